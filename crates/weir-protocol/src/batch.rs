//! A zero-copy view of Kafka v2 record batches: the 61-byte header, CRC32C, and the two fields
//! Weir rewrites on fetch (`baseOffset`, `partitionLeaderEpoch`), which the CRC does not cover.
//!
//! Records inside a batch are never decoded: Weir stores and serves batches as opaque bytes.

use bytes::Bytes;

/// Length of the v2 record-batch header, up to and including the record count.
pub const RECORD_BATCH_HEADER_LEN: usize = 61;
/// Bytes before `batchLength`'s coverage starts (baseOffset + batchLength).
const LOG_OVERHEAD: usize = 12;
/// The CRC covers attributes..end.
const CRC_START: usize = 21;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record set of {available} bytes ends inside a batch header")]
    TruncatedHeader { available: usize },
    #[error("batch declares {declared} bytes but only {available} remain")]
    TruncatedBatch { declared: usize, available: usize },
    #[error("batch length {0} is smaller than a v2 header")]
    BadLength(i32),
    #[error("unsupported record batch magic {0}, only v2 is accepted")]
    BadMagic(i8),
    #[error("crc mismatch: header says {expected:#010x}, content is {actual:#010x}")]
    CrcMismatch { expected: u32, actual: u32 },
    #[error("unknown compression codec {0}")]
    BadCompression(i16),
    #[error("record count {count} does not match last offset delta {last_offset_delta}")]
    BadCount { count: i32, last_offset_delta: i32 },
    #[error("empty record set")]
    Empty,
}

/// The decoded header of one v2 record batch, plus the batch's bytes (header included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl Compression {
    /// Every codec, in attribute order.
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
}

impl BatchHeader {
    /// Parses the header fields of the batch starting at `buf[0]` (no validation beyond length).
    pub fn parse(buf: &[u8]) -> Result<Self, BatchError> {
        if buf.len() < RECORD_BATCH_HEADER_LEN {
            return Err(BatchError::TruncatedHeader {
                available: buf.len(),
            });
        }
        Ok(Self {
            base_offset: i64::from_be_bytes(field(buf, 0)),
            batch_length: i32::from_be_bytes(field(buf, 8)),
            partition_leader_epoch: i32::from_be_bytes(field(buf, 12)),
            magic: i8::from_be_bytes(field(buf, 16)),
            crc: u32::from_be_bytes(field(buf, 17)),
            attributes: i16::from_be_bytes(field(buf, 21)),
            last_offset_delta: i32::from_be_bytes(field(buf, 23)),
            first_timestamp: i64::from_be_bytes(field(buf, 27)),
            max_timestamp: i64::from_be_bytes(field(buf, 35)),
            producer_id: i64::from_be_bytes(field(buf, 43)),
            producer_epoch: i16::from_be_bytes(field(buf, 51)),
            base_sequence: i32::from_be_bytes(field(buf, 53)),
            records_count: i32::from_be_bytes(field(buf, 57)),
        })
    }

    pub fn compression(&self) -> Result<Compression, BatchError> {
        match self.attributes & 0x07 {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(BatchError::BadCompression(other)),
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }

    /// Total bytes of the batch on the wire.
    pub fn total_len(&self) -> usize {
        LOG_OVERHEAD + usize::try_from(self.batch_length).unwrap_or(0)
    }

    /// Offsets the batch occupies once assigned.
    pub fn offset_span(&self) -> i64 {
        i64::from(self.last_offset_delta) + 1
    }

    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }
}

fn field<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

/// One validated batch: its header and its bytes, sliced zero-copy from the request.
#[derive(Debug, Clone)]
pub struct ValidatedBatch {
    pub header: BatchHeader,
    pub bytes: Bytes,
}

/// Splits a produce request's record set into batches, validating each header and CRC32C.
pub fn split_and_validate(records: &Bytes) -> Result<Vec<ValidatedBatch>, BatchError> {
    let mut batches = Vec::new();
    let mut position = 0usize;
    while position < records.len() {
        let remaining = &records[position..];
        let header = BatchHeader::parse(remaining)?;
        validate_header(&header, remaining)?;
        let len = header.total_len();
        batches.push(ValidatedBatch {
            header,
            bytes: records.slice(position..position + len),
        });
        position += len;
    }
    if batches.is_empty() {
        return Err(BatchError::Empty);
    }
    Ok(batches)
}

