//! Byte-bounded LRU read cache keyed by `(object path, byte range)`.
//!
//! Fresh uploads are written through as whole files ([`ReadCache::insert_file`]), so fetches of
//! just-produced data never touch object storage; ranged reads from object storage are inserted
//! with [`ReadCache::insert_range`]. A lookup hits if any cached range of the same object
//! (in particular a whole file) covers the requested range; the result is a zero-copy slice.
//!
//! Cached objects are immutable (`.weir` files are never rewritten), so there is no
//! invalidation on write; [`ReadCache::remove_file`] drops an object after deletion.
//!
//! Each entry is charged its bytes plus [`entry_overhead`]: with batches of a few hundred bytes
//! (one per produce at a short flush), the maps' bookkeeping per entry is as large as the data,
//! and charging only the data let a 256 MiB cache hold over 500 MiB (the bounded-state soak).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Mutex;

use bytes::Bytes;
use object_store::path::Path;

/// Counters of a [`ReadCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups not served from the cache.
    pub misses: u64,
    /// Entries dropped to stay within capacity.
    pub evictions: u64,
    /// Entries currently cached.
    pub entries: usize,
    /// Bytes charged against the capacity: cached data plus each entry's bookkeeping.
    pub bytes: usize,
    /// Configured capacity in bytes.
    pub capacity_bytes: usize,
}

/// The buffer a slice points into, as far as the cache can tell: the cached entry's bytes. A
/// slice keeps all of them alive, so a reader that holds slices beyond the cache's own lifetime
/// for them (a fetch response until the client reads it) is charged for this length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backing {
    addr: usize,
    len: usize,
}

