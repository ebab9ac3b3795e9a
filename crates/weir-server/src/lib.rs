//! The Kafka-facing agent: listener, connection tasks, API routing and the handlers that turn
//! Kafka requests into produce tickets, fetch reads and control-plane entries.
//!
//! Bad input never hurts the agent (BAD-1): frame sizes are checked before allocation, request
//! bytes in flight are bounded by a global memory budget, fetch response bytes by another,
//! connections by a semaphore, and a malformed or unknown request closes only its own connection.

mod admission;
mod agents;
mod broker;
mod connection;
mod dispatch;
mod handlers;
mod maintenance;
mod memory;
mod order;
mod request_memory;
mod server;
#[cfg(test)]
mod tests;

pub use admission::AdmissionSettings;
pub use broker::{Broker, BrokerSettings};
pub use handlers::record_checks::ProduceValidation;
pub use maintenance::{run_group_expiry, GroupExpirySettings};
pub use server::Server;
