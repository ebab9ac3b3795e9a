//! A partition's batch index in shared, immutable chunks (RFC 0003 §8).
//!
//! A snapshot clones the state under the readable state's lock, so cloning must not cost one copy
//! per retained batch. Entries live in chunks of at most [`CHUNK_ENTRIES`] behind `Arc`s: a clone
//! copies one pointer per chunk, and the first append after a clone copies the partly filled last
//! chunk once (copy on write). A log start move drops whole chunks from the front and counts the
//! entries of the first chunk it keeps that are gone (`skip`). Compaction's swap replaces a range
//! of entries by one run entry (RFC 0005 §3) and rebuilds only the chunks the range touches, so
//! chunks vary in length and each full chunk's first position is kept in `starts`.
//!
//! Each chunk also carries what lookups need without a scan of the index:
//! - the running maximum of its entries' max timestamps, so ListOffsets by timestamp and
//!   retention by time find the first batch reaching a timestamp with one pass over chunk maxima
//!   and one binary search inside a chunk;
//! - the running byte total, so retention by size and byte counts are two lookups.
//!
//! Both are relative to the chunk (timestamps) or absolute over the index's lifetime (bytes), so
//! nothing needs recomputing when the front is trimmed.

use std::ops::Index;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::IndexEntry;

/// Entries per chunk: a clone costs one `Arc` per 1,024 batches, and the copy on write after a
/// snapshot at most 1,024 entries (~80 KiB) per partition (benches/snapshot.rs measures both).
pub const CHUNK_ENTRIES: usize = 1024;

#[derive(Debug, Clone, Default)]
struct Chunk {
    entries: Vec<IndexEntry>,
    /// `running_max[i]`: the largest `max_timestamp` of entries `0..=i` of this chunk.
    running_max: Vec<i64>,
    /// `bytes_through[i]`: bytes of every entry ever appended to the index up to and including
    /// entry `i` of this chunk.
    bytes_through: Vec<u64>,
    /// Bytes of every entry appended before this chunk's first.
    bytes_before: u64,
}

impl Chunk {
    fn starting_after(bytes_before: u64) -> Self {
        Self {
            bytes_before,
            ..Self::default()
        }
    }

    fn push(&mut self, entry: IndexEntry) {
        let max = self
            .max()
            .map_or(entry.max_timestamp, |m| m.max(entry.max_timestamp));
        let bytes = self.bytes_after() + u64::from(entry.len);
        self.entries.push(entry);
        self.running_max.push(max);
        self.bytes_through.push(bytes);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The largest max timestamp in the chunk.
    fn max(&self) -> Option<i64> {
        self.running_max.last().copied()
    }

    /// Bytes of every entry up to and including this chunk's last.
    fn bytes_after(&self) -> u64 {
        self.bytes_through
            .last()
            .copied()
            .unwrap_or(self.bytes_before)
    }

    /// Bytes of every entry before local position `i` (`i` may be the chunk's length).
    fn bytes_before_position(&self, i: usize) -> u64 {
        i.checked_sub(1)
            .map_or(self.bytes_before, |last| self.bytes_through[last])
    }

    /// The first local position at or after `from` whose max timestamp reaches `target`.
    fn first_reaching(&self, from: usize, target: i64) -> Option<usize> {
        if from == 0 {
            // The running maximum is monotonic, and reaches `target` first exactly at the first
            // entry that does.
            let first = self.running_max.partition_point(|&max| max < target);
            return (first < self.len()).then_some(first);
        }
        self.entries
            .get(from..)?
            .iter()
            .position(|e| e.max_timestamp >= target)
            .map(|i| from + i)
    }
}

/// The batch index of a partition: sorted by `base_offset`, dense (each entry starts where the
/// previous ended). An entry is one ingest batch or, after compaction, a run of consecutive
/// batches in one compacted file. Serialised as the plain sequence of its entries.
#[derive(Debug, Clone)]
pub struct ChunkedIndex {
    /// Full chunks (shared with clones; a swap rebuilds the ones it touches).
    full: Vec<Arc<Chunk>>,
    /// `starts[i]`: the stored position of `full[i]`'s first entry (stored positions count from
    /// the first stored chunk's first entry, `skip` included).
    starts: Vec<usize>,
    /// The chunk being filled, shared with clones until the next append.
    tail: Arc<Chunk>,
    /// Entries at the front of the first stored chunk that are no longer in the index.
    skip: usize,
    chunk_entries: usize,
}

impl Default for ChunkedIndex {
    fn default() -> Self {
        Self::with_chunk_entries(CHUNK_ENTRIES)
    }
}

impl ChunkedIndex {
    /// An empty index with chunks of `chunk_entries` (tests use tiny chunks to cross boundaries).
    pub fn with_chunk_entries(chunk_entries: usize) -> Self {
        let chunk_entries = chunk_entries.max(1);
        Self {
            full: Vec::new(),
            starts: Vec::new(),
            tail: Arc::new(Chunk::default()),
            skip: 0,
            chunk_entries,
        }
    }

