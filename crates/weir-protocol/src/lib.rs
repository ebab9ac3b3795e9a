//! Kafka wire protocol pieces that Weir owns itself: the frame codec, the supported-version
//! table, the record-batch header view with CRC32C, the records inside a batch (codecs with
//! bounded decompression, the record walk) and error codes.
//!
//! Request and response bodies are encoded and decoded by the `kafka-protocol` crate; this crate
//! adds the parts where Weir needs control (limits before allocation, zero-copy batch views).
//! It does no socket or storage I/O beyond reading a frame from any `AsyncRead`.

pub mod batch;
pub mod codec;
pub mod error_code;
pub mod frame;
pub mod record_set;
pub mod records;
pub mod response;
pub mod versions;

pub use batch::{
    split_and_validate, BatchError, BatchHeader, Compression, ValidatedBatch,
    RECORD_BATCH_HEADER_LEN,
};
pub use frame::{FrameError, RequestFrame};
pub use kafka_protocol;
