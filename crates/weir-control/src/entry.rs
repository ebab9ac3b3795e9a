//! Metadata log entries. The log holds requests, not results: `State::apply` turns each entry
//! into its result deterministically, so replay reproduces what the writer computed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use weir_common::{FileId, Tier, TopicId};

use crate::ControlError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry {
    /// The first entry a new writer epoch puts in the log (fencing and replay ordering).
    NewEpoch {
        epoch: u64,
        cluster_id: String,
        /// The writer's wall clock (0 in records from before RFC 0003). The first with a time
        /// starts the expiry clocks of producers and offsets that predate activity times.
        #[serde(default)]
        at_ms: i64,
    },
    CreateTopic {
        name: String,
        topic_id: TopicId,
        partitions: i32,
        configs: BTreeMap<String, String>,
    },
    DeleteTopic {
        name: String,
    },
    CreatePartitions {
        name: String,
        total: i32,
    },
    CommitFile(FileCommit),
    /// Non-transactional InitProducerId; `existing` asks for an epoch bump of a known id.
    InitProducerId {
        existing: Option<(i64, i16)>,
        /// The handler's wall clock: the producer's last activity.
        #[serde(default)]
        at_ms: i64,
        /// An `existing` id the state does not know (expired) gets a fresh id, as Kafka's
        /// coordinator does for non-transactional producers (KIP-360). Records from before
        /// this field answered `UnknownProducerId`, and replay must keep answering that.
        #[serde(default)]
        fresh_if_unknown: bool,
    },
    /// Committed consumer offsets of a group. The coordinator validated the member and
    /// generation before submitting; apply only checks the partitions and metadata size.
    CommitOffsets {
        group: String,
        offsets: Vec<OffsetCommit>,
        /// The coordinator's wall clock: when the offsets were committed (expiry).
        #[serde(default)]
        at_ms: i64,
        /// The committing coordinator in a cluster (RFC 0002 §7): apply refuses the commit
        /// unless it has coordinated the group without a break since `since`. `None` (a
        /// single agent, and records from before the registry) is not checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinator: Option<CoordinatorStamp>,
    },
    /// OffsetDelete: forgets the group's offsets of these (topic, partition)s.
    DeleteGroupOffsets {
        group: String,
        partitions: Vec<(String, i32)>,
        /// The deleting coordinator in a cluster, fenced as `CommitOffsets`' (log record
        /// version 4); `None` is not checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinator: Option<CoordinatorStamp>,
    },
    /// DeleteGroups: forgets every offset of the group.
    DeleteGroup {
        group: String,
        /// As in `DeleteGroupOffsets`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinator: Option<CoordinatorStamp>,
    },
    /// Moves partitions' log start offsets forward (retention, DeleteRecords). Batches wholly
    /// below the new start leave the index; a file whose last live batch leaves is released.
    AdvanceLogStart {
        topic_id: TopicId,
        partitions: Vec<LogStartMove>,
        cause: LogStartCause,
    },
    /// Released files the deleter removed from every bucket: they leave `State::released`.
    FilesDeleted {
        files: Vec<FileId>,
    },
    /// Forgets every producer id whose last activity is before `before_ms`, with its state on
    /// every partition (`producer.id.expiration.ms`).
    ExpireProducers {
        before_ms: i64,
    },
    /// Forgets an empty group's committed offsets if none was committed after
    /// `last_commit_at_most_ms` (`offsets.retention.minutes`); a later commit wins.
    ExpireGroup {
        group: String,
        last_commit_at_most_ms: i64,
        /// The expiring coordinator in a cluster, fenced as `CommitOffsets`' (a refused expiry
        /// expires nothing; log record version 4); `None` is not checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coordinator: Option<CoordinatorStamp>,
    },
    /// Forgets commit-chain tips (agent incarnations) whose last file is older than `before_ms`.
    ExpireAgentTips {
        before_ms: i64,
    },
    /// The orphan sweep's fence: from here on no file whose id time is before `horizon_ms`
    /// commits, so objects older than it that the state does not name can be deleted.
    SweepHorizon {
        horizon_ms: i64,
    },
    /// Compaction's swap (RFC 0005 §4): batches move from their input files to `output`, each
    /// only if the index still holds it exactly where the worker read it. Since run entries
    /// (RFC 0005 §3) a swap names runs of batches, each of which becomes one index entry.
    ReplaceFiles(FileReplace),
    /// An agent joins the cluster's registry (RFC 0002 §5), or its addresses change.
    RegisterAgent(AgentRegistration),
    /// The leader stopped hearing from an agent: it leaves the registry (if `incarnation` is
    /// still the registered one).
    FenceAgent {
        node_id: i32,
        incarnation: String,
        at_ms: i64,
    },
    /// A file sealed but not yet known to be in a quorum (RFC 0006, log record version 5):
    /// applied as `CommitFile`, but its batches are pending, so no consumer reads them until a
    /// `ConfirmFiles` names it. `buckets` names every bucket that may come to hold it.
    ReserveFile(FileCommit),
    /// Reserved files now in a quorum of ingest buckets: their batches become readable.
    ConfirmFiles {
        files: Vec<ConfirmedFile>,
    },
    /// Reserved files that never reached a quorum (RFC 0006): their batches move to the
    /// filler's empty batches and their producer states roll back.
    AbortFiles(FileAbort),
}

