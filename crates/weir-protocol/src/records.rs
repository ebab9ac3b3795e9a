//! The records inside a v2 batch: decompression (through [`crate::codec`]) and a walk over each
//! record's varint-framed fields. Sans-I/O: everything works on byte slices.
//!
//! Two levels of checking, chosen by the caller:
//! - [`check_framing`]: the codec's container for compressed batches, the record length prefixes
//!   and the record count for uncompressed ones. Nothing is decompressed.
//! - [`decode`] + [`Records`]: decompress (bounded) and parse every record's fields: length,
//!   attributes, timestamp delta, offset delta (must be the record's index), key, value, headers.

use crate::batch::{BatchHeader, Compression, RECORD_BATCH_HEADER_LEN};
use crate::codec::{self, CodecError};

/// Attribute bit of a batch whose timestamps are LogAppendTime.
pub const TIMESTAMP_TYPE_LOG_APPEND_TIME: i16 = 0x08;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("record {index}: {reason}")]
    Malformed { index: i32, reason: &'static str },
    #[error("batch declares {declared} records but holds {found}")]
    CountMismatch { declared: i32, found: i32 },
}

/// One record, borrowed from the (decompressed) records section of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub index: i32,
    pub attributes: i8,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub header_count: i32,
}

impl Record<'_> {
    /// The record's timestamp as consumers see it: the batch's max timestamp for LogAppendTime
    /// batches, otherwise the batch's first timestamp plus the record's delta.
    pub fn timestamp(&self, header: &BatchHeader) -> i64 {
        if header.attributes & TIMESTAMP_TYPE_LOG_APPEND_TIME != 0 {
            header.max_timestamp
        } else {
            header.first_timestamp.wrapping_add(self.timestamp_delta)
        }
    }
}

/// The records section of a batch: the bytes after the 61-byte header.
pub fn payload(batch: &[u8]) -> &[u8] {
    batch.get(RECORD_BATCH_HEADER_LEN..).unwrap_or_default()
}

/// The cheap check: codec framing of a compressed batch; record lengths and count of an
/// uncompressed one. `limit` bounds any declared decompressed size.
pub fn check_framing(header: &BatchHeader, batch: &[u8], limit: usize) -> Result<(), RecordError> {
    let codec = header.compression().map_err(|_| RecordError::Malformed {
        index: 0,
        reason: "unknown compression codec",
    })?;
    let payload = payload(batch);
    if codec != Compression::None {
        return Ok(codec::check_framing(codec, payload, limit)?);
    }
    let mut rest = payload;
    let mut found = 0i32;
    while !rest.is_empty() {
        let (length, used) = read_varint(rest).ok_or(RecordError::Malformed {
            index: found,
            reason: "bad length varint",
        })?;
        let length = usize::try_from(length).map_err(|_| RecordError::Malformed {
            index: found,
            reason: "negative record length",
        })?;
        rest = rest.get(used + length..).ok_or(RecordError::Malformed {
            index: found,
            reason: "record overruns the batch",
        })?;
        found = found.saturating_add(1);
    }
    if found != header.records_count {
        return Err(RecordError::CountMismatch {
            declared: header.records_count,
            found,
        });
    }
    Ok(())
}

/// The records section, decompressed if the batch is compressed (at most `limit` bytes).
pub fn decode(header: &BatchHeader, batch: &[u8], limit: usize) -> Result<Vec<u8>, RecordError> {
    let codec = header.compression().map_err(|_| RecordError::Malformed {
        index: 0,
        reason: "unknown compression codec",
    })?;
    Ok(codec::decompress(codec, payload(batch), limit)?)
}

/// Parses every record of `records` (a decoded records section) and checks the count against
/// the header. Calls `each` for every record in order.
pub fn walk<'a>(
    header: &BatchHeader,
    records: &'a [u8],
    mut each: impl FnMut(&Record<'a>),
) -> Result<(), RecordError> {
    let mut iter = Records::new(records);
    let mut found = 0i32;
    for record in &mut iter {
        let record = record?;
        each(&record);
        found += 1;
    }
    if found != header.records_count {
        return Err(RecordError::CountMismatch {
            declared: header.records_count,
            found,
        });
    }
    Ok(())
}

/// Iterates the records of a decoded records section; stops at the first malformed record.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    rest: &'a [u8],
    index: i32,
    failed: bool,
}

impl<'a> Records<'a> {
    pub fn new(records: &'a [u8]) -> Self {
        Self {
            rest: records,
            index: 0,
            failed: false,
        }
    }

