//! The storage layer: the one wrapper between Weir and every bucket's [`ObjectStore`].
//!
//! Every request of the produce path, the control plane, fetch, recovery and the startup checks
//! passes a [`LayerStore`], which gives it, in one place:
//!
//! - **Deadlines.** Each request has an overall deadline (`storage.request_timeout`) covering all
//!   its attempts, and each attempt one by class and size: `storage.attempt_timeout` plus the
//!   time to move the payload at `storage.min_throughput`. GET bodies and list pages must keep
//!   arriving within the attempt deadline (a download that keeps moving is not cut off because the
//!   object is large). Without deadlines one hung PUT blocks its file and, through the ordered
//!   commit chain, every later produce forever; with them callers see an ordinary retriable error.
//! - **One retry policy.** A failed attempt is retried (up to `storage.max_attempts`, within the
//!   overall deadline) only when the error says a retry may succeed: throttling (HTTP 503
//!   SlowDown, 429) backs off longer; `AlreadyExists`, `Precondition` and `NotFound` are answers,
//!   returned at once; client errors (4xx) are not retried. Backoff is exponential with full
//!   jitter. The cloud clients' own retries are switched off ([`crate::url`]) so this is the only
//!   policy. A timed-out attempt may still take effect (an ambiguous write): every writer above
//!   already tolerates that (data files are re-put under the same key; log slots are create-only
//!   and compare bytes on `AlreadyExists`).
//! - **Counters** of every attempt by class and outcome, and bytes, in [`BucketStats`] (with the
//!   bucket's price table, so the agent knows its own cost).
//!
//! Read hedging across quorum holders lives in [`crate::quorum`], above this layer.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};
use serde::Deserialize;
use tokio::time::Instant;

use crate::stats::{BucketStats, Outcome, RequestClass};

/// Default overall deadline of one request, all attempts included (`storage.request_timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const STORE: &str = "weir-storage";

/// Deadlines and retries of the storage layer (`[storage]` keys of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LayerPolicy {
    /// Overall deadline of one request, all attempts and backoffs included.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Deadline of one attempt before its payload term (and of each GET body chunk or list page).
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Duration,
    /// Bytes per second an attempt is allowed for its payload on top of `attempt_timeout`.
    pub min_throughput: u64,
    /// Attempts per request (1 = no retries).
    pub max_attempts: u32,
    /// First backoff after an ordinary transient failure (doubles, full jitter).
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// First backoff after the store asked us to slow down (503 SlowDown, 429).
    #[serde(with = "humantime_serde")]
    pub throttle_backoff_base: Duration,
    /// Upper bound of one backoff.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
}

impl Default for LayerPolicy {
    fn default() -> Self {
        LayerPolicy {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            attempt_timeout: Duration::from_secs(3),
            min_throughput: 4 << 20,
            max_attempts: 3,
            backoff_base: Duration::from_millis(20),
            throttle_backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(2),
        }
    }
}

impl LayerPolicy {
    /// The same policy with one overall deadline (tests, fault scenarios).
    pub fn with_request_timeout(mut self, timeout: Duration) -> LayerPolicy {
        self.request_timeout = timeout;
        self
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<(), String> {
        if self.request_timeout.is_zero() || self.attempt_timeout.is_zero() {
            return Err("storage.request_timeout and storage.attempt_timeout must be > 0".into());
        }
        if self.max_attempts == 0 {
            return Err("storage.max_attempts must be at least 1".into());
        }
        if self.min_throughput == 0 {
            return Err("storage.min_throughput must be > 0 bytes/s".into());
        }
        Ok(())
    }

    /// The deadline of one attempt that moves `bytes` (before capping by what is left of the
    /// request's overall deadline).
    pub fn attempt_deadline(&self, bytes: u64) -> Duration {
        let transfer = Duration::from_secs_f64(bytes as f64 / self.min_throughput.max(1) as f64);
        self.attempt_timeout.saturating_add(transfer)
    }

    /// The backoff before attempt `attempt + 1` (attempt counts from 1), full jitter drawn
    /// from `rng`.
    fn backoff(&self, attempt: u32, throttled: bool, rng: &mut fastrand::Rng) -> Duration {
        let base = if throttled {
            self.throttle_backoff_base
        } else {
            self.backoff_base
        };
        let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.backoff_max);
        cap.mul_f64(rng.f64())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{operation} did not finish within {timeout:?}")]
struct TimedOut {
    operation: &'static str,
    timeout: Duration,
}

fn timed_out(operation: &'static str, timeout: Duration) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(TimedOut { operation, timeout }),
    }
}

/// The HTTP status of a failed cloud request, found in its error chain (the cloud clients report
/// non-2xx answers as `Server returned non-2xx status code: 503 Service Unavailable: ...`).
pub fn http_status(err: &object_store::Error) -> Option<u16> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let text = e.to_string();
        if let Some(at) = text.find("status code: ") {
            let digits = text[at + "status code: ".len()..].get(..3)?;
            return digits.parse().ok();
        }
        source = e.source();
    }
    None
}

