//! Everything a seed chooses about the deployment: buckets, latencies, client mix, produce and
//! log settings, and the per-step fault probabilities.

use std::time::Duration;

use weir_produce::ProduceSettings;
use weir_storage::append::FenceKind;
use weir_storage::pool::PoolSettings;
use weir_storage::OpLatency;

use super::retention::GcScenario;
use super::sweep;
use crate::client::Kind;

/// Everything the seed chose about the deployment.
#[derive(Debug, Clone)]
pub(super) struct Scenario {
    pub(super) buckets: usize,
    pub(super) quorum: usize,
    pub(super) partitions: i32,
    pub(super) error_rate: f64,
    /// PUTs that land but report a timeout.
    pub(super) ambiguous_rate: f64,
    /// Create-only PUTs of the metadata bucket answered `AlreadyExists` without writing (drawn
    /// from its own generator, like `p_overlap`).
    pub(super) create_conflict_rate: f64,
    pub(super) put: OpLatency,
    pub(super) get: OpLatency,
    pub(super) produce: ProduceSettings,
    pub(super) log_inflight: usize,
    /// The ingest writer joins payloads, as the agent's does over in-process buckets, so the
    /// uploader copies each file into one buffer the buckets keep and the cache slices.
    pub(super) contiguous_payloads: bool,
    pub(super) snapshot_every: u64,
    pub(super) kinds: Vec<Kind>,
    /// Per-step fault probabilities.
    pub(super) p_crash: f64,
    pub(super) p_takeover: f64,
    pub(super) p_outage: f64,
    pub(super) p_slow: f64,
    pub(super) p_log_outage: f64,
    /// Per-step probability of two overlapping recoveries (drawn from its own generator, so
    /// the other faults of a seed stay where they were before this fault existed).
    pub(super) p_overlap: f64,
    /// Per-step probabilities of a held slot PUT and of a stalled recovery (see `loggc`).
    pub(super) p_held_put: f64,
    pub(super) p_stalled_recovery: f64,
    pub(super) p_send: f64,
    /// Retention, DeleteRecords, the deleter and the fetch plan TTL (drawn from their own
    /// generator).
    pub(super) gc: GcScenario,
    /// The orphan sweep (its own generator, as `gc`).
    pub(super) sweep: sweep::SweepScenario,
    /// Producer expiry and quiet producers (its own generator, as `gc`).
    pub(super) expiry: super::expiry::ExpiryScenario,
    /// Files appended into pooled objects instead of PUT (its own generator, as `gc`).
    pub(super) append: Option<AppendScenario>,
    /// The metadata log on an appendable bucket with pre-warmed slots (RFC 0004; its own
    /// generator).
    pub(super) log_append: Option<LogAppendScenario>,
    /// Compaction into a regional bucket (RFC 0005; its own generator).
    pub(super) compaction: Option<super::compaction::CompactionScenario>,
    /// Several agents, one leading the metadata log (RFC 0002; its own generator).
    pub(super) cluster: Option<super::cluster::ClusterScenario>,
}

/// The metadata bucket's fence kind and how many slots each writer pre-warms (0: none, but
/// empty slot objects are still written through takeovers).
#[derive(Debug, Clone, Copy)]
pub(super) struct LogAppendScenario {
    pub(super) fence: FenceKind,
    pub(super) prewarmed_slots: usize,
}

impl LogAppendScenario {
    /// Half the seeds.
    pub(super) fn pick(rng: &mut fastrand::Rng) -> Option<Self> {
        if rng.bool() {
            return None;
        }
        Some(LogAppendScenario {
            fence: [FenceKind::Generation, FenceKind::WriteOffset][rng.usize(..2)],
            prewarmed_slots: rng.usize(0..=8),
        })
    }

    pub(super) fn describe(this: &Option<Self>) -> String {
        match this {
            Some(a) => format!(
                "log on appendable slots ({:?} fence, {} pre-warmed)",
                a.fence, a.prewarmed_slots
            ),
            None => "log by create-only PUTs".to_string(),
        }
    }
}

/// The appendable ingest path: the double's fence kind and the WriterPool's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct AppendScenario {
    pub(super) fence: FenceKind,
    pub(super) pool: PoolSettings,
}

impl AppendScenario {
    /// Half the seeds append; `orphan_age` (the sweep's, if any) bounds the item age, as the
    /// agent's config validation does.
    pub(super) fn pick(rng: &mut fastrand::Rng, orphan_age: Option<Duration>) -> Option<Self> {
        if rng.bool() {
            return None;
        }
        let fence = [FenceKind::Generation, FenceKind::WriteOffset][rng.usize(..2)];
        let bound = orphan_age.map_or(2_000, |age| age.as_millis() as u64);
        let pool = PoolSettings {
            target_ready: rng.usize(0..=6),
            load_concurrency: rng.usize(1..=3),
            max_item_age: Duration::from_millis(rng.u64(bound / 4..bound)),
        };
        Some(AppendScenario { fence, pool })
    }

    pub(super) fn describe(this: &Option<Self>) -> String {
        match this {
            Some(a) => format!(
                "appends ({:?} fence, pool of {} ready, {} loading, age < {:?})",
                a.fence, a.pool.target_ready, a.pool.load_concurrency, a.pool.max_item_age
            ),
            None => "PUTs".to_string(),
        }
    }
}

