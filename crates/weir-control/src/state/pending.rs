//! Pending files (RFC 0006): reserved at seal, their batches hold offsets but no consumer reads
//! them until the file is confirmed in a quorum; an abort moves them to a filler's empty
//! batches and rolls their producer states back.
//!
//! `State::pending` keeps each agent incarnation's pending files in reservation order: an abort
//! must take the last ones, so sequences roll back whole (an incarnation answers its tickets in
//! seal order, so nothing after an aborted file was acknowledged). A derived per-partition map,
//! rebuilt on load, answers "is offset X pending, and whose" without a scan.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use weir_common::{FileId, Tier, TopicId};

use super::{FileMeta, ProducerPartitionState, State};
use crate::entry::{ConfirmedFile, FileAbort, FillerBatch};
use crate::ControlError;

/// A reserved file whose batches are not yet readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingFile {
    pub file_id: FileId,
    /// Its appended batches, in the order apply appended them.
    pub batches: Vec<PendingBatch>,
}

/// One appended batch of a pending file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingBatch {
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    /// What an abort restores, for a batch of an idempotent producer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<ReplacedProducer>,
}

/// A producer's state on a partition before a pending batch changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedProducer {
    pub producer_id: i64,
    /// `None`: the producer had no state on the partition.
    pub before: Option<ProducerPartitionState>,
    /// The epoch the batch brought back for an expired id (its `producer_epochs` entry is
    /// removed again by an abort, if still that epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revived_epoch: Option<i16>,
}

/// Who reserved a pending batch (the derived per-partition map's value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingOwner {
    pub(super) file_id: FileId,
    pub(super) agent: String,
}

/// Pending batches by partition and base offset (derived from `State::pending`).
pub(super) type PendingByPartition = HashMap<(TopicId, i32), BTreeMap<i64, PendingOwner>>;

/// Adds `agent`'s pending `file` to the per-partition map.
fn index_file(by_partition: &mut PendingByPartition, agent: &str, file: &PendingFile) {
    for batch in &file.batches {
        by_partition
            .entry((batch.topic_id, batch.partition))
            .or_default()
            .insert(
                batch.base_offset,
                PendingOwner {
                    file_id: file.file_id,
                    agent: agent.to_string(),
                },
            );
    }
}

impl State {
    /// The base offset of the partition's first pending batch.
    pub fn first_pending(&self, topic_id: &TopicId, partition: i32) -> Option<i64> {
        self.first_unacknowledged(topic_id, partition, |_| false)
    }

    /// The base offset of the partition's first pending batch whose file `acknowledged` does
    /// not name (what an agent serving its acknowledged files stops at, RFC 0006).
    pub fn first_unacknowledged(
        &self,
        topic_id: &TopicId,
        partition: i32,
        acknowledged: impl Fn(&FileId) -> bool,
    ) -> Option<i64> {
        self.pending_by_partition
            .get(&(*topic_id, partition))?
            .iter()
            .find(|(_, owner)| !acknowledged(&owner.file_id))
            .map(|(base_offset, _)| *base_offset)
    }

    /// Whether any file is pending.
    pub fn has_pending(&self) -> bool {
        self.pending.values().any(|files| !files.is_empty())
    }

    /// Rebuilds the per-partition map from `pending` (after a snapshot load).
    pub(super) fn rebuild_pending_index(&mut self) {
        let mut by_partition = PendingByPartition::new();
        for (agent, files) in &self.pending {
            for file in files {
                index_file(&mut by_partition, agent, file);
            }
        }
        self.pending_by_partition = by_partition;
    }

    /// Records a reserved file's appended batches as pending.
    pub(super) fn add_pending(&mut self, agent: &str, file: PendingFile) {
        index_file(&mut self.pending_by_partition, agent, &file);
        self.pending
            .entry(agent.to_string())
            .or_default()
            .push(file);
    }

    /// Removes a file from `pending` (its agent's queue and the per-partition map).
    fn take_pending(&mut self, file_id: &FileId) -> Option<(String, PendingFile)> {
        let (agent, position) = self.pending.iter().find_map(|(agent, files)| {
            files
                .iter()
                .position(|file| file.file_id == *file_id)
                .map(|position| (agent.clone(), position))
        })?;
        let files = self.pending.get_mut(&agent)?;
        let file = files.remove(position);
        if files.is_empty() {
            self.pending.remove(&agent);
        }
        for batch in &file.batches {
            let key = (batch.topic_id, batch.partition);
            if let Some(batches) = self.pending_by_partition.get_mut(&key) {
                batches.remove(&batch.base_offset);
                if batches.is_empty() {
                    self.pending_by_partition.remove(&key);
                }
            }
        }
        Some((agent, file))
    }

    /// Applies a `ConfirmFiles`: the files leave `pending` and name their holders. Files not
    /// pending (confirmed already, aborted) are skipped. Returns how many were pending.
    pub(super) fn confirm_files(&mut self, files: &[ConfirmedFile]) -> usize {
        let mut confirmed = 0;
        for file in files {
            if self.take_pending(&file.file_id).is_none() {
                continue;
            }
            confirmed += 1;
            if let Some(meta) = self.files.get_mut(&file.file_id) {
                meta.buckets = file.buckets.clone();
            }
        }
        confirmed
    }

