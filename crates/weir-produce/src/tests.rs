//! Pipeline tests over real components: a [`QuorumWriter`] over in-memory buckets (some behind a
//! [`ModelStore`] for latency and outages), a [`ControlPlane`] on an in-memory store, and a
//! [`ReadCache`]. Time is paused, so modelled latencies run instantly and deterministically.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_common::{Clock, FileId, ManualClock, TopicId};
use weir_control::{
    ControlError, ControlPlane, ControlPlaneSettings, Entry, EntryResult, IndexEntry,
};
use weir_protocol::batch::{build_test_batch, split_and_validate};
use weir_storage::{keys, LatencyProfile, ModelStore, OpLatency, QuorumWriter, ReadCache};

use crate::{
    PartitionBatches, PartitionOutcome, ProduceError, ProducePipeline, ProduceSettings,
    ProduceTicket,
};

mod parallel;
mod pooled;
mod sealing;

const NO_PRODUCER: (i64, i16, i32) = (-1, -1, -1);

/// One ingest bucket: the raw in-memory store and the model wrapper the writer uses.
struct Bucket {
    raw: Arc<InMemory>,
    model: Arc<ModelStore>,
}

struct Harness {
    pipeline: ProducePipeline,
    control: ControlPlane,
    buckets: Vec<Bucket>,
    cache: Arc<ReadCache>,
    writer: Arc<QuorumWriter>,
    /// The pipeline's wall clock (file ids), moved by hand.
    clock: ManualClock,
}

fn fixed_put(millis: u64) -> LatencyProfile {
    let mut profile = LatencyProfile::local();
    profile.name = format!("fixed-put-{millis}ms");
    profile.put = OpLatency::millis(millis, millis);
    profile
}

/// Settings where every ticket seals its own file (any batch exceeds one byte).
fn file_per_ticket() -> ProduceSettings {
    ProduceSettings {
        max_file_bytes: 1,
        ..ProduceSettings::default()
    }
}

async fn harness_with(
    profiles: Vec<LatencyProfile>,
    quorum: usize,
    settings: ProduceSettings,
    control_store: Arc<dyn ObjectStore>,
) -> Harness {
    harness_over(profiles, quorum, settings, control_store, false).await
}

/// As [`harness_with`]; `contiguous` as the agent sets it for in-process buckets
/// (`QuorumWriter::with_contiguous_payloads`).
async fn harness_over(
    profiles: Vec<LatencyProfile>,
    quorum: usize,
    settings: ProduceSettings,
    control_store: Arc<dyn ObjectStore>,
    contiguous: bool,
) -> Harness {
    let buckets: Vec<Bucket> = profiles
        .into_iter()
        .enumerate()
        .map(|(index, profile)| {
            let raw = Arc::new(InMemory::new());
            let inner: Arc<dyn ObjectStore> = raw.clone();
            let model = Arc::new(ModelStore::new(inner, profile, 100 + index as u64).unwrap());
            Bucket { raw, model }
        })
        .collect();
    let stores: Vec<Arc<dyn ObjectStore>> = buckets
        .iter()
        .map(|bucket| bucket.model.clone() as Arc<dyn ObjectStore>)
        .collect();
    let writer = Arc::new(
        QuorumWriter::new(stores, quorum)
            .unwrap()
            .with_contiguous_payloads(contiguous),
    );
    let control = ControlPlane::open(control_store, ControlPlaneSettings::default(), 7)
        .await
        .unwrap();
    let cache = Arc::new(ReadCache::new(64 * 1024 * 1024));
    let manual = ManualClock::new(1_700_000_000_000);
    let clock: Arc<dyn Clock> = Arc::new(manual.clone());
    let pipeline = ProducePipeline::start(
        settings,
        writer.clone(),
        control.clone(),
        cache.clone(),
        clock,
        42,
    );
    Harness {
        pipeline,
        control,
        buckets,
        cache,
        writer,
        clock: manual,
    }
}

impl Harness {
    /// Creates a one-partition topic `name`.
    async fn one_partition_topic(&self, name: &str) -> TopicId {
        self.control
            .create_topic(name, 1, BTreeMap::new(), 1)
            .await
            .unwrap()
    }
}

async fn harness(
    profiles: Vec<LatencyProfile>,
    quorum: usize,
    settings: ProduceSettings,
) -> Harness {
    harness_with(profiles, quorum, settings, Arc::new(InMemory::new())).await
}

