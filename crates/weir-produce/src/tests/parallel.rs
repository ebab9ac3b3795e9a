//! Parallel persistence (RFC 0006): reservations, acks, the resolver.

use super::*;
use crate::reserver::CONFIRM_LINGER;
use crate::{ResolveOutcome, ResolvePass, Resolver, ResolverSettings};
use weir_protocol::batch::BatchHeader;

fn parallel(ack_deadline: Duration) -> ProduceSettings {
    ProduceSettings {
        parallel_persistence: true,
        ack_deadline,
        ..file_per_ticket()
    }
}

/// The resolver of the pipeline's own agent.
fn resolver(h: &Harness) -> Resolver {
    Resolver::new(
        h.control.clone(),
        h.writer.clone(),
        Arc::new(h.clock.clone()),
        h.pipeline.incarnations(),
        ResolverSettings::default(),
        9,
    )
}

/// A resolver that knows none of the pipeline's incarnations, as another agent's (or a
/// restarted one's) would be.
fn foreign_resolver(h: &Harness) -> Resolver {
    Resolver::new(
        h.control.clone(),
        h.writer.clone(),
        Arc::new(h.clock.clone()),
        None,
        ResolverSettings::default(),
        9,
    )
}

fn pending_files(control: &ControlPlane) -> usize {
    control.read(|state| state.pending.values().map(Vec::len).sum())
}

fn idempotent(topic: TopicId, producer: (i64, i16), sequence: i32, count: i32) -> ProduceTicket {
    ticket(vec![partition_batches(
        topic,
        0,
        &[count],
        (producer.0, producer.1, sequence),
    )])
}

/// Three buckets, quorum two, a 10 s ack deadline, and a one-partition topic `name`.
async fn three_buckets_with_topic(name: &str) -> (Harness, TopicId) {
    let h = harness(
        vec![LatencyProfile::local(); 3],
        2,
        parallel(Duration::from_secs(10)),
    )
    .await;
    let topic = h.one_partition_topic(name).await;
    (h, topic)
}

/// Three buckets, quorum two, a 10 s ack deadline: one idempotent batch of three records sent
/// with the buckets in `down` down, which fails its upload and leaves its file pending (the
/// buckets stay down).
async fn upload_failed_with_down(down: &[usize]) -> (Harness, TopicId, (i64, i16)) {
    let (h, topic) = three_buckets_with_topic("failed").await;
    let producer = init_producer(&h.control).await;
    for &bucket in down {
        h.buckets[bucket].model.set_outage(true);
    }
    let failed = h
        .pipeline
        .submit(idempotent(topic, producer, 0, 3))
        .await
        .await;
    assert!(
        matches!(
            &failed[0],
            PartitionOutcome::Failed(ProduceError::Unresolved(_))
        ),
        "{failed:?}"
    );
    assert_eq!(pending_files(&h.control), 1);
    (h, topic, producer)
}

/// Acknowledged once reserved and uploaded, in seal order with dense offsets; the files are
/// then confirmed, so everything becomes readable and names the buckets that hold it.
#[tokio::test(start_paused = true)]
async fn test_parallel_acks_with_dense_offsets_then_confirms() {
    let mut jittery = LatencyProfile::local();
    jittery.name = "jittery".into();
    jittery.put = OpLatency::millis(5, 80);
    let h = harness(vec![jittery; 3], 2, parallel(Duration::from_secs(10))).await;
    let topic = h
        .control
        .create_topic("p", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for count in 1..=8 {
        outcomes.push(h.pipeline.submit(single(topic, 0, count)).await);
    }
    let mut next = 0;
    for (outcome, count) in futures::future::join_all(outcomes)
        .await
        .into_iter()
        .zip(1..)
    {
        assert_eq!(outcome, vec![committed(next)]);
        next += count;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pending_files(&h.control), 0, "every file confirmed");
    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable, index.len()), (next, next, 8));
    for entry in index {
        let holders = h
            .control
            .read(|state| state.files[&entry.file_id].buckets.clone());
        assert!(
            holders.len() >= 2,
            "holders named by the confirmation: {holders:?}"
        );
        for holder in holders {
            let raw = &h.buckets[usize::from(holder)].raw;
            assert!(raw.head(&file_key(entry.file_id)).await.is_ok());
        }
    }
}

