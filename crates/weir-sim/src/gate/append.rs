//! The gate over a bucket's appendable view: requests an incarnation sends after its death never
//! return (those in flight still land, as for the object view), and the bucket's slowness
//! applies. Lost appends and appends whose answer is lost come from the model below.
//! (The metadata bucket's double itself archives every slot record that lands: see the
//! driver's landing hook.)

use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use weir_storage::append::{
    AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use weir_storage::StorageError;

use super::{pass, BucketFaults};

/// One incarnation's appendable view of one bucket.
#[derive(Debug)]
pub(crate) struct GateAppendable {
    inner: Arc<dyn AppendableStore>,
    halted: Arc<AtomicBool>,
    faults: Arc<BucketFaults>,
}

impl GateAppendable {
    pub(crate) fn new(
        inner: Arc<dyn AppendableStore>,
        halted: Arc<AtomicBool>,
        faults: Arc<BucketFaults>,
    ) -> GateAppendable {
        GateAppendable {
            inner,
            halted,
            faults,
        }
    }

    fn wrap(&self, inner: Box<dyn AppendWriter>) -> Box<dyn AppendWriter> {
        Box::new(GateWriter {
            inner,
            halted: self.halted.clone(),
            faults: self.faults.clone(),
        })
    }
}

#[async_trait]
impl AppendableStore for GateAppendable {
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
        pass(&self.halted, &self.faults).await;
        Ok(self.wrap(self.inner.create(path).await?))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        pass(&self.halted, &self.faults).await;
        Ok(self.wrap(self.inner.takeover(path).await?))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        pass(&self.halted, &self.faults).await;
        self.inner.stat(path).await
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        pass(&self.halted, &self.faults).await;
        self.inner.read(path, range).await
    }
}

#[derive(Debug)]
struct GateWriter {
    inner: Box<dyn AppendWriter>,
    halted: Arc<AtomicBool>,
    faults: Arc<BucketFaults>,
}

#[async_trait]
impl AppendWriter for GateWriter {
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
        self.inner.append(offset, data).await
    }

    async fn flush(&mut self) -> Result<u64, StorageError> {
        pass(&self.halted, &self.faults).await;
        self.inner.flush().await
    }

    async fn finalize(self: Box<Self>) -> Result<u64, StorageError> {
        pass(&self.halted, &self.faults).await;
        self.inner.finalize().await
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        self.inner.close().await
    }
}
