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

pub use clock::ModelClock;

/// z-score of the 99th percentile of the standard normal distribution.
const Z_P99: f64 = 2.326;

/// The names accepted by [`LatencyProfile::named`].
pub const PROFILE_NAMES: &[&str] = &[
    "local",
    "s3-standard",
    "s3-express",
    "gcs-regional",
    "gcs-rapid",
    "azure-premium",
];

/// Latency of one operation kind: a log-normal distribution with the given median and p99.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpLatency {
    /// Median latency.
    pub p50: Duration,
    /// 99th-percentile latency (must be ≥ `p50`).
    pub p99: Duration,
}

impl OpLatency {
    /// No latency.
    pub const ZERO: OpLatency = OpLatency {
        p50: Duration::ZERO,
        p99: Duration::ZERO,
    };

    /// Latency with p50 and p99 given in microseconds.
    pub const fn micros(p50: u64, p99: u64) -> OpLatency {
        OpLatency {
            p50: Duration::from_micros(p50),
            p99: Duration::from_micros(p99),
        }
    }

    /// Latency with p50 and p99 given in milliseconds.
    pub const fn millis(p50: u64, p99: u64) -> OpLatency {
        OpLatency::micros(p50 * 1000, p99 * 1000)
    }

    /// Whether this always samples zero.
    pub fn is_zero(&self) -> bool {
        self.p50.is_zero()
    }

    /// Draws one latency: `p50 · exp(σ·z)` with `σ = ln(p99/p50) / 2.326`, `z ~ N(0, 1)`.
    /// Capped at 10 × p99 so a single draw cannot stall a simulation.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        if self.p50.is_zero() {
            return Duration::ZERO;
        }
        let p50 = self.p50.as_secs_f64();
        let p99 = self.p99.as_secs_f64().max(p50);
        let sigma = (p99 / p50).ln() / Z_P99;
        let secs = (p50 * (sigma * standard_normal(rng)).exp()).min(10.0 * p99);
        Duration::from_secs_f64(secs)
    }
}

/// Box–Muller draw from N(0, 1).
fn standard_normal(rng: &mut fastrand::Rng) -> f64 {
    let u1 = 1.0 - rng.f64(); // (0, 1]: ln is finite
    let u2 = rng.f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Costs of a write on an appendable backend (GCS Rapid), kept apart so a writer pool can skip
/// the metadata round trips on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PutPhases {
    /// Creating (opening) the object: a metadata operation.
    pub create: OpLatency,
    /// Appending data and flushing it (durable, readable), excluding the bandwidth term.
    pub append_flush: OpLatency,
    /// Finalizing (sealing) the object: a metadata operation.
    pub finalize: OpLatency,
}

/// Costs of the appendable-object API ([`crate::append`]), kept apart so the pooled path pays
/// only `append_flush` on the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppendCosts {
    /// Creating an unfinalized object and making it usable (its first, empty flush).
    pub create: OpLatency,
    /// One append and flush into an open object, excluding the bandwidth term.
    pub append_flush: OpLatency,
    /// Finalizing an object.
    pub finalize: OpLatency,
    /// Taking an object over (learning its size and fencing the previous writer).
    pub takeover: OpLatency,
}

/// A named latency/fault profile of an object storage backend.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyProfile {
    /// Profile name; benchmarks report it.
    pub name: String,
    /// Whole-object PUT (also copy and rename), excluding the bandwidth term.
    pub put: OpLatency,
    /// When set, a whole-object PUT costs `create + append_flush + finalize` instead of `put`,
    /// and multipart uploads map to create / append+flush per part / finalize on complete.
    pub put_phases: Option<PutPhases>,
    /// Costs of the appendable-object API; `None` on backends without one (appends to the
    /// in-memory double then cost a PUT each and takeovers a GET).
    pub append: Option<AppendCosts>,
    /// GET and HEAD, to first byte.
    pub get: OpLatency,
    /// LIST (per call).
    pub list: OpLatency,
    /// DELETE (per object).
    pub delete: OpLatency,
    /// Per-request transfer rate for payload bytes; 0 means unlimited.
    pub bandwidth_bytes_per_sec: u64,
    /// Probability in `[0, 1]` that an operation fails with a transient error after its latency.
    pub error_rate: f64,
}

const MB: u64 = 1_000_000;

impl LatencyProfile {
    /// A profile with no latency and no errors.
    pub fn local() -> LatencyProfile {
        LatencyProfile {
            name: "local".to_string(),
            put: OpLatency::ZERO,
            put_phases: None,
            append: None,
            get: OpLatency::ZERO,
            list: OpLatency::ZERO,
            delete: OpLatency::ZERO,
            bandwidth_bytes_per_sec: 0,
            error_rate: 0.0,
        }
    }

