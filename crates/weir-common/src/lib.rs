//! Shared vocabulary of Weir: identifiers, the injectable clock and retry backoff.
//!
//! This crate does no I/O ([`metrics`] only builds unregistered Prometheus metrics). Everything
//! that needs "now" or randomness takes a [`Clock`] or a seeded RNG so tests and the simulator
//! can drive them.

mod backoff;
mod clock;
pub mod failpoint;
mod ids;
pub mod metrics;
pub mod periodic;
pub mod placement;
mod tier;

pub use backoff::Backoff;
pub use clock::{Clock, ManualClock, SystemClock, TOKIO_TIMER_LAG};
pub use ids::{FileId, TopicId};
pub use metrics::LATENCY_BUCKETS;
pub use tier::Tier;
