use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use weir_common::ManualClock;
use weir_control::ControlPlaneSettings;
use weir_produce::{
    PartitionBatches, PartitionOutcome, ProducePipeline, ProduceSettings, ProduceTicket,
};
use weir_protocol::batch::{build_test_batch, rewrite_offsets, split_and_validate, BatchHeader};
use weir_storage::{LatencyProfile, ModelStore, OpLatency};

use super::*;

/// Counts GETs: how many in all, and the most in flight at once.
#[derive(Debug)]
struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    gets: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl std::fmt::Display for CountingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CountingStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = self.inner.get_opts(location, options).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// A control plane on an in-memory log with one topic "t" of one partition.
async fn control_with_topic() -> (ControlPlane, TopicId) {
    let control = ControlPlane::open(
        Arc::new(InMemory::new()),
        ControlPlaneSettings::default(),
        1,
    )
    .await
    .unwrap();
    let topic = control
        .create_topic("t", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    (control, topic)
}

/// A partition over one bucket (GETs take 100 ms of the paused clock, counted by the returned
/// store), filled with one committed ticket per entry of `tickets`, each a list of batch
/// timestamps. `max_file_bytes` 1 makes every ticket its own file.
async fn partition_with(
    tickets: &[Vec<i64>],
    max_file_bytes: usize,
    cache_bytes: usize,
) -> (FetchReader, TopicId, Arc<CountingStore>, Arc<ModelStore>) {
    let tickets: Vec<Vec<Bytes>> = tickets
        .iter()
        .map(|timestamps| {
            timestamps
                .iter()
                .map(|ts| build_test_batch(2, *ts, (-1, -1, -1)))
                .collect()
        })
        .collect();
    partition_of(&tickets, max_file_bytes, cache_bytes).await
}

/// As [`partition_with`], with each ticket's batches given.
async fn partition_of(
    tickets: &[Vec<Bytes>],
    max_file_bytes: usize,
    cache_bytes: usize,
) -> (FetchReader, TopicId, Arc<CountingStore>, Arc<ModelStore>) {
    let mut profile = LatencyProfile::local();
    profile.name = "get-100ms".into();
    profile.get = OpLatency::millis(100, 100);
    let model = Arc::new(ModelStore::new(Arc::new(InMemory::new()), profile, 1).unwrap());
    // Outside the model, so a GET counts as in flight for its whole modelled latency.
    let counting = Arc::new(CountingStore {
        inner: model.clone(),
        gets: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
    });
    let bucket: Arc<dyn ObjectStore> = counting.clone();
    let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
    let (control, topic) = control_with_topic().await;
    let cache = Arc::new(ReadCache::new(cache_bytes));
    let pipeline = ProducePipeline::start(
        ProduceSettings {
            max_file_bytes,
            ..ProduceSettings::default()
        },
        writer.clone(),
        control.clone(),
        cache.clone(),
        Arc::new(ManualClock::new(1_700_000_000_000)),
        1,
    );
    let submitted: Vec<_> = tickets
        .iter()
        .map(|batches| ProduceTicket {
            partitions: vec![PartitionBatches {
                topic_id: topic,
                partition: 0,
                batches: batches
                    .iter()
                    .flat_map(|batch| split_and_validate(batch).unwrap())
                    .collect(),
            }],
        })
        .collect();
    for ticket in submitted {
        let outcome = pipeline.submit(ticket).await.await;
        assert!(matches!(outcome[0], PartitionOutcome::Committed { .. }));
    }
    (
        FetchReader::new(control, writer, cache),
        topic,
        counting,
        model,
    )
}

/// Batches of a fetch result in order: (base offset, first timestamp).
fn batches_of(data: &PartitionData) -> Vec<(i64, i64)> {
    let mut position = 0;
    let mut out = Vec::new();
    let records = data.records.to_bytes();
    while position < records.len() {
        let header = BatchHeader::parse(&records[position..]).unwrap();
        out.push((header.base_offset, header.first_timestamp));
        position += header.total_len();
    }
    out
}

/// A plan over several cold files reads them concurrently: every file's GET is in flight at
/// the same time (counted at the store, not timed), and every batch still comes back in
/// offset order with its offset rewritten.
#[tokio::test(start_paused = true)]
async fn test_read_fetches_cold_files_concurrently_in_order() {
    let files = 6;
    let tickets: Vec<Vec<i64>> = (0..files).map(|i| vec![1_000 + i]).collect();
    // A cache too small for any batch: every read goes to storage.
    let (reader, topic, store, _) = partition_with(&tickets, 1, 0).await;
    let plan = reader.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    assert_eq!(plan.entries.len(), files as usize);
    let gets_before = store.gets.load(Ordering::SeqCst);
    let data = reader.read(plan).await.unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets_before,
        files as usize
    );
    assert_eq!(
        store.most_in_flight.load(Ordering::SeqCst),
        files as usize,
        "the cold files were not all read at once"
    );
    let expected: Vec<(i64, i64)> = (0..files).map(|i| (2 * i, 1_000 + i)).collect();
    assert_eq!(batches_of(&data), expected);
}

