//! Response frames in pieces, and a Fetch response encoder that leaves record sets where they
//! are.
//!
//! A Fetch response is mostly its partitions' record sets. Encoding it with `kafka-protocol`
//! copies every record set into the frame (one more copy of every fetched byte), so
//! [`encode_fetch_response`] writes the response's own fields into a few small buffers and
//! puts each record set's pieces ([`RecordSet`]: rewritten batch prefixes and slices of the
//! buffers the batches were read into) in the [`Frame`] as they are; the connection sends the
//! pieces with vectored writes. The bytes on the wire are exactly what `kafka-protocol` would
//! have written (the tests compare both for every version); a response using something the
//! piecewise encoder does not write (tagged fields, node endpoints) is encoded whole instead.

use std::any::Any;
use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch, PartitionData, SnapshotId,
};
use kafka_protocol::messages::FetchResponse;
use kafka_protocol::protocol::Encodable;

use crate::frame::{encode_response, FrameError};
use crate::record_set::RecordSet;

/// A response frame (length prefix included) as a sequence of byte strings. It implements
/// [`Buf`], so `write_all_buf` sends it with vectored writes.
#[derive(Default)]
pub struct Frame {
    chunks: VecDeque<Bytes>,
    remaining: usize,
    /// Dropped with the frame: what must live as long as its bytes are unsent (a fetch's
    /// memory grant).
    hold: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("chunks", &self.chunks.len())
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

impl From<Bytes> for Frame {
    fn from(bytes: Bytes) -> Self {
        let mut frame = Frame::default();
        frame.push(bytes);
        frame
    }
}

impl Frame {
    /// Appends `bytes` (nothing for an empty one).
    pub fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.remaining += bytes.len();
            self.chunks.push_back(bytes);
        }
    }

    /// Keeps `owner` alive until the frame is dropped.
    pub fn hold(&mut self, owner: impl Any + Send + Sync) {
        self.hold = Some(Box::new(owner));
    }

    /// Bytes not yet sent.
    pub fn len(&self) -> usize {
        self.remaining
    }

    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// Pieces not yet sent.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The unsent bytes in one buffer (a copy; for tests and inspection).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.remaining);
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
        out.freeze()
    }
}

impl Buf for Frame {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |chunk| chunk.as_ref())
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of a frame");
        self.remaining -= cnt;
        while cnt > 0 {
            let front = self
                .chunks
                .front_mut()
                .expect("remaining bytes are in chunks");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.chunks.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut filled = 0;
        for (slot, chunk) in dst.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
            filled += 1;
        }
        filled
    }
}

/// Writes a response's fields into buffers and record sets in place.
struct Pieces {
    chunks: Vec<Bytes>,
    fields: BytesMut,
}

impl Pieces {
    /// The fields written so far become a piece, then `records`' pieces follow as their own.
    fn records<'a>(&mut self, records: impl IntoIterator<Item = &'a Bytes>) {
        self.chunks.push(self.fields.split().freeze());
        self.chunks.extend(records.into_iter().cloned());
    }

    fn finish(mut self) -> Vec<Bytes> {
        self.chunks.push(self.fields.split().freeze());
        self.chunks
    }
}

