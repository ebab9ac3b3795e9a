//! Putting a partition's fetched batches together as a [`RecordSet`].
//!
//! A fetch changes the first 16 bytes of each batch (`baseOffset` to the assigned offset, the
//! leader epoch; `batchLength` is written back as stored) and nothing else. A batch of at least
//! [`SLICE_FROM`] bytes goes out as its rewritten prefix (copied into a small buffer) followed by
//! a slice of the buffer it was read into, so its body is never copied in user space; smaller
//! batches are copied whole into the same buffer (a piece per small batch would cost more in
//! `writev` slots than the copy saves).
//!
//! A slice keeps the whole buffer it points into alive while the client reads the response: a
//! cached file range, or the range this fetch read. So a buffer is sliced only when the batches
//! the fetch slices from it make at least half of it ([`PIN_FACTOR`]); otherwise its batches are
//! copied. A record set then keeps alive at most twice its length plus 16 bytes per sliced
//! batch, and [`RecordSet::pinned`] says exactly how much, which is what the response is
//! charged.

use std::collections::{HashMap, HashSet};

use bytes::{BufMut, Bytes, BytesMut};
use weir_control::IndexEntry;
use weir_protocol::batch::BatchHeader;
use weir_protocol::record_set::RecordSet;
use weir_storage::Backing;

use crate::reader::{FetchError, ReadPlan, LEADER_EPOCH};

/// Bytes at the start of a batch that a fetch writes anew (`baseOffset` and
/// `partitionLeaderEpoch` rewritten, `batchLength` between them as stored).
pub(crate) const REWRITTEN_PREFIX: usize = 16;

/// Batches this long or longer are sliced rather than copied (when their buffer allows).
pub(crate) const SLICE_FROM: usize = 4096;

/// A buffer is sliced only if it is at most this many times the bytes the fetch takes from it.
pub(crate) const PIN_FACTOR: usize = 2;

/// One batch of a fetch: its stored bytes, the offset it is served at, its records (from the
/// header read when it was split off) and the buffer its bytes are a slice of.
#[derive(Debug, Clone)]
pub(crate) struct Batch {
    bytes: Bytes,
    base_offset: i64,
    records: u64,
    backing: Backing,
}

/// The records of a batch of `len` stored bytes with `header`, counted as `count_records`
/// counts a record set: a batch cut short (or without a header that parses) counts none.
fn records_in(header: Option<&BatchHeader>, len: usize) -> u64 {
    header
        .filter(|h| h.total_len() <= len)
        .map_or(0, |h| u64::try_from(h.records_count).unwrap_or(0))
}

/// Appends to `out` the batches of one index entry read as `bytes` (a slice of `backing`), each
/// with its assigned base offset. An ingest entry is one batch; a compacted run entry is
/// consecutive batches (RFC 0005 §3), whose assigned offsets follow from the entry's base
/// offset and each batch's offset span. Inside a run, batches wholly below the plan's offset
/// are left out, so a fetch starts at the batch holding its offset as Kafka's does, and batches
/// past the plan's byte budget are left out (the first batch of a fetch is always served when
/// it asked for one). `taken` counts the bytes of the batches so far.
pub(crate) fn entry_batches(
    out: &mut Vec<Batch>,
    taken: &mut usize,
    bytes: Bytes,
    backing: Backing,
    entry: &IndexEntry,
    plan: &ReadPlan,
) -> Result<(), FetchError> {
    if bytes.len() < REWRITTEN_PREFIX {
        // Too short to hold the fields a fetch rewrites: a damaged object or a short read.
        return Err(FetchError::Storage(format!(
            "batch {}..={} of {}: {} bytes, shorter than a batch header",
            entry.base_offset,
            entry.last_offset,
            entry.file_id,
            bytes.len()
        )));
    }
    let header = BatchHeader::parse(&bytes).ok();
    if header.as_ref().is_none_or(|h| h.total_len() >= bytes.len()) {
        // One batch (a header that does not parse is served as stored, as always).
        *taken += bytes.len();
        out.push(Batch {
            records: records_in(header.as_ref(), bytes.len()),
            bytes,
            base_offset: entry.base_offset,
            backing,
        });
        return Ok(());
    }
    let corrupt = |why: String| {
        FetchError::Storage(format!(
            "run {}..={} of {}: {why}",
            entry.base_offset, entry.last_offset, entry.file_id
        ))
    };
    let (mut base, mut at) = (entry.base_offset, 0);
    while at < bytes.len() {
        let rest = &bytes[at..];
        let header = BatchHeader::parse(rest).map_err(|e| corrupt(e.to_string()))?;
        let (len, span) = (header.total_len(), header.offset_span());
        if len < REWRITTEN_PREFIX || len > rest.len() || span < 1 {
            return Err(corrupt(format!(
                "a batch of {len} bytes and {span} offsets"
            )));
        }
        if base + span > plan.offset() {
            let fits = *taken + len <= plan.max_bytes();
            if !(fits || (*taken == 0 && plan.at_least_one())) {
                return Ok(());
            }
            *taken += len;
            out.push(Batch {
                bytes: bytes.slice(at..at + len),
                base_offset: base,
                records: records_in(Some(&header), len),
                backing,
            });
        }
        base += span;
        at += len;
    }
    if base != entry.last_offset + 1 {
        return Err(corrupt(format!("its batches end at {}", base - 1)));
    }
    Ok(())
}

