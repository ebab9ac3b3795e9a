//! The in-memory appendable bucket: the double of GCS Rapid and S3 Express append.
//!
//! [`MemoryAppendable`] is both an [`AppendableStore`] and an [`ObjectStore`], so one bucket
//! serves appends and the ordinary reads, lists and deletes of everything above it. Appendable
//! objects keep their bytes here; the inner store holds an empty placeholder under the same key,
//! which gives them a creation time, makes create-only puts of the key fail, and keeps them in
//! listings (with the persisted size patched in). A plain put over an appendable key replaces
//! it, as on the real backends.
//!
//! Semantics follow the trait docs exactly: a takeover under [`FenceKind::Generation`] bumps the
//! generation and fences the old writer at once; under [`FenceKind::WriteOffset`] the old writer
//! is fenced only when the object's size no longer matches its offset. Latency and injected
//! faults (a lost append, an append that lands but whose answer is lost) come from the model
//! wrapper ([`crate::model::ModelStore::appendable`]), not from here.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions,
};

use super::{
    broken, wrong_offset, AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind,
};
use crate::StorageError;

/// One appendable object's bytes and state.
#[derive(Debug, Default)]
struct Object {
    data: Vec<u8>,
    generation: u64,
    finalized: bool,
    flushes: u64,
}

#[derive(Debug)]
struct Shared {
    objects: Mutex<HashMap<Path, Object>>,
    fence: FenceKind,
    limits: AppendLimits,
}

impl Shared {
    fn objects(&self) -> MutexGuard<'_, HashMap<Path, Object>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The persisted size of `path` if it is an appendable object.
    fn size_of(&self, path: &Path) -> Option<u64> {
        self.objects().get(path).map(|o| o.data.len() as u64)
    }

    fn patch(&self, mut meta: ObjectMeta) -> ObjectMeta {
        if let Some(size) = self.size_of(&meta.location) {
            meta.size = size;
        }
        meta
    }
}

/// An in-memory bucket with appendable objects (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryAppendable {
    inner: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
}

impl MemoryAppendable {
    /// An empty bucket fencing by `fence`, with `limits`.
    pub fn new(fence: FenceKind, limits: AppendLimits) -> MemoryAppendable {
        MemoryAppendable::over(Arc::new(InMemory::new()), fence, limits)
    }

    /// A bucket keeping placeholders and plain objects in `inner`.
    pub fn over(
        inner: Arc<dyn ObjectStore>,
        fence: FenceKind,
        limits: AppendLimits,
    ) -> MemoryAppendable {
        MemoryAppendable {
            inner,
            shared: Arc::new(Shared {
                objects: Mutex::default(),
                fence,
                limits,
            }),
        }
    }

    /// A double of GCS Rapid (generation fence, Rapid limits).
    pub fn gcs_rapid() -> MemoryAppendable {
        MemoryAppendable::new(FenceKind::Generation, AppendLimits::GCS_RAPID)
    }

    /// A double of S3 Express One Zone append (write-offset fence, S3 Express limits).
    pub fn s3_express() -> MemoryAppendable {
        MemoryAppendable::new(FenceKind::WriteOffset, AppendLimits::S3_EXPRESS)
    }

    /// How many appendable objects exist (finalized or not).
    pub fn appendable_count(&self) -> usize {
        self.shared.objects().len()
    }
}

impl fmt::Display for MemoryAppendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryAppendable({:?})", self.shared.fence)
    }
}

fn not_found(path: &Path) -> StorageError {
    StorageError::ObjectStore(object_store::Error::NotFound {
        path: path.to_string(),
        source: "no appendable object at this key".into(),
    })
}

fn finalized(path: &Path) -> StorageError {
    StorageError::Fenced {
        path: path.to_string(),
        reason: "the object is finalized".to_string(),
    }
}

#[async_trait]
impl AppendableStore for MemoryAppendable {
    fn fence(&self) -> FenceKind {
        self.shared.fence
    }

