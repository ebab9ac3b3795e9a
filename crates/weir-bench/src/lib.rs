//! `weir bench`: OpenMessaging-Benchmark-style workloads against any Kafka bootstrap.
//!
//! A separate crate (and binary, `weir-bench`) so that the agent never links librdkafka; the
//! `weir` binary's `bench` subcommand executes the `weir-bench` next to it. Producers and
//! consumers are real Kafka clients (the `rdkafka` crate); consumers use `assign()`, so no consumer
//! groups are needed. See `docs/benchmarks.md` for how the numbers in the docs were produced.

pub mod agent;
mod backlog;
mod consume;
mod latency;
pub mod report;
pub mod run;
pub mod svg;
pub mod workload;

pub use agent::{count_objects, SpawnedAgent};
pub use report::{CatchUp, Latency, Report, StorageCounts};
pub use run::{run, Options, Outcome};
pub use workload::Workload;
