//! The in-process control plane: one actor sequences entries, applies them to the state machine,
//! group-commits them into log slots with several writes in flight, and answers callers strictly
//! in slot order once each slot and all before it are durable.
//!
//! The writer keeps two states. It applies entries to its private *working* state when it seals
//! a slot (callers need the results, and later entries depend on earlier ones), and applies the
//! same entries to the shared *readable* state only once the slot is durable, in slot order.
//! Readers ([`ControlPlane::read`]: metadata, fetch, offset fetch, configs, the committer's chain
//! tip) therefore only ever see durable facts: an entry whose slot write fails never becomes
//! visible, and recovery never has to take back what readers saw. In the readable state every
//! partition's `stable_high_watermark` equals its `high_watermark`, or its first pending batch's
//! base offset when that is lower (RFC 0006). The cost is a second copy of
//! the state in memory (see `docs/architecture.md`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use object_store::ObjectStore;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tracing::{error, info, warn};
use weir_common::{Backoff, Clock, FileId, SystemClock, TopicId};

use crate::entry::{Entry, EntryResult};
use crate::link::{ControlLink, DurableRecord, Forwarded, LeaderStatus};
use crate::log::{FenceSlots, LogError, LogRecord, LogStore, Recovered};
use crate::replica::Replica;
use crate::state::State;
use crate::ControlError;
use weir_storage::append::AppendableStore;

mod cluster;
mod freshness;
mod recovery;
mod registry;
mod served;
mod snapshot;
mod writer;

pub use served::{Served, ServedChanges};

use cluster::LeaseTask;
use freshness::Freshness;
pub use registry::{AgentInfo, Registration};
use registry::{Heartbeats, LeaderConnSlot, Registrar};
use snapshot::{SnapshotJob, SnapshotTrigger};
use writer::{Next, Start, Writer, WriterPosition};

/// Tuning of the metadata log writer.
#[derive(Debug, Clone)]
pub struct ControlPlaneSettings {
    /// Log slots written concurrently. More hides object-store latency; each slot is one PUT.
    pub max_inflight_writes: usize,
    /// Entries group-committed into one slot at most.
    pub max_entries_per_slot: usize,
    /// `control.snapshot_max_slots` (alias `snapshot_every_slots`): a snapshot after this many
    /// slots since the last. Snapshots bound replay after a crash; each also triggers log GC.
    pub snapshot_every_slots: u64,
    /// A snapshot after this many bytes of slot payload since the last.
    pub snapshot_max_log_bytes: u64,
    /// A snapshot when the first slot durable this long after the last snapshot (a quiet log
    /// still gets snapshots, so its replay and its objects stay bounded).
    pub snapshot_max_interval: Duration,
    /// Delete what snapshots make unnecessary (RFC 0003 §7). The agent turns it on
    /// (`control.log_gc`); off by default for embedders that read the log from slot 0, like
    /// the simulator's independent replay.
    pub log_gc: bool,
    /// Attempts per log write before the writer gives up and re-recovers.
    pub write_attempts: u32,
    /// Advertised address recorded in the epoch object.
    pub address: String,
    /// Serialise snapshots on the actor's runtime thread instead of a blocking thread. Only the
    /// deterministic simulator sets this: a blocking thread finishes at a time the seed does not
    /// control. Large states stall the writer while encoding, so production leaves it off.
    pub encode_snapshots_inline: bool,
    /// Wall clock recorded in new epochs (expiry clocks start from it after an upgrade).
    pub clock: Arc<dyn Clock>,
    /// Body bytes per snapshot chunk (at most 64 MiB, the default): tests and the simulator
    /// use small chunks so that snapshots span many.
    pub snapshot_chunk_bytes: usize,
    /// The metadata bucket's appendable view, on appendable buckets (RFC 0004): empty slot
    /// objects are written through takeovers, and `prewarmed_slots` slot objects are created
    /// ahead of the log's end so a slot write is one append + flush.
    pub appendable: Option<Arc<dyn AppendableStore>>,
    /// `control.prewarmed_slots` (0: create each slot with a create-only PUT, as without an
    /// appendable view).
    pub prewarmed_slots: usize,
    /// Membership of a cluster (RFC 0002): lead or follow by the lease rule. Without it the
    /// control plane is a cluster of one that always leads, claiming again whenever another
    /// writer overtakes it.
    pub cluster: Option<ClusterSettings>,
    /// Where the writer counts its slots and snapshots (`/metrics`).
    pub metrics: crate::metrics::ControlMetrics,
}

