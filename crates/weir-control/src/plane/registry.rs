//! A member's part in the agent registry (RFC 0002 §5): it registers itself through the leader,
//! followers heartbeat to the leader (from a loop of their own), and the leader fences agents it
//! has not heard from for `cluster.agent_timeout`.
//!
//! Heartbeats live in the leader's memory only; a new leader counts every agent as heard when
//! it took over, so an agent is fenced only after a whole timeout of silence to one leader.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use tracing::debug;

use super::*;
use crate::entry::AgentRegistration;
use crate::leadership::MonotonicClock;
use crate::link::LeaderConn;

/// What an agent tells the registry about itself besides its node id and control address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentInfo {
    /// `agent.rack` (`--zone`: the rack clients see; may be empty).
    pub zone: String,
    /// The Kafka address clients are told to connect to.
    pub host: String,
    pub port: i32,
}

/// Where this agent's registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Not in the registry yet (since this process started).
    Pending,
    /// In the registry since this version.
    Registered { since: u64 },
    /// Was registered, and the registry no longer holds it (fenced while cut off from the
    /// leader): it registers again once it reaches the leader. Meanwhile it lists only the
    /// registered agents, so its clients move to them.
    Fenced,
    /// Another agent holds the node id and was not fenced for longer than a failover and the
    /// agent timeout while this one kept asking (with a leader answering): not a dead
    /// predecessor.
    Refused { address: String },
}

/// A follower's current connection to the leader (none while leading or disconnected).
#[derive(Clone, Default)]
pub(crate) struct LeaderConnSlot(Arc<Mutex<Option<Arc<dyn LeaderConn>>>>);

impl LeaderConnSlot {
    pub(crate) fn set(&self, conn: Option<Arc<dyn LeaderConn>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = conn;
    }

    pub(crate) fn get(&self) -> Option<Arc<dyn LeaderConn>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl std::fmt::Debug for LeaderConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaderConnSlot")
    }
}

/// Heartbeats a leader heard, by node id and incarnation.
#[derive(Debug)]
pub(crate) struct Heartbeats {
    clock: Arc<dyn MonotonicClock>,
    heard: Mutex<HashMap<(i32, String), Instant>>,
    /// Agents known to be gone without waiting for the timeout: the leader this member took
    /// over from (its lease stood still for the lease timeout).
    gone: Mutex<HashSet<(i32, String)>>,
    /// The epoch this member last led and since when it has led without a break: epochs it
    /// claimed back to back (a leader's own claim after a failed write) keep the clock, any
    /// other leader's epoch in between restarts it, since heartbeats went to that leader.
    leading: Mutex<Option<(u64, Instant)>>,
}

impl Heartbeats {
    pub(crate) fn new(clock: Arc<dyn MonotonicClock>) -> Self {
        Self {
            clock,
            heard: Mutex::default(),
            gone: Mutex::default(),
            leading: Mutex::default(),
        }
    }

    /// This member leads `epoch` from now (the writer installed it).
    pub(crate) fn lead(&self, epoch: u64) {
        let now = self.clock.now();
        let mut leading = self.leading.lock().unwrap_or_else(|p| p.into_inner());
        let since = match *leading {
            Some((last, since)) if epoch == last || epoch == last + 1 => since,
            _ => now,
        };
        *leading = Some((epoch, since));
    }