    /// The built-in profile called `name` (see [`PROFILE_NAMES`]).
    ///
    /// Numbers are order-of-magnitude planning figures for small (≤ a few MiB) objects from a VM
    /// in the same region, not measurements of ours; each carries its source or assumption.
    pub fn named(name: &str) -> Option<LatencyProfile> {
        let p = match name {
            "local" => LatencyProfile::local(),
            "s3-standard" => LatencyProfile {
                name: name.to_string(),
                // Assumption: commonly reported small-object S3 PUT latency ~30–60 ms, long tail.
                put: OpLatency::millis(45, 150),
                put_phases: None,
                append: None,
                // AWS S3 performance guide: small-object first-byte latency tens of ms, p99 ~100 ms.
                get: OpLatency::millis(25, 90),
                // Assumption: LIST is a metadata read like GET, slightly slower.
                list: OpLatency::millis(30, 100),
                // Assumption: DELETE costs about a GET.
                delete: OpLatency::millis(25, 90),
                // AWS S3 performance guide: ~85–90 MB/s per request stream.
                bandwidth_bytes_per_sec: 90 * MB,
                error_rate: 0.0,
            },
            "s3-express" => LatencyProfile {
                name: name.to_string(),
                // AWS: S3 Express One Zone offers "single-digit millisecond" PUT latency.
                put: OpLatency::millis(6, 15),
                put_phases: None,
                append: Some(AppendCosts {
                    // Creating an appendable object is a zero-byte PUT.
                    create: OpLatency::millis(6, 15),
                    // AWS: appends are PutObject requests with a write offset; assumption: they
                    // cost what a PUT of the same size costs.
                    append_flush: OpLatency::millis(6, 15),
                    // S3 Express has no finalize: an object is complete after every append.
                    finalize: OpLatency::ZERO,
                    // A takeover is a HEAD for the size (the write offset fences).
                    takeover: OpLatency::millis(3, 8),
                }),
                // AWS: single-digit ms first byte; reads are cheaper than writes.
                get: OpLatency::millis(3, 8),
                // Assumption: LIST/DELETE about like GET.
                list: OpLatency::millis(4, 10),
                delete: OpLatency::millis(3, 8),
                // Assumption: higher per-stream throughput than standard S3.
                bandwidth_bytes_per_sec: 200 * MB,
                error_rate: 0.0,
            },
            "gcs-regional" => LatencyProfile {
                name: name.to_string(),
                // Seed 000 (WarpStream): create+write+close of a few hundred KiB took 80–100 ms.
                put: OpLatency::millis(80, 200),
                put_phases: None,
                append: None,
                // Assumption: regional GCS first-byte latency a few tens of ms.
                get: OpLatency::millis(35, 120),
                // Assumption: LIST/DELETE about like GET.
                list: OpLatency::millis(40, 130),
                delete: OpLatency::millis(35, 120),
                // Assumption: ~100 MB/s per request stream.
                bandwidth_bytes_per_sec: 100 * MB,
                error_rate: 0.0,
            },
            "gcs-rapid" => LatencyProfile {
                name: name.to_string(),
                // Copy/rename are metadata operations: costed like one create (see below).
                put: OpLatency::millis(75, 110),
                // Seed 000 measured three things: create + write + finalize of a few hundred
                // KiB, 80–100 ms; the same without finalizing but with the create paid lazily at
                // the first write, still 80–100 ms; write + flush into a pre-created, flushed
                // writer, 2–3 ms (6–9 ms before GCP's backend fix). So the create alone is
                // ~75–95 ms and the finalize small next to it. (GCP's remark that dropping one of
                // the two metadata operations "should be about half" was a prediction the
                // measurements do not bear out.)
                put_phases: Some(PutPhases {
                    create: OpLatency::millis(75, 110),
                    append_flush: OpLatency::micros(2_000, 5_000),
                    finalize: OpLatency::millis(10, 30),
                }),
                append: Some(AppendCosts {
                    create: OpLatency::millis(75, 110),
                    append_flush: OpLatency::micros(2_000, 5_000),
                    finalize: OpLatency::millis(10, 30),
                    // Assumption: reopening an object at its generation opens a write stream
                    // and looks the object up, like a create.
                    takeover: OpLatency::millis(75, 110),
                }),
                // Assumption: zonal Rapid reads are low single-digit ms.
                get: OpLatency::millis(2, 6),
                // Assumption: LIST/DELETE about like GET.
                list: OpLatency::millis(3, 8),
                delete: OpLatency::millis(2, 6),
                // Seed 000: 1 MiB pooled flush p50 20 ms incl. compression → ≥ 60 MB/s; assume 100.
                bandwidth_bytes_per_sec: 100 * MB,
                error_rate: 0.0,
            },
            "azure-premium" => LatencyProfile {
                name: name.to_string(),
                // Assumption: Azure premium block blob (SSD) small writes ~single-digit ms.
                put: OpLatency::millis(8, 25),
                put_phases: None,
                append: None,
                // Assumption: premium reads a few ms.
                get: OpLatency::millis(5, 15),
                // Assumption: LIST/DELETE about like GET.
                list: OpLatency::millis(6, 18),
                delete: OpLatency::millis(5, 15),
                // Assumption: ~100 MB/s per request stream.
                bandwidth_bytes_per_sec: 100 * MB,
                error_rate: 0.0,
            },
            _ => return None,
        };
        Some(p)
    }