    fn limits(&self) -> AppendLimits {
        self.shared.limits
    }

    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        self.inner
            .put_opts(path, PutPayload::default(), opts)
            .await?;
        self.shared
            .objects()
            .insert(path.clone(), Object::default());
        Ok(Box::new(MemoryWriter::new(self.shared.clone(), path, 0, 0)))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let mut objects = self.shared.objects();
        let object = objects.get_mut(path).ok_or_else(|| not_found(path))?;
        if object.finalized {
            return Err(finalized(path));
        }
        if self.shared.fence == FenceKind::Generation {
            object.generation += 1;
        }
        let (generation, size) = (object.generation, object.data.len() as u64);
        drop(objects);
        Ok(Box::new(MemoryWriter::new(
            self.shared.clone(),
            path,
            generation,
            size,
        )))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        let objects = self.shared.objects();
        let object = objects.get(path).ok_or_else(|| not_found(path))?;
        Ok(AppendableMeta {
            size: object.data.len() as u64,
            finalized: object.finalized,
            generation: object.generation,
        })
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        let objects = self.shared.objects();
        let object = objects.get(path).ok_or_else(|| not_found(path))?;
        let len = object.data.len() as u64;
        if range.start > range.end || range.end > len {
            return Err(StorageError::InvalidConfig(format!(
                "read of {range:?} past the persisted size {len} of {path}"
            )));
        }
        Ok(Bytes::copy_from_slice(
            &object.data[range.start as usize..range.end as usize],
        ))
    }
}

/// A writer of one object in a [`MemoryAppendable`].
#[derive(Debug)]
struct MemoryWriter {
    shared: Arc<Shared>,
    path: Path,
    generation: u64,
    persisted: u64,
    pending: Vec<Bytes>,
    pending_len: u64,
    flushes: u64,
    broken: bool,
}

impl MemoryWriter {
    fn new(shared: Arc<Shared>, path: &Path, generation: u64, persisted: u64) -> MemoryWriter {
        MemoryWriter {
            shared,
            path: path.clone(),
            generation,
            persisted,
            pending: Vec::new(),
            pending_len: 0,
            flushes: 0,
            broken: false,
        }
    }

    /// Checks that this writer still owns the object, as the backend would on a request.
    fn check_owner(&self, object: &Object) -> Result<(), StorageError> {
        if object.finalized {
            return Err(finalized(&self.path));
        }
        let fenced = match self.shared.fence {
            FenceKind::Generation => object.generation != self.generation,
            FenceKind::WriteOffset => object.data.len() as u64 != self.persisted,
        };
        if fenced {
            return Err(StorageError::Fenced {
                path: self.path.to_string(),
                reason: format!(
                    "taken over: object at generation {} size {}, writer at generation {} offset {}",
                    object.generation,
                    object.data.len(),
                    self.generation,
                    self.persisted
                ),
            });
        }
        Ok(())
    }

    fn flush_locked(&mut self, finalize: bool) -> Result<u64, StorageError> {
        if self.broken {
            return Err(broken(&self.path));
        }
        let limits = self.shared.limits;
        if self.pending_len > 0 && self.flushes >= limits.max_appends {
            return Err(StorageError::ObjectFull {
                path: self.path.to_string(),
                reason: format!("{} appends made, the limit", self.flushes),
            });
        }
        let mut objects = self.shared.objects();
        let Some(object) = objects.get_mut(&self.path) else {
            self.broken = true;
            return Err(not_found(&self.path));
        };
        if let Err(err) = self.check_owner(object) {
            self.broken = true;
            return Err(err);
        }
        for chunk in self.pending.drain(..) {
            object.data.extend_from_slice(&chunk);
        }
        if self.pending_len > 0 {
            object.flushes += 1;
            self.flushes += 1;
        }
        object.finalized = finalize;
        self.persisted = object.data.len() as u64;
        self.pending_len = 0;
        Ok(self.persisted)
    }
}

#[async_trait]
impl AppendWriter for MemoryWriter {
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
        self.persisted + self.pending_len
    }

    fn flushes(&self) -> u64 {
        self.flushes
    }

    async fn append(&mut self, offset: u64, data: Bytes) -> Result<(), StorageError> {
        if self.broken {
            return Err(broken(&self.path));
        }
        if offset != self.offset() {
            return Err(wrong_offset(&self.path, self.offset(), offset));
        }
        let max = self.shared.limits.max_bytes;
        if self.offset() + data.len() as u64 > max {
            return Err(StorageError::ObjectFull {
                path: self.path.to_string(),
                reason: format!(
                    "{} bytes would pass the {max}-byte limit",
                    offset + data.len() as u64
                ),
            });
        }
        self.pending_len += data.len() as u64;
        self.pending.push(data);
        Ok(())
    }

    async fn flush(&mut self) -> Result<u64, StorageError> {
        self.flush_locked(false)
    }

    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        self.flush_locked(true)
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        Ok(())
    }
}

