//! Metadata-log GC and its fence (RFC 0003 §7).
//!
//! After a snapshot `S2` is written and reads back, with the previous readable snapshot `S1`,
//! log GC deletes snapshots older than `S1` with their chunks, chunks between `S1` and `S2`
//! that no manifest names (a snapshot that crashed or failed mid-write), every log slot `≤ S1`
//! **except fence slots** (the slot of every live `NewEpoch` record), and epoch objects older
//! than the newest [`KEPT_EPOCHS`]. Recovery can still fall back from a corrupt `S2` to `S1` and the slots after
//! it. Deletions are not logged: replay starts at a snapshot and never reads below it.
//!
//! # Why a deposed writer cannot acknowledge a collected slot (the stalled writer)
//!
//! Slots are create-only: a deposed writer `W` (epoch `w`) whose PUT stalls on the wire and
//! lands after a later writer `B` took over fails because the slot exists. Deleting slots
//! reopens them, so GC must keep the one slot that stops `W`:
//!
//! * `B`'s first record is its `NewEpoch`, written create-only at `g`, the first slot missing
//!   when `B` replayed. Every slot below `g` existed then and was replayed: what `W` wrote
//!   there is live, and re-creating a collected one with the same bytes (a retried ambiguous
//!   PUT) re-creates a record that is already in every later snapshot: junk below `S1` that
//!   the next GC deletes.
//! * `W` keeps several slot writes in flight but completes them strictly in slot order (the
//!   plane's `FuturesOrdered`), and a failed write fails every later one. To acknowledge
//!   anything at or above `g`, `W`'s create of slot `g` must succeed first.
//! * Slot `g` holds `B`'s `NewEpoch`, a fence slot, which GC never deletes: `W`'s create of `g`
//!   finds it and fails with `SlotLost`, so `W` acknowledges nothing at or above `g`. A writer
//!   deposed later in turn has its own later `NewEpoch` slot.
//!
//! The fence slots are recorded by replay (a live slot whose first entry is `NewEpoch`) and by
//! recovery (its own `NewEpoch`), carried in every snapshot, and never pruned (one small object
//! per epoch ever). A snapshot from before log GC does not carry them: GC then reads each slot
//! below the point the list is known from before deleting it and keeps those opening with
//! `NewEpoch`.
//!
//! A deposed writer's own GC is harmless: it snapshots only its durable slots, all below the
//! next writer's `NewEpoch`, so it deletes nothing the next writer wrote. A recovery that read
//! the log while GC deleted below its replay gap is caught by the stalled-recovery check
//! ([`LogStore::check_not_collected`]).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use weir_common::Backoff;
use weir_storage::keys;

use super::{LogError, LogStore};
use crate::entry::Entry;

/// Epoch objects kept: `claim_epoch` lists `meta/epoch/` and claims one above the highest, so
/// the newest must stay; a few more keep the history of recent takeovers for operators.
pub const KEPT_EPOCHS: usize = 16;

/// The slots of live `NewEpoch` records: log GC never deletes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceSlots {
    /// Every live `NewEpoch` slot at or above `known_from`.
    slots: BTreeSet<u64>,
    /// Below this slot the list is unknown (a log from before log GC); 0 for a log replayed
    /// from its start.
    known_from: u64,
}

impl Default for FenceSlots {
    /// The fence of an empty log: complete from slot 0.
    fn default() -> Self {
        Self {
            slots: BTreeSet::new(),
            known_from: 0,
        }
    }
}

impl FenceSlots {
    /// The fence of a snapshot from before log GC: nothing known.
    pub(super) fn unknown() -> Self {
        Self {
            slots: BTreeSet::new(),
            known_from: u64::MAX,
        }
    }

    /// Replay reads every slot from `start` on, so the list is complete from there.
    pub(super) fn replaying_from(&mut self, start: u64) {
        self.known_from = self.known_from.min(start);
    }

    /// Records the slot of a live `NewEpoch` record.
    pub(crate) fn record(&mut self, seq: u64) {
        self.slots.insert(seq);
    }

    /// The fence slots known, ascending.
    pub fn slots(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.iter().copied()
    }

    /// `Some(true)` for a fence slot, `Some(false)` for a slot GC may delete, `None` when the
    /// slot is below what the list knows and must be read.
    fn is_fence(&self, seq: u64) -> Option<bool> {
        if self.slots.contains(&seq) {
            Some(true)
        } else if seq >= self.known_from {
            Some(false)
        } else {
            None
        }
    }
}

