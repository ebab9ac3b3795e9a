//! Cluster seeds (RFC 0002): 3–5 agents share the buckets; one leads the metadata log, the
//! others follow it, forward their writes and serve their clients from their replicas, linked
//! in process through `LocalLinks`. Faults: kills of any agent (leader or follower, by the
//! seed's crash probability; a killed node restarts with a new incarnation), an agent cut off
//! its peers but not from storage, an agent cut off the metadata bucket but not from its peers.
//! Checks, besides the auditor's (acks durable, every live agent's visible state a prefix of the
//! durable log): after healing, exactly one leader and every agent at the same durable position;
//! then, with the cluster healthy for several lease timeouts, no epoch claimed (a deposed leader
//! that claims again, CTL-3, makes leadership churn), and every agent's registry lists exactly
//! the live members (RFC 0002 §5: the dead fenced, the restarted registered again).

use weir_control::leadership::MonotonicClock;
use weir_control::plane::{AgentInfo, ClusterSettings, Role};

use super::*;

/// What a cluster seed chose.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClusterScenario {
    pub(super) agents: i32,
    pub(super) lease_renew: Duration,
    pub(super) lease_timeout: Duration,
    pub(super) forward_timeout: Duration,
    /// Per step: cut a live agent off its peers, or heal one.
    pub(super) p_cut: f64,
    /// Per step: cut a live agent off the metadata bucket, or restore it.
    pub(super) p_agent_outage: f64,
    /// Per step: cut a live agent off its peers and the metadata bucket at once (a network
    /// partition of one host that keeps running), or heal both.
    pub(super) p_isolate: f64,
    /// Each member's monotonic clock runs at a rate drawn from `1 ± max_skew`.
    pub(super) max_skew: f64,
}

impl ClusterScenario {
    /// `cluster.agent_timeout`: a registered agent silent this long is fenced.
    fn agent_timeout(&self) -> Duration {
        self.lease_timeout * 2
    }

    /// A third of the seeds.
    pub(super) fn pick(rng: &mut fastrand::Rng) -> Option<Self> {
        if rng.u32(..3) != 0 {
            return None;
        }
        let lease_renew = Duration::from_millis(rng.u64(20..=100));
        Some(ClusterScenario {
            agents: rng.i32(3..=5),
            lease_renew,
            lease_timeout: lease_renew * rng.u32(3..=6),
            forward_timeout: Duration::from_millis(rng.u64(200..=1_000)),
            p_cut: [0.0, 0.005, 0.02][rng.usize(..3)],
            p_agent_outage: [0.0, 0.005, 0.02][rng.usize(..3)],
            max_skew: [0.0, 0.2, 0.5][rng.usize(..3)],
            p_isolate: [0.0, 0.005, 0.01][rng.usize(..3)],
        })
    }

    pub(super) fn describe(this: &Option<Self>) -> String {
        match this {
            None => "one agent at a time".to_string(),
            Some(c) => format!(
                "cluster of {} (lease {:?}/{:?}, forward timeout {:?}, cut {:.1}%, agent \
                 outage {:.1}%, isolation {:.1}%, clock rates 1±{})",
                c.agents,
                c.lease_renew,
                c.lease_timeout,
                c.forward_timeout,
                c.p_cut * 100.0,
                c.p_agent_outage * 100.0,
                c.p_isolate * 100.0,
                c.max_skew
            ),
        }
    }
}

/// A member's monotonic clock, running `rate` times as fast as the simulation's.
#[derive(Debug)]
struct SkewedMonotonic {
    origin: tokio::time::Instant,
    rate: f64,
}

impl MonotonicClock for SkewedMonotonic {
    fn now(&self) -> std::time::Instant {
        self.origin.into_std() + self.origin.elapsed().mul_f64(self.rate)
    }

    fn real(&self, by: Duration) -> Duration {
        by.div_f64(self.rate)
    }
}

/// A cluster member's identity and its private view of the metadata bucket.
pub(super) struct Membership {
    pub(super) node_id: i32,
    pub(super) incarnation: String,
    pub(super) address: String,
    /// An outage here cuts this agent (only) off the metadata bucket.
    pub(super) log_view: Arc<ModelStore>,
}

