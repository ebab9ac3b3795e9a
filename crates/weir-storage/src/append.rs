//! Appendable objects: the zonal buckets' fast write path (DESIGN §4, RFC 0004).
//!
//! On GCS Rapid, creating or finalizing an object is a metadata operation that costs tens of
//! milliseconds, while appending to an object that is already open and flushing it costs one to
//! three. S3 Express One Zone offers the same shape through `PutObject` with a write offset. This
//! module is Weir's one view of both:
//!
//! - [`AppendableStore::create`] makes a new, unfinalized object and returns a writer whose
//!   object already exists (the metadata round trip is paid), so the first real append does not
//!   pay it. The [`crate::pool::WriterPool`] calls it in the background.
//! - [`AppendWriter::append`] adds bytes at the writer's offset; [`AppendWriter::flush`] makes
//!   everything appended durable and readable and returns the persisted size.
//! - [`AppendableStore::takeover`] gives a new writer at the persisted size; the previous
//!   writer's appends then fail with [`StorageError::Fenced`] — at once on backends that fence
//!   by generation ([`FenceKind::Generation`], GCS), or from the new writer's first append on
//!   backends that fence by write offset only ([`FenceKind::WriteOffset`], S3 Express).
//! - Readers read flushed bytes of open objects with ordinary GETs (the bucket's
//!   [`object_store::ObjectStore`]) or with [`AppendableStore::read`].
//!
//! A flush that fails leaves the writer *broken*: the bytes may or may not have landed, and only
//! the backend knows. Every later call on it fails with [`StorageError::Fenced`]; a caller that
//! must continue takes the object over and reads the persisted size from the new writer.
//!
//! Implementations: [`memory::MemoryAppendable`] (the in-memory double with both fence kinds,
//! used by `memory://` buckets under the zonal profiles, by the simulator and by tests), the
//! latency model's wrapper ([`crate::model::ModelStore::appendable`]), the storage layer's
//! request counting ([`crate::layer::LayerAppendable`]), and the GCS Rapid and S3 Express
//! clients in their own crates. [`conformance`] is the one suite they all pass.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;

use crate::StorageError;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod ingest;
pub mod memory;

/// How a backend keeps a replaced writer from appending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceKind {
    /// A takeover bumps the object's generation (or write handle); the old writer's next append
    /// or flush fails at once. GCS Rapid.
    Generation,
    /// Each append names the offset it expects the object to end at; the old writer fails once
    /// the new one has appended anything. S3 Express One Zone.
    WriteOffset,
}

/// Per-object limits of a backend; writers refuse appends past them with
/// [`StorageError::ObjectFull`], and owners roll to a new object before they are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendLimits {
    /// Largest object size in bytes.
    pub max_bytes: u64,
    /// Most flushes (append requests) one object accepts.
    pub max_appends: u64,
    /// Longest an object may stay open for appends; owners roll before this.
    pub max_age: Duration,
}

impl AppendLimits {
    /// S3 Express One Zone: 10,000 appends per object, 5 TB objects. No age limit is published;
    /// Weir rolls after a day regardless.
    pub const S3_EXPRESS: AppendLimits = AppendLimits {
        max_bytes: 5_000_000_000_000,
        max_appends: 10_000,
        max_age: Duration::from_secs(24 * 3600),
    };

    /// GCS Rapid appendable objects: 5 TiB like any object; no documented append count (bounded
    /// here so a writer never runs away); unfinalized objects are meant to be short-lived, so
    /// Weir rolls after a day.
    pub const GCS_RAPID: AppendLimits = AppendLimits {
        max_bytes: 5 << 40,
        max_appends: 1_000_000,
        max_age: Duration::from_secs(24 * 3600),
    };
}

/// What a backend knows about one appendable object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendableMeta {
    /// Bytes persisted (acknowledged by a flush).
    pub size: u64,
    /// Whether the object was finalized (no more appends).
    pub finalized: bool,
    /// The backend's number for the object's current incarnation or writer (the double counts
    /// takeovers; GCS reports the object's generation, which a takeover keeps). For logs only:
    /// fencing is the backend's refusal of a replaced writer's appends, never a comparison of
    /// these numbers.
    pub generation: u64,
}

