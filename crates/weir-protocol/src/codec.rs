//! The compression codecs of Kafka record batches: a cheap framing check of each codec's stream
//! and a bounded decompression.
//!
//! The framing check reads only the codec's container (gzip header, xerial snappy chunk lengths,
//! LZ4 frame and block headers, zstd frame and block headers) and never decompresses, so garbage
//! that merely claims a codec is rejected at a few nanoseconds per block. Decompression is
//! streamed into a buffer that may not grow past a caller-given limit: a decompression bomb is an
//! error, never a large allocation. Both are sans-I/O.
//!
//! Codecs as Kafka clients send them: gzip (possibly several members), snappy either raw (as
//! librdkafka sends it) or in the xerial framing of snappy-java (Java and kafka-python), LZ4 frame
//! format (KIP-57: correct header checksum from magic 1 on) and zstd frames.

use std::io::{Read, Write};

use crate::batch::Compression;

/// The xerial (snappy-java) stream header: magic, then version and compatible version.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
const LZ4_MAGIC: u32 = 0x184D_2204;
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
const ZSTD_MAX_BLOCK: usize = 128 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{codec:?} payload is not a {codec:?} stream: {reason}")]
    BadFraming {
        codec: Compression,
        reason: &'static str,
    },
    #[error("{codec:?} payload does not decompress: {reason}")]
    Corrupt { codec: Compression, reason: String },
    #[error("{codec:?} payload decompresses to more than {limit} bytes")]
    TooLarge { codec: Compression, limit: usize },
}

/// Checks that `payload` is a well-formed stream of `codec`'s container format, without
/// decompressing it. Declared uncompressed sizes above `limit` are rejected here already.
pub fn check_framing(codec: Compression, payload: &[u8], limit: usize) -> Result<(), CodecError> {
    let bad = |reason| CodecError::BadFraming { codec, reason };
    match codec {
        Compression::None => Ok(()),
        Compression::Gzip => check_gzip(payload).map_err(bad),
        Compression::Snappy => check_snappy(payload, limit).map_err(|e| match e {
            FramingIssue::Bad(reason) => bad(reason),
            FramingIssue::TooLarge => CodecError::TooLarge { codec, limit },
        }),
        Compression::Lz4 => check_lz4(payload).map_err(bad),
        Compression::Zstd => check_zstd(payload, limit).map_err(|e| match e {
            FramingIssue::Bad(reason) => bad(reason),
            FramingIssue::TooLarge => CodecError::TooLarge { codec, limit },
        }),
    }
}

/// Decompresses `payload` into at most `limit` bytes.
pub fn decompress(codec: Compression, payload: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    check_framing(codec, payload, limit)?;
    let corrupt = |reason: String| CodecError::Corrupt { codec, reason };
    match codec {
        Compression::None => {
            if payload.len() > limit {
                return Err(CodecError::TooLarge { codec, limit });
            }
            Ok(payload.to_vec())
        }
        Compression::Gzip => read_bounded(
            codec,
            flate2::read::MultiGzDecoder::new(payload),
            limit,
            payload.len(),
        ),
        Compression::Snappy => decompress_snappy(payload),
        Compression::Lz4 => read_bounded(
            codec,
            lz4_flex::frame::FrameDecoder::new(payload),
            limit,
            payload.len(),
        ),
        Compression::Zstd => {
            let mut out = Vec::new();
            let mut rest = payload;
            while !rest.is_empty() {
                if let Some(skip) = zstd_skippable_len(rest) {
                    rest = &rest[skip..];
                    continue;
                }
                let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut rest)
                    .map_err(|e| corrupt(e.to_string()))?;
                let budget = limit - out.len();
                let part = read_bounded(codec, &mut decoder, budget, 0)?;
                out.extend_from_slice(&part);
            }
            Ok(out)
        }
    }
}

/// Reads `reader` to its end into a buffer that may not exceed `limit` bytes.
fn read_bounded(
    codec: Compression,
    reader: impl Read,
    limit: usize,
    size_hint: usize,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(size_hint.saturating_mul(2).min(limit));
    let read = reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| CodecError::Corrupt {
            codec,
            reason: e.to_string(),
        })?;
    if read > limit {
        return Err(CodecError::TooLarge { codec, limit });
    }
    Ok(out)
}

enum FramingIssue {
    Bad(&'static str),
    TooLarge,
}

impl From<&'static str> for FramingIssue {
    fn from(reason: &'static str) -> Self {
        Self::Bad(reason)
    }
}

