//! S3 Express One Zone appendable objects for Weir, through the official `aws-sdk-s3` client.
//!
//! [`S3ExpressAppend`] implements [`AppendableStore`] with [`FenceKind::WriteOffset`] and
//! [`AppendLimits::S3_EXPRESS`] on one directory bucket (`name--zone-id--x-s3`):
//!
//! - `create`: `PutObject` with an empty body and `If-None-Match: *` (create-only; 412 on a
//!   taken key) → a writer at offset 0.
//! - writer `append`: checks the offset and holds the bytes; `flush`: ONE `PutObject` with
//!   `write_offset_bytes` (`x-amz-write-offset-bytes`) = the persisted size and the held bytes
//!   as its body. S3 refuses an offset that is not the object's size (`InvalidWriteOffset`), so
//!   a writer whose object another writer appended to is fenced by its next flush. A flush with
//!   nothing held sends nothing (and so does not notice a takeover; the next append does).
//!   Past [`AppendLimits::max_appends`] flushes, a flush fails with
//!   [`StorageError::ObjectFull`] before sending.
//! - `takeover`: `HeadObject` → a writer at its `Content-Length`. S3 has no generation or
//!   write handle: writers report generation 0, the new writer's first append fences the old
//!   one, and until then both could append (the conformance suite allows exactly this for
//!   [`FenceKind::WriteOffset`]).
//! - `finalize`: S3 Express cannot seal an object. The writer flushes (or, with nothing held,
//!   checks with `HeadObject` that the object is still at its offset) and the store records the
//!   key as finalized **in this process only**: its `stat` then says `finalized`, its
//!   `takeover` refuses the key and flushes of its writers to it fail. Another process, or
//!   this one after a restart or once the key has aged out of the record (the newest
//!   [`FINALIZED_KEPT`] keys are kept), sees an ordinary open object. `close` drops the writer.
//! - `stat`: `HeadObject` (size; `finalized` as above; generation 0). `read`: `GetObject` with
//!   a `Range`, refusing ranges past the persisted size like the trait's double.
//!
//! Every failure of a flush breaks the writer ([`weir_storage::append::broken`] afterwards);
//! `error.rs` maps answers to [`StorageError`]s (fenced, not found, full, retryable or not).
//! The SDK retries throttling, 5xx and lost connections itself (its retry config is the
//! caller's, on the [`aws_sdk_s3::Client`]); an append retried after its first attempt landed
//! but lost its answer comes back `InvalidWriteOffset`, so a [`StorageError::Fenced`] from a
//! flush means "outcome unknown, take the object over", as the trait says of every failed
//! flush.
//!
//! **What the tests prove** (`cargo nextest run -p weir-storage-s3x`, no network): the real
//! client drives an in-memory S3 Express bucket (`fake.rs`) plugged in at the client's
//! `HttpClient` seam, so request building, key encoding, virtual-hosted directory-bucket
//! addressing, S3 Express session auth (`CreateSession` once, then requests signed with the
//! session key and carrying `x-amz-s3session-token`), error parsing and the SDK's retries all
//! run for real; only the socket is replaced. The bucket answers `PutObject` (create-only;
//! write-offset appends with `x-amz-object-size`; `TooManyParts`), `HeadObject` and ranged
//! `GetObject` as the S3 documentation describes them. On it the conformance suite of
//! [`weir_storage::append`] passes, with and without a prefix; creates and flushes carry the
//! headers above (one request per flush, every held byte in it); each error answer maps to
//! the documented [`StorageError`] and breaks the writer; a lost answer leaves its bytes for a
//! takeover; the SDK's retry of a throttled append lands it once, and its retry of an append
//! whose answer was lost comes back fenced; the append limit is enforced before sending; the
//! finalized record is local and bounded. One test runs the SDK's own HTTPS client against a
//! closed loopback port: the refused connection (inside `CreateSession`) is retryable.
//!
//! **What stays unproven until a real S3 Express bucket:** the real answers — status and
//! code of a wrong write offset, of a create-only put on a taken key, of an append to a
//! missing key, of the part past the limit (and whether the empty create counts as a part,
//! which would leave 9,999 appends; a `TooManyParts` maps to [`StorageError::ObjectFull`]
//! either way); that appends accept the CRC32 checksum header the SDK adds by default (the
//! fake does not check it); that `HeadObject` and ranged `GetObject` see an append as soon as
//! it is acknowledged; session expiry and refresh; and the latencies.

