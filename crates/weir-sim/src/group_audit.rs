//! The auditor's check of group coordinators across agents (RFC 0002 §7), run on every entry of
//! the independent replay ([`crate::replay`]):
//!
//! * GRP-1: an offset commit stamped by a coordinator is accepted only if, at its slot, the
//!   registry holds that agent with that incarnation and places the group on it (restated with
//!   the placement function over the registry's node ids), and every registry version since
//!   the stamp's `since` (those this replay saw) placed the group on it too: a coordinator
//!   that lost the group in between, even for one version, must not commit;
//! * the simulated groups' committed offsets never go backwards (their coordinators only ever
//!   commit forward from what their replica showed when they took the group).

use std::collections::BTreeMap;

use weir_common::placement::coordinator_for;
use weir_control::{Entry, EntryResult, State};

/// What a stamped commit found before it was applied.
pub(crate) struct Before {
    group: String,
    node_id: i32,
    /// Why the commit must be refused, if it must.
    refuse: Option<String>,
    /// Each offset's committed offset before the commit (in entry order).
    committed: Vec<Option<i64>>,
}

#[derive(Debug, Default)]
pub(crate) struct GroupAudit {
    breaches: Vec<String>,
    /// The registry's node ids at each version this replay saw (it sees the state before
    /// every entry, so every version after the first it saw).
    versions: BTreeMap<u64, Vec<i32>>,
}

impl GroupAudit {
    pub(crate) fn before(&mut self, state: &State, entry: &Entry) -> Option<Before> {
        let registry = &state.registry;
        self.versions
            .entry(registry.version)
            .or_insert_with(|| registry.agents.keys().copied().collect());
        let Entry::CommitOffsets {
            group,
            offsets,
            coordinator: Some(stamp),
            ..
        } = entry
        else {
            return None;
        };
        let ids: Vec<i32> = registry.agents.keys().copied().collect();
        let coordinator = coordinator_for(group, &ids);
        let moved = self
            .versions
            .range(stamp.since..)
            .find(|(_, ids)| coordinator_for(group, ids) != Some(stamp.node_id));
        let refuse = match registry.agents.get(&stamp.node_id) {
            Some(agent) if agent.incarnation != stamp.incarnation => Some(format!(
                "node {} is registered as incarnation {}, not {}",
                stamp.node_id, agent.incarnation, stamp.incarnation
            )),
            None => Some(format!("node {} is not registered", stamp.node_id)),
            Some(_) if coordinator != Some(stamp.node_id) => {
                Some(format!("the registry places the group on {coordinator:?}"))
            }
            Some(_) => moved.map(|(version, ids)| {
                format!(
                    "registry version {version} (since {}) placed the group on {:?}",
                    stamp.since,
                    coordinator_for(group, ids)
                )
            }),
        };
        let committed = offsets
            .iter()
            .map(|o| {
                state
                    .committed_offset(group, &o.topic, o.partition)
                    .map(|c| c.offset)
            })
            .collect();
        Some(Before {
            group: group.clone(),
            node_id: stamp.node_id,
            refuse,
            committed,
        })
    }

    pub(crate) fn after(&mut self, before: Before, entry: &Entry, result: &EntryResult, seq: u64) {
        let (Entry::CommitOffsets { offsets, .. }, EntryResult::CommitOffsets(results)) =
            (entry, result)
        else {
            return;
        };
        let group = &before.group;
        if results.iter().any(Result::is_ok) {
            if let Some(why) = &before.refuse {
                self.breaches.push(format!(
                    "GRP-1: slot {seq}: a commit of group {group} by node {} was accepted \
                     though {why}",
                    before.node_id
                ));
            }
        }
        if !group.starts_with("sim-g") {
            return;
        }
        for ((offset, result), old) in offsets.iter().zip(results).zip(&before.committed) {
            if let (Ok(()), Some(old)) = (result, old) {
                if offset.offset < *old {
                    self.breaches.push(format!(
                        "GRP-1: slot {seq}: group {group}'s committed offset went back from \
                         {old} to {} (node {})",
                        offset.offset, before.node_id
                    ));
                }
            }
        }
    }

    pub(crate) fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.breaches)
    }
}
