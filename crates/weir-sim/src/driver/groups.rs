//! Group coordinators across agents (RFC 0002 §7) on cluster seeds: each member coordinates the
//! groups the registry in its replica places on it, as an agent's broker does
//! (`weir_control::coordination`), keeps each group's next offset in memory (loaded from its
//! replica when it takes the group or must start it over), and commits it forward with its
//! coordinator stamp. The auditor's replay (`crate::group_audit`) checks that every commit the
//! log accepts comes from the group's coordinator at that slot (GRP-1) and that a group's
//! committed offset never goes backwards.
//!
//! A member that finds it may have lost a group meanwhile (it must start it over) first sends
//! one commit stamped as before, as a commit held up in the network across the move would
//! arrive: the log must refuse it if the group was placed elsewhere since that stamp (the
//! fence's since rule), whatever the registry says now.

use weir_control::coordination::{Coordination, Coordinations};
use weir_control::{CoordinatorStamp, Entry, OffsetCommit};

use super::*;

/// Groups the members commit for (named so the auditor knows them).
pub(crate) const GROUPS: [&str; 4] = ["sim-g0", "sim-g1", "sim-g2", "sim-g3"];

/// One member incarnation's coordinator state.
#[derive(Default)]
struct Coordinator {
    coordinations: Coordinations,
    /// The next offset it commits, per group it holds.
    next: BTreeMap<String, i64>,
    /// The stamp of its last commit, per group.
    stamps: BTreeMap<String, CoordinatorStamp>,
}

/// The workload's state: its own generator and each incarnation's coordinator.
pub(super) struct GroupCommits {
    rng: fastrand::Rng,
    /// Per-step probability of a commit attempt.
    p_commit: f64,
    by_incarnation: BTreeMap<u32, Coordinator>,
}

impl GroupCommits {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x6772_6f75_7073);
        let p_commit = [0.1, 0.3, 0.6][rng.usize(..3)];
        Self {
            rng,
            p_commit,
            by_incarnation: BTreeMap::new(),
        }
    }
}

impl World {
    /// Per step on cluster seeds: maybe one live member commits a group it coordinates.
    pub(super) async fn commit_groups(&mut self) {
        if self.scenario.cluster.is_none() || self.topic.is_none() {
            return;
        }
        if self.groups.rng.f64() >= self.groups.p_commit {
            return;
        }
        let live: Vec<usize> = self
            .live()
            .filter(|(_, inc)| inc.member.is_some())
            .map(|(index, _)| index)
            .collect();
        if live.is_empty() {
            return;
        }
        let index = live[self.groups.rng.usize(..live.len())];
        let group = GROUPS[self.groups.rng.usize(..GROUPS.len())];
        let step = self.groups.rng.i64(1..=5);
        let inc = &self.incarnations[index];
        let member = inc.member.as_ref().expect("filtered above");
        let (node_id, incarnation) = (member.node_id, member.incarnation.clone());
        let control = inc.control.clone();
        let coordinator = self.groups.by_incarnation.entry(inc.number).or_default();
        let (checked, committed) = control.read(|state| {
            let checked =
                coordinator
                    .coordinations
                    .check(&state.registry, group, node_id, &incarnation);
            let committed = state
                .committed_offset(group, TOPIC, 0)
                .map_or(0, |c| c.offset);
            (checked, committed)
        });
        let (stamp, stale) = match checked {
            Coordination::NotMine { .. } => {
                coordinator.next.remove(group);
                return;
            }
            Coordination::Mine { stamp, reload } => {
                let stale = if reload {
                    coordinator.next.remove(group);
                    coordinator.stamps.get(group).cloned()
                } else {
                    None
                };
                coordinator.stamps.insert(group.to_string(), stamp.clone());
                (stamp, stale)
            }
        };
        let next = coordinator
            .next
            .entry(group.to_string())
            .or_insert(committed);
        *next += step;
        let offset = *next;
        let at_ms = self.clock.now_ms();
        let commit = |stamp| Entry::CommitOffsets {
            group: group.to_string(),
            offsets: vec![OffsetCommit {
                topic: TOPIC.to_string(),
                partition: 0,
                offset,
                leader_epoch: 0,
                metadata: None,
            }],
            at_ms,
            coordinator: Some(stamp),
        };
        let mut entries = vec![commit(stamp)];
        if let Some(stale) = stale {
            // Ahead of the fresh one, forward too: accepted only if the group never left it.
            entries.insert(0, commit(stale));
        }
        for entry in entries {
            self.enqueue_commit(&control, entry, group, offset, node_id)
                .await;
        }
    }

    /// Queues a commit in order (a member's commits keep their order, as through its stream)
    /// and awaits its answer in the background.
    async fn enqueue_commit(
        &mut self,
        control: &ControlPlane,
        entry: Entry,
        group: &'static str,
        offset: i64,
        node_id: i32,
    ) {
        let Ok(pending) = control.enqueue(entry).await else {
            return;
        };
        self.report.group_commits += 1;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            if let Ok(weir_control::EntryResult::CommitOffsets(results)) = pending.await {
                if let Some(Err(err)) = results.first() {
                    let _ = tx.send(Msg::CommitRefused(format!(
                        "{group}: commit of {offset} by node {node_id} refused: {err}"
                    )));
                }
            }
        });
    }
}
