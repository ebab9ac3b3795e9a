//! Quorum writes across zonal buckets (DESIGN §4, DUR-1/DUR-2).
//!
//! [`QuorumWriter::put`] writes one object to all `n` buckets in parallel and returns as soon as
//! `k` of them acknowledged it, with the indices of those holders; the remaining writes keep
//! running in the background (they are spawned tasks, never cancelled), so the object usually
//! ends up in all `n` buckets. Reads go to any bucket that holds the object.
//!
//! Not yet: hedging slow buckets, and reporting background completions to the caller.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutOptions, PutPayload};

use crate::StorageError;

/// Writes objects to a quorum of buckets.
#[derive(Debug, Clone)]
pub struct QuorumWriter {
    buckets: Vec<Arc<dyn ObjectStore>>,
    quorum: usize,
}

impl QuorumWriter {
    /// A writer over `buckets` that needs `quorum` acknowledgements (1 ≤ quorum ≤ buckets).
    pub fn new(buckets: Vec<Arc<dyn ObjectStore>>, quorum: usize) -> Result<Self, StorageError> {
        if quorum == 0 || quorum > buckets.len() {
            return Err(StorageError::InvalidConfig(format!(
                "quorum {quorum} must be between 1 and the number of buckets ({})",
                buckets.len()
            )));
        }
        Ok(QuorumWriter { buckets, quorum })
    }

    /// The buckets, indexed as in holder lists.
    pub fn buckets(&self) -> &[Arc<dyn ObjectStore>] {
        &self.buckets
    }

    /// The number of acknowledgements a put needs.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Writes `payload` to `path` in every bucket (overwrite mode); see [`Self::put_opts`].
    pub async fn put(&self, path: &Path, payload: PutPayload) -> Result<Vec<usize>, StorageError> {
        self.put_opts(path, payload, PutOptions::default()).await
    }

    /// Writes `payload` to `path` in every bucket with `opts`. Returns the sorted indices of the
    /// buckets that acknowledged once `quorum` did; fails with [`StorageError::QuorumFailed`]
    /// as soon as so many buckets failed that a quorum is impossible. Writes still in flight
    /// continue in the background either way.
    pub async fn put_opts(
        &self,
        path: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<Vec<usize>, StorageError> {
        let mut pending: FuturesUnordered<_> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, bucket)| {
                let bucket = Arc::clone(bucket);
                let path = path.clone();
                let payload = payload.clone();
                let opts = opts.clone();
                let task = tokio::spawn(async move {
                    let result = bucket.put_opts(&path, payload, opts).await;
                    if let Err(e) = &result {
                        tracing::debug!(bucket = i, %path, error = %e, "quorum put to bucket failed");
                    }
                    result
                });
                async move { (i, task.await) }
            })
            .collect();

