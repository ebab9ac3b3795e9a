//! The consumer group coordinator for Kafka's classic group protocol (JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup), with static membership (KIP-345).
//!
//! * [`core`] — the sans-I/O state machine: groups, members, generations, rebalances and
//!   timeouts, driven by calls and by [`CoordinatorCore::tick`] with an injected clock. Long-polling
//!   requests are identified by a [`Token`]; their answers come back as [`Effects`].
//! * [`service`] — the async wrapper: a oneshot channel per parked request and a timer task that
//!   drives timeouts.
//! * [`coordinator_for`] — which agent coordinates a group (`weir_common::placement`).
//!
//! Membership lives only in the coordinator's memory. Committed offsets do not live here: they are
//! control-plane state; this crate only validates that a commit comes from a current member.
//! The broker never interprets assignment bytes; it passes them through unchanged.

pub mod core;
pub mod error;
mod group;
mod join;
pub mod service;
mod static_member;
mod subscription;
pub mod types;

pub use crate::core::{CoordinatorCore, Effects, GroupSettings};
pub use error::GroupError;
pub use service::GroupCoordinator;
pub use types::*;
pub use weir_common::placement::coordinator_for;
