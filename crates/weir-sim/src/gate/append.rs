//! The gate over a bucket's appendable view: requests an incarnation sends after its death never
//! return (those in flight still land, as for the object view), and the bucket's slowness
//! applies. Lost appends and appends whose answer is lost come from the model below.
//!
//! On the metadata bucket the gate copies every slot record that landed to the [`LogArchive`]:
//! after each flush, whatever its answer, it reads the slot from the double beneath the model
//! (the bucket's truth, no latency), so a record whose answer was lost is archived too.

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

use weir_storage::append::memory::MemoryAppendable;
use weir_storage::keys;

use super::{pass, BucketFaults};
use crate::archive::LogArchive;

/// One incarnation's appendable view of one bucket.
#[derive(Debug)]
pub(crate) struct GateAppendable {
    inner: Arc<dyn AppendableStore>,
    halted: Arc<AtomicBool>,
    faults: Arc<BucketFaults>,
    archive: Option<Archiving>,
}

/// Where landed slot records go, and the bucket's double to read them from.
#[derive(Debug, Clone)]
struct Archiving {
    archive: Arc<LogArchive>,
    double: MemoryAppendable,
}

impl Archiving {
    /// Copies the record of `path` (a log slot) to the archive if one landed.
    async fn copy(&self, path: &Path) {
        if keys::parse_meta_log(path).is_none() {
            return;
        }
        let Ok(meta) = self.double.stat(path).await else {
            return;
        };
        if meta.size == 0 {
            return;
        }
        if let Ok(bytes) = self.double.read(path, 0..meta.size).await {
            self.archive.landed(path, bytes, true);
        }
    }
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
            archive: None,
        }
    }

    /// Archives every log slot record that lands through this gate, read from `double`.
    pub(crate) fn with_archive(
        mut self,
        archive: Arc<LogArchive>,
        double: MemoryAppendable,
    ) -> GateAppendable {
        self.archive = Some(Archiving { archive, double });
        self
    }

    fn wrap(&self, inner: Box<dyn AppendWriter>) -> Box<dyn AppendWriter> {
        Box::new(GateWriter {
            inner,
            halted: self.halted.clone(),
            faults: self.faults.clone(),
            archive: self.archive.clone(),
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
    archive: Option<Archiving>,
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
        let result = self.inner.flush().await;
        if let Some(archiving) = &self.archive {
            archiving.copy(self.inner.path()).await;
        }
        result
    }

    async fn finalize(self: Box<Self>) -> Result<u64, StorageError> {
        pass(&self.halted, &self.faults).await;
        let path = self.inner.path().clone();
        let result = self.inner.finalize().await;
        if let Some(archiving) = &self.archive {
            archiving.copy(&path).await;
        }
        result
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        self.inner.close().await
    }
}