/// A cluster member's identity and timing (RFC 0002 §2). `ControlPlaneSettings::address` is
/// the control address other members reach it at.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: i32,
    /// One per process start: tells a restart of this node from another live agent with its id.
    pub incarnation: String,
    /// `cluster.lease_renew`: the leader renews its lease, and followers read it, this often.
    pub lease_renew: Duration,
    /// `cluster.lease_timeout`: a lease that has not moved this long (on the follower's own
    /// clock) lets a follower take over from a leader that does not answer.
    pub lease_timeout: Duration,
    /// `cluster.forward_timeout`: a forwarded write not answered within it fails retriably.
    pub forward_timeout: Duration,
    pub link: Arc<dyn ControlLink>,
    /// The clock leases and renewals are timed on.
    pub clock: Arc<dyn crate::leadership::MonotonicClock>,
    /// `cluster.agent_timeout`: the leader fences an agent it has not heard from this long.
    pub agent_timeout: Duration,
    /// What the member registers about itself (RFC 0002 §5); `None` keeps it out of the
    /// registry (tests of leadership alone).
    pub agent: Option<AgentInfo>,
    /// A follower serves reads only while its replica was known to hold the whole durable log
    /// at most this long ago (see `plane/freshness.rs`); fetches get no records meanwhile. Must
    /// stay below `gc.grace` less `gc.fetch_plan_ttl` and the read deadline. The lease timeout.
    pub max_read_staleness: Duration,
}

impl ClusterSettings {
    pub fn new(node_id: i32, incarnation: &str, link: Arc<dyn ControlLink>) -> Self {
        Self {
            node_id,
            incarnation: incarnation.to_string(),
            lease_renew: Duration::from_secs(2),
            lease_timeout: Duration::from_secs(10),
            forward_timeout: Duration::from_secs(5),
            link,
            clock: Arc::new(crate::leadership::RuntimeClock),
            agent_timeout: Duration::from_secs(10),
            agent: None,
            max_read_staleness: Duration::from_secs(10),
        }
    }
}

/// What a control plane is at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It writes the log as the leader of `epoch`.
    Leader { epoch: u64 },
    /// It follows the log (the highest epoch it knows of); its writes go to the leader.
    Follower { epoch: u64 },
}

impl Default for ControlPlaneSettings {
    fn default() -> Self {
        Self {
            max_inflight_writes: 8,
            max_entries_per_slot: 4096,
            snapshot_every_slots: 10_000,
            snapshot_max_log_bytes: 256 << 20,
            snapshot_max_interval: Duration::from_secs(600),
            log_gc: false,
            write_attempts: 5,
            address: String::new(),
            encode_snapshots_inline: false,
            clock: Arc::new(SystemClock),
            snapshot_chunk_bytes: crate::log::MAX_SNAPSHOT_CHUNK_BYTES,
            appendable: None,
            prewarmed_slots: 0,
            cluster: None,
            metrics: crate::metrics::ControlMetrics::default(),
        }
    }
}

/// Where a sequenced entry's durable result and its slot go.
type Reply = oneshot::Sender<Result<(EntryResult, u64), ControlError>>;

enum Command {
    Submit {
        entry: Entry,
        reply: Reply,
        /// Sent by a follower: a control plane that no longer leads refuses it.
        forwarded: bool,
    },
    Shutdown {
        done: oneshot::Sender<()>,
    },
}