fn partition_batches(
    topic_id: TopicId,
    partition: i32,
    counts: &[i32],
    producer: (i64, i16, i32),
) -> PartitionBatches {
    let mut sequence = producer.2;
    let mut records = Vec::new();
    for (i, count) in counts.iter().enumerate() {
        records.extend_from_slice(&build_test_batch(
            *count,
            1_000 + i as i64,
            (producer.0, producer.1, sequence),
        ));
        if sequence >= 0 {
            sequence += count;
        }
    }
    PartitionBatches {
        topic_id,
        partition,
        batches: split_and_validate(&Bytes::from(records)).unwrap(),
    }
}

fn ticket(partitions: Vec<PartitionBatches>) -> ProduceTicket {
    ProduceTicket { partitions }
}

fn single(topic_id: TopicId, partition: i32, count: i32) -> ProduceTicket {
    ticket(vec![partition_batches(
        topic_id,
        partition,
        &[count],
        NO_PRODUCER,
    )])
}

fn committed(base_offset: i64) -> PartitionOutcome {
    PartitionOutcome::Committed {
        base_offset,
        log_start_offset: 0,
    }
}

fn base_offset(outcome: &PartitionOutcome) -> i64 {
    match outcome {
        PartitionOutcome::Committed { base_offset, .. } => *base_offset,
        PartitionOutcome::Failed(err) => panic!("expected a commit, got {err}"),
    }
}

/// (high watermark, stable high watermark, index) of a partition.
fn partition_view(
    control: &ControlPlane,
    topic_id: TopicId,
    partition: i32,
) -> (i64, i64, Vec<IndexEntry>) {
    control.read(|state| {
        let p = state.partition(&topic_id, partition).unwrap();
        (
            p.high_watermark,
            p.stable_high_watermark,
            p.index.iter().copied().collect(),
        )
    })
}

fn file_key(file_id: FileId) -> Path {
    keys::ingest_file(&file_id.to_string(), file_id.unix_ms())
}

async fn ingest_keys(store: &InMemory) -> Vec<Path> {
    store
        .list(Some(&keys::ingest_prefix()))
        .map(|meta| meta.unwrap().location)
        .collect()
        .await
}

async fn init_producer(control: &ControlPlane) -> (i64, i16) {
    match control
        .submit(Entry::init_producer_id(None, 0))
        .await
        .unwrap()
    {
        EntryResult::InitProducerId(Ok(pair)) => pair,
        other => panic!("unexpected {other:?}"),
    }
}

/// Tickets from one task get dense offsets in submission order across many files, with random
/// per-PUT latency and several uploads in flight (a forced reorder is tested separately).
#[tokio::test(start_paused = true)]
async fn test_pipeline_offsets_dense_in_submission_order_one_task() {
    let mut jittery = LatencyProfile::local();
    jittery.name = "jittery".into();
    jittery.put = OpLatency::millis(5, 80);
    let settings = ProduceSettings {
        max_file_bytes: 200,
        ..ProduceSettings::default()
    };
    let h = harness(vec![jittery], 1, settings).await;
    let topic = h
        .control
        .create_topic("orders", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let mut pending = Vec::new();
    for i in 0..60 {
        let count = 1 + (i % 4);
        pending.push((count, h.pipeline.submit(single(topic, 0, count)).await));
    }
    let mut expected = 0i64;
    for (count, outcome) in pending {
        assert_eq!(outcome.await, vec![committed(expected)]);
        expected += i64::from(count);
    }
    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable), (expected, expected));
    assert_eq!(index.len(), 60);
    let files: std::collections::BTreeSet<_> = index.iter().map(|e| e.file_id).collect();
    assert!(files.len() > 1, "the test must span several files");
    for pair in index.windows(2) {
        assert_eq!(pair[0].last_offset + 1, pair[1].base_offset, "dense index");
    }
}

