use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{self, BoxFuture, Either, FutureExt};
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::path::Path;
use tokio::time::Instant;
use tracing::debug;
use weir_common::{FileId, Tier, TopicId};
use weir_control::plane::Served;
use weir_control::{ControlPlane, IndexEntry};
use weir_protocol::record_set::RecordSet;
use weir_storage::{keys, Backing, QuorumWriter, ReadCache};

use crate::assemble::{assemble, entry_batches};
use crate::inflight::{InFlight, Joined};
use crate::readahead::{Load, ReadAhead};

/// Storage reads one partition's fetch runs at once (different files of its plan).
pub(crate) const MAX_CONCURRENT_READS: usize = 8;

/// GET bodies up to this size are copied into a buffer of their own before they are cached or
/// served. `object_store` hands a body that arrived as one chunk over as that chunk, and over
/// HTTP that is a slice of the client's read buffer (hyper's grows to ~408 KiB), which a cached
/// range or a sliced batch would keep alive whole; a larger body spans several chunks and is
/// collected into a buffer of its own already.
const COPY_BODIES_UP_TO: usize = 512 << 10;

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
    topic_id: TopicId,
    partition: i32,
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
pub(crate) struct Location {
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

    /// The offset asked for.
    pub(crate) fn offset(&self) -> i64 {
        self.offset
    }

    /// The byte budget asked for.
    pub(crate) fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Whether the first batch is served whatever its size.
    pub(crate) fn at_least_one(&self) -> bool {
        self.at_least_one
    }

    /// The base offsets of the planned index entries, in order.
    pub fn base_offsets(&self) -> impl Iterator<Item = i64> + '_ {
        self.entries.iter().map(|(entry, _)| entry.base_offset)
    }
}

/// Data for one partition of a fetch response.
#[derive(Debug, Clone)]
pub struct PartitionData {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// The batches with their assigned offsets, sliced from the buffers they were read into
    /// where that pins little more than they are (see [`crate::assemble`]).
    pub records: RecordSet,
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
    inflight: Arc<InFlight>,
    read_ahead: Option<Arc<ReadAhead>>,
}

impl FetchReader {
    pub fn new(control: ControlPlane, buckets: Arc<QuorumWriter>, cache: Arc<ReadCache>) -> Self {
        Self {
            control,
            buckets,
            regional: None,
            cache,
            plan_ttl: DEFAULT_PLAN_TTL,
            inflight: Arc::default(),
            read_ahead: None,
        }
    }

