//! A partition's record set as it goes out in a Fetch response: a sequence of byte strings
//! whose concatenation is the record set on the wire.
//!
//! A fetch rewrites `baseOffset` and `partitionLeaderEpoch` in the first 16 bytes of every
//! batch and nothing after them, so a large batch can go out as a small buffer holding its
//! rewritten prefix followed by a slice of the buffer it was read into (a cached or fetched
//! file range), without copying its body. A slice keeps that whole buffer alive until the
//! client has read the response, so a record set also says how many bytes it keeps alive
//! ([`RecordSet::pinned`]): that, not its length, is what a response is charged.

use bytes::{Bytes, BytesMut};

/// The pieces of one partition's record set, in wire order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordSet {
    chunks: Vec<Bytes>,
    len: usize,
    records: u64,
    pinned: usize,
}

impl RecordSet {
    /// A record set of `chunks` (empty ones are dropped) holding `records` records and keeping
    /// `pinned` bytes alive (at least its own length).
    pub fn from_chunks(chunks: Vec<Bytes>, records: u64, pinned: usize) -> RecordSet {
        let chunks: Vec<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let len = chunks.iter().map(Bytes::len).sum();
        RecordSet {
            chunks,
            len,
            records,
            pinned: pinned.max(len),
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records in the set's batches (their headers' record counts).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes this record set keeps alive: its copies plus every buffer its slices point into.
    pub fn pinned(&self) -> usize {
        self.pinned
    }

    /// The pieces, in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// The record set in one buffer: the piece itself when there is one, else a copy.
    pub fn to_bytes(&self) -> Bytes {
        match self.chunks.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            chunks => {
                let mut out = BytesMut::with_capacity(self.len);
                for chunk in chunks {
                    out.extend_from_slice(chunk);
                }
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_record_set_is_its_pieces_in_order() {
        let set = RecordSet::from_chunks(
            vec![
                Bytes::from_static(b"ab"),
                Bytes::new(),
                Bytes::from_static(b"cde"),
            ],
            3,
            100,
        );
        assert_eq!((set.len(), set.chunks().len(), set.records()), (5, 2, 3));
        assert_eq!(set.to_bytes(), Bytes::from_static(b"abcde"));
        assert_eq!(set.pinned(), 100);
        // Never charged less than its own bytes.
        assert_eq!(
            RecordSet::from_chunks(vec![Bytes::from_static(b"abc")], 0, 1).pinned(),
            3
        );
        assert!(RecordSet::default().is_empty());
        assert_eq!(RecordSet::default().to_bytes(), Bytes::new());
    }
}
