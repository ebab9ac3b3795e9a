//! The storage layer over an [`AppendableStore`]: deadlines and request counters.
//!
//! No retries here: a timed-out create or flush may have taken effect, and only the owner knows
//! what to do about it (the pool drops the item's copy in that bucket; the log takes its segment
//! over). A flush that misses its deadline breaks the writer, as a failed flush does.
//!
//! Counting: create, each flush that carries bytes, and finalize are PUT-class requests (S3
//! Express bills each append as a PUT; GCS Rapid writes are Class A operations); takeover and
//! stat are HEADs; reads are GETs.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;

use super::{outcome_of, timed_out, LayerPolicy, LayerStore};
use crate::append::{
    broken, AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use crate::stats::{BucketStats, Outcome, RequestClass};
use crate::StorageError;

/// How a failed appendable request is counted.
fn outcome(err: &StorageError) -> Outcome {
    match err {
        StorageError::ObjectStore(e) => outcome_of(e),
        StorageError::Fenced { .. } => Outcome::Conflict,
        _ => Outcome::Error,
    }
}

#[derive(Clone)]
struct Meter {
    policy: LayerPolicy,
    stats: Arc<BucketStats>,
}

impl Meter {
    /// Runs one request of `class` moving `bytes` under its deadline and counts it.
    async fn run<T>(
        &self,
        class: RequestClass,
        operation: &'static str,
        bytes: u64,
        request: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let deadline = self
            .policy
            .attempt_deadline(bytes)
            .min(self.policy.request_timeout);
        let result = match tokio::time::timeout(deadline, request).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(operation, deadline).into()),
        };
        match &result {
            Ok(_) => self.stats.record(class, Outcome::Ok),
            Err(e) => self.stats.record(class, outcome(e)),
        }
        result
    }
}

/// An [`AppendableStore`] with the layer's deadlines and counters.
struct LayerAppendable {
    inner: Arc<dyn AppendableStore>,
    meter: Meter,
}

impl fmt::Debug for LayerAppendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayerAppendable({:?})", self.inner)
    }
}

impl LayerStore {
    /// The same bucket's appendable view `inner` with this layer's policy and counters.
    pub fn appendable(&self, inner: Arc<dyn AppendableStore>) -> Arc<dyn AppendableStore> {
        Arc::new(LayerAppendable {
            inner,
            meter: Meter {
                policy: self.policy,
                stats: Arc::clone(&self.stats),
            },
        })
    }
}

impl LayerAppendable {
    fn wrap(&self, inner: Box<dyn AppendWriter>) -> Box<dyn AppendWriter> {
        Box::new(LayerWriter {
            inner,
            meter: self.meter.clone(),
            broken: false,
        })
    }
}

#[async_trait]
impl AppendableStore for LayerAppendable {
    fn fence(&self) -> FenceKind {
        self.inner.fence()
    }

    fn limits(&self) -> AppendLimits {
        self.inner.limits()
    }

    fn creates_ahead_pay_off(&self) -> bool {
        self.inner.creates_ahead_pay_off()
    }

    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let writer = self
            .meter
            .run(RequestClass::Put, "create", 0, self.inner.create(path))
            .await?;
        Ok(self.wrap(writer))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let writer = self
            .meter
            .run(RequestClass::Head, "takeover", 0, self.inner.takeover(path))
            .await?;
        Ok(self.wrap(writer))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        self.meter
            .run(RequestClass::Head, "stat", 0, self.inner.stat(path))
            .await
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        let len = range.end.saturating_sub(range.start);
        let bytes = self
            .meter
            .run(RequestClass::Get, "read", len, self.inner.read(path, range))
            .await?;
        self.meter.stats.add_bytes_down(bytes.len() as u64);
        Ok(bytes)
    }
}

#[derive(Debug)]
struct LayerWriter {
    inner: Box<dyn AppendWriter>,
    meter: Meter,
    broken: bool,
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("policy", &self.policy)
            .finish()
    }
}

