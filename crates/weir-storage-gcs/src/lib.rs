//! GCS Rapid (zonal bucket) appendable objects for Weir, through the official
//! `google-cloud-storage` client (1.21, built with `--cfg google_cloud_unstable_storage_bidi`).
//!
//! [`GcsRapid`] implements [`AppendableStore`] with [`FenceKind::Generation`] and
//! [`AppendLimits::GCS_RAPID`]:
//!
//! - `create`: `open_appendable_object(..).set_if_generation_match(0)` (the service refuses a
//!   live name with `FAILED_PRECONDITION`), then one `flush`, so the object exists and the
//!   stream is warm when `create` returns.
//! - `append`: held in the [`AppendWriter`]; `flush`: the held chunks go to the client's
//!   `append`, then its `flush` returns the persisted size.
//! - `takeover`: `open_object` (the object's generation, finalized or not), then
//!   `reopen_appendable_object(.., generation)` (a new writer stream; the service refuses the
//!   previous one).
//! - `finalize`, `close`: the client's `finalize` (seals) and `close` (ends the stream; the
//!   object stays open for a takeover).
//! - `stat`, `read`: `open_object` (a `BidiReadObject` stream) and its `read_range`; they see
//!   the persisted bytes of open objects too.
//!
//! **Generations.** A GCS object's *generation* names the object and does not change when a
//! writer takes it over (a takeover names it to reopen the object); what fences a replaced
//! writer is the service's one-writer rule on the append stream. Weir reports the object's
//! generation as the writer's (`AppendableMeta::generation` is for logs only) and relies on the
//! service refusing the replaced writer, which the conformance suite checks.
//!
//! **What the tests prove** (`cargo nextest run -p weir-storage-gcs`, no network): the
//! conformance suite of `weir_storage::append` passes through the client's public API
//! (`Storage::from_stub`, the `OpenAppendableObject` / `ReopenAppendableObject` / `OpenObject`
//! request builders, `AppendableObjectWriter`, `ObjectDescriptor`) against an in-memory Rapid
//! bucket behind `google_cloud_storage::stub::Storage`; the bucket checks the preconditions the
//! requests carry and enforces one writer per object; error mapping (status codes to
//! [`StorageError`], retryable or not) is tested per code; a failed flush breaks the writer.
//! One test runs the real gRPC transport against a closed loopback port: the bidi-enabled
//! client builds and a refused connection comes back retryable.
//!
//! **What stays unproven until a real Rapid bucket:** the client's gRPC transport beyond the
//! connect (its stream worker, redirects, replay and checksums are crate-private and never run
//! under the stub); which status a replaced writer's flush gets (`ABORTED`,
//! `FAILED_PRECONDITION` and `OUT_OF_RANGE` all map to [`StorageError::Fenced`]); that the
//! client's own reconnect of a replaced writer's stream (it reconnects by itself on
//! `UNAVAILABLE` and the like, with the write handle the service gave it) cannot take the
//! object back, since a reconnect without a handle is itself a takeover; that `open_object` reports the persisted size of an unfinalized object; and
//! the latencies.

#[cfg(not(google_cloud_unstable_storage_bidi))]
compile_error!(
    "weir-storage-gcs needs `--cfg google_cloud_unstable_storage_bidi` (set in .cargo/config.toml; \
     a RUSTFLAGS in the environment replaces that list, so add the cfg there too)"
);