/// RFC 1952 header of the first member, and room for the 8-byte trailer.
fn check_gzip(payload: &[u8]) -> Result<(), &'static str> {
    const FHCRC: u8 = 0x02;
    const FEXTRA: u8 = 0x04;
    const FNAME: u8 = 0x08;
    const FCOMMENT: u8 = 0x10;
    if payload.len() < 18 || payload[0] != 0x1f || payload[1] != 0x8b {
        return Err("missing gzip magic");
    }
    if payload[2] != 8 {
        return Err("compression method is not deflate");
    }
    let flags = payload[3];
    if flags & 0xe0 != 0 {
        return Err("reserved gzip flags set");
    }
    let mut at = 10usize;
    if flags & FEXTRA != 0 {
        let len = payload
            .get(at..at + 2)
            .ok_or("truncated gzip extra field")?;
        at += 2 + usize::from(u16::from_le_bytes([len[0], len[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let end = payload
                .get(at..)
                .and_then(|rest| rest.iter().position(|&b| b == 0))
                .ok_or("unterminated gzip name or comment")?;
            at += end + 1;
        }
    }
    if flags & FHCRC != 0 {
        at += 2;
    }
    // Deflate data (at least one byte) and the CRC32 + ISIZE trailer must follow.
    if at + 1 + 8 > payload.len() {
        return Err("truncated gzip member");
    }
    // The first deflate block's type: 0b11 is reserved.
    if (payload[at] >> 1) & 0x03 == 0x03 {
        return Err("reserved deflate block type");
    }
    Ok(())
}

fn check_snappy(payload: &[u8], limit: usize) -> Result<(), FramingIssue> {
    if payload.starts_with(&XERIAL_MAGIC) {
        if payload.len() < XERIAL_HEADER_LEN {
            return Err("truncated xerial header".into());
        }
        let mut rest = &payload[XERIAL_HEADER_LEN..];
        let mut total = 0usize;
        while !rest.is_empty() {
            let len = rest.get(..4).ok_or("truncated xerial chunk length")?;
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let chunk = rest
                .get(4..4 + len)
                .ok_or("xerial chunk overruns payload")?;
            total = total.saturating_add(snappy_raw_len(chunk)?);
            if total > limit {
                return Err(FramingIssue::TooLarge);
            }
            rest = &rest[4 + len..];
        }
        Ok(())
    } else if snappy_raw_len(payload)? > limit {
        Err(FramingIssue::TooLarge)
    } else {
        Ok(())
    }
}

/// The uncompressed length of a raw snappy block, after walking its element tags (literals
/// and back-references) without producing any output: each element must lie inside the
/// block, each copy must refer to bytes already produced, and the elements must produce
/// exactly the length the preamble declares.
fn snappy_raw_len(block: &[u8]) -> Result<usize, &'static str> {
    if block.is_empty() {
        return Err("empty snappy block");
    }
    let declared = snap::raw::decompress_len(block).map_err(|_| "bad snappy preamble")?;
    let mut at = 1 + block.iter().take_while(|&&b| b & 0x80 != 0).count();
    let mut produced = 0usize;
    let little_endian = |bytes: &[u8]| {
        bytes
            .iter()
            .rev()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    while at < block.len() {
        let tag = block[at];
        at += 1;
        let (len, offset) = match tag & 0x03 {
            0 => {
                let short = usize::from(tag >> 2);
                let len = if short < 60 {
                    short + 1
                } else {
                    let width = short - 59;
                    let bytes = block
                        .get(at..at + width)
                        .ok_or("truncated snappy literal")?;
                    at += width;
                    little_endian(bytes) + 1
                };
                at = at.checked_add(len).ok_or("snappy literal overflow")?;
                if at > block.len() {
                    return Err("snappy literal overruns the block");
                }
                (len, None)
            }
            1 => {
                let low = *block.get(at).ok_or("truncated snappy copy")?;
                at += 1;
                let len = 4 + usize::from((tag >> 2) & 0x07);
                (len, Some(usize::from(tag >> 5) << 8 | usize::from(low)))
            }
            kind => {
                let width = if kind == 2 { 2 } else { 4 };
                let bytes = block.get(at..at + width).ok_or("truncated snappy copy")?;
                at += width;
                (1 + usize::from(tag >> 2), Some(little_endian(bytes)))
            }
        };
        if let Some(offset) = offset {
            if offset == 0 || offset > produced {
                return Err("snappy copy refers before the start");
            }
        }
        produced += len;
        if produced > declared {
            return Err("snappy block produces more than it declares");
        }
    }
    if produced != declared {
        return Err("snappy block produces less than it declares");
    }
    Ok(declared)
}

/// Framing was checked first: every chunk is well formed and the total is within the limit.
fn decompress_snappy(payload: &[u8]) -> Result<Vec<u8>, CodecError> {
    let codec = Compression::Snappy;
    let corrupt = |e: snap::Error| CodecError::Corrupt {
        codec,
        reason: e.to_string(),
    };
    let mut decoder = snap::raw::Decoder::new();
    if !payload.starts_with(&XERIAL_MAGIC) {
        return decoder.decompress_vec(payload).map_err(corrupt);
    }
    let mut out = Vec::new();
    let mut rest = &payload[XERIAL_HEADER_LEN..];
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let chunk = &rest[4..4 + len];
        let at = out.len();
        let size = snappy_raw_len(chunk).map_err(|reason| CodecError::Corrupt {
            codec,
            reason: reason.into(),
        })?;
        out.resize(at + size, 0);
        decoder.decompress(chunk, &mut out[at..]).map_err(corrupt)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// One LZ4 frame (the format of KIP-57): descriptor, blocks up to the end mark, checksum.
fn check_lz4(payload: &[u8]) -> Result<(), &'static str> {
    let magic = payload.get(..4).ok_or("truncated lz4 frame")?;
    if u32::from_le_bytes([magic[0], magic[1], magic[2], magic[3]]) != LZ4_MAGIC {
        return Err("missing lz4 frame magic");
    }
    let flags = *payload.get(4).ok_or("truncated lz4 frame descriptor")?;
    let block_descriptor = *payload.get(5).ok_or("truncated lz4 frame descriptor")?;
    if flags >> 6 != 0b01 {
        return Err("unsupported lz4 frame version");
    }
    if flags & 0x02 != 0 || block_descriptor & 0x8f != 0 {
        return Err("reserved lz4 descriptor bits set");
    }
    let max_block = match (block_descriptor >> 4) & 0x07 {
        4 => 64 * 1024,
        5 => 256 * 1024,
        6 => 1024 * 1024,
        7 => 4 * 1024 * 1024,
        _ => return Err("invalid lz4 block max size"),
    };
    let block_checksum = flags & 0x10 != 0;
    let content_size = flags & 0x08 != 0;
    let content_checksum = flags & 0x04 != 0;
    let dict_id = flags & 0x01 != 0;
    // Descriptor (flags, BD, optional size and dictionary id) and the header checksum byte.
    let mut at = 6 + if content_size { 8 } else { 0 } + if dict_id { 4 } else { 0 } + 1;
    loop {
        let size = payload
            .get(at..at + 4)
            .ok_or("lz4 frame ends before its end mark")?;
        at += 4;
        let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]);
        if size == 0 {
            break;
        }
        let len = (size & 0x7fff_ffff) as usize;
        if len > max_block {
            return Err("lz4 block larger than the frame's block size");
        }
        at += len + if block_checksum { 4 } else { 0 };
    }
    at += if content_checksum { 4 } else { 0 };
    if at != payload.len() {
        return Err("lz4 frame length does not match the payload");
    }
    Ok(())
}

