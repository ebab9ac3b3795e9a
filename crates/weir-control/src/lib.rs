//! The control plane: the deterministic metadata state machine and its durable log on object
//! storage.
//!
//! * [`state`] — topics, partitions, the file index, producer state, committed group offsets;
//!   `apply(entry) -> result`.
//! * [`entry`] — what the log records (requests, not results) and what applying them returns.
//! * [`log`] — create-only sequenced log objects, epochs, snapshots and recovery by replay.
//! * [`gc`] — the deleter: released files leave every bucket after a grace period.
//! * [`maintenance`] — retention: which log starts move, and the task that moves them.
//! * [`sweep`] — the orphan sweep: unreferenced objects older than a fenced horizon go.
//! * [`summary`] — topic names, ids and partition counts without partition contents (Metadata).
//! * [`replica`] — a follower's copy of the durable log's state (RFC 0002; not yet used).
//! * [`leadership`] — the leader's lease and when a follower may take over (RFC 0002; not yet
//!   used).
//! * [`plane`] — the in-process [`ControlPlane`] handle: a single actor sequences entries,
//!   group-commits them with several log writes in flight, and answers each caller once its
//!   entry and every entry before it are durable (DUR-1, CTL-1).
//!
//! It does not speak the Kafka protocol; callers map [`ControlError`] to Kafka error codes.

pub mod configs;
pub mod coordination;
pub mod entry;
pub mod error;
pub mod gc;
pub mod leadership;
pub mod link;
pub mod log;
pub mod maintenance;
pub mod metrics;
pub mod plane;
pub mod replica;
pub mod state;
pub mod summary;
pub mod sweep;
#[cfg(test)]
mod test_support;

pub use entry::{
    AgentRegistration, BatchCommit, BatchOutcome, ConfirmedFile, CoordinatorStamp, Entry,
    EntryResult, FileAbort, FileCommit, FileReplace, FillerBatch, LogStartCause, LogStartMove,
    OffsetCommit, ReplaceOutcome, ReplacedBatch, ReplacedRun,
};
pub use error::ControlError;
pub use plane::{AgentInfo, ControlPlane, ControlPlaneSettings, Registration, Reservation};
pub use state::{
    ChunkedIndex, CommittedOffset, IndexEntry, PartitionState, RegisteredAgent, Registry, State,
    Topic, CHUNK_ENTRIES,
};
pub use summary::{GroupLag, StateCounts, TopicSummary};
