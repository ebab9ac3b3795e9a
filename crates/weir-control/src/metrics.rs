//! What the metadata log writer exports to `/metrics`: slots written, their latency and size,
//! and snapshots. The leader's role, epoch and position are read from the plane at scrape time
//! ([`crate::ControlPlane::leader_status`]); these count events as they happen.

use prometheus::{Histogram, IntCounter, IntGauge, Registry};
use weir_common::metrics::{counter, gauge, histogram, latency};

/// The metadata log writer's metrics (created unregistered; the agent registers them).
#[derive(Debug, Clone)]
pub struct ControlMetrics {
    /// Slots this agent wrote as the leader and found durable: one PUT each (or one append +
    /// flush into a pre-warmed slot object).
    pub(crate) log_slots: IntCounter,
    pub(crate) slot_duration: Histogram,
    pub(crate) entries_per_slot: Histogram,
    pub(crate) snapshots: IntCounter,
    pub(crate) snapshot_bytes: IntGauge,
    pub(crate) snapshot_duration: Histogram,
}

impl Default for ControlMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> Self {
        Self {
            log_slots: counter(
                "weir_control_log_slots_total",
                "Metadata log slots this agent wrote as the leader and made durable",
            ),
            slot_duration: latency(
                "weir_control_log_slot_duration_seconds",
                "Time to write one metadata log slot, retries included",
            ),
            entries_per_slot: histogram(
                "weir_control_log_entries_per_slot",
                "Entries (file commits, offset commits, …) group-committed into one slot",
                prometheus::exponential_buckets(1.0, 2.0, 13).expect("valid buckets"),
            ),
            snapshots: counter(
                "weir_control_snapshots_total",
                "Snapshots of the metadata state written",
            ),
            snapshot_bytes: gauge(
                "weir_control_snapshot_bytes",
                "Size of the latest snapshot written (body and index sections)",
            ),
            snapshot_duration: latency(
                "weir_control_snapshot_duration_seconds",
                "Time to encode and write one snapshot",
            ),
        }
    }

    /// Registers every metric with `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.log_slots.clone()))?;
        registry.register(Box::new(self.slot_duration.clone()))?;
        registry.register(Box::new(self.entries_per_slot.clone()))?;
        registry.register(Box::new(self.snapshots.clone()))?;
        registry.register(Box::new(self.snapshot_bytes.clone()))?;
        registry.register(Box::new(self.snapshot_duration.clone()))
    }
}