/// Batches produced together share a file and sit next to each other, and the produce path
/// caches each batch as its own range. A fetch of all of them must be served from those
/// per-batch cache entries (not coalesced into one file range the cache never holds): with
/// the bucket down, it still succeeds, and no GET reaches the store.
#[tokio::test(start_paused = true)]
async fn test_read_serves_adjacent_batches_of_one_file_from_the_cache() {
    let tickets = vec![vec![1_000, 1_001, 1_002, 1_003]];
    let (reader, topic, store, bucket) = partition_with(&tickets, 1 << 20, 64 * 1024 * 1024).await;
    let plan = reader.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    assert_eq!(plan.entries.len(), 4);
    let files: std::collections::BTreeSet<_> =
        plan.entries.iter().map(|(e, _)| e.file_id).collect();
    assert_eq!(
        files.len(),
        1,
        "the batches must share one file to be coalescible"
    );
    bucket.set_outage(true);
    let gets_before = store.gets.load(Ordering::SeqCst);
    let data = reader.read(plan).await.expect("served from the cache");
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets_before,
        "a GET went to storage"
    );
    assert_eq!(
        batches_of(&data),
        vec![(0, 1_000), (2, 1_001), (4, 1_002), (6, 1_003)]
    );
}

/// `reader` with a fresh, empty cache of `cache_bytes` and read-ahead of `window` bytes: a
/// consumer behind the tip whose batches the produce path's write-through no longer holds.
fn cold(reader: &FetchReader, cache_bytes: usize, window: u64) -> FetchReader {
    FetchReader {
        cache: Arc::new(ReadCache::new(cache_bytes)),
        inflight: Arc::default(),
        read_ahead: None,
        ..reader.clone()
    }
    .with_read_ahead(window)
}

/// Bytes of the first `n` batches of the partition.
fn bytes_of_first(reader: &FetchReader, topic: &TopicId, n: usize) -> u64 {
    let plan = reader.plan(topic, 0, 0, usize::MAX, true).unwrap();
    plan.entries[..n]
        .iter()
        .map(|(e, _)| u64::from(e.len))
        .sum()
}

/// A fetch behind the tip starts loading the partition's next window; once loaded, the next
/// fetches are served from the cache with the bucket down, and a fetch half-way through the
/// window loads the next one.
#[tokio::test(start_paused = true)]
async fn test_read_ahead_loads_the_next_window_into_the_cache() {
    let tickets: Vec<Vec<i64>> = (0..40).map(|i| vec![1_000 + i]).collect();
    let (warm, topic, store, bucket) = partition_with(&tickets, 1, 0).await;
    // Every batch is its own file and about the same size: a window of 8 batches.
    let window = bytes_of_first(&warm, &topic, 8);
    let reader = cold(&warm, 64 << 20, window);
    let two = bytes_of_first(&warm, &topic, 2) as usize;
    let gets = store.gets.load(Ordering::SeqCst);
    let plan = reader.plan(&topic, 0, 0, two, true).unwrap();
    assert_eq!(plan.entries.len(), 2);
    reader.read(plan).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets,
        2 + 8,
        "the fetch's 2 batches and the 8 after them"
    );
    // Batches 2..10 are cached: the next two fetches send no GET of their own. The second
    // ends at batch 6, past half-way (batch 5), and loads on from the frontier (batch 10) to
    // 8 batches past its end: 4 more GETs.
    let before = store.gets.load(Ordering::SeqCst);
    for offset in [4, 8] {
        let plan = reader.plan(&topic, 0, offset, two, true).unwrap();
        let data = reader.read(plan).await.unwrap();
        assert_eq!(batches_of(&data)[0].0, offset);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.gets.load(Ordering::SeqCst) - before, 4);
    // Batches 10..14 are cached: served with the bucket down.
    bucket.set_outage(true);
    let plan = reader.plan(&topic, 0, 20, 2 * two, true).unwrap();
    let data = reader.read(plan).await.expect("served from the read-ahead");
    assert_eq!(
        batches_of(&data),
        (10..14).map(|i| (2 * i, 1_000 + i)).collect::<Vec<_>>()
    );
}