/// `true` for a record that opens an epoch: a fence slot.
pub(crate) fn opens_epoch(entries: &[Entry]) -> bool {
    matches!(entries.first(), Some(Entry::NewEpoch { .. }))
}

/// What one log GC deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The snapshot kept as the fallback (`S1`); `None`: nothing to collect yet.
    pub kept_snapshot: Option<u64>,
    pub snapshots: usize,
    /// Chunks of collected snapshots and chunks without a manifest.
    pub chunks: usize,
    pub slots: usize,
    pub epochs: usize,
    /// Fence slots at or below `S1`, kept.
    pub fences_kept: usize,
}

impl LogStore {
    /// Log GC after snapshot `s2` was written by the serving writer, whose fence slots are
    /// `fence`. Reads `s2` back first and does nothing unless it decodes.
    ///
    /// A pass makes a dozen or so requests and stops at the first failed one; a failed pass is
    /// run again (up to `write_attempts` passes, with backoff), since every pass is idempotent
    /// (an absent object counts as deleted). Without that, a bucket failing a few percent of
    /// requests fails most passes, and the log outgrows its bound between snapshots.
    pub async fn collect_garbage(&self, s2: u64, fence: &FenceSlots) -> Result<GcReport, LogError> {
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
        let mut rng = fastrand::Rng::with_seed(s2);
        let mut pass = 1;
        loop {
            match self.collect_garbage_once(s2, fence).await {
                Err(err @ LogError::Store { .. }) if pass < self.write_attempts => {
                    warn!(s2, pass, error = %err, "metadata log GC pass failed, retrying");
                }
                result => return result,
            }
            pass += 1;
            tokio::time::sleep(backoff.next_delay(&mut rng)).await;
        }
    }

    /// One pass of [`LogStore::collect_garbage`].
    async fn collect_garbage_once(
        &self,
        s2: u64,
        fence: &FenceSlots,
    ) -> Result<GcReport, LogError> {
        match self.read_snapshot(s2).await? {
            Some(Ok(_)) => {}
            Some(Err(reason)) => {
                warn!(s2, %reason, "the new snapshot does not read back: no log GC");
                return Ok(GcReport::default());
            }
            None => {
                warn!(s2, "the new snapshot is absent: no log GC");
                return Ok(GcReport::default());
            }
        }
        let snapshots = self.list_seqs(&keys::meta_snapshot_prefix()).await?;
        let Some(s1) = self.previous_good_snapshot(&snapshots, s2).await? else {
            return Ok(GcReport::default());
        };
        let mut report = GcReport {
            kept_snapshot: Some(s1),
            ..GcReport::default()
        };
        let old_snapshots: Vec<Path> = snapshots
            .iter()
            .filter(|seq| **seq < s1)
            .map(|seq| keys::meta_snapshot(*seq))
            .collect();
        // Each batch is attempted even when an earlier one failed: what one GC leaves, the
        // next lists and deletes again, but only if every GC makes progress.
        let deleted_snapshots = self.delete_all(old_snapshots).await;
        // After the manifests: a crash in between leaves chunks without one, collected next.
        let chunks = match self.collectable_chunks(s1, s2, &snapshots).await {
            Ok(chunks) => self.delete_all(chunks).await,
            Err(err) => Err(err),
        };
        let (slots, fences_kept) = self.collectable_slots(s1, fence).await?;
        report.fences_kept = fences_kept;
        let slots = self.delete_all(slots).await;
        let epochs = self.list_seqs(&keys::meta_epoch_prefix()).await?;
        let old_epochs = epochs.len().saturating_sub(KEPT_EPOCHS);
        let epochs = self
            .delete_all(
                epochs[..old_epochs]
                    .iter()
                    .map(|e| keys::meta_epoch(*e))
                    .collect(),
            )
            .await;
        report.snapshots = deleted_snapshots?;
        report.chunks = chunks?;
        report.slots = slots?;
        report.epochs = epochs?;
        info!(s1, s2, ?report, "metadata log GC");
        Ok(report)
    }

    /// The newest snapshot below `s2` that reads back: recovery's fallback, kept with `s2`.
    async fn previous_good_snapshot(
        &self,
        snapshots: &[u64],
        s2: u64,
    ) -> Result<Option<u64>, LogError> {
        for seq in snapshots.iter().rev().filter(|seq| **seq < s2) {
            match self.read_snapshot(*seq).await? {
                Some(Ok(_)) => return Ok(Some(*seq)),
                Some(Err(reason)) => warn!(seq, %reason, "unreadable snapshot skipped by log GC"),
                None => {}
            }
        }
        Ok(None)
    }