fn mentions_throttling(err: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        let text = e.to_string();
        if [
            "SlowDown",
            "TooManyRequests",
            "ServerBusy",
            "rateLimitExceeded",
        ]
        .iter()
        .any(|m| text.contains(m))
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// S3 answers a create-only or conditional PUT that races another write to the same key with
/// `409 ConditionalRequestConflict` ("a conflicting operation is in progress; retry"), which
/// object_store reports as `AlreadyExists` like every 409. It says nothing about whether the
/// object exists: it is transient, not an answer. (Azure's 409 `BlobAlreadyExists` is an answer.)
fn is_conditional_conflict(err: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.to_string().contains("ConditionalRequestConflict") {
            return true;
        }
        source = e.source();
    }
    false
}

/// How an attempt's error is counted.
pub fn outcome_of(err: &object_store::Error) -> Outcome {
    use object_store::Error as E;
    match err {
        E::AlreadyExists { .. } if is_conditional_conflict(err) => Outcome::Error,
        E::NotFound { .. } => Outcome::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            Outcome::Conflict
        }
        E::Generic { source, .. } if source.is::<TimedOut>() => Outcome::Timeout,
        _ if matches!(http_status(err), Some(503 | 429)) || mentions_throttling(err) => {
            Outcome::Throttled
        }
        _ => Outcome::Error,
    }
}

/// Whether another attempt may succeed where this one failed.
pub fn is_retryable(err: &object_store::Error) -> bool {
    use object_store::Error as E;
    match err {
        E::AlreadyExists { .. } => is_conditional_conflict(err),
        E::Generic { .. } | E::JoinError { .. } => match http_status(err) {
            // Timeouts, throttling and server errors: yes; other client errors: no.
            Some(status) => status >= 500 || status == 408 || status == 429,
            None => true,
        },
        _ => false,
    }
}

/// Wraps one bucket's store with deadlines, retries and counters. See the module docs.
pub struct LayerStore {
    inner: Arc<dyn ObjectStore>,
    policy: LayerPolicy,
    stats: Arc<BucketStats>,
    /// Backoff jitter; seeded by the simulation so its runs repeat.
    rng: Mutex<fastrand::Rng>,
}

