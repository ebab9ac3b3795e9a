//! Latency and fault model: an [`ObjectStore`] wrapper that makes a fast local store behave like
//! a cloud bucket (DESIGN §4).
//!
//! Every operation sleeps for a latency sampled from a per-operation log-normal distribution
//! (fitted to a p50 and a p99), plus `bytes / bandwidth` for payloads, and then either delegates
//! to the inner store or fails with a transient [`object_store::Error::Generic`] (with
//! probability `error_rate`, or always while an outage is set). The model is a simulation of the
//! cloud, not a mock of our code: everything above it runs for real. By default sleeps use
//! `tokio::time`, so tests with a paused clock run instantly and deterministically (the RNG is
//! seeded); an agent subtracts tokio's timer lag instead ([`ModelClock`]), so that waits last
//! what the profile says on average.
//!
//! Not modelled yet: per-prefix throttling (503 SlowDown) and hedging-relevant tail correlation.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};

use crate::StorageError;

mod append;
mod clock;
mod profile;
#[cfg(test)]
mod tests;

pub use clock::ModelClock;
pub use profile::{AppendCosts, LatencyProfile, OpLatency, PutPhases, PROFILE_NAMES};

/// Wraps `inner` in a [`ModelStore`] running the named profile, or returns `inner` unchanged
/// when the profile adds nothing (`local`).
pub fn maybe_wrap(
    inner: Arc<dyn ObjectStore>,
    profile_name: &str,
    seed: u64,
) -> Result<Arc<dyn ObjectStore>, StorageError> {
    let profile = LatencyProfile::named(profile_name).ok_or_else(|| {
        StorageError::InvalidConfig(format!(
            "unknown latency profile {profile_name:?} (known: {})",
            PROFILE_NAMES.join(", ")
        ))
    })?;
    if profile.is_zero() {
        return Ok(inner);
    }
    Ok(Arc::new(ModelStore::new(inner, profile, seed)?))
}

/// Which distribution an operation samples.
#[derive(Debug, Clone, Copy)]
enum Op {
    Put,
    /// Whole-object put: phases if the profile has them, else `put`.
    PutObject,
    Create,
    AppendFlush,
    Finalize,
    Get,
    List,
    Delete,
    /// Appendable API: create an object.
    AppendCreate,
    /// Appendable API: one append + flush.
    Append,
    /// Appendable API: finalize.
    AppendFinalize,
    /// Appendable API: take an object over.
    Takeover,
}

/// State shared between the store and the streams/uploads it hands out.
#[derive(Debug)]
struct Model {
    profile: LatencyProfile,
    rng: Mutex<fastrand::Rng>,
    outage: AtomicBool,
    ignore_conditions: AtomicBool,
    clock: ModelClock,
}

impl Model {
    /// Samples the delay for `op` moving `bytes` payload bytes, and whether it fails.
    fn plan(&self, op: Op, bytes: u64) -> (Duration, bool) {
        let p = &self.profile;
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let phases = p.put_phases;
        let mut delay = match (op, phases) {
            (Op::PutObject, Some(ph)) => {
                ph.create.sample(&mut rng)
                    + ph.append_flush.sample(&mut rng)
                    + ph.finalize.sample(&mut rng)
            }
            (Op::PutObject | Op::Put, _) => p.put.sample(&mut rng),
            (Op::Create, Some(ph)) => ph.create.sample(&mut rng),
            (Op::AppendFlush, Some(ph)) => ph.append_flush.sample(&mut rng),
            (Op::Finalize, Some(ph)) => ph.finalize.sample(&mut rng),
            // Without phases, a multipart upload costs a PUT per part only.
            (Op::Create | Op::Finalize, None) => Duration::ZERO,
            (Op::AppendFlush, None) => p.put.sample(&mut rng),
            (Op::Get, _) => p.get.sample(&mut rng),
            (Op::List, _) => p.list.sample(&mut rng),
            (Op::Delete, _) => p.delete.sample(&mut rng),
            (Op::AppendCreate, _) => p.append.map_or(p.put, |a| a.create).sample(&mut rng),
            (Op::Append, _) => p.append.map_or(p.put, |a| a.append_flush).sample(&mut rng),
            (Op::AppendFinalize, _) => p
                .append
                .map_or(OpLatency::ZERO, |a| a.finalize)
                .sample(&mut rng),
            (Op::Takeover, _) => p.append.map_or(p.get, |a| a.takeover).sample(&mut rng),
        };
        if p.bandwidth_bytes_per_sec > 0 && bytes > 0 {
            delay += Duration::from_secs_f64(bytes as f64 / p.bandwidth_bytes_per_sec as f64);
        }
        let fail = p.error_rate > 0.0 && rng.f64() < p.error_rate;
        (delay, fail)
    }

    /// A fair coin from the model's RNG (which way an injected append failure goes).
    fn coin(&self) -> bool {
        self.rng.lock().unwrap_or_else(|e| e.into_inner()).bool()
    }

    /// Sleeps for the sampled latency, then reports an injected failure if any.
    async fn gate(&self, op: Op, bytes: u64) -> object_store::Result<()> {
        let (delay, fail) = self.plan(op, bytes);
        self.clock.sleep(delay).await;
        self.check(fail)
    }

