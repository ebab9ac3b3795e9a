//! The columnar codec of a partition's batch index inside a binary snapshot (RFC 0003 §8).
//!
//! A partition's index is dense (each batch starts where the previous ended), so base offsets
//! are implied and only each batch's offset span is stored. The index is cut into blocks of at
//! most [`INDEX_BLOCK_ROWS`] rows so that an encoder streams a partition of any size and a
//! decoder never buffers more than one block. A block, all integers LEB128 varints unless noted:
//!
//! ```text
//! u32 BE  body length (≤ MAX_INDEX_BLOCK_BYTES)
//! body:
//!   rows n (1..=INDEX_BLOCK_ROWS)
//!   zigzag  base offset of the first row
//!   n ×     offset span (last − base + 1 ≥ 1)
//!   n × zigzag  file reference − previous row's (the first against 0)
//!   n ×     length
//!   n ×     byte offset: in the previous row's file, zigzag of the distance from that row's
//!           end; in another file, the offset itself
//!   n × zigzag  first timestamp − previous row's first timestamp (the first against 0)
//!   n × zigzag  max timestamp − first timestamp
//! ```
//!
//! Columns keep similar values together; every delta is small in the common case (batches of a
//! partition land in time order, in files whose ids grow), so a row costs ~8 bytes (RFC 0003
//! aims at ~14; JSON costs ~160–190). Each block is self-contained; the decoder checks that
//! consecutive blocks stay dense. File references index a per-snapshot file table the caller
//! keeps.
//!
//! Decoding is total (BAD-1): malformed input is a [`FormatError`], never a panic, and no
//! allocation exceeds what the input's length could describe.

use crate::error::FormatError;

/// Rows per block at most: memory per decoded block stays small and fixed.
pub const INDEX_BLOCK_ROWS: usize = 4096;
/// Bytes of the block header (the body length).
pub const INDEX_BLOCK_HEADER: usize = 4;
/// The longest encoding of one row: four 10-byte varints and two 5-byte ones.
const MAX_ROW_BYTES: usize = 4 * 10 + 2 * 5;
/// The longest block body an encoder can produce; a header claiming more is malformed.
pub const MAX_INDEX_BLOCK_BYTES: usize = 5 + 10 + INDEX_BLOCK_ROWS * MAX_ROW_BYTES;
/// The shortest encoding of one row: six one-byte varints.
const MIN_ROW_BYTES: usize = 6;

/// One index entry as the codec sees it: the file is a position in the snapshot's file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexRow {
    pub base_offset: i64,
    pub last_offset: i64,
    pub file: u32,
    pub byte_offset: u64,
    pub len: u32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
}

/// Where the next row of a dense index must start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum NextBase {
    /// No row yet: anywhere (the log start may fall inside the first batch).
    #[default]
    Any,
    At(i64),
    /// The previous row ended at `i64::MAX`: no row can follow.
    End,
}

impl NextBase {
    /// Checks that a row starts at `base` and returns what follows a row ending at `last`.
    fn advance(self, base: i64, last: i64) -> Result<Self, FormatError> {
        match self {
            Self::At(expected) if expected != base => {
                return Err(FormatError::IndexNotDense {
                    expected,
                    found: base,
                })
            }
            Self::End => return Err(FormatError::MalformedIndex("a row after offset i64::MAX")),
            _ => {}
        }
        if last < base {
            return Err(FormatError::MalformedIndex("last offset below base offset"));
        }
        Ok(last.checked_add(1).map_or(Self::End, Self::At))
    }
}

/// Encodes one partition's index block by block, checking that it stays dense.
#[derive(Debug, Default)]
pub struct IndexEncoder {
    next_base: NextBase,
}

impl IndexEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `rows` (1..=[`INDEX_BLOCK_ROWS`], dense, continuing the previous block) as one
    /// block to `out`. A row breaking density is [`FormatError::IndexNotDense`]: the index
    /// cannot be written with implied base offsets.
    pub fn encode_block(
        &mut self,
        rows: &[IndexRow],
        out: &mut Vec<u8>,
    ) -> Result<(), FormatError> {
        if rows.is_empty() || rows.len() > INDEX_BLOCK_ROWS {
            return Err(FormatError::MalformedIndex("block row count out of range"));
        }
        let mut next_base = self.next_base;
        for row in rows {
            next_base = next_base.advance(row.base_offset, row.last_offset)?;
        }
        self.next_base = next_base;
        let header_at = out.len();
        out.extend_from_slice(&[0; INDEX_BLOCK_HEADER]);
        let body_at = out.len();
        put_varint(out, rows.len() as u64);
        put_varint(out, zigzag(rows[0].base_offset));
        for row in rows {
            put_varint(out, row.last_offset.abs_diff(row.base_offset) + 1);
        }
        for column in &COLUMNS {
            let mut previous = None;
            for row in rows {
                put_varint(out, (column.encode)(previous, row));
                previous = Some(row);
            }
        }
        let body_len = (out.len() - body_at) as u32;
        out[header_at..body_at].copy_from_slice(&body_len.to_be_bytes());
        Ok(())
    }
}

