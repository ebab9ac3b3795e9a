//! Why a group request failed. The server maps each variant to one Kafka error code.

/// A group coordinator error, with the fields that explain it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("group is rebalancing")]
    RebalanceInProgress,
    #[error("generation {got} is not the group's generation {current}")]
    IllegalGeneration { current: i32, got: i32 },
    #[error("unknown member id {0:?}")]
    UnknownMemberId(String),
    #[error("the member must rejoin with the member id it was given")]
    MemberIdRequired,
    #[error("group instance id {0:?} is now used by another member")]
    FencedInstanceId(String),
    #[error("protocol type or protocols do not match the group's")]
    InconsistentGroupProtocol,
    #[error("group {0:?} does not exist")]
    GroupIdNotFound(String),
    #[error("group {0:?} has members")]
    NonEmptyGroup(String),
    #[error("group {0:?} is coordinated by another agent")]
    NotCoordinator(String),
    #[error("coordinator not available: {0}")]
    CoordinatorNotAvailable(String),
    #[error("session timeout {got} ms is outside {min}..={max} ms")]
    InvalidSessionTimeout { got: i32, min: i32, max: i32 },
    #[error("group already has its maximum of {0} members")]
    GroupMaxSizeReached(usize),
    #[error("invalid group id {0:?}")]
    InvalidGroupId(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl GroupError {
    /// Whether the client may retry the same request and expect a different outcome.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            GroupError::RebalanceInProgress
                | GroupError::CoordinatorNotAvailable(_)
                | GroupError::NotCoordinator(_)
        )
    }
}