impl World {
    /// Starts agents for the nodes without a live or opening incarnation.
    pub(super) fn ensure_members(&mut self, cluster: ClusterScenario) {
        if tokio::time::Instant::now() < self.open_after {
            return;
        }
        for node_id in 1..=cluster.agents {
            let running = self
                .live()
                .any(|(_, inc)| inc.member.as_ref().is_some_and(|m| m.node_id == node_id))
                || self.opening_nodes.values().any(|n| *n == node_id);
            if !running {
                let faults = self.log_bucket.faults.clone();
                self.next_node = Some(node_id);
                let number = self.start_open_with(faults);
                self.opening_nodes.insert(number, node_id);
            }
        }
    }

    /// The membership and settings of the agent process `number` about to open, on cluster
    /// seeds; `gate` is its gate of the metadata bucket, wrapped in a view of its own.
    pub(super) fn membership(
        &mut self,
        number: u32,
        gate: Arc<dyn ObjectStore>,
    ) -> (Arc<dyn ObjectStore>, Option<(Membership, ClusterSettings)>) {
        let (Some(cluster), Some(node_id)) = (self.scenario.cluster, self.next_node.take()) else {
            return (gate, None);
        };
        let log_view = Arc::new(
            ModelStore::new(gate, LatencyProfile::local(), u64::from(number))
                .expect("a zero profile is valid"),
        );
        let address = format!("sim-agent-{number}");
        self.node_by_address.insert(address.clone(), node_id);
        let rate = if cluster.max_skew > 0.0 {
            1.0 + cluster.max_skew * (2.0 * self.cluster_rng.f64() - 1.0)
        } else {
            1.0
        };
        self.clock_rates.insert(address.clone(), rate);
        let settings = ClusterSettings {
            clock: Arc::new(SkewedMonotonic {
                origin: tokio::time::Instant::now(),
                rate,
            }),
            lease_renew: cluster.lease_renew,
            lease_timeout: cluster.lease_timeout,
            forward_timeout: cluster.forward_timeout,
            // Twice the lease timeout: members' clocks run up to ±50% apart here, far more than
            // the 3-renewal minimum of production assumes, and a live member whose heartbeats a
            // fast leader clock counts as late would be fenced and register again.
            agent_timeout: cluster.agent_timeout(),
            // A fifth of the deleter's grace, as plan TTL and read deadline are: on a clock at
            // half speed that is 0.4 × grace, and with both 0.8 × grace, under the grace.
            max_read_staleness: cluster.lease_timeout.min(self.scenario.gc.grace / 5),
            agent: Some(AgentInfo {
                zone: format!("zone-{}", node_id % 2),
                host: address.clone(),
                port: 9092,
            }),
            ..ClusterSettings::new(
                node_id,
                &format!("incarnation-{number}"),
                self.links.link_for(&address),
            )
        };
        let membership = Membership {
            node_id,
            incarnation: settings.incarnation.clone(),
            address,
            log_view: log_view.clone(),
        };
        (log_view, Some((membership, settings)))
    }

    /// The agent a client (re)connects to: the newest live one, or on cluster seeds any live
    /// member not cut off its peers (clients bootstrapped at different agents, and clients
    /// that refreshed their metadata after a cut-off agent failed them).
    pub(super) fn attach_to(&mut self, newest: usize) -> usize {
        if self.scenario.cluster.is_none() {
            return newest;
        }
        let reachable: Vec<usize> = self
            .live()
            .filter(|(index, _)| !self.is_cut(*index))
            .map(|(index, _)| index)
            .collect();
        if reachable.is_empty() {
            return newest;
        }
        reachable[self.cluster_rng.usize(..reachable.len())]
    }

    /// Client `c`'s agent is cut off its peers, so its requests time out: the client drops
    /// the connection (what it had in flight is of unknown fate) and reconnects elsewhere.
    pub(super) fn leave_cut_agent(&mut self, c: usize) {
        let index = self.clients[c].attached;
        self.requests
            .retain(|_, request| !(request.client == c && Some(request.incarnation) == index));
        if self.producer_pending.get(&c) == index.as_ref() {
            self.producer_pending.remove(&c);
        }
        let client = &mut self.clients[c];
        for batch in client.connection_lost() {
            let id = batch.id;
            if !client.failed(batch) {
                self.report.plain_unacked += 1;
                self.stamps.abandon(id);
            }
        }
    }

