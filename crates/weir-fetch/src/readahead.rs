//! Read-ahead for consumers behind the tip.
//!
//! A consumer at the tip reads what the produce path just cached. One that fell behind reads
//! from the buckets, and a Kafka client sends one fetch per broker at a time, so without help
//! it waits one GET round trip per fetch: on S3 Standard (25 ms to first byte, a long tail)
//! that held catch-up near 90 MiB/s while a producer wrote 230. Read-ahead keeps the next
//! `window` bytes of such a partition loading into the read cache while the consumer works
//! through the current ones:
//!
//! * A fetch whose plan ends below the served high watermark claims its reader's window: the
//!   frontier of the partition whose last window it ends in (up to four readers per partition,
//!   e.g. consumer groups at different offsets). Once half-way through that window it reads on
//!   from the frontier to `end + window`; before that it reads nothing ahead. A fetch in no
//!   window (a new reader, a seek, a reader that outran its loads) starts one at
//!   `[end, end + window)`. A consumer is thus between half a window and a window behind what
//!   is loading.
//! * A fetch that goes to storage for a batch its partition's window loaded (none of it in
//!   flight) shows the cache dropped it before the consumer got there: producers writing
//!   through a small cache turn it over faster than this consumer reads. The partition's window
//!   then halves (down to a sixteenth), and grows back by an eighth per window read in time,
//!   so a slow consumer does not pay for its windows twice.
//! * The window is planned under the state lock like a fetch (never at or above the served
//!   high watermark, FET-1), coalesced into one range per run of a file like a fetch, and
//!   batches the cache already holds (each fresh batch is its own cache entry) are skipped.
//! * Loads go through the fetch's own reads ([`FetchReader::read_range`]): a fetch arriving
//!   while its bytes are still loading waits for that GET instead of sending another, and
//!   what is loaded is cached for it. At most [`MAX_CONCURRENT_LOADS`] run at once across
//!   the agent; with four times that waiting, no fetch starts a window (read-ahead sheds work
//!   rather than queueing it), and a load every reader has passed by its turn is dropped. A
//!   failed load is only logged (a fetch waiting on it retries the read itself).
//!
//! Read-ahead only ever fills the cache with immutable bytes of committed files; what a fetch
//! returns is still decided by its own plan. The agent caps the window at a sixteenth of the
//! cache so that the windows of several lagging partitions are not evicted before they are read.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt};
use tokio::sync::Semaphore;
use tracing::debug;
use weir_common::{FileId, TopicId};

use crate::reader::{FetchReader, Location};

/// Loads read-ahead runs at once across the agent.
pub(crate) const MAX_CONCURRENT_LOADS: usize = 16;
/// Loads waiting or running across the agent past which no fetch starts a window: read-ahead
/// sheds work instead of queueing it behind the consumers it is meant to help.
const MAX_PENDING_LOADS: usize = 4 * MAX_CONCURRENT_LOADS;
/// Readers of one partition whose frontiers are kept apart (consumer groups at different
/// offsets); past it the one claimed least recently is forgotten.
const MAX_READERS_PER_PARTITION: usize = 4;
/// Partitions whose frontiers are remembered; past it the map starts over (read-ahead restarts
/// for each partition at its next fetch).
const MAX_TRACKED_PARTITIONS: usize = 65_536;

/// How far read-ahead went for one reader of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frontier {
    /// Where the reader's last window started from (the end of the fetch that claimed it).
    from: i64,
    /// Read-ahead was started for the offsets below this.
    until: i64,
    /// A fetch ending at or past this starts the next window.
    trigger: i64,
    /// The window: halved when the cache dropped what it loaded before the consumer got
    /// there, grown back by an eighth of the maximum per window read in time.
    window: usize,
    /// When it was last claimed (a counter): the least recent goes first.
    used: u64,
}

impl Frontier {
    /// Whether a fetch ending at `end` is this reader's: inside its window.
    fn follows(&self, end: i64) -> bool {
        self.from <= end && end < self.until
    }
}

#[derive(Debug, Default)]
struct Frontiers {
    partitions: HashMap<(TopicId, i32), Vec<Frontier>>,
    clock: u64,
}

/// Read-ahead state shared by an agent's fetches.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// The largest window (`storage.read_ahead_bytes`, capped by the agent).
    window_bytes: usize,
    loads: Arc<Semaphore>,
    /// Loads scheduled and not finished.
    pending: AtomicUsize,
    frontiers: Mutex<Frontiers>,
}

/// One range to load: a run of one file, and the last offset it holds.
pub(crate) struct Load {
    pub(crate) file_id: FileId,
    pub(crate) location: Location,
    pub(crate) range: Range<u64>,
    pub(crate) last_offset: i64,
}

impl ReadAhead {
    pub(crate) fn new(window_bytes: u64) -> Self {
        Self {
            window_bytes: usize::try_from(window_bytes).unwrap_or(usize::MAX),
            loads: Arc::new(Semaphore::new(MAX_CONCURRENT_LOADS)),
            pending: AtomicUsize::new(0),
            frontiers: Mutex::new(Frontiers::default()),
        }
    }

