//! Read-ahead for consumers behind the tip.
//!
//! A consumer at the tip reads what the produce path just cached. One that fell behind reads
//! from the buckets, and a Kafka client sends one fetch per broker at a time, so without help
//! it waits one GET round trip per fetch: on S3 Standard (25 ms to first byte, a long tail)
//! that held catch-up near 90 MiB/s while a producer wrote 230. Read-ahead keeps the next
//! `window` bytes of such a partition loading into the read cache while the consumer works
//! through the current ones:
//!
//! * A fetch whose plan ends below the stable high watermark claims the partition's window:
//!   the first time, after a seek back, or once past the frontier it reads `[end, end+window)`;
//!   once half-way through the last window it reads on from the frontier to `end + window`.
//!   Otherwise it reads nothing ahead. A consumer is thus always between half a window and a
//!   window behind what is loading.
//! * The window is planned under the state lock like a fetch (never at or above the stable
//!   high watermark, FET-1), coalesced into one range per run of a file like a fetch, and
//!   ranges the cache already holds are skipped.
//! * Loads go through the fetch's own reads ([`FetchReader::read_range`]): a fetch arriving
//!   while its bytes are still loading waits for that GET instead of sending another, and
//!   what is loaded is cached for it. At most [`MAX_CONCURRENT_LOADS`] run at once across
//!   the agent; a failed load is only logged (the fetch then reads for itself).
//!
//! Read-ahead only ever fills the cache with immutable bytes of committed files; what a fetch
//! returns is still decided by its own plan. The agent caps the window at a sixteenth of the
//! cache so that the windows of several lagging partitions are not evicted before they are read.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt};
use tokio::sync::Semaphore;
use tracing::debug;
use weir_common::{FileId, TopicId};

use crate::reader::{FetchReader, Location};

/// Loads read-ahead runs at once across the agent.
pub(crate) const MAX_CONCURRENT_LOADS: usize = 32;
/// Partitions whose frontier is remembered; past it the map starts over (read-ahead restarts
/// for each partition at its next fetch).
const MAX_TRACKED_PARTITIONS: usize = 65_536;

/// How far read-ahead went for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frontier {
    /// Where the last window started: a fetch ending below it went back, and starts over.
    from: i64,
    /// Read-ahead was started for the offsets below this.
    until: i64,
    /// A fetch ending at or past this starts the next window.
    trigger: i64,
}

/// Read-ahead state shared by an agent's fetches.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    window_bytes: usize,
    loads: Arc<Semaphore>,
    frontiers: Mutex<HashMap<(TopicId, i32), Frontier>>,
}

impl ReadAhead {
    pub(crate) fn new(window_bytes: u64) -> Self {
        Self {
            window_bytes: usize::try_from(window_bytes).unwrap_or(usize::MAX),
            loads: Arc::new(Semaphore::new(MAX_CONCURRENT_LOADS)),
            frontiers: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn window_bytes(&self) -> usize {
        self.window_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(TopicId, i32), Frontier>> {
        self.frontiers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fetch of `key` ends at `end` (below the high watermark): the offset to read ahead
    /// from, or `None` when the window read ahead before still reaches far enough. The caller
    /// plans the window and [`ReadAhead::record`]s it right away, without awaiting anything.
    pub(crate) fn claim(&self, key: (TopicId, i32), end: i64) -> Option<i64> {
        let mut frontiers = self.lock();
        let start = match frontiers.get(&key) {
            Some(f) if end >= f.from && end < f.until && end < f.trigger => return None,
            Some(f) if end >= f.from && end < f.until => f.until,
            _ => end,
        };
        if frontiers.len() >= MAX_TRACKED_PARTITIONS && !frontiers.contains_key(&key) {
            frontiers.clear();
        }
        frontiers.insert(
            key,
            Frontier {
                from: end,
                until: start,
                trigger: i64::MAX,
            },
        );
        Some(start)
    }

    /// What a claim planned: the window from `from` was started up to `until`, and a fetch
    /// ending at `trigger` starts the next.
    pub(crate) fn record(&self, key: (TopicId, i32), from: i64, until: i64, trigger: i64) {
        self.lock().insert(
            key,
            Frontier {
                from,
                until,
                trigger,
            },
        );
    }

    /// Loads `ranges` into the cache through `reader`, at most [`MAX_CONCURRENT_LOADS`] at once
    /// across the agent.
    pub(crate) async fn load(
        &self,
        reader: &FetchReader,
        ranges: Vec<(FileId, Location, Range<u64>)>,
    ) {
        stream::iter(ranges)
            .for_each_concurrent(None, |(file_id, location, range)| async move {
                let Ok(_permit) = self.loads.acquire().await else {
                    return;
                };
                if let Err(err) = reader.read_range(file_id, &location, range.clone()).await {
                    debug!(%file_id, ?range, error = %err, "read-ahead load failed");
                }
            })
            .await;
    }

    #[cfg(test)]
    fn frontier(&self, key: (TopicId, i32)) -> Option<Frontier> {
        self.lock().get(&key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (TopicId, i32) {
        (TopicId([7; 16]), 0)
    }

    /// The claim rules: first fetch, inside the first half, past half-way, past the frontier,
    /// and a seek back.
    #[test]
    fn test_claims_follow_the_consumer() {
        let ahead = ReadAhead::new(1 << 20);
        assert_eq!(
            ahead.claim(key(), 100),
            Some(100),
            "first fetch: from its end"
        );
        ahead.record(key(), 100, 1_000, 550);
        assert_eq!(ahead.claim(key(), 549), None, "not half-way yet");
        assert_eq!(
            ahead.claim(key(), 550),
            Some(1_000),
            "half-way: on from the frontier"
        );
        assert_eq!(
            ahead.frontier(key()).map(|f| (f.from, f.until)),
            Some((550, 1_000))
        );
        ahead.record(key(), 550, 1_450, 1_000);
        assert_eq!(ahead.claim(key(), 2_000), Some(2_000), "past the frontier");
        ahead.record(key(), 2_000, 2_900, 2_450);
        assert_eq!(ahead.claim(key(), 10), Some(10), "a seek back starts over");
    }

    /// A claim whose plan found nothing ahead (at the end of what is committed) records an
    /// empty window, and the next fetch past it claims again.
    #[test]
    fn test_an_empty_window_claims_again() {
        let ahead = ReadAhead::new(1 << 20);
        assert_eq!(ahead.claim(key(), 100), Some(100));
        ahead.record(key(), 100, 100, 100);
        assert_eq!(ahead.claim(key(), 100), Some(100));
    }
}
