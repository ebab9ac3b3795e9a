//! The fetch path: index lookup in the control-plane state, ranged reads (cache first; files this
//! agent just uploaded are already cached), `baseOffset` / `partitionLeaderEpoch` rewrite of
//! batches served as slices of the buffers they were read into (`assemble`).
//!
//! It never returns data at or above the high watermark this agent serves (the stable one, or
//! past it over pending files this agent acknowledged: `weir_control::plane::Served`), nor
//! below the log start offset (FET-1). Long-polling lives with the caller, woken by
//! [`weir_control::ControlPlane::subscribe_served`].

mod assemble;
mod inflight;
mod readahead;
mod reader;

pub use reader::{FetchError, FetchReader, PartitionData, ReadPlan, LEADER_EPOCH};
