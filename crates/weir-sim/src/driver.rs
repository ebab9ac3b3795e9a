//! The simulated world and its step loop. Faults live in [`faults`], retention, DeleteRecords
//! and the file deleter in [`retention`], agents and clients in [`agents`], consumers and audits
//! in [`checks`], the per-seed report in [`report`], what a seed chooses in [`scenario`],
//! metadata-log GC and paused log writes in [`loggc`], producer expiry in [`expiry`].

mod agents;
mod checks;
mod cluster;
mod compaction;
mod expiry;
mod faults;
mod groups;
mod loggc;
mod report;
mod retention;
mod scenario;
mod sweep;

pub use report::SimReport;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    PartitionBatches, PartitionOutcome, ProduceError, ProducePipeline, ProduceTicket, TicketOutcome,
};
use weir_protocol::batch::{build_test_batch, split_and_validate, BatchHeader};
use weir_storage::{
    BucketStats, LatencyProfile, LayerPolicy, LayerStore, ModelStore, PriceTable, QuorumWriter,
    ReadCache,
};

use crate::archive::LogArchive;
use crate::audit::{check_log, Auditor, Shadow};
use crate::client::{Batch, BatchId, Client, Kind, Stamps};
use crate::gate::{BucketFaults, Gate};
use crate::hold::{HoldSwitch, SlotHold};
use crate::ledger::DeleteLedger;
use retention::GcScenario;
use scenario::{AppendScenario, Scenario};
use weir_storage::append::memory::MemoryAppendable;
use weir_storage::append::{AppendLimits, AppendableStore, FenceKind};

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

