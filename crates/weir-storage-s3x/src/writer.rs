//! The writer of one S3 Express object: appends held in memory, one write-offset `PutObject`
//! per flush.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::primitives::ByteStream;
use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use weir_storage::append::{broken, AppendWriter, Pending};
use weir_storage::StorageError;

use crate::error::{map_error, Request};
use crate::{finalized_error, Shared};

/// A writer (see the crate docs). It owns no connection or session of its own, so a dropped
/// writer leaves nothing behind.
#[derive(Debug)]
pub(crate) struct S3ExpressWriter {
    shared: Arc<Shared>,
    path: Path,
    persisted: u64,
    pending: Pending,
    flushes: u64,
    broken: bool,
}

impl S3ExpressWriter {
    pub(crate) fn new(shared: &Arc<Shared>, path: &Path, persisted: u64) -> S3ExpressWriter {
        S3ExpressWriter {
            shared: shared.clone(),
            path: path.clone(),
            persisted,
            pending: Pending::default(),
            flushes: 0,
            broken: false,
        }
    }

    /// Checks what can be checked without a request; a failure here sends nothing and leaves
    /// the writer as it was, like the trait's double.
    fn check_flush(&self) -> Result<(), StorageError> {
        if self.broken {
            return Err(broken(&self.path));
        }
        self.pending
            .check_append_count(&self.path, &self.shared.limits(), self.flushes)
    }

    /// Sends what is held (if anything), breaking the writer on any failure.
    async fn flush_held(&mut self) -> Result<u64, StorageError> {
        self.check_flush()?;
        if self.shared.finalized().contains(&self.path) {
            self.broken = true;
            return Err(finalized_error(&self.path));
        }
        if self.pending.is_empty() {
            return Ok(self.persisted);
        }
        let result = self.append_held().await;
        if result.is_err() {
            self.broken = true;
        }
        result
    }

    /// One `PutObject` at the persisted size with every held byte.
    async fn append_held(&mut self) -> Result<u64, StorageError> {
        let end = self.persisted + self.pending.len();
        let put = self
            .shared
            .client()
            .put_object()
            .bucket(self.shared.bucket())
            .key(self.shared.key(&self.path))
            // Past i64::MAX (never: appends stop at max_bytes) S3 would refuse the offset.
            .write_offset_bytes(i64::try_from(self.persisted).unwrap_or(i64::MAX))
            .body(ByteStream::from(self.held()))
            .send()
            .await
            .map_err(|e| map_error(Request::Append, &self.path, e))?;
        // S3 reports the object's size after an append; anything but our end means the write
        // offset did not work as the crate assumes.
        if let Some(size) = put.size().filter(|&size| size != end as i64) {
            return Err(StorageError::Fenced {
                path: self.path.to_string(),
                reason: format!("S3 reports {size} bytes after an append that ends at {end}"),
            });
        }
        self.persisted = end;
        self.flushes += 1;
        self.pending.clear();
        Ok(end)
    }

    /// The held bytes as one body (without a copy when there is one chunk).
    fn held(&self) -> Bytes {
        if let [one] = self.pending.chunks() {
            return one.clone();
        }
        let mut body = BytesMut::with_capacity(self.pending.len() as usize);
        for chunk in self.pending.chunks() {
            body.extend_from_slice(chunk);
        }
        body.freeze()
    }

    /// With nothing held, a finalize must still learn that no other writer appended since this
    /// one last did (an append would have found out).
    async fn check_still_at_offset(&mut self) -> Result<(), StorageError> {
        let size = self.shared.size(&self.path).await;
        match size {
            Ok(size) if size == self.persisted => Ok(()),
            Ok(size) => {
                self.broken = true;
                Err(StorageError::Fenced {
                    path: self.path.to_string(),
                    reason: format!(
                        "the object has {size} bytes, the writer is at {}: another writer appended",
                        self.persisted
                    ),
                })
            }
            Err(err) => {
                self.broken = true;
                Err(err)
            }
        }
    }
}

#[async_trait]
impl AppendWriter for S3ExpressWriter {
    fn path(&self) -> &Path {
        &self.path
    }

    /// S3 has no generations; see the crate docs.
    fn generation(&self) -> u64 {
        0
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
        if self.broken {
            return Err(broken(&self.path));
        }
        self.pending.push(
            &self.path,
            &self.shared.limits(),
            self.persisted,
            offset,
            data,
        )
    }

    async fn flush(&mut self) -> Result<u64, StorageError> {
        self.flush_held().await
    }

    /// Flushes and records the key as finalized in this process (S3 Express cannot seal an
    /// object; see the crate docs).
    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        let held = !self.pending.is_empty();
        let size = self.flush_held().await?;
        if !held {
            self.check_still_at_offset().await?;
        }
        self.shared.finalized().insert(&self.path);
        Ok(size)
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        Ok(())
    }
}