/// Handle to the control plane; cheap to clone.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    commands: mpsc::Sender<Command>,
    state: Arc<RwLock<State>>,
    durable_seq: watch::Receiver<u64>,
    available: watch::Receiver<bool>,
    role: watch::Receiver<Role>,
    /// The leader's last lease renewal succeeded (a leader cut off from its bucket stops
    /// answering as healthy, so followers take over).
    lease_ok: Arc<AtomicBool>,
    records: broadcast::Sender<DurableRecord>,
    open_claims: u32,
    /// Heartbeats heard while leading (RFC 0002 §5).
    heartbeats: Arc<Heartbeats>,
    registration: watch::Receiver<Registration>,
    /// Set by [`ControlPlane::leave`]: the registrar stops registering this member.
    leaving: Arc<AtomicBool>,
    /// While following: the connection to the leader (the registrar heartbeats on it).
    leader_conn: LeaderConnSlot,
    /// Pending files this agent acknowledged, served before their confirmation is durable.
    acknowledged: Arc<served::Acknowledged>,
    freshness: Arc<Freshness>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Submit {
                entry, forwarded, ..
            } => write!(f, "Submit({entry:?}, forwarded: {forwarded})"),
            Command::Shutdown { .. } => write!(f, "Shutdown"),
        }
    }
}