    fn check(&self, injected: bool) -> object_store::Result<()> {
        if self.outage.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "model",
                source: format!("simulated outage ({})", self.profile.name).into(),
            });
        }
        if injected {
            return Err(object_store::Error::Generic {
                store: "model",
                source: format!("simulated transient error ({})", self.profile.name).into(),
            });
        }
        Ok(())
    }
}

/// An [`ObjectStore`] wrapper that adds modelled latency, transient errors and outages.
#[derive(Debug)]
pub struct ModelStore {
    inner: Arc<dyn ObjectStore>,
    model: Arc<Model>,
}

impl ModelStore {
    /// Wraps `inner` with `profile`; `seed` makes the latency/error sequence reproducible.
    /// Waits on `tokio::time` ([`ModelClock::Tokio`]).
    pub fn new(
        inner: Arc<dyn ObjectStore>,
        profile: LatencyProfile,
        seed: u64,
    ) -> Result<ModelStore, StorageError> {
        ModelStore::with_clock(inner, profile, seed, ModelClock::Tokio)
    }

    /// As [`ModelStore::new`], waiting on `clock`.
    pub fn with_clock(
        inner: Arc<dyn ObjectStore>,
        profile: LatencyProfile,
        seed: u64,
        clock: ModelClock,
    ) -> Result<ModelStore, StorageError> {
        profile.validate()?;
        Ok(ModelStore {
            inner,
            model: Arc::new(Model {
                profile,
                rng: Mutex::new(fastrand::Rng::with_seed(seed)),
                outage: AtomicBool::new(false),
                ignore_conditions: AtomicBool::new(false),
                clock,
            }),
        })
    }

    /// The profile this store runs.
    pub fn profile(&self) -> &LatencyProfile {
        &self.model.profile
    }

    /// Starts (`true`) or ends (`false`) a simulated bucket outage: while set, every operation
    /// fails with a transient error after its latency.
    pub fn set_outage(&self, down: bool) {
        self.model.outage.store(down, Ordering::SeqCst);
    }

    /// Makes (`true`) the store ignore conditional writes, like an S3-compatible server that
    /// drops `If-None-Match` / `If-Match`: every put then overwrites. The startup probe
    /// ([`crate::probe`]) must refuse such a store.
    pub fn set_ignore_conditions(&self, ignore: bool) {
        self.model.ignore_conditions.store(ignore, Ordering::SeqCst);
    }

    /// Whether an outage is in effect.
    pub fn is_down(&self) -> bool {
        self.model.outage.load(Ordering::SeqCst)
    }
}

impl fmt::Display for ModelStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelStore({}, {})", self.model.profile.name, self.inner)
    }
}

fn range_len(r: &Range<u64>) -> u64 {
    r.end.saturating_sub(r.start)
}

/// A stream that waits for `op`'s latency and then yields `inner`, or a single error.
fn gated_stream<T: Send + 'static>(
    model: Arc<Model>,
    op: Op,
    inner: BoxStream<'static, object_store::Result<T>>,
) -> BoxStream<'static, object_store::Result<T>> {
    stream::once(async move {
        match model.gate(op, 0).await {
            Ok(()) => inner,
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        }
    })
    .flatten()
    .boxed()
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for ModelStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.model
            .gate(Op::PutObject, payload.content_length() as u64)
            .await?;
        let opts = if self.model.ignore_conditions.load(Ordering::SeqCst) {
            PutOptions {
                mode: object_store::PutMode::Overwrite,
                ..opts
            }
        } else {
            opts
        };
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.model.gate(Op::Create, 0).await?;
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(ModelUpload {
            upload,
            model: Arc::clone(&self.model),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.model.gate(Op::Get, 0).await?;
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        let bw = self.model.profile.bandwidth_bytes_per_sec;
        if !head && bw > 0 {
            // Transfer time, paid up front rather than while streaming: close enough for a model.
            let secs = range_len(&result.range) as f64 / bw as f64;
            self.model.clock.sleep(Duration::from_secs_f64(secs)).await;
        }
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let total = ranges.iter().map(range_len).sum();
        self.model.gate(Op::Get, total).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let model = Arc::clone(&self.model);
        let gated = locations
            .then(move |location| {
                let model = Arc::clone(&model);
                async move {
                    let location = location?;
                    model.gate(Op::Delete, 0).await?;
                    Ok(location)
                }
            })
            .boxed();
        self.inner.delete_stream(gated)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        gated_stream(Arc::clone(&self.model), Op::List, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        gated_stream(
            Arc::clone(&self.model),
            Op::List,
            self.inner.list_with_offset(prefix, offset),
        )
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.model.gate(Op::List, 0).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.model.gate(Op::Put, 0).await?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.model.gate(Op::Put, 0).await?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// Multipart upload under the model: each part pays append+flush (or a PUT) plus bandwidth,
/// completion pays finalize, abort pays a delete.
#[derive(Debug)]
struct ModelUpload {
    upload: Box<dyn MultipartUpload>,
    model: Arc<Model>,
}

#[async_trait]
impl MultipartUpload for ModelUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let (delay, fail) = self
            .model
            .plan(Op::AppendFlush, data.content_length() as u64);
        // Parts are ordered by call order, so the inner part must be started now.
        let put = self.upload.put_part(data);
        let model = Arc::clone(&self.model);
        Box::pin(async move {
            model.clock.sleep(delay).await;
            model.check(fail)?;
            put.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.model.gate(Op::Finalize, 0).await?;
        self.upload.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.model.gate(Op::Delete, 0).await?;
        self.upload.abort().await
    }
}
