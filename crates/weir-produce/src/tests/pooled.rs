//! The pooled (appendable) ingest path: files are appended into objects the WriterPool created
//! ahead of need, on in-memory doubles of GCS Rapid under the latency model, time paused.

use weir_format::decode_file;
use weir_storage::append::ingest::IngestLoader;
use weir_storage::append::memory::MemoryAppendable;
use weir_storage::append::AppendableStore;
use weir_storage::pool::{PoolSettings, WriterPool};

use super::*;
use crate::IngestWrites;

struct Pooled {
    pipeline: ProducePipeline,
    control: ControlPlane,
    doubles: Vec<MemoryAppendable>,
    models: Vec<Arc<ModelStore>>,
    pool: crate::IngestPool,
}

async fn pooled(n: usize, quorum: usize, settings: ProduceSettings) -> Pooled {
    let profile = LatencyProfile::named("gcs-rapid").unwrap();
    let doubles: Vec<MemoryAppendable> = (0..n).map(|_| MemoryAppendable::gcs_rapid()).collect();
    let models: Vec<Arc<ModelStore>> = doubles
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Arc::new(ModelStore::new(Arc::new(d.clone()), profile.clone(), 200 + i as u64).unwrap())
        })
        .collect();
    let objects: Vec<Arc<dyn ObjectStore>> = models
        .iter()
        .map(|m| m.clone() as Arc<dyn ObjectStore>)
        .collect();
    let appendable: Vec<Arc<dyn AppendableStore>> = models
        .iter()
        .zip(&doubles)
        .map(|(m, d)| m.appendable(Arc::new(d.clone())))
        .collect();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_700_000_000_000));
    let loader = IngestLoader::new(appendable, objects.clone(), quorum, clock.clone(), 9).unwrap();
    let pool = WriterPool::start(
        loader,
        // The defaults: sized for one file per 5 ms flush against Rapid's create latency.
        PoolSettings::default(),
    );
    let writer = Arc::new(QuorumWriter::new(objects, quorum).unwrap());
    let control = ControlPlane::open(
        Arc::new(InMemory::new()),
        ControlPlaneSettings::default(),
        7,
    )
    .await
    .unwrap();
    let cache = Arc::new(ReadCache::new(64 * 1024 * 1024));
    let pipeline = ProducePipeline::start_with(
        settings,
        writer,
        IngestWrites::Pool(pool.clone()),
        control.clone(),
        cache,
        clock,
        42,
    );
    Pooled {
        pipeline,
        control,
        doubles,
        models,
        pool,
    }
}

/// Every index entry's batch is in each of its file's holders (at least `quorum`), where the
/// file's footer places it. Buckets outside the holder list may have an empty or partial copy.
async fn check_files_readable(p: &Pooled, topic: TopicId, quorum: usize) {
    let (_, _, index) = partition_view(&p.control, topic, 0);
    assert!(!index.is_empty());
    for entry in index {
        let key = keys::data_file(keys::Tier::Ingest, &entry.file_id);
        let holders = p
            .control
            .read(|state| state.files.get(&entry.file_id).map(|f| f.buckets.clone()))
            .expect("committed file has a record");
        assert!(holders.len() >= quorum, "{key} held by {holders:?}");
        for holder in holders {
            let got = p.doubles[holder as usize].get(&key).await.unwrap();
            let bytes = got.bytes().await.unwrap();
            let footer = decode_file(&bytes).unwrap();
            let located = footer
                .partitions
                .iter()
                .flat_map(|section| &section.batches)
                .any(|b| b.offset == entry.byte_offset && b.len == entry.len);
            assert!(located, "{key}: no batch at {}", entry.byte_offset);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn test_pooled_pipeline_commits_files_appended_into_pooled_objects() {
    let p = pooled(3, 2, file_per_ticket()).await;
    let topic = p
        .control
        .create_topic("pooled", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    // Let the pool fill before the first file, as an agent does after its start.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..20 {
        let outcome = p.pipeline.submit(single(topic, 0, 2)).await.await;
        assert_eq!(outcome, vec![committed(2 * i)]);
    }
    check_files_readable(&p, topic, 2).await;
    let stats = p.pool.stats();
    assert_eq!(stats.misses, 0, "{stats:?}");
    assert_eq!(stats.hits, 20);
    // Every file was named by its pooled item: the committed ids are ones the pool made.
    let (_, _, index) = partition_view(&p.control, topic, 0);
    let mut files: Vec<_> = index.iter().map(|e| e.file_id).collect();
    files.dedup();
    assert_eq!(files.len(), 20);
}

#[tokio::test(start_paused = true)]
async fn test_pooled_pipeline_survives_one_bucket_down() {
    let p = pooled(3, 2, file_per_ticket()).await;
    p.models[1].set_outage(true);
    let topic = p
        .control
        .create_topic("one-down", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..10 {
        let outcome = p.pipeline.submit(single(topic, 0, 1)).await.await;
        assert_eq!(outcome, vec![committed(i)]);
    }
    check_files_readable(&p, topic, 2).await;
    assert_eq!(p.pool.stats().misses, 0);
}

#[tokio::test(start_paused = true)]
async fn test_pooled_pipeline_fails_cleanly_without_a_quorum() {
    let p = pooled(3, 2, file_per_ticket()).await;
    let topic = p
        .control
        .create_topic("two-down", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.models[0].set_outage(true);
    p.models[2].set_outage(true);
    let outcome = p.pipeline.submit(single(topic, 0, 1)).await.await;
    assert!(
        matches!(
            &outcome[0],
            PartitionOutcome::Failed(ProduceError::Storage(_))
        ),
        "{outcome:?}"
    );
    let (hw, _, index) = partition_view(&p.control, topic, 0);
    assert_eq!((hw, index.len()), (0, 0), "nothing committed");
}