/// The body length a block header announces, checked against [`MAX_INDEX_BLOCK_BYTES`] before
/// the caller gathers (and allocates) that many bytes.
pub fn index_block_len(header: [u8; INDEX_BLOCK_HEADER]) -> Result<usize, FormatError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_INDEX_BLOCK_BYTES {
        return Err(FormatError::MalformedIndex(
            "block longer than any encoder writes",
        ));
    }
    Ok(len)
}

/// Decodes one partition's index block by block, checking density across blocks.
#[derive(Debug)]
pub struct IndexDecoder {
    file_count: u32,
    next_base: NextBase,
}

impl IndexDecoder {
    /// A decoder for an index whose file references must be below `file_count`.
    pub fn new(file_count: u32) -> Self {
        Self {
            file_count,
            next_base: NextBase::Any,
        }
    }

    /// The span column: rows with their offsets (the rest zero), checked dense from the
    /// previous block on, and where the next block must start.
    fn decode_spans(
        &self,
        input: &mut Varints<'_>,
        count: usize,
        mut base_offset: i64,
    ) -> Result<(Vec<IndexRow>, NextBase), FormatError> {
        let mut next_base = self.next_base;
        let mut rows = Vec::with_capacity(count);
        for _ in 0..count {
            let span = input.next()?;
            let last_offset = i64::try_from(span)
                .ok()
                .filter(|span| *span >= 1)
                .and_then(|span| base_offset.checked_add(span - 1))
                .ok_or(FormatError::MalformedIndex("offset span out of range"))?;
            next_base = next_base.advance(base_offset, last_offset)?;
            rows.push(IndexRow {
                base_offset,
                last_offset,
                file: 0,
                byte_offset: 0,
                len: 0,
                first_timestamp: 0,
                max_timestamp: 0,
            });
            // Past i64::MAX `advance` has already refused the next row.
            base_offset = last_offset.wrapping_add(1);
        }
        Ok((rows, next_base))
    }

    /// Decodes one block `body` (the bytes after its header, exactly) and appends its rows.
    pub fn decode_block(
        &mut self,
        body: &[u8],
        out: &mut Vec<IndexRow>,
    ) -> Result<(), FormatError> {
        let mut input = Varints { buf: body };
        let count = input.next()?;
        let count = usize::try_from(count)
            .ok()
            .filter(|n| (1..=INDEX_BLOCK_ROWS).contains(n))
            .ok_or(FormatError::MalformedIndex("block row count out of range"))?;
        if count.saturating_mul(MIN_ROW_BYTES) > body.len() {
            return Err(FormatError::MalformedIndex(
                "more rows than the block could hold",
            ));
        }
        let base_offset = unzigzag(input.next()?);
        let (mut rows, next_base) = self.decode_spans(&mut input, count, base_offset)?;
        for column in &COLUMNS {
            for i in 0..rows.len() {
                let previous = i.checked_sub(1).map(|p| rows[p]);
                let value = input.next()?;
                (column.decode)(previous.as_ref(), &mut rows[i], value, self.file_count)?;
            }
        }
        if !input.buf.is_empty() {
            return Err(FormatError::TrailingBytes {
                section: SECTION,
                count: input.buf.len() as u64,
            });
        }
        self.next_base = next_base;
        out.extend_from_slice(&rows);
        Ok(())
    }
}

const SECTION: &str = "snapshot index block";

/// A column after the spans, in block order: a row's field as one varint, given the previous
/// row of the block (`None` for the first), and back. A column's decoder may read the fields
/// of earlier columns (of this row and the previous one), never of later ones.
struct Column {
    encode: fn(Option<&IndexRow>, &IndexRow) -> u64,
    decode: fn(Option<&IndexRow>, &mut IndexRow, u64, u32) -> Result<(), FormatError>,
}

