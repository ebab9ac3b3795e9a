//! The Kafka-facing agent: listener, connection tasks, API routing and the handlers that turn
//! Kafka requests into produce tickets, fetch reads and control-plane entries.
//!
//! Bad input never hurts the agent (BAD-1): frame sizes are checked before allocation, request
//! bytes in flight are bounded by a global memory budget, fetch response bytes by another,
//! connections by a semaphore, and a malformed or unknown request closes only its own connection.
//!
//! The agent's HTTP endpoint lives here too ([`http`]): Prometheus metrics ([`metrics`]),
//! health and readiness ([`health`]) and the status page ([`status`]).

mod admission;
mod agents;
mod broker;
mod connection;
mod dispatch;
mod handlers;
mod health;
mod http;
mod maintenance;
mod memory;
pub mod metrics;
mod order;
mod request_memory;
mod server;
mod status;
#[cfg(test)]
mod tests;

pub use admission::AdmissionSettings;
pub use broker::{Broker, BrokerSettings};
pub use handlers::record_checks::ProduceValidation;
pub use health::{ProbedBucket, Readiness};
pub use http::{serve as serve_http, Observability};
pub use maintenance::{run_group_expiry, GroupExpirySettings};
pub use server::Server;
