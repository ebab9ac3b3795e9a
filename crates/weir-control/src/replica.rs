//! A follower's replica of the durable metadata log (RFC 0002 §3).
//!
//! A replica is a [`State`] with every durable slot applied in slot order, and its position
//! (the next slot to apply). It takes records from the leader's stream ([`Replica::offer`]) or,
//! when it is behind, from the bucket ([`Replica::catch_up`]), by the rules replay uses: a slot is
//! applied only after every slot before it, and a record whose epoch is below one already applied
//! is dead (a deposed writer's, written after a takeover) and skipped. A replica is therefore
//! always the state after a prefix of the log that any later replay reads the same way (CTL-2):
//! it never shows what the log does not hold.
//!
//! The state sits behind a lock shared with the control plane's readers: a follower's readers
//! read its replica, and a follower that takes over starts from it (a clone, the new leader's
//! working state) instead of replaying the whole log.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use crate::entry::Entry;
use crate::log::{opens_epoch, FenceSlots, LogError, LogRecord, LogStore, Replayed};
use crate::state::State;

/// Slots one [`Replica::catch_up`] reads from the bucket at most.
pub const MAX_CATCH_UP_SLOTS: usize = 256;
/// What [`Replica::offer`] did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Applied: the replica is one slot further.
    Applied,
    /// Skipped as dead (an epoch below the log's); the replica is one slot further.
    Dead,
    /// Already applied (a stream resent it); nothing changed.
    Behind,
    /// A slot after the next one: nothing changed; the slots between must come first (from
    /// the stream or [`Replica::catch_up`]).
    Gap { next: u64 },
}

/// A state that follows the durable log.
#[derive(Debug, Clone)]
pub struct Replica {
    state: Arc<RwLock<State>>,
    next_seq: u64,
    /// The highest writer epoch among applied records.
    log_epoch: u64,
    /// The live `NewEpoch` slots (log GC's fence), as replay keeps them.
    fence: FenceSlots,
    /// Slots applied or skipped since the snapshot the replica started from (at most: the
    /// leader may have written snapshots since), so a new leader snapshots on time.
    slots_after_snapshot: u64,
}

impl Replica {
    /// The replica of what `replayed` found (a starting agent's replay).
    pub fn new(replayed: Replayed) -> Replica {
        Replica::resume(Arc::new(RwLock::new(State::default())), replayed)
    }

    /// The replica of what `replayed` found, in `shared` (whatever it held is replaced).
    pub fn resume(shared: Arc<RwLock<State>>, replayed: Replayed) -> Replica {
        let mut replica = Replica {
            state: shared,
            next_seq: 0,
            log_epoch: 0,
            fence: FenceSlots::default(),
            slots_after_snapshot: 0,
        };
        replica.restart(replayed);
        replica
    }

    /// A leader's readable state becoming a replica (a deposed leader follows): `shared` holds
    /// every slot before `next_seq` and none after.
    pub(crate) fn of_leader(
        shared: Arc<RwLock<State>>,
        next_seq: u64,
        log_epoch: u64,
        fence: FenceSlots,
        slots_after_snapshot: u64,
    ) -> Replica {
        Replica {
            state: shared,
            next_seq,
            log_epoch,
            fence,
            slots_after_snapshot,
        }
    }