        let n = self.buckets.len();
        let mut succeeded = Vec::with_capacity(self.quorum);
        let mut failed = 0;
        while let Some((i, joined)) = pending.next().await {
            let error = match joined {
                Ok(Ok(_)) => {
                    succeeded.push(i);
                    if succeeded.len() == self.quorum {
                        // Dropping `pending` detaches the remaining tasks; they run to the end.
                        succeeded.sort_unstable();
                        return Ok(succeeded);
                    }
                    continue;
                }
                Ok(Err(e)) => StorageError::from(e),
                Err(join) => StorageError::from(object_store::Error::from(join)),
            };
            failed += 1;
            if n - failed < self.quorum {
                return Err(StorageError::QuorumFailed {
                    needed: self.quorum,
                    succeeded: succeeded.len(),
                    last_error: Box::new(error),
                });
            }
        }
        unreachable!("every bucket reports success or failure and one of both thresholds is hit")
    }

    /// Reads `range` of `path` from the first bucket in `holders` that returns it.
    pub async fn get_range(
        &self,
        holders: &[usize],
        path: &Path,
        range: Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let mut last_error = None;
        for &i in holders {
            let Some(bucket) = self.buckets.get(i) else {
                last_error = Some(StorageError::InvalidConfig(format!(
                    "holder index {i} out of range (have {} buckets)",
                    self.buckets.len()
                )));
                continue;
            };
            match bucket.get_range(path, range.clone()).await {
                Ok(bytes) => return Ok(bytes),
                Err(e) => {
                    tracing::debug!(bucket = i, %path, error = %e, "read from holder failed");
                    last_error = Some(e.into());
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| StorageError::InvalidConfig(format!("no holders given for {path}"))))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use object_store::memory::InMemory;

    use super::*;
    use crate::model::{LatencyProfile, ModelStore, OpLatency};

    fn fixed(put_ms: u64) -> LatencyProfile {
        let mut p = LatencyProfile::local();
        p.name = format!("fixed-{put_ms}");
        p.put = OpLatency::millis(put_ms, put_ms);
        p.get = OpLatency::millis(1, 1);
        p
    }

    fn model(profile: LatencyProfile, seed: u64) -> Arc<ModelStore> {
        Arc::new(ModelStore::new(Arc::new(InMemory::new()), profile, seed).unwrap())
    }

    fn as_dyn(stores: &[Arc<ModelStore>]) -> Vec<Arc<dyn ObjectStore>> {
        stores
            .iter()
            .map(|s| Arc::clone(s) as Arc<dyn ObjectStore>)
            .collect()
    }

    #[test]
    fn test_quorum_new_validates() {
        let b: Vec<Arc<dyn ObjectStore>> = vec![Arc::new(InMemory::new())];
        assert!(QuorumWriter::new(b.clone(), 0).is_err());
        assert!(QuorumWriter::new(b.clone(), 2).is_err());
        assert!(QuorumWriter::new(b, 1).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_succeeds_with_one_failing_bucket_of_three() {
        let stores: Vec<_> = (0..3)
            .map(|i| model(LatencyProfile::named("s3-express").unwrap(), i))
            .collect();
        stores[1].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let key = crate::keys::ingest_file("f1", 0);
        let holders = qw
            .put(&key, PutPayload::from_static(b"payload"))
            .await
            .unwrap();
        assert_eq!(holders, vec![0, 2]);
        let got = qw.get_range(&[1, 0, 2], &key, 0..3).await.unwrap();
        assert_eq!(&got[..], b"pay");
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_returns_early_and_finishes_in_background() {
        let stores = vec![
            model(fixed(5), 0),
            model(fixed(10), 1),
            model(fixed(500), 2),
        ];
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let key = Path::from("k");
        let start = tokio::time::Instant::now();
        let holders = qw.put(&key, PutPayload::from_static(b"v")).await.unwrap();
        assert_eq!(holders, vec![0, 1]);
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        assert!(
            stores[2].head(&key).await.is_err(),
            "slow bucket not done yet"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(stores[2].head(&key).await.is_ok(), "slow write completed");
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_failure_when_quorum_impossible() {
        let stores = vec![
            model(fixed(5), 0),
            model(fixed(5), 1),
            model(fixed(1000), 2),
        ];
        stores[0].set_outage(true);
        stores[1].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let start = tokio::time::Instant::now();
        let err = qw
            .put(&Path::from("k"), PutPayload::from_static(b"v"))
            .await
            .unwrap_err();
        // fails as soon as two of three failed, without waiting for the slow third
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        match &err {
            StorageError::QuorumFailed {
                needed, succeeded, ..
            } => assert_eq!((*needed, *succeeded), (2, 0)),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.is_retryable());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_get_range_errors() {
        let stores = vec![model(fixed(1), 0)];
        let qw = QuorumWriter::new(as_dyn(&stores), 1).unwrap();
        let key = Path::from("missing");
        assert!(matches!(
            qw.get_range(&[], &key, 0..1).await,
            Err(StorageError::InvalidConfig(_))
        ));
        assert!(matches!(
            qw.get_range(&[5], &key, 0..1).await,
            Err(StorageError::InvalidConfig(_))
        ));
        let err = qw.get_range(&[0], &key, 0..1).await.unwrap_err();
        assert!(matches!(
            err,
            StorageError::ObjectStore(object_store::Error::NotFound { .. })
        ));
    }
}