const COLUMNS: [Column; 5] = [
    // File reference: a delta, as files mostly grow along a partition.
    Column {
        encode: |previous, row| {
            zigzag(i64::from(row.file) - i64::from(previous.map_or(0, |p| p.file)))
        },
        decode: |previous, row, value, file_count| {
            let file = i64::from(previous.map_or(0, |p| p.file))
                .checked_add(unzigzag(value))
                .filter(|f| (0..i64::from(file_count)).contains(f))
                .ok_or(FormatError::MalformedIndex(
                    "file reference outside the file table",
                ))?;
            row.file = file as u32;
            Ok(())
        },
    },
    Column {
        encode: |_, row| u64::from(row.len),
        decode: |_, row, value, _| {
            row.len = u32::try_from(value)
                .map_err(|_| FormatError::MalformedIndex("batch length over u32"))?;
            Ok(())
        },
    },
    // Byte offset: in the previous row's file, the distance from that row's end (usually 0).
    Column {
        encode: |previous, row| match previous.filter(|p| p.file == row.file) {
            Some(p) => zigzag(row.byte_offset.wrapping_sub(end_of(p)) as i64),
            None => row.byte_offset,
        },
        decode: |previous, row, value, _| {
            row.byte_offset = match previous.filter(|p| p.file == row.file) {
                Some(p) => end_of(p).wrapping_add(unzigzag(value) as u64),
                None => value,
            };
            Ok(())
        },
    },
    Column {
        encode: |previous, row| {
            zigzag(
                row.first_timestamp
                    .wrapping_sub(previous.map_or(0, |p| p.first_timestamp)),
            )
        },
        decode: |previous, row, value, _| {
            let previous = previous.map_or(0, |p| p.first_timestamp);
            row.first_timestamp = previous.wrapping_add(unzigzag(value));
            Ok(())
        },
    },
    Column {
        encode: |_, row| zigzag(row.max_timestamp.wrapping_sub(row.first_timestamp)),
        decode: |_, row, value, _| {
            row.max_timestamp = row.first_timestamp.wrapping_add(unzigzag(value));
            Ok(())
        },
    },
];

/// Where a row's batch ends in its file.
fn end_of(row: &IndexRow) -> u64 {
    row.byte_offset.wrapping_add(u64::from(row.len))
}

/// Reads LEB128 varints from a slice.
struct Varints<'a> {
    buf: &'a [u8],
}