/// A bucket that supports appendable objects.
#[async_trait]
pub trait AppendableStore: Send + Sync + fmt::Debug + 'static {
    /// How this backend fences replaced writers.
    fn fence(&self) -> FenceKind;

    /// Per-object limits.
    fn limits(&self) -> AppendLimits;

    /// Whether creating objects ahead of need takes latency off the write path: true where a
    /// create costs far more than an append and flush (GCS Rapid: ~75 ms against ~2 ms), false
    /// where a create is one request like an append (S3 Express: both are a `PutObject`). Where
    /// it is false, a pooled ingest file or a pre-warmed log slot costs two requests for the
    /// latency of one, so `storage.ingest_writes = "auto"` writes whole objects and the log does
    /// not pre-warm slots.
    fn creates_ahead_pay_off(&self) -> bool;

    /// Creates an empty, unfinalized object at `path` and returns its writer at offset 0. Fails
    /// with `AlreadyExists` when any object is at `path`. When this returns, the object exists
    /// and is visible to GETs and LISTs.
    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError>;

    /// Takes over the unfinalized object at `path`: returns a writer positioned at its persisted
    /// size. Earlier writers are fenced (see [`FenceKind`]). Fails with `NotFound` when there is
    /// no object and with [`StorageError::Fenced`] when it is finalized.
    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError>;

    /// The object's persisted size, state and generation.
    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError>;

    /// Reads `range` of the persisted bytes (open or finalized). A range past the persisted size
    /// is an error.
    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError>;
}

/// The one writer of an appendable object.
#[async_trait]
pub trait AppendWriter: Send + Sync + fmt::Debug {
    /// The object's key.
    fn path(&self) -> &Path;

    /// The generation this writer holds (see [`AppendableMeta::generation`]; for logs only).
    fn generation(&self) -> u64;

    /// Bytes persisted by this writer's flushes (plus what was there when it took over).
    fn persisted(&self) -> u64;

    /// Where the next append goes: persisted plus appended-but-unflushed bytes.
    fn offset(&self) -> u64;

    /// Flushes this writer has made (the backend's append count).
    fn flushes(&self) -> u64;

    /// Appends `data` at `offset`, which must equal [`Self::offset`] (a caller that lost track
    /// of its position gets [`StorageError::Fenced`] instead of a hole or an overlap). The bytes
    /// are neither durable nor readable until [`Self::flush`] returns.
    async fn append(&mut self, offset: u64, data: Bytes) -> Result<(), StorageError>;

    /// Makes every appended byte durable and readable; returns the persisted size. A failure
    /// breaks the writer (see the module docs). The metadata log (RFC 0004) assumes a flush of
    /// at most 1 MiB lands whole or not at all.
    async fn flush(&mut self) -> Result<u64, StorageError>;

    /// Flushes, then seals the object (no more appends by anyone); returns its final size.
    async fn finalize(self: Box<Self>) -> Result<u64, StorageError>;

    /// Releases the writer without finalizing: unflushed bytes are dropped, the object stays
    /// open for a later takeover.
    async fn close(self: Box<Self>) -> Result<(), StorageError>;
}

/// The bytes a writer holds between its appends and its flush, with the checks every backend
/// makes before sending anything: the offset, the object's size limit and its append count.
#[derive(Debug, Default, Clone)]
pub struct Pending {
    chunks: Vec<Bytes>,
    len: u64,
}

impl Pending {
    /// Bytes held.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The held chunks, in append order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// Hands over the held chunks and holds nothing.
    pub fn take(&mut self) -> Vec<Bytes> {
        self.len = 0;
        std::mem::take(&mut self.chunks)
    }

    /// Drops what is held.
    pub fn clear(&mut self) {
        self.take();
    }

    /// Holds `data`, appended at `offset` to an object whose writer has `persisted` bytes
    /// persisted: `offset` must be where the writer is, and the object must stay within
    /// `limits.max_bytes`.
    pub fn push(
        &mut self,
        path: &Path,
        limits: &AppendLimits,
        persisted: u64,
        offset: u64,
        data: Bytes,
    ) -> Result<(), StorageError> {
        let at = persisted + self.len;
        if offset != at {
            return Err(wrong_offset(path, at, offset));
        }
        let end = offset + data.len() as u64;
        if end > limits.max_bytes {
            return Err(StorageError::ObjectFull {
                path: path.to_string(),
                reason: format!("{end} bytes would pass the {}-byte limit", limits.max_bytes),
            });
        }
        self.len += data.len() as u64;
        self.chunks.push(data);
        Ok(())
    }

    /// Refuses a flush carrying bytes once the object took `flushes` appends, its limit.
    pub fn check_append_count(
        &self,
        path: &Path,
        limits: &AppendLimits,
        flushes: u64,
    ) -> Result<(), StorageError> {
        if !self.is_empty() && flushes >= limits.max_appends {
            return Err(StorageError::ObjectFull {
                path: path.to_string(),
                reason: format!("{flushes} appends made, the limit"),
            });
        }
        Ok(())
    }
}

/// The error every call on a broken writer returns.
pub fn broken(path: &Path) -> StorageError {
    StorageError::Fenced {
        path: path.to_string(),
        reason: "the writer broke on a failed flush; take the object over to learn its size"
            .to_string(),
    }
}

/// The error for an append at the wrong offset.
pub fn wrong_offset(path: &Path, expected: u64, given: u64) -> StorageError {
    StorageError::Fenced {
        path: path.to_string(),
        reason: format!("append at offset {given}, but the writer is at {expected}"),
    }
}
