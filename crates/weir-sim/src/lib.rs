//! Deterministic simulation of the produce pipeline, the control plane and the storage model.
//!
//! One seed decides everything: the deployment (buckets, quorum, partitions, file and flush
//! settings, log pipelining, snapshot cadence), the storage latency and error model, the clients
//! (idempotent and plain producers, a consumer per partition) and the faults (kill -9 of an
//! agent incarnation, a second writer taking over while the first still runs, bucket outages,
//! slow buckets, metadata-bucket outages) and the bounded-state machinery of RFC 0003: retention,
//! DeleteRecords, the file deleter with its grace, fetch plans with a TTL, slow metadata and
//! lagging data buckets, the orphan sweep with skewed agent clocks, snapshots every 3–40 slots
//! each followed by metadata-log GC; and, on a third of the seeds, a cluster of 3–5 agents
//! (RFC 0002) where one leads the metadata log and the others follow, forward their writes and
//! take over by the lease rule, with members killed, cut off their peers or off the metadata
//! bucket. The real `weir-produce`, `weir-control`, `weir-fetch`
//! and `weir-storage` code runs on a single-threaded Tokio runtime with a paused clock over
//! in-memory buckets, so a seed replays exactly and an hour of faults runs in seconds.
//!
//! After every step the [`audit`] rebuilds the durable state the way recovery would (raw log,
//! raw bucket bytes) and checks DUR-1 (every acknowledged batch is durable at its offset, in a
//! quorum), ORD-1/ORD-2 (dense offsets, per-producer order), IDM-1 (no duplicates), FET-1
//! (every live writer's visible prefix equals the durable log; consumers only read durable
//! batches) and CTL-1 (a deposed writer never acknowledges); the log start (never backwards,
//! never past the high watermark, nothing below it served to a fetch planned after it moved) and
//! GC-1 (every DELETE a gate saw was of a file the durable log of that moment released, or an
//! orphan it never named below a durable sweep horizon;
//! no fetch finds a file gone within its plan's TTL); on seeds with cold reads and read-ahead, a
//! second reader of a partition, started at the same time one batch in, must get the bytes the
//! first reader got from there (reads joining GETs in flight part-way in); on cluster seeds also CTL-3 (an epoch
//! claimed over another agent's lease only after that lease stood still for the lease timeout)
//! and, after healing, one leader with every member at the same durable position. After the
//! fault phase everything heals and every idempotent batch must eventually be acknowledged,
//! and log GC must have bounded
//! the metadata log again (liveness). The independent replay reads every log slot ever written
//! from the [`archive`], since GC deletes covered slots from the bucket.
//!
//! `cargo nextest run -p weir-sim` runs a fixed set of seeds; `weir-sim --seeds N` runs more.

#[cfg(not(tokio_unstable))]
compile_error!(
    "weir-sim needs `--cfg tokio_unstable` to seed tokio's random numbers (set in \
     .cargo/config.toml; a RUSTFLAGS in the environment replaces that list, so add the cfg there too)"
);

mod archive;
mod audit;
mod client;
mod driver;
mod expiry_audit;
mod gate;
mod group_audit;
mod hold;
mod ledger;
mod replay;

pub use audit::Breaches;
pub use driver::{run, Sabotage, SimOptions, SimReport};
