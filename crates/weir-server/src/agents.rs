//! The agents of the cluster as Kafka clients see them (RFC 0002 §6–7): the brokers Metadata
//! and DescribeCluster list, the partition leaders Metadata names, and group coordinators.
//!
//! In a cluster they come from the registry in this agent's replica, so every agent answers the
//! same; a single agent (no `cluster_incarnation`) is a cluster of itself.

use weir_common::placement::{coordinator_for, place};
use weir_common::TopicId;
use weir_control::coordination::Coordination;
use weir_control::CoordinatorStamp;

use crate::broker::Broker;

/// An agent as Metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveAgent {
    pub(crate) node_id: i32,
    pub(crate) host: String,
    pub(crate) port: i32,
    /// Its zone; `None` when it has none.
    pub(crate) rack: Option<String>,
}

/// The zone a client names in its `client.id`: `weir_az=<zone>`, or WarpStream's
/// `ws_az=<zone>`, among entries separated by `,` (or `;`, or spaces).
pub(crate) fn client_zone(client_id: &str) -> Option<&str> {
    client_id
        .split([',', ';', ' '])
        .filter_map(|entry| {
            entry
                .strip_prefix("weir_az=")
                .or_else(|| entry.strip_prefix("ws_az="))
        })
        .find(|zone| !zone.is_empty())
}

