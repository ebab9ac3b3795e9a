//! Named latency/fault profiles: per-operation log-normal latencies fitted to a p50 and a p99,
//! a bandwidth term and an error rate, with the source or assumption behind each number.

use std::time::Duration;

use crate::StorageError;

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
