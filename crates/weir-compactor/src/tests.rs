//! The planner and worker against a real control plane, produce pipeline and fetch reader on
//! in-memory buckets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStore;
use weir_common::{FileId, ManualClock, Tier, TopicId};
use weir_control::{ControlPlane, ControlPlaneSettings, Entry, LogStartCause, LogStartMove};
use weir_fetch::FetchReader;
use weir_objq::cas::ObjectStoreCas;
use weir_objq::{LocalNetwork, Member};
use weir_produce::{
    PartitionBatches, PartitionOutcome, ProducePipeline, ProduceSettings, ProduceTicket,
};
use weir_protocol::batch::{build_test_batch, split_and_validate};
use weir_storage::{QuorumWriter, ReadCache};

use crate::{Compactor, JobOutcome, JobSpec, Outstanding, Settings};

struct Harness {
    control: ControlPlane,
    topic: TopicId,
    ingest: Arc<QuorumWriter>,
    regional: Arc<InMemory>,
    compactor: Arc<Compactor>,
    queue: Arc<Member>,
}

fn settings() -> Settings {
    Settings {
        min_input_age: Duration::ZERO,
        max_input_age: Duration::ZERO,
        job_lease: Duration::from_millis(400),
        ..Settings::default()
    }
}

/// `files` produce requests of two batches on partition 0 and one on partition 1, each its own
/// file.
async fn harness(files: usize) -> Harness {
    harness_with(files, settings()).await
}

async fn harness_with(files: usize, compactor_settings: Settings) -> Harness {
    let buckets: Vec<Arc<dyn ObjectStore>> =
        (0..2).map(|_| Arc::new(InMemory::new()) as _).collect();
    let ingest = Arc::new(QuorumWriter::new(buckets, 2).unwrap());
    let meta = Arc::new(InMemory::new());
    let control = ControlPlane::open(meta.clone(), ControlPlaneSettings::default(), 1)
        .await
        .unwrap();
    let topic = control
        .create_topic("t", 2, BTreeMap::new(), 1)
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let pipeline = ProducePipeline::start(
        ProduceSettings::default(),
        ingest.clone(),
        control.clone(),
        Arc::new(ReadCache::new(0)),
        clock.clone(),
        1,
    );
    for i in 0..files as i64 {
        let batches = |partition, count: i64| PartitionBatches {
            topic_id: topic,
            partition,
            batches: (0..count)
                .flat_map(|j| {
                    split_and_validate(&build_test_batch(3, 1_000 + 10 * i + j, (-1, -1, -1)))
                        .unwrap()
                })
                .collect(),
        };
        let ticket = ProduceTicket {
            partitions: vec![batches(0, 2), batches(1, 1)],
        };
        let outcome = pipeline.submit(ticket).await.await;
        assert!(outcome
            .iter()
            .all(|o| matches!(o, PartitionOutcome::Committed { .. })));
        clock.advance_ms(5);
    }
    let regional = Arc::new(InMemory::new());
    let queue_settings = weir_objq::Settings {
        lease: settings().job_lease,
        broker_timeout: Duration::from_millis(100),
        write_retry: Duration::from_millis(10),
        ..weir_objq::Settings::default()
    };
    let queue = Arc::new(Member::new(
        "agent-1",
        "local",
        Arc::new(ObjectStoreCas::new(meta, Path::from("queue/compaction"))),
        LocalNetwork::new(&queue_settings),
        queue_settings,
    ));
    let compactor = Arc::new(Compactor::new(
        control.clone(),
        ingest.clone(),
        regional.clone(),
        queue.clone(),
        clock,
        compactor_settings,
        7,
    ));
    Harness {
        control,
        topic,
        ingest,
        regional,
        compactor,
        queue,
    }
}

impl Harness {
    /// Every batch of both partitions as a fetch returns it.
    async fn read_all(&self) -> Vec<bytes::Bytes> {
        let mut out = Vec::new();
        for partition in 0..2 {
            out.push(self.read(partition, 0, usize::MAX).await);
        }
        out
    }

    /// What a fetch of `partition` from `offset` for `max_bytes` returns.
    async fn read(&self, partition: i32, offset: i64, max_bytes: usize) -> bytes::Bytes {
        let regional: Arc<dyn ObjectStore> = self.regional.clone();
        let reader = FetchReader::new(
            self.control.clone(),
            self.ingest.clone(),
            Arc::new(ReadCache::new(0)),
        )
        .with_regional(Arc::new(QuorumWriter::new(vec![regional], 1).unwrap()));
        let plan = reader
            .plan(&self.topic, partition, offset, max_bytes, true)
            .unwrap();
        reader.read(plan).await.unwrap().records.to_bytes()
    }

    /// Every fetch of one batch's worth from every offset of both partitions.
    async fn read_every_offset(&self) -> Vec<bytes::Bytes> {
        let mut out = Vec::new();
        for partition in 0..2 {
            let end = self
                .control
                .read(|s| s.topics["t"].partitions[partition as usize].high_watermark);
            for offset in 0..end {
                out.push(self.read(partition, offset, 1).await);
            }
        }
        out
    }

