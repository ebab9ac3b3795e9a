//! Moving log starts and deleting files: the topic's `retention.ms` / `retention.bytes`,
//! retention passes on the simulated clock, DeleteRecords at random offsets (valid or not), and
//! each incarnation's file deleter with a grace the fetch plan TTL and read deadline fit in.
//!
//! Everything here draws from the world's `gc_rng`, so the seed's older fault schedules stay
//! where they were. A slow metadata bucket keeps log slots in flight past the deleter's grace.
//! A data bucket whose PUTs lag holds the quorum writer's background copy of a file until after
//! the deleter's delete (a late copy).

use std::collections::BTreeMap;

use weir_control::entry::{LogStartCause, LogStartMove};
use weir_control::gc::{DeleterSettings, FileDeleter};
use weir_control::maintenance::{apply_retention, RetentionDefaults};

use super::*;

/// What one seed chose about retention and deletion.
#[derive(Debug, Clone, Default)]
pub(super) struct GcScenario {
    pub(super) retention_ms: Option<i64>,
    pub(super) retention_bytes: Option<i64>,
    /// Released file → delete.
    pub(super) grace: Duration,
    pub(super) deleter_interval: Duration,
    /// Oldest plan a fetch reads, and the overall deadline of each of its storage reads:
    /// `grace ≥ 2 × (plan_ttl + read_timeout)`, as the configuration requires.
    pub(super) plan_ttl: Duration,
    pub(super) read_timeout: Duration,
    /// Fetches read through a cache of their own with no room (every read goes to a bucket)
    /// instead of the pipeline's write-through cache.
    pub(super) uncached_reads: bool,
    /// Of the uncached seeds, those with the larger fetch limit read through a cache of their
    /// own that the pipeline does not write through, with read-ahead: every range is cold,
    /// read-ahead loads the next ones, and fetches join its GETs in flight (no draw of its own,
    /// so the other seeds keep their scenarios).
    pub(super) cold_read_ahead: bool,
    /// A fetch's byte limit: small with uncached reads, where every file of a plan is a GET
    /// and one failed GET fails the whole read (at 5 % errors a plan over dozens of files
    /// would almost never be read).
    pub(super) fetch_max_bytes: usize,
    /// Per-step probabilities: a retention pass, a DeleteRecords, a consumer holding its plan.
    pub(super) p_retention: f64,
    pub(super) p_delete_records: f64,
    pub(super) p_hold_plan: f64,
    /// Per-step probability that the metadata bucket turns slow (or fast again): log slots stay
    /// in flight longer than the deleter's grace, so a deleter acting on entries that are not
    /// durable yet would be seen.
    pub(super) p_slow_log: f64,
    /// Per-step probability that a data bucket's PUTs start (or stop) lagging by 2–8 s (only
    /// with more buckets than the quorum): late copies.
    pub(super) p_put_lag: f64,
    /// Per-step probability that a consumer stops reading for 0.3–2 s, then reads on from where
    /// it was: near the log start, where retention releases files under its plans.
    pub(super) p_pause_consumer: f64,
}

impl GcScenario {
    pub(super) fn pick(rng: &mut fastrand::Rng) -> GcScenario {
        let limits = rng.usize(..4);
        let grace = Duration::from_millis(rng.u64(500..=3_000));
        let fifth = grace / 5;
        let uncached_reads = rng.f64() < 0.75;
        let fetch_max_bytes = if uncached_reads {
            [512, 2_048][rng.usize(..2)]
        } else {
            16 * 1024
        };
        GcScenario {
            // Half of the time-limited seeds keep under a second: batches are dropped while
            // consumers still hold plans that name them.
            retention_ms: (limits & 1 != 0).then(|| {
                if rng.bool() {
                    rng.i64(200..=1_000)
                } else {
                    rng.i64(1_000..=5_000)
                }
            }),
            retention_bytes: (limits & 2 != 0).then(|| rng.i64(300..=8_000)),
            grace,
            deleter_interval: Duration::from_millis(rng.u64(20..=150)),
            plan_ttl: fifth,
            read_timeout: fifth,
            uncached_reads,
            cold_read_ahead: uncached_reads && fetch_max_bytes == 2_048,
            fetch_max_bytes,
            p_retention: [0.02, 0.05, 0.1][rng.usize(..3)],
            p_delete_records: [0.0, 0.005, 0.02][rng.usize(..3)],
            p_hold_plan: [0.1, 0.3, 0.6][rng.usize(..3)],
            p_slow_log: [0.0, 0.003, 0.008][rng.usize(..3)],
            p_put_lag: [0.0, 0.004, 0.01][rng.usize(..3)],
            p_pause_consumer: [0.0, 0.005, 0.01][rng.usize(..3)],
        }
    }

    /// The simulated topic's configs.
    pub(super) fn topic_configs(&self) -> BTreeMap<String, String> {
        let mut configs = BTreeMap::new();
        if let Some(ms) = self.retention_ms {
            configs.insert("retention.ms".to_string(), ms.to_string());
        }
        if let Some(bytes) = self.retention_bytes {
            configs.insert("retention.bytes".to_string(), bytes.to_string());
        }
        configs
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "retention.ms {:?}, retention.bytes {:?}, DeleteRecords {:.1}%, grace {:?}, plan TTL \
             {:?}, {} reads, plans held {:.0}%",
            self.retention_ms,
            self.retention_bytes,
            self.p_delete_records * 100.0,
            self.grace,
            self.plan_ttl,
            if self.cold_read_ahead {
                "cold read-ahead"
            } else if self.uncached_reads {
                "uncached"
            } else {
                "cached"
            },
            self.p_hold_plan * 100.0,
        )
    }
}