impl LayerWriter {
    async fn metered_flush(&mut self) -> Result<u64, StorageError> {
        if self.broken {
            return Err(broken(self.inner.path()));
        }
        let pending = self.inner.offset() - self.inner.persisted();
        if pending == 0 {
            return self.inner.flush().await;
        }
        let result = self
            .meter
            .run(RequestClass::Put, "append", pending, self.inner.flush())
            .await;
        match &result {
            Ok(_) => self.meter.stats.add_bytes_up(pending),
            Err(_) => self.broken = true,
        }
        result
    }
}

#[async_trait]
impl AppendWriter for LayerWriter {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }

    fn persisted(&self) -> u64 {
        self.inner.persisted()
    }

    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    fn flushes(&self) -> u64 {
        self.inner.flushes()
    }

    async fn append(&mut self, offset: u64, data: Bytes) -> Result<(), StorageError> {
        if self.broken {
            return Err(broken(self.inner.path()));
        }
        self.inner.append(offset, data).await
    }

    async fn flush(&mut self) -> Result<u64, StorageError> {
        self.metered_flush().await
    }

    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        self.metered_flush().await?;
        let meter = self.meter.clone();
        meter
            .run(RequestClass::Put, "finalize", 0, self.inner.finalize())
            .await
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::append::{conformance, memory::MemoryAppendable};
    use crate::model::{AppendCosts, LatencyProfile, ModelStore, OpLatency};
    use crate::stats::PriceTable;

    fn layered(double: &MemoryAppendable, policy: LayerPolicy) -> (LayerStore, Arc<BucketStats>) {
        let stats = Arc::new(BucketStats::new(
            "memory://double",
            "gcs-rapid",
            PriceTable::named("gcs-rapid").unwrap(),
        ));
        let store = LayerStore::new(Arc::new(double.clone()), policy, Arc::clone(&stats));
        (store, stats)
    }

    #[tokio::test]
    async fn test_layer_appendable_passes_conformance_and_counts_requests() {
        let double = MemoryAppendable::gcs_rapid();
        let (store, stats) = layered(&double, LayerPolicy::default());
        let appendable = store.appendable(Arc::new(double.clone()));
        conformance::run(appendable.as_ref(), Some(Arc::new(store))).await;
        let puts = stats.snapshot().requests_of(RequestClass::Put);
        assert!(puts >= 10, "creates and appends counted as PUTs: {puts}");
    }

    #[tokio::test(start_paused = true)]
    async fn test_layer_appendable_flush_past_its_deadline_breaks_the_writer() {
        let double = MemoryAppendable::gcs_rapid();
        let stuck = OpLatency {
            p50: Duration::from_secs(60),
            p99: Duration::from_secs(60),
        };
        let mut profile = LatencyProfile::local();
        profile.name = "slow-appends".to_string();
        profile.append = Some(AppendCosts {
            append_flush: stuck,
            ..AppendCosts::default()
        });
        let slow = ModelStore::new(Arc::new(double.clone()), profile, 1).unwrap();
        let policy = LayerPolicy::default().with_request_timeout(Duration::from_secs(5));
        let (store, stats) = layered(&double, policy);
        let appendable = store.appendable(slow.appendable(Arc::new(double.clone())));
        let path = Path::from("deadline");
        let mut writer = appendable.create(&path).await.unwrap();
        writer.append(0, Bytes::from_static(b"late")).await.unwrap();
        let err = writer.flush().await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(
            writer.append(4, Bytes::from_static(b"x")).await.is_err(),
            "broken"
        );
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.requests(RequestClass::Put, Outcome::Timeout), 1);
        assert_eq!(
            snapshot.requests(RequestClass::Put, Outcome::Ok),
            1,
            "the create"
        );
        assert_eq!(double.stat(&path).await.unwrap().size, 0, "nothing landed");
    }
}
