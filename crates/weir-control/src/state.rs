//! The deterministic state machine: `apply(entry) -> result`.
//!
//! Offsets are assigned here (ORD-1): a partition's high watermark grows by each appended batch's
//! offset span. Idempotent-producer checks (IDM-1) happen here too, so a retried batch gets its
//! original offsets even across restarts (the producer state is part of snapshots and replay).
//!
//! `high_watermark` is what apply has assigned; `stable_high_watermark` is what is durable and may
//! be served to consumers (FET-1). Apply advances the first; the plane publishes the second once
//! the log slot holding the entry is durable.

use std::collections::{BTreeMap, HashMap, VecDeque};

use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use weir_common::{FileId, Tier, TopicId};

use crate::configs;
use crate::entry::{BatchCommit, BatchOutcome, Entry, EntryResult, FileCommit, OffsetCommit};
use crate::ControlError;
use crate::CoordinatorStamp;
use pending::{PendingBatch, PendingByPartition, PendingFile, ReplacedProducer};

mod compaction;
mod expiry;
mod index;
mod log_start;
pub mod pending;
mod producers;
mod registry;
pub use index::{ChunkedIndex, CHUNK_ENTRIES};
use producers::{check_sequence, record_sequence, SequenceCheck};
pub use registry::{RegisteredAgent, Registry, CHANGES_KEPT};

/// How many recent batches per producer and partition are remembered for duplicate detection,
/// matching Kafka's limit of 5 in-flight requests for idempotent producers.
const PRODUCER_BATCH_MEMORY: usize = 5;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct State {
    pub cluster_id: String,
    pub epoch: u64,
    pub next_producer_id: i64,
    pub producer_epochs: OrdMap<i64, i16>,
    /// Last activity of each producer id (InitProducerId time, file time of its batches).
    #[serde(default)]
    pub producer_last_ms: OrdMap<i64, i64>,
    pub topics: BTreeMap<String, Topic>,
    pub files: OrdMap<FileId, FileMeta>,
    /// Last file committed by each agent incarnation (see `FileCommit::previous`).
    #[serde(default)]
    pub agent_tips: BTreeMap<String, FileId>,
    /// Committed consumer offsets: group → topic → partition → offset.
    #[serde(default)]
    pub group_offsets: BTreeMap<String, GroupOffsets>,
    /// Files no index entry names any more, waiting for the deleter (see `log_start`).
    #[serde(default)]
    pub released: OrdMap<FileId, FileMeta>,
    /// No file whose id time is before this commits (the orphan sweep's fence).
    #[serde(default)]
    pub sweep_horizon_ms: i64,
    /// The cluster's live agents (RFC 0002 §5); empty for a single agent.
    #[serde(default)]
    pub registry: Registry,
    /// Reserved files not yet confirmed or aborted, by agent incarnation, in reservation order
    /// (RFC 0006; see `pending`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending: BTreeMap<String, Vec<PendingFile>>,
    #[serde(skip)]
    topic_names_by_id: HashMap<TopicId, String>,
    #[serde(skip)]
    pending_by_partition: PendingByPartition,
}

/// A group's committed offsets: topic → partition → offset.
pub type GroupOffsets = BTreeMap<String, BTreeMap<i32, CommittedOffset>>;