/// `response` as a Fetch response frame whose record sets are pieces of their own, not copies.
///
/// `record_sets` go to the response's partitions in order (topic by topic), each in place of
/// that partition's `records`; partitions past the end of `record_sets` send their own.
pub fn encode_fetch_response(
    correlation_id: i32,
    header_version: i16,
    response: &FetchResponse,
    record_sets: &[RecordSet],
    version: i16,
) -> Result<Frame, FrameError> {
    if !piecewise(response, version) {
        let whole = with_record_sets(response, record_sets);
        return encode_response(correlation_id, header_version, &whole, version).map(Frame::from);
    }
    let mut record_sets = record_sets.iter();
    let flexible = version >= 12;
    let mut pieces = Pieces {
        chunks: Vec::new(),
        fields: BytesMut::with_capacity(256),
    };
    let out = &mut pieces.fields;
    out.put_i32(response.throttle_time_ms);
    if version >= 7 {
        out.put_i16(response.error_code);
        out.put_i32(response.session_id);
    }
    array_len(out, response.responses.len(), flexible)?;
    for topic in &response.responses {
        let out = &mut pieces.fields;
        if version <= 12 {
            let name = topic.topic.as_bytes();
            if flexible {
                put_varint(out, length(name.len() + 1)?);
            } else {
                out.put_i16(i16::try_from(name.len()).map_err(|_| too_long())?);
            }
            out.put_slice(name);
        }
        if version >= 13 {
            out.put_slice(topic.topic_id.as_bytes());
        }
        array_len(out, topic.partitions.len(), flexible)?;
        for partition in &topic.partitions {
            partition_fields(&mut pieces, partition, record_sets.next(), version)?;
        }
        if flexible {
            pieces.fields.put_u8(0); // no tagged fields
        }
    }
    if flexible {
        pieces.fields.put_u8(0); // no tagged fields (no node endpoints)
    }
    let body = pieces.finish();
    let header_len = if header_version >= 1 { 5 } else { 4 };
    let total = header_len + body.iter().map(Bytes::len).sum::<usize>();
    let mut header = BytesMut::with_capacity(4 + header_len);
    header.put_i32(
        i32::try_from(total).map_err(|_| FrameError::Encode("response too large".into()))?,
    );
    header.put_i32(correlation_id);
    if header_version >= 1 {
        header.put_u8(0); // no tagged fields
    }
    let mut frame = Frame::from(header.freeze());
    for chunk in body {
        frame.push(chunk);
    }
    Ok(frame)
}

/// `response` with `record_sets` in place of its partitions' records, each in one buffer.
fn with_record_sets(response: &FetchResponse, record_sets: &[RecordSet]) -> FetchResponse {
    let mut whole = response.clone();
    let partitions = whole.responses.iter_mut().flat_map(|t| &mut t.partitions);
    for (partition, set) in partitions.zip(record_sets) {
        partition.records = Some(set.to_bytes());
    }
    whole
}

/// Whether the piecewise encoder writes everything `response` holds: it writes no tagged
/// fields, so a response with any falls back to the whole encoding.
fn piecewise(response: &FetchResponse, version: i16) -> bool {
    (4..=16).contains(&version)
        && response.unknown_tagged_fields.is_empty()
        && response.node_endpoints.is_empty()
        && response
            .responses
            .iter()
            .all(|topic: &FetchableTopicResponse| {
                topic.unknown_tagged_fields.is_empty()
                    && topic.partitions.iter().all(|p| {
                        p.unknown_tagged_fields.is_empty()
                            && p.diverging_epoch == EpochEndOffset::default()
                            && p.current_leader == LeaderIdAndEpoch::default()
                            && p.snapshot_id == SnapshotId::default()
                    })
            })
}

fn too_long() -> FrameError {
    FrameError::Encode("response field too long".into())
}

/// A length as a Kafka `INT32`/`UNSIGNED_VARINT` can carry.
fn length(len: usize) -> Result<u32, FrameError> {
    u32::try_from(len)
        .ok()
        .filter(|len| *len <= i32::MAX as u32)
        .ok_or_else(too_long)
}