/// Runs one seed on a fresh single-threaded runtime with a paused clock.
pub fn run(seed: u64, options: &SimOptions) -> SimReport {
    // Seeded: tokio draws random numbers to pick an unbiased select! branch and the order in
    // which a watch channel wakes its waiters; unseeded, a seed would not replay exactly.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()))
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

/// One bucket: durable bytes, the shared latency/fault model over them, and the faults the
/// gates add (slowness, ambiguous writes, create conflicts on the metadata bucket).
struct Bucket {
    raw: Arc<InMemory>,
    model: Arc<ModelStore>,
    faults: Arc<BucketFaults>,
    /// On the appendable path: the bucket's appendable view under its model (the double writes
    /// every flush through to `raw`), and the double itself (the archive reads slots from it).
    appendable: Option<Arc<dyn AppendableStore>>,
    double: Option<MemoryAppendable>,
}

/// One agent process: its control plane (a writer of the shared metadata log), produce pipeline
/// and fetch reader, seeing the buckets through gates that halt when it is killed.
struct Incarnation {
    number: u32,
    halted: Arc<AtomicBool>,
    control: ControlPlane,
    pipeline: ProducePipeline,
    fetch: FetchReader,
    /// Dropping it stops the incarnation's file deleter (a halted one hangs in its gates).
    _deleter: tokio::sync::watch::Sender<bool>,
    /// Dropping it stops the incarnation's compaction planner and workers.
    _compaction: Option<tokio::sync::watch::Sender<bool>>,
    /// On cluster seeds: the node it runs as and its view of the metadata bucket.
    member: Option<cluster::Membership>,
}

impl Incarnation {
    fn alive(&self) -> bool {
        !self.halted.load(Ordering::SeqCst)
    }
}

/// Two overlapping recoveries: the first agent sees the metadata bucket slowly while it opens,
/// so the second, started once the first has claimed its epoch, claims a later one and writes
/// its `NewEpoch` before the first one's replay reaches the end of the log. In the other variant
/// (an odd first agent, on a log with pre-warmed slot objects) the second starts once the first,
/// filling the holes the stopped writer
/// left, reads a slot it listed a second time: the second's replay passes the first's `NewEpoch`
/// and fillers and its own `NewEpoch` lands in the empty pre-warmed object the first is about to
/// judge (RFC 0004 point 4; the bug 9599043 fixed). Once the second has
/// opened the first runs at normal speed; once the first has opened, every other agent stops
/// (a rolling restart that started the new agent before stopping the old ones), so clients move
/// to the first: if it served from an overtaken claim, what it acknowledges is lost.
struct Overlap {
    first: u32,
    /// The first agent's private view of the metadata bucket (slow until the second opened).
    first_faults: Arc<BucketFaults>,
    /// When the second agent starts (`None` once it has).
    second_at: Option<tokio::time::Instant>,
    /// The second starts once the first reads a slot it listed a second time, not at a time.
    at_fill: bool,
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
    /// Where the batch was acknowledged; for an implicit ack, the offset of the later batch
    /// whose acknowledgement implied it (the batch is somewhere below).
    base_offset: i64,
    count: i32,
    /// Implied by a later batch's acknowledgement, not answered itself.
    implicit: bool,
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
    /// Something for the event trace (a DeleteRecords answer).
    Note(String),
    /// The coordinator fence refused a group's offset commit.
    CommitRefused(String),
}

/// A consumer of one partition: reads forward from the newest live incarnation, resetting to
/// the log start when its offset fell below it.
#[derive(Default)]
struct Consumer {
    next_offset: i64,
    /// Batches read and not yet compared with the durable log.
    unchecked: Vec<Consumed>,
    /// A plan read at a later step (a fetch that waits before it reads, as a slow connection).
    held: Option<Held>,
    /// Reads nothing until then (a consumer that falls behind).
    paused_until: Option<tokio::time::Instant>,
}

/// One batch a consumer received.
struct Consumed {
    base_offset: i64,
    id: BatchId,
    count: i32,
    /// The durable log start when its fetch was planned.
    durable_start: i64,
    /// Planned by a deposed writer (see [`Held::deposed`]).
    deposed: bool,
}

/// A fetch plan and when it was made, waiting to be read.
struct Held {
    plan: weir_fetch::ReadPlan,
    incarnation: usize,
    planned_at: tokio::time::Instant,
    read_at: tokio::time::Instant,
    durable_start: i64,
    /// The planning agent's epoch was below the durable log's newest when it planned: a writer
    /// deposed while idle serves its last view until it next writes (no lease yet), so its plan
    /// may name batches below a start the new writer moved, and files its deleter removed.
    deposed: bool,
}

struct World {
    seed: u64,
    rng: fastrand::Rng,
    scenario: Scenario,
    clock: Arc<dyn Clock>,
    buckets: Vec<Bucket>,
    log_bucket: Bucket,
    /// Every log slot the metadata bucket's gates saw land (log GC deletes from the bucket).
    archive: Arc<LogArchive>,
    auditor: Auditor,
    topic: Option<TopicId>,
    incarnations: Vec<Incarnation>,
    /// Opens (recoveries) in flight.
    opening: u32,
    /// Draws of faults added after the seed schedules were fixed (see `Scenario::p_overlap`).
    fault_rng: fastrand::Rng,
    /// Lost uploads (parallel-persistence seeds): its own generator, so other seeds' runs stay.
    lost_upload_rng: fastrand::Rng,
    /// Draws of retention, DeleteRecords and held fetch plans (their own generator).
    gc_rng: fastrand::Rng,
    /// Draws of the orphan sweep and agents' clock skews (their own generator).
    sweep_rng: fastrand::Rng,
    /// Draws of producer expiry and quiet producers (their own generator).
    expiry_rng: fastrand::Rng,
    /// Draws of paused log writes (their own generator).
    loggc_rng: fastrand::Rng,
    /// Per incarnation number, the switch that pauses one of its log writes.
    log_holds: Vec<Arc<HoldSwitch>>,
    slot_hold: Option<loggc::SlotHoldFault>,
    /// Every batch's first timestamp, for the auditor to tell batches apart.
    stamps: Stamps,
    /// DELETEs of data files the gates saw.
    ledger: Arc<DeleteLedger>,
    overlap: Option<Overlap>,
    /// The (incarnation, epoch) last woken by [`World::wake_deposed`].
    woken: Option<(usize, u64)>,
    /// Create-only PUTs of the metadata bucket answered `AlreadyExists` without writing.
    create_conflicts: Arc<AtomicU64>,
    /// Every agent's resolver counts what it settles here (RFC 0006).
    resolved: weir_produce::ProduceMetrics,
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
    /// The WriterPools of every incarnation (appendable seeds), for the report.
    pools: Vec<weir_produce::IngestPool>,
    /// Compaction seeds: the regional bucket, the queue's in-process network shared by every
    /// agent, each incarnation's compactor (for the report), and the draws of regional outages.
    regional: Option<Bucket>,
    queue_network: Arc<weir_objq::LocalNetwork>,
    compactors: Vec<Arc<weir_compactor::Compactor>>,
    compaction_rng: fastrand::Rng,
    regional_down_until: Option<tokio::time::Instant>,
    /// Cluster seeds: the in-process links between agents' control planes, the draws of
    /// cluster faults, the node each opening process runs as (by number), the node the next
    /// open is for, members opened but not yet serving, and the agents cut off their peers.
    links: weir_control::link::LocalLinks,
    cluster_rng: fastrand::Rng,
    opening_nodes: BTreeMap<u32, i32>,
    next_node: Option<i32>,
    pending_members: BTreeMap<u32, cluster::Membership>,
    cut: BTreeSet<String>,
    /// Every member's node id by control address (claims name the claimant's address).
    node_by_address: BTreeMap<String, i32>,
    /// Every member's clock rate by control address.
    clock_rates: BTreeMap<String, f64>,
    /// Cluster seeds: group coordinators committing offsets.
    groups: groups::GroupCommits,
}

/// A bucket; `create_conflicts` (the metadata bucket's) gives it the scenario's create-only
/// conflicts, counted there.
fn bucket(
    rng: &mut fastrand::Rng,
    scenario: &Scenario,
    name: &str,
    create_conflicts: Option<&Arc<AtomicU64>>,
    append: Option<FenceKind>,
) -> Bucket {
    let raw = Arc::new(InMemory::new());
    let mut profile = LatencyProfile::local();
    profile.name = name.to_string();
    profile.put = scenario.put;
    profile.get = scenario.get;
    profile.list = scenario.get;
    profile.error_rate = scenario.error_rate;
    let double = append
        .map(|fence| MemoryAppendable::write_through(raw.clone(), fence, AppendLimits::GCS_RAPID));
    let inner: Arc<dyn ObjectStore> = match &double {
        Some(double) => Arc::new(double.clone()),
        None => raw.clone(),
    };
    let model = ModelStore::new(inner, profile, rng.u64(..)).expect("valid sim profile");
    let appendable = double
        .clone()
        .map(|double| model.appendable(Arc::new(double)));
    let mut faults = BucketFaults::new(scenario.ambiguous_rate, rng.u64(..));
    if let Some(count) = create_conflicts {
        faults = faults.with_create_conflicts(
            scenario.create_conflict_rate,
            scenario.put,
            count.clone(),
        );
    }
    Bucket {
        raw,
        model: Arc::new(model),
        faults: Arc::new(faults),
        appendable,
        double,
    }
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut scenario = Scenario::pick(&mut rng);
        let mut conflict_rng = fastrand::Rng::with_seed(seed ^ 0x636f_6e66_6c69_6374);
        scenario.create_conflict_rate = [0.0, 0.05, 0.3][conflict_rng.usize(..3)];
        let mut gc_rng = fastrand::Rng::with_seed(seed ^ 0x7265_7465_6e74_696f);
        scenario.gc = GcScenario::pick(&mut gc_rng);
        let mut sweep_rng = fastrand::Rng::with_seed(seed ^ 0x7377_6565_7021);
        scenario.sweep = sweep::SweepScenario::pick(&mut sweep_rng);
        let mut expiry_rng = fastrand::Rng::with_seed(seed ^ 0x6578_7069_7279);
        scenario.expiry = expiry::ExpiryScenario::pick(&mut expiry_rng, scenario.p_crash == 0.0);
        let mut append_rng = fastrand::Rng::with_seed(seed ^ 0x6170_7065_6e64);
        let orphan_age = scenario.sweep.settings.as_ref().map(|s| s.orphan_age);
        scenario.append = AppendScenario::pick(&mut append_rng, orphan_age);
        let fence = scenario.append.map(|a| a.fence);
        let buckets: Vec<Bucket> = (0..scenario.buckets)
            .map(|i| bucket(&mut rng, &scenario, &format!("sim-bucket-{i}"), None, fence))
            .collect();
        let mut log_append_rng = fastrand::Rng::with_seed(seed ^ 0x6c6f_6761_7070);
        scenario.log_append = scenario::LogAppendScenario::pick(&mut log_append_rng);
        let log_fence = scenario.log_append.map(|a| a.fence);
        let mut compaction_rng = fastrand::Rng::with_seed(seed ^ 0x0063_6f6d_7061_6374);
        scenario.compaction = compaction::CompactionScenario::pick(&mut compaction_rng);
        let regional = World::regional_bucket(&scenario, &mut compaction_rng);
        let mut cluster_rng = fastrand::Rng::with_seed(seed ^ 0x0063_6c75_7374_6572);
        scenario.cluster = cluster::ClusterScenario::pick(&mut cluster_rng);
        if scenario.cluster.is_some() {
            // Faults of a single writer's world: a second writer started beside it, overlapping
            // recoveries and paused log writes, which take over by starting one more process.
            // Members take over by the lease rule, and kills stay.
            scenario.p_takeover = 0.0;
            scenario.p_overlap = 0.0;
            scenario.p_held_put = 0.0;
            scenario.p_stalled_recovery = 0.0;
            // Followers commit after upload (RFC 0006, "Clusters").
            scenario.produce.parallel_persistence = false;
        }
        if scenario.append.is_some() {
            // Pooled objects bring their own ids: commit after upload (the agent falls back).
            scenario.produce.parallel_persistence = false;
        }
        let create_conflicts = Arc::new(AtomicU64::new(0));
        let log_bucket = bucket(
            &mut rng,
            &scenario,
            "sim-log",
            Some(&create_conflicts),
            log_fence,
        );
        let archive = Arc::new(LogArchive::default());
        if let Some(double) = &log_bucket.double {
            // Every slot record that lands on an append, inside the flush (never cancelled).
            let archive = archive.clone();
            double.set_landing_hook(Arc::new(move |path, bytes| {
                archive.landed(path, bytes, true)
            }));
        }
        // The regional bucket is the ledger's bucket after the ingest ones.
        let ledger = Arc::new(DeleteLedger::new(
            archive.clone(),
            buckets
                .iter()
                .chain(regional.iter())
                .map(|b| b.raw.clone())
                .collect(),
        ));
        let mut auditor = Auditor::new(
            log_bucket.raw.clone(),
            archive.clone(),
            buckets.iter().map(|b| b.raw.clone()).collect(),
            scenario.quorum,
            ledger.clone(),
        );
        if let Some(regional) = &regional {
            auditor = auditor.with_regional(regional.raw.clone());
        }
        if scenario.append.is_some() {
            auditor = auditor.with_pool_discards();
        }
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
            archive,
            auditor,
            topic: None,
            incarnations: Vec::new(),
            opening: 0,
            fault_rng: fastrand::Rng::with_seed(seed ^ 0x6f76_6572_6c61_7021),
            lost_upload_rng: fastrand::Rng::with_seed(seed ^ 0x6c6f_7374_7570_6c64),
            gc_rng,
            sweep_rng,
            loggc_rng: fastrand::Rng::with_seed(seed ^ 0x6c6f_6767_6321),
            expiry_rng,
            log_holds: Vec::new(),
            slot_hold: None,
            stamps: Stamps::default(),
            ledger,
            overlap: None,
            woken: None,
            create_conflicts,
            resolved: weir_produce::ProduceMetrics::new(),
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
            pools: Vec::new(),
            regional,
            queue_network: weir_objq::LocalNetwork::new(&weir_objq::Settings::default()),
            compactors: Vec::new(),
            compaction_rng,
            regional_down_until: None,
            links: weir_control::link::LocalLinks::default(),
            cluster_rng,
            opening_nodes: BTreeMap::new(),
            next_node: None,
            pending_members: BTreeMap::new(),
            cut: BTreeSet::new(),
            node_by_address: BTreeMap::new(),
            clock_rates: BTreeMap::new(),
            groups: groups::GroupCommits::new(seed),
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
            self.inject_gc();
            self.inject_slot_holds();
            self.inject_expiry();
            self.inject_compaction_faults();
            self.inject_cluster_faults();
            self.commit_groups().await;
            self.tick(true).await;
            if step == options.steps / 2 {
                self.sabotage(options.sabotage).await;
            }
        }
        self.heal();
        self.heal_compaction();
        let healed_at = tokio::time::Instant::now();
        if self.converge(healed_at).await && self.scenario.cluster.is_some() {
            self.check_cluster_stays().await;
            // Writes a member held while it was cut off may have landed meanwhile.
            self.converge(healed_at).await;
        }
        self.check_log_bound().await;
        // Its steps write slots too, and a member's held write may land among them (seed 684:
        // a commit of two records, read by a plan that a consumer held past its TTL at the
        // last step): consumers read to the end once more before the final audit.
        self.converge(tokio::time::Instant::now()).await;
        self.report.steps = self.step + 1;
        self.final_audit().await;
        self.report.sim_millis = start.elapsed().as_millis() as u64;
        self.report.dead_slots = self.auditor.max_dead_slots;
        self.report.create_conflicts = self.create_conflicts.load(Ordering::SeqCst);
        self.report.log_start_advance = self.auditor.log_start_advance;
        self.report.files_deleted = self.ledger.deleted().len() as u64;
        self.report.late_copies = self.ledger.late_copies();
        self.report.repaired_files = self
            .resolved
            .resolved(weir_produce::ResolveOutcome::Repaired)
            .get();
        for pool in &self.pools {
            let stats = pool.stats();
            self.report.pool_hits += stats.hits;
            self.report.pool_misses += stats.misses;
            self.report.pool_discards += stats.discarded;
        }
        self.report_compaction();
        self.report.trace_hash = self.trace;
    }

    /// Steps without load until everything settled ([`World::converged`]); `false` (and a
    /// violation) when that takes longer than [`HEAL_LIMIT`] after `healed_at`.
    async fn converge(&mut self, healed_at: tokio::time::Instant) -> bool {
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
                     consumers at {:?}, live incarnations {}{}",
                    self.consumers.iter().map(|c| c.next_offset).collect::<Vec<_>>(),
                    self.incarnations.iter().filter(|i| i.alive()).count(),
                    self.describe_members()
                ));
                return false;
            }
            self.step += 1;
            self.tick(false).await;
        }
        true
    }

    /// One step: keep an agent running, let clients send, let time pass, take in what came
    /// back, consume, audit.
    async fn tick(&mut self, load: bool) {
        self.progress_slot_hold().await;
        self.overlap_second();
        self.ensure_incarnation();
        self.send(load).await;
        if !load {
            self.wake_deposed();
        }
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
}