/// The length of a zstd skippable frame at the start of `rest`, if it is one.
fn zstd_skippable_len(rest: &[u8]) -> Option<usize> {
    let head = rest.get(..8)?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if magic & 0xFFFF_FFF0 != 0x184D_2A50 {
        return None;
    }
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    (rest.len() >= 8 + len).then_some(8 + len)
}

/// zstd frames (RFC 8878): frame headers and block headers, without decoding any block.
fn check_zstd(payload: &[u8], limit: usize) -> Result<(), FramingIssue> {
    let mut rest = payload;
    let mut frames = 0usize;
    while !rest.is_empty() {
        if let Some(skip) = zstd_skippable_len(rest) {
            rest = &rest[skip..];
            continue;
        }
        rest = check_zstd_frame(rest, limit)?;
        frames += 1;
    }
    if frames == 0 {
        return Err("no zstd frame".into());
    }
    Ok(())
}

fn check_zstd_frame(frame: &[u8], limit: usize) -> Result<&[u8], FramingIssue> {
    let head = frame.get(..5).ok_or("truncated zstd frame header")?;
    if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) != ZSTD_MAGIC {
        return Err("missing zstd magic".into());
    }
    let descriptor = head[4];
    if descriptor & 0x08 != 0 {
        return Err("reserved zstd descriptor bit set".into());
    }
    let single_segment = descriptor & 0x20 != 0;
    let checksum = descriptor & 0x04 != 0;
    let dict_len = [0usize, 1, 2, 4][usize::from(descriptor & 0x03)];
    let content_size_len = match descriptor >> 6 {
        0 if single_segment => 1,
        0 => 0,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut at = 5usize;
    let mut window = None;
    if !single_segment {
        let byte = *frame.get(at).ok_or("truncated zstd window descriptor")?;
        let base = 1u64 << (10 + (byte >> 3));
        window = Some(base + (base / 8) * u64::from(byte & 0x07));
        at += 1;
    }
    at += dict_len;
    let size_field = frame
        .get(at..at + content_size_len)
        .ok_or("truncated zstd frame header")?;
    let mut content_size = 0u64;
    for (i, byte) in size_field.iter().enumerate() {
        content_size |= u64::from(*byte) << (8 * i);
    }
    if content_size_len == 2 {
        content_size += 256;
    }
    at += content_size_len;
    // The decoder allocates a window buffer of this size: bound it before any decoding.
    let window = window.unwrap_or(content_size);
    if window > limit as u64 || (content_size_len > 0 && content_size > limit as u64) {
        return Err(FramingIssue::TooLarge);
    }
    let max_block = (window as usize).clamp(1, ZSTD_MAX_BLOCK);
    loop {
        let block = frame
            .get(at..at + 3)
            .ok_or("zstd frame ends inside a block")?;
        at += 3;
        let header = u32::from(block[0]) | u32::from(block[1]) << 8 | u32::from(block[2]) << 16;
        let last = header & 1 != 0;
        let size = (header >> 3) as usize;
        let stored = match (header >> 1) & 0x03 {
            0 | 2 => size,
            1 => 1,
            _ => return Err("reserved zstd block type".into()),
        };
        if size > max_block {
            return Err("zstd block larger than allowed".into());
        }
        at += stored;
        if last {
            break;
        }
    }
    at += if checksum { 4 } else { 0 };
    frame
        .get(at..)
        .ok_or_else(|| "zstd frame overruns payload".into())
}