/// The record set of `batches`, in order, with their offsets rewritten: large batches of
/// buffers that the fetch slices at least half of are sliced, everything else is copied into one
/// buffer (see the module docs).
pub(crate) fn assemble(batches: Vec<Batch>) -> RecordSet {
    let large = |batch: &Batch| batch.bytes.len() >= SLICE_FROM;
    // Per buffer, the bytes of the batches that would be sliced from it.
    let mut sliceable: HashMap<Backing, usize> = HashMap::new();
    for batch in batches.iter().filter(|b| large(b)) {
        *sliceable.entry(batch.backing).or_default() += batch.bytes.len();
    }
    let sliced: Vec<bool> = batches
        .iter()
        .map(|batch| {
            large(batch)
                && batch.backing.len() <= PIN_FACTOR.saturating_mul(sliceable[&batch.backing])
        })
        .collect();
    let copied: usize = batches
        .iter()
        .zip(&sliced)
        .map(|(b, sliced)| {
            if *sliced {
                REWRITTEN_PREFIX
            } else {
                b.bytes.len()
            }
        })
        .sum();
    // Sized exactly, so splitting pieces off never reallocates it.
    let mut buffer = BytesMut::with_capacity(copied);
    let mut chunks = Vec::new();
    let mut pinned: HashSet<Backing> = HashSet::new();
    for (batch, sliced) in batches.iter().zip(sliced) {
        let bytes = &batch.bytes;
        buffer.put_i64(batch.base_offset);
        buffer.put_slice(&bytes[8..12]); // batchLength, as stored
        buffer.put_i32(LEADER_EPOCH);
        if sliced {
            chunks.push(buffer.split().freeze());
            chunks.push(bytes.slice(REWRITTEN_PREFIX..));
            pinned.insert(batch.backing);
        } else {
            buffer.put_slice(&bytes[REWRITTEN_PREFIX..]);
        }
    }
    chunks.push(buffer.freeze());
    let pinned = copied + pinned.iter().map(Backing::len).sum::<usize>();
    let records = batches.iter().map(|b| b.records).sum();
    RecordSet::from_chunks(chunks, records, pinned)
}

#[cfg(test)]
mod tests {
    use weir_protocol::batch::{build_test_batch, rewrite_offsets};

    use super::*;

    fn batch(buffer: &Bytes, range: std::ops::Range<usize>, base_offset: i64) -> Batch {
        let bytes = buffer.slice(range);
        Batch {
            records: records_in(BatchHeader::parse(&bytes).ok().as_ref(), bytes.len()),
            bytes,
            base_offset,
            backing: Backing::of(buffer),
        }
    }

