//! The simulated world and its step loop.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::mpsc;
use weir_common::{Clock, TopicId};
use weir_control::{ControlError, ControlPlane, ControlPlaneSettings, Entry, EntryResult};
use weir_fetch::FetchReader;
use weir_produce::{
    PartitionBatches, PartitionOutcome, ProduceError, ProducePipeline, ProduceSettings,
    ProduceTicket, TicketOutcome,
};
use weir_protocol::batch::{build_test_batch, split_and_validate, BatchHeader};
use weir_storage::{LatencyProfile, ModelStore, OpLatency, QuorumWriter, ReadCache};

use crate::audit::{check_log, Auditor, Breaches, Shadow};
use crate::client::{Batch, BatchId, Client, Kind};
use crate::gate::{BucketFaults, Gate};

const TOPIC: &str = "sim";
/// Upper bound on simulated time for the heal phase to converge.
const HEAL_LIMIT: Duration = Duration::from_secs(60);
/// Violation messages kept per report (all are counted).
const MAX_MESSAGES: usize = 40;

/// How long a run is.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Steps of the fault phase; each step advances the clock by 0–15 ms.
    pub steps: u32,
    /// Print every event as it happens (for replaying one failing seed).
    pub print_events: bool,
    /// Break durability on purpose half-way, to show the auditor notices.
    pub sabotage: Sabotage,
}

/// Damage done behind the system's back (tests of the auditor itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sabotage {
    #[default]
    None,
    /// Delete the newest committed file from every bucket.
    DeleteFile,
    /// Delete every snapshot and log slot 2, so replay stops early.
    TruncateLog,
    /// Rewrite the log slot the newest snapshot ends at, adding a topic: the snapshot (which
    /// production replay starts from) and the log (which the auditor's own replay reads) now
    /// disagree, as they would if either replay had a bug.
    ForgeCoveredSlot,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            steps: 600,
            print_events: false,
            sabotage: Sabotage::None,
        }
    }
}

/// What one seed did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    /// The deployment and fault mix the seed chose.
    pub scenario: String,
    pub steps: u32,
    pub sim_millis: u64,
    pub requests: u64,
    pub acked_batches: u64,
    pub acked_records: u64,
    /// Sends of an idempotent batch after its first.
    pub resends: u64,
    /// Plain batches that failed or went unanswered (not retried; may or may not be in the log).
    pub plain_unacked: u64,
    /// Idempotent sends the control plane refused as out of sequence (retried in order).
    pub out_of_sequence: u64,
    pub crashes: u32,
    pub takeovers: u32,
    pub bucket_outages: u32,
    pub slowdowns: u32,
    pub log_outages: u32,
    pub failed_opens: u32,
    /// Two agents recovering at once, the first one's claim overtaken by the second (slow
    /// first recovery): the interleaving of a rolling restart that starts the new agent early.
    pub overlapping_recoveries: u32,
    /// Claims lost to a later writer and made again while opening (`EpochTaken`).
    pub overtaken_claims: u32,
    /// Most dead log slots (written by a deposed writer) one replay skipped.
    pub dead_slots: u64,
    pub consumed_batches: u64,
    pub audits: u32,
    /// Breaches found by the final audit.
    pub final_audit: Breaches,
    /// Every invariant violation seen at any step (the first few verbatim).
    pub violation_count: u64,
    pub violations: Vec<String>,
    /// Hash of every event in order: equal for two runs of one seed.
    pub trace_hash: u64,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.violation_count == 0 && self.final_audit.total() == 0
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} [{}]: {} — {} steps, {:.1} s simulated, {} requests, {} batches / {} records \
             acked, {} resends, {} crashes, {} takeovers ({} dead log slots), {} overlapping \
             recoveries ({} claims overtaken), {} bucket outages, {} slowdowns, {} log \
             outages, {} consumed; lost {}, duplicated {}, reordered {}, gaps {}, violations {}; \
             trace {:016x}",
            self.seed,
            self.scenario,
            if self.passed() { "ok" } else { "FAILED" },
            self.steps,
            self.sim_millis as f64 / 1000.0,
            self.requests,
            self.acked_batches,
            self.acked_records,
            self.resends,
            self.crashes,
            self.takeovers,
            self.dead_slots,
            self.overlapping_recoveries,
            self.overtaken_claims,
            self.bucket_outages,
            self.slowdowns,
            self.log_outages,
            self.consumed_batches,
            self.final_audit.lost,
            self.final_audit.duplicated,
            self.final_audit.reordered,
            self.final_audit.gaps,
            self.violation_count,
            self.trace_hash,
        )
    }
}

/// Runs one seed on a fresh single-threaded runtime with a paused clock.
pub fn run(seed: u64, options: &SimOptions) -> SimReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(async {
        let mut world = World::new(seed);
        world.print_events = options.print_events;
        world.run(options).await;
        world.report
    })
}

/// Wall-clock milliseconds for the agents: a fixed origin plus the paused Tokio clock.
#[derive(Debug)]
struct SimClock {
    origin: tokio::time::Instant,
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        1_750_000_000_000 + self.origin.elapsed().as_millis() as i64
    }
}

/// Everything the seed chose about the deployment.
#[derive(Debug, Clone)]
struct Scenario {
    buckets: usize,
    quorum: usize,
    partitions: i32,
    error_rate: f64,
    /// PUTs that land but report a timeout.
    ambiguous_rate: f64,
    put: OpLatency,
    get: OpLatency,
    produce: ProduceSettings,
    log_inflight: usize,
    snapshot_every: u64,
    kinds: Vec<Kind>,
    /// Per-step fault probabilities.
    p_crash: f64,
    p_takeover: f64,
    p_outage: f64,
    p_slow: f64,
    p_log_outage: f64,
    /// Per-step probability of two overlapping recoveries (drawn from its own generator, so
    /// the other faults of a seed stay where they were before this fault existed).
    p_overlap: f64,
    p_send: f64,
}

