//! Which groups an agent coordinates in a cluster (RFC 0002 §7), and the stamp its offset
//! commits carry for the coordinator fence.
//!
//! An agent coordinates a group while it is registered with its incarnation and the registry
//! places the group on it. It remembers since which registry version it has coordinated each
//! group; when the registry shows that another agent may have held the group since then, the
//! group must start over (the caller unloads its members), so nothing of an older generation
//! commits. Apply checks the same stamp ([`crate::Registry::check_coordinator`]).

use std::collections::HashMap;

use crate::entry::CoordinatorStamp;
use crate::state::Registry;

/// Groups remembered at most; past it the map starts over (every group then reloads once).
pub const MAX_GROUPS: usize = 100_000;

/// One agent's groups, by the registry version since which it coordinates each.
#[derive(Debug, Default)]
pub struct Coordinations {
    since: HashMap<String, u64>,
}

/// What [`Coordinations::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coordination {
    /// Another agent coordinates the group (or this one is not registered); `was_mine` when
    /// this agent coordinated it until now (its members must go).
    NotMine { was_mine: bool },
    /// This agent coordinates the group; `reload` when it must start over first (another
    /// agent may have coordinated it since this one last did).
    Mine {
        stamp: CoordinatorStamp,
        reload: bool,
    },
}

impl Coordinations {
    /// Whether agent `node_id` (incarnation `incarnation`) coordinates `group` by `registry`,
    /// remembering the answer.
    pub fn check(
        &mut self,
        registry: &Registry,
        group: &str,
        node_id: i32,
        incarnation: &str,
    ) -> Coordination {
        let registered = registry
            .agents
            .get(&node_id)
            .is_some_and(|agent| agent.incarnation == incarnation);
        if !registered || registry.coordinator(group) != Some(node_id) {
            return Coordination::NotMine {
                was_mine: self.since.remove(group).is_some(),
            };
        }
        // A group met for the first time starts over too: anything held for it in memory
        // (from a coordination this map no longer remembers) may be of an older generation.
        let (since, reload) = match self.since.get(group) {
            Some(&since) if !registry.moved_since(group, node_id, since) => (since, false),
            _ => (registry.version, true),
        };
        if self.since.len() >= MAX_GROUPS && !self.since.contains_key(group) {
            // Bounded whatever group ids clients ask about: forgetting only costs a reload.
            self.since.clear();
        }
        self.since.insert(group.to_string(), since);
        Coordination::Mine {
            stamp: CoordinatorStamp {
                node_id,
                incarnation: incarnation.to_string(),
                since,
            },
            reload,
        }
    }

    /// Forgets `group` (the fence refused a commit: the group must start over).
    pub fn forget(&mut self, group: &str) {
        self.since.remove(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::AgentRegistration;
    use weir_common::placement::outranks;

    fn register(registry: &mut Registry, node_id: i32, incarnation: &str) {
        registry
            .register(&AgentRegistration {
                node_id,
                incarnation: incarnation.into(),
                zone: String::new(),
                host: "h".into(),
                port: 1,
                control_address: String::new(),
                at_ms: 0,
            })
            .unwrap();
    }

    #[test]
    fn test_coordination_starts_over_after_the_group_was_elsewhere() {
        let mut registry = Registry::default();
        let mut mine = Coordinations::default();
        let group = (0..)
            .map(|n| format!("g{n}"))
            .find(|g| outranks(g.as_bytes(), 2, 1))
            .unwrap();
        // Not registered: coordinates nothing.
        assert_eq!(
            mine.check(&registry, &group, 1, "a"),
            Coordination::NotMine { was_mine: false }
        );
        register(&mut registry, 1, "a");
        let Coordination::Mine { stamp, reload } = mine.check(&registry, &group, 1, "a") else {
            panic!("node 1 coordinates");
        };
        assert!(reload, "a group met for the first time starts over");
        let Coordination::Mine { reload, .. } = mine.check(&registry, &group, 1, "a") else {
            panic!("node 1 coordinates");
        };
        assert!(!reload);
        assert_eq!(stamp.since, registry.version);
        // Node 2 joins and leaves before node 1 looks again: node 1 must start over.
        register(&mut registry, 2, "b");
        registry.fence(2, "b");
        let Coordination::Mine { stamp, reload } = mine.check(&registry, &group, 1, "a") else {
            panic!("node 1 coordinates again");
        };
        assert!(reload);
        assert_eq!(stamp.since, registry.version);
        assert_eq!(registry.check_coordinator(&group, &stamp), Ok(()));
        // Node 2 joins and node 1 looks: not its group any more.
        register(&mut registry, 2, "c");
        assert_eq!(
            mine.check(&registry, &group, 1, "a"),
            Coordination::NotMine { was_mine: true }
        );
    }
}
