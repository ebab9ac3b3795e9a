//! The agent registry (RFC 0002 §5): the live agents of a cluster by node id, as the log says.
//! Metadata, FindCoordinator and DescribeCluster read it from each agent's replica, so every
//! agent answers the same; group coordinators are placed over it, and the coordinator fence
//! (RFC 0002 §7) checks offset commits against it.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use weir_common::placement::{outranks, place};

use crate::entry::{AgentRegistration, CoordinatorStamp};
use crate::ControlError;

/// Registry changes kept to tell whether a group could have moved since a version. A
/// coordinator older than that many changes loses its groups (its members join again).
pub const CHANGES_KEPT: usize = 256;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registry {
    pub agents: BTreeMap<i32, RegisteredAgent>,
    /// Bumped by every change: an agent registered, re-registered elsewhere, or fenced.
    pub version: u64,
    /// The node id each of the last changes concerned, oldest first: change `version - k`
    /// is `changes[len - 1 - k]`.
    pub changes: VecDeque<i32>,
}

/// A live agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisteredAgent {
    /// The process start it belongs to.
    pub incarnation: String,
    /// Its zone (`agent.rack`, `--zone`), the rack Metadata gives clients; may be empty.
    pub zone: String,
    /// The address Kafka clients are told to connect to.
    pub host: String,
    pub port: i32,
    /// Its control-plane service (`cluster.control_listen`).
    pub control_address: String,
    /// The registry version its registration made.
    pub since: u64,
    /// Its wall clock when it registered.
    pub registered_ms: i64,
}

impl Registry {
    /// Registers an agent, or updates its addresses. A node id held by another incarnation is
    /// refused until that one is fenced: one node id, one live agent.
    pub fn register(&mut self, agent: &AgentRegistration) -> Result<u64, ControlError> {
        if let Some(live) = self.agents.get(&agent.node_id) {
            if live.incarnation != agent.incarnation {
                return Err(ControlError::NodeIdTaken {
                    node_id: agent.node_id,
                    address: format!("{}:{}", live.host, live.port),
                });
            }
            let same = live.zone == agent.zone
                && live.host == agent.host
                && live.port == agent.port
                && live.control_address == agent.control_address;
            if same {
                return Ok(self.version);
            }
        }
        self.change(agent.node_id);
        self.agents.insert(
            agent.node_id,
            RegisteredAgent {
                incarnation: agent.incarnation.clone(),
                zone: agent.zone.clone(),
                host: agent.host.clone(),
                port: agent.port,
                control_address: agent.control_address.clone(),
                since: self.version,
                registered_ms: agent.at_ms,
            },
        );
        Ok(self.version)
    }

    /// Removes the agent if `incarnation` is the registered one; whether it did.
    pub fn fence(&mut self, node_id: i32, incarnation: &str) -> bool {
        if self
            .agents
            .get(&node_id)
            .is_none_or(|live| live.incarnation != incarnation)
        {
            return false;
        }
        self.agents.remove(&node_id);
        self.change(node_id);
        true
    }

    fn change(&mut self, node_id: i32) {
        self.version += 1;
        self.changes.push_back(node_id);
        while self.changes.len() > CHANGES_KEPT {
            self.changes.pop_front();
        }
    }

    /// Each live agent's incarnation, by node id.
    pub fn incarnations(&self) -> BTreeMap<i32, String> {
        self.agents
            .iter()
            .map(|(node, agent)| (*node, agent.incarnation.clone()))
            .collect()
    }

    pub fn node_ids(&self) -> Vec<i32> {
        self.agents.keys().copied().collect()
    }

    /// The coordinator of `group` among the registered agents.
    pub fn coordinator(&self, group: &str) -> Option<i32> {
        place(group.as_bytes(), &self.node_ids())
    }

    /// Whether `group` may have had another coordinator than `node_id` at some version after
    /// `since` (or `node_id` registered again meanwhile): an agent that joined and outranks it
    /// for the group took the group, and one that left may have held it. Conservative: any
    /// change of `node_id` itself, or a version older than the changes kept, counts as moved.
    pub fn moved_since(&self, group: &str, node_id: i32, since: u64) -> bool {
        let Some(newer) = self.version.checked_sub(since) else {
            return true;
        };
        let newer = newer as usize;
        if newer > self.changes.len() {
            return true;
        }
        self.changes
            .iter()
            .rev()
            .take(newer)
            .any(|&changed| changed == node_id || outranks(group.as_bytes(), changed, node_id))
    }

    /// The coordinator fence (GRP-1): whether `stamp` names the coordinator `group` has had
    /// without a break since the stamp's version.
    pub fn check_coordinator(
        &self,
        group: &str,
        stamp: &CoordinatorStamp,
    ) -> Result<(), ControlError> {
        let registered = self
            .agents
            .get(&stamp.node_id)
            .is_some_and(|live| live.incarnation == stamp.incarnation);
        if registered
            && self.coordinator(group) == Some(stamp.node_id)
            && !self.moved_since(group, stamp.node_id, stamp.since)
        {
            return Ok(());
        }
        Err(ControlError::NotCoordinator(format!(
            "agent {} no longer coordinates group {group}",
            stamp.node_id
        )))
    }
}

#[cfg(test)]
mod tests;