/// A file of a `ConfirmFiles`, and the ingest buckets that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmedFile {
    pub file_id: FileId,
    pub buckets: Vec<u8>,
}

/// An `AbortFiles`: pending files of one agent incarnation, which must be the last of its
/// pending files (in reservation order), and the filler that takes their offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAbort {
    pub agent: String,
    pub files: Vec<FileId>,
    pub filler: FileId,
    pub size: u64,
    /// Positions of the filler's holders in the ingest bucket list.
    pub buckets: Vec<u8>,
    /// One per pending batch of `files`: where its empty batch is in the filler.
    pub batches: Vec<FillerBatch>,
}

/// An empty record batch of a filler, standing in for the pending batch of the same partition
/// and base offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FillerBatch {
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    pub byte_offset: u64,
    pub len: u32,
}

/// A `RegisterAgent` entry: who the agent is and where clients and peers reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRegistration {
    pub node_id: i32,
    pub incarnation: String,
    pub zone: String,
    pub host: String,
    pub port: i32,
    pub control_address: String,
    pub at_ms: i64,
}

/// Who commits a group's offsets: an agent incarnation that has coordinated the group since
/// registry version `since`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStamp {
    pub node_id: i32,
    pub incarnation: String,
    pub since: u64,
}

/// A compaction job's result: the output file and, per batch, where it was and where it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileReplace {
    /// The job queue's id of the job (logs and metrics only).
    pub job: u64,
    pub output: FileId,
    pub tier: Tier,
    /// Positions of the output's holders in its tier's bucket list.
    pub holders: Vec<u8>,
    pub size: u64,
    /// One per batch: swaps written before run entries (their batches keep one index entry
    /// each). Empty in swaps of this build.
    #[serde(default)]
    pub batches: Vec<ReplacedBatch>,
    /// The job's input files: every batch a run replaces must be in one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<FileId>,
    /// Runs of consecutive batches laid out back to back in the output; each becomes one
    /// index entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<ReplacedRun>,
}

/// A run of a [`FileReplace`]: batches `base_offset..=last_offset` of one partition, `entries`
/// index entries when the worker read them, now at `byte_offset..byte_offset + len` of the
/// output in offset order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedRun {
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    pub last_offset: i64,
    pub byte_offset: u64,
    pub len: u32,
    pub entries: u32,
}

/// One batch of a [`FileReplace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplacedBatch {
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    pub last_offset: i64,
    /// The file the index named when the worker read the batch.
    pub from: FileId,
    /// Where the batch is in the output.
    pub byte_offset: u64,
    pub len: u32,
}

/// What a `ReplaceFiles` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceOutcome {
    /// Batches now read from the output.
    pub replaced: usize,
    /// Batches retention (or a topic deletion) removed after the worker read them.
    pub skipped: usize,
}