impl Scenario {
    fn pick(rng: &mut fastrand::Rng) -> Scenario {
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
            put: OpLatency::millis(put_p50, put_p50 * rng.u64(2..=6)),
            get: OpLatency::millis(1 + put_p50 / 3, put_p50 * 2),
            produce: ProduceSettings {
                flush_interval: Duration::from_millis(rng.u64(1..=20)),
                max_file_bytes: [300, 2_000, 64 * 1024][rng.usize(..3)],
                max_inflight_uploads: rng.usize(1..=8),
                upload_attempts: rng.u32(1..=3),
                queue_depth: 1024,
            },
            log_inflight: rng.usize(1..=4),
            snapshot_every: rng.u64(3..=40),
            kinds,
            p_crash: 0.004 * scale,
            p_takeover: 0.008 * scale,
            p_outage: 0.006 * scale,
            p_slow: 0.006 * scale,
            p_log_outage: 0.003 * scale,
            p_overlap: 0.002 * scale,
            p_send: 0.3 + rng.f64() * 0.6,
        }
    }

    fn describe(&self) -> String {
        let idempotent = self
            .kinds
            .iter()
            .filter(|k| **k == Kind::Idempotent)
            .count();
        format!(
            "{} bucket(s) q{}, {} partition(s), {} idempotent + {} plain clients, put p50 {:?}, \
             errors {:.0}%, ambiguous {:.0}%, file ≤{} B, flush {:?}, {} upload(s) and {} log write(s) in flight, \
             snapshot every {} slots{}",
            self.buckets,
            self.quorum,
            self.partitions,
            idempotent,
            self.kinds.len() - idempotent,
            self.put.p50,
            self.error_rate * 100.0,
            self.ambiguous_rate * 100.0,
            self.produce.max_file_bytes,
            self.produce.flush_interval,
            self.produce.max_inflight_uploads,
            self.log_inflight,
            self.snapshot_every,
            if self.p_crash == 0.0 {
                ", no process faults"
            } else {
                ""
            }
        )
    }
}

/// One bucket: durable bytes, the shared latency/fault model over them, and the faults the
/// gates add (slowness, ambiguous writes).
struct Bucket {
    raw: Arc<InMemory>,
    model: Arc<ModelStore>,
    faults: Arc<BucketFaults>,
}

/// One agent process: its control plane (a writer of the shared metadata log), produce pipeline
/// and fetch reader, seeing the buckets through gates that halt when it is killed.
struct Incarnation {
    number: u32,
    halted: Arc<AtomicBool>,
    control: ControlPlane,
    pipeline: ProducePipeline,
    fetch: FetchReader,
}

impl Incarnation {
    fn alive(&self) -> bool {
        !self.halted.load(Ordering::SeqCst)
    }
}

/// Two overlapping recoveries: the first agent sees the metadata bucket slowly while it opens,
/// so the second, started once the first has claimed its epoch, claims a later one and writes
/// its `NewEpoch` before the first one's replay reaches the end of the log. Once the second has
/// opened the first runs at normal speed; once the first has opened, every other agent stops
/// (a rolling restart that started the new agent before stopping the old ones), so clients move
/// to the first: if it served from an overtaken claim, what it acknowledges is lost.
struct Overlap {
    first: u32,
    /// The first agent's private view of the metadata bucket (slow until the second opened).
    first_faults: Arc<BucketFaults>,
    /// When the second agent starts (`None` once it has).
    second_at: Option<tokio::time::Instant>,
    second: Option<u32>,
}

/// Delay per metadata operation of the first of two overlapping recoveries.
const OVERLAP_SLOW_MS: u64 = 300;

/// A request in flight: which client, on which incarnation, carrying which batches.
struct Request {
    client: usize,
    incarnation: usize,
    batches: Vec<(i32, u32)>,
}

struct Ack {
    id: BatchId,
    partition: i32,
    base_offset: i64,
    count: i32,
}

/// What spawned tasks report back to the driver.
enum Msg {
    Outcome {
        request: u64,
        outcome: TicketOutcome,
    },
    Opened {
        number: u32,
        halted: Arc<AtomicBool>,
        result: Result<ControlPlane, String>,
    },
    Topic {
        incarnation: usize,
        result: Result<TopicId, String>,
    },
    Producer {
        client: usize,
        incarnation: usize,
        result: Result<(i64, i16), String>,
    },
}

/// A consumer of one partition: reads forward from the newest live incarnation.
#[derive(Default)]
struct Consumer {
    next_offset: i64,
    /// (base offset, batch) read and not yet compared with the durable log.
    unchecked: Vec<(i64, BatchId, i32)>,
}

struct World {
    seed: u64,
    rng: fastrand::Rng,
    scenario: Scenario,
    clock: Arc<dyn Clock>,
    buckets: Vec<Bucket>,
    log_bucket: Bucket,
    auditor: Auditor,
    topic: Option<TopicId>,
    incarnations: Vec<Incarnation>,
    /// Opens (recoveries) in flight.
    opening: u32,
    /// Draws of faults added after the seed schedules were fixed (see `Scenario::p_overlap`).
    fault_rng: fastrand::Rng,
    overlap: Option<Overlap>,
    /// Agent processes started (their numbers).
    opened_count: u32,
    /// Earliest time the next open may start (backoff after a failed one).
    open_after: tokio::time::Instant,
    clients: Vec<Client>,
    /// Clients (and `usize::MAX` for topic creation) waiting on the control plane, with the
    /// incarnation asked.
    producer_pending: BTreeMap<usize, usize>,
    requests: BTreeMap<u64, Request>,
    next_request: u64,
    acks: Vec<Ack>,
    consumers: Vec<Consumer>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    step: u32,
    trace: u64,
    reported: BTreeSet<String>,
    print_events: bool,
    clock_origin: tokio::time::Instant,
    report: SimReport,
}

