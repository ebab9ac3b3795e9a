//! The latency and fault model over an [`AppendableStore`]: the same profile, RNG and outage
//! switch as the bucket's [`ModelStore`], so a modelled zonal bucket is slow or down for appends
//! exactly when it is for everything else.
//!
//! Costs ([`super::AppendCosts`]): `create` on create, `takeover` on takeover, `append_flush`
//! plus the bandwidth term on every flush that carries bytes, `finalize` on finalize; stat and
//! read cost a GET. Appends themselves are local (buffered until the flush).
//!
//! An injected error on a flush is, with equal odds, a *lost append* (the request never reached
//! the bucket) or an append that *landed but whose answer was lost* (the bytes are persisted, the
//! writer sees an error). Either way the writer is broken, as the trait requires; only a
//! takeover tells the owner which one happened.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;

use super::{Model, ModelStore, Op};
use crate::append::{
    broken, AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use crate::StorageError;

/// An [`AppendableStore`] under a [`ModelStore`]'s profile.
struct ModelAppendable {
    inner: Arc<dyn AppendableStore>,
    model: Arc<Model>,
}

impl fmt::Debug for ModelAppendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ModelAppendable({}, {:?})",
            self.model.profile.name, self.inner
        )
    }
}

impl ModelStore {
    /// `inner` (the same bucket's appendable view) under this store's profile, RNG and outage.
    pub fn appendable(&self, inner: Arc<dyn AppendableStore>) -> Arc<dyn AppendableStore> {
        Arc::new(ModelAppendable {
            inner,
            model: Arc::clone(&self.model),
        })
    }
}

#[async_trait]
impl AppendableStore for ModelAppendable {
    fn fence(&self) -> FenceKind {
        self.inner.fence()
    }

    fn limits(&self) -> AppendLimits {
        self.inner.limits()
    }

    /// The profile decides: a create must cost more than twice an append and flush (p50).
    fn creates_ahead_pay_off(&self) -> bool {
        match &self.model.profile.append {
            Some(costs) => costs.create.p50 > costs.append_flush.p50 * 2,
            None => self.inner.creates_ahead_pay_off(),
        }
    }

    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        self.model.gate(Op::AppendCreate, 0).await?;
        let inner = self.inner.create(path).await?;
        Ok(Box::new(ModelWriter {
            inner,
            model: Arc::clone(&self.model),
            broken: false,
        }))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        self.model.gate(Op::Takeover, 0).await?;
        let inner = self.inner.takeover(path).await?;
        Ok(Box::new(ModelWriter {
            inner,
            model: Arc::clone(&self.model),
            broken: false,
        }))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        self.model.gate(Op::Get, 0).await?;
        self.inner.stat(path).await
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.model
            .gate(Op::Get, range.end.saturating_sub(range.start))
            .await?;
        self.inner.read(path, range).await
    }
}

/// A writer whose flushes pay the modelled latency and may fail in either way.
#[derive(Debug)]
struct ModelWriter {
    inner: Box<dyn AppendWriter>,
    model: Arc<Model>,
    broken: bool,
}

impl ModelWriter {
    /// One modelled flush: sleep, then deliver it, lose it, or deliver it and lose the answer.
    async fn modelled_flush(&mut self) -> Result<u64, StorageError> {
        if self.broken {
            return Err(broken(self.inner.path()));
        }
        let pending = self.inner.offset() - self.inner.persisted();
        if pending == 0 {
            return self.inner.flush().await;
        }
        let (delay, fail) = self.model.plan(Op::Append, pending);
        self.model.clock.sleep(delay).await;
        let Err(err) = self.model.check(fail) else {
            return self.inner.flush().await;
        };
        self.broken = true;
        let landed = fail && self.model.coin();
        if landed {
            // The bucket persisted it; only the answer is lost.
            let _ = self.inner.flush().await;
        }
        Err(err.into())
    }
}

#[async_trait]
impl AppendWriter for ModelWriter {
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
        self.modelled_flush().await
    }

    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        self.modelled_flush().await?;
        self.model.gate(Op::AppendFinalize, 0).await?;
        self.inner.finalize().await
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
    use crate::LatencyProfile;

    fn modelled(
        profile: &str,
        double: &MemoryAppendable,
    ) -> (ModelStore, Arc<dyn AppendableStore>) {
        let profile = LatencyProfile::named(profile).unwrap();
        let store = ModelStore::new(Arc::new(double.clone()), profile, 7).unwrap();
        let appendable = store.appendable(Arc::new(double.clone()));
        (store, appendable)
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_appendable_passes_conformance() {
        for (name, double) in [
            ("gcs-rapid", MemoryAppendable::gcs_rapid()),
            ("s3-express", MemoryAppendable::s3_express()),
        ] {
            let (store, appendable) = modelled(name, &double);
            conformance::run(appendable.as_ref(), Some(Arc::new(store))).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_appendable_charges_create_and_append_apart() {
        let double = MemoryAppendable::gcs_rapid();
        let (_store, appendable) = modelled("gcs-rapid", &double);
        let path = Path::from("costs");
        let start = tokio::time::Instant::now();
        let mut writer = appendable.create(&path).await.unwrap();
        let created = start.elapsed();
        writer.append(0, Bytes::from_static(b"x")).await.unwrap();
        let before_flush = tokio::time::Instant::now();
        writer.flush().await.unwrap();
        let flushed = before_flush.elapsed();
        // gcs-rapid: create ~45 ms, append+flush ~2 ms (p99s 90 and 5 ms, capped at 10 × p99).
        assert!(created >= Duration::from_millis(10), "create {created:?}");
        assert!(flushed <= Duration::from_millis(50), "flush {flushed:?}");
        assert!(flushed < created, "flush {flushed:?} vs create {created:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn test_model_appendable_injected_errors_lose_or_land_and_break_the_writer() {
        let double = MemoryAppendable::gcs_rapid();
        let profile = LatencyProfile::named("gcs-rapid")
            .unwrap()
            .with_error_rate(1.0);
        let store = ModelStore::new(Arc::new(double.clone()), profile, 3).unwrap();
        let healthy = ModelStore::new(
            Arc::new(double.clone()),
            LatencyProfile::named("gcs-rapid").unwrap(),
            3,
        )
        .unwrap()
        .appendable(Arc::new(double.clone()));
        let failing = store.appendable(Arc::new(double.clone()));
        let (mut lost, mut landed) = (0, 0);
        for i in 0..40 {
            let path = Path::from(format!("fault/{i}"));
            let created = healthy.create(&path).await.unwrap();
            created.close().await.unwrap();
            assert!(failing.takeover(&path).await.is_err(), "error rate 1");
            let mut writer = healthy.takeover(&path).await.unwrap();
            writer.append(0, Bytes::from_static(b"data")).await.unwrap();
            // Move the writer under the failing model: same bucket, same generation.
            let mut faulty = ModelWriter {
                inner: writer,
                model: Arc::clone(&store.model),
                broken: false,
            };
            let err = faulty.flush().await.unwrap_err();
            assert!(err.is_retryable(), "{err}");
            assert!(
                faulty.flush().await.is_err(),
                "a failed flush breaks the writer"
            );
            match double.stat(&path).await.unwrap().size {
                0 => lost += 1,
                4 => landed += 1,
                other => panic!("partial append of {other} bytes"),
            }
        }
        assert!(lost > 5 && landed > 5, "lost {lost}, landed {landed}");
    }
}