    /// Snapshot chunks below `s1`, and those between `s1` and `s2` whose manifest is not in
    /// `manifests` (listed before the chunks, so a manifest written after that listing names
    /// chunks listed here only if its snapshot is below `s2`: it is then skipped as unreadable
    /// and `s2` is read first anyway). Chunks above `s2` may be a snapshot in progress.
    async fn collectable_chunks(
        &self,
        s1: u64,
        s2: u64,
        manifests: &[u64],
    ) -> Result<Vec<Path>, LogError> {
        let metas = self
            .list_keys(&keys::meta_snapshot_chunk_prefix(), None)
            .await?;
        Ok(metas
            .into_iter()
            .filter(|meta| {
                keys::parse_snapshot_chunk(&meta.location).is_some_and(|(seq, _)| {
                    seq < s1 || (seq > s1 && seq < s2 && manifests.binary_search(&seq).is_err())
                })
            })
            .map(|meta| meta.location)
            .collect())
    }

    /// Log slots `≤ s1` that are not fence slots, and how many fence slots were kept. The
    /// listing covers what earlier GCs left (fence slots) plus about one snapshot interval.
    async fn collectable_slots(
        &self,
        s1: u64,
        fence: &FenceSlots,
    ) -> Result<(Vec<Path>, usize), LogError> {
        let mut doomed = Vec::new();
        let mut kept = 0;
        for seq in self.list_seqs(&keys::meta_log_prefix()).await? {
            if seq > s1 {
                break;
            }
            let is_fence = match fence.is_fence(seq) {
                Some(known) => known,
                None => self.legacy_slot_opens_epoch(seq).await?,
            };
            if is_fence {
                kept += 1;
            } else {
                doomed.push(keys::meta_log(seq));
            }
        }
        Ok((doomed, kept))
    }

    /// Whether a slot from before the fence list opens an epoch. An unreadable slot is kept:
    /// keeping junk costs one object, deleting a fence could cost an acknowledgement.
    async fn legacy_slot_opens_epoch(&self, seq: u64) -> Result<bool, LogError> {
        match self.read_record(seq).await {
            Ok(Some((_, record))) => Ok(opens_epoch(&record.entries)),
            Ok(None) => Ok(false),
            Err(err @ LogError::Store { .. }) => Err(err),
            Err(err) => {
                warn!(seq, error = %err, "keeping an unreadable slot below the snapshots");
                Ok(true)
            }
        }
    }

    /// Deletes `locations` with the store's bulk delete; an absent object counts as deleted.
    /// Every location is attempted: one failed key (a bulk delete reports errors per key) must
    /// not leave the rest, or a store failing a few percent of keys collects only the first few
    /// dozen slots per GC and the log grows without bound. The first failure is returned after.
    async fn delete_all(&self, locations: Vec<Path>) -> Result<usize, LogError> {
        let count = locations.len();
        if count == 0 {
            return Ok(0);
        }
        let first = locations[0].to_string();
        let stream = futures::stream::iter(locations.into_iter().map(Ok)).boxed();
        let failures: Vec<object_store::Error> = self
            .store
            .delete_stream(stream)
            .filter_map(|result| async move {
                match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => None,
                    Err(source) => Some(source),
                }
            })
            .collect()
            .await;
        match failures.into_iter().next() {
            Some(source) => Err(LogError::Store { key: first, source }),
            None => Ok(count),
        }
    }

    /// Whether a snapshot at or above `seq` exists: slots up to `seq` may have been collected
    /// (and created again by a deposed writer's late PUT).
    pub(crate) async fn snapshot_at_or_above(&self, seq: u64) -> Result<bool, LogError> {
        let snapshots = self.list_seqs(&keys::meta_snapshot_prefix()).await?;
        Ok(snapshots.last().is_some_and(|newest| *newest >= seq))
    }

    /// The stalled-recovery check (RFC 0003 §7), after recovery wrote its `NewEpoch` at `gap`
    /// and before it fills holes or serves. A writer that replayed up to `gap`, then stalled
    /// while the serving writer filled `gap`, snapshotted past it and collected it, has just
    /// re-created a collected slot and would serve a stale state. GC deletes a slot only once a
    /// snapshot at or above it exists, and never deletes the two newest snapshots, so such a
    /// snapshot is listed here: fail with [`LogError::EpochTaken`] and claim again.
    pub(super) async fn check_not_collected(&self, gap: u64, epoch: u64) -> Result<(), LogError> {
        if self.snapshot_at_or_above(gap).await? {
            warn!(
                gap,
                epoch,
                "the log passed our replay gap and was collected while we recovered; claiming again"
            );
            return Err(LogError::EpochTaken(epoch));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