/// Kafka's `UNSIGNED_VARINT`: seven bits per byte, low first.
fn put_varint(out: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// An array's length: `INT32`, or `len + 1` as an `UNSIGNED_VARINT` in flexible versions.
fn array_len(out: &mut BytesMut, len: usize, flexible: bool) -> Result<(), FrameError> {
    if flexible {
        put_varint(out, length(len + 1)?);
    } else {
        out.put_i32(length(len)? as i32);
    }
    Ok(())
}

/// One partition: its fields by `kafka-protocol` (with an empty record set, which is then cut
/// off again), its record set's length, and the record set's pieces (`set` when given, else
/// the partition's own records as one piece).
fn partition_fields(
    pieces: &mut Pieces,
    partition: &PartitionData,
    set: Option<&RecordSet>,
    version: i16,
) -> Result<(), FrameError> {
    let flexible = version >= 12;
    let own = partition.records.as_ref().map(std::slice::from_ref);
    let records: Option<(usize, &[Bytes])> = match set {
        Some(set) => Some((set.len(), set.chunks())),
        None => own.map(|chunk| (chunk[0].len(), chunk)),
    };
    let without = partition.clone().with_records(Some(Bytes::new()));
    let start = pieces.fields.len();
    without
        .encode(&mut pieces.fields, version)
        .map_err(|e| FrameError::Encode(e.to_string()))?;
    // An empty record set and (flexible versions) an empty tagged-field section end it.
    let tail: &[u8] = if flexible { &[1, 0] } else { &[0, 0, 0, 0] };
    if !pieces.fields[start..].ends_with(tail) {
        return Err(FrameError::Encode(
            "fetch partition does not end with its record set".into(),
        ));
    }
    let cut = pieces.fields.len() - tail.len();
    pieces.fields.truncate(cut);
    let out = &mut pieces.fields;
    match records {
        None if flexible => out.put_u8(0),
        None => out.put_i32(-1),
        Some((len, chunks)) => {
            if flexible {
                put_varint(out, length(len + 1)?);
            } else {
                out.put_i32(length(len)? as i32);
            }
            pieces.records(chunks);
        }
    }
    if flexible {
        pieces.fields.put_u8(0); // no tagged fields
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::AbortedTransaction;
    use kafka_protocol::messages::{BrokerId, ProducerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    /// A response of `topics` topics with partitions of every shape `version` has: errors, no
    /// records, empty and non-empty record sets, aborted transactions, a preferred replica.
    fn response(rng: &mut fastrand::Rng, topics: usize, version: i16) -> FetchResponse {
        let responses = (0..topics)
            .map(|t| {
                let partitions = (0..rng.usize(0..4))
                    .map(|p| {
                        let records = match rng.usize(0..4) {
                            0 => None,
                            1 => Some(Bytes::new()),
                            _ => {
                                let len = rng.usize(1..3_000);
                                Some(Bytes::from(
                                    (0..len).map(|_| rng.u8(..)).collect::<Vec<_>>(),
                                ))
                            }
                        };
                        let aborted = rng.bool().then(|| {
                            (0..rng.usize(0..3))
                                .map(|i| {
                                    AbortedTransaction::default()
                                        .with_producer_id(ProducerId(i as i64))
                                        .with_first_offset(rng.i64(0..1_000))
                                })
                                .collect()
                        });
                        PartitionData::default()
                            .with_partition_index(p as i32)
                            .with_error_code(if rng.bool() { 0 } else { 1 })
                            .with_high_watermark(rng.i64(-1..1 << 40))
                            .with_last_stable_offset(rng.i64(-1..1 << 40))
                            .with_log_start_offset(if version >= 5 {
                                rng.i64(-1..1 << 20)
                            } else {
                                -1
                            })
                            .with_aborted_transactions(aborted)
                            .with_preferred_read_replica(BrokerId(if version >= 11 {
                                rng.i32(-1..3)
                            } else {
                                -1
                            }))
                            .with_records(records)
                    })
                    .collect();
                let topic = FetchableTopicResponse::default().with_partitions(partitions);
                if version >= 13 {
                    topic.with_topic_id(uuid::Uuid::from_u128(rng.u128(..)))
                } else {
                    topic.with_topic(TopicName(StrBytes::from_string(format!("topic-{t}"))))
                }
            })
            .collect();
        FetchResponse::default()
            .with_throttle_time_ms(rng.i32(0..100))
            .with_error_code(0)
            .with_session_id(0)
            .with_responses(responses)
    }

    /// The pieces put together are the bytes `kafka-protocol` writes, for every version and
    /// header version, and each non-empty record set is a piece of its own (not copied).
    #[test]
    fn test_piecewise_fetch_response_matches_the_whole_encoding() {
        let mut rng = fastrand::Rng::with_seed(16);
        for version in 4..=16 {
            let header_version = if version >= 12 { 1 } else { 0 };
            for topics in [0, 1, 3] {
                let response = response(&mut rng, topics, version);
                let whole = encode_response(7, header_version, &response, version).unwrap();
                let frame =
                    encode_fetch_response(7, header_version, &response, &[], version).unwrap();
                assert_eq!(frame.len(), whole.len(), "v{version}");
                assert_eq!(frame.to_bytes(), whole, "v{version}, {topics} topics");
                let record_sets: Vec<&Bytes> = response
                    .responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .filter_map(|p| p.records.as_ref())
                    .filter(|r| !r.is_empty())
                    .collect();
                for records in record_sets {
                    assert!(
                        frame.chunks.iter().any(|c| c.as_ptr() == records.as_ptr()),
                        "v{version}: a record set was copied"
                    );
                }
            }
        }
    }

    /// `response` with the pieces of `sets[i]` concatenated as the records of its `i`-th
    /// partition (topic by topic), built apart from the encoder's own fallback.
    fn expected_with(response: &FetchResponse, sets: &[RecordSet]) -> FetchResponse {
        let mut whole = response.clone();
        let mut index = 0;
        for topic in &mut whole.responses {
            for partition in &mut topic.partitions {
                if let Some(set) = sets.get(index) {
                    let bytes: Vec<u8> = set.chunks().iter().flat_map(|c| c.to_vec()).collect();
                    partition.records = Some(Bytes::from(bytes));
                }
                index += 1;
            }
        }
        whole
    }

    /// Record sets in pieces replace the partitions' records: the frame is the whole encoding
    /// of the response with each set in one buffer, every piece goes into the frame uncopied,
    /// and partitions past the given sets keep their own records.
    #[test]
    fn test_record_sets_in_pieces_replace_the_partitions_records() {
        let mut rng = fastrand::Rng::with_seed(5);
        for version in [4, 11, 12, 16] {
            let header_version = if version >= 12 { 1 } else { 0 };
            let response = response(&mut rng, 3, version);
            let partitions: usize = response.responses.iter().map(|t| t.partitions.len()).sum();
            let sets: Vec<RecordSet> = (0..partitions.max(1) - 1)
                .map(|_| {
                    let chunks = (0..rng.usize(0..4))
                        .map(|_| {
                            Bytes::from(
                                (0..rng.usize(0..300))
                                    .map(|_| rng.u8(..))
                                    .collect::<Vec<_>>(),
                            )
                        })
                        .collect();
                    RecordSet::from_chunks(chunks, 0, 0)
                })
                .collect();
            let whole = expected_with(&response, &sets);
            let expected = encode_response(3, header_version, &whole, version).unwrap();
            let frame =
                encode_fetch_response(3, header_version, &response, &sets, version).unwrap();
            assert_eq!(frame.to_bytes(), expected, "v{version}");
            for chunk in sets.iter().flat_map(RecordSet::chunks) {
                assert!(
                    frame.chunks.iter().any(|c| c.as_ptr() == chunk.as_ptr()),
                    "v{version}: a piece was copied"
                );
            }
            // The fallback encodes the same sets, each in one buffer.
            let mut tagged = response.clone();
            tagged.responses[0].partitions.push(
                PartitionData::default()
                    .with_current_leader(LeaderIdAndEpoch::default().with_leader_id(BrokerId(2)))
                    .with_records(Some(Bytes::from_static(b"abc"))),
            );
            if version >= 12 {
                let whole = expected_with(&tagged, &sets);
                let expected = encode_response(3, 1, &whole, version).unwrap();
                let frame = encode_fetch_response(3, 1, &tagged, &sets, version).unwrap();
                assert_eq!(frame.to_bytes(), expected, "v{version} whole");
            }
        }
    }

    /// A response with a field the piecewise encoder does not write is encoded whole.
    #[test]
    fn test_tagged_fields_fall_back_to_the_whole_encoding() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut response = response(&mut rng, 1, 12);
        response.responses[0].partitions.push(
            PartitionData::default()
                .with_current_leader(LeaderIdAndEpoch::default().with_leader_id(BrokerId(2)))
                .with_records(Some(Bytes::from_static(b"abc"))),
        );
        for version in [12, 16] {
            let whole = encode_response(1, 1, &response, version).unwrap();
            let frame = encode_fetch_response(1, 1, &response, &[], version).unwrap();
            assert_eq!(frame.to_bytes(), whole, "v{version}");
        }
    }

    /// `advance` and vectored chunks walk the pieces in order, across piece boundaries.
    #[test]
    fn test_frame_as_a_buf() {
        let mut frame = Frame::default();
        for piece in [&b"abc"[..], b"", b"defg", b"h"] {
            frame.push(Bytes::copy_from_slice(piece));
        }
        assert_eq!((frame.len(), frame.chunk_count()), (8, 3));
        let mut slices = [IoSlice::new(&[]); 8];
        assert_eq!(frame.chunks_vectored(&mut slices), 3);
        frame.advance(4);
        assert_eq!(frame.chunk(), b"efg");
        frame.advance(3);
        assert_eq!(frame.chunk(), b"h");
        assert_eq!(frame.copy_to_bytes(1), Bytes::from_static(b"h"));
        assert!(frame.is_empty());
    }
}