/// An upload that lands nowhere fails its tickets and leaves its file pending: a retry is
/// refused retriably (the original may still land) until a resolver of another process, once
/// the file is past the ack deadline and the margin, aborts it (it cannot know whether the
/// incarnation still runs). The offsets then hold an empty batch and the retry appends anew.
#[tokio::test(start_paused = true)]
async fn test_parallel_upload_failure_is_aborted_by_the_resolver_after_the_deadline() {
    let (h, topic, producer) = upload_failed_with_down(&[0, 1, 2]).await;
    assert_eq!(pending_files(&h.control), 1);
    let (high_watermark, stable, _) = partition_view(&h.control, topic, 0);
    assert_eq!(
        (high_watermark, stable),
        (3, 0),
        "offsets reserved, nothing readable"
    );

    let mut resolver = foreign_resolver(&h);
    let waiting = ResolvePass {
        waiting: 1,
        ..ResolvePass::default()
    };
    assert_eq!(resolver.pass().await, waiting, "no bucket answers: unknown");
    for bucket in &h.buckets {
        bucket.model.set_outage(false);
    }
    assert_eq!(
        resolver.pass().await,
        waiting,
        "missing, but not past the deadline"
    );
    let retry = h
        .pipeline
        .submit(idempotent(topic, producer, 0, 3))
        .await
        .await;
    assert_eq!(
        retry,
        vec![PartitionOutcome::Failed(ProduceError::Control(
            ControlError::SequencePending {
                producer_id: producer.0
            }
        ))],
        "the original may still land: the retry must wait for its outcome"
    );
    h.clock.advance_ms(20_001);
    let aborted = resolver.pass().await;
    assert_eq!(aborted.aborted, 1, "{aborted:?}");
    assert_eq!(pending_files(&h.control), 0);

    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable, index.len()), (3, 3, 1));
    let filler = index[0];
    assert_eq!(
        (filler.base_offset, filler.last_offset, filler.len),
        (0, 2, 61)
    );
    let raw = &h.buckets[0].raw;
    let range = filler.byte_offset..filler.byte_offset + u64::from(filler.len);
    let bytes = raw
        .get_range(&file_key(filler.file_id), range)
        .await
        .unwrap();
    let header = BatchHeader::parse(&bytes).unwrap();
    assert_eq!((header.records_count, header.offset_span()), (0, 3));

    let appended = h
        .pipeline
        .submit(idempotent(topic, producer, 0, 3))
        .await
        .await;
    assert_eq!(
        appended,
        vec![committed(3)],
        "the rolled-back sequence appends anew"
    );
}

/// Checks that the failed file of [`upload_failed_with_down`] is settled (its three offsets
/// readable, as records or as an aborted empty batch), then resends its batch.
async fn retry_once_settled(
    h: &Harness,
    topic: TopicId,
    producer: (i64, i16),
) -> Vec<PartitionOutcome> {
    let (high_watermark, stable, _) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable), (3, 3));
    h.pipeline
        .submit(idempotent(topic, producer, 0, 3))
        .await
        .await
}

/// Which incarnation names are this agent's abandoned ones.
#[test]
fn test_abandoned_here_knows_its_own_past_incarnations_only() {
    let incarnations = crate::Incarnations::new("agent-1".into());
    assert!(!incarnations.abandoned_here("agent-1"), "live");
    incarnations.abandon_for_test(2);
    assert_eq!(incarnations.live(), "agent-1.2");
    for (name, abandoned) in [
        ("agent-1", true),
        ("agent-1.1", true),
        ("agent-1.2", false),
        ("agent-1.3", false),
        ("agent-1.0", false),
        ("agent-10", false),
        ("agent-1.x", false),
        ("agent-2.1", false),
    ] {
        assert_eq!(incarnations.abandoned_here(name), abandoned, "{name}");
    }
}