    /// Whether incarnation `index` is a member cut off its peers.
    pub(super) fn is_cut(&self, index: usize) -> bool {
        self.incarnations[index]
            .member
            .as_ref()
            .is_some_and(|member| self.cut.contains(&member.address))
    }

    pub(super) fn inject_cluster_faults(&mut self) {
        let Some(cluster) = self.scenario.cluster else {
            return;
        };
        let members: Vec<(String, Arc<ModelStore>)> = self
            .live()
            .filter_map(|(_, inc)| inc.member.as_ref())
            .map(|m| (m.address.clone(), m.log_view.clone()))
            .collect();
        if members.is_empty() {
            return;
        }
        if self.cluster_rng.f64() < cluster.p_cut {
            let (address, _) = &members[self.cluster_rng.usize(..members.len())];
            let cut = !self.cut.contains(address);
            self.links.set_cut(address, cut);
            if cut {
                self.cut.insert(address.clone());
                self.report.cluster_cuts += 1;
            } else {
                self.cut.remove(address);
            }
            self.event(&format!("{address} cut off its peers={cut}"));
        }
        if self.cluster_rng.f64() < cluster.p_agent_outage {
            let (address, view) = &members[self.cluster_rng.usize(..members.len())];
            let down = !view.is_down();
            view.set_outage(down);
            if down {
                self.report.agent_log_outages += 1;
            }
            self.event(&format!("{address} cut off the metadata bucket={down}"));
        }
        if self.cluster_rng.f64() < cluster.p_isolate {
            let (address, view) = &members[self.cluster_rng.usize(..members.len())];
            let isolate = !(self.cut.contains(address) && view.is_down());
            self.links.set_cut(address, isolate);
            view.set_outage(isolate);
            if isolate {
                self.cut.insert(address.clone());
                self.report.agent_isolations += 1;
            } else {
                self.cut.remove(address);
            }
            self.event(&format!(
                "{address} cut off its peers and the metadata bucket={isolate}"
            ));
        }
    }

    /// Ends every cut and every agent's outage (agents stay up).
    pub(super) fn heal_cluster(&mut self) {
        for address in std::mem::take(&mut self.cut) {
            self.links.set_cut(&address, false);
        }
        for inc in &self.incarnations {
            if let Some(member) = &inc.member {
                member.log_view.set_outage(false);
            }
        }
    }

    /// The live agents' roles and durable positions.
    fn roles(&self) -> Vec<(i32, Role, u64)> {
        self.live()
            .filter_map(|(_, inc)| {
                let member = inc.member.as_ref()?;
                let role = *inc.control.role().borrow();
                let position = *inc.control.subscribe().borrow();
                Some((member.node_id, role, position))
            })
            .collect()
    }

    /// The members' roles and positions, and the durable log's, for a report (empty on
    /// single-agent seeds).
    pub(super) fn describe_members(&self) -> String {
        if self.scenario.cluster.is_none() {
            return String::new();
        }
        format!(
            " (members (node, role, position): {:?}; leaders' status {:?}; durable epoch {}, \
             next slot {})",
            self.roles(),
            self.live()
                .filter(|(_, inc)| { matches!(*inc.control.role().borrow(), Role::Leader { .. }) })
                .map(|(_, inc)| inc.control.leader_status())
                .collect::<Vec<_>>(),
            self.auditor.durable_epoch(),
            self.auditor.durable_next_seq()
        )
    }

    /// Exactly one leader among a full set of live agents, all at the same durable position.
    pub(super) fn cluster_settled(&self) -> bool {
        let Some(cluster) = self.scenario.cluster else {
            return true;
        };
        let roles = self.roles();
        let leaders = roles
            .iter()
            .filter(|(_, role, _)| matches!(role, Role::Leader { .. }))
            .count();
        roles.len() == cluster.agents as usize
            && self.opening == 0
            && leaders == 1
            && roles.iter().all(|(_, _, position)| *position == roles[0].2)
    }

    /// After convergence the cluster runs a while longer, so that leaders that fight each
    /// other (CTL-3 broken) show in the claims; then [`World::check_claims`].
    pub(super) async fn check_cluster_stays(&mut self) {
        let Some(cluster) = self.scenario.cluster else {
            return;
        };
        let until = tokio::time::Instant::now() + cluster.lease_timeout * 4;
        while tokio::time::Instant::now() < until {
            self.step += 1;
            self.tick(false).await;
        }
        self.check_claims();
        self.check_registry(cluster).await;
        self.report.cluster_epochs = self.archive.claims().epochs.len() as u64;
    }

