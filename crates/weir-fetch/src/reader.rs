use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::{self, Either};
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path;
use tokio::time::Instant;
use weir_common::{FileId, Tier, TopicId};
use weir_control::{ControlPlane, IndexEntry};
use weir_protocol::batch::{rewrite_offsets, BatchHeader};
use weir_storage::{keys, QuorumWriter, ReadCache};

/// Storage reads one partition's fetch runs at once (different files of its plan).
pub(crate) const MAX_CONCURRENT_READS: usize = 8;

/// Leader epoch Weir reports: there is one logical leader per partition and it never changes.
pub const LEADER_EPOCH: i32 = 0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("offset {offset} is outside [{log_start_offset}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        high_watermark: i64,
    },
    #[error("storage read failed: {0}")]
    Storage(String),
    /// The plan waited longer than the plan TTL: the files it names may be deleted by now
    /// (the deleter's grace exceeds the TTL). Retriable: a new fetch plans again.
    #[error("fetch plan expired after {0:?}")]
    PlanExpired(Duration),
}

/// Default of the oldest plan [`FetchReader::read`] starts reading (`gc.fetch_plan_ttl`).
pub(crate) const DEFAULT_PLAN_TTL: Duration = Duration::from_secs(30);

/// What to read for one partition, decided under the state lock.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    planned_at: Instant,
    /// The offset asked for: batches wholly below it are left out of the read.
    offset: i64,
    /// The byte budget asked for, applied batch by batch inside run entries.
    max_bytes: usize,
    at_least_one: bool,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    entries: Vec<(IndexEntry, Location)>,
}

/// Where a planned batch's file is: its tier and its holders' positions in the tier's buckets.
#[derive(Debug, Clone, Default)]
struct Location {
    tier: Tier,
    holders: Vec<u8>,
}

impl Location {
    fn key(&self, file_id: &FileId) -> Path {
        keys::data_file(self.tier, file_id)
    }
}

impl ReadPlan {
    pub fn byte_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(entry, _)| entry.len as usize)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Data for one partition of a fetch response.
#[derive(Debug, Clone)]
pub struct PartitionData {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
}

/// Reads record batches of committed files.
#[derive(Debug, Clone)]
pub struct FetchReader {
    control: ControlPlane,
    buckets: Arc<QuorumWriter>,
    /// The regional tier's buckets (compacted files), when configured.
    regional: Option<Arc<QuorumWriter>>,
    cache: Arc<ReadCache>,
    plan_ttl: Duration,
}

impl FetchReader {
    pub fn new(control: ControlPlane, buckets: Arc<QuorumWriter>, cache: Arc<ReadCache>) -> Self {
        Self {
            control,
            buckets,
            regional: None,
            cache,
            plan_ttl: DEFAULT_PLAN_TTL,
        }
    }

    /// Reads compacted files from `regional` (the regional tier's buckets, in holder order).
    pub fn with_regional(mut self, regional: Arc<QuorumWriter>) -> Self {
        self.regional = Some(regional);
        self
    }

    /// Sets the oldest plan `read` starts reading; the file deleter's grace must exceed it.
    pub fn with_plan_ttl(mut self, plan_ttl: Duration) -> Self {
        self.plan_ttl = plan_ttl;
        self
    }

    /// Picks the batches from `offset` up to `max_bytes` (at least one batch if `at_least_one`).
    pub fn plan(
        &self,
        topic_id: &TopicId,
        partition: i32,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
    ) -> Result<ReadPlan, FetchError> {
        self.control.read(|state| {
            let Some(partition) = state.partition(topic_id, partition) else {
                return Err(FetchError::UnknownTopicOrPartition);
            };
            let high_watermark = partition.stable_high_watermark;
            let log_start_offset = partition.log_start_offset;
            if offset < log_start_offset || offset > high_watermark {
                return Err(FetchError::OffsetOutOfRange {
                    offset,
                    log_start_offset,
                    high_watermark,
                });
            }
            let first = partition
                .index
                .partition_point(|entry| entry.last_offset < offset);
            let mut entries = Vec::new();
            let mut bytes = 0usize;
            for entry in partition.index.iter_from(first) {
                if entry.base_offset >= high_watermark {
                    break;
                }
                let fits = bytes + entry.len as usize <= max_bytes;
                let must_take_first = at_least_one && entries.is_empty();
                if !(fits || must_take_first) {
                    break;
                }
                let location = state
                    .files
                    .get(&entry.file_id)
                    .map(|meta| Location {
                        tier: meta.tier,
                        holders: meta.buckets.clone(),
                    })
                    .unwrap_or_default();
                bytes += entry.len as usize;
                entries.push((*entry, location));
            }
            Ok(ReadPlan {
                planned_at: Instant::now(),
                offset,
                max_bytes,
                at_least_one,
                high_watermark,
                log_start_offset,
                entries,
            })
        })
    }

