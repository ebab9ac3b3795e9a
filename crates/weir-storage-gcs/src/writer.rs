//! [`RapidWriter`]: Weir's [`AppendWriter`] over the client's `AppendableObjectWriter`.
//!
//! Appends stay in this writer until [`AppendWriter::flush`]: the client's `close` flushes
//! whatever it holds, while Weir's `close` must drop unflushed bytes, so the client only ever
//! holds bytes that are being flushed right now. (The client coalesces appends into 2 MiB
//! messages anyway, so holding them here costs no round trip.)

use async_trait::async_trait;
use bytes::Bytes;
use google_cloud_storage::appendable_object_writer::AppendableObjectWriter;
use object_store::path::Path;
use weir_storage::append::{broken, AppendLimits, AppendWriter, Pending};
use weir_storage::StorageError;

use crate::error::{self, Op};

/// The writer of one appendable object (see the module docs).
#[derive(Debug)]
pub(crate) struct RapidWriter {
    /// `None` once broken (the client writer was dropped) or consumed.
    inner: Option<AppendableObjectWriter>,
    path: Path,
    generation: u64,
    persisted: u64,
    pending: Pending,
    flushes: u64,
    limits: AppendLimits,
}

impl RapidWriter {
    /// Wraps `inner`, whose object holds `persisted` bytes; this writer holds `generation`.
    pub(crate) fn new(
        inner: AppendableObjectWriter,
        path: &Path,
        generation: u64,
        persisted: u64,
        limits: AppendLimits,
    ) -> RapidWriter {
        RapidWriter {
            inner: Some(inner),
            path: path.clone(),
            generation,
            persisted,
            pending: Pending::default(),
            flushes: 0,
            limits,
        }
    }

    /// The client writer, or the broken-writer error.
    fn inner(&mut self) -> Result<&mut AppendableObjectWriter, StorageError> {
        self.inner.as_mut().ok_or_else(|| broken(&self.path))
    }

    /// Breaks the writer on `err`: the bytes of the failed call may or may not have landed.
    fn fail(&mut self, err: StorageError) -> StorageError {
        self.inner = None;
        self.pending.clear();
        err
    }

    /// Refuses a flush carrying bytes once the object took its last append.
    fn check_append_count(&self) -> Result<(), StorageError> {
        self.pending
            .check_append_count(&self.path, &self.limits, self.flushes)
    }

    /// Hands every pending chunk to the client writer (they stay counted until the flush answers,
    /// which `check_size` compares against).
    async fn send_pending(&mut self) -> Result<(), StorageError> {
        let chunks = self.pending.chunks().to_vec();
        let inner = self.inner.as_mut().ok_or_else(|| broken(&self.path))?;
        for chunk in chunks {
            if let Err(err) = inner.append(chunk).await {
                return Err(error::map(&self.path, Op::Write, err));
            }
        }
        Ok(())
    }

    /// Checks the size the service reports after a flush or finalize against what this writer
    /// sent: anything else means another writer changed the object under us.
    fn check_size(&self, reported: i64) -> Result<u64, StorageError> {
        let expected = self.persisted + self.pending.len();
        if reported < 0 || reported as u64 != expected {
            return Err(StorageError::Fenced {
                path: self.path.to_string(),
                reason: format!("the service persisted {reported} bytes, this writer {expected}"),
            });
        }
        Ok(expected)
    }

    async fn flush_inner(&mut self) -> Result<u64, StorageError> {
        self.send_pending().await?;
        let reported = match self.inner()?.flush().await {
            Ok(size) => size,
            Err(err) => return Err(error::map(&self.path, Op::Write, err)),
        };
        self.check_size(reported)
    }

    async fn finalize_inner(&mut self) -> Result<u64, StorageError> {
        self.send_pending().await?;
        let inner = self.inner.take().ok_or_else(|| broken(&self.path))?;
        let object = match inner.finalize().await {
            Ok(object) => object,
            Err(err) => return Err(error::map(&self.path, Op::Write, err)),
        };
        self.check_size(object.size)
    }
}

#[async_trait]
impl AppendWriter for RapidWriter {
    fn path(&self) -> &Path {
        &self.path
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn persisted(&self) -> u64 {
        self.persisted
    }

    fn offset(&self) -> u64 {
        self.persisted + self.pending.len()
    }

    fn flushes(&self) -> u64 {
        self.flushes
    }

    async fn append(&mut self, offset: u64, data: Bytes) -> Result<(), StorageError> {
        self.inner()?;
        self.pending
            .push(&self.path, &self.limits, self.persisted, offset, data)
    }

    /// Flushes through the client even with nothing pending, so a replaced writer learns it
    /// here as it does from the in-memory double.
    async fn flush(&mut self) -> Result<u64, StorageError> {
        self.inner()?;
        self.check_append_count()?;
        let carried = !self.pending.is_empty();
        match self.flush_inner().await {
            Ok(size) => {
                self.persisted = size;
                self.pending.clear();
                self.flushes += u64::from(carried);
                Ok(size)
            }
            Err(err) => Err(self.fail(err)),
        }
    }

    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        self.inner()?;
        self.check_append_count()?;
        match self.finalize_inner().await {
            Ok(size) => Ok(size),
            Err(err) => Err(self.fail(err)),
        }
    }

    /// Drops the unflushed bytes, then closes the client writer, which flushes nothing (it holds
    /// no bytes between flushes) and ends the stream. A broken writer has nothing left to close.
    async fn close(mut self: Box<Self>) -> Result<(), StorageError> {
        let Some(inner) = self.inner.take() else {
            return Ok(());
        };
        match inner.close().await {
            Ok(_) => Ok(()),
            Err(err) => Err(error::map(&self.path, Op::Write, err)),
        }
    }
}