impl ControlPlane {
    /// Recovers from `store` (snapshot + replay), claims a new epoch, and starts the writer.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        settings: ControlPlaneSettings,
        seed: u64,
    ) -> Result<Self, LogError> {
        let mut log = LogStore::new(store, settings.write_attempts)
            .with_clock(settings.clock.clone())
            .with_snapshot_chunk_bytes(settings.snapshot_chunk_bytes);
        if let Some(appendable) = &settings.appendable {
            log = log.with_appendable(appendable.clone(), settings.prewarmed_slots);
        }
        let mut rng = fastrand::Rng::with_seed(seed);
        let cluster_id = new_cluster_id(&mut rng);
        let state = Arc::new(RwLock::new(State::default()));
        let (start, open_claims) = match &settings.cluster {
            None => {
                let (recovered, claims) =
                    recover_claiming_again(&log, &settings.address, &cluster_id).await?;
                (Start::Lead(Box::new(recovered)), claims)
            }
            Some(cluster) => {
                let start = cluster::start(&log, &settings, cluster, &cluster_id, &state).await?;
                (start, 1)
            }
        };
        let (durable_tx, durable_rx) = watch::channel(0);
        let (available_tx, available_rx) = watch::channel(true);
        let (role_tx, role_rx) = watch::channel(Role::Follower { epoch: 0 });
        let records = crate::link::durable_channel();
        let lease_ok = Arc::new(AtomicBool::new(true));
        let leader_conn = LeaderConnSlot::default();
        let heartbeats = Arc::new(Heartbeats::new(settings.cluster.as_ref().map_or_else(
            || Arc::new(crate::leadership::RuntimeClock) as _,
            |cluster| cluster.clock.clone(),
        )));
        let freshness =
            Arc::new(Freshness::new(settings.cluster.as_ref().map(|cluster| {
                (cluster.clock.clone(), cluster.max_read_staleness)
            })));
        let (commands_tx, commands_rx) = mpsc::channel(4096);
        let mut writer = Writer {
            freshness: freshness.clone(),
            log,
            settings,
            working: State::default(),
            state: state.clone(),
            durable_tx: Arc::new(durable_tx),
            available_tx: Arc::new(available_tx),
            role_tx,
            role_changes: Arc::default(),
            lease_ok: lease_ok.clone(),
            records: records.clone(),
            leader_conn: leader_conn.clone(),
            heartbeats: heartbeats.clone(),
            cluster_id,
            fence: FenceSlots::default(),
            snapshots: SnapshotTrigger::new(),
        };
        let next = match start {
            Start::Lead(recovered) => Next::Lead(writer.install(*recovered)),
            Start::Follow(replica) => Next::Follow(replica),
        };
        let cluster = writer.settings.cluster.clone();
        let (address, clock) = (
            writer.settings.address.clone(),
            writer.settings.clock.clone(),
        );
        tokio::spawn(writer.run(commands_rx, next));
        let (registration_tx, registration) = watch::channel(Registration::Pending);
        let plane = Self {
            commands: commands_tx,
            state,
            durable_seq: durable_rx,
            available: available_rx,
            role: role_rx,
            lease_ok,
            records,
            open_claims,
            heartbeats,
            registration,
            leaving: Arc::default(),
            leader_conn,
            acknowledged: Arc::default(),
            freshness,
        };
        if let Some(cluster) = cluster {
            if let Some(info) = cluster.agent.clone() {
                let registrar = Registrar {
                    plane: plane.clone(),
                    cluster,
                    info,
                    address,
                    clock,
                    registration: registration_tx,
                };
                tokio::spawn(registrar.run());
            }
        }
        Ok(plane)
    }

    /// The leader's side of a follower's heartbeat (RFC 0002 §5).
    /// Only a leader keeps them (a follower's map would never be pruned).
    pub fn heard_from(&self, node_id: i32, incarnation: &str) {
        if matches!(*self.role.borrow(), Role::Leader { .. }) {
            self.heartbeats.heard(node_id, incarnation);
        }
    }

    /// A clean shutdown's first step in a cluster: this member leaves the registry at once
    /// (clients stop being sent to it) instead of when the leader stops hearing from it.
    pub async fn leave(&self, node_id: i32, incarnation: &str, at_ms: i64) {
        self.leaving.store(true, Ordering::SeqCst);
        let registered = self.read(|state| {
            state
                .registry
                .agents
                .get(&node_id)
                .is_some_and(|agent| agent.incarnation == incarnation)
        });
        if !registered {
            return;
        }
        let entry = Entry::FenceAgent {
            node_id,
            incarnation: incarnation.to_string(),
            at_ms,
        };
        match self.submit(entry).await {
            Ok(_) => info!(node_id, "left the cluster's registry"),
            Err(err) => {
                warn!(node_id, error = %err, "could not leave the registry; the leader fences this agent when its heartbeats stop")
            }
        }
    }

    /// Where this member's registration stands (always `Pending` outside a cluster).
    pub fn registration(&self) -> watch::Receiver<Registration> {
        self.registration.clone()
    }

    /// Epochs opening claimed: more than one when another writer overtook a claim.
    pub fn open_claims(&self) -> u32 {
        self.open_claims
    }

    /// Sequences `entry`, and returns its result once it is durable.
    pub async fn submit(&self, entry: Entry) -> Result<EntryResult, ControlError> {
        self.enqueue(entry).await?.await
    }

    /// Queues `entry` behind everything enqueued before it and returns a future for its durable
    /// result. Callers that must keep an order (the committer) enqueue in that order, then await
    /// the results concurrently.
    pub async fn enqueue(
        &self,
        entry: Entry,
    ) -> Result<impl std::future::Future<Output = Result<EntryResult, ControlError>>, ControlError>
    {
        let response = self.send(entry, false).await?;
        Ok(async move { response.await.map(|(result, _)| result) })
    }

    async fn send(&self, entry: Entry, forwarded: bool) -> Result<Forwarded, ControlError> {
        let (reply, response) = oneshot::channel();
        self.commands
            .send(Command::Submit {
                entry,
                reply,
                forwarded,
            })
            .await
            .map_err(|_| ControlError::ShuttingDown)?;
        Ok(Box::pin(async move {
            response.await.map_err(|_| ControlError::ShuttingDown)?
        }))
    }

    /// The leader's side of a follower's write (RFC 0002 §4): sequenced behind everything
    /// enqueued before it, answered with its slot once durable. Refused unless this control
    /// plane leads.
    pub async fn accept_forwarded(&self, entry: Entry) -> Result<Forwarded, ControlError> {
        if matches!(entry, Entry::NewEpoch { .. }) {
            // Only a recovering leader writes one, never through another agent.
            return Err(ControlError::InvalidConfig(
                "a NewEpoch entry cannot be forwarded".into(),
            ));
        }
        if !self.leader_status().available {
            return Err(not_leader());
        }
        self.send(entry, true).await
    }

    /// Read-your-writes across agents (RFC 0002 §3): returns once everything the leader had
    /// made durable when asked (so everything any agent acknowledged before this call) is in
    /// this control plane's readable state. The leader, and a single agent, return at once;
    /// a follower asks the leader for its durable position and waits for its replica to reach
    /// it. Fails (`Unavailable`) when no leader answers or the replica does not get there
    /// within `timeout`; the caller may still answer from the replica, which is only older.
    pub async fn barrier(&self, timeout: Duration) -> Result<(), ControlError> {
        if matches!(*self.role.borrow(), Role::Leader { .. }) {
            return Ok(());
        }
        if !*self.available.borrow() {
            // A forward failed and the leader has not been reached since: do not wait on it.
            return Err(ControlError::Unavailable(
                "the leader is not reachable".into(),
            ));
        }
        let conn = self
            .leader_conn
            .get()
            .ok_or_else(|| ControlError::Unavailable("no control-plane leader known".into()))?;
        let timed_out = |_| ControlError::Unavailable(format!("no barrier within {timeout:?}"));
        tokio::time::timeout(timeout, async {
            let target = conn.barrier().await?;
            let mut durable = self.durable_seq.clone();
            durable
                .wait_for(|seq| *seq >= target)
                .await
                .map(|_| ())
                .map_err(|_| ControlError::Unavailable("the control plane stopped".into()))
        })
        .await
        .map_err(timed_out)?
    }

    /// The leader's durable position, for a follower's barrier; refused unless it leads.
    pub fn leader_barrier(&self) -> Result<u64, ControlError> {
        let status = self.leader_status();
        if !status.available {
            return Err(not_leader());
        }
        Ok(status.durable)
    }

    /// Whether this control plane leads and can write now, its epoch and durable position.
    pub fn leader_status(&self) -> LeaderStatus {
        let (epoch, leads) = match *self.role.borrow() {
            Role::Leader { epoch } => (epoch, true),
            Role::Follower { epoch } => (epoch, false),
        };
        LeaderStatus {
            epoch,
            available: leads && *self.available.borrow() && self.lease_ok.load(Ordering::Relaxed),
            durable: *self.durable_seq.borrow(),
        }
    }

    /// The slots this control plane makes durable as the leader, from now on.
    pub fn durable_records(&self) -> broadcast::Receiver<DurableRecord> {
        self.records.subscribe()
    }

    /// Leader or follower, and of which epoch.
    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Reserves a place in the sequencing queue, so that the caller can then sequence an entry
    /// synchronously: inside a lock that must cover both a check and the entry's position in the
    /// log (an OffsetCommit validated against a group generation that a rebalance may end).
    pub async fn reserve(&self) -> Result<Reservation<'_>, ControlError> {
        let permit = self
            .commands
            .reserve()
            .await
            .map_err(|_| ControlError::ShuttingDown)?;
        Ok(Reservation { permit })
    }

    /// Reads the durable state: every entry whose slot is durable and none other. Never hold the
    /// closure across an await.
    pub fn read<R>(&self, reader: impl FnOnce(&State) -> R) -> R {
        let guard = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reader(&guard)
    }

    /// Whether this agent may serve reads from its state now: outside a cluster and on the
    /// leader always; on a follower while its replica was known to hold the whole durable log
    /// within `cluster.max_read_staleness` (see `plane/freshness.rs`).
    pub fn serves_fresh_reads(&self) -> bool {
        self.freshness.fresh()
    }

    /// Reads the durable state as this agent serves it to consumers: with the pending files it
    /// acknowledged readable (see [`Served`]). Never hold the closure across an await.
    pub fn read_served<R>(&self, reader: impl FnOnce(Served<'_>) -> R) -> R {
        let guard = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.acknowledged.with(&guard, reader)
    }

    /// Serves a pending file this agent acknowledged (its reservation durable, `holders` a
    /// quorum) until [`Self::forget_acknowledged`].
    pub fn serve_acknowledged(&self, file_id: FileId, holders: Vec<u8>) {
        self.acknowledged.insert(file_id, holders);
    }

    /// Stops serving `file_id` from this agent's own knowledge (its confirmation's slot is
    /// settled: durable, so the state serves it, or failed, so the resolver will confirm it).
    pub fn forget_acknowledged(&self, file_id: &FileId) {
        self.acknowledged.remove(file_id);
    }

    /// Waits until the durable log holds the confirmations of every file this agent serves
    /// from its own knowledge now, so the stable view covers what its consumers were shown (an
    /// operation bounded by the stable high watermark, DeleteRecords); `false` if `deadline`
    /// came first.
    pub async fn settle_acknowledged(&self, deadline: tokio::time::Instant) -> bool {
        self.acknowledged.settle(deadline).await
    }

    /// How many acknowledged files wait for their confirmation
    /// (`weir_acknowledged_unconfirmed_files`).
    pub fn acknowledged_unconfirmed(&self) -> usize {
        self.acknowledged.len()
    }

    /// Wakes when what [`Self::read_served`] shows may have grown (fetch long-poll wake-up).
    pub fn subscribe_served(&self) -> ServedChanges {
        ServedChanges::new(self.durable_seq.clone(), self.acknowledged.subscribe())
    }

    /// A receiver that changes whenever a log slot becomes durable (fetch long-poll wake-up).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.durable_seq.clone()
    }

    /// `true` while the writer serves from a recovered state; `false` from a log failure until
    /// recovery has installed the durable state again. It turns `false` before any caller of
    /// the failed slot is answered. While it is `false`, [`Self::read`] shows the durable prefix
    /// the writer knew of, but a failed write may still have landed (an ambiguous PUT), which
    /// only recovery finds out: a reader that must see the log's last word (the committer's
    /// chain tip) waits for `true`.
    pub fn availability(&self) -> watch::Receiver<bool> {
        self.available.clone()
    }

    /// Finishes in-flight writes, writes a snapshot, and stops the writer.
    pub async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.commands.send(Command::Shutdown { done }).await.is_ok() {
            let _ = finished.await;
        }
    }

    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: std::collections::BTreeMap<String, String>,
        seed: u64,
    ) -> Result<TopicId, ControlError> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let entry = Entry::CreateTopic {
            name: name.to_string(),
            topic_id: TopicId::random(&mut rng),
            partitions,
            configs,
        };
        match self.submit(entry).await? {
            EntryResult::CreateTopic(result) => result,
            other => Err(unexpected(other)),
        }
    }
}