impl LayerStore {
    /// Wraps `inner` (the bucket named in `stats`) with `policy`.
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        policy: LayerPolicy,
        stats: Arc<BucketStats>,
    ) -> LayerStore {
        LayerStore {
            inner,
            policy,
            stats,
            rng: Mutex::new(fastrand::Rng::new()),
        }
    }

    /// Draws backoff jitter from a generator seeded with `seed` (deterministic simulation).
    pub fn with_jitter_seed(self, seed: u64) -> LayerStore {
        LayerStore {
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            ..self
        }
    }

    /// A seed for a stream's own backoff jitter, drawn from this store's generator.
    fn jitter_seed(&self) -> u64 {
        self.rng.lock().unwrap_or_else(|e| e.into_inner()).u64(..)
    }

    /// The bucket's counters.
    pub fn stats(&self) -> &Arc<BucketStats> {
        &self.stats
    }

    /// Runs `attempt` under the policy: per-attempt deadline, retries with backoff, counters.
    async fn call<T, F, Fut>(
        &self,
        class: RequestClass,
        operation: &'static str,
        bytes_up: u64,
        mut attempt: F,
    ) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let per_attempt = self.policy.attempt_deadline(bytes_up);
        // A payload too large to move within request_timeout still gets one whole attempt: the
        // deadline grows by its transfer time.
        let transfer = per_attempt.saturating_sub(self.policy.attempt_timeout);
        let request = self.policy.request_timeout;
        let deadline =
            Instant::now() + request.max(request.min(self.policy.attempt_timeout) + transfer);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .min(per_attempt);
            let result = match tokio::time::timeout(budget, attempt()).await {
                Ok(result) => result,
                Err(_) => Err(timed_out(operation, budget)),
            };
            self.stats.add_bytes_up(bytes_up);
            let err = match result {
                Ok(value) => {
                    self.stats.record(class, Outcome::Ok);
                    return Ok(value);
                }
                Err(err) => err,
            };
            let outcome = outcome_of(&err);
            self.stats.record(class, outcome);
            if !is_retryable(&err) || attempts >= self.policy.max_attempts {
                return Err(err);
            }
            let backoff = {
                let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                self.policy
                    .backoff(attempts, outcome == Outcome::Throttled, &mut rng)
            };
            // An attempt with a sliver of time left would only replace this error with a
            // timeout: give up with the real error instead.
            let useful = per_attempt.min(self.policy.attempt_timeout) / 4;
            if Instant::now() + backoff + useful >= deadline {
                return Err(err);
            }
            self.stats.record_retry(class);
            tracing::debug!(
                bucket = self.stats.name(),
                operation,
                attempts,
                ?backoff,
                error = %err,
                "retrying object-store request"
            );
            tokio::time::sleep(backoff).await;
        }
    }

    /// Counts a stream's items: one request per `page` items (list pages) or per item (deletes),
    /// and each item's outcome; each item must arrive within the attempt deadline. A failed item
    /// ends a list, but not a delete stream (`per_request == 1`): each key of a bulk delete has
    /// its own answer, and the keys after a failed one must still be deleted.
    fn metered_stream<T: Send + 'static>(
        &self,
        class: RequestClass,
        operation: &'static str,
        per_request: usize,
        inner: BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        let stats = self.stats.clone();
        let timeout = self.policy.attempt_timeout;
        let items_independent = per_request == 1;
        // (inner, items that succeeded, a billed request is still open, any item arrived)
        let state = (inner, 0usize, false, false);
        futures::stream::unfold(Some(state), move |state| {
            let stats = stats.clone();
            async move {
                let (mut inner, mut seen, mut billed_open, answered) = state?;
                let item = match tokio::time::timeout(timeout, inner.next()).await {
                    Ok(Some(Ok(item))) => {
                        seen += 1;
                        // A request is billed when its first item arrives.
                        if !billed_open {
                            stats.record(class, Outcome::Ok);
                            billed_open = true;
                        }
                        if seen % per_request == 0 {
                            billed_open = false;
                        }
                        Ok(item)
                    }
                    Ok(Some(Err(err))) => {
                        stats.record(class, outcome_of(&err));
                        if !items_independent {
                            return Some((Err(err), None));
                        }
                        Err(err)
                    }
                    Ok(None) => {
                        // An empty answer is still one request.
                        if !answered {
                            stats.record(class, Outcome::Ok);
                        }
                        return None;
                    }
                    Err(_) => {
                        stats.record(class, Outcome::Timeout);
                        return Some((Err(timed_out(operation, timeout)), None));
                    }
                };
                Some((item, Some((inner, seen, billed_open, true))))
            }
        })
        // Callers may poll an ended stream again (object_store's own streams allow it).
        .fuse()
        .boxed()
    }
}