    /// CTL-3, from what landed in the metadata bucket: an epoch claimed by another agent than
    /// the previous epoch's claimant (whose own claims after a failed write are its recovery)
    /// follows a time when the previous epoch's lease stood still for the lease timeout: a gap
    /// of at least the timeout between that epoch's claim, its lease writes and the new claim.
    /// A follower only sees the counter stand still if no write landed for that long (its reads
    /// see what landed), so a claim without such a gap took over from a leader it saw renew.
    /// Exempt: a released lease, and a lease of the claimant's own node (a restart leads at once).
    pub(super) fn check_claims(&mut self) {
        let Some(cluster) = self.scenario.cluster else {
            return;
        };
        let claims = self.archive.claims();
        let mut messages = Vec::new();
        for (epoch, (claimed_at, claimant)) in &claims.epochs {
            let previous = epoch - 1;
            let Some((previous_at, previous_claimant)) = claims.epochs.get(&previous) else {
                continue;
            };
            if previous_claimant == claimant {
                continue;
            }
            let writes: Vec<&(tokio::time::Instant, i32, bool)> = claims
                .leases
                .get(&previous)
                .into_iter()
                .flatten()
                .filter(|(at, ..)| at < claimed_at)
                .collect();
            let exempt = writes.iter().any(|(_, node_id, released)| {
                *released || self.node_by_address.get(claimant) == Some(node_id)
            });
            let times: Vec<tokio::time::Instant> = std::iter::once(*previous_at)
                .chain(writes.iter().map(|(at, ..)| *at))
                .chain(std::iter::once(*claimed_at))
                .collect();
            let longest = times
                .windows(2)
                .map(|pair| pair[1].saturating_duration_since(pair[0]))
                .max()
                .unwrap_or_default();
            // The claimant timed the lease on its own clock.
            let rate = self.clock_rates.get(claimant).copied().unwrap_or(1.0);
            let timeout = cluster.lease_timeout.div_f64(rate);
            if !exempt && longest < timeout {
                messages.push(format!(
                    "CTL-3: {claimant} claimed epoch {epoch} while epoch {previous}'s lease never \
                     stood still for the lease timeout {timeout:?} on its clock (longest \
                     {longest:?}, {} writes)",
                    writes.len()
                ));
            }
        }
        for message in messages {
            self.violation(message);
        }
    }

    /// RFC 0002 §5: once the cluster has run settled for longer than the agent timeout, every
    /// agent's registry lists exactly the live members with their incarnations (the dead were
    /// fenced, the live registered, one per node id).
    ///
    /// The window above need not be quiet: a writer deposed while idle led on in its own view,
    /// sent no heartbeats and was fenced, and it registers again only after it learnt of the
    /// later epoch (seed 469: the last takeover landed 40 ms before the window ended, with 30 %
    /// of log writes conflicting). So the check waits, for at most twenty agent timeouts, for
    /// the registries to agree; a member that never registers again still fails it.
    async fn check_registry(&mut self, cluster: ClusterScenario) {
        let until = tokio::time::Instant::now() + cluster.agent_timeout() * 20;
        while tokio::time::Instant::now() < until && !self.registry_mismatches().is_empty() {
            self.step += 1;
            self.tick(false).await;
        }
        for message in self.registry_mismatches() {
            self.violation(message);
        }
    }

    /// Every live member whose registry does not list exactly the live members.
    fn registry_mismatches(&self) -> Vec<String> {
        let live: BTreeMap<i32, String> = self
            .live()
            .filter_map(|(_, inc)| inc.member.as_ref())
            .map(|member| (member.node_id, member.incarnation.clone()))
            .collect();
        let mut messages = Vec::new();
        for (_, inc) in self.live() {
            let Some(member) = &inc.member else { continue };
            let registry = inc.control.read(|state| state.registry.incarnations());
            if registry != live {
                messages.push(format!(
                    "registry: agent {} lists {registry:?}, the live members are {live:?}",
                    member.address
                ));
            }
        }
        messages
    }
}
