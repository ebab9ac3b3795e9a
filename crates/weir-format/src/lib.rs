//! On-object byte formats of Weir, sans I/O.
//!
//! This crate owns these formats and nothing else:
//!
//! - [`mod@file`]: the `.weir` v1 data file (header, record batches grouped by partition, footer
//!   with one entry per batch, trailer). [`FileBuilder`] lays a file out without copying batch
//!   bytes; [`parse_trailer`], [`parse_footer`] and [`decode_file`] read it back.
//! - [`mod@envelope`]: the CRC-protected frame around a metadata-log object (log entry, snapshot,
//!   epoch). The payload inside is opaque here; another crate serializes it.
//! - [`mod@index`]: the columnar codec of a partition's batch index in a binary snapshot.
//!
//! It does not do I/O, know object keys, or parse Kafka record batches: callers hand it bytes
//! that are already validated and get bytes (or parsed metadata) back. Every decoder is total:
//! on arbitrary input it returns a [`FormatError`], never panics, and never allocates more than
//! the input could describe.

pub mod envelope;
pub mod error;
pub mod file;
pub mod index;

mod cursor;

pub use envelope::{
    decode_envelope, encode_envelope, Envelope, EnvelopeKind, ENVELOPE_MAGIC, ENVELOPE_OVERHEAD,
    ENVELOPE_VERSION,
};
pub use error::FormatError;
pub use file::{
    decode_file, parse_footer, parse_trailer, BatchLocation, BatchMeta, EncodedFile, FileBuilder,
    Footer, PartitionSection, TrailerInfo, FILE_MAGIC, FORMAT_VERSION, HEADER_LEN, TRAILER_LEN,
};
pub use index::{
    index_block_len, IndexDecoder, IndexEncoder, IndexRow, INDEX_BLOCK_HEADER, INDEX_BLOCK_ROWS,
    MAX_INDEX_BLOCK_BYTES,
};