    pub fn len(&self) -> usize {
        self.tail_start() + self.tail.len() - self.skip
    }

    /// The stored position of the tail's first entry.
    fn tail_start(&self) -> usize {
        self.starts
            .last()
            .zip(self.full.last())
            .map_or(0, |(start, chunk)| start + chunk.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends an entry after the last.
    pub fn push(&mut self, entry: IndexEntry) {
        let chunk_entries = self.chunk_entries;
        let tail = Arc::make_mut(&mut self.tail);
        tail.push(entry);
        if tail.len() >= chunk_entries {
            let next = Chunk::starting_after(tail.bytes_after());
            let start = self.tail_start();
            let full = std::mem::replace(&mut self.tail, Arc::new(next));
            self.full.push(full);
            self.starts.push(start);
        }
    }

    /// Removes the first `count` entries (all of them when `count` exceeds the length), handing
    /// each to `removed` in order. Whole chunks are dropped; no kept entry is copied.
    pub fn remove_front(&mut self, count: usize, mut removed: impl FnMut(&IndexEntry)) {
        let count = count.min(self.len());
        for entry in self.iter().take(count) {
            removed(entry);
        }
        self.skip += count;
        // Full chunks every entry of which is gone.
        let whole = self
            .starts
            .iter()
            .zip(&self.full)
            .take_while(|(start, chunk)| *start + chunk.len() <= self.skip)
            .count();
        if whole > 0 {
            let dropped = self.starts[whole - 1] + self.full[whole - 1].len();
            self.full.drain(..whole);
            self.starts.drain(..whole);
            for start in &mut self.starts {
                *start -= dropped;
            }
            self.skip -= dropped;
        }
        if self.full.is_empty() && self.skip == self.tail.len() && self.skip > 0 {
            // Everything is gone: start the tail afresh (its byte count goes on).
            let bytes = self.tail.bytes_after();
            self.tail = Arc::new(Chunk::starting_after(bytes));
            self.skip = 0;
        }
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.remove_front(self.len(), |_| {});
    }

    pub fn get(&self, position: usize) -> Option<&IndexEntry> {
        let (chunk, local) = self.locate(position)?;
        chunk.entries.get(local)
    }

    pub fn first(&self) -> Option<&IndexEntry> {
        self.get(0)
    }

    pub fn last(&self) -> Option<&IndexEntry> {
        self.len().checked_sub(1).and_then(|last| self.get(last))
    }

    /// Entries in offset order.
    pub fn iter(&self) -> impl Iterator<Item = &IndexEntry> + '_ {
        self.iter_from(0)
    }

    /// Entries from `position` on, in offset order.
    pub fn iter_from(&self, position: usize) -> impl Iterator<Item = &IndexEntry> + '_ {
        let start = self.skip.saturating_add(position);
        let first = self.chunk_of(start);
        let first_start = self.start_of(first);
        self.chunks()
            .skip(first)
            .enumerate()
            .flat_map(move |(i, chunk)| {
                let local = if i == 0 {
                    start.saturating_sub(first_start).min(chunk.len())
                } else {
                    0
                };
                &chunk.entries[local..]
            })
    }

    /// The number (in `chunks()` order, the tail last) of the chunk holding stored position
    /// `stored`; the tail's for positions at or past it.
    fn chunk_of(&self, stored: usize) -> usize {
        if stored >= self.tail_start() {
            return self.full.len();
        }
        self.starts.partition_point(|&start| start <= stored) - 1
    }

    /// The stored position of chunk `chunk`'s first entry (`chunks()` order).
    fn start_of(&self, chunk: usize) -> usize {
        self.starts
            .get(chunk)
            .copied()
            .unwrap_or_else(|| self.tail_start())
    }

    /// The number of entries for which `pred` holds, when it holds for a prefix of the index
    /// (like `slice::partition_point`): a binary search.
    pub fn partition_point(&self, mut pred: impl FnMut(&IndexEntry) -> bool) -> usize {
        self.positions_where(|position| pred(&self[position]))
    }

    /// The first position whose entries after it hold fewer than `bytes`: every entry before it
    /// can go while what stays is still at least `bytes` (retention by size).
    pub fn first_keeping(&self, bytes: u64) -> usize {
        let len = self.len();
        self.positions_where(|position| self.bytes_between(position + 1, len) >= bytes)
    }

