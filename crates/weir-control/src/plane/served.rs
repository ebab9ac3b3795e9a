//! What this agent serves beyond the durable log: the pending files it acknowledged itself
//! (RFC 0006, "Serving acknowledged files").
//!
//! A file this agent acknowledged has a durable reservation and reached a quorum of buckets
//! within its ack deadline, so no resolver can abort it (it aborts only files missing from a
//! quorum, and an incarnation acknowledges in seal order, so nothing before it is missing
//! either): its confirmation is certain, only not yet durable. Readers on this agent may see
//! its batches as soon as the acknowledgement goes out, instead of a log slot later. The
//! knowledge is the agent's own and never enters the state machine: a restarted agent, or any
//! other one, serves the log's stable view until the confirmation is durable, which is never
//! more than this agent served (a consumer past it gets empty fetches, not an error).
//!
//! The readable bound of a partition is its stable high watermark moved past every pending
//! batch of an acknowledged file, up to the first pending batch of any other file (another
//! incarnation's, or one not acknowledged yet).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;
use weir_common::{FileId, TopicId};

use crate::state::{PartitionState, State};

/// The acknowledged pending files and their holders; entries leave once the confirmation's
/// slot is settled (durable or failed).
#[derive(Debug)]
pub(crate) struct Acknowledged {
    files: Mutex<HashMap<FileId, Vec<u8>>>,
    /// Bumped on every acknowledgement (a fetch waiting for data wakes on it).
    changed: watch::Sender<u64>,
    /// Bumped whenever files leave (their confirmations settled).
    settled: watch::Sender<u64>,
}

impl Default for Acknowledged {
    fn default() -> Self {
        Self {
            files: Mutex::default(),
            changed: watch::channel(0).0,
            settled: watch::channel(0).0,
        }
    }
}

impl Acknowledged {
    fn files(&self) -> std::sync::MutexGuard<'_, HashMap<FileId, Vec<u8>>> {
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn insert(&self, file_id: FileId, holders: Vec<u8>) {
        self.files().insert(file_id, holders);
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn remove(&self, file_id: &FileId) {
        self.files().remove(file_id);
        self.settled.send_modify(|n| *n += 1);
    }

    /// Waits until every file acknowledged now has left (its confirmation settled), or until
    /// `deadline`; `false` if the deadline came first.
    pub(crate) async fn settle(&self, deadline: tokio::time::Instant) -> bool {
        let waiting: Vec<FileId> = self.files().keys().copied().collect();
        let mut settled = self.settled.subscribe();
        loop {
            settled.borrow_and_update();
            {
                let files = self.files();
                if !waiting.iter().any(|file_id| files.contains_key(file_id)) {
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, settled.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.files().len()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Runs `reader` over the state with the acknowledged files (lock order: state, then files).
    pub(crate) fn with<R>(&self, state: &State, reader: impl FnOnce(Served<'_>) -> R) -> R {
        let files = self.files();
        reader(Served {
            state,
            acknowledged: &files,
        })
    }
}

/// The durable state as this agent serves it (see the module docs).
pub struct Served<'a> {
    state: &'a State,
    acknowledged: &'a HashMap<FileId, Vec<u8>>,
}

impl<'a> Served<'a> {
    pub fn state(&self) -> &'a State {
        self.state
    }

    /// Where readers on this agent stop: at or above the stable high watermark, never above
    /// the high watermark.
    pub fn high_watermark(
        &self,
        topic_id: &TopicId,
        index: i32,
        partition: &PartitionState,
    ) -> i64 {
        if self.acknowledged.is_empty() {
            return partition.stable_high_watermark;
        }
        let bound = self
            .state
            .first_unacknowledged(topic_id, index, |file_id| {
                self.acknowledged.contains_key(file_id)
            })
            .map_or(partition.high_watermark, |first| {
                first.min(partition.high_watermark)
            });
        bound.max(partition.stable_high_watermark)
    }

    /// The buckets holding `file_id` if this agent acknowledged it (its reservation names every
    /// bucket that may come to hold it).
    pub fn acknowledged_holders(&self, file_id: &FileId) -> Option<&'a [u8]> {
        self.acknowledged.get(file_id).map(Vec::as_slice)
    }
}

/// Wakes when a slot becomes durable or this agent acknowledges a file.
pub struct ServedChanges {
    durable: watch::Receiver<u64>,
    acknowledged: watch::Receiver<u64>,
}

impl ServedChanges {
    pub(crate) fn new(durable: watch::Receiver<u64>, acknowledged: watch::Receiver<u64>) -> Self {
        Self {
            durable,
            acknowledged,
        }
    }

    /// Marks the current state seen.
    pub fn mark_seen(&mut self) {
        self.durable.borrow_and_update();
        self.acknowledged.borrow_and_update();
    }

    /// Waits for a change after the last [`Self::mark_seen`]; `Err` once the writer is gone.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        tokio::select! {
            // Biased: the simulator replays a seed exactly only without tokio's random choice.
            biased;
            changed = self.durable.changed() => changed,
            changed = self.acknowledged.changed() => changed,
        }
    }
}
