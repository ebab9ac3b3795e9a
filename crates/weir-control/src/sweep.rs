//! The orphan sweep (GC-1): objects no log entry names — uploads whose commit never came or
//! was rejected, files of crashed agents, copies that landed after the deleter removed a file —
//! are deleted once they are older than a horizon that the log itself fences.
//!
//! A pass (every `interval`):
//! 1. submits `SweepHorizon { now − orphan_age }` and waits until it is durable. From then on,
//!    apply rejects every `CommitFile` whose file id time is before the horizon (`FileTooOld`,
//!    retriable for clients: they produce again into a new file);
//! 2. reads the durable state, which includes the horizon;
//! 3. lists `ingest/` in every ingest bucket (and `compacted/` in the regional bucket) and
//!    deletes each data file whose id time is before the horizon and that is neither live
//!    (`files`) nor released (the deleter's).
//!
//! No clock is trusted for safety: the horizon and the file ids are compared by apply, in the
//! log. An object deleted here has an id before a durable horizon and is unreferenced in a state
//! that includes it, and no later entry can reference it. A wrong clock only makes produces
//! retry or garbage live longer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::sync::watch;
use tracing::{info, warn};
use weir_common::periodic::{millis, next_pass, pass_interval};
use weir_common::{Clock, FileId};
use weir_storage::keys;

use crate::entry::{Entry, EntryResult};
use crate::plane::ControlPlane;

#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// Objects younger than this are never swept; must exceed the longest upload (attempts ×
    /// request timeout) so a sweep rarely fails a produce that is merely slow.
    pub orphan_age: Duration,
    pub interval: Duration,
}