    /// How many positions `pred` holds for, when it holds for a prefix of them: a binary search.
    fn positions_where(&self, mut pred: impl FnMut(usize) -> bool) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if pred(mid) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Bytes of the entries at positions `from..to` (clamped to the index).
    pub fn bytes_between(&self, from: usize, to: usize) -> u64 {
        let to = to.min(self.len());
        if from >= to {
            return 0;
        }
        self.bytes_before(to) - self.bytes_before(from)
    }

    /// The first position at or after `from` whose batch's max timestamp reaches `target`:
    /// Kafka's ListOffsets by timestamp and retention by time.
    pub fn first_reaching(&self, from: usize, target: i64) -> Option<usize> {
        let start = self.skip.checked_add(from)?;
        let mut stored = 0;
        for chunk in self.chunks() {
            let end = stored + chunk.len();
            if end > start {
                let local = start.saturating_sub(stored);
                let reaches = local > 0 || chunk.max().is_some_and(|max| max >= target);
                if let Some(found) = reaches
                    .then(|| chunk.first_reaching(local, target))
                    .flatten()
                {
                    return Some(stored + found - self.skip);
                }
            }
            stored = end;
        }
        None
    }

    /// The largest max timestamp among positions `from..to`, and the first position holding it.
    pub fn max_timestamp_between(&self, from: usize, to: usize) -> Option<(usize, i64)> {
        let to = to.min(self.len());
        let (start, end) = (self.skip + from, self.skip + to);
        let mut best: Option<i64> = None;
        let mut stored = 0;
        for chunk in self.chunks() {
            let chunk_end = stored + chunk.len();
            if chunk_end > start && stored < end {
                let (low, high) = (
                    start.saturating_sub(stored),
                    (end - stored).min(chunk.len()),
                );
                let max = if low == 0 && high == chunk.len() {
                    chunk.max()
                } else {
                    chunk.entries[low..high]
                        .iter()
                        .map(|e| e.max_timestamp)
                        .max()
                };
                best = best.max(max);
            }
            stored = chunk_end;
        }
        let max = best?;
        self.first_reaching(from, max)
            .map(|position| (position, max))
    }

    /// Points the entry at `position` at another copy of the same batch: `file_id` at
    /// `byte_offset` (compaction). Offsets, length and timestamps stay, so nothing derived from
    /// them changes; the chunk holding it is copied first if a clone shares it. Returns whether
    /// `position` exists.
    pub fn relocate(
        &mut self,
        position: usize,
        file_id: weir_common::FileId,
        byte_offset: u64,
    ) -> bool {
        if position >= self.len() {
            return false;
        }
        let stored = self.skip + position;
        let number = self.chunk_of(stored);
        let local = stored - self.start_of(number);
        let chunk = match self.full.get_mut(number) {
            Some(full) => Arc::make_mut(full),
            None => Arc::make_mut(&mut self.tail),
        };
        let entry = &mut chunk.entries[local];
        entry.file_id = file_id;
        entry.byte_offset = byte_offset;
        true
    }

    /// Replaces the entries at positions `from..to` by `entry`, which must span exactly their
    /// offsets and bytes (compaction's run entry, RFC 0005 §3), so nothing derived from offsets
    /// or byte totals changes. Only the chunks holding the range are rebuilt. Returns whether
    /// the range exists and `entry` matches it; nothing changes otherwise.
    pub fn replace_range(&mut self, from: usize, to: usize, entry: IndexEntry) -> bool {
        if from >= to || to > self.len() {
            return false;
        }
        let spans = self[from].base_offset == entry.base_offset
            && self[to - 1].last_offset == entry.last_offset
            && self.bytes_between(from, to) == u64::from(entry.len);
        if !spans {
            return false;
        }
        let (start, end) = (self.skip + from, self.skip + to);
        let (first, last) = (self.chunk_of(start), self.chunk_of(end - 1));
        let first_start = self.start_of(first);
        let chunks: Vec<&Chunk> = self.chunks().skip(first).take(last - first + 1).collect();
        let bytes_before = chunks[0].bytes_before;
        let last_start = self.start_of(last);
        let kept_before = &chunks[0].entries[..start - first_start];
        let kept_after = &chunks[chunks.len() - 1].entries[end - last_start..];
        let entries: Vec<IndexEntry> = kept_before
            .iter()
            .copied()
            .chain(std::iter::once(entry))
            .chain(kept_after.iter().copied())
            .collect();
        if last == self.full.len() {
            // The range reaches the tail: the chunks from `first` on are pushed again.
            self.full.truncate(first);
            self.starts.truncate(first);
            self.tail = Arc::new(Chunk::starting_after(bytes_before));
            for entry in entries {
                self.push(entry);
            }
            return true;
        }
        let rebuilt: Vec<Arc<Chunk>> = entries
            .chunks(self.chunk_entries)
            .scan(bytes_before, |bytes, piece| {
                let mut chunk = Chunk::starting_after(*bytes);
                for entry in piece {
                    chunk.push(*entry);
                }
                *bytes = chunk.bytes_after();
                Some(Arc::new(chunk))
            })
            .collect();
        self.full.splice(first..=last, rebuilt);
        self.starts.truncate(first);
        let mut at = first_start;
        for chunk in &self.full[first..] {
            self.starts.push(at);
            at += chunk.len();
        }
        true
    }