    /// Reads the planned batches, coalescing adjacent ranges of one file into one request, and
    /// rewrites each batch's base offset to its assigned offset (see [`append_entry`]). Cache hits are served first;
    /// the storage reads of different files run concurrently (up to `MAX_CONCURRENT_READS`),
    /// so a plan spanning many cold files costs about one GET latency, not one per file.
    pub async fn read(&self, plan: ReadPlan) -> Result<PartitionData, FetchError> {
        let age = plan.planned_at.elapsed();
        if age > self.plan_ttl {
            return Err(FetchError::PlanExpired(age));
        }
        // Pieces in plan order: a cached batch, or a range of one file covering `count` entries.
        enum Piece<'a> {
            Cached(Bytes),
            Stored {
                first: &'a IndexEntry,
                location: &'a Location,
                range: Range<u64>,
                count: usize,
            },
        }
        let mut pieces = Vec::new();
        let mut index = 0;
        while index < plan.entries.len() {
            let (first, location) = &plan.entries[index];
            // Fresh batches are cached one range per batch (write-through): serve a hit before
            // coalescing, or a multi-batch range would miss the cache and go to storage.
            let first_key = location.key(&first.file_id);
            let first_range = first.byte_offset..first.byte_offset + u64::from(first.len);
            if let Some(batch) = self.cache.get(&first_key, first_range) {
                pieces.push(Piece::Cached(batch));
                index += 1;
                continue;
            }
            let mut end = index + 1;
            while end < plan.entries.len()
                && plan.entries[end].0.file_id == first.file_id
                && plan.entries[end].0.byte_offset
                    == plan.entries[end - 1].0.byte_offset + u64::from(plan.entries[end - 1].0.len)
            {
                end += 1;
            }
            let last = &plan.entries[end - 1].0;
            pieces.push(Piece::Stored {
                first,
                location,
                range: first.byte_offset..last.byte_offset + u64::from(last.len),
                count: end - index,
            });
            index = end;
        }
        // The futures are built first (not inside a stream combinator's closure) so the
        // returned future stays `Send` for the connection task.
        let reads: Vec<_> = pieces
            .iter()
            .map(|piece| match piece {
                Piece::Cached(bytes) => Either::Left(future::ready(Ok(bytes.clone()))),
                Piece::Stored {
                    first,
                    location,
                    range,
                    ..
                } => Either::Right(self.read_range(first.file_id, location, range.clone())),
            })
            .collect();
        let fetched: Vec<Bytes> = stream::iter(reads)
            .buffered(MAX_CONCURRENT_READS)
            .try_collect()
            .await?;
        let mut out = BytesMut::with_capacity(plan.byte_len());
        let mut entries = plan.entries.iter();
        for (piece, bytes) in pieces.iter().zip(fetched) {
            let (start, count) = match piece {
                Piece::Cached(_) => (None, 1),
                Piece::Stored { range, count, .. } => (Some(range.start), *count),
            };
            for (entry, _) in entries.by_ref().take(count) {
                let batch = match start {
                    None => &bytes[..],
                    Some(range_start) => {
                        let at = (entry.byte_offset - range_start) as usize;
                        bytes
                            .get(at..at + entry.len as usize)
                            .ok_or_else(|| FetchError::Storage("short read".into()))?
                    }
                };
                append_entry(&mut out, batch, entry, &plan)?;
            }
        }
        Ok(PartitionData {
            high_watermark: plan.high_watermark,
            log_start_offset: plan.log_start_offset,
            records: out.freeze(),
        })
    }

    async fn read_range(
        &self,
        file_id: FileId,
        location: &Location,
        range: Range<u64>,
    ) -> Result<Bytes, FetchError> {
        let key = location.key(&file_id);
        if let Some(bytes) = self.cache.get(&key, range.clone()) {
            return Ok(bytes);
        }
        let buckets = match location.tier {
            Tier::Ingest => &self.buckets,
            Tier::Regional => self.regional.as_ref().ok_or_else(|| {
                FetchError::Storage(format!(
                    "{key} is a compacted file and no compacted bucket is configured"
                ))
            })?,
        };
        let holders: Vec<usize> = location.holders.iter().map(|h| *h as usize).collect();
        let bytes = buckets
            .get_range(&holders, &key, range.clone())
            .await
            .map_err(|err| FetchError::Storage(err.to_string()))?;
        self.cache.insert_range(&key, range, bytes.clone());
        Ok(bytes)
    }
}