pub mod connect;
mod error;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;
use object_store::path::Path;
use weir_storage::append::{
    AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use weir_storage::StorageError;

use error::{map_error, past_end, Request};
use writer::S3ExpressWriter;

/// How many finalized keys a store remembers (see the module docs): enough for the objects a
/// broker finalizes between restarts of interest, bounded so a long-running process does not
/// grow without end.
pub const FINALIZED_KEPT: usize = 4096;

/// Appendable objects in one S3 Express One Zone directory bucket (see the module docs).
#[derive(Debug, Clone)]
pub struct S3ExpressAppend {
    shared: Arc<Shared>,
}

/// What the store and its writers share.
#[derive(Debug)]
pub(crate) struct Shared {
    client: Client,
    bucket: String,
    /// Empty, or the key prefix with its trailing `/`.
    prefix: String,
    limits: AppendLimits,
    finalized: Mutex<Finalized>,
}

impl S3ExpressAppend {
    /// A store over `bucket` (a directory bucket name, `name--zone-id--x-s3`), with its keys
    /// under `prefix` when given (`prefix/path`, as `object_store`'s `PrefixStore` joins them,
    /// so the bucket's ordinary [`object_store::ObjectStore`] view sees the same keys). The
    /// client brings the region, credentials, endpoint, HTTP client and retry policy.
    pub fn new(client: Client, bucket: &str, prefix: Option<&str>) -> S3ExpressAppend {
        let prefix = prefix
            .map(|p| p.trim_matches('/'))
            .filter(|p| !p.is_empty())
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        S3ExpressAppend {
            shared: Arc::new(Shared {
                client,
                bucket: bucket.to_string(),
                prefix,
                limits: AppendLimits::S3_EXPRESS,
                finalized: Mutex::new(Finalized::new(FINALIZED_KEPT)),
            }),
        }
    }

    /// The same store with other limits and finalized-record size (tests reach the limits
    /// without thousands of requests).
    #[cfg(test)]
    pub(crate) fn with_limits(self, limits: AppendLimits, finalized_kept: usize) -> Self {
        let shared = Arc::into_inner(self.shared).expect("not shared yet");
        S3ExpressAppend {
            shared: Arc::new(Shared {
                limits,
                finalized: Mutex::new(Finalized::new(finalized_kept)),
                ..shared
            }),
        }
    }
}

impl Shared {
    /// The S3 key of `path`.
    pub(crate) fn key(&self, path: &Path) -> String {
        format!("{}{path}", self.prefix)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn bucket(&self) -> &str {
        &self.bucket
    }

    pub(crate) fn limits(&self) -> AppendLimits {
        self.limits
    }

    pub(crate) fn finalized(&self) -> MutexGuard<'_, Finalized> {
        self.finalized.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The persisted size of `path` (`HeadObject`).
    pub(crate) async fn size(&self, path: &Path) -> Result<u64, StorageError> {
        let head = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.key(path))
            .send()
            .await
            .map_err(|e| map_error(Request::Head, path, e))?;
        head.content_length()
            .and_then(|len| u64::try_from(len).ok())
            .ok_or_else(|| {
                error::generic(format!(
                    "HeadObject of {path} answered without a Content-Length"
                ))
            })
    }
}

/// The error for a key this store finalized.
pub(crate) fn finalized_error(path: &Path) -> StorageError {
    StorageError::Fenced {
        path: path.to_string(),
        reason: "finalized through this store (S3 Express objects cannot be sealed; the \
                 record is local to this process)"
            .to_string(),
    }
}

/// The keys finalized through one store, newest last, at most `kept` of them.
#[derive(Debug)]
pub(crate) struct Finalized {
    order: VecDeque<Path>,
    keys: HashSet<Path>,
    kept: usize,
}

impl Finalized {
    fn new(kept: usize) -> Finalized {
        Finalized {
            order: VecDeque::new(),
            keys: HashSet::new(),
            kept,
        }
    }

    pub(crate) fn contains(&self, path: &Path) -> bool {
        self.keys.contains(path)
    }

    /// Records `path`, forgetting the oldest key past the bound.
    pub(crate) fn insert(&mut self, path: &Path) {
        if !self.keys.insert(path.clone()) {
            return;
        }
        self.order.push_back(path.clone());
        while self.order.len() > self.kept {
            if let Some(oldest) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
    }

    /// Forgets `path` (a new object was created under it).
    fn remove(&mut self, path: &Path) {
        if self.keys.remove(path) {
            self.order.retain(|p| p != path);
        }
    }
}

#[async_trait]
impl AppendableStore for S3ExpressAppend {
    fn fence(&self) -> FenceKind {
        FenceKind::WriteOffset
    }

    fn limits(&self) -> AppendLimits {
        self.shared.limits
    }

    /// A create is a `PutObject` like every append: making objects ahead buys no latency.
    fn creates_ahead_pay_off(&self) -> bool {
        false
    }

    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let shared = &self.shared;
        shared
            .client
            .put_object()
            .bucket(&shared.bucket)
            .key(shared.key(path))
            .if_none_match("*")
            .body(ByteStream::from_static(b""))
            .send()
            .await
            .map_err(|e| map_error(Request::Create, path, e))?;
        shared.finalized().remove(path);
        Ok(Box::new(S3ExpressWriter::new(shared, path, 0)))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        if self.shared.finalized().contains(path) {
            return Err(finalized_error(path));
        }
        let size = self.shared.size(path).await?;
        Ok(Box::new(S3ExpressWriter::new(&self.shared, path, size)))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        let size = self.shared.size(path).await?;
        Ok(AppendableMeta {
            size,
            finalized: self.shared.finalized().contains(path),
            generation: 0,
        })
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        if range.start >= range.end {
            // HTTP cannot ask for an empty range; check the bound with a HEAD instead.
            let size = self.shared.size(path).await?;
            if range.start > range.end || range.end > size {
                return Err(past_end(path, format!("{range:?} of {size} bytes")));
            }
            return Ok(Bytes::new());
        }
        let shared = &self.shared;
        let got = shared
            .client
            .get_object()
            .bucket(&shared.bucket)
            .key(shared.key(path))
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await
            .map_err(|e| map_error(Request::Get, path, e))?;
        let bytes = got
            .body
            .collect()
            .await
            .map_err(|e| error::generic(DisplayErrorContext(&e)))?
            .into_bytes();
        // S3 answers a range that runs past the end with the bytes it has.
        if bytes.len() as u64 != range.end - range.start {
            return Err(past_end(
                path,
                format!("{range:?}, {} bytes from {}", bytes.len(), range.start),
            ));
        }
        Ok(bytes)
    }
}
