//! Pool items for ingest files: one open, empty object per ingest bucket under one file key.
//!
//! The file's name (its [`FileId`], whose timestamp is the item's creation time) is chosen when
//! the item is made, not when the file seals: every bucket must hold the file under the same key,
//! so the objects are created under it ahead of time. An item is usable once a quorum of buckets
//! created their object; the others are `None` and count as failed copies when it is written
//! ([`crate::QuorumWriter::append_flush`]).
//!
//! Discarding an item (expired, or the pool shut down) closes its writers and deletes its empty
//! objects; a discard that fails leaves an empty unreferenced object for the orphan sweep.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::join_all;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_common::{Clock, FileId, Tier};

use super::{AppendWriter, AppendableStore};
use crate::pool::PoolLoader;
use crate::{keys, StorageError};

/// One ready ingest file: its id, key, and an open object per bucket (`None` where the create
/// failed).
#[derive(Debug)]
pub struct IngestItem {
    /// The file's id, fixed at creation.
    pub file_id: FileId,
    /// `keys::data_file(Tier::Ingest, file_id)`.
    pub key: Path,
    /// One per ingest bucket, in bucket order.
    pub writers: Vec<Option<Box<dyn AppendWriter>>>,
}

/// Makes [`IngestItem`]s across the ingest buckets.
#[derive(Debug)]
pub struct IngestLoader {
    appendable: Vec<Arc<dyn AppendableStore>>,
    objects: Vec<Arc<dyn ObjectStore>>,
    quorum: usize,
    clock: Arc<dyn Clock>,
    rng: Mutex<fastrand::Rng>,
}

impl IngestLoader {
    /// A loader over the buckets' appendable views and their object views (same order, used to
    /// delete discarded objects); an item needs `quorum` created objects.
    pub fn new(
        appendable: Vec<Arc<dyn AppendableStore>>,
        objects: Vec<Arc<dyn ObjectStore>>,
        quorum: usize,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Result<IngestLoader, StorageError> {
        if appendable.len() != objects.len() || quorum == 0 || quorum > appendable.len() {
            return Err(StorageError::InvalidConfig(format!(
                "ingest pool: {} appendable and {} object views for a quorum of {quorum}",
                appendable.len(),
                objects.len()
            )));
        }
        Ok(IngestLoader {
            appendable,
            objects,
            quorum,
            clock,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        })
    }

    fn next_id(&self) -> FileId {
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        FileId::new(self.clock.now_ms(), &mut rng)
    }

    /// Closes `writer` and deletes its object from bucket `index`.
    async fn remove(&self, index: usize, key: &Path, writer: Box<dyn AppendWriter>) {
        let _ = writer.close().await;
        match self.objects[index].delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::debug!(bucket = index, %key, error = %e, "deleting an unused pooled object failed; the orphan sweep will");
            }
        }
    }
}

#[async_trait]
impl PoolLoader for IngestLoader {
    type Item = IngestItem;

    async fn load(&self) -> Result<IngestItem, StorageError> {
        let file_id = self.next_id();
        let key = keys::data_file(Tier::Ingest, &file_id);
        let created = join_all(self.appendable.iter().map(|store| store.create(&key))).await;
        let mut writers = Vec::with_capacity(created.len());
        let mut last_error = None;
        for (index, result) in created.into_iter().enumerate() {
            match result {
                Ok(writer) => writers.push(Some(writer)),
                Err(e) => {
                    tracing::debug!(bucket = index, %key, error = %e, "creating a pooled object failed");
                    last_error = Some(e);
                    writers.push(None);
                }
            }
        }
        let made = writers.iter().flatten().count();
        if made >= self.quorum {
            return Ok(IngestItem {
                file_id,
                key,
                writers,
            });
        }
        let item = IngestItem {
            file_id,
            key,
            writers,
        };
        self.discard(item).await;
        Err(StorageError::QuorumFailed {
            needed: self.quorum,
            succeeded: made,
            last_error: Box::new(last_error.unwrap_or_else(|| {
                StorageError::InvalidConfig("no bucket reported an error".to_string())
            })),
        })
    }