/// Appends the batches of one index entry to `out`, each with its assigned base offset and the
/// leader epoch. An ingest entry is one batch; a compacted run entry is consecutive batches
/// (RFC 0005 §3), whose assigned offsets follow from the entry's base offset and each batch's
/// offset span. Inside a run, batches wholly below the plan's offset are left out, so a fetch
/// starts at the batch holding its offset as Kafka's does, and batches past the plan's byte
/// budget are left out (the first batch of a fetch is always served when it asked for one).
fn append_entry(
    out: &mut BytesMut,
    bytes: &[u8],
    entry: &IndexEntry,
    plan: &ReadPlan,
) -> Result<(), FetchError> {
    let header = BatchHeader::parse(bytes).ok();
    if header.is_none_or(|h| h.total_len() >= bytes.len()) {
        // One batch (a header that does not parse is served as stored, as always).
        let position = out.len();
        out.extend_from_slice(bytes);
        rewrite_offsets(&mut out[position..], entry.base_offset, LEADER_EPOCH);
        return Ok(());
    }
    let corrupt = |why: String| {
        FetchError::Storage(format!(
            "run {}..={} of {}: {why}",
            entry.base_offset, entry.last_offset, entry.file_id
        ))
    };
    let (mut base, mut rest) = (entry.base_offset, bytes);
    while !rest.is_empty() {
        let header = BatchHeader::parse(rest).map_err(|e| corrupt(e.to_string()))?;
        let (len, span) = (header.total_len(), header.offset_span());
        if len > rest.len() || span < 1 {
            return Err(corrupt(format!(
                "a batch of {len} bytes and {span} offsets"
            )));
        }
        if base + span > plan.offset {
            let fits = out.len() + len <= plan.max_bytes;
            if !(fits || (out.is_empty() && plan.at_least_one)) {
                return Ok(());
            }
            let position = out.len();
            out.extend_from_slice(&rest[..len]);
            rewrite_offsets(&mut out[position..], base, LEADER_EPOCH);
        }
        base += span;
        rest = &rest[len..];
    }
    if base != entry.last_offset + 1 {
        return Err(corrupt(format!("its batches end at {}", base - 1)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
    use weir_protocol::batch::{build_test_batch, split_and_validate, BatchHeader};
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

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
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

    /// A partition over one bucket (GETs take 100 ms of the paused clock, counted by the returned
    /// store), filled with one committed ticket per entry of `tickets`, each a list of batch
    /// timestamps. `max_file_bytes` 1 makes every ticket its own file.
    async fn partition_with(
        tickets: &[Vec<i64>],
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
            .map(|timestamps| ProduceTicket {
                partitions: vec![PartitionBatches {
                    topic_id: topic,
                    partition: 0,
                    batches: timestamps
                        .iter()
                        .flat_map(|ts| {
                            split_and_validate(&build_test_batch(2, *ts, (-1, -1, -1))).unwrap()
                        })
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
        while position < data.records.len() {
            let header = BatchHeader::parse(&data.records[position..]).unwrap();
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
        let (reader, topic, store, bucket) =
            partition_with(&tickets, 1 << 20, 64 * 1024 * 1024).await;
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
}