    /// A profile that adds exactly `delay` to every operation (PUT, each multipart part, GET,
    /// HEAD, LIST, DELETE, copy, rename) and nothing else. Stacked over another [`ModelStore`],
    /// it makes that bucket persistently slow by `delay`.
    pub fn constant(name: &str, delay: Duration) -> LatencyProfile {
        let fixed = OpLatency {
            p50: delay,
            p99: delay,
        };
        LatencyProfile {
            name: name.to_string(),
            put: fixed,
            put_phases: None,
            append: None,
            get: fixed,
            list: fixed,
            delete: fixed,
            bandwidth_bytes_per_sec: 0,
            error_rate: 0.0,
        }
    }

    /// Returns the profile with `error_rate` replaced.
    pub fn with_error_rate(mut self, error_rate: f64) -> LatencyProfile {
        self.error_rate = error_rate;
        self
    }

    /// Whether the profile adds neither latency nor errors (wrapping would be a no-op).
    pub fn is_zero(&self) -> bool {
        let phases_zero = self
            .put_phases
            .is_none_or(|p| p.create.is_zero() && p.append_flush.is_zero() && p.finalize.is_zero());
        let append_zero = self.append.is_none_or(|a| {
            a.create.is_zero()
                && a.append_flush.is_zero()
                && a.finalize.is_zero()
                && a.takeover.is_zero()
        });
        self.put.is_zero()
            && phases_zero
            && append_zero
            && self.get.is_zero()
            && self.list.is_zero()
            && self.delete.is_zero()
            && self.bandwidth_bytes_per_sec == 0
            && self.error_rate == 0.0
    }

