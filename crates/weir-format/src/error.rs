//! Errors raised while decoding `.weir` files and metadata envelopes.
//!
//! Every variant means the bytes are not what we wrote: corruption, truncation, or a format
//! version this build does not understand. None of them is retryable against the same bytes.

/// Why a byte buffer failed to decode.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The magic bytes of a section do not match.
    #[error("bad magic in {section}: found {found:?}, expected {expected:?}")]
    BadMagic {
        section: &'static str,
        found: [u8; 4],
        expected: [u8; 4],
    },
    /// A format version this build does not know.
    #[error("unsupported {section} version {found}, expected {expected}")]
    UnsupportedVersion {
        section: &'static str,
        found: u16,
        expected: u16,
    },
    /// A field that must be zero in this version is not.
    #[error("reserved field in {section} is {found}, expected 0")]
    NonZeroReserved { section: &'static str, found: u16 },
    /// The input ended before a section was complete.
    #[error("truncated {section}: needed {needed} bytes, {available} available")]
    Truncated {
        section: &'static str,
        needed: u64,
        available: u64,
    },
    /// Bytes remain after a section that must end the input.
    #[error("{count} trailing bytes after {section}")]
    TrailingBytes { section: &'static str, count: u64 },
    /// The stored checksum does not match the bytes.
    #[error("crc32c mismatch in {section}: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        section: &'static str,
        stored: u32,
        computed: u32,
    },
    /// The trailer claims a footer longer than the space between header and trailer.
    #[error("footer length {footer_len} does not fit in a file of {file_len} bytes")]
    FooterLengthOutOfRange { footer_len: u32, file_len: u64 },
    /// A footer entry points outside the batch region of the file.
    #[error(
        "batch {batch_index} of partition {partition} at offset {offset} len {len} \
         lies outside the batch region [{region_start}, {region_end})"
    )]
    BatchOutOfRange {
        partition: i32,
        batch_index: usize,
        offset: u64,
        len: u32,
        region_start: u64,
        region_end: u64,
    },
    /// An envelope kind byte this build does not know.
    #[error("unknown envelope kind {0}")]
    UnknownEnvelopeKind(u8),
    /// A snapshot index block that does not decode (or a block an encoder refuses to write).
    #[error("malformed snapshot index: {0}")]
    MalformedIndex(&'static str),
    /// An index row that does not start where the previous one ended: snapshots imply base
    /// offsets from density, so such an index cannot be encoded and is never decoded.
    #[error("snapshot index is not dense: a row starts at {found}, expected {expected}")]
    IndexNotDense { expected: i64, found: i64 },
    /// Encoding only: a metadata payload too long for the envelope's u32 length field.
    #[error("envelope payload of {len} bytes exceeds the 4 GiB limit")]
    EnvelopeTooLarge { len: u64 },
}
