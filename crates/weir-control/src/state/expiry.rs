//! Expiry of producer, group and commit-chain state (RFC 0003 §4). What expires is decided by
//! entries that carry a time bound computed from a wall clock by the maintenance task; apply
//! only compares times recorded in the log, so replay is deterministic.
//!
//! Producer state expires per producer id as a whole (every partition at once), after
//! inactivity, never because the log start moved: a known id without state on a partition
//! must start at sequence 0 there (seed 17's rule), and that never rejects a live producer,
//! because its per-partition states disappear only together with its id.

use super::State;

impl State {
    /// The first `NewEpoch` with a time starts the clocks of state recorded before activity
    /// times existed, so an upgrade starts the expiry periods at the upgrade, not in 1970.
    pub(super) fn start_expiry_clocks(&mut self, at_ms: i64) {
        if at_ms <= 0 {
            return;
        }
        for producer_id in self.producer_epochs.keys() {
            self.producer_last_ms.entry(*producer_id).or_insert(at_ms);
        }
        for offset in self
            .group_offsets
            .values_mut()
            .flat_map(|topics| topics.values_mut())
            .flat_map(|partitions| partitions.values_mut())
        {
            if offset.commit_ms == 0 {
                offset.commit_ms = at_ms;
            }
        }
    }

    /// Applies `ExpireProducers`: ids idle since before `before_ms` are forgotten everywhere,
    /// except ids with a batch in a pending file (RFC 0006). That batch may still be confirmed,
    /// and a retry of it must be found a duplicate then, not refused as an unknown id: the
    /// producer would bump its epoch and append the batch a second time. Its abort must find
    /// the state it restores still there.
    pub(super) fn expire_producers(&mut self, before_ms: i64) -> usize {
        let pending: std::collections::BTreeSet<i64> = self
            .pending
            .values()
            .flatten()
            .flat_map(|file| &file.batches)
            .filter_map(|batch| batch.producer.as_ref().map(|p| p.producer_id))
            .collect();
        let expired: Vec<i64> = self
            .producer_last_ms
            .iter()
            .filter(|(id, last)| **last < before_ms && !pending.contains(id))
            .map(|(id, _)| *id)
            .collect();
        if expired.is_empty() {
            return 0;
        }
        for id in &expired {
            self.producer_last_ms.remove(id);
            self.producer_epochs.remove(id);
        }
        for partition in self
            .topics
            .values_mut()
            .flat_map(|topic| topic.partitions.iter_mut())
        {
            if !partition.producers.is_empty() {
                for id in &expired {
                    partition.producers.remove(id);
                }
            }
        }
        expired.len()
    }

    /// Applies `ExpireGroup`: the group's offsets go unless one was committed after the bound.
    pub(super) fn expire_group(&mut self, group: &str, last_commit_at_most_ms: i64) -> bool {
        let Some(newest) = self.group_last_commit_ms(group) else {
            return false;
        };
        if newest > last_commit_at_most_ms {
            return false;
        }
        self.group_offsets.remove(group);
        true
    }

    /// Applies `ExpireAgentTips`: chains whose last file is older than `before_ms` end. An
    /// incarnation idle that long has no file in flight; its next commit starts a new chain
    /// after one retriable `CommitOutOfOrder`.
    pub(super) fn expire_agent_tips(&mut self, before_ms: i64) -> usize {
        let before = self.agent_tips.len();
        self.agent_tips.retain(|_, tip| tip.unix_ms() >= before_ms);
        before - self.agent_tips.len()
    }

    /// The newest commit time of a group's offsets, if it has any.
    pub fn group_last_commit_ms(&self, group: &str) -> Option<i64> {
        self.group_offsets
            .get(group)?
            .values()
            .flat_map(|partitions| partitions.values())
            .map(|offset| offset.commit_ms)
            .max()
    }
}
