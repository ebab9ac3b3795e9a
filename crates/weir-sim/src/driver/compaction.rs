//! Compaction in the simulation (RFC 0005): per agent a planner and workers over the agent's
//! gated buckets, a regional bucket with outages, and the job queue in the metadata bucket.
//!
//! The faults come from the rest of the world: an agent killed (its gates halt) stops its
//! workers mid-job at any point — before the output PUT, after it, after the swap and before
//! the ack — and its broker between its write and its answers; a deposed agent's planner and
//! workers keep running against a log it can no longer write; short leases hand a slow job to a
//! second worker while the first still runs. This module adds outages of the regional bucket.
//! The auditor reads compacted files from the regional bucket and checks its DELETEs like the
//! ingest buckets'.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use weir_compactor::{Compactor, Settings as CompactorSettings};
use weir_objq::cas::ObjectStoreCas;
use weir_objq::{LocalNetwork, Member, Network, Request, Response, Unreachable};

use super::agents::layered;
use super::*;
use weir_storage::keys;

/// What a seed chose about compaction.
#[derive(Debug, Clone, Copy)]
pub(super) struct CompactionScenario {
    pub(super) settings: CompactorSettings,
    pub(super) queue: weir_objq::Settings,
    pub(super) workers: usize,
    /// Per-step probability that the regional bucket goes down for a while.
    pub(super) p_outage: f64,
    /// Fraction of heartbeats lost on the way to the broker: a job whose heartbeats are lost
    /// for a lease is handed to a second worker while the first still runs it.
    pub(super) heartbeat_loss: f64,
}

impl CompactionScenario {
    /// Half the seeds compact.
    pub(super) fn pick(rng: &mut fastrand::Rng) -> Option<Self> {
        if rng.bool() {
            return None;
        }
        let lease = Duration::from_millis(rng.u64(80..=600));
        let mut settings = CompactorSettings {
            target_file_bytes: rng.u64(1_000..=64_000),
            max_inputs: rng.usize(2..=20),
            min_input_age: Duration::from_millis(rng.u64(0..=300)),
            max_input_age: Duration::from_millis(rng.u64(300..=1_500)),
            plan_interval: Duration::from_millis(rng.u64(30..=200)),
            poll_interval: Duration::from_millis(rng.u64(10..=100)),
            replan_after: lease * 4,
            job_lease: lease,
            max_run_bytes: u32::MAX,
            multipart_threshold: u64::MAX,
        };
        let queue = weir_objq::Settings {
            lease,
            broker_timeout: Duration::from_millis(rng.u64(100..=500)),
            max_jobs: rng.usize(4..=64),
            write_retry: Duration::from_millis(20),
            inbox: 256,
            recheck: Duration::from_millis(rng.u64(200..=2_000)),
        };
        let workers = rng.usize(1..=2);
        let p_outage = [0.0, 0.004, 0.01][rng.usize(..3)];
        let heartbeat_loss = [0.0, 0.5, 0.95][rng.usize(..3)];
        // Runs from one batch each to unbounded (drawn last: earlier draws keep their seeds).
        settings.max_run_bytes = [1, 300, 2_000, u32::MAX][rng.usize(..4)];
        // Outputs by one PUT or by multipart upload.
        settings.multipart_threshold = [0, u64::MAX][rng.usize(..2)];
        Some(CompactionScenario {
            settings,
            queue,
            workers,
            p_outage,
            heartbeat_loss,
        })
    }

    pub(super) fn describe(this: &Option<Self>) -> String {
        match this {
            Some(c) => format!(
                "compaction ({} worker(s), jobs ≤{} B / {} files, runs ≤{} B, {}, age \
                 {:?}..{:?}, lease {:?}, {:.0}% heartbeats lost, regional outages {:.1}%)",
                c.workers,
                c.settings.target_file_bytes,
                c.settings.max_inputs,
                c.settings.max_run_bytes,
                if c.settings.multipart_threshold == 0 {
                    "multipart outputs"
                } else {
                    "outputs by one PUT"
                },
                c.settings.min_input_age,
                c.settings.max_input_age,
                c.settings.job_lease,
                c.heartbeat_loss * 100.0,
                c.p_outage * 100.0
            ),
            None => "no compaction".to_string(),
        }
    }
}

/// The queue's network as one agent process sees it: nothing goes out once it is killed, and
/// a seeded share of its heartbeats is lost.
#[derive(Debug)]
struct AgentNetwork {
    inner: Arc<LocalNetwork>,
    halted: Arc<AtomicBool>,
    heartbeat_loss: f64,
    rng: std::sync::Mutex<fastrand::Rng>,
}