/// Kafka's `offset.metadata.max.bytes` default: longer commit metadata is refused.
pub const MAX_OFFSET_METADATA_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    /// When it was committed (the coordinator's clock); 0 until the first timed `NewEpoch`.
    #[serde(default)]
    pub commit_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Topic {
    pub name: String,
    pub id: TopicId,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionState>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PartitionState {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub stable_high_watermark: i64,
    /// Sorted by `base_offset`, dense: each entry starts where the previous ended.
    pub index: ChunkedIndex,
    pub producers: OrdMap<i64, ProducerPartitionState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    pub base_offset: i64,
    pub last_offset: i64,
    pub file_id: FileId,
    pub byte_offset: u64,
    pub len: u32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileMeta {
    pub size: u64,
    /// The file's holders: positions in its tier's bucket list (see [`Tier`]).
    pub buckets: Vec<u8>,
    pub live_batches: u32,
    /// Absent in states from before tiers: every file was an ingest file.
    #[serde(default, skip_serializing_if = "Tier::is_ingest")]
    pub tier: Tier,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerPartitionState {
    pub epoch: i16,
    pub recent: VecDeque<SequencedBatch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequencedBatch {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub base_offset: i64,
}

impl Topic {
    /// The partition at `index`, if the topic has it.
    pub fn partition(&self, index: i32) -> Option<&PartitionState> {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.partitions.get(index))
    }
}

impl State {
    /// Rebuilds lookup tables that are not serialised.
    pub fn rebuild_indexes(&mut self) {
        self.topic_names_by_id = self
            .topics
            .values()
            .map(|topic| (topic.id, topic.name.clone()))
            .collect();
        self.rebuild_pending_index();
    }

    /// Applies an entry whose log slot is durable, for a state that holds only durable entries
    /// (the plane's readable state, a follower's replica): as [`State::apply`], and what a
    /// commit appended becomes visible to consumers (its partitions' stable high watermark is
    /// their high watermark).
    pub fn apply_durable(&mut self, entry: &Entry) -> EntryResult {
        // A confirmation or abort moves the stable bound of the partitions its files reserved:
        // collect them before apply forgets the files.
        let touched: Vec<(TopicId, i32)> = match entry {
            Entry::CommitFile(commit) | Entry::ReserveFile(commit) => commit
                .batches
                .iter()
                .map(|batch| (batch.topic_id, batch.partition))
                .collect(),
            Entry::ConfirmFiles { files } => {
                self.pending_partitions(files.iter().map(|f| f.file_id))
            }
            Entry::AbortFiles(abort) => self.pending_partitions(abort.files.iter().copied()),
            _ => Vec::new(),
        };
        let result = self.apply(entry);
        for (topic_id, partition) in touched {
            self.refresh_stable(&topic_id, partition);
        }
        result
    }

    /// The partitions the pending batches of `files` are on.
    fn pending_partitions(&self, files: impl Iterator<Item = FileId>) -> Vec<(TopicId, i32)> {
        let wanted: std::collections::HashSet<FileId> = files.collect();
        self.pending
            .values()
            .flatten()
            .filter(|file| wanted.contains(&file.file_id))
            .flat_map(|file| &file.batches)
            .map(|batch| (batch.topic_id, batch.partition))
            .collect()
    }

    /// Sets a partition's stable high watermark to what is durable and readable: its high
    /// watermark, or its first pending batch's base offset if lower (RFC 0006).
    fn refresh_stable(&mut self, topic_id: &TopicId, partition: i32) {
        let first_pending = self.first_pending(topic_id, partition);
        let Some(name) = self.topic_names_by_id.get(topic_id) else {
            return;
        };
        let state = usize::try_from(partition).ok().and_then(|index| {
            self.topics
                .get_mut(name)
                .and_then(|topic| topic.partitions.get_mut(index))
        });
        if let Some(state) = state {
            state.stable_high_watermark = first_pending.map_or(state.high_watermark, |first| {
                first.min(state.high_watermark)
            });
        }
    }

    /// Marks everything assigned as durable (after recovery: all replayed entries are durable),
    /// except what is pending.
    pub fn mark_all_stable(&mut self) {
        for topic in self.topics.values_mut() {
            for (index, partition) in topic.partitions.iter_mut().enumerate() {
                let first_pending = self
                    .pending_by_partition
                    .get(&(topic.id, index as i32))
                    .and_then(|batches| batches.keys().next().copied());
                partition.stable_high_watermark = first_pending
                    .map_or(partition.high_watermark, |first| {
                        first.min(partition.high_watermark)
                    });
            }
        }
    }

    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, id: &TopicId) -> Option<&Topic> {
        self.topic_names_by_id
            .get(id)
            .and_then(|name| self.topics.get(name))
    }

    pub fn partition(&self, topic_id: &TopicId, partition: i32) -> Option<&PartitionState> {
        self.topic_by_id(topic_id)?.partition(partition)
    }

    /// Applies one entry. Total and deterministic: every failure is a result, never a panic.
    pub fn apply(&mut self, entry: &Entry) -> EntryResult {
        match entry {
            Entry::NewEpoch {
                epoch,
                cluster_id,
                at_ms,
            } => {
                self.epoch = *epoch;
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id.clone();
                }
                self.start_expiry_clocks(*at_ms);
                EntryResult::NewEpoch
            }
            Entry::CreateTopic {
                name,
                topic_id,
                partitions,
                configs,
            } => EntryResult::CreateTopic(self.create_topic(name, *topic_id, *partitions, configs)),
            Entry::DeleteTopic { name } => EntryResult::DeleteTopic(self.delete_topic(name)),
            Entry::CreatePartitions { name, total } => {
                EntryResult::CreatePartitions(self.create_partitions(name, *total))
            }
            Entry::CommitFile(commit) => EntryResult::CommitFile(self.commit_file(commit, false)),
            Entry::ReserveFile(commit) => EntryResult::ReserveFile(self.commit_file(commit, true)),
            Entry::ConfirmFiles { files } => EntryResult::ConfirmFiles(self.confirm_files(files)),
            Entry::AbortFiles(abort) => EntryResult::AbortFiles(self.abort_files(abort)),
            Entry::InitProducerId {
                existing,
                at_ms,
                fresh_if_unknown,
            } => EntryResult::InitProducerId(self.init_producer_id(
                *existing,
                *at_ms,
                *fresh_if_unknown,
            )),
            Entry::CommitOffsets {
                group,
                offsets,
                at_ms,
                coordinator,
            } => match self.fence_group(group, coordinator) {
                Ok(()) => EntryResult::CommitOffsets(self.commit_offsets(group, offsets, *at_ms)),
                Err(err) => EntryResult::CommitOffsets(vec![Err(err); offsets.len()]),
            },
            Entry::DeleteGroupOffsets {
                group,
                partitions,
                coordinator,
            } => EntryResult::DeleteGroupOffsets(self.fence_group(group, coordinator).map(|()| {
                self.delete_group_offsets(group, partitions);
            })),
            Entry::DeleteGroup { group, coordinator } => EntryResult::DeleteGroup(
                self.fence_group(group, coordinator)
                    .map(|()| self.group_offsets.remove(group).is_some()),
            ),
            Entry::AdvanceLogStart {
                topic_id,
                partitions,
                cause: _,
            } => EntryResult::AdvanceLogStart(self.advance_log_start(topic_id, partitions)),
            Entry::FilesDeleted { files } => EntryResult::FilesDeleted(self.files_deleted(files)),
            Entry::ExpireProducers { before_ms } => {
                EntryResult::ExpireProducers(self.expire_producers(*before_ms))
            }
            Entry::ExpireGroup {
                group,
                last_commit_at_most_ms,
                coordinator,
            } => EntryResult::ExpireGroup(
                self.fence_group(group, coordinator).is_ok()
                    && self.expire_group(group, *last_commit_at_most_ms),
            ),
            Entry::ExpireAgentTips { before_ms } => {
                EntryResult::ExpireAgentTips(self.expire_agent_tips(*before_ms))
            }
            Entry::SweepHorizon { horizon_ms } => {
                self.sweep_horizon_ms = self.sweep_horizon_ms.max(*horizon_ms);
                EntryResult::SweepHorizon(self.sweep_horizon_ms)
            }
            Entry::ReplaceFiles(replace) => EntryResult::ReplaceFiles(self.replace_files(replace)),
            Entry::RegisterAgent(agent) => {
                EntryResult::RegisterAgent(self.registry.register(agent))
            }
            Entry::FenceAgent {
                node_id,
                incarnation,
                at_ms: _,
            } => EntryResult::FenceAgent(self.registry.fence(*node_id, incarnation)),
        }
    }

    /// The committed offset of `group` for one partition.
    pub fn committed_offset(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
    ) -> Option<&CommittedOffset> {
        self.group_offsets.get(group)?.get(topic)?.get(&partition)
    }

    fn commit_offsets(
        &mut self,
        group: &str,
        offsets: &[OffsetCommit],
        at_ms: i64,
    ) -> Vec<Result<(), ControlError>> {
        offsets
            .iter()
            .map(|commit| {
                let partitions = self
                    .topics
                    .get(&commit.topic)
                    .map_or(0, |topic| topic.partitions.len());
                let known = usize::try_from(commit.partition).is_ok_and(|p| p < partitions);
                if !known {
                    return Err(ControlError::UnknownTopicOrPartition(format!(
                        "{}-{}",
                        commit.topic, commit.partition
                    )));
                }
                let metadata_len = commit.metadata.as_ref().map_or(0, String::len);
                if metadata_len > MAX_OFFSET_METADATA_BYTES {
                    return Err(ControlError::OffsetMetadataTooLarge {
                        got: metadata_len,
                        max: MAX_OFFSET_METADATA_BYTES,
                    });
                }
                self.group_offsets
                    .entry(group.to_string())
                    .or_default()
                    .entry(commit.topic.clone())
                    .or_default()
                    .insert(
                        commit.partition,
                        CommittedOffset {
                            offset: commit.offset,
                            leader_epoch: commit.leader_epoch,
                            metadata: commit.metadata.clone(),
                            commit_ms: at_ms,
                        },
                    );
                Ok(())
            })
            .collect()
    }

    /// The coordinator fence of a group's offset changes (RFC 0002 §7): a stamped change
    /// passes only while its agent coordinates the group without a break since the stamp.
    fn fence_group(
        &self,
        group: &str,
        coordinator: &Option<CoordinatorStamp>,
    ) -> Result<(), ControlError> {
        coordinator.as_ref().map_or(Ok(()), |stamp| {
            self.registry.check_coordinator(group, stamp)
        })
    }

    fn delete_group_offsets(&mut self, group: &str, partitions: &[(String, i32)]) {
        let Some(offsets) = self.group_offsets.get_mut(group) else {
            return;
        };
        for (topic, partition) in partitions {
            if let Some(by_partition) = offsets.get_mut(topic) {
                by_partition.remove(partition);
                if by_partition.is_empty() {
                    offsets.remove(topic);
                }
            }
        }
        if offsets.is_empty() {
            self.group_offsets.remove(group);
        }
    }

    fn create_topic(
        &mut self,
        name: &str,
        topic_id: TopicId,
        partitions: i32,
        topic_configs: &BTreeMap<String, String>,
    ) -> Result<TopicId, ControlError> {
        configs::validate_topic_name(name)?;
        if self.topics.contains_key(name) {
            return Err(ControlError::TopicAlreadyExists(name.to_string()));
        }
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(ControlError::InvalidPartitions(format!(
                "partition count {partitions} is outside 1..={MAX_PARTITIONS}"
            )));
        }
        if topic_id.is_zero() || self.topic_names_by_id.contains_key(&topic_id) {
            return Err(ControlError::InvalidTopic(format!(
                "topic id {topic_id} is not unique"
            )));
        }
        configs::validate(topic_configs)?;
        let topic = Topic {
            name: name.to_string(),
            id: topic_id,
            configs: topic_configs.clone(),
            partitions: (0..partitions).map(|_| PartitionState::default()).collect(),
        };
        self.topic_names_by_id.insert(topic_id, name.to_string());
        self.topics.insert(name.to_string(), topic);
        Ok(topic_id)
    }

    fn delete_topic(&mut self, name: &str) -> Result<(), ControlError> {
        let Some(topic) = self.topics.remove(name) else {
            return Err(ControlError::UnknownTopicOrPartition(name.to_string()));
        };
        self.topic_names_by_id.remove(&topic.id);
        // Committed offsets go with the topic: a new topic of the same name starts afresh.
        self.group_offsets.retain(|_, offsets| {
            offsets.remove(name);
            !offsets.is_empty()
        });
        for partition in &topic.partitions {
            for entry in &partition.index {
                self.release_batch(entry.file_id);
            }
        }
        self.forget_pending_of(&topic.id);
        Ok(())
    }

    fn create_partitions(&mut self, name: &str, total: i32) -> Result<(), ControlError> {
        let Some(topic) = self.topics.get_mut(name) else {
            return Err(ControlError::UnknownTopicOrPartition(name.to_string()));
        };
        let current = topic.partitions.len() as i32;
        if total <= current || total > MAX_PARTITIONS {
            return Err(ControlError::InvalidPartitions(format!(
                "topic {name} has {current} partitions; requested total {total} must be larger and at most {MAX_PARTITIONS}"
            )));
        }
        topic
            .partitions
            .resize_with(total as usize, PartitionState::default);
        Ok(())
    }

    /// Applies a `CommitFile`, or a `ReserveFile` (`reserve`): the same checks and offsets, but
    /// the appended batches are pending (RFC 0006).
    fn commit_file(&mut self, commit: &FileCommit, reserve: bool) -> Vec<BatchOutcome> {
        if commit.file_id.unix_ms() < self.sweep_horizon_ms {
            // The sweep may have deleted (or be deleting) this object: never reference it.
            let error = ControlError::FileTooOld {
                horizon_ms: self.sweep_horizon_ms,
            };
            return vec![BatchOutcome::Rejected(error); commit.batches.len()];
        }
        let last_committed = self.agent_tips.get(&commit.agent).copied();
        if last_committed != commit.previous || self.knows_file(&commit.file_id) {
            let error = ControlError::CommitOutOfOrder { last_committed };
            return vec![BatchOutcome::Rejected(error); commit.batches.len()];
        }
        self.agent_tips.insert(commit.agent.clone(), commit.file_id);
        let mut pending = Vec::new();
        let outcomes: Vec<BatchOutcome> = commit
            .batches
            .iter()
            .map(|batch| {
                let (outcome, replaced) =
                    self.append_batch(commit.file_id, batch, &commit.agent, reserve);
                if let (true, BatchOutcome::Appended { base_offset, .. }) = (reserve, &outcome) {
                    pending.push(PendingBatch {
                        topic_id: batch.topic_id,
                        partition: batch.partition,
                        base_offset: *base_offset,
                        producer: replaced,
                    });
                }
                outcome
            })
            .collect();
        if !pending.is_empty() {
            self.add_pending(
                &commit.agent,
                PendingFile {
                    file_id: commit.file_id,
                    batches: pending,
                },
            );
        }
        let live = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, BatchOutcome::Appended { .. }))
            .count() as u32;
        let meta = FileMeta {
            size: commit.size,
            buckets: commit.buckets.clone(),
            live_batches: live,
            // A commit or reservation names what a producer uploads, always to the ingest tier.
            tier: Tier::Ingest,
        };
        if live > 0 {
            self.files.insert(commit.file_id, meta);
        } else {
            self.release_unused_file(commit.file_id, meta);
        }
        outcomes
    }

    /// Appends one batch of `agent`'s file, or answers why not. For an appended batch of an
    /// idempotent producer, also returns the producer state it replaced (an abort restores it).
    fn append_batch(
        &mut self,
        file_id: FileId,
        batch: &BatchCommit,
        agent: &str,
        reserve: bool,
    ) -> (BatchOutcome, Option<ReplacedProducer>) {
        let rejected = |error| (BatchOutcome::Rejected(error), None);
        let Some(name) = self.topic_names_by_id.get(&batch.topic_id) else {
            return rejected(ControlError::UnknownTopicOrPartition(
                batch.topic_id.to_string(),
            ));
        };
        // An id this state allocated but expired comes back when its client restarts it at
        // sequence 0 (librdkafka bumps the epoch locally on UNKNOWN_PRODUCER_ID, KIP-360). Any
        // later sequence of an expired id stays refused: it may be a retry of a batch whose
        // state is gone. Before expiry existed no allocated id was ever unknown, so old logs
        // replay unchanged.
        let revived = batch.producer_id >= 0
            && batch.producer_id < self.next_producer_id
            && batch.base_sequence == 0
            && !self.producer_epochs.contains_key(&batch.producer_id);
        let producer_epoch_known = if revived {
            Some(batch.producer_epoch)
        } else {
            self.producer_epochs.get(&batch.producer_id).copied()
        };
        let next_producer_id = self.next_producer_id;
        let Some(topic) = self.topics.get_mut(name) else {
            return rejected(ControlError::UnknownTopicOrPartition(name.clone()));
        };
        let Some(partition) = usize::try_from(batch.partition)
            .ok()
            .and_then(|index| topic.partitions.get_mut(index))
        else {
            return rejected(ControlError::UnknownTopicOrPartition(format!(
                "{}-{}",
                topic.name, batch.partition
            )));
        };
        if batch.offset_span <= 0 {
            return rejected(ControlError::InvalidPartitions("empty batch".into()));
        }
        let pending = self
            .pending_by_partition
            .get(&(batch.topic_id, batch.partition));
        let mut before = None;
        if batch.producer_id >= 0 {
            let Some(current_epoch) =
                producer_epoch_known.filter(|_| batch.producer_id < next_producer_id)
            else {
                return rejected(ControlError::UnknownProducerId(batch.producer_id));
            };
            if batch.producer_epoch < current_epoch {
                return rejected(ControlError::InvalidProducerEpoch {
                    current: current_epoch,
                    got: batch.producer_epoch,
                });
            }
            let producer = partition.producers.get(&batch.producer_id);
            // The producer's latest batch is pending in another incarnation's file: an abort of
            // that file would roll its sequences back under this batch (RFC 0006).
            let last_pending_elsewhere = producer
                .and_then(|producer| producer.recent.back())
                .and_then(|last| pending?.get(&last.base_offset))
                .is_some_and(|owner| owner.agent != agent);
            if last_pending_elsewhere {
                return rejected(ControlError::SequencePending {
                    producer_id: batch.producer_id,
                });
            }
            // What an abort restores: only a reservation's batches can be aborted.
            before = Some(producer.filter(|_| reserve).cloned());
            match check_sequence(partition, batch) {
                SequenceCheck::Accept => {}
                SequenceCheck::Duplicate(base_offset) => {
                    // Its original may still be aborted: acknowledging its offset now could
                    // lose the record.
                    if pending.is_some_and(|pending| pending.contains_key(&base_offset)) {
                        return rejected(ControlError::SequencePending {
                            producer_id: batch.producer_id,
                        });
                    }
                    let log_start_offset = partition.log_start_offset;
                    self.producer_active(batch.producer_id, file_id.unix_ms());
                    return (
                        BatchOutcome::Duplicate {
                            base_offset,
                            log_start_offset,
                        },
                        None,
                    );
                }
                SequenceCheck::Reject(error) => return rejected(error),
            }
        }
        let base_offset = partition.high_watermark;
        let last_offset = base_offset + i64::from(batch.offset_span) - 1;
        partition.index.push(IndexEntry {
            base_offset,
            last_offset,
            file_id,
            byte_offset: batch.byte_offset,
            len: batch.len,
            first_timestamp: batch.first_timestamp,
            max_timestamp: batch.max_timestamp,
        });
        partition.high_watermark = last_offset + 1;
        let log_start_offset = partition.log_start_offset;
        let mut replaced = None;
        if let Some(before) = before {
            record_sequence(partition, batch, base_offset);
            if revived {
                self.producer_epochs
                    .insert(batch.producer_id, batch.producer_epoch);
            }
            self.producer_active(batch.producer_id, file_id.unix_ms());
            replaced = reserve.then_some(ReplacedProducer {
                producer_id: batch.producer_id,
                before,
                revived_epoch: revived.then_some(batch.producer_epoch),
            });
        }
        (
            BatchOutcome::Appended {
                base_offset,
                log_start_offset,
            },
            replaced,
        )
    }
}

/// Kafka's hard ceiling is far higher; this bounds memory per request.
pub const MAX_PARTITIONS: i32 = 10_000;

#[cfg(test)]
mod tests;