/// Each body chunk must arrive within `timeout` of the previous one, and the whole body by
/// `deadline` (the attempt deadline of its length); bytes are counted.
fn metered_body(
    stats: Arc<BucketStats>,
    timeout: Duration,
    deadline: Instant,
    inner: BoxStream<'static, object_store::Result<Bytes>>,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    futures::stream::unfold(Some(inner), move |state| {
        let stats = stats.clone();
        async move {
            let mut inner = state?;
            let wait = timeout.min(deadline.saturating_duration_since(Instant::now()));
            match tokio::time::timeout(wait, inner.next()).await {
                Ok(Some(Ok(chunk))) => {
                    stats.add_bytes_down(chunk.len() as u64);
                    Some((Ok(chunk), Some(inner)))
                }
                Ok(Some(Err(err))) => Some((Err(err), None)),
                Ok(None) => None,
                // The error ends the stream.
                Err(_) => {
                    stats.record(RequestClass::Get, Outcome::Timeout);
                    Some((Err(timed_out("get body", wait)), None))
                }
            }
        }
    })
    // `GetResult::bytes` polls the body again after its end (an empty object has no chunks).
    .fuse()
    .boxed()
}

/// A listing whose first page is retried under `policy` (a 503 or a stall before any key
/// arrived re-issues it); once keys flow, a failure ends the stream and the caller decides (a
/// resumed listing could skip keys on stores that do not list in order). Failed attempts are
/// counted here; the answer that is returned is counted by [`LayerStore::metered_stream`].
fn retry_first_page<T: Send + 'static>(
    stats: Arc<BucketStats>,
    policy: LayerPolicy,
    jitter_seed: u64,
    operation: &'static str,
    make: impl Fn() -> BoxStream<'static, object_store::Result<T>> + Send + 'static,
) -> BoxStream<'static, object_store::Result<T>> {
    futures::stream::once(async move {
        let mut rng = fastrand::Rng::with_seed(jitter_seed);
        let deadline = Instant::now() + policy.request_timeout;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let mut stream = make();
            let budget = deadline
                .saturating_duration_since(Instant::now())
                .min(policy.attempt_timeout);
            let err = match tokio::time::timeout(budget, stream.next()).await {
                Ok(Some(Ok(first))) => {
                    return futures::stream::once(futures::future::ready(Ok(first)))
                        .chain(stream)
                        .boxed()
                }
                Ok(None) => return futures::stream::empty().boxed(),
                Ok(Some(Err(err))) => err,
                Err(_) => timed_out(operation, budget),
            };
            let outcome = outcome_of(&err);
            let backoff = policy.backoff(attempts, outcome == Outcome::Throttled, &mut rng);
            let useful = policy.attempt_timeout / 4;
            if !is_retryable(&err)
                || attempts >= policy.max_attempts
                || Instant::now() + backoff + useful >= deadline
            {
                return futures::stream::once(futures::future::ready(Err(err))).boxed();
            }
            stats.record(RequestClass::List, outcome);
            stats.record_retry(RequestClass::List);
            tokio::time::sleep(backoff).await;
        }
    })
    .flatten()
    .boxed()
}

impl fmt::Debug for LayerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for LayerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Layer({}, {:?}, {})",
            self.stats.name(),
            self.policy.request_timeout,
            self.inner
        )
    }
}