    fn parse(&mut self) -> Result<Record<'a>, &'static str> {
        let (length, used) = read_varint(self.rest).ok_or("bad length varint")?;
        let length = usize::try_from(length).map_err(|_| "negative record length")?;
        let body = self
            .rest
            .get(used..used + length)
            .ok_or("record overruns the batch")?;
        self.rest = &self.rest[used + length..];
        let mut cursor = Cursor { rest: body };
        let attributes = cursor.byte()? as i8;
        let timestamp_delta = cursor.varlong()?;
        let offset_delta = i32::try_from(cursor.varlong()?).map_err(|_| "offset delta overflow")?;
        if offset_delta != self.index {
            return Err("offset delta is not the record's position");
        }
        let key = cursor.bytes()?;
        let value = cursor.bytes()?;
        let header_count = i32::try_from(cursor.varlong()?).map_err(|_| "bad header count")?;
        if header_count < 0 {
            return Err("negative header count");
        }
        for _ in 0..header_count {
            cursor.bytes()?.ok_or("null header key")?;
            cursor.bytes()?;
        }
        if !cursor.rest.is_empty() {
            return Err("record length does not match its fields");
        }
        Ok(Record {
            index: self.index,
            attributes,
            timestamp_delta,
            offset_delta,
            key,
            value,
            header_count,
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let index = self.index;
        match self.parse() {
            Ok(record) => {
                self.index += 1;
                Some(Ok(record))
            }
            Err(reason) => {
                self.failed = true;
                Some(Err(RecordError::Malformed { index, reason }))
            }
        }
    }
}

struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Result<u8, &'static str> {
        let (&first, rest) = self.rest.split_first().ok_or("record ends early")?;
        self.rest = rest;
        Ok(first)
    }

    fn varlong(&mut self) -> Result<i64, &'static str> {
        let (value, used) = read_varint(self.rest).ok_or("bad varint")?;
        self.rest = &self.rest[used..];
        Ok(value)
    }

    /// A varint length then that many bytes; -1 is null.
    fn bytes(&mut self) -> Result<Option<&'a [u8]>, &'static str> {
        let length = self.varlong()?;
        if length == -1 {
            return Ok(None);
        }
        let length = usize::try_from(length).map_err(|_| "negative field length")?;
        let field = self.rest.get(..length).ok_or("field overruns the record")?;
        self.rest = &self.rest[length..];
        Ok(Some(field))
    }
}

/// Reads a zigzag varint of at most 10 bytes; returns the value and the bytes used.
fn read_varint(buf: &[u8]) -> Option<(i64, usize)> {
    let mut raw = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(10) {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

/// Appends a zigzag varint (the encoding of record fields).
pub fn write_varint(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// One record for [`build_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSpec {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
}

/// Builds a valid v2 batch of `records` compressed with `codec` (snappy: raw). For tools, tests
/// and benchmarks; the agent never builds batches.
pub fn build_batch(codec: Compression, records: &[RecordSpec]) -> bytes::Bytes {
    build_producer_batch(codec, records, (-1, -1, -1))
}

/// [`build_batch`] with a producer id, epoch and base sequence in the header.
pub fn build_producer_batch(
    codec: Compression,
    records: &[RecordSpec],
    producer: (i64, i16, i32),
) -> bytes::Bytes {
    use bytes::BufMut;
    let first_timestamp = records.first().map_or(0, |r| r.timestamp);
    let max_timestamp = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    let mut section = Vec::new();
    for (delta, record) in records.iter().enumerate() {
        let mut body = vec![0u8];
        write_varint(&mut body, record.timestamp - first_timestamp);
        write_varint(&mut body, delta as i64);
        for field in [&record.key, &record.value] {
            match field {
                Some(bytes) => {
                    write_varint(&mut body, bytes.len() as i64);
                    body.extend_from_slice(bytes);
                }
                None => write_varint(&mut body, -1),
            }
        }
        write_varint(&mut body, 0);
        write_varint(&mut section, body.len() as i64);
        section.extend_from_slice(&body);
    }
    let payload = codec::compress(codec, &section);
    let count = records.len() as i32;
    let mut out = bytes::BytesMut::new();
    out.put_i64(0);
    out.put_i32((RECORD_BATCH_HEADER_LEN - 12 + payload.len()) as i32);
    out.put_i32(-1);
    out.put_i8(2);
    out.put_u32(0);
    out.put_i16(codec as i16);
    out.put_i32(count - 1);
    out.put_i64(first_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(producer.0);
    out.put_i16(producer.1);
    out.put_i32(producer.2);
    out.put_i32(count);
    out.extend_from_slice(&payload);
    crate::batch::reseal(&mut out);
    out.freeze()
}

#[cfg(test)]
mod tests;
