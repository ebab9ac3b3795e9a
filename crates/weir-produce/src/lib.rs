//! The produce path (DESIGN §1): tickets → [`batcher`] → [`uploader`] → [`committer`].
//!
//! * A connection turns each Produce request into a [`ProduceTicket`] and gets back a future
//!   for its outcome; it does not wait before reading the next request (the Little's-law stage).
//! * The batcher packs tickets from every connection into one open file and numbers sealed
//!   files 1, 2, 3… in seal order. It seals adaptively: at once at low rates when nothing is
//!   uploading, spaced out as the rate grows, and never later than `flush_interval` or past
//!   `target_file_bytes` (see [`batcher`]).
//! * Uploads run concurrently (bounded) to a quorum of ingest buckets.
//! * The committer commits files to the control plane strictly in seal order (ORD-2); a file
//!   whose upload failed for good fails with every later file sealed before the failure was seen.
//! * A ticket resolves only once its file is durable in a quorum and its commit is durable (DUR-1).
//!
//! This crate knows nothing of the wire protocol or of concrete storage backends.

mod batcher;
mod committer;
mod metrics;
mod pipeline;
mod reserver;
mod resolver;
mod uploader;

pub use metrics::{ProduceMetrics, ResolveOutcome};
pub use pipeline::{
    PartitionBatches, PartitionOutcome, ProduceError, ProducePipeline, ProduceSettings,
    ProduceTicket, TicketOutcome,
};
pub use reserver::Incarnations;
pub use resolver::{ResolvePass, Resolver, ResolverSettings};
pub use uploader::{IngestPool, IngestWrites};

#[cfg(test)]
mod tests;