/// Compresses `data` with `codec` (snappy raw, as librdkafka sends it). For tools, tests and
/// benchmarks: Weir never compresses on the serving path.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    match codec {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder
                .write_all(data)
                .expect("writing to a Vec cannot fail");
            encoder.finish().expect("writing to a Vec cannot fail")
        }
        Compression::Snappy => snap::raw::Encoder::new()
            .compress_vec(data)
            .expect("writing to a Vec cannot fail"),
        Compression::Lz4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder
                .write_all(data)
                .expect("writing to a Vec cannot fail");
            encoder.finish().expect("writing to a Vec cannot fail")
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

/// snappy-java's stream format, as kafka-python and Java producers send it.
pub fn compress_xerial(data: &[u8]) -> Vec<u8> {
    let mut out = XERIAL_MAGIC.to_vec();
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&1i32.to_be_bytes());
    for chunk in data.chunks(32 * 1024) {
        let block = snap::raw::Encoder::new()
            .compress_vec(chunk)
            .expect("writing to a Vec cannot fail");
        out.extend_from_slice(&(block.len() as u32).to_be_bytes());
        out.extend_from_slice(&block);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 1 << 20;

    fn sample() -> Vec<u8> {
        (0..5000u32).flat_map(|i| (i % 251).to_le_bytes()).collect()
    }

    const CODECS: [Compression; 5] = Compression::ALL;

    #[test]
    fn test_codec_round_trip_every_codec() {
        let data = sample();
        for codec in CODECS {
            let compressed = compress(codec, &data);
            check_framing(codec, &compressed, LIMIT).unwrap();
            assert_eq!(
                decompress(codec, &compressed, LIMIT).unwrap(),
                data,
                "{codec:?}"
            );
        }
        let framed = compress_xerial(&data);
        check_framing(Compression::Snappy, &framed, LIMIT).unwrap();
        assert_eq!(
            decompress(Compression::Snappy, &framed, LIMIT).unwrap(),
            data
        );
    }

    #[test]
    fn test_codec_garbage_fails_framing() {
        let garbage = b"this is not compressed at all, just text".to_vec();
        for codec in &CODECS[1..] {
            assert!(
                matches!(
                    check_framing(*codec, &garbage, LIMIT),
                    Err(CodecError::BadFraming { .. }) | Err(CodecError::TooLarge { .. })
                ),
                "{codec:?}"
            );
            assert!(decompress(*codec, &garbage, LIMIT).is_err(), "{codec:?}");
        }
    }

    #[test]
    fn test_codec_truncated_stream_is_an_error() {
        let data = sample();
        for codec in &CODECS[1..] {
            let compressed = compress(*codec, &data);
            let cut = &compressed[..compressed.len() - 5];
            assert!(decompress(*codec, cut, LIMIT).is_err(), "{codec:?}");
        }
    }

    #[test]
    fn test_codec_bomb_is_bounded() {
        let zeros = vec![0u8; 4 * LIMIT];
        for codec in &CODECS[1..] {
            let compressed = compress(*codec, &zeros);
            assert!(compressed.len() < LIMIT / 4, "{codec:?} compresses zeros");
            assert!(
                matches!(
                    decompress(*codec, &compressed, LIMIT),
                    Err(CodecError::TooLarge { .. })
                ),
                "{codec:?}"
            );
        }
        assert!(matches!(
            decompress(Compression::Snappy, &compress_xerial(&zeros), LIMIT),
            Err(CodecError::TooLarge { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn test_codec_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256), codec in 0usize..5) {
            let _ = decompress(CODECS[codec], &data, 4096);
        }
    }
}