impl Default for SweepSettings {
    fn default() -> Self {
        Self {
            orphan_age: Duration::from_secs(3600),
            interval: Duration::from_secs(900),
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPass {
    pub horizon_ms: i64,
    /// Data files listed (all buckets).
    pub listed: usize,
    /// Orphans deleted.
    pub deleted: usize,
    /// Deletes or listings that failed (retried next pass).
    pub failed: usize,
}

#[derive(Debug)]
pub struct OrphanSweeper {
    control: ControlPlane,
    stores: Vec<Arc<dyn ObjectStore>>,
    /// The regional tier's buckets: compaction outputs that never committed.
    regional: Vec<Arc<dyn ObjectStore>>,
    clock: Arc<dyn Clock>,
    settings: SweepSettings,
}

impl OrphanSweeper {
    pub fn new(
        control: ControlPlane,
        stores: Vec<Arc<dyn ObjectStore>>,
        clock: Arc<dyn Clock>,
        settings: SweepSettings,
    ) -> Self {
        Self {
            control,
            stores,
            regional: Vec::new(),
            clock,
            settings,
        }
    }

    /// Also sweeps `compacted/` in `regional` (outputs of compaction jobs that never committed:
    /// the horizon fences `ReplaceFiles` outputs as it fences commits).
    pub fn with_regional(mut self, regional: Vec<Arc<dyn ObjectStore>>) -> Self {
        self.regional = regional;
        self
    }

    /// Sweeps every `interval` until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut ticks = pass_interval(self.settings.interval);
        // The first tick is immediate; an agent that just started sweeps one interval later.
        ticks.tick().await;
        while next_pass(&mut ticks, &mut stop).await {
            match self.pass().await {
                Ok(pass) if pass.deleted > 0 || pass.failed > 0 => info!(
                    deleted = pass.deleted,
                    failed = pass.failed,
                    listed = pass.listed,
                    horizon_ms = pass.horizon_ms,
                    "swept orphaned data files"
                ),
                Ok(_) => {}
                Err(error) => warn!(%error, "orphan sweep failed; it runs again next interval"),
            }
        }
    }

    /// One sweep: fence, read, list, delete.
    pub async fn pass(&self) -> Result<SweepPass, String> {
        let age = millis(self.settings.orphan_age);
        let wanted = self.clock.now_ms().saturating_sub(age);
        let horizon_ms = match self
            .control
            .submit(Entry::SweepHorizon { horizon_ms: wanted })
            .await
        {
            Ok(EntryResult::SweepHorizon(horizon)) => horizon,
            Ok(other) => return Err(format!("unexpected result {other:?}")),
            Err(error) => return Err(error.to_string()),
        };
        let mut pass = SweepPass {
            horizon_ms,
            ..SweepPass::default()
        };
        let tiers = self
            .stores
            .iter()
            .map(|store| (store, keys::ingest_prefix()))
            .chain(
                self.regional
                    .iter()
                    .map(|store| (store, keys::compacted_prefix())),
            );
        for (store, prefix) in tiers {
            let listed: Vec<Path> = match store
                .list(Some(&prefix))
                .map_ok(|meta| meta.location)
                .try_collect()
                .await
            {
                Ok(listed) => listed,
                Err(error) => {
                    warn!(%error, "orphan sweep could not list a bucket");
                    pass.failed += 1;
                    continue;
                }
            };
            let candidates: Vec<(FileId, Path)> = listed
                .into_iter()
                .filter_map(|path| {
                    let (_tier, id) = keys::parse_data_file(&path)?;
                    Some((id, path))
                })
                .filter(|(id, _)| id.unix_ms() < horizon_ms)
                .collect();
            pass.listed += candidates.len();
            // Read after the horizon is durable: every commit of these ids is in this state.
            let orphans: BTreeSet<Path> = self.control.read(|state| {
                candidates
                    .into_iter()
                    .filter(|(id, _)| !state.knows_file(id))
                    .map(|(_, path)| path)
                    .collect()
            });
            let locations = futures::stream::iter(orphans.into_iter().map(Ok)).boxed();
            let results: Vec<_> = store.delete_stream(locations).collect().await;
            for result in results {
                match result {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => pass.deleted += 1,
                    Err(error) => {
                        warn!(%error, "orphan sweep could not delete an object");
                        pass.failed += 1;
                    }
                }
            }
        }
        Ok(pass)
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};
    use weir_common::ManualClock;

    use super::*;
    use crate::entry::BatchOutcome;
    use crate::test_support::{one_batch_commit, plane_with_topic};
    use crate::ControlError;

    const HOUR: i64 = 3_600_000;

    fn id(unix_ms: i64, n: u128) -> FileId {
        FileId((u128::from(unix_ms as u64) << 80) | n)
    }

    fn commit(topic: weir_common::TopicId, file_id: FileId) -> Entry {
        one_batch_commit(format!("a-{file_id}"), None, topic, file_id, vec![0], 1)
    }

    #[tokio::test]
    async fn test_sweep_deletes_only_unreferenced_objects_older_than_a_durable_horizon() {
        let now = 100 * HOUR;
        let clock = Arc::new(ManualClock::new(now));
        let (control, topic) = plane_with_topic(1).await;
        // Offset 0 (file `released`) leaves the log; offset 1 (file `live`) stays.
        let released = id(now - 3 * HOUR, 1);
        let live = id(now - 3 * HOUR, 2);
        let orphan = id(now - 2 * HOUR, 3);
        let young = id(now - 10, 4);
        control.submit(commit(topic, released)).await.unwrap();
        control.submit(commit(topic, live)).await.unwrap();
        control
            .submit(Entry::AdvanceLogStart {
                topic_id: topic,
                partitions: vec![crate::entry::LogStartMove {
                    partition: 0,
                    offset: 1,
                }],
                cause: crate::entry::LogStartCause::Retention,
            })
            .await
            .unwrap();
        assert!(control.read(|s| s.released.contains_key(&released) && s.files.contains_key(&live)));
        let buckets: Vec<Arc<InMemory>> = (0..2).map(|_| Arc::new(InMemory::new())).collect();
        let key = |id: FileId| keys::data_file(keys::Tier::Ingest, &id);
        for bucket in &buckets {
            for file in [live, released, orphan, young] {
                bucket.put(&key(file), PutPayload::from("x")).await.unwrap();
            }
            bucket
                .put(&Path::from("ingest/not-a-data-file"), PutPayload::from("x"))
                .await
                .unwrap();
        }
        // The regional bucket: an output that never committed (older than the horizon) and
        // one still young.
        let regional = Arc::new(InMemory::new());
        let compacted = |id: FileId| keys::data_file(keys::Tier::Regional, &id);
        let lost_output = id(now - 2 * HOUR, 5);
        for file in [lost_output, young] {
            regional
                .put(&compacted(file), PutPayload::from("x"))
                .await
                .unwrap();
        }
        let sweeper = OrphanSweeper::new(
            control.clone(),
            buckets
                .iter()
                .map(|b| b.clone() as Arc<dyn ObjectStore>)
                .collect(),
            clock,
            SweepSettings {
                orphan_age: Duration::from_millis(HOUR as u64),
                interval: Duration::from_secs(1),
            },
        )
        .with_regional(vec![regional.clone()]);
        let pass = sweeper.pass().await.unwrap();
        assert_eq!(pass.horizon_ms, now - HOUR);
        assert_eq!((pass.deleted, pass.failed), (3, 0), "{pass:?}");
        assert!(
            regional.head(&compacted(lost_output)).await.is_err(),
            "lost output swept"
        );
        assert!(regional.head(&compacted(young)).await.is_ok());
        for bucket in &buckets {
            assert!(bucket.head(&key(orphan)).await.is_err(), "orphan swept");
            for kept in [live, released, young] {
                assert!(bucket.head(&key(kept)).await.is_ok(), "{kept} kept");
            }
            assert!(bucket
                .head(&Path::from("ingest/not-a-data-file"))
                .await
                .is_ok());
        }
        // The fence: the swept id can never commit now (a slow upload finishing late).
        let late = control.submit(commit(topic, orphan)).await.unwrap();
        assert_eq!(
            late,
            EntryResult::CommitFile(vec![BatchOutcome::Rejected(ControlError::FileTooOld {
                horizon_ms: now - HOUR
            })])
        );
    }
}