    /// Since when this member has led without a break, if it leads `epoch`.
    fn leading_since(&self, epoch: u64) -> Option<Instant> {
        match *self.leading.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((last, since)) if last == epoch => Some(since),
            _ => None,
        }
    }

    /// `node_id`'s `incarnation` stopped (the leader this member took over from).
    pub(crate) fn gone(&self, node_id: i32, incarnation: &str) {
        self.gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((node_id, incarnation.to_string()));
    }

    fn is_gone(&self, node_id: i32, incarnation: &str) -> bool {
        self.gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(node_id, incarnation.to_string()))
    }

    pub(crate) fn heard(&self, node_id: i32, incarnation: &str) {
        let now = self.clock.now();
        self.lock().insert((node_id, incarnation.to_string()), now);
    }

    fn last(&self, node_id: i32, incarnation: &str) -> Option<Instant> {
        self.lock()
            .get(&(node_id, incarnation.to_string()))
            .copied()
    }

    fn forget_before(&self, before: Instant) {
        self.lock().retain(|_, heard| *heard >= before);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i32, String), Instant>> {
        self.heard.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A follower's heartbeats to the leader, once per lease renewal on a loop of their own: the
/// registrar's loop waits for what it submits, which goes through the follow loop, and slow
/// storage reads there (a follower far behind catching up) must not silence this member until
/// the leader fences it. Each is sent in the background, so a slow leader holds nothing up.
async fn heartbeats(plane: ControlPlane, cluster: ClusterSettings) {
    let interval = cluster.clock.real(cluster.lease_renew);
    loop {
        tokio::time::sleep(interval).await;
        if plane.commands.is_closed() || plane.leaving.load(Ordering::SeqCst) {
            return;
        }
        if !matches!(*plane.role.borrow(), Role::Follower { .. }) {
            continue;
        }
        let Some(conn) = plane.leader_conn.get() else {
            continue;
        };
        let (node_id, incarnation) = (cluster.node_id, cluster.incarnation.clone());
        let timeout = cluster.forward_timeout;
        tokio::spawn(async move {
            let sent = tokio::time::timeout(timeout, conn.heartbeat(node_id, &incarnation)).await;
            if let Ok(Err(err)) = sent {
                debug!(error = %err, "heartbeat to the leader failed");
            }
        });
    }
}

/// The registry task of one member: registers it, and fences silent agents while it leads.
pub(super) struct Registrar {
    pub(super) plane: ControlPlane,
    pub(super) cluster: ClusterSettings,
    pub(super) info: AgentInfo,
    pub(super) address: String,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) registration: watch::Sender<Registration>,
}

impl Registrar {
    pub(super) async fn run(self) {
        tokio::spawn(heartbeats(self.plane.clone(), self.cluster.clone()));
        let mut refused_since: Option<Instant> = None;
        // Agents being fenced (warned about once).
        let mut fencing = HashSet::new();
        let interval = self.cluster.clock.real(self.cluster.lease_renew);
        loop {
            tokio::time::sleep(interval).await;
            if self.plane.commands.is_closed() || self.plane.leaving.load(Ordering::SeqCst) {
                return;
            }
            let now = self.cluster.clock.now();
            // Since when this member leads, from the writer's installs rather than from this
            // loop's samples: leadership can move to another member and back between two ticks,
            // and heartbeats meanwhile went to the other leader.
            let leading_since = match *self.plane.role.borrow() {
                Role::Leader { epoch } => {
                    Some(self.plane.heartbeats.leading_since(epoch).unwrap_or(now))
                }
                Role::Follower { .. } => None,
            };
            if let Some(since) = leading_since {
                self.fence_silent(since, now, &mut fencing).await;
            }
            self.register(now, &mut refused_since).await;
        }
    }

    /// The leader's duty: fences every agent (but itself) silent for the agent timeout.
    async fn fence_silent(
        &self,
        leading_since: Instant,
        now: Instant,
        fencing: &mut HashSet<(i32, String)>,
    ) {
        let timeout = self.cluster.agent_timeout;
        let agents = self.plane.read(|state| state.registry.agents.clone());
        let heartbeats = &self.plane.heartbeats;
        for (node_id, agent) in agents {
            if node_id == self.cluster.node_id && agent.incarnation == self.cluster.incarnation {
                continue;
            }
            let heard = heartbeats
                .last(node_id, &agent.incarnation)
                .map_or(leading_since, |heard| heard.max(leading_since));
            let silent = now.saturating_duration_since(heard);
            if silent < timeout && !heartbeats.is_gone(node_id, &agent.incarnation) {
                continue;
            }
            if fencing.insert((node_id, agent.incarnation.clone())) {
                warn!(
                    node_id,
                    address = %format!("{}:{}", agent.host, agent.port),
                    zone = %agent.zone,
                    ?silent,
                    "no heartbeat from this agent; fencing it (it registers again when it is back)"
                );
            }
            let entry = Entry::FenceAgent {
                node_id,
                incarnation: agent.incarnation.clone(),
                at_ms: self.clock.now_ms(),
            };
            if let Err(err) = self.plane.submit(entry).await {
                debug!(node_id, error = %err, "could not fence an agent");
            }
        }
        heartbeats.forget_before(now.checked_sub(timeout * 2).unwrap_or(now));
        let registered = self.plane.read(|state| state.registry.agents.clone());
        let still = |(node_id, incarnation): &(i32, String)| {
            registered
                .get(node_id)
                .is_some_and(|agent| agent.incarnation == *incarnation)
        };
        fencing.retain(still);
        heartbeats
            .gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(still);
    }

