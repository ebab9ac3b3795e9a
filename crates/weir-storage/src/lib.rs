//! Object storage for Weir (DESIGN §4).
//!
//! - [`append`] — appendable objects (GCS Rapid, S3 Express append): the trait, the in-memory
//!   double and the conformance suite.
//! - [`keys`] — the object key layout, the only place keys are built.
//! - [`url`] — open a store by URL (`memory://`, `file://` with fsync on).
//! - [`model`] — latency and fault model wrapper with named cloud profiles.
//! - [`cache`] — byte-bounded LRU read cache, written through by fresh uploads.
//! - [`quorum`] — write one object to a quorum of buckets (background copies bounded per
//!   bucket); read from any holder.
//! - [`layer`] — the storage layer every bucket is wrapped in: deadlines, one retry policy,
//!   request counters.
//! - [`stats`] — request counters and estimated cost per bucket (price tables).
//! - [`hold`] — keeps a bucket whose identity is unchecked out of use.
//! - [`pool`] — the WriterPool: ready appendable objects made in the background.
//! - [`probe`] — startup checks of what a bucket must support (create-only writes, CAS).
//! - [`identity`] — stable bucket ids, checked against the holders the log names.
//! - [`error`] — [`StorageError`].

pub mod append;
pub mod cache;
pub mod error;
pub mod hold;
pub mod identity;
pub mod keys;
pub mod layer;
pub mod model;
pub mod pool;
pub mod probe;
pub mod quorum;
pub mod stats;
pub mod url;

pub use cache::{entry_overhead, Backing, CacheStats, ReadCache};
pub use error::StorageError;
pub use layer::{LayerPolicy, LayerStore, DEFAULT_REQUEST_TIMEOUT};
pub use model::{
    maybe_wrap, AppendCosts, LatencyProfile, ModelClock, ModelStore, OpLatency, PutPhases,
    PROFILE_NAMES,
};
pub use quorum::{LagStats, QuorumWriter, DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET};
pub use stats::{BucketSnapshot, BucketStats, Outcome, PriceTable, RequestClass, StorageStats};
pub use url::{local_store, open_store, BucketUrl};