/// A place in the sequencing queue taken by [`ControlPlane::reserve`].
#[derive(Debug)]
pub struct Reservation<'a> {
    permit: mpsc::Permit<'a, Command>,
}

impl Reservation<'_> {
    /// Sequences `entry` now, behind everything enqueued before, and returns a future for its
    /// durable result.
    pub fn enqueue(
        self,
        entry: Entry,
    ) -> impl std::future::Future<Output = Result<EntryResult, ControlError>> {
        let (reply, response) = oneshot::channel();
        self.permit.send(Command::Submit {
            entry,
            reply,
            forwarded: false,
        });
        async move {
            response
                .await
                .map_err(|_| ControlError::ShuttingDown)?
                .map(|(result, _)| result)
        }
    }
}

/// How often opening claims a new epoch after another writer overtook the previous claim.
const OPEN_CLAIM_ATTEMPTS: u32 = 5;

/// Recovery for a starting agent: when another writer overtakes our claim (a rolling restart
/// starts the new agent before the old one stops, or two agents start together), claims again
/// above it, a few times, before giving up.
async fn recover_claiming_again(
    log: &LogStore,
    address: &str,
    cluster_id: &str,
) -> Result<(Recovered, u32), LogError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match log.recover(address, cluster_id).await {
            Ok(recovered) => return Ok((recovered, attempt)),
            Err(err @ (LogError::EpochTaken(_) | LogError::SlotLost { .. }))
                if attempt < OPEN_CLAIM_ATTEMPTS =>
            {
                warn!(attempt, error = %err, "another writer overtook our claim, claiming again");
            }
            Err(err) => return Err(err),
        }
    }
}

fn not_leader() -> ControlError {
    ControlError::Unavailable("not the control-plane leader".into())
}

fn unexpected(result: EntryResult) -> ControlError {
    ControlError::Unavailable(format!("unexpected result {result:?}"))
}

fn new_cluster_id(rng: &mut fastrand::Rng) -> String {
    // Kafka cluster ids are 22-char url-safe base64 of a UUID; any unique string works for clients.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..22)
        .map(|_| ALPHABET[rng.usize(..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod gc_tests;
#[cfg(test)]
mod tests;