fn range_error(err: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "MemoryAppendable",
        source: Box::new(err),
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for MemoryAppendable {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let result = self.inner.put_opts(location, payload, opts).await?;
        self.shared.objects().remove(location);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // The placeholder gives the metadata (and the preconditions' e-tag); the size and bytes
        // are the appendable object's persisted ones.
        let placeholder = self
            .inner
            .get_opts(
                location,
                GetOptions {
                    head: true,
                    ..GetOptions::default()
                },
            )
            .await;
        let data = {
            let objects = self.shared.objects();
            objects
                .get(location)
                .map(|o| Bytes::copy_from_slice(&o.data))
        };
        let Some(data) = data else {
            return self.inner.get_opts(location, options).await;
        };
        let mut meta = placeholder?.meta;
        meta.size = data.len() as u64;
        options.check_preconditions(&meta)?;
        let range = match &options.range {
            Some(range) => range.as_range(meta.size).map_err(range_error)?,
            None => 0..meta.size,
        };
        let body = data.slice(range.start as usize..range.end as usize);
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(body) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            out.push(self.get_range(location, range.clone()).await?);
        }
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let shared = self.shared.clone();
        let forgotten = locations
            .map(move |location| {
                if let Ok(path) = &location {
                    shared.objects().remove(path);
                }
                location
            })
            .boxed();
        self.inner.delete_stream(forgotten)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let shared = self.shared.clone();
        self.inner
            .list(prefix)
            .map(move |meta| meta.map(|m| shared.patch(m)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let shared = self.shared.clone();
        self.inner
            .list_with_offset(prefix, offset)
            .map(move |meta| meta.map(|m| shared.patch(m)))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let mut result = self.inner.list_with_delimiter(prefix).await?;
        result.objects = result
            .objects
            .into_iter()
            .map(|m| self.shared.patch(m))
            .collect();
        Ok(result)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        refuse_appendable(&self.shared, from)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        refuse_appendable(&self.shared, from)?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// Copies and renames of appendable objects are not something Weir does; refuse them rather
/// than copy a placeholder.
fn refuse_appendable(shared: &Shared, path: &Path) -> object_store::Result<()> {
    if shared.size_of(path).is_some() {
        return Err(object_store::Error::NotSupported {
            source: format!("copy or rename of the appendable object {path}").into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::append::conformance;

    #[tokio::test]
    async fn test_memory_appendable_conformance_generation_fence() {
        let store = MemoryAppendable::gcs_rapid();
        conformance::run(&store, Some(Arc::new(store.clone()))).await;
    }

    #[tokio::test]
    async fn test_memory_appendable_conformance_write_offset_fence() {
        let store = MemoryAppendable::s3_express();
        conformance::run(&store, Some(Arc::new(store.clone()))).await;
    }

    #[tokio::test]
    async fn test_memory_appendable_append_count_limit() {
        let limits = AppendLimits {
            max_bytes: 1 << 20,
            max_appends: 2,
            max_age: std::time::Duration::from_secs(60),
        };
        let store = MemoryAppendable::new(FenceKind::Generation, limits);
        let path = Path::from("limit");
        let mut writer = store.create(&path).await.unwrap();
        for i in 0..2u64 {
            writer.append(i, Bytes::from_static(b"x")).await.unwrap();
            writer.flush().await.unwrap();
        }
        writer.append(2, Bytes::from_static(b"y")).await.unwrap();
        let err = writer.flush().await.unwrap_err();
        assert!(matches!(err, StorageError::ObjectFull { .. }), "{err}");
        let err = writer.append(3, Bytes::from(vec![0; 1 << 20])).await;
        assert!(matches!(err, Err(StorageError::ObjectFull { .. })));
    }
}