    /// Reads up to `window_bytes` of each partition ahead of a consumer behind the tip into the
    /// cache (see [`crate::readahead`]); 0, or a cache that holds nothing, turns it off.
    pub fn with_read_ahead(mut self, window_bytes: u64) -> Self {
        self.read_ahead = (window_bytes > 0 && self.cache.stats().capacity_bytes > 0)
            .then(|| Arc::new(ReadAhead::new(window_bytes)));
        self
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
    /// A cluster follower whose replica is not known to be recent plans no batches (the fetch
    /// answers none, as at the high watermark): its state may name files deleted since
    /// (`ControlPlane::serves_fresh_reads`).
    pub fn plan(
        &self,
        topic_id: &TopicId,
        partition: i32,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
    ) -> Result<ReadPlan, FetchError> {
        let fresh = self.control.serves_fresh_reads();
        self.control.read_served(|served| {
            let state = served.state();
            let partition_index = partition;
            let Some(partition) = state.partition(topic_id, partition) else {
                return Err(FetchError::UnknownTopicOrPartition);
            };
            // The stable high watermark, or past it over files this agent acknowledged.
            let high_watermark = served.high_watermark(topic_id, partition_index, partition);
            let log_start_offset = partition.log_start_offset;
            // Out of range only past every assigned offset. Between the stable and the assigned
            // high watermark (offsets of files reserved but not yet confirmed, RFC 0006) the
            // answer is empty, as Kafka answers a fetch between its high watermark and log end:
            // a producer already has those offsets, and a consumer may seek to them.
            if offset < log_start_offset || offset > partition.high_watermark {
                return Err(FetchError::OffsetOutOfRange {
                    offset,
                    log_start_offset,
                    high_watermark,
                });
            }
            let entries = if fresh {
                planned_entries(
                    &served,
                    partition,
                    high_watermark,
                    offset,
                    max_bytes,
                    at_least_one,
                )
            } else {
                Vec::new()
            };
            Ok(ReadPlan {
                planned_at: Instant::now(),
                topic_id: *topic_id,
                partition: partition_index,
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
    /// rewrites each batch's base offset to its assigned offset (see [`entry_batches`] and
    /// [`assemble`]). Cache hits are served first;
    /// the storage reads of different files run concurrently (up to `MAX_CONCURRENT_READS`),
    /// so a plan spanning many cold files costs about one GET latency, not one per file.
    pub async fn read(&self, plan: ReadPlan) -> Result<PartitionData, FetchError> {
        let age = plan.planned_at.elapsed();
        if age > self.plan_ttl {
            return Err(FetchError::PlanExpired(age));
        }
        // Before this plan's own reads, so the next window loads while they are in flight.
        self.read_ahead_of(&plan);
        // Pieces in plan order: a cached batch, or a range of one file covering `count` entries.
        enum Piece<'a> {
            Cached(Bytes, Backing),
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
            if let Some((batch, backing)) = self.cache.get_backed(&first_key, first_range) {
                pieces.push(Piece::Cached(batch, backing));
                index += 1;
                continue;
            }
            self.note_eviction(&plan, first, &first_key);
            let end = contiguous_run(&plan.entries, index);
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
                Piece::Cached(bytes, backing) => {
                    Either::Left(future::ready(Ok((bytes.clone(), *backing))))
                }
                Piece::Stored {
                    first,
                    location,
                    range,
                    ..
                } => Either::Right(self.read_range_backed(first.file_id, location, range.clone())),
            })
            .collect();
        let fetched: Vec<(Bytes, Backing)> = stream::iter(reads)
            .buffered(MAX_CONCURRENT_READS)
            .try_collect()
            .await?;
        let (mut batches, mut taken) = (Vec::with_capacity(plan.entries.len()), 0);
        let mut entries = plan.entries.iter();
        for (piece, (bytes, backing)) in pieces.iter().zip(fetched) {
            let (start, count) = match piece {
                Piece::Cached(..) => (None, 1),
                Piece::Stored { range, count, .. } => (Some(range.start), *count),
            };
            for (entry, _) in entries.by_ref().take(count) {
                let batch = match start {
                    None => bytes.clone(),
                    Some(range_start) => {
                        let at = (entry.byte_offset - range_start) as usize;
                        let end = at + entry.len as usize;
                        if end > bytes.len() {
                            return Err(FetchError::Storage("short read".into()));
                        }
                        bytes.slice(at..end)
                    }
                };
                entry_batches(&mut batches, &mut taken, batch, backing, entry, &plan)?;
            }
        }
        Ok(PartitionData {
            high_watermark: plan.high_watermark,
            log_start_offset: plan.log_start_offset,
            records: assemble(batches),
        })
    }

    /// A range of a file: from the cache, from a read in flight that covers it, or from its
    /// holders (then cached). The GET runs as a shared future, so readers arriving meanwhile
    /// wait for it rather than send their own.
    pub(crate) async fn read_range(
        &self,
        file_id: FileId,
        location: &Location,
        range: Range<u64>,
    ) -> Result<Bytes, FetchError> {
        let (bytes, _) = self.read_range_backed(file_id, location, range).await?;
        Ok(bytes)
    }

    /// As [`FetchReader::read_range`], with the buffer the bytes are a slice of: the cached
    /// entry that covered the range, or the range itself when it was read.
    async fn read_range_backed(
        &self,
        file_id: FileId,
        location: &Location,
        range: Range<u64>,
    ) -> Result<(Bytes, Backing), FetchError> {
        let key = location.key(&file_id);
        if let Some(found) = self.cache.get_backed(&key, range.clone()) {
            return Ok(found);
        }
        let buckets = match location.tier {
            Tier::Ingest => self.buckets.clone(),
            Tier::Regional => self.regional.clone().ok_or_else(|| {
                FetchError::Storage(format!(
                    "{key} is a compacted file and no compacted bucket is configured"
                ))
            })?,
        };
        let holders: Vec<usize> = location.holders.iter().map(|h| *h as usize).collect();
        let start = || {
            let (buckets, holders) = (buckets.clone(), holders.clone());
            Self::start_read(&self.cache, buckets, holders, key.clone(), range.clone())
        };
        let started = match self.inflight.join_or_start(&key, range.clone(), start) {
            Joined::Shared(read) => match read.await {
                Ok(found) => return Ok(found),
                // The read joined failed (a read-ahead load, say): this read retries for itself,
                // as it would have read had it not found that one in flight.
                Err(_) => Self::start_read(&self.cache, buckets, holders, key, range),
            },
            Joined::Started(read, registration) => {
                let bytes = read.await;
                drop(registration);
                return bytes.map(with_backing);
            }
        };
        started.await.map(with_backing)
    }

    /// `first`, a batch of `plan`, is neither cached nor loading: tells read-ahead, which
    /// shrinks the partition's window if it had loaded it.
    fn note_eviction(&self, plan: &ReadPlan, first: &IndexEntry, key: &Path) {
        let Some(read_ahead) = &self.read_ahead else {
            return;
        };
        let range = first.byte_offset..first.byte_offset + u64::from(first.len);
        if !self.inflight.covers(key, &range)
            && read_ahead.evicted((plan.topic_id, plan.partition), first.base_offset)
        {
            debug!(
                partition = plan.partition,
                offset = first.base_offset,
                "read-ahead window evicted before it was read: halving it"
            );
        }
    }

    /// A GET of `range` of `key` from its `holders`, cached when it returns.
    fn start_read(
        cache: &Arc<ReadCache>,
        buckets: Arc<QuorumWriter>,
        holders: Vec<usize>,
        key: Path,
        range: Range<u64>,
    ) -> BoxFuture<'static, Result<Bytes, FetchError>> {
        let cache = cache.clone();
        async move {
            let mut bytes = buckets
                .get_range(&holders, &key, range.clone())
                .await
                .map_err(|err| FetchError::Storage(err.to_string()))?;
            if bytes.len() <= COPY_BODIES_UP_TO {
                bytes = Bytes::copy_from_slice(&bytes);
            }
            // Cached before the read leaves the registry: a reader that misses it there finds
            // it here.
            cache.insert_range(&key, range, bytes.clone());
            Ok(bytes)
        }
        .boxed()
    }

    /// Starts reading the partition's next window into the cache when `plan` is behind the
    /// tip and has used up half of the window read ahead before (see [`crate::readahead`]).
    fn read_ahead_of(&self, plan: &ReadPlan) {
        let Some(read_ahead) = &self.read_ahead else {
            return;
        };
        let Some((last, _)) = plan.entries.last() else {
            return;
        };
        let end = last.last_offset + 1;
        if end >= plan.high_watermark {
            return; // At the tip: the produce path caches what comes next.
        }
        if read_ahead.busy() {
            return; // Loads are queueing already: shed, do not pile up.
        }
        let key = (plan.topic_id, plan.partition);
        let Some((start, window)) = read_ahead.claim(key, end) else {
            return;
        };
        // At least one entry: a batch larger than the window is still read ahead.
        let entries = self
            .control
            .read_served(|served| {
                let partition = served.state().partition(&plan.topic_id, plan.partition)?;
                let high_watermark =
                    served.high_watermark(&plan.topic_id, plan.partition, partition);
                Some(planned_entries(
                    &served,
                    partition,
                    high_watermark,
                    end,
                    window,
                    true,
                ))
            })
            .unwrap_or_default();
        let trigger = half_way(&entries, window);
        let entries: Vec<_> = entries
            .into_iter()
            .filter(|(entry, _)| entry.base_offset >= start)
            .collect();
        let until = entries
            .last()
            .map_or(start, |(entry, _)| entry.last_offset + 1);
        read_ahead.record(key, end, until, trigger.min(until));
        // Batch by batch: fresh batches are cached one entry each, so a range over several
        // would never be found in the cache and would be read again.
        let missing: Vec<_> = entries
            .into_iter()
            .filter(|(entry, location)| {
                let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
                !self.cache.contains(&location.key(&entry.file_id), range)
            })
            .collect();
        let mut loads = Vec::new();
        let mut index = 0;
        while index < missing.len() {
            let next = contiguous_run(&missing, index);
            let (first, location) = &missing[index];
            let last = &missing[next - 1].0;
            loads.push(Load {
                file_id: first.file_id,
                location: location.clone(),
                range: first.byte_offset..last.byte_offset + u64::from(last.len),
                last_offset: last.last_offset,
            });
            index = next;
        }
        if !loads.is_empty() {
            read_ahead.spawn_loads(self.clone(), key, loads);
        }
    }
}

/// The index entries from `offset` up to `max_bytes` below `high_watermark` (what this agent
/// serves), each with where its file is (at least one entry if `at_least_one`).
fn planned_entries(
    served: &Served<'_>,
    partition: &weir_control::PartitionState,
    high_watermark: i64,
    offset: i64,
    max_bytes: usize,
    at_least_one: bool,
) -> Vec<(IndexEntry, Location)> {
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
        let location = served
            .state()
            .files
            .get(&entry.file_id)
            .map(|meta| Location {
                tier: meta.tier,
                // A pending file's reservation names every bucket; the acknowledgement knew
                // which hold it.
                holders: served
                    .acknowledged_holders(&entry.file_id)
                    .map_or_else(|| meta.buckets.clone(), <[u8]>::to_vec),
            })
            .unwrap_or_default();
        bytes += entry.len as usize;
        entries.push((*entry, location));
    }
    entries
}

/// The end of the run of entries from `index` that sit back to back in one file (one range).
fn contiguous_run(entries: &[(IndexEntry, Location)], index: usize) -> usize {
    let mut end = index + 1;
    while end < entries.len()
        && entries[end].0.file_id == entries[index].0.file_id
        && entries[end].0.byte_offset
            == entries[end - 1].0.byte_offset + u64::from(entries[end - 1].0.len)
    {
        end += 1;
    }
    end
}

/// The first offset of the entry where half of `window` bytes is reached: a fetch that gets
/// there starts the next window. `i64::MAX` for no entries.
fn half_way(entries: &[(IndexEntry, Location)], window: usize) -> i64 {
    let mut bytes = 0usize;
    for (entry, _) in entries {
        bytes += entry.len as usize;
        if bytes >= window / 2 {
            return entry.base_offset;
        }
    }
    entries
        .last()
        .map_or(i64::MAX, |(entry, _)| entry.base_offset)
}

/// A range read from storage, as its own backing.
fn with_backing(bytes: Bytes) -> (Bytes, Backing) {
    let backing = Backing::of(&bytes);
    (bytes, backing)
}

#[cfg(test)]
mod tests;
