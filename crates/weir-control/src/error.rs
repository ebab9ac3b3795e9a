use serde::{Deserialize, Serialize};

/// Why a control-plane request failed. Deterministic outcomes of `apply` are serialisable so
/// replay reproduces them; `Unavailable` and `ShuttingDown` come from the plane, never from apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ControlError {
    #[error("unknown topic or partition: {0}")]
    UnknownTopicOrPartition(String),
    #[error("topic already exists: {0}")]
    TopicAlreadyExists(String),
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("out of order sequence: expected {expected}, got {got}")]
    OutOfOrderSequence { expected: i32, got: i32 },
    #[error("producer epoch {got} is older than current epoch {current}")]
    InvalidProducerEpoch { current: i16, got: i16 },
    #[error("unknown producer id {0}")]
    UnknownProducerId(i64),
    #[error("an earlier file of this agent did not commit (last committed: {last_committed:?})")]
    CommitOutOfOrder {
        last_committed: Option<weir_common::FileId>,
    },
    #[error("offset metadata of {got} bytes exceeds {max} bytes")]
    OffsetMetadataTooLarge { got: usize, max: usize },
    #[error("offset {offset} is outside [{log_start_offset}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        high_watermark: i64,
    },
    #[error("file is older than the orphan sweep horizon {horizon_ms} ms: upload it again")]
    FileTooOld { horizon_ms: i64 },
    /// The producer's batch this one duplicates or follows is in a file not yet known to be
    /// in a quorum (RFC 0006): retry once it is confirmed or aborted.
    #[error("producer {producer_id}'s previous batch on this partition is not yet durable")]
    SequencePending { producer_id: i64 },
    /// An `AbortFiles` that does not match the pending state: nothing was aborted.
    #[error("abort refused: {0}")]
    AbortMismatch(String),
    /// A compaction's swap found a batch elsewhere than where its worker read it (another
    /// compaction moved it first): nothing was replaced.
    #[error("compaction conflict: {0}")]
    ReplaceConflict(String),
    /// Another live agent holds the node id (RFC 0002 §5).
    #[error("node id {node_id} belongs to the live agent at {address}")]
    NodeIdTaken { node_id: i32, address: String },
    /// The coordinator fence refused a group's offset commit (RFC 0002 §7).
    #[error("not the group's coordinator: {0}")]
    NotCoordinator(String),
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
    #[error("control plane is shutting down")]
    ShuttingDown,
}

impl ControlError {
    /// Whether the client may retry the same request and expect a different outcome.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ControlError::Unavailable(_)
                | ControlError::ShuttingDown
                | ControlError::SequencePending { .. }
        )
    }
}