/// The ack deadline of parallel-persistence seeds: short, so that slow and held PUTs miss it.
pub(super) const SIM_ACK_DEADLINE: Duration = Duration::from_secs(2);
/// The resolver's clock-skew margin: above the ±150 ms the sweep scenarios skew clocks by.
pub(super) const SIM_SKEW_MARGIN: Duration = Duration::from_secs(1);

impl Scenario {
    pub(super) fn pick(rng: &mut fastrand::Rng) -> Scenario {
        let (buckets, quorum) = [(1, 1), (3, 2), (3, 2), (2, 2)][rng.usize(..4)];
        let put_p50 = rng.u64(2..=12);
        let clients = rng.usize(2..=4);
        let kinds = (0..clients)
            .map(|i| {
                if i == 0 || rng.f64() < 0.6 {
                    Kind::Idempotent
                } else {
                    Kind::Plain
                }
            })
            .collect();
        let calm = rng.f64() < 0.25;
        let scale = if calm { 0.0 } else { 1.0 };
        Scenario {
            buckets,
            quorum,
            partitions: rng.i32(1..=4),
            error_rate: [0.0, 0.0, 0.01, 0.05][rng.usize(..4)],
            ambiguous_rate: [0.0, 0.01, 0.03][rng.usize(..3)],
            create_conflict_rate: 0.0,
            put: OpLatency::millis(put_p50, put_p50 * rng.u64(2..=6)),
            get: OpLatency::millis(1 + put_p50 / 3, put_p50 * 2),
            produce: {
                let flush_ms = rng.u64(1..=20);
                let max_file_bytes = [300, 2_000, 64 * 1024][rng.usize(..3)];
                ProduceSettings {
                    flush_interval: Duration::from_millis(flush_ms),
                    // From the draws above (a new draw would shift every later one and so
                    // every seed's scenario): half the seeds seal at a quarter of the largest
                    // file, half only at the largest.
                    target_file_bytes: if flush_ms % 2 == 0 {
                        max_file_bytes / 4
                    } else {
                        max_file_bytes
                    },
                    max_file_bytes,
                    max_inflight_uploads: rng.usize(1..=8),
                    // From the draws above: a third of the seeds let eager seals overlap.
                    eager_uploads: if flush_ms % 3 == 0 { 2 } else { 1 },
                    upload_attempts: rng.u32(1..=3),
                    queue_depth: 1024,
                    // From a draw above, as the target: half the seeds reserve offsets while
                    // files upload (RFC 0006). Clusters and appendable ingest commit after
                    // upload (see `run`).
                    parallel_persistence: put_p50 % 2 == 1,
                    ack_deadline: SIM_ACK_DEADLINE,
                    // The paused clock's timers are exact: nothing to compensate, and every
                    // seed seals as it did before the agent's timers were.
                    timer_lag: Duration::ZERO,
                }
            },
            log_inflight: rng.usize(1..=8),
            // From the draws above, as the others: half the seeds.
            contiguous_payloads: (put_p50 + clients as u64) % 2 == 0,
            snapshot_every: rng.u64(3..=40),
            kinds,
            p_crash: 0.004 * scale,
            p_takeover: 0.008 * scale,
            p_outage: 0.006 * scale,
            p_slow: 0.006 * scale,
            p_log_outage: 0.003 * scale,
            p_overlap: 0.002 * scale,
            p_held_put: 0.008 * scale,
            p_stalled_recovery: 0.006 * scale,
            p_send: 0.3 + rng.f64() * 0.6,
            gc: GcScenario::default(),
            sweep: sweep::SweepScenario::default(),
            expiry: super::expiry::ExpiryScenario::default(),
            append: None,
            log_append: None,
            compaction: None,
            cluster: None,
        }
    }

    pub(super) fn describe(&self) -> String {
        let idempotent = self
            .kinds
            .iter()
            .filter(|k| **k == Kind::Idempotent)
            .count();
        format!(
            "{} bucket(s) q{}, {} partition(s), {} idempotent + {} plain clients, put p50 {:?}, \
             errors {:.0}%, ambiguous {:.0}%, metadata create conflicts {:.0}%, file ≤{} B, flush {:?}, {} upload(s) and {} log write(s) in flight, \
             snapshot every {} slots{}; {}; {}; {}; files by {}{}; {}; {}; {}",
            self.buckets,
            self.quorum,
            self.partitions,
            idempotent,
            self.kinds.len() - idempotent,
            self.put.p50,
            self.error_rate * 100.0,
            self.ambiguous_rate * 100.0,
            self.create_conflict_rate * 100.0,
            self.produce.max_file_bytes,
            self.produce.flush_interval,
            self.produce.max_inflight_uploads,
            self.log_inflight,
            self.snapshot_every,
            if self.p_crash == 0.0 {
                ", no process faults"
            } else {
                ""
            },
            self.gc.describe(),
            self.sweep.describe(),
            self.expiry.describe(),
            AppendScenario::describe(&self.append),
            if self.produce.parallel_persistence {
                ", reserved while they upload"
            } else {
                ""
            },
            LogAppendScenario::describe(&self.log_append),
            super::compaction::CompactionScenario::describe(&self.compaction),
            super::cluster::ClusterScenario::describe(&self.cluster),
        )
    }
}