    fn restart(&mut self, replayed: Replayed) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = replayed.state;
        self.next_seq = replayed.gap;
        self.log_epoch = replayed.log_epoch;
        self.fence = replayed.fence;
        self.slots_after_snapshot = replayed.replayed + replayed.dead;
    }

    /// The state after slots `..self.next_seq()`. Never hold it across an await.
    pub fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The next slot to apply: every slot before it is applied (or dead).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The highest writer epoch applied.
    pub fn log_epoch(&self) -> u64 {
        self.log_epoch
    }

    /// Takes durable record `seq`, written by `epoch`: applied only if it is the next slot.
    pub fn offer(&mut self, seq: u64, epoch: u64, entries: &[Entry]) -> Offered {
        if seq < self.next_seq {
            return Offered::Behind;
        }
        if seq > self.next_seq {
            return Offered::Gap {
                next: self.next_seq,
            };
        }
        self.next_seq += 1;
        self.slots_after_snapshot += 1;
        if epoch < self.log_epoch {
            return Offered::Dead;
        }
        self.log_epoch = epoch;
        if opens_epoch(entries) {
            self.fence.record(seq);
        }
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        for entry in entries {
            state.apply_durable(entry);
        }
        Offered::Applied
    }

    /// Applies the slots in `log` from the next one up to the first missing one, and returns
    /// how many it took. When `durable` (the leader's durable position, from a barrier or the
    /// stream) says a slot the bucket no longer has was written, log GC collected it (the
    /// replica was behind the two newest snapshots): the replica starts again from a fresh
    /// replay, which begins at a snapshot past it. Behind with no snapshot at or past its next
    /// slot, it reads on from where it is.
    ///
    /// Slots read from the bucket are applied only if no snapshot at or above the first of them
    /// exists. Log GC deletes slots only below a snapshot, and a deposed writer's late PUT may
    /// then create a collected slot again with a record that is not the log's (replay never
    /// reads it: it starts past the snapshot); a replica that far behind starts again from the
    /// replay instead.
    ///
    /// A replay begins at the newest snapshot, which may lie well past what it was asked to
    /// reach; it is followed by the slots after it (as many as one read takes), read before
    /// the replica changes. Readers (fetch plans) then never see the snapshot's state if the
    /// log is known to go further: a snapshot may be older than the deleter's grace, and a
    /// plan made from it may name files deleted since.
    ///
    /// One call reads at most [`MAX_CATCH_UP_SLOTS`] slots past the replica (or past the
    /// replay), and a replay it starts stops at what it was asked to reach: a live leader keeps
    /// adding slots, and a follower that read on to the first missing one could chase its tail
    /// for as long as the leader writes faster than one GET per slot (a follower's tick, its
    /// leader connection and its shutdown all wait on this).
    pub async fn catch_up(
        &mut self,
        log: &LogStore,
        durable: Option<u64>,
    ) -> Result<u64, LogError> {
        let start = self.next_seq;
        let read = read_slots(log, start).await?;
        let behind = durable.is_some_and(|durable| durable >= start + read.len() as u64);
        // A snapshot at or past the replica: what was read may not be the log's, or (behind)
        // the replica's next slot was collected, or a snapshot lets it skip ahead. Behind with
        // none, it reads on from here in the next call: a replay would begin at an older
        // snapshot (or at slot 0) and read again every slot the replica holds.
        let snapshot_ahead =
            (!read.is_empty() || behind) && log.snapshot_at_or_above(start).await?;
        if snapshot_ahead {
            // Up to the slot asked for, or to what was just read: never past either.
            let reach = (start + read.len() as u64).max(durable.map_or(0, |d| d + 1));
            let replayed = log.replay_until(Some(reach)).await?;
            if replayed.gap > self.next_seq {
                let gap = replayed.gap;
                let mut after = read_slots(log, gap).await?;
                if read_past_a_snapshot(log, gap, &after).await? {
                    // A snapshot was written past the replay meanwhile: the next call.
                    after.clear();
                }
                self.restart(replayed);
                self.apply_read(gap, after);
            }
        } else {
            self.apply_read(start, read);
        }
        Ok(self.next_seq.saturating_sub(start))
    }

    /// Offers slots read from the bucket, the first of them `from`.
    fn apply_read(&mut self, from: u64, read: Vec<(u64, LogRecord)>) {
        for (seq, (epoch, record)) in (from..).zip(read) {
            self.offer(seq, epoch, &record.entries);
        }
    }

    /// Whether the replica holds every slot written when this was called: its next slot is
    /// absent from the bucket, and no snapshot at or past it exists (log GC deletes slots only
    /// behind a snapshot, so an absent slot below one was collected, not never written).
    pub async fn holds_whole_log(&self, log: &LogStore) -> Result<bool, LogError> {
        if log.read_record(self.next_seq).await?.is_some() {
            return Ok(false);
        }
        Ok(!log.snapshot_at_or_above(self.next_seq).await?)
    }

    /// What a replay up to the replica's position would have found: where a follower that
    /// takes over starts (its working state is a copy).
    pub(crate) fn as_replayed(&self) -> Replayed {
        Replayed {
            state: self.state().clone(),
            snapshot_seq: None,
            replayed: self.slots_after_snapshot,
            dead: 0,
            gap: self.next_seq,
            log_epoch: self.log_epoch,
            fence: self.fence.clone(),
        }
    }
}

/// Slots `from..` in the bucket up to the first missing one, at most [`MAX_CATCH_UP_SLOTS`].
async fn read_slots(log: &LogStore, from: u64) -> Result<Vec<(u64, LogRecord)>, LogError> {
    let mut read = Vec::new();
    while read.len() < MAX_CATCH_UP_SLOTS {
        match log.read_record(from + read.len() as u64).await? {
            Some(record) => read.push(record),
            None => break,
        }
    }
    Ok(read)
}

/// Whether slots read from `from` on may not be the log's: a snapshot at or above `from`
/// exists, so log GC may have collected them and a deposed writer's late PUT created one again.
async fn read_past_a_snapshot(
    log: &LogStore,
    from: u64,
    read: &[(u64, LogRecord)],
) -> Result<bool, LogError> {
    Ok(!read.is_empty() && log.snapshot_at_or_above(from).await?)
}

#[cfg(test)]
mod tests;
