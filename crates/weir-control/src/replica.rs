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
//! Not yet used by the agent: the cluster (issue 14) wires it to the leader's stream.

use crate::log::{LogError, LogRecord, LogStore, Replayed};
use crate::state::State;

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
    state: State,
    next_seq: u64,
    /// The highest writer epoch among applied records.
    log_epoch: u64,
}

impl Replica {
    /// The replica of what `replayed` found (a starting agent's replay).
    pub fn new(replayed: Replayed) -> Replica {
        Replica {
            state: replayed.state,
            next_seq: replayed.gap,
            log_epoch: replayed.log_epoch,
        }
    }

    /// The state after slots `..self.next_seq()`.
    pub fn state(&self) -> &State {
        &self.state
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
    pub fn offer(&mut self, seq: u64, epoch: u64, record: &LogRecord) -> Offered {
        if seq < self.next_seq {
            return Offered::Behind;
        }
        if seq > self.next_seq {
            return Offered::Gap {
                next: self.next_seq,
            };
        }
        self.next_seq += 1;
        if epoch < self.log_epoch {
            return Offered::Dead;
        }
        self.log_epoch = epoch;
        for entry in &record.entries {
            self.state.apply_durable(entry);
        }
        Offered::Applied
    }

    /// Applies the slots in `log` from the next one up to the first missing one, and returns
    /// how many it took. When `durable` (the leader's durable position, from a barrier or the
    /// stream) says a slot the bucket no longer has was written, log GC collected it (the
    /// replica was behind the two newest snapshots): the replica starts again from a fresh
    /// replay, which begins at a snapshot past it.
    pub async fn catch_up(
        &mut self,
        log: &LogStore,
        durable: Option<u64>,
    ) -> Result<u64, LogError> {
        let start = self.next_seq;
        while let Some((epoch, record)) = log.read_record(self.next_seq).await? {
            let seq = self.next_seq;
            self.offer(seq, epoch, &record);
        }
        if durable.is_some_and(|durable| durable >= self.next_seq) {
            let replayed = log.replay().await?;
            if replayed.gap > self.next_seq {
                *self = Replica::new(replayed);
            }
        }
        Ok(self.next_seq - start)
    }
}

#[cfg(test)]
mod tests;