    async fn discard(&self, item: IngestItem) {
        let IngestItem { key, writers, .. } = item;
        let removals = writers
            .into_iter()
            .enumerate()
            .filter_map(|(index, writer)| writer.map(|w| (index, w)))
            .map(|(index, writer)| self.remove(index, &key, writer));
        join_all(removals).await;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use weir_common::ManualClock;

    use super::*;
    use crate::append::memory::MemoryAppendable;
    use crate::model::{LatencyProfile, ModelStore};
    use crate::QuorumWriter;

    fn buckets(n: usize) -> Vec<MemoryAppendable> {
        (0..n).map(|_| MemoryAppendable::gcs_rapid()).collect()
    }

    fn loader(doubles: &[MemoryAppendable], quorum: usize) -> IngestLoader {
        IngestLoader::new(
            doubles.iter().map(|d| Arc::new(d.clone()) as _).collect(),
            doubles.iter().map(|d| Arc::new(d.clone()) as _).collect(),
            quorum,
            Arc::new(ManualClock::new(1_700_000_000_000)),
            1,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn test_ingest_item_is_one_object_per_bucket_under_one_key() {
        let doubles = buckets(3);
        let loader = loader(&doubles, 2);
        let item = loader.load().await.unwrap();
        assert_eq!(item.key, keys::data_file(Tier::Ingest, &item.file_id));
        for double in &doubles {
            assert_eq!(double.stat(&item.key).await.unwrap().size, 0);
        }
        let writer = QuorumWriter::new(
            doubles.iter().map(|d| Arc::new(d.clone()) as _).collect(),
            2,
        )
        .unwrap();
        let parts = [Bytes::from_static(b"head"), Bytes::from_static(b"-body")];
        let holders = writer
            .append_flush(&item.key, item.writers, &parts)
            .await
            .unwrap();
        assert_eq!(holders.len(), 2);
        for holder in holders {
            let got = writer.buckets()[holder].get(&item.key).await.unwrap();
            assert_eq!(&got.bytes().await.unwrap()[..], b"head-body");
        }
    }

    #[tokio::test]
    async fn test_ingest_item_survives_one_bucket_down_and_discard_deletes() {
        let doubles = buckets(3);
        let profile = LatencyProfile::local().with_error_rate(0.0);
        let down = ModelStore::new(Arc::new(doubles[1].clone()), profile, 1).unwrap();
        down.set_outage(true);
        let appendable: Vec<Arc<dyn AppendableStore>> = vec![
            Arc::new(doubles[0].clone()),
            down.appendable(Arc::new(doubles[1].clone())),
            Arc::new(doubles[2].clone()),
        ];
        let objects: Vec<Arc<dyn ObjectStore>> =
            doubles.iter().map(|d| Arc::new(d.clone()) as _).collect();
        let loader = IngestLoader::new(
            appendable,
            objects.clone(),
            2,
            Arc::new(ManualClock::new(0)),
            2,
        )
        .unwrap();
        let item = loader.load().await.unwrap();
        assert!(item.writers[1].is_none());
        let key = item.key.clone();
        loader.discard(item).await;
        for object in &objects {
            assert!(object.head(&key).await.is_err(), "discarded object deleted");
        }
        // With two of three down, no item can be made, and nothing is left behind.
        let loader = IngestLoader::new(
            vec![
                Arc::new(doubles[0].clone()),
                down.appendable(Arc::new(doubles[1].clone())),
                down.appendable(Arc::new(doubles[2].clone())),
            ],
            objects,
            2,
            Arc::new(ManualClock::new(0)),
            3,
        )
        .unwrap();
        let err = loader.load().await.unwrap_err();
        assert!(matches!(err, StorageError::QuorumFailed { .. }), "{err}");
        assert_eq!(doubles[0].appendable_count(), 0);
    }
}
