//! Shared vocabulary of Weir: identifiers, the injectable clock and retry backoff.
//!
//! This crate does no I/O. Everything that needs "now" or randomness takes a
//! [`Clock`] or a seeded RNG so tests and the simulator can drive them.

mod backoff;
mod clock;
pub mod failpoint;
mod ids;
pub mod periodic;
pub mod placement;
mod tier;

pub use backoff::Backoff;
pub use clock::{Clock, ManualClock, SystemClock};
pub use ids::{FileId, TopicId};
pub use tier::Tier;

/// Bucket bounds, in seconds, of every latency histogram Weir exports (`weir_*_seconds`): from
/// 0.5 ms (an append + flush on GCS Rapid) to 30 s (a request past every storage deadline), so
/// dashboards can compare stages on one scale.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0,
];