pub mod connect;
mod error;
#[cfg(test)]
mod fake;
mod objects;
#[cfg(test)]
mod tests;
mod writer;

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use google_cloud_storage::client::Storage;
use google_cloud_storage::model::Object;
use google_cloud_storage::model_ext::ReadRange;
use google_cloud_storage::object_descriptor::ObjectDescriptor;
use google_cloud_storage::stub;
use object_store::path::Path;
use weir_storage::append::{
    AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use weir_storage::StorageError;

use crate::error::Op;
pub use crate::objects::RapidObjects;
use crate::writer::RapidWriter;

/// The client's prefix for bucket resource names (`projects/_/buckets/{name}`).
const BUCKET_PREFIX: &str = "projects/_/buckets/";

/// A GCS Rapid bucket's appendable objects (see the crate docs).
#[derive(Clone)]
pub struct GcsRapid<S = stub::DefaultStorage>
where
    S: stub::Storage + 'static,
{
    client: Storage<S>,
    /// `projects/_/buckets/{name}`, as the client wants it.
    bucket: String,
    /// Empty, or the object name prefix with its trailing `/`.
    prefix: String,
    limits: AppendLimits,
}

impl<S> fmt::Debug for GcsRapid<S>
where
    S: stub::Storage + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcsRapid")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<S> GcsRapid<S>
where
    S: stub::Storage + 'static,
{
    /// The appendable objects of `bucket` (a bare name, or `projects/_/buckets/{name}`) through
    /// `client`, e.g. `Storage::builder().build().await?` (Application Default Credentials).
    pub fn new(bucket: &str, client: Storage<S>) -> Result<GcsRapid<S>, StorageError> {
        let name = bucket.strip_prefix(BUCKET_PREFIX).unwrap_or(bucket);
        if name.is_empty() || name.contains('/') {
            return Err(StorageError::InvalidConfig(format!(
                "GCS bucket {bucket:?}: expected a bucket name or projects/_/buckets/NAME"
            )));
        }
        Ok(GcsRapid {
            client,
            bucket: format!("{BUCKET_PREFIX}{name}"),
            prefix: String::new(),
            limits: AppendLimits::GCS_RAPID,
        })
    }

    /// The same bucket with every object name under `prefix` (`prefix/path`, as
    /// `object_store`'s `PrefixStore` joins them, so the bucket's object view under the same
    /// prefix sees the same objects).
    pub fn with_prefix(mut self, prefix: &str) -> GcsRapid<S> {
        let prefix = prefix.trim_matches('/');
        self.prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        self
    }

    /// The same bucket with other per-object limits (tests use small ones).
    pub fn with_limits(mut self, limits: AppendLimits) -> GcsRapid<S> {
        self.limits = limits;
        self
    }

    /// The bucket's resource name, `projects/_/buckets/{name}`.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The object name of `path`.
    fn name(&self, path: &Path) -> String {
        format!("{}{path}", self.prefix)
    }

    /// Opens `path` for reading: one `BidiReadObject` stream, whose first answer carries the
    /// object's metadata.
    async fn open(&self, path: &Path) -> Result<ObjectDescriptor, StorageError> {
        self.client
            .open_object(&self.bucket, self.name(path))
            .send()
            .await
            .map_err(|err| error::map(path, Op::Read, err))
    }

    async fn object(&self, path: &Path) -> Result<Object, StorageError> {
        Ok(self.open(path).await?.object())
    }

    /// Writes `data` as the whole object `path` in one stream (open, append, finalize), with
    /// `ifGenerationMatch: precondition` when given (`Some(0)`: only if there is no object);
    /// returns the new object's generation.
    pub(crate) async fn write_whole(
        &self,
        path: &Path,
        data: Bytes,
        precondition: Option<i64>,
    ) -> Result<i64, StorageError> {
        let mut open = self
            .client
            .open_appendable_object(&self.bucket, self.name(path));
        let op = match precondition {
            Some(0) => Op::Create,
            _ => Op::Replace,
        };
        if let Some(generation) = precondition {
            open = open.set_if_generation_match(generation);
        }
        let inner = open.send().await.map_err(|err| error::map(path, op, err))?;
        let generation = inner.generation();
        let mut writer = RapidWriter::new(
            inner,
            path,
            non_negative(path, "generation", generation)?,
            0,
            self.limits,
        );
        if !data.is_empty() {
            writer.append(0, data).await?;
        }
        Box::new(writer).finalize().await?;
        Ok(generation)
    }
}

/// A size or generation the service reported, which is never negative.
fn non_negative(path: &Path, what: &str, value: i64) -> Result<u64, StorageError> {
    u64::try_from(value).map_err(|_| {
        StorageError::InvalidConfig(format!("{path}: the service reported {what} {value}"))
    })
}

fn past_end(path: &Path, range: &Range<u64>, size: u64) -> StorageError {
    StorageError::InvalidConfig(format!(
        "read of {range:?} past the persisted size {size} of {path}"
    ))
}

/// Reads the whole of `range` (already checked against the size) from `descriptor`.
async fn read_range(
    path: &Path,
    descriptor: &ObjectDescriptor,
    range: Range<u64>,
) -> Result<Bytes, StorageError> {
    let want = range.end - range.start;
    let mut reader = descriptor
        .read_range(ReadRange::segment(range.start, want))
        .await;
    let mut chunks = Vec::new();
    while let Some(chunk) = reader.next().await {
        chunks.push(chunk.map_err(|err| error::map(path, Op::Read, err))?);
    }
    let got: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    if got != want {
        let short = format!("{path}: read {got} bytes of {range:?}");
        return Err(error::transient(short.into()));
    }
    Ok(match chunks.len() {
        1 => chunks.remove(0),
        _ => Bytes::from(chunks.concat()),
    })
}

#[async_trait]
impl<S> AppendableStore for GcsRapid<S>
where
    S: stub::Storage + 'static,
{
    fn fence(&self) -> FenceKind {
        FenceKind::Generation
    }

    fn limits(&self) -> AppendLimits {
        self.limits
    }

    /// Opening an appendable object costs ~75 ms, an append and flush into an open one ~2 ms
    /// (seed 000's measurements).
    fn creates_ahead_pay_off(&self) -> bool {
        true
    }

    /// Opens the object with `ifGenerationMatch: 0` and flushes once, so the object exists and
    /// the stream has had its first round trip when this returns. A failed flush leaves an
    /// empty unfinalized object behind, for orphan collection.
    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let mut inner = self
            .client
            .open_appendable_object(&self.bucket, self.name(path))
            .set_if_generation_match(0)
            .send()
            .await
            .map_err(|err| error::map(path, Op::Create, err))?;
        let size = inner
            .flush()
            .await
            .map_err(|err| error::map(path, Op::Write, err))?;
        if size != 0 {
            return Err(StorageError::Fenced {
                path: path.to_string(),
                reason: format!("a new object holds {size} bytes"),
            });
        }
        let generation = non_negative(path, "generation", inner.generation())?;
        let writer = RapidWriter::new(inner, path, generation, 0, self.limits);
        Ok(Box::new(writer))
    }

    /// Reopens the object at its generation; the service then refuses the previous writer.
    /// The new writer's generation is the metageneration read after the reopen. An object
    /// finalized between the stat and the reopen fails the reopen: fenced on a
    /// `FAILED_PRECONDITION`, or retryable when the client itself spots the finalized object
    /// (it says so without a status), and then the retry's stat says finalized.
    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let object = self.object(path).await?;
        if object.finalize_time.is_some() {
            return Err(StorageError::Fenced {
                path: path.to_string(),
                reason: "the object is finalized".to_string(),
            });
        }
        let inner = self
            .client
            .reopen_appendable_object(&self.bucket, self.name(path), object.generation)
            .send()
            .await
            .map_err(|err| error::map(path, Op::Takeover, err))?;
        let persisted = non_negative(path, "persisted size", inner.persisted_size())?;
        let generation = non_negative(path, "generation", object.generation)?;
        let writer = RapidWriter::new(inner, path, generation, persisted, self.limits);
        Ok(Box::new(writer))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        let object = self.object(path).await?;
        Ok(AppendableMeta {
            size: non_negative(path, "size", object.size)?,
            finalized: object.finalize_time.is_some(),
            generation: non_negative(path, "generation", object.generation)?,
        })
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        let descriptor = self.open(path).await?;
        let size = non_negative(path, "size", descriptor.object().size)?;
        if range.start > range.end || range.end > size {
            return Err(past_end(path, &range, size));
        }
        // An empty segment would read to the end: a zero read limit means "no limit".
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        read_range(path, &descriptor, range).await
    }
}
