//! The file deleter (GC-1): a file whose batches were all released (retention, DeleteRecords,
//! DeleteTopic, a compaction that moved them, or a commit none of whose batches was appended) is
//! deleted from every bucket of its tier — not only the quorum that acknowledged it, since the quorum writer keeps copying to
//! the other buckets in the background — once
//! * its release is durable: the deleter reads only the durable state, so a release in a log
//!   slot that failed can never be acted on; and
//! * `grace` has passed on this process's monotonic clock since the deleter first saw it
//!   released: longer than any fetch plan that may still name it may live (the fetch reader
//!   refuses plans older than its TTL, and the configuration requires the grace to exceed it).
//!
//! When every bucket has answered (`NotFound` counts as deleted), the ids are recorded with one
//! `FilesDeleted` entry, which removes them from `State::released`. A crash before that entry
//! only repeats the deletes after recovery (idempotent), with the grace restarted. No entry ever
//! commits a released id again (apply refuses), so a deleted object is never needed again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use weir_common::periodic::{next_pass, pass_interval};
use weir_common::{FileId, Tier};
use weir_storage::keys;

use crate::entry::{Entry, EntryResult};
use crate::plane::ControlPlane;

/// Largest `FilesDeleted` entry: bounds one log record.
pub const MAX_FILES_PER_ENTRY: usize = 10_000;
/// Deletes in flight at once, over all buckets.
const DELETE_CONCURRENCY: usize = 16;

#[derive(Debug, Clone, Copy)]
pub struct DeleterSettings {
    /// Time from a durable release to the delete.
    pub grace: Duration,
    /// How often the deleter looks for eligible files.
    pub interval: Duration,
}

impl Default for DeleterSettings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(300),
            interval: Duration::from_secs(10),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleterPass {
    /// Released files waiting for their grace.
    pub waiting: usize,
    /// Files deleted from every bucket in this pass.
    pub deleted: usize,
    /// Files with at least one bucket that failed (retried next pass).
    pub failed: usize,
    /// Files recorded as deleted in the log.
    pub recorded: usize,
}

/// Deletes released files from every ingest bucket after a grace period.
#[derive(Debug)]
pub struct FileDeleter {
    control: ControlPlane,
    stores: Vec<Arc<dyn ObjectStore>>,
    /// The regional tier's buckets (compacted files); empty when compaction never ran here.
    regional: Vec<Arc<dyn ObjectStore>>,
    settings: DeleterSettings,
    /// When this process first saw each released file in the durable state.
    first_seen: BTreeMap<FileId, Instant>,
    /// Deleted from every bucket, not yet recorded by a durable `FilesDeleted`.
    unrecorded: BTreeSet<FileId>,
}

impl FileDeleter {
    pub fn new(
        control: ControlPlane,
        stores: Vec<Arc<dyn ObjectStore>>,
        settings: DeleterSettings,
    ) -> Self {
        Self {
            control,
            stores,
            regional: Vec::new(),
            settings,
            first_seen: BTreeMap::new(),
            unrecorded: BTreeSet::new(),
        }
    }

    /// Also deletes released compacted files from `regional` (the regional tier's buckets).
    pub fn with_regional(mut self, regional: Vec<Arc<dyn ObjectStore>>) -> Self {
        self.regional = regional;
        self
    }

    /// Runs a pass every `interval` until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut ticks = pass_interval(self.settings.interval);
        while next_pass(&mut ticks, &mut stop).await {
            let pass = self.pass().await;
            if pass.deleted > 0 || pass.failed > 0 {
                info!(
                    deleted = pass.deleted,
                    failed = pass.failed,
                    waiting = pass.waiting,
                    "deleted released files"
                );
            }
        }
    }

    /// One pass: notes newly released files, deletes those past their grace from every
    /// bucket, and records the deleted ones in the log.
    pub async fn pass(&mut self) -> DeleterPass {
        let now = Instant::now();
        let released: BTreeMap<FileId, Tier> = self.control.read(|state| {
            state
                .released
                .iter()
                .map(|(id, meta)| (*id, meta.tier))
                .collect()
        });
        self.first_seen.retain(|id, _| released.contains_key(id));
        self.unrecorded.retain(|id| released.contains_key(id));
        for id in released.keys() {
            self.first_seen.entry(*id).or_insert(now);
        }
        let eligible: Vec<FileId> = self
            .first_seen
            .iter()
            .filter(|(id, seen)| {
                now.duration_since(**seen) >= self.settings.grace && !self.unrecorded.contains(id)
            })
            .map(|(id, _)| *id)
            .take(MAX_FILES_PER_ENTRY)
            .collect();
        let mut pass = DeleterPass {
            waiting: self
                .first_seen
                .len()
                .saturating_sub(eligible.len() + self.unrecorded.len()),
            ..DeleterPass::default()
        };
        // The futures are built into a Vec first (not inside iterator adapters' closures) so
        // the pass stays `Send` for a spawned task.
        let mut deletes = Vec::with_capacity(eligible.len() * self.stores.len());
        let mut failed = BTreeSet::new();
        for id in &eligible {
            let tier = released[id];
            let key = keys::data_file(tier, id);
            if self.stores_of(tier).is_empty() {
                // No bucket of that tier is configured here: the object cannot be deleted, so
                // the file is not recorded as deleted either.
                warn!(%key, ?tier, "a released file's tier has no bucket configured; keeping it");
                failed.insert(*id);
                continue;
            }
            for store in self.stores_of(tier) {
                let (id, key, store) = (*id, key.clone(), store.clone());
                deletes.push(async move {
                    let outcome = match store.delete(&key).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(err) => Err(err),
                    };
                    (id, key, outcome)
                });
            }
        }
        let outcomes: Vec<_> = stream::iter(deletes)
            .buffer_unordered(DELETE_CONCURRENCY)
            .collect()
            .await;
        for (id, key, outcome) in outcomes {
            if let Err(err) = outcome {
                debug!(%key, %err, "delete of a released file failed; retrying next pass");
                failed.insert(id);
            }
        }
        for id in eligible {
            if !failed.contains(&id) {
                self.unrecorded.insert(id);
                pass.deleted += 1;
            }
        }
        pass.failed = failed.len();
        if !failed.is_empty() {
            warn!(
                files = failed.len(),
                "some released files could not be deleted from every bucket; retrying next pass"
            );
        }
        pass.recorded = self.record().await;
        pass
    }

    /// Every bucket of `tier` that may hold a file of it.
    fn stores_of(&self, tier: Tier) -> &[Arc<dyn ObjectStore>] {
        match tier {
            Tier::Ingest => &self.stores,
            Tier::Regional => &self.regional,
        }
    }

    /// Records the deleted files in the log; they stay unrecorded if the entry fails.
    async fn record(&mut self) -> usize {
        if self.unrecorded.is_empty() {
            return 0;
        }
        let files: Vec<FileId> = self
            .unrecorded
            .iter()
            .copied()
            .take(MAX_FILES_PER_ENTRY)
            .collect();
        match self
            .control
            .submit(Entry::FilesDeleted {
                files: files.clone(),
            })
            .await
        {
            Ok(EntryResult::FilesDeleted(_)) => {
                for id in &files {
                    self.unrecorded.remove(id);
                    self.first_seen.remove(id);
                }
                files.len()
            }
            Ok(other) => {
                warn!(?other, "unexpected result of FilesDeleted");
                0
            }
            Err(err) => {
                warn!(%err, "recording deleted files failed; retrying next pass");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests;