/// A file whose incarnation is abandoned while its upload is in flight is never acknowledged,
/// even though the upload then reaches its quorum in time: the resolver aborts a missing file
/// of the agent's own abandoned incarnation at once, relying on exactly this. (The abandonment
/// comes from outside the acker here, as a failed confirmation write's does.)
#[tokio::test(start_paused = true)]
async fn test_a_file_is_not_acknowledged_after_its_incarnation_was_abandoned() {
    let h = harness(vec![fixed_put(50); 3], 2, parallel(Duration::from_secs(10))).await;
    let topic = h.one_partition_topic("abandoned").await;
    let outcome = h.pipeline.submit(single(topic, 0, 2)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let incarnations = h.pipeline.incarnations().expect("reserving");
    incarnations.abandon_for_test(1);
    assert_eq!(
        outcome.await,
        vec![PartitionOutcome::Failed(ProduceError::Unresolved(
            crate::reserver::EARLIER_FILE_FAILED.to_string()
        ))],
        "the upload landed after the abandonment: not acknowledged, and may yet be confirmed"
    );
}

/// During an outage a pass asks a bucket that did not answer once, not once per pending file.
/// A HEAD against a bucket that hangs takes up to the request timeout (10 s by default) with
/// its retries, so with many abandoned incarnations a pass could run for minutes, and the files
/// it could settle (and the startup pass's 10 s) waited behind it.
#[tokio::test(start_paused = true)]
async fn test_a_pass_asks_a_silent_bucket_once() {
    use weir_storage::{BucketStats, LayerPolicy, LayerStore, PriceTable, RequestClass};
    let (h, topic) = three_buckets_with_topic("silent").await;
    for bucket in &h.buckets {
        bucket.model.set_outage(true);
    }
    // Each failed upload abandons its incarnation: three incarnations, one file each.
    for _ in 0..3 {
        let failed = h.pipeline.submit(single(topic, 0, 1)).await.await;
        assert!(
            matches!(failed[0], PartitionOutcome::Failed(_)),
            "{failed:?}"
        );
    }
    assert_eq!(pending_files(&h.control), 3);
    h.buckets[0].model.set_outage(false);
    h.buckets[1].model.set_outage(false);
    let stats: Vec<Arc<BucketStats>> = (0..3)
        .map(|i| Arc::new(BucketStats::new(&format!("b{i}"), "test", PriceTable::FREE)))
        .collect();
    let stores: Vec<Arc<dyn ObjectStore>> = h
        .buckets
        .iter()
        .zip(&stats)
        .map(|(bucket, stats)| {
            let model: Arc<dyn ObjectStore> = bucket.model.clone();
            Arc::new(LayerStore::new(
                model,
                LayerPolicy::default(),
                stats.clone(),
            )) as Arc<dyn ObjectStore>
        })
        .collect();
    let writer = Arc::new(QuorumWriter::new(stores, 2).unwrap());
    let mut resolver = Resolver::new(
        h.control.clone(),
        writer,
        Arc::new(h.clock.clone()),
        h.pipeline.incarnations(),
        ResolverSettings::default(),
        9,
    );
    let pass = resolver.pass().await;
    assert_eq!(
        pass.aborted, 3,
        "two buckets answered 'not found': in no quorum; {pass:?}"
    );
    // What one HEAD costs against a down bucket (the layer retries it).
    let once = Arc::new(BucketStats::new("once", "test", PriceTable::FREE));
    let model: Arc<dyn ObjectStore> = h.buckets[2].model.clone();
    let probe = LayerStore::new(model, LayerPolicy::default(), once.clone());
    assert!(probe.head(&Path::from("any")).await.is_err());
    let heads: Vec<u64> = stats
        .iter()
        .map(|stats| stats.snapshot().requests_of(RequestClass::Head))
        .collect();
    assert_eq!(heads[..2], [3, 3], "one HEAD per file where buckets answer");
    assert_eq!(
        heads[2],
        once.snapshot().requests_of(RequestClass::Head),
        "the silent bucket: one HEAD (and its retries) in the whole pass"
    );
}

/// The agent's own resolver aborts a missing file of an incarnation the agent abandoned at
/// once: that incarnation never answers another ticket, so there is no deadline to wait for,
/// and the partition's consumers and the retry do not wait either.
#[tokio::test(start_paused = true)]
async fn test_own_abandoned_incarnation_missing_file_is_aborted_at_once() {
    let (h, topic, producer) = upload_failed_with_down(&[0, 1, 2]).await;
    for bucket in &h.buckets {
        bucket.model.set_outage(false);
    }
    let pass = resolver(&h).pass().await;
    assert_eq!(
        (pass.aborted, pass.waiting),
        (1, 0),
        "aborted before the deadline: {pass:?}"
    );
    let appended = retry_once_settled(&h, topic, producer).await;
    assert_eq!(appended, vec![committed(3)], "the retry appends anew");
}

/// A file in one bucket of three (quorum two), with a second bucket down and the third without
/// it, is the state a crash can leave: the down bucket may hold the quorum's other copy, so the
/// file may have been acknowledged and cannot be aborted, and one copy cannot be confirmed.
/// The resolver copies it into the bucket that answered "not found" and confirms it there; a
/// retry is then a duplicate with its offset instead of waiting on the file while the bucket
/// stays down.
#[tokio::test(start_paused = true)]
async fn test_resolver_repairs_a_file_in_one_bucket_while_another_is_down() {
    let (h, topic, producer) = upload_failed_with_down(&[1, 2]).await;
    let (_, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((stable, index.len()), (0, 1));
    let key = file_key(index[0].file_id);
    assert!(h.buckets[0].raw.head(&key).await.is_ok());
    assert!(h.buckets[1].raw.head(&key).await.is_err());

    h.buckets[1].model.set_outage(false);
    let metrics = crate::ProduceMetrics::new();
    let mut resolver = resolver(&h).with_metrics(metrics.clone());
    let pass = resolver.pass().await;
    assert_eq!(
        pass,
        ResolvePass {
            confirmed: 1,
            repaired: 1,
            ..ResolvePass::default()
        },
        "copied into bucket 1 and confirmed, bucket 2 still down"
    );
    let counted = [ResolveOutcome::Confirmed, ResolveOutcome::Repaired]
        .map(|outcome| metrics.resolved(outcome).get());
    assert_eq!(counted, [0, 1], "counted as repaired only");
    assert!(h.buckets[1].raw.head(&key).await.is_ok(), "the copy landed");
    assert_eq!(
        h.control
            .read(|state| state.files[&index[0].file_id].buckets.clone()),
        vec![0, 1],
        "the confirmation names the holders"
    );
    let retry = retry_once_settled(&h, topic, producer).await;
    assert_eq!(retry, vec![committed(0)], "a duplicate of the original");
}

/// A file that reached its quorum after the ack deadline is never acknowledged, but it is in a
/// quorum, so the resolver confirms it: the retry is then a duplicate with its offset.
#[tokio::test(start_paused = true)]
async fn test_resolver_confirms_a_late_file_that_reached_a_quorum() {
    let h = harness(
        vec![fixed_put(50); 3],
        2,
        parallel(Duration::from_millis(10)),
    )
    .await;
    let topic = h
        .control
        .create_topic("late", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let producer = init_producer(&h.control).await;
    let late = h
        .pipeline
        .submit(idempotent(topic, producer, 0, 2))
        .await
        .await;
    assert!(
        matches!(
            &late[0],
            PartitionOutcome::Failed(ProduceError::Unresolved(_))
        ),
        "{late:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        pending_files(&h.control),
        1,
        "in a quorum, not yet confirmed"
    );
    let pass = resolver(&h).pass().await;
    assert_eq!(pass.confirmed, 1, "{pass:?}");
    let (high_watermark, stable, _) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable), (2, 2));
    // A retry is now a duplicate with the original's offset (this pipeline's uploads all miss
    // its 10 ms deadline, so the retry is committed directly).
    let retry = weir_control::FileCommit {
        agent: "retrying".into(),
        previous: None,
        file_id: FileId(1),
        size: 100,
        buckets: vec![0],
        batches: vec![weir_control::BatchCommit {
            topic_id: topic,
            partition: 0,
            byte_offset: 0,
            len: 100,
            offset_span: 2,
            first_timestamp: 0,
            max_timestamp: 0,
            producer_id: producer.0,
            producer_epoch: producer.1,
            base_sequence: 0,
        }],
    };
    let outcome = h.control.submit(Entry::CommitFile(retry)).await.unwrap();
    assert!(
        matches!(&outcome, EntryResult::CommitFile(o) if matches!(o[0], weir_control::BatchOutcome::Duplicate { base_offset: 0, .. })),
        "{outcome:?}"
    );
}

/// The served and the stable high watermark of partition 0.
fn served_view(control: &ControlPlane, topic_id: TopicId) -> (i64, i64) {
    control.read_served(|served| {
        let p = served.state().partition(&topic_id, 0).unwrap();
        (
            served.high_watermark(&topic_id, 0, p),
            p.stable_high_watermark,
        )
    })
}

/// An acknowledged file is served on this agent before its confirmation is durable, and the
/// confirmation then rides in the next reservation's slot; without a next one, it takes its
/// own slot after the linger.
#[tokio::test(start_paused = true)]
async fn test_acknowledged_files_are_served_at_once_and_confirmations_ride_reservations() {
    let mut slow_puts = LatencyProfile::local();
    slow_puts.name = "slow-puts".into();
    slow_puts.put = OpLatency::millis(20, 20);
    let h = harness(vec![slow_puts; 3], 2, parallel(Duration::from_secs(10))).await;
    let topic = h
        .control
        .create_topic("served", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let slots_before = *h.control.subscribe().borrow();
    let files = 8;
    let mut next = 0;
    for count in 1..=files {
        let outcome = h.pipeline.submit(single(topic, 0, count)).await.await;
        assert_eq!(outcome, vec![committed(next)]);
        next += i64::from(count);
        let (served, stable) = served_view(&h.control, topic);
        assert_eq!(served, next, "file {count}: served once acknowledged");
        assert!(
            stable < next,
            "file {count}: its confirmation is not durable yet"
        );
    }
    let slots_busy = *h.control.subscribe().borrow() - slots_before;
    assert!(
        slots_busy <= u64::from(files as u32),
        "{slots_busy} slots for {files} files: confirmations rode in reservations' slots"
    );
    tokio::time::sleep(CONFIRM_LINGER * 2).await;
    assert_eq!(served_view(&h.control, topic), (next, next), "confirmed");
    assert_eq!(pending_files(&h.control), 0);
    assert_eq!(
        h.control.acknowledged_unconfirmed(),
        0,
        "the overlay emptied"
    );
    let slots = *h.control.subscribe().borrow() - slots_before;
    assert_eq!(
        slots,
        slots_busy + 1,
        "the last confirmation took a slot of its own"
    );
}
