//! When the writer snapshots (RFC 0003 §8 "Triggers") and the background job that writes a
//! snapshot and then runs log GC (RFC 0003 §7).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::ControlPlaneSettings;
use crate::log::{FenceSlots, LogError, LogStore};
use crate::state::State;

/// Slots and slot payload bytes since the last snapshot, and when it was taken.
#[derive(Debug)]
pub(super) struct SnapshotTrigger {
    slots: u64,
    bytes: u64,
    since: Instant,
    /// Set while a snapshot job runs: at most one at a time, so a slow store cannot pile up
    /// snapshot copies of the state in memory.
    busy: Arc<AtomicBool>,
}

impl SnapshotTrigger {
    pub(super) fn new() -> Self {
        Self {
            slots: 0,
            bytes: 0,
            since: Instant::now(),
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Counts from a recovered state: `slots` already follow the newest snapshot (their bytes
    /// are not known; the clock starts now).
    pub(super) fn restart(&mut self, slots: u64) {
        self.slots = slots;
        self.bytes = 0;
        self.since = Instant::now();
    }

    /// Counts a durable slot of `payload_bytes`. Returns a claim on the snapshot slot when a
    /// snapshot is due — `snapshot_every_slots` (`control.snapshot_max_slots`) slots or
    /// `snapshot_max_log_bytes` since the last, or `snapshot_max_interval` with this slot
    /// since — and no other snapshot is running. A due snapshot that finds one running is
    /// taken at a later slot (the counts keep growing).
    pub(super) fn slot_durable(
        &mut self,
        payload_bytes: u64,
        settings: &ControlPlaneSettings,
    ) -> Option<SnapshotClaim> {
        self.slots += 1;
        self.bytes = self.bytes.saturating_add(payload_bytes);
        let due = self.slots >= settings.snapshot_every_slots.max(1)
            || self.bytes >= settings.snapshot_max_log_bytes.max(1)
            || self.since.elapsed() >= settings.snapshot_max_interval;
        if !due || self.busy.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.restart(0);
        Some(SnapshotClaim(self.busy.clone()))
    }
}

/// The one snapshot job allowed to run; dropping it (done, failed or panicked) frees the slot.
#[derive(Debug)]
pub(super) struct SnapshotClaim(Arc<AtomicBool>);

impl Drop for SnapshotClaim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A snapshot of the readable state after durable slot `seq`, to write and then collect by.
pub(super) struct SnapshotJob {
    pub(super) log: LogStore,
    pub(super) epoch: u64,
    pub(super) seq: u64,
    pub(super) state: Box<State>,
    pub(super) fence: FenceSlots,
    pub(super) inline: bool,
    pub(super) log_gc: bool,
    pub(super) claim: SnapshotClaim,
    pub(super) metrics: crate::metrics::ControlMetrics,
}

impl SnapshotJob {
    /// Encodes (on a blocking thread unless `inline`) and writes, then runs log GC. Failures
    /// are logged and the writer keeps serving: the log stays complete, only replay gets
    /// longer, and chunks a failed snapshot left are deleted by a later log GC.
    pub(super) async fn run(self) {
        let SnapshotJob {
            log,
            epoch,
            seq,
            state,
            fence,
            inline,
            log_gc,
            claim,
            metrics,
        } = self;
        let started = Instant::now();
        let written = if inline {
            log.write_snapshot(epoch, seq, &state, &fence).await
        } else {
            log.write_snapshot_in_background(epoch, seq, state, fence.clone())
                .await
        };
        match written {
            Ok(written) => {
                metrics.snapshots.inc();
                metrics
                    .snapshot_bytes
                    .set((written.bytes + written.index_bytes) as i64);
                metrics
                    .snapshot_duration
                    .observe(started.elapsed().as_secs_f64());
                debug!(seq, epoch, ?written, "snapshot written");
            }
            Err(err @ (LogError::Encode { .. } | LogError::SnapshotEncoder(_))) => {
                error!(seq, error = %err, "snapshot skipped: the state cannot be encoded");
                return;
            }
            Err(err) => {
                warn!(seq, epoch, error = %err, "snapshot write failed");
                return;
            }
        }
        if log_gc {
            // A failure leaves garbage for the next snapshot's GC to delete.
            if let Err(err) = log.collect_garbage(seq, &fence).await {
                warn!(seq, error = %err, "metadata log GC failed");
            }
        }
        drop(claim);
    }
}