impl Varints<'_> {
    fn next(&mut self) -> Result<u64, FormatError> {
        let mut value = 0u64;
        for (i, byte) in self.buf.iter().enumerate().take(10) {
            let bits = u64::from(byte & 0x7f);
            // The tenth byte carries the top bit of a u64 only.
            if i == 9 && *byte > 1 {
                return Err(FormatError::MalformedIndex("varint longer than 64 bits"));
            }
            value |= bits << (7 * i);
            if byte & 0x80 == 0 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        if self.buf.len() >= 10 {
            return Err(FormatError::MalformedIndex("varint longer than 64 bits"));
        }
        Err(FormatError::Truncated {
            section: SECTION,
            needed: self.buf.len() as u64 + 1,
            available: self.buf.len() as u64,
        })
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(base: i64, span: i64, file: u32, byte_offset: u64, len: u32, ts: i64) -> IndexRow {
        IndexRow {
            base_offset: base,
            last_offset: base + span - 1,
            file,
            byte_offset,
            len,
            first_timestamp: ts,
            max_timestamp: ts + 3,
        }
    }

    /// Encodes `rows` in blocks of `block` rows; returns the bytes.
    fn encode(rows: &[IndexRow], block: usize) -> Vec<u8> {
        let mut encoder = IndexEncoder::new();
        let mut out = Vec::new();
        for part in rows.chunks(block) {
            encoder.encode_block(part, &mut out).unwrap();
        }
        out
    }

    /// Decodes every block of `bytes` against a table of `files` files.
    fn decode(mut bytes: &[u8], files: u32) -> Result<Vec<IndexRow>, FormatError> {
        let mut decoder = IndexDecoder::new(files);
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let header: [u8; INDEX_BLOCK_HEADER] = bytes
                .get(..INDEX_BLOCK_HEADER)
                .and_then(|h| h.try_into().ok())
                .ok_or(FormatError::MalformedIndex("test: short header"))?;
            let len = index_block_len(header)?;
            let body = bytes
                .get(INDEX_BLOCK_HEADER..INDEX_BLOCK_HEADER + len)
                .ok_or(FormatError::MalformedIndex("test: short body"))?;
            decoder.decode_block(body, &mut out)?;
            bytes = &bytes[INDEX_BLOCK_HEADER + len..];
        }
        Ok(out)
    }

    #[test]
    fn test_index_round_trip_and_size() {
        // 10 batches per file, consecutive in each file, as a partition of a busy topic sees.
        let rows: Vec<IndexRow> = (0..10_000)
            .map(|i| {
                let file = (i / 10) as u32;
                row(
                    i * 100,
                    100,
                    file,
                    (i as u64 % 10) * 16_384,
                    16_384,
                    1_764_547_200_000 + i,
                )
            })
            .collect();
        let bytes = encode(&rows, INDEX_BLOCK_ROWS);
        assert_eq!(decode(&bytes, 1000).unwrap(), rows);
        let per_row = bytes.len() as f64 / rows.len() as f64;
        assert!(per_row < 10.0, "{per_row} bytes per row");
    }

    #[test]
    fn test_index_extremes_round_trip() {
        let rows = vec![
            IndexRow {
                base_offset: -5,
                last_offset: 10,
                file: 3,
                byte_offset: u64::MAX,
                len: u32::MAX,
                first_timestamp: i64::MIN,
                max_timestamp: i64::MAX,
            },
            IndexRow {
                base_offset: 11,
                last_offset: i64::MAX,
                file: 0,
                byte_offset: 0,
                len: 0,
                first_timestamp: i64::MAX,
                max_timestamp: i64::MIN,
            },
        ];
        for block in [1, 2] {
            assert_eq!(decode(&encode(&rows, block), 4).unwrap(), rows);
        }
    }

    /// The decoder refuses blocks longer than `MAX_INDEX_BLOCK_BYTES`: the longest block an
    /// encoder writes must fit.
    #[test]
    fn test_index_longest_block_fits_the_limit() {
        let mut base = i64::MIN;
        let rows: Vec<IndexRow> = (0..INDEX_BLOCK_ROWS)
            .map(|i| {
                let odd = i % 2 == 1;
                let span = if i == 0 { i64::MAX } else { 1 };
                let row = IndexRow {
                    base_offset: base,
                    last_offset: base + (span - 1),
                    file: if odd { u32::MAX - 1 } else { 0 },
                    byte_offset: if odd { u64::MAX } else { 1 << 63 },
                    len: u32::MAX,
                    // Deltas of ±2^62 between rows and within one: ten bytes each.
                    first_timestamp: if odd { 0 } else { 1 << 62 },
                    max_timestamp: if odd { -(1 << 62) } else { i64::MIN },
                };
                base = row.last_offset + 1;
                row
            })
            .collect();
        let bytes = encode(&rows, INDEX_BLOCK_ROWS);
        let header = bytes[..INDEX_BLOCK_HEADER].try_into().unwrap();
        let len = index_block_len(header).unwrap();
        assert!(len > INDEX_BLOCK_ROWS * 40, "a heavy case: {len} bytes");
        assert_eq!(decode(&bytes, u32::MAX).unwrap(), rows);
    }

    #[test]
    fn test_index_encoder_refuses_gaps_and_bad_blocks() {
        let mut out = Vec::new();
        let gap = [row(0, 5, 0, 0, 1, 0), row(6, 1, 0, 1, 1, 0)];
        assert_eq!(
            IndexEncoder::new().encode_block(&gap, &mut out),
            Err(FormatError::IndexNotDense {
                expected: 5,
                found: 6
            })
        );
        let mut encoder = IndexEncoder::new();
        encoder
            .encode_block(&[row(0, 5, 0, 0, 1, 0)], &mut out)
            .unwrap();
        assert!(matches!(
            encoder.encode_block(&[row(7, 1, 0, 0, 1, 0)], &mut out),
            Err(FormatError::IndexNotDense {
                expected: 5,
                found: 7
            })
        ));
        assert!(IndexEncoder::new().encode_block(&[], &mut out).is_err());
        let too_many = vec![row(0, 1, 0, 0, 1, 0); INDEX_BLOCK_ROWS + 1];
        assert!(IndexEncoder::new()
            .encode_block(&too_many, &mut out)
            .is_err());
        let backwards = IndexRow {
            last_offset: -1,
            ..row(0, 1, 0, 0, 1, 0)
        };
        assert!(IndexEncoder::new()
            .encode_block(&[backwards], &mut out)
            .is_err());
        let after_max = [
            IndexRow {
                last_offset: i64::MAX,
                ..row(0, 1, 0, 0, 1, 0)
            },
            row(i64::MIN, 1, 0, 0, 1, 0),
        ];
        assert!(IndexEncoder::new()
            .encode_block(&after_max, &mut out)
            .is_err());
    }

    #[test]
    fn test_index_decoder_rejects_malformed_blocks() {
        let rows = [row(0, 5, 1, 0, 10, 0), row(5, 5, 1, 10, 10, 1)];
        let bytes = encode(&rows, 2);
        // A file reference outside the table.
        assert_eq!(
            decode(&bytes, 1),
            Err(FormatError::MalformedIndex(
                "file reference outside the file table"
            ))
        );
        // Every truncation of the body.
        for cut in INDEX_BLOCK_HEADER..bytes.len() {
            let body = &bytes[INDEX_BLOCK_HEADER..cut];
            assert!(IndexDecoder::new(2)
                .decode_block(body, &mut Vec::new())
                .is_err());
        }
        // A trailing byte in the body.
        let mut body = bytes[INDEX_BLOCK_HEADER..].to_vec();
        body.push(0);
        assert!(matches!(
            IndexDecoder::new(2).decode_block(&body, &mut Vec::new()),
            Err(FormatError::TrailingBytes { count: 1, .. })
        ));
        // A header longer than any block.
        let huge = (MAX_INDEX_BLOCK_BYTES as u32 + 1).to_be_bytes();
        assert!(index_block_len(huge).is_err());
        // A row count the body cannot hold, zero rows, a zero span, an overlong varint.
        let mut decoder = IndexDecoder::new(1);
        assert!(decoder
            .decode_block(&[0x80, 0x20], &mut Vec::new())
            .is_err());
        assert!(decoder
            .decode_block(&[0, 0, 0, 0, 0, 0, 0], &mut Vec::new())
            .is_err());
        assert!(decoder
            .decode_block(&[1, 0, 0, 0, 0, 0, 0, 0], &mut Vec::new())
            .is_err());
        let overlong = [
            1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ];
        assert!(decoder.decode_block(&overlong, &mut Vec::new()).is_err());
    }

    #[test]
    fn test_index_decoder_checks_density_across_blocks() {
        let first = encode(&[row(0, 5, 0, 0, 1, 0)], 1);
        let apart = encode(&[row(9, 1, 0, 0, 1, 0)], 1);
        let joined = [first, apart].concat();
        assert_eq!(
            decode(&joined, 1),
            Err(FormatError::IndexNotDense {
                expected: 5,
                found: 9
            })
        );
    }

    /// A dense index from arbitrary spans and field values.
    fn any_index() -> impl Strategy<Value = (Vec<IndexRow>, usize)> {
        let fields = (
            1i64..1_000_000,
            0u32..50,
            any::<u64>(),
            any::<u32>(),
            any::<i64>(),
            any::<i64>(),
        );
        (
            any::<i64>().prop_map(|b| b / 2),
            proptest::collection::vec(fields, 1..300),
            1usize..64,
        )
            .prop_map(|(start, fields, block)| {
                let mut base = start;
                let rows = fields
                    .into_iter()
                    .map(|(span, file, byte_offset, len, first, max)| {
                        let row = IndexRow {
                            base_offset: base,
                            last_offset: base + span - 1,
                            file,
                            byte_offset,
                            len,
                            first_timestamp: first,
                            max_timestamp: max,
                        };
                        base += span;
                        row
                    })
                    .collect();
                (rows, block)
            })
    }

    proptest! {
        #[test]
        fn test_index_round_trip_prop((rows, block) in any_index()) {
            prop_assert_eq!(decode(&encode(&rows, block), 50).unwrap(), rows);
        }

        #[test]
        fn test_index_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = IndexDecoder::new(8).decode_block(&bytes, &mut Vec::new());
            let _ = decode(&bytes, 8);
        }

        #[test]
        fn test_index_decode_mutated_never_panics(
            (rows, block) in any_index(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encode(&rows, block);
            for (index, value) in flips {
                let position = index.index(bytes.len());
                bytes[position] = value;
            }
            let _ = decode(&bytes, 50);
        }
    }
}