/// A fetch whose batches read-ahead is still loading waits for those GETs: one GET per range
/// in all, and the fetch gets every batch in order.
#[tokio::test(start_paused = true)]
async fn test_a_fetch_joins_the_read_ahead_in_flight() {
    let tickets: Vec<Vec<i64>> = (0..20).map(|i| vec![1_000 + i]).collect();
    let (warm, topic, store, _) = partition_with(&tickets, 1, 0).await;
    let window = bytes_of_first(&warm, &topic, 8);
    let reader = cold(&warm, 64 << 20, window);
    let two = bytes_of_first(&warm, &topic, 2) as usize;
    let gets = store.gets.load(Ordering::SeqCst);
    reader
        .read(reader.plan(&topic, 0, 0, two, true).unwrap())
        .await
        .unwrap();
    // Read-ahead of batches 2..10 was started with the first fetch and is still in flight
    // (the first fetch's GETs took the same 100 ms).
    assert!(reader.inflight.len() > 0, "read-ahead is loading");
    let plan = reader.plan(&topic, 0, 4, 4 * two, true).unwrap();
    let data = reader.read(plan).await.unwrap();
    let expected: Vec<(i64, i64)> = (2..10).map(|i| (2 * i, 1_000 + i)).collect();
    assert_eq!(batches_of(&data), expected);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let batches_read = store.gets.load(Ordering::SeqCst) - gets;
    // 2 + 8 loaded ahead (the first fetch's), then the second fetch (ending at batch 10) was
    // past half-way and loaded 8 more: every batch once.
    assert_eq!(batches_read, 2 + 8 + 8, "no batch was read twice");
}

/// A fetch that reaches the high watermark reads nothing ahead, and read-ahead never plans at
/// or past it.
#[tokio::test(start_paused = true)]
async fn test_no_read_ahead_at_the_tip() {
    let tickets: Vec<Vec<i64>> = (0..6).map(|i| vec![1_000 + i]).collect();
    let (warm, topic, store, _) = partition_with(&tickets, 1, 0).await;
    let reader = cold(&warm, 64 << 20, 1 << 20);
    let gets = store.gets.load(Ordering::SeqCst);
    let plan = reader.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    reader.read(plan).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store.gets.load(Ordering::SeqCst) - gets,
        6,
        "only the fetch's own"
    );
    // Behind the tip by 2 batches with a window far larger: only those 2 are loaded.
    let reader = cold(&warm, 64 << 20, 1 << 20);
    let gets = store.gets.load(Ordering::SeqCst);
    let four = bytes_of_first(&warm, &topic, 4) as usize;
    reader
        .read(reader.plan(&topic, 0, 0, four, true).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.gets.load(Ordering::SeqCst) - gets, 4 + 2);
}

/// A stored batch too short for the fields a fetch rewrites (a damaged object) fails the read
/// with a storage error instead of panicking the connection's task.
#[tokio::test(start_paused = true)]
async fn test_a_batch_shorter_than_its_rewritten_fields_is_an_error() {
    let (reader, topic, _, _) = partition_with(&[vec![1_000]], 1, 0).await;
    let plan = reader.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    let (entry, _) = plan.entries[0];
    let (mut out, mut taken) = (Vec::new(), 0);
    let mut read = |bytes: Bytes| {
        let backing = Backing::of(&bytes);
        entry_batches(&mut out, &mut taken, bytes, backing, &entry, &plan).unwrap_err()
    };
    let err = read(Bytes::from_static(&[0u8; 12]));
    assert!(
        matches!(err, FetchError::Storage(ref m) if m.contains("shorter")),
        "{err}"
    );
    // A run whose first header claims a batch smaller than a header (batchLength 0).
    let err = read(Bytes::from_static(&[0u8; 130]));
    assert!(
        matches!(err, FetchError::Storage(ref m) if m.contains("a batch of 12 bytes")),
        "{err}"
    );
    assert!(out.is_empty());
}