    /// Applies an `AbortFiles`: checks that it names the agent's last pending files in order
    /// and a filler batch for each of their pending batches, then moves each batch to the
    /// filler, rolls producer states back (last batch first) and releases the files.
    pub(super) fn abort_files(&mut self, abort: &FileAbort) -> Result<usize, ControlError> {
        let queue = self
            .pending
            .get(&abort.agent)
            .map_or(&[][..], Vec::as_slice);
        let suffix = queue
            .len()
            .checked_sub(abort.files.len())
            .map(|at| &queue[at..]);
        let names_suffix = !abort.files.is_empty()
            && suffix.is_some_and(|suffix| {
                suffix
                    .iter()
                    .map(|file| file.file_id)
                    .eq(abort.files.iter().copied())
            });
        if !names_suffix {
            return Err(ControlError::AbortMismatch(format!(
                "{} file(s) are not the last pending files of agent {}",
                abort.files.len(),
                abort.agent
            )));
        }
        if abort.filler.unix_ms() < self.sweep_horizon_ms {
            // The sweep may be deleting the filler's object: never reference it.
            return Err(ControlError::AbortMismatch(format!(
                "filler {} is older than the sweep horizon",
                abort.filler
            )));
        }
        if self.knows_file(&abort.filler) {
            return Err(ControlError::AbortMismatch(format!(
                "filler {} is already known",
                abort.filler
            )));
        }
        let fillers: HashMap<(TopicId, i32, i64), &FillerBatch> = abort
            .batches
            .iter()
            .map(|batch| ((batch.topic_id, batch.partition, batch.base_offset), batch))
            .collect();
        let aborted: Vec<PendingFile> = suffix.unwrap_or_default().to_vec();
        let batches: Vec<&PendingBatch> = aborted.iter().flat_map(|file| &file.batches).collect();
        if let Some(missing) = batches.iter().find(|batch| {
            !fillers.contains_key(&(batch.topic_id, batch.partition, batch.base_offset))
        }) {
            return Err(ControlError::AbortMismatch(format!(
                "no filler batch for {}-{} at offset {}",
                missing.topic_id, missing.partition, missing.base_offset
            )));
        }
        // Every check passed: from here on nothing fails.
        for file in &aborted {
            self.take_pending(&file.file_id);
        }
        let mut moved = 0;
        for batch in batches.iter().rev() {
            let filler = fillers[&(batch.topic_id, batch.partition, batch.base_offset)];
            if self.move_to_filler(batch, abort.filler, filler) {
                moved += 1;
            }
            if let Some(replaced) = &batch.producer {
                self.restore_producer(batch.topic_id, batch.partition, replaced);
            }
        }
        for file in &aborted {
            // Released with every candidate bucket: a partial copy may be in any of them.
            if let Some(meta) = self.files.remove(&file.file_id) {
                self.released.insert(file.file_id, meta);
            }
        }
        let meta = FileMeta {
            size: abort.size,
            buckets: abort.buckets.clone(),
            live_batches: moved as u32,
            tier: Tier::Ingest,
        };
        if moved > 0 {
            self.files.insert(abort.filler, meta);
        } else {
            self.release_unused_file(abort.filler, meta);
        }
        Ok(moved)
    }

    /// A deleted topic's batches leave `pending` (no reader will ever ask for them, and no
    /// abort could name a filler for them); a file left without batches leaves it too.
    pub(super) fn forget_pending_of(&mut self, topic_id: &TopicId) {
        if !self.pending_by_partition.keys().any(|(t, _)| t == topic_id) {
            return;
        }
        for files in self.pending.values_mut() {
            for file in files.iter_mut() {
                file.batches.retain(|batch| batch.topic_id != *topic_id);
            }
            files.retain(|file| !file.batches.is_empty());
        }
        self.pending.retain(|_, files| !files.is_empty());
        self.pending_by_partition
            .retain(|(topic, _), _| topic != topic_id);
    }

    /// Points a pending batch's index entry at its filler (if retention or a topic deletion
    /// did not remove it meanwhile). Returns whether it moved.
    fn move_to_filler(
        &mut self,
        batch: &PendingBatch,
        filler_id: FileId,
        filler: &FillerBatch,
    ) -> bool {
        let Some(name) = self.topic_names_by_id.get(&batch.topic_id) else {
            return false;
        };
        let Some(partition) = self.topics.get_mut(name).and_then(|topic| {
            usize::try_from(batch.partition)
                .ok()
                .and_then(|p| topic.partitions.get_mut(p))
        }) else {
            return false;
        };
        let position = partition
            .index
            .partition_point(|entry| entry.base_offset < batch.base_offset);
        let Some(entry) = partition.index.get(position).copied() else {
            return false;
        };
        if entry.base_offset != batch.base_offset {
            return false;
        }
        partition.index.rewrite_from(position, |rewritten| {
            if rewritten.base_offset == batch.base_offset {
                rewritten.file_id = filler_id;
                rewritten.byte_offset = filler.byte_offset;
                rewritten.len = filler.len;
            }
        });
        let old_file = entry.file_id;
        if let Some(meta) = self.files.get_mut(&old_file) {
            meta.live_batches = meta.live_batches.saturating_sub(1);
        }
        true
    }

    fn restore_producer(&mut self, topic_id: TopicId, partition: i32, replaced: &ReplacedProducer) {
        if let Some(epoch) = replaced.revived_epoch {
            if self.producer_epochs.get(&replaced.producer_id) == Some(&epoch) {
                self.producer_epochs.remove(&replaced.producer_id);
            }
        }
        let Some(name) = self.topic_names_by_id.get(&topic_id) else {
            return;
        };
        let Some(partition) = self.topics.get_mut(name).and_then(|topic| {
            usize::try_from(partition)
                .ok()
                .and_then(|p| topic.partitions.get_mut(p))
        }) else {
            return;
        };
        match &replaced.before {
            Some(before) => {
                partition
                    .producers
                    .insert(replaced.producer_id, before.clone());
            }
            None => {
                partition.producers.remove(&replaced.producer_id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