    /// Checks `error_rate ∈ [0, 1]` and `p50 ≤ p99` everywhere.
    pub fn validate(&self) -> Result<(), StorageError> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(StorageError::InvalidConfig(format!(
                "profile {}: error_rate {} not in [0, 1]",
                self.name, self.error_rate
            )));
        }
        let mut ops = vec![
            ("put", self.put),
            ("get", self.get),
            ("list", self.list),
            ("delete", self.delete),
        ];
        if let Some(p) = self.put_phases {
            ops.extend([
                ("create", p.create),
                ("append_flush", p.append_flush),
                ("finalize", p.finalize),
            ]);
        }
        if let Some(a) = self.append {
            ops.extend([
                ("append.create", a.create),
                ("append.append_flush", a.append_flush),
                ("append.finalize", a.finalize),
                ("append.takeover", a.takeover),
            ]);
        }
        for (op, l) in ops {
            if l.p99 < l.p50 {
                return Err(StorageError::InvalidConfig(format!(
                    "profile {}: {op} p99 {:?} < p50 {:?}",
                    self.name, l.p99, l.p50
                )));
            }
        }
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    use super::*;

    fn mem() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    #[test]
    fn test_model_sampling_p50_and_p99_roughly_right() {
        let lat = OpLatency::millis(45, 150);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut samples: Vec<Duration> = (0..20_000).map(|_| lat.sample(&mut rng)).collect();
        samples.sort();
        let p50 = samples[samples.len() / 2].as_secs_f64() * 1000.0;
        let p99 = samples[samples.len() * 99 / 100].as_secs_f64() * 1000.0;
        assert!((42.0..48.0).contains(&p50), "p50 {p50} ms");
        assert!((130.0..170.0).contains(&p99), "p99 {p99} ms");
    }

    #[test]
    fn test_model_sampling_is_deterministic_per_seed() {
        let lat = OpLatency::millis(6, 15);
        let draw = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..10).map(|_| lat.sample(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(OpLatency::ZERO
            .sample(&mut fastrand::Rng::with_seed(1))
            .is_zero());
    }

    #[test]
    fn test_model_named_profiles_valid() {
        for name in PROFILE_NAMES {
            let p = LatencyProfile::named(name).unwrap();
            assert_eq!(p.name, *name);
            p.validate().unwrap();
            assert_eq!(p.is_zero(), *name == "local");
        }
        assert!(LatencyProfile::named("nope").is_none());
        assert!(LatencyProfile::local()
            .with_error_rate(1.5)
            .validate()
            .is_err());
    }

    #[test]
    fn test_model_maybe_wrap_local_is_identity() {
        let inner = mem();
        let wrapped = maybe_wrap(Arc::clone(&inner), "local", 1).unwrap();
        assert!(Arc::ptr_eq(&inner, &wrapped));
        let wrapped = maybe_wrap(Arc::clone(&inner), "s3-express", 1).unwrap();
        assert!(!Arc::ptr_eq(&inner, &wrapped));
        assert!(wrapped.to_string().starts_with("ModelStore(s3-express"));
        assert!(matches!(
            maybe_wrap(inner, "bogus", 1),
            Err(StorageError::InvalidConfig(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_put_pays_latency_and_bandwidth() {
        let mut profile = LatencyProfile::local();
        profile.name = "fixed".into();
        profile.put = OpLatency::millis(10, 10);
        profile.bandwidth_bytes_per_sec = 1_000_000;
        let store = ModelStore::new(mem(), profile, 1).unwrap();
        let start = tokio::time::Instant::now();
        store
            .put(&Path::from("a"), PutPayload::from(vec![0u8; 100_000]))
            .await
            .unwrap();
        // 10 ms base + 100 kB at 1 MB/s = 110 ms (σ = 0 when p50 == p99).
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(109) && took <= Duration::from_millis(111),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_constant_profile_stacks_on_another_model() {
        let inner: Arc<dyn ObjectStore> = Arc::new(
            ModelStore::new(
                mem(),
                LatencyProfile::constant("base", Duration::from_millis(5)),
                1,
            )
            .unwrap(),
        );
        let slow = ModelStore::new(
            inner,
            LatencyProfile::constant("slow", Duration::from_secs(2)),
            2,
        )
        .unwrap();
        let key = Path::from("a");
        let start = tokio::time::Instant::now();
        slow.put(&key, PutPayload::from_static(b"xy"))
            .await
            .unwrap();
        let put = start.elapsed();
        assert!(
            put >= Duration::from_millis(2_004) && put <= Duration::from_millis(2_006),
            "{put:?}"
        );
        let start = tokio::time::Instant::now();
        assert_eq!(&slow.get_range(&key, 0..1).await.unwrap()[..], b"x");
        let get = start.elapsed();
        assert!(
            get >= Duration::from_millis(2_004) && get <= Duration::from_millis(2_006),
            "{get:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_gcs_rapid_put_sums_phases() {
        let store = ModelStore::new(mem(), LatencyProfile::named("gcs-rapid").unwrap(), 3).unwrap();
        let start = tokio::time::Instant::now();
        store
            .put(&Path::from("a"), PutPayload::from_static(b"x"))
            .await
            .unwrap();
        let took = start.elapsed();
        // create + append + finalize ≈ 87 ms; certainly above one append and below 10 × p99s.
        assert!(took > Duration::from_millis(40), "{took:?}");
        assert!(took < Duration::from_millis(1_800), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_outage_and_error_rate() {
        let store =
            ModelStore::new(mem(), LatencyProfile::named("s3-express").unwrap(), 5).unwrap();
        let key = Path::from("k");
        store
            .put(&key, PutPayload::from_static(b"v"))
            .await
            .unwrap();
        store.set_outage(true);
        assert!(store.is_down());
        let err = store.get(&key).await.unwrap_err();
        assert!(matches!(
            err,
            object_store::Error::Generic { store: "model", .. }
        ));
        assert!(StorageError::from(err).is_retryable());
        let listed: Vec<_> = store.list(None).collect().await;
        assert!(listed.len() == 1 && listed[0].is_err());
        store.set_outage(false);
        assert_eq!(
            &store.get(&key).await.unwrap().bytes().await.unwrap()[..],
            b"v"
        );

        let always = LatencyProfile::named("s3-express")
            .unwrap()
            .with_error_rate(1.0);
        let store = ModelStore::new(mem(), always, 5).unwrap();
        assert!(store
            .put(&key, PutPayload::from_static(b"v"))
            .await
            .is_err());
        // the failed put did not reach the inner store
        assert!(store.inner.head(&key).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_multipart_and_delete_pass_through() {
        let store = ModelStore::new(mem(), LatencyProfile::named("gcs-rapid").unwrap(), 9).unwrap();
        let key = Path::from("mp");
        let mut up = store.put_multipart(&key).await.unwrap();
        up.put_part(PutPayload::from_static(b"ab")).await.unwrap();
        up.put_part(PutPayload::from_static(b"cd")).await.unwrap();
        up.complete().await.unwrap();
        assert_eq!(
            &store.get(&key).await.unwrap().bytes().await.unwrap()[..],
            b"abcd"
        );
        assert_eq!(&store.get_range(&key, 1..3).await.unwrap()[..], b"bc");
        store.delete(&key).await.unwrap();
        assert!(store.head(&key).await.is_err());
    }
}