#[async_trait]
impl Network for AgentNetwork {
    async fn call(&self, address: &str, request: Request) -> Result<Response, Unreachable> {
        if self.halted.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if matches!(request, Request::Heartbeat { .. }) {
            let lost =
                self.rng.lock().unwrap_or_else(|e| e.into_inner()).f64() < self.heartbeat_loss;
            if lost {
                return Err(Unreachable {
                    address: address.to_string(),
                    reason: "heartbeat lost (simulated)".to_string(),
                });
            }
        }
        self.inner.call(address, request).await
    }

    fn listen(&self, address: &str) -> mpsc::Receiver<weir_objq::broker::Envelope> {
        self.inner.listen(address)
    }

    fn close(&self, address: &str) {
        self.inner.close(address)
    }
}

impl World {
    /// The regional bucket (own generator, so the seed's other draws stay where they were).
    pub(super) fn regional_bucket(scenario: &Scenario, rng: &mut fastrand::Rng) -> Option<Bucket> {
        scenario.compaction?;
        Some(bucket(rng, scenario, "sim-regional", None, None))
    }

    /// An agent's gated, layered view of the regional bucket.
    pub(super) fn regional_store(
        &self,
        number: u32,
        halted: &Arc<AtomicBool>,
    ) -> Option<Arc<dyn ObjectStore>> {
        let regional = self.regional.as_ref()?;
        let gate = Arc::new(
            Gate::new(
                regional.model.clone(),
                halted.clone(),
                regional.faults.clone(),
            )
            .with_ledger(self.ledger.clone(), self.buckets.len()),
        );
        Some(layered(
            "regional",
            gate,
            LayerPolicy::default(),
            u64::from(number) << 8 | 0xff,
        ))
    }

    /// Starts an agent's planner and workers; dropping the returned sender stops them.
    pub(super) fn start_compaction(
        &mut self,
        number: u32,
        halted: &Arc<AtomicBool>,
        control: &ControlPlane,
        ingest: Arc<QuorumWriter>,
        clock: Arc<dyn Clock>,
    ) -> Option<watch::Sender<bool>> {
        let scenario = self.scenario.compaction?;
        let regional = self.regional_store(number, halted)?;
        let log_gate = Arc::new(Gate::new(
            self.log_bucket.model.clone(),
            halted.clone(),
            self.log_bucket.faults.clone(),
        ));
        let log = layered(
            "log-queue",
            log_gate,
            LayerPolicy::default(),
            u64::from(number) << 8 | 0xfe,
        );
        let network = Arc::new(AgentNetwork {
            inner: self.queue_network.clone(),
            halted: halted.clone(),
            heartbeat_loss: scenario.heartbeat_loss,
            rng: std::sync::Mutex::new(fastrand::Rng::with_seed(u64::from(number) ^ 0x6862)),
        });
        let address = format!("sim-agent-{number}");
        let member = Arc::new(Member::new(
            &address,
            &address,
            Arc::new(ObjectStoreCas::new(log, keys::queue("compaction"))),
            network,
            scenario.queue,
        ));
        let compactor = Arc::new(Compactor::new(
            control.clone(),
            ingest,
            regional,
            member,
            clock,
            scenario.settings,
            // Not drawn from the seed's generator, which would move every later fault.
            u64::from(number) << 16 ^ 0x636f_6d70,
        ));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(compactor.clone().run_planner(stopped.clone()));
        for n in 0..scenario.workers {
            let worker = format!("{address}-w{n}");
            tokio::spawn(compactor.clone().run_worker(worker, stopped.clone()));
        }
        self.compactors.push(compactor);
        Some(stop)
    }

    /// Takes the regional bucket down for a while, or brings it back.
    pub(super) fn inject_compaction_faults(&mut self) {
        let Some(scenario) = self.scenario.compaction else {
            return;
        };
        let Some(regional) = &self.regional else {
            return;
        };
        let now = tokio::time::Instant::now();
        match self.regional_down_until {
            Some(until) if now >= until => {
                regional.model.set_outage(false);
                self.regional_down_until = None;
                self.event("regional bucket back");
            }
            None if self.compaction_rng.f64() < scenario.p_outage => {
                let length = Duration::from_millis(self.compaction_rng.u64(100..=2_000));
                regional.model.set_outage(true);
                self.regional_down_until = Some(now + length);
                self.report.regional_outages += 1;
                self.event(&format!("regional bucket down for {length:?}"));
            }
            _ => {}
        }
    }

    /// Brings the regional bucket back for the heal phase.
    pub(super) fn heal_compaction(&mut self) {
        if let Some(regional) = &self.regional {
            regional.model.set_outage(false);
        }
        self.regional_down_until = None;
    }

    /// Adds compaction's counters to the report.
    pub(super) fn report_compaction(&mut self) {
        for compactor in &self.compactors {
            let stats = compactor.stats();
            self.report.compactions += stats.jobs_done;
            self.report.compaction_jobs += stats.jobs_pushed;
            self.report.compactions_refused += stats.jobs_conflicted;
            self.report.batches_compacted += stats.batches_moved;
        }
    }
}