impl Backing {
    /// `bytes` as its own backing (a range just read from storage).
    pub fn of(bytes: &Bytes) -> Backing {
        Backing {
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// Bytes of the backing buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `(start, end)` of a cached byte range.
type Span = (u64, u64);

#[derive(Debug)]
struct Slot {
    bytes: Bytes,
    generation: u64,
    /// What the entry is charged against the capacity (bytes + bookkeeping).
    cost: usize,
}

/// Bookkeeping of one entry beyond its bytes: the recency map's copy of the path, the two map
/// nodes and their allocations (an estimate, on the high side).
pub fn entry_overhead(path: &Path) -> usize {
    160 + path.as_ref().len()
}

#[derive(Debug, Default)]
struct Inner {
    used: usize,
    next_generation: u64,
    /// Per object, cached ranges ordered by start.
    objects: HashMap<Path, BTreeMap<Span, Slot>>,
    /// Recency order: generation → entry. The smallest generation is the least recently used.
    lru: BTreeMap<u64, (Path, Span)>,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl Inner {
    /// The cached entry of `path` that covers `range`, if any.
    fn covering<'a>(inner: &'a Inner, path: &Path, range: &Range<u64>) -> Option<(Span, &'a Slot)> {
        if range.start > range.end {
            return None;
        }
        inner.objects.get(path).and_then(|ranges| {
            ranges
                .range(..=(range.start, u64::MAX))
                .rev()
                .find(|((_, end), _)| *end >= range.end)
                .map(|(&span, slot)| (span, slot))
        })
    }

    fn bump(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    fn remove(&mut self, path: &Path, span: Span) {
        let Some(ranges) = self.objects.get_mut(path) else {
            return;
        };
        if let Some(slot) = ranges.remove(&span) {
            self.used -= slot.cost;
            self.lru.remove(&slot.generation);
        }
        if ranges.is_empty() {
            self.objects.remove(path);
        }
    }

    fn insert(&mut self, path: &Path, span: Span, bytes: Bytes, capacity: usize) {
        self.remove(path, span);
        let cost = bytes.len() + entry_overhead(path);
        let generation = self.bump();
        self.objects.entry(path.clone()).or_default().insert(
            span,
            Slot {
                bytes,
                generation,
                cost,
            },
        );
        self.lru.insert(generation, (path.clone(), span));
        self.used += cost;
        while self.used > capacity {
            let Some((_, (victim_path, victim_span))) = self.lru.pop_first() else {
                break;
            };
            if let Some(ranges) = self.objects.get_mut(&victim_path) {
                if let Some(slot) = ranges.remove(&victim_span) {
                    self.used -= slot.cost;
                    self.evictions += 1;
                }
                if ranges.is_empty() {
                    self.objects.remove(&victim_path);
                }
            }
        }
    }
}

/// A byte-bounded LRU cache of object byte ranges. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct ReadCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl ReadCache {
    /// A cache holding at most `capacity_bytes` payload bytes (0 disables caching).
    pub fn new(capacity_bytes: usize) -> ReadCache {
        ReadCache {
            capacity: capacity_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The cache holds no invariants a panicking reader could break mid-way that matter more
        // than availability; recover from poisoning.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caches a whole object (write-through after upload) as range `0..len`. Ranges of the same
    /// object cached before are dropped: the whole file covers them.
    pub fn insert_file(&self, path: &Path, bytes: Bytes) {
        let len = bytes.len();
        if len + entry_overhead(path) > self.capacity {
            return;
        }
        let mut inner = self.lock();
        let old: Vec<Span> = inner
            .objects
            .get(path)
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default();
        for span in old {
            inner.remove(path, span);
        }
        inner.insert(path, (0, len as u64), bytes, self.capacity);
    }

    /// Caches `bytes` as the content of `range` of `path`. Ignored if the lengths disagree or the
    /// entry alone exceeds the capacity.
    pub fn insert_range(&self, path: &Path, range: Range<u64>, bytes: Bytes) {
        if range.start > range.end
            || range.end - range.start != bytes.len() as u64
            || bytes.len() + entry_overhead(path) > self.capacity
        {
            return;
        }
        self.lock()
            .insert(path, (range.start, range.end), bytes, self.capacity);
    }

    /// Whether a cached range covers `range` of `path`, without counting a lookup or making
    /// the entry recent (read-ahead deciding what to load).
    pub fn contains(&self, path: &Path, range: Range<u64>) -> bool {
        Inner::covering(&self.lock(), path, &range).is_some()
    }

    /// The bytes of `range` of `path`, if a cached range covers it.
    pub fn get(&self, path: &Path, range: Range<u64>) -> Option<Bytes> {
        self.get_backed(path, range).map(|(bytes, _)| bytes)
    }

    /// As [`ReadCache::get`], with the cached entry the bytes are a slice of.
    pub fn get_backed(&self, path: &Path, range: Range<u64>) -> Option<(Bytes, Backing)> {
        let mut inner = self.lock();
        let found = Inner::covering(&inner, path, &range)
            .map(|(span, slot)| (span, slot.generation, slot.bytes.clone()));
        let Some((span, old_generation, bytes)) = found else {
            inner.misses += 1;
            return None;
        };
        inner.hits += 1;
        let generation = inner.bump();
        inner.lru.remove(&old_generation);
        inner.lru.insert(generation, (path.clone(), span));
        if let Some(slot) = inner
            .objects
            .get_mut(path)
            .and_then(|ranges| ranges.get_mut(&span))
        {
            slot.generation = generation;
        }
        let from = (range.start - span.0) as usize;
        let to = (range.end - span.0) as usize;
        Some((bytes.slice(from..to), Backing::of(&bytes)))
    }

    /// Drops every cached range of `path` (after the object is deleted).
    pub fn remove_file(&self, path: &Path) {
        let mut inner = self.lock();
        let spans: Vec<Span> = inner
            .objects
            .get(path)
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default();
        for span in spans {
            inner.remove(path, span);
        }
    }

    /// Current counters.
    pub fn stats(&self) -> CacheStats {
        let inner = self.lock();
        CacheStats {
            hits: inner.hits,
            misses: inner.misses,
            evictions: inner.evictions,
            entries: inner.lru.len(),
            bytes: inner.used,
            capacity_bytes: self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        Path::from(s)
    }

    #[test]
    fn test_cache_range_hit_from_whole_file() {
        let cache = ReadCache::new(1024);
        let file = Bytes::from_static(b"0123456789");
        cache.insert_file(&p("a"), file.clone());
        let got = cache.get(&p("a"), 2..5).unwrap();
        assert_eq!(&got[..], b"234");
        // zero-copy: the slice points into the cached buffer
        assert_eq!(got.as_ptr(), file[2..].as_ptr());
        assert_eq!(&cache.get(&p("a"), 0..10).unwrap()[..], b"0123456789");
        assert!(cache.get(&p("a"), 5..11).is_none());
        assert!(cache.get(&p("b"), 0..1).is_none());
        let s = cache.stats();
        assert_eq!(
            (s.hits, s.misses, s.entries, s.bytes),
            (2, 2, 1, 10 + entry_overhead(&p("a")))
        );
        // The slice's backing is the cached entry it points into.
        let (_, backing) = cache.get_backed(&p("a"), 2..5).unwrap();
        assert_eq!(backing, Backing::of(&file));
    }

    #[test]
    fn test_cache_range_entries() {
        let cache = ReadCache::new(1024);
        cache.insert_range(&p("a"), 100..104, Bytes::from_static(b"wxyz"));
        cache.insert_range(&p("a"), 0..2, Bytes::from_static(b"ab"));
        assert_eq!(&cache.get(&p("a"), 100..104).unwrap()[..], b"wxyz");
        assert_eq!(&cache.get(&p("a"), 101..103).unwrap()[..], b"xy");
        assert_eq!(&cache.get(&p("a"), 1..2).unwrap()[..], b"b");
        assert!(cache.get(&p("a"), 99..101).is_none());
        assert!(cache.get(&p("a"), 2..4).is_none());
        // length mismatch is ignored
        cache.insert_range(&p("a"), 10..20, Bytes::from_static(b"short"));
        assert!(cache.get(&p("a"), 10..11).is_none());
        // a whole file replaces the ranges it covers
        cache.insert_file(&p("a"), Bytes::from(vec![7u8; 200]));
        let s = cache.stats();
        assert_eq!((s.entries, s.bytes), (1, 200 + entry_overhead(&p("a"))));
        cache.remove_file(&p("a"));
        assert_eq!(cache.stats().bytes, 0);
        assert!(cache.get(&p("a"), 0..1).is_none());
    }

    #[test]
    fn test_cache_eviction_by_bytes_lru() {
        let entry = 40 + entry_overhead(&p("a"));
        let capacity = 2 * entry + 20;
        let cache = ReadCache::new(capacity);
        cache.insert_file(&p("a"), Bytes::from(vec![1u8; 40]));
        cache.insert_file(&p("b"), Bytes::from(vec![2u8; 40]));
        // touch a: b becomes least recently used
        assert!(cache.get(&p("a"), 0..1).is_some());
        cache.insert_file(&p("c"), Bytes::from(vec![3u8; 40]));
        assert!(cache.get(&p("b"), 0..1).is_none(), "b evicted");
        assert!(cache.get(&p("a"), 0..1).is_some());
        assert!(cache.get(&p("c"), 0..1).is_some());
        let s = cache.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (2, 2 * entry, 1));
        assert!(s.bytes <= s.capacity_bytes);

        // larger than capacity with its bookkeeping: not cached, nothing evicted
        let huge = capacity - entry_overhead(&p("huge")) + 1;
        cache.insert_file(&p("huge"), Bytes::from(vec![0u8; huge]));
        assert!(cache.get(&p("huge"), 0..1).is_none());
        assert_eq!(cache.stats().entries, 2);

        // one big entry pushes out both
        let big = capacity - entry_overhead(&p("d"));
        cache.insert_file(&p("d"), Bytes::from(vec![4u8; big]));
        let s = cache.stats();
        assert_eq!((s.entries, s.bytes, s.evictions), (1, capacity, 3));
    }

    /// Many tiny entries are bounded by their bookkeeping, not only their bytes.
    #[test]
    fn test_cache_tiny_entries_are_charged_their_bookkeeping() {
        let capacity = 100 * 1024;
        let cache = ReadCache::new(capacity);
        for i in 0..10_000u64 {
            cache.insert_range(&p("f"), i * 8..i * 8 + 8, Bytes::from(vec![0u8; 8]));
        }
        let s = cache.stats();
        assert!(s.bytes <= capacity);
        assert!(
            s.entries <= capacity / (8 + entry_overhead(&p("f"))),
            "{} entries of 8 bytes fit in {capacity} bytes",
            s.entries
        );
    }

    #[test]
    fn test_cache_zero_capacity_caches_nothing() {
        let cache = ReadCache::new(0);
        cache.insert_file(&p("a"), Bytes::from_static(b"x"));
        assert!(cache.get(&p("a"), 0..1).is_none());
        // not even an empty file: every entry costs its bookkeeping
        cache.insert_file(&p("e"), Bytes::new());
        assert!(cache.get(&p("e"), 0..0).is_none());
    }
}