/// How long a read waits for its barrier before answering from this agent's replica (the
/// request holds up the connection's later requests meanwhile).
const READ_BARRIER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Broker {
    /// Before a read that must show what any agent acknowledged (ListOffsets, OffsetFetch), a
    /// follower catches up with the leader (`ControlPlane::barrier`, RFC 0002 §3). Without a
    /// leader in reach it answers from its replica, which is only older.
    pub(crate) async fn read_your_writes(&self) {
        if self.settings.cluster_incarnation.is_none() {
            return;
        }
        if let Err(err) = self.control.barrier(READ_BARRIER_WAIT).await {
            tracing::debug!(error = %err, "no barrier; answering from this agent's replica");
        }
    }

    fn me(&self) -> LiveAgent {
        let settings = &self.settings;
        LiveAgent {
            node_id: settings.node_id,
            host: settings.advertised_host.clone(),
            port: settings.advertised_port,
            rack: settings.rack.clone(),
        }
    }

    /// The agents Metadata and DescribeCluster list, by node id: the registered ones, and this
    /// agent while it has not registered yet since it started, for `registration_grace` (a
    /// restart waits for its predecessor's fence, and serves clients meanwhile). A fenced agent
    /// (cut off from the leader), or one that could not register within the grace (it started
    /// cut off), does not list itself, so its clients move to the registered ones. Nor does an
    /// agent whose control plane has stayed unavailable for that grace (a leader that cannot
    /// write its log, a follower that reaches no leader): a new leader has fenced it by then,
    /// but without its metadata bucket its replica never shows it, and its clients, which ask
    /// the broker they use most for Metadata (librdkafka), would stay on an agent that can
    /// acknowledge nothing until its bucket returns. Outside a cluster, this agent alone.
    pub(crate) fn live_agents(&self) -> Vec<LiveAgent> {
        let mut agents = self.registered_agents();
        let me = self.settings.node_id;
        let listed = agents.iter().any(|a| a.node_id == me);
        let starting = matches!(
            *self.control.registration().borrow(),
            weir_control::Registration::Pending
        ) && self.started.elapsed() < self.settings.registration_grace;
        if !listed && starting {
            agents.push(self.me());
            agents.sort_by_key(|a| a.node_id);
        } else if listed && agents.len() > 1 && self.cut_off() {
            agents.retain(|a| a.node_id != me);
        }
        agents
    }

    /// Whether this cluster member's control plane has been unavailable for the registration
    /// grace (`lease_timeout + agent_timeout + 3 × lease_renew`: a failover and the agent
    /// timeout), as seen by the calls that list the agents.
    fn cut_off(&self) -> bool {
        if self.settings.cluster_incarnation.is_none() {
            return false;
        }
        self.outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lasted()
            .is_some_and(|lasted| lasted >= self.settings.registration_grace)
    }

    /// The controller Metadata and DescribeCluster name among `agents`: this agent when it is
    /// listed, else the first listed (a fenced agent must not name a broker clients cannot see).
    pub(crate) fn controller(&self, agents: &[LiveAgent]) -> i32 {
        let me = self.settings.node_id;
        if agents.iter().any(|agent| agent.node_id == me) {
            me
        } else {
            agents.first().map_or(me, |agent| agent.node_id)
        }
    }

    /// The agents in the registry, by node id; until it holds any (a single agent, or a
    /// cluster member before the first registration is durable) this agent alone. Group
    /// coordinators are placed over these, as the coordinator fence does.
    fn registered_agents(&self) -> Vec<LiveAgent> {
        if self.settings.cluster_incarnation.is_none() {
            return vec![self.me()];
        }
        let agents: Vec<LiveAgent> = self.control.read(|state| {
            state
                .registry
                .agents
                .iter()
                .map(|(node_id, agent)| LiveAgent {
                    node_id: *node_id,
                    host: agent.host.clone(),
                    port: agent.port,
                    rack: Some(agent.zone.clone()).filter(|zone| !zone.is_empty()),
                })
                .collect()
        });
        if agents.is_empty() {
            vec![self.me()]
        } else {
            agents
        }
    }

    /// The agent Metadata names as a partition's leader for a client in `zone`: rendezvous
    /// hashing of (topic id, partition) over the agents of that zone (all agents when none is
    /// in it), so every agent gives the same answer. Any agent serves any partition; this only
    /// spreads clients over the agents near them.
    pub(crate) fn partition_leader(
        agents: &[LiveAgent],
        zone: Option<&str>,
        topic_id: TopicId,
        partition: i32,
    ) -> i32 {
        let in_zone: Vec<i32> = agents
            .iter()
            .filter(|agent| zone.is_some() && agent.rack.as_deref() == zone)
            .map(|agent| agent.node_id)
            .collect();
        let candidates = if in_zone.is_empty() {
            agents.iter().map(|agent| agent.node_id).collect()
        } else {
            in_zone
        };
        let mut key = topic_id.0.to_vec();
        key.extend_from_slice(&partition.to_be_bytes());
        place(&key, &candidates).unwrap_or(-1)
    }

    /// The coordinator of `group_id` among the live agents.
    pub(crate) fn coordinator_of(&self, group_id: &str) -> Option<LiveAgent> {
        let agents = self.registered_agents();
        let ids: Vec<i32> = agents.iter().map(|agent| agent.node_id).collect();
        let node_id = coordinator_for(group_id, &ids)?;
        agents.into_iter().find(|agent| agent.node_id == node_id)
    }

    /// Whether this agent coordinates `group_id`.
    pub(crate) fn coordinates(&self, group_id: &str) -> bool {
        self.coordination(group_id).is_some()
    }

    /// `Some` while this agent coordinates `group_id`, with the stamp its offset commits carry
    /// in a cluster (RFC 0002 §7). In a cluster an agent coordinates only once it is
    /// registered; a group that another agent may have coordinated since this one last saw it
    /// is unloaded first (its members join again), so nothing of an older generation commits.
    pub(crate) fn coordination(&self, group_id: &str) -> Option<Option<CoordinatorStamp>> {
        let Some(incarnation) = &self.settings.cluster_incarnation else {
            // A single agent coordinates every group, unfenced.
            return Some(None);
        };
        // Held until the group is unloaded below, so no other request validates a commit
        // against the old group with the new stamp in between.
        let mut coordinations = self.coordinations.lock().unwrap_or_else(|p| p.into_inner());
        let checked = self.control.read(|state| {
            coordinations.check(
                &state.registry,
                group_id,
                self.settings.node_id,
                incarnation,
            )
        });
        match checked {
            Coordination::NotMine { was_mine } => {
                if was_mine {
                    self.groups.unload(group_id);
                }
                None
            }
            Coordination::Mine { stamp, reload } => {
                if reload {
                    self.groups.unload(group_id);
                }
                Some(Some(stamp))
            }
        }
    }

    /// The coordinator fence refused a commit: the group is unloaded, and its members find
    /// their coordinator again.
    pub(crate) fn lost_group(&self, group_id: &str, why: &str) {
        tracing::info!(group = group_id, why, "group moved to another agent");
        let mut coordinations = self.coordinations.lock().unwrap_or_else(|p| p.into_inner());
        coordinations.forget(group_id);
        self.groups.unload(group_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_client_zone_from_client_id() {
        assert_eq!(client_zone("app,weir_az=use1-az4"), Some("use1-az4"));
        assert_eq!(client_zone("ws_az=b;app"), Some("b"));
        assert_eq!(client_zone("weir_az= x"), None);
        assert_eq!(client_zone("app"), None);
        assert_eq!(client_zone(""), None);
    }

    fn agent(node_id: i32, zone: &str) -> LiveAgent {
        LiveAgent {
            node_id,
            host: "127.0.0.1".into(),
            port: 9000 + node_id,
            rack: Some(zone.into()),
        }
    }

    #[test]
    fn test_partition_leaders_stay_in_the_clients_zone_and_spread() {
        let agents = [agent(1, "a"), agent(2, "a"), agent(3, "b"), agent(4, "c")];
        let topic = TopicId([7; 16]);
        let mut in_a = std::collections::BTreeSet::new();
        for partition in 0..64 {
            let leader = Broker::partition_leader(&agents, Some("a"), topic, partition);
            assert!(leader == 1 || leader == 2, "{leader} is not in zone a");
            in_a.insert(leader);
            assert_eq!(
                Broker::partition_leader(&agents, Some("b"), topic, partition),
                3
            );
            // A zone without agents, or none: any agent, the same for every agent asked.
            let anywhere = Broker::partition_leader(&agents, Some("z"), topic, partition);
            assert_eq!(
                anywhere,
                Broker::partition_leader(&agents, None, topic, partition)
            );
        }
        assert_eq!(in_a.len(), 2, "both agents of zone a lead some partitions");
    }
}