impl World {
    /// Per step of the fault phase: maybe a retention pass, maybe a DeleteRecords, both through
    /// the newest live incarnation (spawned: a log outage must not stall the world).
    pub(super) fn inject_gc(&mut self) {
        let gc = self.scenario.gc.clone();
        let retention = self.gc_rng.f64() < gc.p_retention;
        let delete_records = self.gc_rng.f64() < gc.p_delete_records;
        let calm = self.scenario.p_crash == 0.0;
        // Turned slow only once something was acknowledged: a seed whose first open waits out
        // a metadata outage and then a slow bucket would prove nothing.
        let slow_log = self.gc_rng.f64() < gc.p_slow_log;
        let is_slow = self.log_bucket.faults.slow_ms.load(Ordering::SeqCst) > 0;
        if slow_log && !calm && (is_slow || self.report.acked_batches > 0) {
            let faults = &self.log_bucket.faults;
            let slow = if !is_slow {
                self.report.slow_logs += 1;
                self.gc_rng.u64(300..=2_000)
            } else {
                0
            };
            faults.slow_ms.store(slow, Ordering::SeqCst);
            self.event(&format!("log bucket slow={slow}ms"));
        }
        let lag = self.gc_rng.f64() < gc.p_put_lag;
        if lag && self.scenario.buckets > self.scenario.quorum {
            let index = self.gc_rng.usize(..self.buckets.len());
            let faults = &self.buckets[index].faults;
            let lag = if faults.put_lag_ms.load(Ordering::SeqCst) == 0 {
                self.report.put_lags += 1;
                self.gc_rng.u64(2_000..=8_000)
            } else {
                0
            };
            faults.put_lag_ms.store(lag, Ordering::SeqCst);
            self.event(&format!("bucket {index} put lag={lag}ms"));
        }
        if self.gc_rng.f64() < gc.p_pause_consumer {
            let partition = self.gc_rng.usize(..self.consumers.len());
            let pause = Duration::from_millis(self.gc_rng.u64(300..=2_000));
            self.consumers[partition].paused_until = Some(tokio::time::Instant::now() + pause);
            self.report.consumer_pauses += 1;
            self.event(&format!("p{partition}: consumer pauses {pause:?}"));
        }
        let (Some(newest), Some(topic)) = (self.newest_live(), self.topic) else {
            return;
        };
        let control = self.incarnations[newest].control.clone();
        if retention {
            self.report.retention_ticks += 1;
            let now_ms = self.clock.now_ms();
            let defaults = RetentionDefaults { ms: -1, bytes: -1 };
            let control = control.clone();
            tokio::spawn(async move { apply_retention(&control, now_ms, defaults).await });
        }
        if delete_records {
            self.delete_records(control, topic);
        }
    }

    /// A DeleteRecords for some partitions: to the high watermark (-1), above it, below the
    /// start, or anywhere in between. Invalid offsets must be refused, valid ones move the start.
    fn delete_records(&mut self, control: ControlPlane, topic: TopicId) {
        let bounds: Vec<(i64, i64)> = control.read(|state| {
            (0..self.scenario.partitions)
                .map(|partition| {
                    state
                        .partition(&topic, partition)
                        .map_or((0, 0), |p| (p.log_start_offset, p.high_watermark))
                })
                .collect()
        });
        let mut partitions = Vec::new();
        for (partition, (start, high_watermark)) in bounds.into_iter().enumerate() {
            if self.gc_rng.bool() && partition > 0 {
                continue;
            }
            let offset = match self.gc_rng.usize(..5) {
                0 => -1,
                1 => high_watermark + self.gc_rng.i64(1..=20),
                2 => start - self.gc_rng.i64(1..=20),
                _ => self.gc_rng.i64(start..=high_watermark),
            };
            partitions.push(LogStartMove {
                partition: partition as i32,
                offset,
            });
        }
        self.report.delete_records += 1;
        self.event(&format!("DeleteRecords {partitions:?}"));
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let entry = Entry::AdvanceLogStart {
                topic_id: topic,
                partitions,
                cause: LogStartCause::DeleteRecords,
            };
            let note = match control.submit(entry).await {
                Ok(EntryResult::AdvanceLogStart(results)) => format!("DeleteRecords: {results:?}"),
                Ok(other) => format!("DeleteRecords: unexpected {other:?}"),
                Err(err) => format!("DeleteRecords failed: {err}"),
            };
            let _ = tx.send(Msg::Note(note));
        });
    }

    /// Starts an incarnation's file deleter over its own view of the data buckets; the returned
    /// sender stops it when dropped.
    pub(super) fn start_deleter(
        &self,
        control: ControlPlane,
        stores: Vec<Arc<dyn ObjectStore>>,
        regional: Vec<Arc<dyn ObjectStore>>,
    ) -> tokio::sync::watch::Sender<bool> {
        let settings = DeleterSettings {
            grace: self.scenario.gc.grace,
            interval: self.scenario.gc.deleter_interval,
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(
            FileDeleter::new(control, stores, settings)
                .with_regional(regional)
                .run(stopped),
        );
        stop
    }
}