/// Batches the produce path cached go out as slices of the cached buffers, with only their
/// first 16 bytes copied (and rewritten); a small batch is copied whole. The record set is the
/// batches with their assigned offsets either way.
#[tokio::test(start_paused = true)]
async fn test_large_cached_batches_are_served_as_slices_of_the_cache() {
    let large = build_test_batch(600, 1_000, (-1, -1, -1));
    assert!(large.len() >= crate::assemble::SLICE_FROM);
    let small = build_test_batch(2, 2_000, (-1, -1, -1));
    let tickets = vec![
        vec![large.clone()],
        vec![small.clone()],
        vec![large.clone()],
    ];
    let (reader, topic, store, _) = partition_of(&tickets, 1, 64 << 20).await;
    let plan = reader.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    let entries: Vec<IndexEntry> = plan.entries.iter().map(|(e, _)| *e).collect();
    let data = reader.read(plan).await.unwrap();
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        0,
        "served from the cache"
    );
    // The bodies of both large batches point into the cached batches.
    for entry in [&entries[0], &entries[2]] {
        let key = keys::data_file(Tier::Ingest, &entry.file_id);
        let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
        let cached = reader.cache.get(&key, range).unwrap();
        assert!(
            data.records
                .chunks()
                .iter()
                .any(|c| c.as_ptr() == cached[16..].as_ptr() && c.len() == cached.len() - 16),
            "batch at {} was copied",
            entry.base_offset
        );
    }
    let mut expected = Vec::new();
    for (batch, base) in [(&large, 0), (&small, 600), (&large, 602)] {
        let at = expected.len();
        expected.extend_from_slice(batch);
        rewrite_offsets(&mut expected[at..], base, LEADER_EPOCH);
    }
    assert_eq!(data.records.to_bytes(), Bytes::from(expected));
    assert_eq!(data.records.records(), 1_202);
    // Charged the copies (two prefixes and the small batch) and the two cached batches.
    assert_eq!(
        data.records.pinned(),
        16 + small.len() + 16 + 2 * large.len()
    );
}

/// A fetch that goes to storage for a batch read-ahead had loaded (the cache dropped it) halves
/// the partition's window; one served from the loads leaves it alone.
#[tokio::test(start_paused = true)]
async fn test_an_evicted_window_halves() {
    let tickets: Vec<Vec<i64>> = (0..20).map(|i| vec![1_000 + i]).collect();
    let (warm, topic, _, _) = partition_with(&tickets, 1, 0).await;
    let window = bytes_of_first(&warm, &topic, 8);
    let reader = cold(&warm, 64 << 20, window);
    let ahead = reader.read_ahead.clone().unwrap();
    let two = bytes_of_first(&warm, &topic, 2) as usize;
    reader
        .read(reader.plan(&topic, 0, 0, two, true).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ahead.window_of((topic, 0)), Some(window as usize));
    // Batches 2 and 3 loaded; batch 2's file is dropped from the cache.
    let plan = reader.plan(&topic, 0, 4, two, true).unwrap();
    let (entry, location) = &plan.entries[0];
    reader.cache.remove_file(&location.key(&entry.file_id));
    reader.read(plan).await.unwrap();
    assert_eq!(ahead.window_of((topic, 0)), Some(window as usize / 2));
}

/// A consumer just behind the tip, whose batches the produce path cached one entry each in a
/// shared file: read-ahead finds every batch cached and sends no GET.
#[tokio::test(start_paused = true)]
async fn test_read_ahead_skips_batches_cached_one_by_one() {
    let tickets = vec![(1_000..1_012).collect::<Vec<i64>>()];
    let (warm, topic, store, _) = partition_with(&tickets, 1 << 20, 64 << 20).await;
    let plan = warm.plan(&topic, 0, 0, usize::MAX, true).unwrap();
    let files: std::collections::BTreeSet<_> =
        plan.entries.iter().map(|(e, _)| e.file_id).collect();
    assert_eq!(files.len(), 1, "the batches share one file");
    let window = bytes_of_first(&warm, &topic, 8);
    let reader = warm.with_read_ahead(window);
    let two = bytes_of_first(&reader, &topic, 2) as usize;
    let gets = store.gets.load(Ordering::SeqCst);
    reader
        .read(reader.plan(&topic, 0, 0, two, true).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        store.gets.load(Ordering::SeqCst),
        gets,
        "every batch was in the cache"
    );
}

