//! Object storage for Weir (DESIGN §4).
//!
//! - [`keys`] — the object key layout, the only place keys are built.
//! - [`url`] — open a store by URL (`memory://`, `file://` with fsync on).
//! - [`model`] — latency and fault model wrapper with named cloud profiles.
//! - [`cache`] — byte-bounded LRU read cache, written through by fresh uploads.
//! - [`quorum`] — write one object to a quorum of buckets (background copies bounded per
//!   bucket); read from any holder.
//! - [`timeout`] — a deadline on every request, so a hung call fails retriably.
//! - [`error`] — [`StorageError`].

pub mod cache;
pub mod error;
pub mod keys;
pub mod model;
pub mod quorum;
pub mod timeout;
pub mod url;

pub use cache::{CacheStats, ReadCache};
pub use error::StorageError;
pub use model::{maybe_wrap, LatencyProfile, ModelStore, OpLatency, PutPhases, PROFILE_NAMES};
pub use quorum::{LagStats, QuorumWriter, DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET};
pub use timeout::{TimeoutStore, DEFAULT_REQUEST_TIMEOUT};
pub use url::{local_store, open_store};