/// Objects per LIST request (S3, GCS and Azure all page at 1,000 keys by default).
const LIST_PAGE: usize = 1000;

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for LayerStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let bytes = payload.content_length() as u64;
        self.call(RequestClass::Put, "put", bytes, || {
            self.inner.put_opts(location, payload.clone(), opts.clone())
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let upload = self
            .call(RequestClass::Put, "multipart create", 0, || {
                self.inner.put_multipart_opts(location, opts.clone())
            })
            .await?;
        Ok(Box::new(LayerUpload {
            upload,
            policy: self.policy,
            stats: self.stats.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let class = if options.head {
            RequestClass::Head
        } else {
            RequestClass::Get
        };
        let mut result = self
            .call(class, "get", 0, || {
                self.inner.get_opts(location, options.clone())
            })
            .await?;
        match result.payload {
            GetResultPayload::Stream(stream) => {
                let length = result.range.end.saturating_sub(result.range.start);
                let deadline = Instant::now() + self.policy.attempt_deadline(length);
                result.payload = GetResultPayload::Stream(metered_body(
                    self.stats.clone(),
                    self.policy.attempt_timeout,
                    deadline,
                    stream,
                ));
            }
            // Local files are read synchronously by the caller: nothing there can hang on a
            // network; count the range it will read (none for a HEAD).
            #[allow(unreachable_patterns)]
            _ if !options.head => self
                .stats
                .add_bytes_down(result.range.end.saturating_sub(result.range.start)),
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let got = self
            .call(RequestClass::Get, "get ranges", 0, || {
                self.inner.get_ranges(location, ranges)
            })
            .await?;
        let bytes: usize = got.iter().map(Bytes::len).sum();
        self.stats.add_bytes_down(bytes as u64);
        Ok(got)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.metered_stream(
            RequestClass::Delete,
            "delete",
            1,
            self.inner.delete_stream(locations),
        )
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (inner, prefix) = (self.inner.clone(), prefix.cloned());
        let listing = retry_first_page(
            self.stats.clone(),
            self.policy,
            self.jitter_seed(),
            "list",
            move || inner.list(prefix.as_ref()),
        );
        self.metered_stream(RequestClass::List, "list", LIST_PAGE, listing)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        // Some servers ignore the offset (azurite ignores Azure's `startFrom` unless the client
        // is configured as an emulator): filtering again here keeps "strictly after `offset`"
        // true on every backend, at no cost where the server honoured it.
        let (inner, prefix, offset) = (self.inner.clone(), prefix.cloned(), offset.clone());
        let start = offset.clone();
        let listing = retry_first_page(
            self.stats.clone(),
            self.policy,
            self.jitter_seed(),
            "list",
            move || inner.list_with_offset(prefix.as_ref(), &start),
        );
        self.metered_stream(RequestClass::List, "list", LIST_PAGE, listing)
            .try_filter(move |meta| futures::future::ready(meta.location > offset))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.call(RequestClass::List, "list", 0, || {
            self.inner.list_with_delimiter(prefix)
        })
        .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.call(RequestClass::Put, "copy", 0, || {
            self.inner.copy_opts(from, to, options.clone())
        })
        .await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.call(RequestClass::Put, "rename", 0, || {
            self.inner.rename_opts(from, to, options.clone())
        })
        .await
    }
}

/// A multipart upload under the layer's deadlines and counters. Parts are not retried here (a
/// part's number is fixed when it is started); the caller retries the whole upload.
#[derive(Debug)]
struct LayerUpload {
    upload: Box<dyn MultipartUpload>,
    policy: LayerPolicy,
    stats: Arc<BucketStats>,
}

async fn counted<T>(
    stats: Arc<BucketStats>,
    operation: &'static str,
    timeout: Duration,
    work: impl Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    let result = match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(operation, timeout)),
    };
    let outcome = match &result {
        Ok(_) => Outcome::Ok,
        Err(err) => outcome_of(err),
    };
    stats.record(RequestClass::Put, outcome);
    result
}

#[async_trait]
impl MultipartUpload for LayerUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let bytes = data.content_length() as u64;
        self.stats.add_bytes_up(bytes);
        // Parts are ordered by call order, so the inner part must be started now.
        let put = self.upload.put_part(data);
        let timeout = self
            .policy
            .attempt_deadline(bytes)
            .min(self.policy.request_timeout);
        Box::pin(counted(self.stats.clone(), "upload part", timeout, put))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let timeout = self.policy.attempt_timeout;
        counted(
            self.stats.clone(),
            "upload complete",
            timeout,
            self.upload.complete(),
        )
        .await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let timeout = self.policy.attempt_timeout;
        counted(
            self.stats.clone(),
            "upload abort",
            timeout,
            self.upload.abort(),
        )
        .await
    }
}

mod append;

#[cfg(test)]
mod tests;