    fn index_entries(&self) -> usize {
        self.control
            .read(|s| s.topics["t"].partitions.iter().map(|p| p.index.len()).sum())
    }

    fn tiers(&self) -> Vec<Tier> {
        self.control.read(|state| {
            state.topics["t"]
                .partitions
                .iter()
                .flat_map(|p| p.index.iter().map(|e| state.files[&e.file_id].tier))
                .collect()
        })
    }

    async fn regional_objects(&self) -> usize {
        futures::StreamExt::count(self.regional.list(None)).await
    }
}

#[tokio::test]
async fn test_compaction_moves_everything_and_reads_back_identical() {
    let h = harness(6).await;
    let before = h.read_all().await;
    let mut outstanding = Outstanding::default();
    assert_eq!(h.compactor.plan_once(&mut outstanding).await.unwrap(), 1);
    assert_eq!(outstanding.len(), 6, "six input files planned");
    let stats = h.compactor.stats();
    assert_eq!((stats.jobs_outstanding, stats.files_outstanding), (1, 6));
    assert_eq!(
        h.compactor.plan_once(&mut outstanding).await.unwrap(),
        0,
        "a planned file is not planned twice"
    );
    assert!(h.compactor.work_once("w").await.unwrap());
    assert!(h.tiers().iter().all(|t| *t == Tier::Regional));
    let (live_ingest, released) = h.control.read(|s| {
        (
            s.files.values().filter(|m| m.tier == Tier::Ingest).count(),
            s.released.len(),
        )
    });
    assert_eq!((live_ingest, released), (0, 6), "every input released");
    assert_eq!(
        h.read_all().await,
        before,
        "byte-identical after compaction"
    );
    assert_eq!(h.regional_objects().await, 1);
    let stats = h.compactor.stats();
    assert_eq!(
        (stats.jobs_done, stats.batches_moved, stats.input_files),
        (1, 18, 6)
    );
    assert!(
        h.queue.snapshot().await.unwrap().jobs.is_empty(),
        "the job was acked"
    );
    // The files left the ingest tier: the planner forgets them.
    assert_eq!(h.compactor.plan_once(&mut outstanding).await.unwrap(), 0);
    assert!(outstanding.is_empty());
    let stats = h.compactor.stats();
    assert_eq!((stats.jobs_outstanding, stats.files_outstanding), (0, 0));
}

/// The same job run twice commits once: the second run's swap is refused and its output
/// deleted, and the data still reads back.
#[tokio::test]
async fn test_compaction_job_run_twice_commits_once() {
    let h = harness(3).await;
    let before = h.read_all().await;
    let inputs: Vec<FileId> = h.control.read(|s| s.files.keys().copied().collect());
    let spec = JobSpec::new(&inputs).encode();
    h.queue.push(vec![spec.clone(), spec]).await.unwrap();
    assert!(h.compactor.work_once("w1").await.unwrap());
    // The second copy finds nothing of its inputs live: nothing to do.
    assert!(h.compactor.work_once("w2").await.unwrap());
    assert_eq!(h.regional_objects().await, 1);
    assert_eq!(h.read_all().await, before);
    // A run that read the inputs before the first swap and commits after it: refused.
    let h = harness(3).await;
    let before = h.read_all().await;
    let inputs: Vec<FileId> = h.control.read(|s| s.files.keys().copied().collect());
    let gathered = h.control.read(|s| crate::merge::gather(s, &inputs));
    assert_eq!(
        h.compactor.compact(1, &inputs).await.unwrap(),
        JobOutcome::Done(weir_control::ReplaceOutcome {
            replaced: 9,
            skipped: 0
        })
    );
    let stale = build(&gathered, &read_inputs(&h, &gathered).await);
    let result = h
        .control
        .submit(swap(FileId(u128::MAX), &gathered, stale))
        .await
        .unwrap();
    assert!(
        matches!(
            result,
            weir_control::EntryResult::ReplaceFiles(Err(
                weir_control::ControlError::ReplaceConflict(_)
            ))
        ),
        "{result:?}"
    );
    assert_eq!(
        h.read_all().await,
        before,
        "the refused swap changed nothing"
    );
    assert_eq!(h.regional_objects().await, 1, "only the committed output");
}

fn build(
    gathered: &crate::merge::Gathered,
    bytes: &std::collections::HashMap<FileId, bytes::Bytes>,
) -> crate::merge::Output {
    crate::merge::build(gathered, bytes, settings().max_run_bytes).unwrap()
}

/// The swap a worker submits for `output` (never written to a bucket here).
fn swap(id: FileId, gathered: &crate::merge::Gathered, output: crate::merge::Output) -> Entry {
    Entry::ReplaceFiles(weir_control::FileReplace {
        job: 1,
        output: id,
        tier: Tier::Regional,
        holders: vec![0],
        size: output.file.total_len,
        batches: Vec::new(),
        inputs: gathered.inputs.keys().copied().collect(),
        runs: output.runs,
    })
}