    /// Rewrites the entries from `position` to the end with `rewrite`, which may change their
    /// lengths but not their offsets (an abort pointing a pending batch at its filler, RFC
    /// 0006). The chunks from the one holding `position` are rebuilt, so byte totals stay right;
    /// pending batches are near the end, so that is a few chunks at most.
    pub fn rewrite_from(&mut self, position: usize, mut rewrite: impl FnMut(&mut IndexEntry)) {
        if position >= self.len() {
            return;
        }
        let stored = self.skip + position;
        let first = self.chunk_of(stored);
        let first_start = self.start_of(first);
        let Some(bytes_before) = self.chunks().nth(first).map(|chunk| chunk.bytes_before) else {
            return;
        };
        let mut entries: Vec<IndexEntry> = self
            .chunks()
            .skip(first)
            .flat_map(|chunk| chunk.entries.iter().copied())
            .collect();
        for entry in &mut entries[stored - first_start..] {
            let (base, last) = (entry.base_offset, entry.last_offset);
            rewrite(entry);
            debug_assert_eq!((base, last), (entry.base_offset, entry.last_offset));
        }
        self.full.truncate(first);
        self.starts.truncate(first);
        self.tail = Arc::new(Chunk::starting_after(bytes_before));
        for entry in entries {
            self.push(entry);
        }
    }

    fn chunks(&self) -> impl Iterator<Item = &Chunk> + '_ {
        self.full
            .iter()
            .map(|c| c.as_ref())
            .chain(std::iter::once(self.tail.as_ref()))
    }

    /// The chunk holding `position` and the position inside it.
    fn locate(&self, position: usize) -> Option<(&Chunk, usize)> {
        if position >= self.len() {
            return None;
        }
        let stored = self.skip + position;
        let number = self.chunk_of(stored);
        let local = stored - self.start_of(number);
        Some(match self.full.get(number) {
            Some(full) => (full.as_ref(), local),
            None => (self.tail.as_ref(), local),
        })
    }

    /// Bytes of every entry appended before `position` (`position` may be the length).
    fn bytes_before(&self, position: usize) -> u64 {
        match self.locate(position) {
            Some((chunk, local)) => chunk.bytes_before_position(local),
            None => self.tail.bytes_after(),
        }
    }
}

impl Index<usize> for ChunkedIndex {
    type Output = IndexEntry;

    fn index(&self, position: usize) -> &IndexEntry {
        match self.get(position) {
            Some(entry) => entry,
            None => panic!(
                "index position {position} out of range (length {})",
                self.len()
            ),
        }
    }
}

impl PartialEq for ChunkedIndex {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for ChunkedIndex {}

impl FromIterator<IndexEntry> for ChunkedIndex {
    fn from_iter<I: IntoIterator<Item = IndexEntry>>(entries: I) -> Self {
        let mut index = Self::default();
        index.extend(entries);
        index
    }
}

impl Extend<IndexEntry> for ChunkedIndex {
    fn extend<I: IntoIterator<Item = IndexEntry>>(&mut self, entries: I) {
        for entry in entries {
            self.push(entry);
        }
    }
}

impl<'a> IntoIterator for &'a ChunkedIndex {
    type Item = &'a IndexEntry;
    type IntoIter = Box<dyn Iterator<Item = &'a IndexEntry> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl Serialize for ChunkedIndex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for ChunkedIndex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = ChunkedIndex;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence of index entries")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ChunkedIndex, A::Error> {
                let mut index = ChunkedIndex::default();
                while let Some(entry) = seq.next_element()? {
                    index.push(entry);
                }
                Ok(index)
            }
        }
        deserializer.deserialize_seq(Entries)
    }
}

#[cfg(test)]
mod tests;