/// Several tasks submitting concurrently to the same partition: each task's offsets increase in
/// its submission order, and together they tile the partition densely with no overlap.
#[tokio::test(start_paused = true)]
async fn test_pipeline_offsets_dense_across_concurrent_tasks() {
    let mut jittery = LatencyProfile::local();
    jittery.name = "jittery".into();
    jittery.put = OpLatency::millis(3, 40);
    let settings = ProduceSettings {
        max_file_bytes: 300,
        ..ProduceSettings::default()
    };
    let h = harness(vec![jittery], 1, settings).await;
    let topic = h
        .control
        .create_topic("shared", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for task in 0..4i32 {
        let pipeline = h.pipeline.clone();
        tasks.push(tokio::spawn(async move {
            let mut pending = Vec::new();
            for i in 0..25i32 {
                let count = 1 + (task + i) % 3;
                pending.push((count, pipeline.submit(single(topic, 0, count)).await));
                if i % 5 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            let mut ranges = Vec::new();
            for (count, outcome) in pending {
                let outcome = outcome.await;
                assert_eq!(outcome.len(), 1);
                let base = base_offset(&outcome[0]);
                ranges.push((base, base + i64::from(count)));
            }
            ranges
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        let ranges = task.await.unwrap();
        for pair in ranges.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "a task's offsets follow its order: {pair:?}"
            );
        }
        all.extend(ranges);
    }
    all.sort_unstable();
    let mut next = 0;
    for (start, end) in &all {
        assert_eq!(*start, next, "offsets are dense and never assigned twice");
        next = *end;
    }
    let (high_watermark, stable, _) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable), (next, next));
}

/// A ticket spanning partitions of two topics resolves per partition, in ticket order, each
/// partition counting its own offsets.
#[tokio::test(start_paused = true)]
async fn test_pipeline_multi_partition_ticket_resolves_per_partition() {
    let h = harness(vec![LatencyProfile::local()], 1, ProduceSettings::default()).await;
    let orders = h
        .control
        .create_topic("orders", 2, BTreeMap::new(), 1)
        .await
        .unwrap();
    let audit = h
        .control
        .create_topic("audit", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    let mut pending = Vec::new();
    for _ in 0..5 {
        let multi = ticket(vec![
            partition_batches(orders, 1, &[3], NO_PRODUCER),
            partition_batches(audit, 0, &[1, 1], NO_PRODUCER),
            partition_batches(orders, 0, &[2, 4], NO_PRODUCER),
        ]);
        pending.push(h.pipeline.submit(multi).await);
        // A single-partition ticket in between shifts only orders-1.
        pending.push(h.pipeline.submit(single(orders, 1, 10)).await);
    }
    let mut outcomes = Vec::new();
    for outcome in pending {
        outcomes.push(outcome.await);
    }
    for round in 0..5i64 {
        let multi = &outcomes[2 * round as usize];
        assert_eq!(
            multi,
            &vec![
                committed(round * 13),
                committed(round * 2),
                committed(round * 6),
            ],
            "round {round}"
        );
        assert_eq!(
            outcomes[2 * round as usize + 1],
            vec![committed(round * 13 + 3)]
        );
    }
    assert_eq!(partition_view(&h.control, orders, 0).1, 30);
    assert_eq!(partition_view(&h.control, orders, 1).1, 65);
    assert_eq!(partition_view(&h.control, audit, 0).1, 10);
}

/// DUR-1: once a ticket resolves, the commit is durable (the stable high watermark covers it)
/// and the file is in the bucket.
#[tokio::test(start_paused = true)]
async fn test_pipeline_outcome_implies_durable_commit_and_file() {
    let h = harness(vec![LatencyProfile::local()], 1, file_per_ticket()).await;
    let topic = h
        .control
        .create_topic("durable", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let mut expected = 0;
    for count in [5, 1, 7] {
        let outcome = h.pipeline.submit(single(topic, 0, count)).await.await;
        assert_eq!(outcome, vec![committed(expected)]);
        expected += i64::from(count);
        let (_, stable, index) = partition_view(&h.control, topic, 0);
        assert!(stable >= expected, "stable {stable} must cover {expected}");
        let entry = index.last().unwrap();
        assert_eq!(entry.last_offset + 1, expected);
        let key = file_key(entry.file_id);
        assert!(
            ingest_keys(&h.buckets[0].raw).await.contains(&key),
            "{key} is in the bucket"
        );
        let stored = h.buckets[0]
            .raw
            .get_range(
                &key,
                entry.byte_offset..entry.byte_offset + u64::from(entry.len),
            )
            .await
            .unwrap();
        assert_eq!(stored.len(), entry.len as usize);
    }
}

/// DUR-1: a ticket does not resolve while its upload is still running, and nothing is committed
/// before the upload finished.
#[tokio::test(start_paused = true)]
async fn test_pipeline_does_not_resolve_before_upload_completes() {
    let h = harness(vec![fixed_put(1_000)], 1, file_per_ticket()).await;
    let topic = h
        .control
        .create_topic("slow", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let outcome = tokio::spawn(h.pipeline.submit(single(topic, 0, 3)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !outcome.is_finished(),
        "resolved before the upload finished"
    );
    assert_eq!(
        partition_view(&h.control, topic, 0).0,
        0,
        "nothing applied yet"
    );
    assert!(ingest_keys(&h.buckets[0].raw).await.is_empty());
    assert_eq!(outcome.await.unwrap(), vec![committed(0)]);
    assert_eq!(ingest_keys(&h.buckets[0].raw).await.len(), 1);
    assert_eq!(partition_view(&h.control, topic, 0).1, 3);
}

/// DUR-1: a ticket does not resolve while its commit is sealed but the metadata log write is
/// still in flight, and readers do not see the commit meanwhile; when it resolves, the stable
/// high watermark covers it.
#[tokio::test(start_paused = true)]
async fn test_pipeline_does_not_resolve_before_commit_is_durable() {
    let raw_log = Arc::new(InMemory::new());
    let log_inner: Arc<dyn ObjectStore> = raw_log.clone();
    let slow_log = Arc::new(ModelStore::new(log_inner, fixed_put(1_000), 9).unwrap());
    let h = harness_with(
        vec![LatencyProfile::local()],
        1,
        file_per_ticket(),
        slow_log,
    )
    .await;
    let topic = h
        .control
        .create_topic("slowlog", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let outcome = tokio::spawn(h.pipeline.submit(single(topic, 0, 4)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (high_watermark, stable, _) = partition_view(&h.control, topic, 0);
    assert_eq!(
        (high_watermark, stable),
        (0, 0),
        "sealed, not yet durable: invisible to readers"
    );
    assert!(
        !outcome.is_finished(),
        "resolved before the commit was durable"
    );
    assert_eq!(outcome.await.unwrap(), vec![committed(0)]);
    assert_eq!(partition_view(&h.control, topic, 0).1, 4);
}

/// With a 2-of-3 quorum the file is in at least two buckets when the ticket resolves, even when
/// the third bucket is slow.
#[tokio::test(start_paused = true)]
async fn test_pipeline_resolves_with_quorum_while_slow_bucket_lags() {
    let profiles = vec![
        LatencyProfile::local(),
        fixed_put(60_000),
        LatencyProfile::local(),
    ];
    let h = harness(profiles, 2, file_per_ticket()).await;
    let topic = h
        .control
        .create_topic("quorum", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let outcome = h.pipeline.submit(single(topic, 0, 2)).await.await;
    assert_eq!(outcome, vec![committed(0)]);
    let key = file_key(partition_view(&h.control, topic, 0).2[0].file_id);
    let mut holders = Vec::new();
    for (index, bucket) in h.buckets.iter().enumerate() {
        if bucket.raw.head(&key).await.is_ok() {
            holders.push(index);
        }
    }
    assert_eq!(
        holders,
        vec![0, 2],
        "the fast pair holds it, the slow bucket not yet"
    );
    let recorded = h.control.read(|state| {
        let file_id = state.partition(&topic, 0).unwrap().index[0].file_id;
        state.files[&file_id].buckets.clone()
    });
    assert_eq!(recorded, vec![0, 2], "the commit records the holders");
}

/// 2-of-3: one bucket down still commits; two down fails with a storage error and commits
/// nothing; after the outage, offsets continue densely.
#[tokio::test(start_paused = true)]
async fn test_pipeline_quorum_outage_fails_then_recovers_densely() {
    let profiles = vec![LatencyProfile::local(); 3];
    let h = harness(profiles, 2, file_per_ticket()).await;
    let topic = h
        .control
        .create_topic("outage", 1, BTreeMap::new(), 1)
        .await
        .unwrap();

    h.buckets[1].model.set_outage(true);
    let outcome = h.pipeline.submit(single(topic, 0, 3)).await.await;
    assert_eq!(outcome, vec![committed(0)], "one bucket down of three");
    let recorded = h.control.read(|state| {
        let file_id = state.partition(&topic, 0).unwrap().index[0].file_id;
        state.files[&file_id].buckets.clone()
    });
    assert_eq!(recorded, vec![0, 2]);

    h.buckets[2].model.set_outage(true);
    let before = partition_view(&h.control, topic, 0);
    let files_before = h.control.read(|state| state.files.len());
    let first = h.pipeline.submit(single(topic, 0, 2)).await;
    let second = h.pipeline.submit(single(topic, 0, 2)).await;
    for outcome in [first.await, second.await] {
        assert_eq!(outcome.len(), 1);
        assert!(
            matches!(
                &outcome[0],
                PartitionOutcome::Failed(
                    ProduceError::Storage(_) | ProduceError::EarlierFileFailed
                )
            ),
            "{outcome:?}"
        );
    }
    let lone = h.pipeline.submit(single(topic, 0, 2)).await.await;
    assert!(
        matches!(&lone[0], PartitionOutcome::Failed(ProduceError::Storage(_))),
        "{lone:?}"
    );
    let after = partition_view(&h.control, topic, 0);
    assert_eq!(
        (after.0, after.1),
        (before.0, before.1),
        "nothing committed"
    );
    assert_eq!(after.2.len(), before.2.len());
    assert_eq!(h.control.read(|state| state.files.len()), files_before);

    h.buckets[1].model.set_outage(false);
    h.buckets[2].model.set_outage(false);
    let a = h.pipeline.submit(single(topic, 0, 4)).await;
    let b = h.pipeline.submit(single(topic, 0, 1)).await;
    assert_eq!(a.await, vec![committed(3)]);
    assert_eq!(b.await, vec![committed(7)]);
    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable, index.len()), (8, 8, 3));
}

/// A pipeline sealing one file per ticket over one bucket whose PUTs take exactly 100ms and
/// check the outage flag at their end. File 1 (3 records) starts at t=0 and its PUT ends at t=100
/// during an outage (t=10..120); file 2 (5 records) is sealed at t=50, before file 1's failure is
/// seen, and its PUT ends at t=150, healthy. Returns the harness, the topic and both outcomes.
async fn second_file_sealed_during_first_upload_outage(
    upload_attempts: u32,
    topic_name: &str,
) -> (
    Harness,
    TopicId,
    impl std::future::Future<Output = Vec<PartitionOutcome>>,
    impl std::future::Future<Output = Vec<PartitionOutcome>>,
) {
    let settings = ProduceSettings {
        upload_attempts,
        ..file_per_ticket()
    };
    let h = harness(vec![fixed_put(100)], 1, settings).await;
    let topic = h
        .control
        .create_topic(topic_name, 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let first = h.pipeline.submit(single(topic, 0, 3)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    h.buckets[0].model.set_outage(true);
    tokio::time::sleep(Duration::from_millis(40)).await;
    let second = h.pipeline.submit(single(topic, 0, 5)).await;
    tokio::time::sleep(Duration::from_millis(70)).await;
    h.buckets[0].model.set_outage(false);
    (h, topic, first, second)
}

/// ORD-2: a file whose upload fails for good fails every later file that was sealed before the
/// failure was seen, even if that later file uploaded fine; a file sealed afterwards commits.
#[tokio::test(start_paused = true)]
async fn test_pipeline_failed_upload_fails_later_sealed_files() {
    // File 1's only PUT fails; file 2 was sealed before that was seen.
    let (h, topic, first, second) = second_file_sealed_during_first_upload_outage(1, "ord2").await;
    let first = first.await;
    assert!(
        matches!(
            &first[0],
            PartitionOutcome::Failed(ProduceError::Storage(_))
        ),
        "{first:?}"
    );
    assert_eq!(
        second.await,
        vec![PartitionOutcome::Failed(ProduceError::EarlierFileFailed)]
    );
    assert_eq!(
        ingest_keys(&h.buckets[0].raw).await.len(),
        1,
        "file 2 did land in the bucket (an orphan for the sweep)"
    );
    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable, index.len()), (0, 0, 0));

    // Sealed after the failure was seen: commits at offset 0.
    let third = h.pipeline.submit(single(topic, 0, 2)).await.await;
    assert_eq!(third, vec![committed(0)]);
}

/// ORD-2: when an earlier file's upload needs a retry and a later file's upload finishes first,
/// the later file still commits after the earlier one (offsets follow seal order).
#[tokio::test(start_paused = true)]
async fn test_pipeline_commits_in_seal_order_when_uploads_finish_out_of_order() {
    // File 1's first PUT fails and is retried after a backoff; file 2's only PUT succeeds at
    // t=150, so its upload result arrives first.
    let (h, topic, first, second) =
        second_file_sealed_during_first_upload_outage(3, "reorder").await;
    let second = tokio::spawn(second);
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(
        ingest_keys(&h.buckets[0].raw).await.len(),
        1,
        "file 2 is uploaded while file 1 is still retrying"
    );
    assert!(!second.is_finished(), "file 2 waits for file 1");
    assert_eq!(
        partition_view(&h.control, topic, 0).0,
        0,
        "nothing committed yet"
    );
    assert_eq!(first.await, vec![committed(0)]);
    assert_eq!(second.await.unwrap(), vec![committed(3)]);
}

/// A control plane whose metadata log writes take 100ms each, one at a time, with no retries,
/// and a pipeline that seals one file per ticket.
async fn one_write_at_a_time() -> (ControlPlane, Arc<ModelStore>, ProducePipeline) {
    let log_inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log_store = Arc::new(ModelStore::new(log_inner, fixed_put(100), 9).unwrap());
    let control = ControlPlane::open(
        log_store.clone(),
        ControlPlaneSettings {
            // One log write at a time: file 2's commit waits in the queue behind file 1's.
            max_inflight_writes: 1,
            write_attempts: 1,
            ..ControlPlaneSettings::default()
        },
        7,
    )
    .await
    .unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_700_000_000_000));
    let pipeline = ProducePipeline::start(
        file_per_ticket(),
        writer,
        control.clone(),
        Arc::new(ReadCache::new(1 << 20)),
        clock,
        42,
    );
    (control, log_store, pipeline)
}

/// Submits `first` and `second` so that `first`'s commit fails in a metadata log outage while
/// `second`'s commit is queued behind it; returns both outcomes.
async fn fail_first_commit(
    log_store: &ModelStore,
    pipeline: &ProducePipeline,
    first: ProduceTicket,
    second: ProduceTicket,
) -> (Vec<PartitionOutcome>, Vec<PartitionOutcome>) {
    // t=0: file 1's commit goes into a log write ending at t=100, during an outage.
    let first = pipeline.submit(first).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    log_store.set_outage(true);
    // t=20: file 2 uploads and its commit is queued behind file 1's.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(pipeline.submit(second).await);
    let first = first.await;
    assert!(
        matches!(
            &first[0],
            PartitionOutcome::Failed(ProduceError::Control(_))
        ),
        "{first:?}"
    );
    log_store.set_outage(false);
    (first, second.await.unwrap())
}

/// ORD-2: when a file's commit fails (the metadata log write fails for good), a later file whose
/// commit was already queued behind it must fail too, not commit once the control plane recovers.
#[tokio::test(start_paused = true)]
async fn test_pipeline_failed_commit_fails_later_uncommitted_files() {
    let (control, log_store, pipeline) = one_write_at_a_time().await;
    let topic = control
        .create_topic("ord2commit", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let (_, second) = fail_first_commit(
        &log_store,
        &pipeline,
        single(topic, 0, 3),
        single(topic, 0, 5),
    )
    .await;
    assert!(
        matches!(&second[0], PartitionOutcome::Failed(_)),
        "file 2 committed after file 1 failed (ORD-2): {second:?}"
    );
}

/// Submits the ticket until its outcome is something other than "control plane unavailable"
/// (100 ms apart, at most 100 times).
async fn retry_while_unavailable(
    pipeline: &ProducePipeline,
    make: impl Fn() -> ProduceTicket,
) -> Vec<PartitionOutcome> {
    for _ in 0..100 {
        let outcome = pipeline.submit(make()).await.await;
        let unavailable = outcome.iter().any(|o| {
            matches!(
                o,
                PartitionOutcome::Failed(ProduceError::Control(ControlError::Unavailable(_)))
            )
        });
        if !unavailable {
            return outcome;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the control plane stayed unavailable");
}

/// IDM-1 consequence of the above: an idempotent producer whose first batch (seq 0) failed in a
/// commit must be able to retry it; if its second batch (seq 3) committed meanwhile, the retry
/// is rejected and records 0..3 can never be written.
#[tokio::test(start_paused = true)]
async fn test_pipeline_idempotent_retry_after_failed_commit_succeeds() {
    let (control, log_store, pipeline) = one_write_at_a_time().await;
    let topic = control
        .create_topic("idm1commit", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let (producer_id, epoch) = init_producer(&control).await;
    let batch = |sequence: i32, count: i32| {
        ticket(vec![partition_batches(
            topic,
            0,
            &[count],
            (producer_id, epoch, sequence),
        )])
    };
    let (_, second) = fail_first_commit(&log_store, &pipeline, batch(0, 3), batch(3, 5)).await;
    // The producer retries in order: seq 0, then seq 3 (a duplicate if it did commit). Until the
    // control plane has recovered from the outage it answers retriably at once, and the producer
    // backs off and tries again, as a Kafka client does.
    let retry_first = retry_while_unavailable(&pipeline, || batch(0, 3)).await;
    let retry_second = retry_while_unavailable(&pipeline, || batch(3, 5)).await;
    assert_eq!(
        (retry_first, retry_second),
        (vec![committed(0)], vec![committed(3)]),
        "second attempt of file 2 was {second:?}"
    );
}

/// Idempotent batches that failed with an upload failure (directly or as later files) and are
/// retried get dense offsets once; a further retry of a committed batch returns its original
/// offset without appending.
#[tokio::test(start_paused = true)]
async fn test_pipeline_idempotent_retry_after_failure_no_duplicates() {
    let settings = ProduceSettings {
        upload_attempts: 1,
        ..file_per_ticket()
    };
    let h = harness(vec![fixed_put(100)], 1, settings).await;
    let topic = h
        .control
        .create_topic("idem", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let (producer_id, epoch) = init_producer(&h.control).await;
    let batch = |sequence: i32, count: i32| {
        ticket(vec![partition_batches(
            topic,
            0,
            &[count],
            (producer_id, epoch, sequence),
        )])
    };

    assert_eq!(
        h.pipeline.submit(batch(0, 5)).await.await,
        vec![committed(0)]
    );

    // seq 5 fails in its upload; seq 10 was sealed before the failure was seen.
    let failing = h.pipeline.submit(batch(5, 5)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    h.buckets[0].model.set_outage(true);
    tokio::time::sleep(Duration::from_millis(40)).await;
    let later = h.pipeline.submit(batch(10, 5)).await;
    tokio::time::sleep(Duration::from_millis(70)).await;
    h.buckets[0].model.set_outage(false);
    assert!(matches!(
        &failing.await[0],
        PartitionOutcome::Failed(ProduceError::Storage(_))
    ));
    assert_eq!(
        later.await,
        vec![PartitionOutcome::Failed(ProduceError::EarlierFileFailed)]
    );

    // The producer retries both in order.
    let retry_a = h.pipeline.submit(batch(5, 5)).await;
    let retry_b = h.pipeline.submit(batch(10, 5)).await;
    assert_eq!(retry_a.await, vec![committed(5)]);
    assert_eq!(retry_b.await, vec![committed(10)]);

    // A duplicate retry (e.g. the ack was lost) returns the original offset.
    assert_eq!(
        h.pipeline.submit(batch(5, 5)).await.await,
        vec![committed(5)]
    );
    assert_eq!(
        h.pipeline.submit(batch(0, 5)).await.await,
        vec![committed(0)]
    );

    let (high_watermark, stable, index) = partition_view(&h.control, topic, 0);
    assert_eq!((high_watermark, stable), (15, 15));
    let bases: Vec<i64> = index.iter().map(|e| e.base_offset).collect();
    assert_eq!(bases, vec![0, 5, 10], "no duplicate appended");

    // Skipping a sequence after the retry is rejected.
    let gap = h.pipeline.submit(batch(20, 5)).await.await;
    assert!(
        matches!(&gap[0], PartitionOutcome::Failed(ProduceError::Control(_))),
        "{gap:?}"
    );
    assert_eq!(partition_view(&h.control, topic, 0).0, 15);
}

/// The write-through cache holds exactly the batch bytes of a fresh file, at the byte ranges the
/// index records, also when one file interleaves tickets of several partitions.
#[tokio::test(start_paused = true)]
async fn test_pipeline_write_through_cache_holds_fresh_batches() {
    write_through_holds_fresh_batches(false).await;
}

/// As above with payloads joined for in-process buckets: the uploader copies the file into one
/// buffer, which the bucket keeps as it is and the cache's batches are slices of.
#[tokio::test(start_paused = true)]
async fn test_pipeline_write_through_cache_shares_the_in_process_buckets_buffer() {
    write_through_holds_fresh_batches(true).await;
}

async fn write_through_holds_fresh_batches(contiguous: bool) {
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(50),
        ..ProduceSettings::default()
    };
    let control_store = Arc::new(InMemory::new());
    let h = harness_over(
        vec![LatencyProfile::local()],
        1,
        settings,
        control_store,
        contiguous,
    )
    .await;
    let topic = h
        .control
        .create_topic("cached", 2, BTreeMap::new(), 1)
        .await
        .unwrap();
    // Interleaved: p0, p1, p0 land in one file whose layout groups p0's batches first.
    let tickets = vec![
        partition_batches(topic, 0, &[2], NO_PRODUCER),
        partition_batches(topic, 1, &[3, 1], NO_PRODUCER),
        partition_batches(topic, 0, &[4], NO_PRODUCER),
    ];
    let mut originals: BTreeMap<(i32, i64), Bytes> = BTreeMap::new();
    let mut pending = Vec::new();
    for part in tickets {
        pending.push((part.clone(), h.pipeline.submit(ticket(vec![part])).await));
    }
    for (part, outcome) in pending {
        let mut offset = base_offset(&outcome.await[0]);
        for batch in &part.batches {
            originals.insert((part.partition, offset), batch.bytes.clone());
            offset += batch.header.offset_span();
        }
    }
    assert_eq!(ingest_keys(&h.buckets[0].raw).await.len(), 1, "one file");
    let stats = h.cache.stats();
    let key = ingest_keys(&h.buckets[0].raw).await.remove(0);
    let bookkeeping = 4 * weir_storage::entry_overhead(&key);
    let total: usize = originals.values().map(Bytes::len).sum();
    assert_eq!((stats.entries, stats.bytes), (4, total + bookkeeping));
    for partition in 0..2 {
        for entry in partition_view(&h.control, topic, partition).2 {
            let key = file_key(entry.file_id);
            let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
            let cached = h.cache.get(&key, range.clone()).expect("cached");
            assert_eq!(
                cached,
                originals[&(partition, entry.base_offset)],
                "partition {partition} offset {}",
                entry.base_offset
            );
            let stored = h.buckets[0].raw.get_range(&key, range).await.unwrap();
            assert_eq!(cached, stored, "cache and bucket agree");
            assert_eq!(
                cached.as_ptr() == stored.as_ptr(),
                contiguous,
                "the cache shares the bucket's buffer exactly when payloads are contiguous"
            );
        }
    }
    assert_eq!(h.cache.stats().hits, 4);
}

/// A request frame that records when its last reference is gone.
struct TrackedFrame {
    bytes: Vec<u8>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

impl AsRef<[u8]> for TrackedFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for TrackedFrame {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A produce of one small batch at the start of a 1 MiB request frame, committed; returns the
/// flag the frame sets when its last reference is gone.
async fn produce_from_large_frame(h: &Harness, topic: &str) -> Arc<std::sync::atomic::AtomicBool> {
    let topic_id = h
        .control
        .create_topic(topic, 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    let batch = build_test_batch(1, 1_000, NO_PRODUCER);
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut bytes = batch.to_vec();
    bytes.resize(1024 * 1024, 0);
    let frame = Bytes::from_owner(TrackedFrame {
        bytes,
        dropped: dropped.clone(),
    });
    let part = PartitionBatches {
        topic_id,
        partition: 0,
        batches: split_and_validate(&frame.slice(0..batch.len())).unwrap(),
    };
    drop(frame);
    let outcome = h.pipeline.submit(ticket(vec![part])).await.await;
    assert_eq!(base_offset(&outcome[0]), 0, "committed");
    dropped
}

/// Whether the frame is gone within a second (the pipeline may drop its last references to the
/// ticket just after answering).
async fn frame_dropped(dropped: &std::sync::atomic::AtomicBool) -> bool {
    for _ in 0..100 {
        if dropped.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    dropped.load(std::sync::atomic::Ordering::SeqCst)
}

/// The write-through cache keeps copies of the batches, not slices of the request frame: a large
/// frame with one small batch must not stay resident while the cache charges the batch alone.
#[tokio::test(start_paused = true)]
async fn test_pipeline_cache_does_not_pin_the_request_frame() {
    let h = harness(vec![LatencyProfile::local()], 1, ProduceSettings::default()).await;
    let dropped = produce_from_large_frame(&h, "pinned").await;
    assert_eq!(h.cache.stats().entries, 1, "the batch is cached");
    assert!(
        frame_dropped(&dropped).await,
        "the cached batch keeps its 1 MiB request frame alive"
    );
    assert_eq!(
        h.cache.stats().entries,
        1,
        "still cached after the frame is gone"
    );
}

/// Writes that outlive the quorum (a copy still going to a slow bucket) do not keep the request
/// frame alive either: the upload sends copies of the batches, not slices of frames.
#[tokio::test(start_paused = true)]
async fn test_pipeline_lagging_write_does_not_pin_the_request_frame() {
    let profiles = vec![LatencyProfile::local(), fixed_put(3_600_000)];
    let h = harness(profiles, 1, ProduceSettings::default()).await;
    let dropped = produce_from_large_frame(&h, "lagging").await;
    let released = frame_dropped(&dropped).await;
    assert!(
        ingest_keys(&h.buckets[1].raw).await.is_empty(),
        "the slow bucket's write is still in flight"
    );
    assert!(
        released,
        "the lagging write keeps its 1 MiB request frame alive"
    );
}