async fn read_inputs(
    h: &Harness,
    gathered: &crate::merge::Gathered,
) -> std::collections::HashMap<FileId, bytes::Bytes> {
    let mut out = std::collections::HashMap::new();
    for (id, (size, holders)) in &gathered.inputs {
        let holders: Vec<usize> = holders.iter().map(|h| *h as usize).collect();
        let key = weir_storage::keys::data_file(Tier::Ingest, id);
        out.insert(
            *id,
            h.ingest.get_range(&holders, &key, 0..*size).await.unwrap(),
        );
    }
    out
}

/// Retention that moves a partition's start while a job runs: the gone batches are skipped,
/// the rest move.
#[tokio::test]
async fn test_compaction_skips_what_retention_removed_meanwhile() {
    let h = harness(4).await;
    let inputs: Vec<FileId> = h.control.read(|s| s.files.keys().copied().collect());
    let gathered = h.control.read(|s| crate::merge::gather(s, &inputs));
    let bytes = read_inputs(&h, &gathered).await;
    let output = build(&gathered, &bytes);
    // Partition 0 loses its first two files' batches (offsets 0..12) before the swap.
    h.control
        .submit(Entry::AdvanceLogStart {
            topic_id: h.topic,
            partitions: vec![LogStartMove {
                partition: 0,
                offset: 12,
            }],
            cause: LogStartCause::DeleteRecords,
        })
        .await
        .unwrap();
    let output_id = FileId::new(1_700_000_000_100, &mut fastrand::Rng::with_seed(1));
    let result = h
        .control
        .submit(swap(output_id, &gathered, output))
        .await
        .unwrap();
    let weir_control::EntryResult::ReplaceFiles(Ok(outcome)) = result else {
        panic!("{result:?}");
    };
    assert_eq!((outcome.replaced, outcome.skipped), (8, 4));
}

/// A worker that claims a job and dies: after one lease another worker runs it.
#[tokio::test]
async fn test_compaction_job_of_a_dead_worker_is_run_again_after_the_lease() {
    let h = harness(2).await;
    let mut outstanding = Outstanding::default();
    h.compactor.plan_once(&mut outstanding).await.unwrap();
    let claimed = h.queue.claim("dead").await.unwrap().expect("a job");
    assert!(
        !h.compactor.work_once("w").await.unwrap(),
        "held by the dead worker"
    );
    tokio::time::sleep(settings().job_lease + Duration::from_millis(100)).await;
    assert!(h.compactor.work_once("w").await.unwrap());
    assert!(h.tiers().iter().all(|t| *t == Tier::Regional));
    assert!(
        h.queue.ack("dead", claimed.id).await.is_err(),
        "the dead worker lost it"
    );
}

/// Runs of batches become one index entry each; a fetch from any offset returns what it
/// returned before compaction (the batch holding the offset first, nothing below it), also
/// when runs are cut small.
#[tokio::test]
async fn test_compaction_runs_shrink_the_index_and_fetches_from_any_offset_are_unchanged() {
    for max_run_bytes in [1 << 20, 200] {
        let h = harness(6).await;
        let every = h.read_every_offset().await;
        assert_eq!(h.index_entries(), 18);
        let inputs: Vec<FileId> = h.control.read(|s| s.files.keys().copied().collect());
        let gathered = h.control.read(|s| crate::merge::gather(s, &inputs));
        let bytes = read_inputs(&h, &gathered).await;
        let output = crate::merge::build(&gathered, &bytes, max_run_bytes).unwrap();
        let runs = output.runs.len();
        let id = FileId::new(1_700_000_000_100, &mut fastrand::Rng::with_seed(1));
        let key = weir_storage::keys::data_file(Tier::Regional, &id);
        let payload: object_store::PutPayload = output.file.parts.iter().cloned().collect();
        object_store::ObjectStoreExt::put(h.regional.as_ref(), &key, payload)
            .await
            .unwrap();
        let result = h.control.submit(swap(id, &gathered, output)).await.unwrap();
        assert!(
            matches!(result, weir_control::EntryResult::ReplaceFiles(Ok(_))),
            "{result:?}"
        );
        assert_eq!(h.index_entries(), runs);
        if max_run_bytes == 1 << 20 {
            assert_eq!(runs, 2, "one run per partition");
        } else {
            assert!(runs > 2 && runs < 18, "{runs} runs of at most 200 bytes");
        }
        assert_eq!(
            h.read_every_offset().await,
            every,
            "max_run_bytes {max_run_bytes}"
        );
    }
}

/// An output above the multipart threshold is written in parts and reads back the same.
#[tokio::test]
async fn test_compaction_large_output_goes_multipart_and_reads_back_identical() {
    let h = harness_with(
        4,
        Settings {
            multipart_threshold: 0,
            ..settings()
        },
    )
    .await;
    let before = h.read_every_offset().await;
    let inputs: Vec<FileId> = h.control.read(|s| s.files.keys().copied().collect());
    assert!(matches!(
        h.compactor.compact(1, &inputs).await.unwrap(),
        JobOutcome::Done(_)
    ));
    assert!(h.tiers().iter().all(|t| *t == Tier::Regional));
    assert_eq!(h.regional_objects().await, 1);
    assert_eq!(h.read_every_offset().await, before);
}