    /// `batches` of `buffer` at `(range, base offset)`, rewritten and back to back.
    fn rewritten(buffer: &Bytes, batches: &[(std::ops::Range<usize>, i64)]) -> Bytes {
        let mut out = Vec::new();
        for (range, base) in batches {
            let at = out.len();
            out.extend_from_slice(&buffer[range.clone()]);
            rewrite_offsets(&mut out[at..], *base, LEADER_EPOCH);
        }
        Bytes::from(out)
    }

    /// A range read from storage: the large batch's body is a slice of it, the small batch and
    /// the large one's prefix are copied into one buffer; the response is charged the copies
    /// and the whole range.
    #[test]
    fn test_a_large_batch_is_sliced_and_a_small_one_copied() {
        let small = build_test_batch(2, 7, (-1, -1, -1));
        let large = build_test_batch(600, 5, (-1, -1, -1));
        assert!(large.len() >= SLICE_FROM && small.len() < SLICE_FROM);
        let range: Bytes = [small.clone(), large.clone()].concat().into();
        let (s, l) = (0..small.len(), small.len()..range.len());
        let set = assemble(vec![
            batch(&range, s.clone(), 10),
            batch(&range, l.clone(), 12),
        ]);
        assert_eq!(
            set.to_bytes(),
            rewritten(&range, &[(s, 10), (l.clone(), 12)])
        );
        assert_eq!(set.chunks().len(), 2);
        assert_eq!(set.chunks()[1].as_ptr(), range[l.start + 16..].as_ptr());
        assert_eq!(set.records(), 602);
        assert_eq!(set.pinned(), small.len() + REWRITTEN_PREFIX + range.len());
    }

    /// A buffer the fetch takes less than half of is copied from, not pinned.
    #[test]
    fn test_a_buffer_the_fetch_takes_little_of_is_copied() {
        let large = build_test_batch(600, 5, (-1, -1, -1));
        let window: Bytes = [large.clone(), Bytes::from(vec![0; 2 * large.len()])]
            .concat()
            .into();
        let set = assemble(vec![batch(&window, 0..large.len(), 3)]);
        assert_eq!(set.to_bytes(), rewritten(&window, &[(0..large.len(), 3)]));
        assert_eq!(set.chunks().len(), 1);
        assert_ne!(set.chunks()[0].as_ptr(), window.as_ptr());
        assert_eq!(set.pinned(), large.len());
        // Two fetched batches of the same window make half of it: sliced.
        let window: Bytes = [large.clone(), large.clone(), Bytes::from(vec![0; 100])]
            .concat()
            .into();
        let both = [(0..large.len(), 3), (large.len()..2 * large.len(), 603)];
        let set = assemble(
            both.iter()
                .map(|(r, b)| batch(&window, r.clone(), *b))
                .collect(),
        );
        assert_eq!(set.to_bytes(), rewritten(&window, &both));
        assert_eq!(set.chunks().len(), 4);
        assert_eq!(set.pinned(), 2 * REWRITTEN_PREFIX + window.len());
    }

    /// Small batches taken from a buffer do not count toward slicing it: a buffer of one large
    /// batch and many small ones, all fetched, is copied from when the large one is less than
    /// half of it (slicing it would pin the buffer on top of the small batches' copies).
    #[test]
    fn test_small_batches_do_not_make_a_buffer_worth_slicing() {
        let large = build_test_batch(600, 5, (-1, -1, -1));
        let small = build_test_batch(2, 7, (-1, -1, -1));
        let smalls = (2 * large.len()).div_ceil(small.len());
        let mut parts = vec![large.clone()];
        parts.extend(std::iter::repeat_n(small.clone(), smalls));
        let range: Bytes = parts.concat().into();
        let mut at = 0;
        let mut base = 0;
        let mut taken = Vec::new();
        for part in &parts {
            taken.push((at..at + part.len(), base));
            at += part.len();
            base += BatchHeader::parse(part).unwrap().offset_span();
        }
        let set = assemble(
            taken
                .iter()
                .map(|(r, b)| batch(&range, r.clone(), *b))
                .collect(),
        );
        assert_eq!(set.to_bytes(), rewritten(&range, &taken));
        assert_eq!(set.chunks().len(), 1, "nothing sliced");
        assert_eq!(set.pinned(), range.len());
    }
}