impl Entry {
    /// An InitProducerId of this build: an unknown (expired) `existing` id gets a fresh one.
    pub fn init_producer_id(existing: Option<(i64, i16)>, at_ms: i64) -> Entry {
        Entry::InitProducerId {
            existing,
            at_ms,
            fresh_if_unknown: true,
        }
    }
}

/// One partition's requested log start in an `AdvanceLogStart` entry. `offset` -1 means the
/// partition's high watermark (DeleteRecords' "delete everything").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStartMove {
    pub partition: i32,
    pub offset: i64,
}

/// Why a log start moved: for logs and metrics; apply treats both alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStartCause {
    Retention,
    DeleteRecords,
}

/// One partition's committed offset in a `CommitOffsets` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// A file uploaded to a quorum of ingest buckets, to be made visible at assigned offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCommit {
    /// The committing agent incarnation; its commits form a chain through `previous`.
    pub agent: String,
    /// The agent's file committed just before this one (`None` for its first). A commit whose
    /// `previous` is not the agent's last committed file is rejected whole, so a file whose
    /// commit failed can never be overtaken by a later file of the same agent (ORD-2).
    pub previous: Option<FileId>,
    pub file_id: FileId,
    pub size: u64,
    /// Indices of the ingest buckets that hold the file.
    pub buckets: Vec<u8>,
    pub batches: Vec<BatchCommit>,
}

/// One record batch inside a committed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCommit {
    pub topic_id: TopicId,
    pub partition: i32,
    pub byte_offset: u64,
    pub len: u32,
    /// Offsets the batch occupies (`lastOffsetDelta + 1`).
    pub offset_span: i32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// The outcome of one batch of a CommitFile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOutcome {
    Appended {
        base_offset: i64,
        log_start_offset: i64,
    },
    /// An idempotent retry of a batch already in the log: its original offset.
    Duplicate {
        base_offset: i64,
        log_start_offset: i64,
    },
    Rejected(ControlError),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryResult {
    NewEpoch,
    CreateTopic(Result<TopicId, ControlError>),
    DeleteTopic(Result<(), ControlError>),
    CreatePartitions(Result<(), ControlError>),
    CommitFile(Vec<BatchOutcome>),
    InitProducerId(Result<(i64, i16), ControlError>),
    /// One result per offset of the entry, in order.
    CommitOffsets(Vec<Result<(), ControlError>>),
    DeleteGroupOffsets(Result<(), ControlError>),
    /// Whether the group had committed offsets; `NotCoordinator` when the fence refused it.
    DeleteGroup(Result<bool, ControlError>),
    /// One result per partition of the entry, in order: the log start (Kafka's low watermark).
    AdvanceLogStart(Vec<Result<i64, ControlError>>),
    /// How many of the files were released and are now forgotten.
    FilesDeleted(usize),
    /// How many producer ids expired.
    ExpireProducers(usize),
    /// Whether the group's offsets were forgotten.
    ExpireGroup(bool),
    /// How many tips expired.
    ExpireAgentTips(usize),
    /// The horizon in effect (it never moves back).
    SweepHorizon(i64),
    ReplaceFiles(Result<ReplaceOutcome, ControlError>),
    /// The registry version after the registration.
    RegisterAgent(Result<u64, ControlError>),
    /// Whether the agent was fenced (false: another incarnation, or not registered).
    FenceAgent(bool),
    ReserveFile(Vec<BatchOutcome>),
    /// How many of the files were pending (and are now readable).
    ConfirmFiles(usize),
    /// How many batches moved to the filler.
    AbortFiles(Result<usize, ControlError>),
}

impl Entry {
    /// The oldest log record version that can hold this entry (see `LOG_RECORD_VERSION`).
    pub fn record_version(&self) -> u16 {
        match self {
            Entry::ReserveFile(_) | Entry::ConfirmFiles { .. } | Entry::AbortFiles(_) => 5,
            _ => 4,
        }
    }
}
