//! The cluster transport (RFC 0002 §8): a follower reaches the control-plane leader over gRPC.
//!
//! One hand-written service, `weir.cluster.v1.Control`, with `prost` messages written in Rust (no
//! `protoc` needed): `Submit` (one ordered bidirectional stream per connection: forwarded writes
//! and their durable results), `Barrier`, `Status`, `Records` (the leader's durable slots),
//! `Heartbeat` (the registry's liveness) and `Queue` (a call to a job queue's broker on this
//! agent, [`QueueNetwork`]).
//! Entries, results and errors travel in the JSON the metadata log stores them in. Every call
//! carries the cluster id and protocol version; a peer of another cluster or version is refused
//! with `FAILED_PRECONDITION`. Messages are bounded ([`MAX_MESSAGE_BYTES`]); a malformed one ends
//! its call with an error status, never a panic.
//!
//! [`GrpcLink`] is the client side (a [`weir_control::link::ControlLink`]); [`serve`] runs the
//! server side for one control plane.

mod client;
mod proto;
mod queue;
mod server;

pub use client::GrpcLink;
pub use queue::QueueNetwork;
pub use server::{serve, ControlService};

/// Protocol version in every call's metadata; a peer on another version is refused.
/// 3: `DeleteGroup` results carry the coordinator fence's refusal.
pub const PROTOCOL_VERSION: &str = "3";
/// Metadata keys of the handshake.
pub const CLUSTER_ID_HEADER: &str = "weir-cluster-id";
pub const PROTOCOL_HEADER: &str = "weir-cluster-protocol";
/// Largest message either side decodes: a log slot's entries at most (a slot is far smaller).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

const SERVICE: &str = "weir.cluster.v1.Control";

#[cfg(test)]
mod tests;