fn bucket(rng: &mut fastrand::Rng, scenario: &Scenario, name: &str) -> Bucket {
    let raw = Arc::new(InMemory::new());
    let mut profile = LatencyProfile::local();
    profile.name = name.to_string();
    profile.put = scenario.put;
    profile.get = scenario.get;
    profile.list = scenario.get;
    profile.error_rate = scenario.error_rate;
    let inner: Arc<dyn ObjectStore> = raw.clone();
    let model = ModelStore::new(inner, profile, rng.u64(..)).expect("valid sim profile");
    let faults = BucketFaults::new(scenario.ambiguous_rate, rng.u64(..));
    Bucket {
        raw,
        model: Arc::new(model),
        faults: Arc::new(faults),
    }
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = fastrand::Rng::with_seed(seed);
        let scenario = Scenario::pick(&mut rng);
        let buckets: Vec<Bucket> = (0..scenario.buckets)
            .map(|i| bucket(&mut rng, &scenario, &format!("sim-bucket-{i}")))
            .collect();
        let log_bucket = bucket(&mut rng, &scenario, "sim-log");
        let auditor = Auditor::new(
            log_bucket.raw.clone(),
            buckets.iter().map(|b| b.raw.clone()).collect(),
            scenario.quorum,
        );
        let clients = scenario
            .kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| Client::new(i as u32, *kind))
            .collect();
        let consumers = (0..scenario.partitions)
            .map(|_| Consumer::default())
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let report = SimReport {
            seed,
            scenario: scenario.describe(),
            ..SimReport::default()
        };
        World {
            seed,
            rng,
            scenario,
            clock: Arc::new(SimClock {
                origin: tokio::time::Instant::now(),
            }),
            buckets,
            log_bucket,
            auditor,
            topic: None,
            incarnations: Vec::new(),
            opening: 0,
            fault_rng: fastrand::Rng::with_seed(seed ^ 0x6f76_6572_6c61_7021),
            overlap: None,
            opened_count: 0,
            open_after: tokio::time::Instant::now(),
            clients,
            producer_pending: BTreeMap::new(),
            requests: BTreeMap::new(),
            next_request: 0,
            acks: Vec::new(),
            consumers,
            tx,
            rx,
            step: 0,
            trace: 0xcbf2_9ce4_8422_2325,
            reported: BTreeSet::new(),
            print_events: false,
            clock_origin: tokio::time::Instant::now(),
            report,
        }
    }

    /// Folds an event into the trace hash (FNV-1a).
    fn event(&mut self, text: &str) {
        if self.print_events {
            println!(
                "[{:>5} {:>8.3}s] {text}",
                self.step,
                self.clock_origin.elapsed().as_secs_f64()
            );
        }
        for byte in self.step.to_le_bytes().iter().chain(text.as_bytes()) {
            self.trace ^= u64::from(*byte);
            self.trace = self.trace.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn violation(&mut self, message: String) {
        self.report.violation_count += 1;
        // The same breach is usually seen again at every later step: keep the first sighting.
        if !self.reported.insert(message.clone()) {
            return;
        }
        if self.report.violations.len() < MAX_MESSAGES {
            self.report
                .violations
                .push(format!("step {}: {message}", self.step));
            if self.print_events {
                println!("VIOLATION at step {}: {message}", self.step);
            }
        }
    }

    async fn run(&mut self, options: &SimOptions) {
        let start = tokio::time::Instant::now();
        for step in 0..options.steps {
            self.step = step;
            self.inject_faults();
            self.tick(true).await;
            if step == options.steps / 2 {
                self.sabotage(options.sabotage).await;
            }
        }
        self.heal();
        let healed_at = tokio::time::Instant::now();
        let mut step = options.steps;
        while !self.converged() {
            if healed_at.elapsed() > HEAL_LIMIT {
                let unsettled: Vec<u32> = self
                    .clients
                    .iter()
                    .filter(|c| {
                        !c.settled() || (c.kind == Kind::Idempotent && c.producer.is_none())
                    })
                    .map(|c| c.id)
                    .collect();
                self.violation(format!(
                    "no convergence {HEAL_LIMIT:?} after healing: unsettled clients {unsettled:?}, \
                     consumers at {:?}, live incarnations {}",
                    self.consumers.iter().map(|c| c.next_offset).collect::<Vec<_>>(),
                    self.incarnations.iter().filter(|i| i.alive()).count()
                ));
                break;
            }
            self.step = step;
            step += 1;
            self.tick(false).await;
        }
        self.report.steps = self.step + 1;
        self.final_audit().await;
        self.report.sim_millis = start.elapsed().as_millis() as u64;
        self.report.dead_slots = self.auditor.max_dead_slots;
        self.report.trace_hash = self.trace;
    }

    /// One step: keep an agent running, let clients send, let time pass, take in what came
    /// back, consume, audit.
    async fn tick(&mut self, load: bool) {
        self.overlap_second();
        self.ensure_incarnation();
        self.send(load).await;
        let pause = if load { self.rng.u64(0..=15) } else { 20 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        self.drain();
        self.consume().await;
        self.audit().await;
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Incarnation)> {
        self.incarnations
            .iter()
            .enumerate()
            .filter(|(_, inc)| inc.alive())
    }

    fn newest_live(&self) -> Option<usize> {
        self.live().map(|(index, _)| index).last()
    }

    fn inject_faults(&mut self) {
        let s = self.scenario.clone();
        if self.rng.f64() < s.p_crash {
            let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
            if !live.is_empty() {
                let victim = live[self.rng.usize(..live.len())];
                self.report.crashes += 1;
                self.halt(victim);
            }
        }
        if self.rng.f64() < s.p_takeover && self.opening == 0 && self.live().count() < 2 {
            // A second writer starts while the first still serves its clients.
            self.report.takeovers += 1;
            self.event("takeover");
            self.start_open();
        }
        if self.rng.f64() < s.p_outage {
            let index = self.rng.usize(..self.buckets.len());
            let model = &self.buckets[index].model;
            let down = !model.is_down();
            model.set_outage(down);
            if down {
                self.report.bucket_outages += 1;
            }
            self.event(&format!("bucket {index} down={down}"));
        }
        if self.rng.f64() < s.p_slow {
            let index = self.rng.usize(..self.buckets.len());
            let slow = if self.buckets[index].faults.slow_ms.load(Ordering::SeqCst) == 0 {
                self.report.slowdowns += 1;
                self.rng.u64(100..=2_000)
            } else {
                0
            };
            self.buckets[index]
                .faults
                .slow_ms
                .store(slow, Ordering::SeqCst);
            self.event(&format!("bucket {index} slow={slow}ms"));
        }
        if self.fault_rng.f64() < s.p_overlap
            && self.opening == 0
            && self.overlap.is_none()
            && self.live().count() < 2
        {
            self.start_overlap();
        }
        if self.rng.f64() < s.p_log_outage {
            let down = !self.log_bucket.model.is_down();
            self.log_bucket.model.set_outage(down);
            if down {
                self.report.log_outages += 1;
            }
            self.event(&format!("log bucket down={down}"));
        }
    }

    async fn sabotage(&mut self, sabotage: Sabotage) {
        match sabotage {
            Sabotage::None => {}
            Sabotage::DeleteFile => {
                let Some(ack) = self.acks.last() else { return };
                let (partition, offset) = (ack.partition, ack.base_offset);
                let Some(file) = self.incarnations.iter().find_map(|inc| {
                    inc.control.read(|state| {
                        let topic = state.topic(TOPIC)?;
                        let p = topic.partition(partition)?;
                        p.index
                            .iter()
                            .find(|e| e.base_offset == offset)
                            .map(|e| e.file_id)
                    })
                }) else {
                    return;
                };
                let key = weir_storage::keys::ingest_file(&file.to_string(), file.unix_ms());
                for bucket in &self.buckets {
                    let _ = bucket.raw.delete(&key).await;
                }
                self.event(&format!("sabotage: deleted {key}"));
            }
            Sabotage::TruncateLog => {
                let snapshots: Vec<_> = self
                    .log_bucket
                    .raw
                    .list(Some(&weir_storage::keys::meta_snapshot_prefix()))
                    .filter_map(|meta| async move { meta.ok().map(|m| m.location) })
                    .collect()
                    .await;
                for key in snapshots {
                    let _ = self.log_bucket.raw.delete(&key).await;
                }
                let _ = self
                    .log_bucket
                    .raw
                    .delete(&weir_storage::keys::meta_log(2))
                    .await;
                self.event("sabotage: truncated the log");
            }
            Sabotage::ForgeCoveredSlot => self.forge_covered_slot().await,
        }
    }

    /// Stops the serving agent and starts the first of two overlapping recoveries;
    /// [`World::overlap_second`] starts the second once the first has claimed its epoch (a claim
    /// is a LIST and a PUT).
    fn start_overlap(&mut self) {
        self.report.overlapping_recoveries += 1;
        // The agent serving so far stops, so the two recoveries race only each other.
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        for index in live {
            self.halt(index);
        }
        let faults = Arc::new(BucketFaults::new(
            self.scenario.ambiguous_rate,
            self.fault_rng.u64(..),
        ));
        faults.slow_ms.store(OVERLAP_SLOW_MS, Ordering::SeqCst);
        let first = self.start_open_with(faults.clone());
        self.event(&format!("overlapping recoveries: {first} opens slowly"));
        let claimed = Duration::from_millis(2 * OVERLAP_SLOW_MS + 150);
        self.overlap = Some(Overlap {
            first,
            first_faults: faults,
            second_at: Some(tokio::time::Instant::now() + claimed),
            second: None,
        });
    }

    fn overlap_second(&mut self) {
        let due = self
            .overlap
            .as_ref()
            .and_then(|overlap| overlap.second_at)
            .is_some_and(|at| tokio::time::Instant::now() >= at);
        if due {
            let second = self.start_open();
            self.event(&format!("overlapping recoveries: {second} opens"));
            if let Some(overlap) = &mut self.overlap {
                overlap.second_at = None;
                overlap.second = Some(second);
            }
        }
    }

    /// An agent finished opening: the second of two overlapping recoveries lets the first run
    /// at normal speed; the first (if it opened) stops every other agent.
    fn overlap_opened(&mut self, number: u32, opened: bool) {
        let Some(overlap) = &self.overlap else {
            return;
        };
        if overlap.second == Some(number) {
            overlap.first_faults.slow_ms.store(0, Ordering::SeqCst);
        }
        if overlap.first != number {
            return;
        }
        overlap.first_faults.slow_ms.store(0, Ordering::SeqCst);
        // Opened before the second even started: just a slow open, nothing overlapped.
        let overlapped = overlap.second_at.is_none();
        self.overlap = None;
        if opened && overlapped {
            self.event("overlapping recoveries: the others stop");
            let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
            for index in live {
                self.halt(index);
            }
        }
    }

    async fn forge_covered_slot(&mut self) {
        let snapshots: Vec<u64> = self
            .log_bucket
            .raw
            .list(Some(&weir_storage::keys::meta_snapshot_prefix()))
            .filter_map(|meta| async move {
                meta.ok()
                    .and_then(|m| weir_storage::keys::parse_seq_key(&m.location))
            })
            .collect()
            .await;
        let Some(seq) = snapshots.into_iter().max() else {
            return;
        };
        let key = weir_storage::keys::meta_log(seq);
        let Ok(found) = self.log_bucket.raw.get(&key).await else {
            return;
        };
        let Ok(bytes) = found.bytes().await else {
            return;
        };
        let Ok(envelope) = weir_format::decode_envelope(&bytes) else {
            return;
        };
        let Ok(mut record) =
            serde_json::from_slice::<weir_control::log::LogRecord>(envelope.payload)
        else {
            return;
        };
        record.entries.push(Entry::CreateTopic {
            name: "forged".into(),
            topic_id: TopicId([0x5a; 16]),
            partitions: 1,
            configs: BTreeMap::new(),
        });
        let forged = weir_control::log::LogStore::encode_record(envelope.epoch, seq, &record);
        let _ = self.log_bucket.raw.put(&key, forged.into()).await;
        self.event(&format!("sabotage: forged {key}"));
    }

    /// Ends every fault: buckets up and fast, and one fresh agent instead of whatever survived.
    /// (A writer deposed while idle keeps serving its last view until it next writes — there is
    /// no lease yet — so a survivor of a takeover may be stale; a restart is what an operator
    /// does, and what the convergence check then measures.)
    fn heal(&mut self) {
        for bucket in self.buckets.iter().chain(std::iter::once(&self.log_bucket)) {
            bucket.model.set_outage(false);
            bucket.faults.slow_ms.store(0, Ordering::SeqCst);
        }
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        for index in live {
            self.halt(index);
        }
        self.event("healed");
    }

    /// kill -9: the incarnation's storage calls stop returning; its clients lose their
    /// connection and write off everything in flight.
    fn halt(&mut self, index: usize) {
        self.incarnations[index]
            .halted
            .store(true, Ordering::SeqCst);
        let number = self.incarnations[index].number;
        self.event(&format!("halt incarnation {number}"));
        self.requests
            .retain(|_, request| request.incarnation != index);
        for client in &mut self.clients {
            if client.attached == Some(index) {
                for batch in client.connection_lost() {
                    if !client.failed(batch) {
                        self.report.plain_unacked += 1;
                    }
                }
            }
        }
        self.producer_pending.retain(|_, asked| *asked != index);
    }

    fn ensure_incarnation(&mut self) {
        if self.newest_live().is_none()
            && self.opening == 0
            && tokio::time::Instant::now() >= self.open_after
        {
            self.start_open();
        }
    }

    /// Starts a new agent process: recover the control plane (claiming a new epoch).
    fn start_open(&mut self) -> u32 {
        let faults = self.log_bucket.faults.clone();
        self.start_open_with(faults)
    }

    /// Starts an agent process that sees the metadata bucket with `log_faults`.
    fn start_open_with(&mut self, log_faults: Arc<BucketFaults>) -> u32 {
        self.opening += 1;
        self.opened_count += 1;
        let number = self.opened_count - 1;
        let halted = Arc::new(AtomicBool::new(false));
        let store: Arc<dyn ObjectStore> = Arc::new(Gate::new(
            self.log_bucket.model.clone(),
            halted.clone(),
            log_faults,
        ));
        let settings = ControlPlaneSettings {
            max_inflight_writes: self.scenario.log_inflight,
            snapshot_every_slots: self.scenario.snapshot_every,
            write_attempts: 2,
            address: format!("sim-agent-{number}"),
            encode_snapshots_inline: true,
            ..ControlPlaneSettings::default()
        };
        let seed = self.rng.u64(..);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = ControlPlane::open(store, settings, seed)
                .await
                .map_err(|err| err.to_string());
            let _ = tx.send(Msg::Opened {
                number,
                halted,
                result,
            });
        });
        number
    }

    fn opened(&mut self, number: u32, halted: Arc<AtomicBool>, control: ControlPlane) {
        let stores: Vec<Arc<dyn ObjectStore>> = self
            .buckets
            .iter()
            .map(|b| {
                Arc::new(Gate::new(b.model.clone(), halted.clone(), b.faults.clone()))
                    as Arc<dyn ObjectStore>
            })
            .collect();
        let writer =
            Arc::new(QuorumWriter::new(stores, self.scenario.quorum).expect("valid quorum"));
        let cache = Arc::new(ReadCache::new(1 << 20));
        let pipeline = ProducePipeline::start(
            self.scenario.produce.clone(),
            writer.clone(),
            control.clone(),
            cache.clone(),
            self.clock.clone(),
            self.rng.u64(..),
        );
        let fetch = FetchReader::new(control.clone(), writer, cache);
        self.incarnations.push(Incarnation {
            number,
            halted,
            control,
            pipeline,
            fetch,
        });
    }

    /// Clients (re)connect, get producer ids, create the topic, and send.
    async fn send(&mut self, load: bool) {
        let Some(newest) = self.newest_live() else {
            return;
        };
        let Some(topic) = self.topic.or_else(|| self.ensure_topic(newest)) else {
            return;
        };
        for c in 0..self.clients.len() {
            let attached = match self.clients[c].attached {
                Some(index) if self.incarnations[index].alive() => index,
                _ => {
                    self.clients[c].attached = Some(newest);
                    newest
                }
            };
            let client = &self.clients[c];
            if client.kind == Kind::Idempotent && client.producer.is_none() {
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    self.producer_pending.entry(c)
                {
                    slot.insert(attached);
                    self.init_producer(c, attached);
                }
                continue;
            }
            let mut requests: Vec<Vec<Batch>> = self.clients[c]
                .take_resends()
                .into_iter()
                .map(|batch| vec![batch])
                .collect();
            if load && self.rng.f64() < self.scenario.p_send {
                let mut partitions: Vec<i32> = (0..self.scenario.partitions).collect();
                self.rng.shuffle(&mut partitions);
                partitions.truncate(self.rng.usize(1..=partitions.len().min(3)));
                let client = &mut self.clients[c];
                let mut batches = Vec::new();
                for partition in partitions {
                    let ready = match client.kind {
                        Kind::Idempotent => client
                            .streams
                            .get(&partition)
                            .is_none_or(|stream| stream.can_send_new()),
                        Kind::Plain => client.plain_in_flight.len() < 16,
                    };
                    if ready {
                        let count = self.rng.i32(1..=5);
                        batches.push(client.new_batch(partition, count));
                    }
                }
                if !batches.is_empty() {
                    requests.push(batches);
                }
            }
            for batches in requests {
                self.submit(c, attached, topic, batches).await;
            }
        }
    }

    /// Creates the topic through the newest incarnation (retried every step until a creation
    /// is acknowledged: only then is the topic durable).
    fn ensure_topic(&mut self, newest: usize) -> Option<TopicId> {
        if let std::collections::btree_map::Entry::Vacant(slot) =
            self.producer_pending.entry(usize::MAX)
        {
            slot.insert(newest);
            let control = self.incarnations[newest].control.clone();
            let partitions = self.scenario.partitions;
            let seed = self.seed;
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let result = match control
                    .create_topic(TOPIC, partitions, BTreeMap::new(), seed)
                    .await
                {
                    Ok(id) => Ok(id),
                    // An earlier attempt landed; its slot precedes ours, so it is durable too.
                    Err(ControlError::TopicAlreadyExists(_)) => control
                        .read(|state| state.topic(TOPIC).map(|t| t.id))
                        .ok_or_else(|| "topic exists but is not in the state".to_string()),
                    Err(err) => Err(err.to_string()),
                };
                let _ = tx.send(Msg::Topic {
                    incarnation: newest,
                    result,
                });
            });
        }
        None
    }

    fn init_producer(&mut self, client: usize, incarnation: usize) {
        let control = self.incarnations[incarnation].control.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = match control
                .submit(Entry::InitProducerId { existing: None })
                .await
            {
                Ok(EntryResult::InitProducerId(Ok(pair))) => Ok(pair),
                Ok(other) => Err(format!("{other:?}")),
                Err(err) => Err(err.to_string()),
            };
            let _ = tx.send(Msg::Producer {
                client,
                incarnation,
                result,
            });
        });
    }

    async fn submit(&mut self, c: usize, incarnation: usize, topic: TopicId, batches: Vec<Batch>) {
        let producer = match self.clients[c].kind {
            Kind::Idempotent => self.clients[c].producer.expect("idempotent clients wait"),
            Kind::Plain => (-1, -1),
        };
        let mut partitions = Vec::with_capacity(batches.len());
        for batch in &batches {
            if batch.attempts > 1 {
                self.report.resends += 1;
            }
            let bytes: Bytes = build_test_batch(
                batch.count,
                batch.id.timestamp(),
                (producer.0, producer.1, batch.sequence),
            );
            partitions.push(PartitionBatches {
                topic_id: topic,
                partition: batch.partition,
                batches: split_and_validate(&bytes).expect("test batches are valid"),
            });
        }
        let request = self.next_request;
        self.next_request += 1;
        self.report.requests += 1;
        let pipeline = self.incarnations[incarnation].pipeline.clone();
        let queued = tokio::time::timeout(
            Duration::from_secs(1),
            pipeline.submit(ProduceTicket { partitions }),
        )
        .await;
        let Ok(outcome) = queued else {
            // The pipeline did not take the request: as if the connection timed out.
            for batch in batches {
                if let Some(batch) = self.clients[c].answered(batch.partition, batch.id.number) {
                    if !self.clients[c].failed(batch) {
                        self.report.plain_unacked += 1;
                    }
                }
            }
            return;
        };
        self.requests.insert(
            request,
            Request {
                client: c,
                incarnation,
                batches: batches
                    .iter()
                    .map(|batch| (batch.partition, batch.id.number))
                    .collect(),
            },
        );
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let outcome = outcome.await;
            let _ = tx.send(Msg::Outcome { request, outcome });
        });
    }

    /// Takes in everything spawned tasks reported since the last step.
    fn drain(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Outcome { request, outcome } => self.outcome(request, outcome),
                Msg::Opened {
                    number,
                    halted,
                    result,
                } => {
                    self.opening -= 1;
                    self.overlap_opened(number, result.is_ok());
                    match result {
                        Ok(control) => {
                            self.report.overtaken_claims += control.open_claims() - 1;
                            self.event(&format!(
                                "opened incarnation {number} ({} claims)",
                                control.open_claims()
                            ));
                            self.opened(number, halted, control);
                        }
                        Err(err) => {
                            self.report.failed_opens += 1;
                            self.event(&format!("open failed: {err}"));
                            self.open_after =
                                tokio::time::Instant::now() + Duration::from_millis(50);
                        }
                    }
                }
                Msg::Topic {
                    incarnation,
                    result,
                } => {
                    self.producer_pending.remove(&usize::MAX);
                    match result {
                        Ok(id) if self.incarnations[incarnation].alive() => {
                            self.event("topic created");
                            self.topic.get_or_insert(id);
                        }
                        Ok(_) => {}
                        Err(err) => self.event(&format!("create topic: {err}")),
                    }
                }
                Msg::Producer {
                    client,
                    incarnation,
                    result,
                } => {
                    if self.producer_pending.get(&client) == Some(&incarnation) {
                        self.producer_pending.remove(&client);
                    }
                    if !self.incarnations[incarnation].alive() {
                        continue;
                    }
                    match (client, result) {
                        (client, Ok(pair)) => {
                            self.event(&format!("client {client} is producer {pair:?}"));
                            // A second id (from a retry after a crash) is simply not used.
                            self.clients[client].producer.get_or_insert(pair);
                        }
                        (client, Err(err)) => {
                            self.event(&format!("client {client} init failed: {err}"))
                        }
                    }
                }
            }
        }
    }

    fn outcome(&mut self, request: u64, outcome: TicketOutcome) {
        let Some(request) = self.requests.remove(&request) else {
            return; // written off when its incarnation died
        };
        if outcome.len() != request.batches.len() {
            self.violation(format!(
                "request answered with {} outcomes for {} partitions",
                outcome.len(),
                request.batches.len()
            ));
        }
        let client_id = self.clients[request.client].id;
        for ((partition, number), result) in request.batches.iter().zip(outcome) {
            let Some(batch) = self.clients[request.client].answered(*partition, *number) else {
                continue;
            };
            match result {
                PartitionOutcome::Committed { base_offset, .. } => {
                    self.event(&format!(
                        "ack c{client_id}#{number} p{partition}@{base_offset}"
                    ));
                    self.report.acked_batches += 1;
                    self.report.acked_records += batch.count as u64;
                    self.acks.push(Ack {
                        id: batch.id,
                        partition: *partition,
                        base_offset,
                        count: batch.count,
                    });
                }
                PartitionOutcome::Failed(err) => {
                    if matches!(
                        err,
                        ProduceError::Control(ControlError::OutOfOrderSequence { .. })
                    ) {
                        self.report.out_of_sequence += 1;
                    }
                    if matches!(
                        err,
                        ProduceError::Control(
                            ControlError::InvalidProducerEpoch { .. }
                                | ControlError::UnknownProducerId(_)
                                | ControlError::UnknownTopicOrPartition(_)
                        )
                    ) {
                        self.violation(format!("c{client_id}#{number} refused: {err}"));
                    }
                    self.event(&format!("fail c{client_id}#{number} p{partition}: {err}"));
                    if !self.clients[request.client].failed(batch) {
                        self.report.plain_unacked += 1;
                    }
                }
            }
        }
    }

    /// Each partition's consumer reads what the newest live incarnation makes visible.
    async fn consume(&mut self) {
        let (Some(newest), Some(topic)) = (self.newest_live(), self.topic) else {
            return;
        };
        let fetch = self.incarnations[newest].fetch.clone();
        for partition in 0..self.scenario.partitions {
            let consumer = &self.consumers[partition as usize];
            let plan = match fetch.plan(&topic, partition, consumer.next_offset, 16 * 1024, true) {
                Ok(plan) if !plan.is_empty() => plan,
                Ok(_) => continue,
                Err(weir_fetch::FetchError::OffsetOutOfRange { .. }) => continue,
                Err(err) => {
                    self.violation(format!("p{partition}: fetch plan failed: {err}"));
                    continue;
                }
            };
            // Reads of a plan go one file after another, so a slow holder costs its delay per
            // file; a read that never returns shows up as no convergence after healing.
            let read = tokio::time::timeout(Duration::from_secs(60), fetch.read(plan)).await;
            let data = match read {
                Ok(Ok(data)) => data,
                Ok(Err(err)) => {
                    self.event(&format!("p{partition}: read failed: {err}"));
                    continue;
                }
                Err(_) => {
                    self.event(&format!("p{partition}: read timed out"));
                    continue;
                }
            };
            let mut position = 0;
            let mut records = Vec::new();
            while position < data.records.len() {
                let header = match BatchHeader::parse(&data.records[position..]) {
                    Ok(header) => header,
                    Err(err) => {
                        self.violation(format!("p{partition}: fetched garbage: {err}"));
                        break;
                    }
                };
                position += header.total_len();
                records.push(header);
            }
            for header in records {
                let consumer = &mut self.consumers[partition as usize];
                if header.base_offset != consumer.next_offset {
                    let expected = consumer.next_offset;
                    self.violation(format!(
                        "p{partition}: consumer expected offset {expected}, got {}",
                        header.base_offset
                    ));
                    break;
                }
                let Some(id) = BatchId::from_timestamp(header.first_timestamp) else {
                    self.violation(format!("p{partition}: consumer read a foreign batch"));
                    break;
                };
                consumer.next_offset = header.base_offset + header.offset_span();
                consumer
                    .unchecked
                    .push((header.base_offset, id, header.last_offset_delta + 1));
                self.report.consumed_batches += 1;
            }
        }
    }

    async fn audit(&mut self) {
        let Some(topic) = self.topic else {
            return;
        };
        self.report.audits += 1;
        let mut messages = Vec::new();
        let shadow = self
            .auditor
            .shadow(topic, self.scenario.partitions, &mut messages)
            .await;
        if let Some(shadow) = &shadow {
            check_log(shadow, &mut messages);
            self.check_acks(shadow, &mut messages);
            self.check_live_prefixes(topic, shadow, &mut messages);
            self.check_consumed(shadow, &mut messages);
        }
        for message in messages {
            self.violation(message);
        }
    }

    /// DUR-1: every acknowledged batch is in the durable log at the offset it was acked with.
    fn check_acks(&self, shadow: &Shadow, messages: &mut Vec<String>) -> u64 {
        let mut lost = 0;
        for ack in &self.acks {
            let found = shadow.at(ack.partition as usize, ack.base_offset);
            let ok = found.is_some_and(|placed| {
                placed.seen.id == ack.id
                    && placed.entry.last_offset == ack.base_offset + i64::from(ack.count) - 1
            });
            if !ok {
                lost += 1;
                messages.push(format!(
                    "LOST: {} acked at p{}@{} but the durable log has {:?}",
                    ack.id,
                    ack.partition,
                    ack.base_offset,
                    found.map(|p| p.seen.id)
                ));
            }
        }
        lost
    }

    /// FET-1 and CTL-1: what each live writer shows consumers (below its stable high
    /// watermark) is exactly the durable log.
    fn check_live_prefixes(&self, topic: TopicId, shadow: &Shadow, messages: &mut Vec<String>) {
        for (_, incarnation) in self.live() {
            let number = incarnation.number;
            incarnation.control.read(|state| {
                for partition in 0..self.scenario.partitions {
                    let Some(p) = state.partition(&topic, partition) else {
                        continue;
                    };
                    let durable = shadow.high_watermark(partition as usize);
                    if p.stable_high_watermark > durable {
                        messages.push(format!(
                            "incarnation {number} p{partition}: stable {} beyond durable {durable}",
                            p.stable_high_watermark
                        ));
                    }
                    for entry in p
                        .index
                        .iter()
                        .take_while(|e| e.last_offset < p.stable_high_watermark)
                    {
                        let same = shadow
                            .at(partition as usize, entry.base_offset)
                            .is_some_and(|placed| placed.entry == *entry);
                        if !same {
                            messages.push(format!(
                                "incarnation {number} p{partition}: visible batch at {} differs \
                                 from the durable log",
                                entry.base_offset
                            ));
                            break;
                        }
                    }
                }
            });
        }
    }

    /// Consumers only ever read durable batches, at their durable offsets.
    fn check_consumed(&mut self, shadow: &Shadow, messages: &mut Vec<String>) {
        for (partition, consumer) in self.consumers.iter_mut().enumerate() {
            for (offset, id, count) in consumer.unchecked.drain(..) {
                let ok = shadow
                    .at(partition, offset)
                    .is_some_and(|placed| placed.seen.id == id && placed.seen.count == count);
                if !ok {
                    messages.push(format!(
                        "p{partition}: consumer read {id} at {offset}, not in the durable log"
                    ));
                }
            }
        }
    }

    /// Every idempotent batch acknowledged, every consumer at the end of the durable log.
    fn converged(&self) -> bool {
        if self.topic.is_none() || self.newest_live().is_none() {
            return false;
        }
        let clients_done = self.clients.iter().all(|client| {
            client.settled() && (client.kind == Kind::Plain || client.producer.is_some())
        });
        if !clients_done {
            return false;
        }
        let newest = &self.incarnations[self.newest_live().expect("checked")];
        let topic = self.topic.expect("checked");
        newest.control.read(|state| {
            (0..self.scenario.partitions).all(|partition| {
                state.partition(&topic, partition).is_some_and(|p| {
                    self.consumers[partition as usize].next_offset == p.stable_high_watermark
                        && p.stable_high_watermark == p.high_watermark
                })
            })
        })
    }

    /// The last audit also counts: lost, duplicated, reordered, gaps, and whether consumers
    /// read the whole log.
    async fn final_audit(&mut self) {
        let Some(topic) = self.topic else {
            self.violation("the topic was never created".to_string());
            return;
        };
        let mut messages = Vec::new();
        self.auditor.cross_check_replay(&mut messages).await;
        self.auditor.forget_reads();
        let Some(shadow) = self
            .auditor
            .shadow(topic, self.scenario.partitions, &mut messages)
            .await
        else {
            for message in messages {
                self.violation(message);
            }
            return;
        };
        let mut breaches = check_log(&shadow, &mut messages);
        breaches.lost = self.check_acks(&shadow, &mut messages);
        for (partition, consumer) in self.consumers.iter().enumerate() {
            let end = shadow.high_watermark(partition);
            if consumer.next_offset != end {
                messages.push(format!(
                    "p{partition}: consumer stopped at {} of {end}",
                    consumer.next_offset
                ));
            }
        }
        let all_acked: BTreeSet<BatchId> = self.acks.iter().map(|ack| ack.id).collect();
        for client in &self.clients {
            if client.kind == Kind::Idempotent {
                let sent = client.next_number;
                let acked = all_acked.iter().filter(|id| id.client == client.id).count();
                if acked as u32 != sent {
                    messages.push(format!(
                        "client {}: {acked} of {sent} idempotent batches acknowledged",
                        client.id
                    ));
                }
            }
        }
        self.report.final_audit = breaches;
        for message in messages {
            self.violation(message);
        }
    }
}