/// Offsets of a reserved file not yet confirmed (RFC 0006) are assigned but unreadable: a fetch
/// there is answered empty, as Kafka answers one between its high watermark and log end; only
/// past every assigned offset is it out of range.
#[tokio::test]
async fn test_a_fetch_between_the_stable_and_the_assigned_high_watermark_is_empty() {
    let (control, topic) = control_with_topic().await;
    control.submit(reserve(topic, 7, "a", None)).await.unwrap();
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
    let reader = FetchReader::new(control, writer, Arc::new(ReadCache::new(1 << 20)));
    for offset in [0, 2, 3] {
        let plan = reader.plan(&topic, 0, offset, 1 << 20, true).unwrap();
        assert!(
            plan.entries.is_empty(),
            "offset {offset}: nothing readable yet"
        );
        assert_eq!(
            plan.high_watermark, 0,
            "the stable high watermark is reported"
        );
    }
    assert!(matches!(
        reader.plan(&topic, 0, 4, 1 << 20, true),
        Err(FetchError::OffsetOutOfRange { .. })
    ));
}

/// A reserved file of one 3-offset batch on partition 0 (RFC 0006).
fn reserve(topic: TopicId, file: u128, agent: &str, previous: Option<u128>) -> weir_control::Entry {
    weir_control::Entry::ReserveFile(weir_control::FileCommit {
        agent: agent.into(),
        previous: previous.map(weir_common::FileId),
        file_id: weir_common::FileId(file),
        size: 100,
        buckets: vec![0, 1],
        batches: vec![weir_control::BatchCommit {
            topic_id: topic,
            partition: 0,
            byte_offset: 0,
            len: 100,
            offset_span: 3,
            first_timestamp: 0,
            max_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }],
    })
}

/// A pending file this agent acknowledged is served before its confirmation is durable, from
/// the buckets the acknowledgement named, and only up to the first pending batch of a file it
/// did not acknowledge (RFC 0006, "Serving acknowledged files").
#[tokio::test]
async fn test_acknowledged_pending_files_are_served_up_to_the_first_unacknowledged_one() {
    let (control, topic) = control_with_topic().await;
    control.submit(reserve(topic, 7, "a", None)).await.unwrap();
    control.submit(reserve(topic, 8, "b", None)).await.unwrap();
    control
        .submit(reserve(topic, 9, "a", Some(7)))
        .await
        .unwrap();
    let buckets: Vec<Arc<dyn ObjectStore>> =
        vec![Arc::new(InMemory::new()), Arc::new(InMemory::new())];
    let writer = Arc::new(QuorumWriter::new(buckets, 1).unwrap());
    let reader = FetchReader::new(control.clone(), writer, Arc::new(ReadCache::new(1 << 20)));
    let planned = |offset| {
        let plan = reader.plan(&topic, 0, offset, 1 << 20, true).unwrap();
        let bases: Vec<i64> = plan.base_offsets().collect();
        (plan.high_watermark, bases)
    };
    assert_eq!(planned(0), (0, vec![]), "nothing acknowledged yet");

    control.serve_acknowledged(weir_common::FileId(9), vec![1]);
    assert_eq!(
        planned(0),
        (0, vec![]),
        "file 7 before it is not acknowledged"
    );
    control.serve_acknowledged(weir_common::FileId(7), vec![1]);
    assert_eq!(
        planned(0),
        (3, vec![0]),
        "up to b's file 8, which a may not serve"
    );
    let plan = reader.plan(&topic, 0, 0, 1 << 20, true).unwrap();
    assert_eq!(
        plan.entries[0].1.holders,
        vec![1],
        "the acknowledged holders"
    );

    control.serve_acknowledged(weir_common::FileId(8), vec![0, 1]);
    assert_eq!(planned(3), (9, vec![3, 6]), "all three");

    control.forget_acknowledged(&weir_common::FileId(7));
    assert_eq!(planned(0), (0, vec![]), "back to the stable view");
    assert_eq!(control.acknowledged_unconfirmed(), 2);
}
