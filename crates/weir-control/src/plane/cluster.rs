//! A cluster member's control plane (RFC 0002 §2–4): how it starts, the leader's lease, and
//! the follower: its replica fed by the leader's durable records (and the bucket when the
//! stream missed some), its writes forwarded to the leader, and its watch on the lease that
//! decides when it takes over.

use futures::stream::BoxStream;
use tokio::sync::Mutex;
use tokio::time::MissedTickBehavior;
use tracing::debug;

use super::registry::LeaderConnSlot;
use super::*;
use crate::leadership::{
    at_start, may_take_over, read_lease, AtStart, Candidate, Lease, LeaseKeeper, LeaseState,
    LeaseWatch,
};
use crate::link::LeaderConn;
use crate::replica::Offered;

/// How a member starts (RFC 0002 §2 "Start"): it replays the log into its replica, reads the
/// highest epoch's lease twice two renewals apart, and leads only when nobody holds it.
pub(super) async fn start(
    log: &LogStore,
    settings: &ControlPlaneSettings,
    cluster: &ClusterSettings,
    cluster_id: &str,
    state: &Arc<RwLock<State>>,
) -> Result<Start, LogError> {
    let mut replica = Replica::resume(state.clone(), log.replay().await?);
    let highest = log.highest_epoch().await?.max(replica.log_epoch());
    let me = Candidate {
        node_id: cluster.node_id,
        incarnation: &cluster.incarnation,
    };
    let first = read_lease(log.store().as_ref(), highest).await?;
    if highest > 0 {
        // Two renewal intervals: a live leader's renewal lands in between even when its PUT
        // started just after our first read.
        tokio::time::sleep(cluster.clock.real(cluster.lease_renew * 2)).await;
    }
    let second = read_lease(log.store().as_ref(), highest).await?;
    match at_start(highest, first.as_ref(), second.as_ref(), me) {
        AtStart::Lead => {
            let recovered = log
                .recover_after(highest, &settings.address, cluster_id, Some(&mut replica))
                .await;
            match recovered {
                Ok(recovered) => Ok(Start::Lead(Box::new(recovered))),
                Err(err @ (LogError::EpochTaken(_) | LogError::SlotLost { .. })) => {
                    info!(error = %err, "another agent took over as we started; following it");
                    Ok(Start::Follow(replica))
                }
                Err(err) => Err(err),
            }
        }
        AtStart::Follow | AtStart::Watch => {
            info!(epoch = highest, "a leader holds the lease; following it");
            Ok(Start::Follow(replica))
        }
        AtStart::DuplicateNodeId { address } => Err(LogError::DuplicateNodeId {
            node_id: cluster.node_id,
            address,
        }),
    }
}

/// The leader's lease, renewed in the background until dropped or released. Each renewal
/// also looks for the next epoch's object: once a later epoch is claimed the leader steps down.
pub(super) struct LeaseTask {
    keeper: Arc<Mutex<LeaseKeeper>>,
    task: tokio::task::JoinHandle<()>,
    /// The later epoch found (0: none yet).
    overtaken: watch::Receiver<u64>,
}

/// The later epoch that overtook the leader, or pending for ever without a lease task.
pub(super) async fn overtaken(lease: &mut Option<LeaseTask>) -> u64 {
    let Some(lease) = lease else {
        return std::future::pending().await;
    };
    let found = lease
        .overtaken
        .wait_for(|epoch| *epoch > 0)
        .await
        .map(|epoch| *epoch);
    match found {
        Ok(epoch) => epoch,
        Err(_) => std::future::pending().await,
    }
}

impl LeaseTask {
    pub(super) fn start(
        log: &LogStore,
        address: &str,
        cluster: &ClusterSettings,
        epoch: u64,
        renewed: Arc<AtomicBool>,
    ) -> LeaseTask {
        let keeper = Arc::new(Mutex::new(LeaseKeeper::new(
            log.store().clone(),
            epoch,
            cluster.node_id,
            &cluster.incarnation,
            address,
        )));
        let renew = cluster.clock.real(cluster.lease_renew);
        let (overtaken_tx, overtaken) = watch::channel(0);
        let log = log.clone();
        let task = tokio::spawn({
            let keeper = keeper.clone();
            async move {
                loop {
                    match log.epoch_address(epoch + 1).await {
                        Ok(Some(address)) => {
                            warn!(
                                epoch,
                                later = epoch + 1,
                                %address,
                                "a later epoch was claimed; stepping down"
                            );
                            overtaken_tx.send_replace(epoch + 1);
                            return;
                        }
                        Ok(None) => {}
                        Err(err) => debug!(error = %err, "could not look for a later epoch"),
                    }
                    let result = keeper.lock().await.renew().await;
                    // A leader that cannot renew is cut off from its bucket: it stops answering
                    // followers as healthy, so one of them takes over once the lease times out.
                    renewed.store(result.is_ok(), Ordering::Relaxed);
                    if let Err(err) = result {
                        warn!(epoch, error = %err, "could not renew the leader's lease");
                    }
                    tokio::time::sleep(renew).await;
                }
            }
        });
        LeaseTask {
            keeper,
            task,
            overtaken,
        }
    }

