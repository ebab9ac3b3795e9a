//! One module per API family. Each handler maps internal errors to Kafka error codes at the edge.

pub(crate) mod admin;
pub(crate) mod api_versions;
pub(crate) mod configs;
pub(crate) mod coordinator;
pub(crate) mod delete_records;
pub(crate) mod fetch;
pub(crate) mod group_admin;
pub(crate) mod group_offsets;
pub(crate) mod membership;
pub(crate) mod metadata;
pub(crate) mod offsets;
pub(crate) mod produce;
pub(crate) mod record_checks;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;
use weir_common::TopicId;
use weir_control::ControlError;
use weir_groups::GroupError;
use weir_protocol::error_code;

pub(crate) fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

pub(crate) fn text(value: impl Into<String>) -> StrBytes {
    StrBytes::from_string(value.into())
}

pub(crate) fn uuid(id: TopicId) -> Uuid {
    Uuid::from_bytes(id.0)
}

pub(crate) fn topic_id(id: Uuid) -> TopicId {
    TopicId(*id.as_bytes())
}

/// The one mapping from control-plane errors to Kafka error codes.
pub(crate) fn control_error_code(error: &ControlError) -> i16 {
    match error {
        ControlError::UnknownTopicOrPartition(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
        ControlError::TopicAlreadyExists(_) => error_code::TOPIC_ALREADY_EXISTS,
        ControlError::InvalidTopic(_) => error_code::INVALID_TOPIC_EXCEPTION,
        ControlError::InvalidPartitions(_) => error_code::INVALID_PARTITIONS,
        ControlError::InvalidConfig(_) => error_code::INVALID_CONFIG,
        ControlError::OutOfOrderSequence { .. } => error_code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        ControlError::InvalidProducerEpoch { .. } => error_code::INVALID_PRODUCER_EPOCH,
        ControlError::UnknownProducerId(_) => error_code::UNKNOWN_PRODUCER_ID,
        // Compaction's conflict never reaches a client; mapped for completeness.
        ControlError::CommitOutOfOrder { .. }
        | ControlError::FileTooOld { .. }
        | ControlError::ReplaceConflict(_)
        | ControlError::AbortMismatch(_) => error_code::KAFKA_STORAGE_ERROR,
        // The batch may or may not be written yet (its original is pending): Kafka's answer for
        // a produce whose outcome is unknown, which clients retry with the same sequence.
        ControlError::SequencePending { .. } => error_code::REQUEST_TIMED_OUT,
        ControlError::OffsetMetadataTooLarge { .. } => error_code::OFFSET_METADATA_TOO_LARGE,
        ControlError::OffsetOutOfRange { .. } => error_code::OFFSET_OUT_OF_RANGE,
        ControlError::NotCoordinator(_) => error_code::NOT_COORDINATOR,
        // Registration is the agent's own business; mapped for completeness.
        ControlError::NodeIdTaken { .. } => error_code::UNKNOWN_SERVER_ERROR,
        ControlError::Unavailable(_) => error_code::REQUEST_TIMED_OUT,
        ControlError::ShuttingDown => error_code::NOT_LEADER_OR_FOLLOWER,
    }
}

/// The one mapping from group coordinator errors to Kafka error codes.
pub(crate) fn group_error_code(error: &GroupError) -> i16 {
    match error {
        GroupError::RebalanceInProgress => error_code::REBALANCE_IN_PROGRESS,
        GroupError::IllegalGeneration { .. } => error_code::ILLEGAL_GENERATION,
        GroupError::UnknownMemberId(_) => error_code::UNKNOWN_MEMBER_ID,
        GroupError::MemberIdRequired => error_code::MEMBER_ID_REQUIRED,
        GroupError::FencedInstanceId(_) => error_code::FENCED_INSTANCE_ID,
        GroupError::InconsistentGroupProtocol => error_code::INCONSISTENT_GROUP_PROTOCOL,
        GroupError::GroupIdNotFound(_) => error_code::GROUP_ID_NOT_FOUND,
        GroupError::NonEmptyGroup(_) => error_code::NON_EMPTY_GROUP,
        GroupError::NotCoordinator(_) => error_code::NOT_COORDINATOR,
        GroupError::CoordinatorNotAvailable(_) => error_code::COORDINATOR_NOT_AVAILABLE,
        GroupError::InvalidSessionTimeout { .. } => error_code::INVALID_SESSION_TIMEOUT,
        GroupError::GroupMaxSizeReached(_) => error_code::GROUP_MAX_SIZE_REACHED,
        GroupError::InvalidGroupId(_) => error_code::INVALID_GROUP_ID,
        GroupError::InvalidRequest(_) => error_code::INVALID_REQUEST,
    }
}

/// An optional error code: `NONE` for success.
pub(crate) fn group_result_code(result: &Result<(), GroupError>) -> i16 {
    result
        .as_ref()
        .err()
        .map_or(error_code::NONE, group_error_code)
}