/// Records in a record set of whole v2 batches (as a fetch returns), read from each header's
/// record count; stops at the first batch that does not fit (a truncated tail counts nothing).
pub fn count_records(records: &[u8]) -> u64 {
    let mut count = 0u64;
    let mut position = 0usize;
    while let Some(header) = records.get(position..position + RECORD_BATCH_HEADER_LEN) {
        let batch_len = i32::from_be_bytes(field(header, 8));
        let Ok(len) = usize::try_from(batch_len) else {
            break;
        };
        if position + LOG_OVERHEAD + len > records.len() {
            break;
        }
        count += u64::try_from(i32::from_be_bytes(field(header, 57))).unwrap_or(0);
        position += LOG_OVERHEAD + len;
    }
    count
}

fn validate_header(header: &BatchHeader, remaining: &[u8]) -> Result<(), BatchError> {
    if header.magic != 2 {
        return Err(BatchError::BadMagic(header.magic));
    }
    let min_length = (RECORD_BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;
    if header.batch_length < min_length {
        return Err(BatchError::BadLength(header.batch_length));
    }
    let len = header.total_len();
    if len > remaining.len() {
        return Err(BatchError::TruncatedBatch {
            declared: len,
            available: remaining.len(),
        });
    }
    let actual = crc32c::crc32c(&remaining[CRC_START..len]);
    if actual != header.crc {
        return Err(BatchError::CrcMismatch {
            expected: header.crc,
            actual,
        });
    }
    header.compression()?;
    if header.records_count <= 0 || header.last_offset_delta != header.records_count - 1 {
        return Err(BatchError::BadCount {
            count: header.records_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(())
}

/// Rewrites `baseOffset` and `partitionLeaderEpoch` of the batch at the start of `batch`.
/// Neither field is covered by the CRC, so the batch stays valid.
pub fn rewrite_offsets(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    debug_assert!(batch.len() >= RECORD_BATCH_HEADER_LEN);
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
    batch[12..16].copy_from_slice(&leader_epoch.to_be_bytes());
}

/// Recomputes the CRC32C of the batch at the start of `batch` after a change to a covered field.
pub fn reseal(batch: &mut [u8]) {
    let end = BatchHeader::parse(batch).map_or(batch.len(), |h| h.total_len().min(batch.len()));
    let crc = crc32c::crc32c(&batch[CRC_START..end]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Sets a batch's timestamp type to LogAppendTime and its max timestamp to `append_time`, as
/// Kafka does for `message.timestamp.type=LogAppendTime` topics (record deltas are left alone:
/// consumers take every record's timestamp from the batch), and reseals the CRC.
pub fn set_log_append_time(batch: &mut [u8], append_time: i64) {
    debug_assert!(batch.len() >= RECORD_BATCH_HEADER_LEN);
    let attributes = i16::from_be_bytes(field(batch, 21)) | 0x08;
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    batch[35..43].copy_from_slice(&append_time.to_be_bytes());
    reseal(batch);
}

/// An empty record batch spanning `span` offsets: no records, `lastOffsetDelta` = span − 1,
/// no producer id. Kafka's log cleaner leaves such batches to keep producer state, and
/// consumers step over them to the next offset. Weir serves one in place of an aborted batch
/// (RFC 0006), so that a partition's offsets stay dense.
pub fn empty_batch(span: i32, first_timestamp: i64, max_timestamp: i64) -> Bytes {
    use bytes::BufMut;
    let mut out = bytes::BytesMut::with_capacity(RECORD_BATCH_HEADER_LEN);
    out.put_i64(0);
    out.put_i32((RECORD_BATCH_HEADER_LEN - LOG_OVERHEAD) as i32);
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(0);
    out.put_i16(0);
    out.put_i32(span.max(1) - 1);
    out.put_i64(first_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(-1);
    out.put_i16(-1);
    out.put_i32(-1);
    out.put_i32(0);
    reseal(&mut out);
    out.freeze()
}

/// Test helper and tool for building a minimal valid batch of `count` records, each with no key
/// and the one-byte value `x`, all at `first_timestamp`.
pub fn build_test_batch(count: i32, first_timestamp: i64, producer: (i64, i16, i32)) -> Bytes {
    let record = crate::records::RecordSpec {
        key: None,
        value: Some(b"x".to_vec()),
        timestamp: first_timestamp,
    };
    let records = vec![record; usize::try_from(count).unwrap_or(0)];
    crate::records::build_producer_batch(Compression::None, &records, producer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn test_count_records_sums_whole_batches_only() {
        let mut set = build_test_batch(3, 0, (-1, -1, -1)).to_vec();
        set.extend_from_slice(&build_test_batch(5, 0, (-1, -1, -1)));
        assert_eq!(count_records(&set), 8);
        // A truncated last batch (as a fetch at max_bytes may end) counts nothing.
        assert_eq!(count_records(&set[..set.len() - 1]), 3);
        assert_eq!(count_records(&[]), 0);
        assert_eq!(count_records(&[0xff; 70]), 0);
    }

    #[test]
    fn test_batch_split_validates_two_batches() {
        let first = build_test_batch(3, 1000, (-1, -1, -1));
        let second = build_test_batch(1, 2000, (7, 0, 3));
        let mut joined = first.to_vec();
        joined.extend_from_slice(&second);
        let batches = split_and_validate(&Bytes::from(joined)).unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].header.records_count, 3);
        assert_eq!(batches[0].header.offset_span(), 3);
        assert_eq!(batches[1].header.producer_id, 7);
        assert_eq!(batches[1].header.base_sequence, 3);
        assert_eq!(batches[1].bytes, second);
    }

    #[test]
    fn test_empty_batch_spans_its_offsets_with_a_valid_crc() {
        let batch = empty_batch(7, 100, 200);
        assert_eq!(batch.len(), RECORD_BATCH_HEADER_LEN);
        let header = BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.total_len(), batch.len());
        assert_eq!((header.offset_span(), header.records_count), (7, 0));
        assert_eq!((header.first_timestamp, header.max_timestamp), (100, 200));
        assert!(!header.has_producer_id() && !header.is_control());
        let crc = crc32c::crc32c(&batch[CRC_START..]);
        assert_eq!(header.crc, crc);
        assert_eq!(count_records(&batch), 0);
    }

    #[test]
    fn test_batch_crc_mismatch_detected() {
        let mut bytes = build_test_batch(2, 1, (-1, -1, -1)).to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let err = split_and_validate(&Bytes::from(bytes)).unwrap_err();
        assert!(matches!(err, BatchError::CrcMismatch { .. }));
    }

    #[test]
    fn test_batch_rewrite_keeps_crc_valid() {
        let mut bytes = build_test_batch(2, 1, (-1, -1, -1)).to_vec();
        rewrite_offsets(&mut bytes, 12345, 9);
        let batches = split_and_validate(&Bytes::from(bytes)).unwrap();
        assert_eq!(batches[0].header.base_offset, 12345);
        assert_eq!(batches[0].header.partition_leader_epoch, 9);
    }

    #[test]
    fn test_batch_rejects_old_magic_and_truncation() {
        let mut bytes = build_test_batch(1, 1, (-1, -1, -1)).to_vec();
        bytes[16] = 1;
        assert_eq!(
            split_and_validate(&Bytes::from(bytes.clone())).unwrap_err(),
            BatchError::BadMagic(1)
        );
        bytes[16] = 2;
        bytes.truncate(bytes.len() - 1);
        assert!(matches!(
            split_and_validate(&Bytes::from(bytes)).unwrap_err(),
            BatchError::TruncatedBatch { .. }
        ));
        assert_eq!(
            split_and_validate(&Bytes::new()).unwrap_err(),
            BatchError::Empty
        );
    }

    proptest! {
        #[test]
        fn test_batch_split_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = split_and_validate(&Bytes::from(data));
        }

        #[test]
        fn test_batch_header_round_trip(count in 1i32..50, ts in 0i64..i64::MAX / 2, pid in -1i64..1000, seq in 0i32..1000) {
            let batch = build_test_batch(count, ts, (pid, 0, seq));
            let parsed = split_and_validate(&batch).unwrap();
            prop_assert_eq!(parsed.len(), 1);
            prop_assert_eq!(parsed[0].header.records_count, count);
            prop_assert_eq!(parsed[0].header.first_timestamp, ts);
            prop_assert_eq!(parsed[0].header.producer_id, pid);
        }
    }
}