    /// A clean shutdown: followers take over without waiting for the lease to time out.
    pub(super) async fn release(self) {
        self.task.abort();
        if let Err(err) = self.keeper.lock().await.release().await {
            warn!(error = %err, "could not release the leader's lease");
        }
    }
}

impl Drop for LeaseTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A follower's view of the leader.
struct Following {
    cluster: ClusterSettings,
    /// The lease of the highest epoch known.
    watch: LeaseWatch,
    conn: Option<Arc<dyn LeaderConn>>,
    /// `conn`, shared with the registrar (its heartbeats).
    shared: LeaderConnSlot,
    records: Option<BoxStream<'static, DurableRecord>>,
    /// The leader address last logged as connected.
    announced: Option<String>,
}

impl Following {
    fn disconnect(&mut self) {
        self.conn = None;
        self.shared.set(None);
        self.records = None;
    }

    /// Watches a newer epoch's lease (and its leader) from now.
    fn watch_epoch(&mut self, epoch: u64) {
        let now = self.cluster.clock.now();
        self.watch = LeaseWatch::new(epoch, self.cluster.lease_timeout, now);
        self.disconnect();
    }
}

/// The next record of the leader's stream, or pending forever without one.
async fn next_record(
    records: &mut Option<BoxStream<'static, DurableRecord>>,
) -> Option<DurableRecord> {
    match records {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

impl Writer {
    /// Follows the leader until shutdown (`None`) or until it takes over (the position it
    /// leads from).
    pub(super) async fn follow(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        mut replica: Replica,
    ) -> Option<WriterPosition> {
        let cluster = self.settings.cluster.clone()?;
        let mut following = Following {
            watch: LeaseWatch::new(
                replica.log_epoch(),
                cluster.lease_timeout,
                cluster.clock.now(),
            ),
            cluster,
            conn: None,
            shared: self.leader_conn.clone(),
            records: None,
            announced: None,
        };
        self.role_changes.fetch_add(1, Ordering::SeqCst);
        self.freshness.follow();
        self.role_tx.send_replace(Role::Follower {
            epoch: replica.log_epoch(),
        });
        self.publish(&replica);
        let cluster = &following.cluster;
        let mut tick = tokio::time::interval(cluster.clock.real(cluster.lease_renew));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    None => return None,
                    Some(Command::Shutdown { done }) => {
                        commands.close();
                        let _ = done.send(());
                        return None;
                    }
                    Some(Command::Submit { reply, forwarded: true, .. }) => {
                        let _ = reply.send(Err(not_leader()));
                    }
                    Some(Command::Submit { entry, reply, .. }) => {
                        self.forward(&mut following, entry, reply).await;
                    }
                },
                record = next_record(&mut following.records) => match record {
                    Some(record) => self.take_record(&mut replica, record).await,
                    // Lagged or broken: the next tick subscribes again. The connection (and
                    // its submit stream, with writes in flight) stays.
                    None => following.records = None,
                },
                _ = tick.tick() => {
                    if let Some(position) = self.follower_tick(&mut following, &mut replica).await {
                        following.disconnect();
                        return Some(position);
                    }
                }
            }
        }
    }

    /// The replica's position, for readers waiting on new slots and forwarded writes waiting
    /// for theirs.
    fn publish(&self, replica: &Replica) {
        self.durable_tx
            .send_replace(replica.next_seq().saturating_sub(1));
    }

    /// Applies a durable record from the leader's stream; slots the stream skipped come from
    /// the bucket first.
    async fn take_record(&mut self, replica: &mut Replica, record: DurableRecord) {
        if let Offered::Gap { .. } = replica.offer(record.seq, record.epoch, &record.entries) {
            if let Err(err) = replica.catch_up(&self.log, Some(record.seq)).await {
                warn!(error = %err, "follower could not read the metadata log");
            }
            replica.offer(record.seq, record.epoch, &record.entries);
        }
        self.publish(replica);
    }

    /// Sends a write to the leader on this agent's stream and answers it once the replica
    /// holds its slot. Any failure is retriable for the caller, and makes the control plane
    /// unavailable until a barrier on the leader is applied here: the entry's fate is unknown,
    /// so a caller that keeps a chain (the committer) must read the chain's tip again.
    async fn forward(&mut self, following: &mut Following, entry: Entry, reply: Reply) {
        let sent = match &following.conn {
            Some(conn) => conn.send(entry).await,
            None => Err(ControlError::Unavailable(
                "no control-plane leader is reachable".into(),
            )),
        };
        let result = match sent {
            Ok(result) => result,
            Err(err) => {
                self.available_tx.send_replace(false);
                following.disconnect();
                let _ = reply.send(Err(err));
                return;
            }
        };
        let available = self.available_tx.clone();
        let (role_changes, role) = (
            self.role_changes.clone(),
            self.role_changes.load(Ordering::SeqCst),
        );
        let mut durable = self.durable_tx.subscribe();
        let timeout = following.cluster.forward_timeout;
        tokio::spawn(async move {
            let answer = tokio::time::timeout(timeout, async {
                let (result, seq) = result.await?;
                durable
                    .wait_for(|durable| *durable >= seq)
                    .await
                    .map_err(|_| ControlError::ShuttingDown)?;
                Ok((result, seq))
            })
            .await
            .unwrap_or_else(|_| {
                Err(ControlError::Unavailable(format!(
                    "the control-plane leader did not answer within {timeout:?}"
                )))
            });
            if answer.is_err() {
                // Under the watch's lock, so a take-over (which bumps the count before it
                // makes the plane available) is never undone by a stale failure.
                available.send_if_modified(|available| {
                    let still_following = role_changes.load(Ordering::SeqCst) == role;
                    let changed = still_following && *available;
                    if still_following {
                        *available = false;
                    }
                    changed
                });
            }
            let _ = reply.send(answer);
        });
    }

    /// Once per lease renewal: catch up from the bucket, follow newer epochs, (re)connect to
    /// the leader, restore availability after a barrier, and take over when the lease rule
    /// says the leader stopped (the position it then leads from).
    async fn follower_tick(
        &mut self,
        following: &mut Following,
        replica: &mut Replica,
    ) -> Option<WriterPosition> {
        if let Err(err) = replica.catch_up(&self.log, None).await {
            warn!(error = %err, "follower could not read the metadata log");
        }
        self.publish(replica);
        if replica.log_epoch() > following.watch.epoch() {
            following.watch_epoch(replica.log_epoch());
        }
        self.role_tx.send_replace(Role::Follower {
            epoch: following.watch.epoch(),
        });
        let asked = following.cluster.clock.now();
        let lease = match read_lease(self.log.store().as_ref(), following.watch.epoch()).await {
            Ok(lease) => lease,
            Err(err) => {
                warn!(error = %err, "follower could not read the leader's lease");
                return None;
            }
        };
        let answered = following.cluster.clock.now();
        let state = following.watch.observe(lease.as_ref(), asked, answered);
        following
            .cluster
            .link
            .cluster_id_known(&replica.state().cluster_id.clone());
        if following.conn.is_none() {
            self.connect(following, lease.as_ref()).await;
        } else if following.records.is_none() {
            self.subscribe(following).await;
        }
        if !*self.available_tx.borrow() {
            self.restore_availability(following, replica).await;
        }
        self.confirm_fresh(following, replica).await;
        if matches!(state, LeaseState::Held { .. }) {
            return None;
        }
        let highest = match self.log.highest_epoch().await {
            Ok(highest) => highest,
            Err(err) => {
                warn!(error = %err, "follower could not list epochs");
                return None;
            }
        };
        if highest > following.watch.epoch() {
            following.watch_epoch(highest);
            return None;
        }
        let answers = match &following.conn {
            Some(conn) => conn
                .status()
                .await
                .is_ok_and(|status| status.available && status.epoch >= following.watch.epoch()),
            None => false,
        };
        let me = Candidate {
            node_id: following.cluster.node_id,
            incarnation: &following.cluster.incarnation,
        };
        if !may_take_over(&state, &following.watch, highest, answers, me) {
            return None;
        }
        let epoch = following.watch.epoch();
        info!(epoch, ?state, "the leader stopped; taking over");
        let recovered = self
            .log
            .recover_after(
                epoch,
                &self.settings.address,
                &self.cluster_id,
                Some(replica),
            )
            .await;
        match recovered {
            Ok(recovered) => {
                if let LeaseState::Stale {
                    node_id,
                    incarnation,
                } = &state
                {
                    // It stopped: it leaves the registry now, not an agent timeout later.
                    self.heartbeats.gone(*node_id, incarnation);
                }
                Some(self.install(recovered))
            }
            Err(err) => {
                warn!(epoch, error = %err, "could not take over; following on");
                self.publish(replica);
                None
            }
        }
    }

    /// Connects to the leader of the watched epoch (its address from the lease, or from the
    /// epoch object before its first lease) and subscribes to its records.
    async fn connect(&self, following: &mut Following, lease: Option<&Lease>) {
        let address = match lease {
            Some(lease) => Some(lease.address.clone()),
            None => self
                .log
                .epoch_address(following.watch.epoch())
                .await
                .ok()
                .flatten(),
        };
        let Some(address) = address.filter(|a| !a.is_empty() && *a != self.settings.address) else {
            return;
        };
        match following.cluster.link.connect(&address) {
            Ok(conn) => {
                // Once per leader address: a follower that did not log this since it began to
                // follow cannot forward writes or heartbeat.
                if following.announced.as_deref() != Some(address.as_str()) {
                    info!(%address, epoch = following.watch.epoch(), "connected to the control-plane leader");
                    following.announced = Some(address.clone());
                }
                following.shared.set(Some(conn.clone()));
                following.conn = Some(conn);
                self.subscribe(following).await;
            }
            Err(err) => debug!(%address, error = %err, "leader unreachable"),
        }
    }

    /// Subscribes to the connected leader's durable records.
    async fn subscribe(&self, following: &mut Following) {
        let Some(conn) = &following.conn else {
            return;
        };
        match conn.records().await {
            Ok(records) => following.records = Some(records),
            Err(err) => debug!(error = %err, "no record stream from the leader"),
        }
    }

    /// Records that the replica held the whole durable log when asked, which lets this
    /// follower serve reads for `max_read_staleness` more (see `plane/freshness.rs`). It asks
    /// the leader its durable position and catches up to it; a leader that cannot write its log
    /// (cut off from its bucket, or deposed) confirms nothing. Without a leader's answer the
    /// bucket may confirm it: the next slot absent, and no snapshot past it (log GC deletes
    /// slots only behind a snapshot), costing a GET and a LIST per tick while cut off.
    async fn confirm_fresh(&mut self, following: &mut Following, replica: &mut Replica) {
        let asked = following.cluster.clock.now();
        let status = match &following.conn {
            Some(conn) => match conn.status().await {
                Ok(status) if status.available && status.epoch >= following.watch.epoch() => {
                    Some(status)
                }
                Ok(_) => None,
                Err(err) => {
                    debug!(error = %err, "leader status failed");
                    None
                }
            },
            None => None,
        };
        let whole = match status {
            Some(status) => {
                if replica.next_seq() <= status.durable {
                    if let Err(err) = replica.catch_up(&self.log, Some(status.durable)).await {
                        warn!(error = %err, "follower could not read the metadata log");
                    }
                    self.publish(replica);
                }
                replica.next_seq() > status.durable
            }
            None => replica.holds_whole_log(&self.log).await.unwrap_or(false),
        };
        if whole {
            self.freshness.confirmed(asked);
        }
    }

    /// After a failed forward: available again once a barrier on the leader is applied here.
    async fn restore_availability(&mut self, following: &mut Following, replica: &mut Replica) {
        let Some(conn) = &following.conn else {
            return;
        };
        let barrier = match conn.barrier().await {
            Ok(barrier) => barrier,
            Err(err) => {
                debug!(error = %err, "barrier failed");
                following.disconnect();
                return;
            }
        };
        if replica.next_seq() <= barrier {
            if let Err(err) = replica.catch_up(&self.log, Some(barrier)).await {
                warn!(error = %err, "follower could not read the metadata log");
            }
            self.publish(replica);
        }
        if replica.next_seq() > barrier {
            self.available_tx.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests;