    /// The smallest window: an eviction never halves it below this.
    fn min_window(&self) -> usize {
        (self.window_bytes / 16).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Frontiers> {
        self.frontiers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether enough loads are waiting that no fetch should start another window.
    pub(crate) fn busy(&self) -> bool {
        self.pending.load(Ordering::Relaxed) >= MAX_PENDING_LOADS
    }

    /// A fetch of `key` ends at `end` (below the high watermark): the offset to read ahead
    /// from and the window in bytes, or `None` when the window this reader's fetches read
    /// ahead before still reaches far enough. The reader is the partition's frontier whose
    /// window `end` falls in; a fetch in none of them (a new reader, a seek, or a reader past
    /// its frontier) starts a new one. The caller plans the window and [`ReadAhead::record`]s
    /// it right away, without awaiting anything.
    pub(crate) fn claim(&self, key: (TopicId, i32), end: i64) -> Option<(i64, usize)> {
        let mut frontiers = self.lock();
        frontiers.clock += 1;
        let now = frontiers.clock;
        if frontiers.partitions.len() >= MAX_TRACKED_PARTITIONS
            && !frontiers.partitions.contains_key(&key)
        {
            frontiers.partitions.clear();
        }
        let max = self.window_bytes;
        let readers = frontiers.partitions.entry(key).or_default();
        let (start, window) = match readers.iter_mut().find(|f| f.follows(end)) {
            Some(f) if end < f.trigger => return None,
            // Half-way through a window read in time: on from the frontier, a larger window.
            Some(f) => {
                let claimed = (f.until, (f.window + max / 8).min(max));
                readers.retain(|f| !f.follows(end));
                claimed
            }
            None => {
                // Learned windows carry over: the cache pressure is the agent's, not the reader's.
                let recent = readers
                    .iter()
                    .max_by_key(|f| f.used)
                    .map_or(max, |f| f.window);
                if readers.len() >= MAX_READERS_PER_PARTITION {
                    let oldest = readers.iter().enumerate().min_by_key(|(_, f)| f.used);
                    if let Some((index, _)) = oldest {
                        readers.swap_remove(index);
                    }
                }
                (end, recent)
            }
        };
        readers.push(Frontier {
            from: end,
            until: start,
            trigger: i64::MAX,
            window,
            used: now,
        });
        Some((start, window))
    }

    /// What a claim from `from` planned: read-ahead was started up to `until`, and a fetch
    /// ending at `trigger` starts the next window.
    pub(crate) fn record(&self, key: (TopicId, i32), from: i64, until: i64, trigger: i64) {
        let mut frontiers = self.lock();
        let claimed = frontiers
            .partitions
            .get_mut(&key)
            .and_then(|readers| readers.iter_mut().max_by_key(|f| f.used))
            .filter(|f| f.from == from);
        if let Some(frontier) = claimed {
            (frontier.until, frontier.trigger) = (until, trigger);
        }
    }

    /// A fetch of `key` went to storage for the batch at `offset`, with no load of it in
    /// flight: if read-ahead had started loading it, the cache dropped it before the consumer
    /// got there (the cache turns over faster than this consumer reads), and that window
    /// halves. Returns whether it did.
    pub(crate) fn evicted(&self, key: (TopicId, i32), offset: i64) -> bool {
        let min = self.min_window();
        let mut frontiers = self.lock();
        let readers = frontiers.partitions.get_mut(&key);
        match readers.and_then(|r| r.iter_mut().find(|f| f.follows(offset) && f.window > min)) {
            Some(f) => {
                f.window = (f.window / 2).max(min);
                true
            }
            None => false,
        }
    }

    /// Whether a reader of `key` is still at or before `offset`: a load ending there is still
    /// ahead of someone.
    fn wanted(&self, key: (TopicId, i32), offset: i64) -> bool {
        self.lock()
            .partitions
            .get(&key)
            .is_some_and(|readers| readers.iter().any(|f| f.from <= offset))
    }

    /// Loads `loads` of partition `key` into the cache through `reader`, in a task of their
    /// own, at most [`MAX_CONCURRENT_LOADS`] at once across the agent. A load whose batches
    /// every reader of the partition has passed by its turn is dropped.
    pub(crate) fn spawn_loads(
        self: &Arc<Self>,
        reader: FetchReader,
        key: (TopicId, i32),
        loads: Vec<Load>,
    ) {
        self.pending.fetch_add(loads.len(), Ordering::Relaxed);
        let this = self.clone();
        tokio::spawn(async move {
            let this = &this;
            let reader = &reader;
            stream::iter(loads)
                .for_each_concurrent(None, |load| async move {
                    let permit = this.loads.acquire().await;
                    if permit.is_ok() && this.wanted(key, load.last_offset) {
                        let range = load.range.clone();
                        let read = reader.read_range(load.file_id, &load.location, range);
                        if let Err(err) = read.await {
                            debug!(file_id = %load.file_id, range = ?load.range, error = %err, "read-ahead load failed");
                        }
                    }
                    this.pending.fetch_sub(1, Ordering::Relaxed);
                })
                .await;
        });
    }

    #[cfg(test)]
    pub(crate) fn window_of(&self, key: (TopicId, i32)) -> Option<usize> {
        self.frontier(key).map(|f| f.window)
    }

    /// The partition's most recently claimed frontier.
    #[cfg(test)]
    fn frontier(&self, key: (TopicId, i32)) -> Option<Frontier> {
        self.lock()
            .partitions
            .get(&key)
            .and_then(|readers| readers.iter().max_by_key(|f| f.used).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (TopicId, i32) {
        (TopicId([7; 16]), 0)
    }

    const MIB: usize = 1 << 20;

    fn start(claim: Option<(i64, usize)>) -> Option<i64> {
        claim.map(|(start, _)| start)
    }

    /// The claim rules: first fetch, inside the first half, past half-way, past the frontier,
    /// and a seek back.
    #[test]
    fn test_claims_follow_the_consumer() {
        let ahead = ReadAhead::new(MIB as u64);
        assert_eq!(
            ahead.claim(key(), 100),
            Some((100, MIB)),
            "first fetch: from its end"
        );
        ahead.record(key(), 100, 1_000, 550);
        assert_eq!(ahead.claim(key(), 549), None, "not half-way yet");
        assert_eq!(
            start(ahead.claim(key(), 550)),
            Some(1_000),
            "half-way: on from the frontier"
        );
        assert_eq!(
            ahead.frontier(key()).map(|f| (f.from, f.until)),
            Some((550, 1_000))
        );
        ahead.record(key(), 550, 1_450, 1_000);
        assert_eq!(
            start(ahead.claim(key(), 2_000)),
            Some(2_000),
            "past the frontier"
        );
        ahead.record(key(), 2_000, 2_900, 2_450);
        assert_eq!(
            start(ahead.claim(key(), 10)),
            Some(10),
            "a seek back starts over"
        );
    }

    /// A claim whose plan found nothing ahead (at the end of what is committed) records an
    /// empty window, and the next fetch past it claims again.
    #[test]
    fn test_an_empty_window_claims_again() {
        let ahead = ReadAhead::new(MIB as u64);
        assert_eq!(start(ahead.claim(key(), 100)), Some(100));
        ahead.record(key(), 100, 100, 100);
        assert_eq!(start(ahead.claim(key(), 100)), Some(100));
    }

    /// Evictions of loaded batches halve the window down to a sixteenth; windows read in time
    /// grow it back an eighth at a time; a batch outside the window is no eviction.
    #[test]
    fn test_the_window_shrinks_on_evictions_and_grows_back() {
        let ahead = ReadAhead::new(MIB as u64);
        ahead.claim(key(), 0);
        ahead.record(key(), 0, 1_000, 500);
        assert!(!ahead.evicted(key(), 1_000), "not loaded by read-ahead");
        assert!(ahead.evicted(key(), 10));
        assert_eq!(ahead.frontier(key()).unwrap().window, MIB / 2);
        for _ in 0..10 {
            ahead.evicted(key(), 10);
        }
        assert_eq!(ahead.frontier(key()).unwrap().window, MIB / 16, "floor");
        assert_eq!(ahead.claim(key(), 600), Some((1_000, MIB / 16 + MIB / 8)));
        ahead.record(key(), 600, 1_200, 900);
        // A seek back keeps the learned window.
        assert_eq!(ahead.claim(key(), 5), Some((5, MIB / 16 + MIB / 8)));
    }

    /// Two readers of one partition far apart (two consumer groups) keep their own frontiers:
    /// neither restarts the other's window.
    #[test]
    fn test_readers_of_one_partition_keep_their_own_frontiers() {
        let ahead = ReadAhead::new(MIB as u64);
        assert_eq!(start(ahead.claim(key(), 100)), Some(100));
        ahead.record(key(), 100, 1_000, 550);
        assert_eq!(
            start(ahead.claim(key(), 5_000)),
            Some(5_000),
            "a second reader"
        );
        ahead.record(key(), 5_000, 6_000, 5_500);
        assert_eq!(
            ahead.claim(key(), 200),
            None,
            "the first reader's window holds"
        );
        assert_eq!(ahead.claim(key(), 5_100), None, "and so does the second's");
        assert_eq!(
            start(ahead.claim(key(), 600)),
            Some(1_000),
            "each goes on from its own"
        );
        ahead.record(key(), 600, 1_500, 1_000);
        assert_eq!(start(ahead.claim(key(), 5_600)), Some(6_000));
        for reader in 0..MAX_READERS_PER_PARTITION as i64 {
            ahead.claim(key(), 100_000 * (reader + 1));
        }
        assert_eq!(
            ahead.lock().partitions[&key()].len(),
            MAX_READERS_PER_PARTITION,
            "the least recent are forgotten"
        );
    }
}