    /// Registers this agent unless the registry holds it as it is.
    async fn register(&self, now: Instant, refused_since: &mut Option<Instant>) {
        if self.plane.leaving.load(Ordering::SeqCst) {
            return;
        }
        let me = self.cluster.node_id;
        let registered = self.plane.read(|state| {
            state.registry.agents.get(&me).and_then(|agent| {
                let current = agent.incarnation == self.cluster.incarnation
                    && agent.zone == self.info.zone
                    && agent.host == self.info.host
                    && agent.port == self.info.port
                    && agent.control_address == self.address;
                current.then_some(agent.since)
            })
        });
        if let Some(since) = registered {
            *refused_since = None;
            let changed = self
                .registration
                .send_if_modified(|now| replace(now, Registration::Registered { since }));
            if changed {
                // Logged from the registry, not from the answer: a registration whose answer
                // was lost (the leader died) may still have landed.
                info!(
                    node_id = me,
                    version = since,
                    zone = %self.info.zone,
                    "registered in the cluster"
                );
            }
            return;
        }
        self.registration.send_if_modified(unregistered);
        if !*self.plane.available.borrow() {
            // Nobody can fence a dead predecessor meanwhile: patience starts again.
            *refused_since = None;
            return;
        }
        let entry = Entry::RegisterAgent(AgentRegistration {
            node_id: me,
            incarnation: self.cluster.incarnation.clone(),
            zone: self.info.zone.clone(),
            host: self.info.host.clone(),
            port: self.info.port,
            control_address: self.address.clone(),
            at_ms: self.clock.now_ms(),
        });
        match self.plane.submit(entry).await {
            Ok(EntryResult::RegisterAgent(Ok(version))) => {
                debug!(node_id = me, version, "registration durable");
                *refused_since = None;
            }
            Ok(EntryResult::RegisterAgent(Err(ControlError::NodeIdTaken { address, .. }))) => {
                let since = *refused_since.get_or_insert(now);
                // A dead predecessor of this node id is fenced within the agent timeout of a
                // leader (after a failover, of the next one); one that outlives that and a few
                // renewals of slack is alive.
                let patience = self.cluster.lease_timeout
                    + self.cluster.agent_timeout
                    + self.cluster.lease_renew * 3;
                if now.saturating_duration_since(since) >= patience {
                    error!(
                        node_id = me,
                        %address,
                        "another live agent has this node id; give each agent its own --node-id"
                    );
                    self.registration
                        .send_replace(Registration::Refused { address });
                } else {
                    info!(
                        node_id = me,
                        %address,
                        "the node id is still registered to the agent at this address; \
                         waiting for it to be fenced"
                    );
                }
            }
            Ok(other) => warn!(?other, "unexpected result of a registration"),
            Err(err) => {
                *refused_since = None;
                debug!(error = %err, "could not register; retrying");
            }
        }
    }
}

fn replace(current: &mut Registration, new: Registration) -> bool {
    if *current == new {
        return false;
    }
    *current = new;
    true
}

/// Not in the registry: `Fenced` once it was registered, else still `Pending`; a refusal is
/// final.
fn unregistered(current: &mut Registration) -> bool {
    match current {
        Registration::Refused { .. } | Registration::Pending => false,
        Registration::Registered { .. } | Registration::Fenced => {
            replace(current, Registration::Fenced)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leadership::RuntimeClock;

    /// A leader's clock for silent agents runs from its own first claim while it claims epoch
    /// after epoch itself, and restarts when another member led in between: heartbeats went
    /// to that member meanwhile (a writer deposed while idle, taking over again later, would
    /// otherwise fence every agent at once).
    #[tokio::test(start_paused = true)]
    async fn test_leading_since_restarts_after_another_members_epoch() {
        let heartbeats = Heartbeats::new(Arc::new(RuntimeClock));
        heartbeats.lead(5);
        let first = heartbeats.leading_since(5).expect("leads 5");
        tokio::time::advance(Duration::from_millis(300)).await;
        heartbeats.lead(6);
        assert_eq!(heartbeats.leading_since(6), Some(first));
        assert_eq!(heartbeats.leading_since(5), None, "no longer leads 5");
        tokio::time::advance(Duration::from_millis(300)).await;
        heartbeats.lead(9);
        let again = heartbeats.leading_since(9).expect("leads 9");
        assert_eq!(again - first, Duration::from_millis(600));
    }
}
