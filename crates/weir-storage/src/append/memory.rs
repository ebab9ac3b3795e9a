//! The appendable double: GCS Rapid and S3 Express append semantics over any object store.
//!
//! [`MemoryAppendable`] is both an [`AppendableStore`] and an [`ObjectStore`], so one bucket
//! serves appends and the ordinary reads, lists and deletes of everything above it. It runs in
//! one of two modes:
//!
//! - **In memory** ([`MemoryAppendable::new`], `memory://` buckets): appendable objects keep
//!   their bytes here; the inner store holds an empty placeholder under the same key, which
//!   gives them a creation time, makes create-only puts of the key fail, and keeps them in
//!   listings (with the persisted size patched in).
//! - **Write-through** ([`MemoryAppendable::write_through`], `file://` buckets under a zonal
//!   profile): every flush rewrites the whole object in the inner store before it returns, so a
//!   flushed byte is as durable as a PUT there and survives a restart (kill -9 tests of the
//!   appendable path). Only each open object's size and generation stay here, and an object's
//!   entry is dropped when its writer closes; a takeover after a restart starts from the inner
//!   store's copy. Rewriting costs O(object size) per flush, which is fine for ingest files
//!   (one flush each) and is not a model of real append costs (the latency model is).
//!
//! A plain put over an appendable key replaces it, as on the real backends. Semantics follow
//! the trait docs exactly: a takeover under [`FenceKind::Generation`] bumps the generation and
//! fences the old writer at once; under [`FenceKind::WriteOffset`] the old writer is fenced only
//! when the object's size no longer matches its offset. Latency and injected faults (a lost
//! append, an append that lands but whose answer is lost) come from the model wrapper
//! ([`crate::model::ModelStore::appendable`]), not from here.

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
    broken, AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind, Pending,
};
use crate::StorageError;

/// One appendable object's state. `data` holds the bytes in memory mode only.
#[derive(Debug, Default)]
struct Object {
    data: Vec<u8>,
    size: u64,
    generation: u64,
    finalized: bool,
    /// Counts writers handed out (create and every takeover), whatever the fence kind: a
    /// writer's close forgets the object only if no later writer exists.
    handles: u64,
}

type Entry = Arc<tokio::sync::Mutex<Object>>;

#[derive(Debug)]
struct Shared {
    inner: Arc<dyn ObjectStore>,
    objects: Mutex<HashMap<Path, Entry>>,
    /// Sizes of the open objects, for listings (memory mode).
    sizes: Mutex<HashMap<Path, u64>>,
    fence: FenceKind,
    limits: AppendLimits,
    write_through: bool,
    /// Told every object's whole bytes each time a flush lands (the simulator's log archive).
    landed: Mutex<Option<Hook>>,
}

/// See [`MemoryAppendable::set_landing_hook`].
pub type LandingHook = Arc<dyn Fn(&Path, Bytes) + Send + Sync>;

#[derive(Clone)]
struct Hook(LandingHook);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LandingHook")
    }
}

impl Shared {
    fn objects(&self) -> MutexGuard<'_, HashMap<Path, Entry>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sizes(&self) -> MutexGuard<'_, HashMap<Path, u64>> {
        self.sizes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn landed_hook(&self) -> Option<LandingHook> {
        let hook = self.landed.lock().unwrap_or_else(|e| e.into_inner());
        hook.as_ref().map(|h| h.0.clone())
    }

    fn forget(&self, path: &Path) {
        self.objects().remove(path);
        self.sizes().remove(path);
    }

    /// The entry of `path`; in write-through mode an object this process does not know (made
    /// before a restart) is loaded from the inner store.
    async fn entry(&self, path: &Path) -> Result<Entry, StorageError> {
        if let Some(entry) = self.objects().get(path) {
            return Ok(entry.clone());
        }
        if !self.write_through {
            return Err(not_found(path));
        }
        let meta = self.inner.head(path).await?;
        let loaded = Arc::new(tokio::sync::Mutex::new(Object {
            size: meta.size,
            ..Object::default()
        }));
        Ok(self.objects().entry(path.clone()).or_insert(loaded).clone())
    }

    /// The persisted bytes of `object` at `path`.
    async fn bytes_of(&self, path: &Path, object: &Object) -> Result<Bytes, StorageError> {
        if !self.write_through {
            return Ok(Bytes::copy_from_slice(&object.data));
        }
        if object.size == 0 {
            return Ok(Bytes::new());
        }
        Ok(self.inner.get(path).await?.bytes().await?)
    }

    fn patch(&self, mut meta: ObjectMeta) -> ObjectMeta {
        if let Some(size) = self.sizes().get(&meta.location) {
            meta.size = *size;
        }
        meta
    }
}

/// A bucket with appendable objects (see the module docs).
#[derive(Debug, Clone)]
pub struct MemoryAppendable {
    shared: Arc<Shared>,
}

impl MemoryAppendable {
    /// An empty in-memory bucket fencing by `fence`, with `limits`.
    pub fn new(fence: FenceKind, limits: AppendLimits) -> MemoryAppendable {
        MemoryAppendable::over(Arc::new(InMemory::new()), fence, limits, false)
    }

    /// A bucket over `inner`. With `write_through`, every flush rewrites the whole object in
    /// `inner` (a durable store survives restarts); without, bytes stay in memory.
    pub fn over(
        inner: Arc<dyn ObjectStore>,
        fence: FenceKind,
        limits: AppendLimits,
        write_through: bool,
    ) -> MemoryAppendable {
        MemoryAppendable {
            shared: Arc::new(Shared {
                inner,
                objects: Mutex::default(),
                sizes: Mutex::default(),
                fence,
                limits,
                write_through,
                landed: Mutex::default(),
            }),
        }
    }

    /// Calls `hook` with an object's key and all its bytes every time a flush into it lands,
    /// inside the flush (which completes even if its caller stops waiting), so an observer sees
    /// every append that landed, including those whose answer was lost above.
    pub fn set_landing_hook(&self, hook: LandingHook) {
        *self.shared.landed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Hook(hook));
    }

    /// A write-through bucket over `inner` (see [`Self::over`]).
    pub fn write_through(
        inner: Arc<dyn ObjectStore>,
        fence: FenceKind,
        limits: AppendLimits,
    ) -> MemoryAppendable {
        MemoryAppendable::over(inner, fence, limits, true)
    }

    /// A double of GCS Rapid (generation fence, Rapid limits).
    pub fn gcs_rapid() -> MemoryAppendable {
        MemoryAppendable::new(FenceKind::Generation, AppendLimits::GCS_RAPID)
    }

    /// A double of S3 Express One Zone append (write-offset fence, S3 Express limits).
    pub fn s3_express() -> MemoryAppendable {
        MemoryAppendable::new(FenceKind::WriteOffset, AppendLimits::S3_EXPRESS)
    }

    /// How many appendable objects this process tracks (open, or finalized in memory mode).
    pub fn appendable_count(&self) -> usize {
        self.shared.objects().len()
    }
}

impl fmt::Display for MemoryAppendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.shared.write_through {
            "write-through"
        } else {
            "memory"
        };
        write!(f, "MemoryAppendable({:?}, {mode})", self.shared.fence)
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

    /// The double has no latency of its own: it answers for the backend it doubles, known by
    /// its fence (generation: GCS Rapid, write offset: S3 Express).
    fn creates_ahead_pay_off(&self) -> bool {
        self.shared.fence == FenceKind::Generation
    }

    async fn create(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        self.shared
            .inner
            .put_opts(path, PutPayload::default(), opts)
            .await?;
        let entry = Entry::default();
        self.shared.objects().insert(path.clone(), entry.clone());
        if !self.shared.write_through {
            self.shared.sizes().insert(path.clone(), 0);
        }
        Ok(Box::new(MemoryWriter::new(&self.shared, entry, path, 0, 0)))
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        let entry = self.shared.entry(path).await?;
        let mut object = entry.lock().await;
        if object.finalized {
            return Err(finalized(path));
        }
        if self.shared.fence == FenceKind::Generation {
            object.generation += 1;
        }
        object.handles += 1;
        let (generation, size, handle) = (object.generation, object.size, object.handles);
        drop(object);
        let mut writer = MemoryWriter::new(&self.shared, entry, path, generation, size);
        writer.handle = handle;
        Ok(Box::new(writer))
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        let entry = self.shared.entry(path).await?;
        let object = entry.lock().await;
        Ok(AppendableMeta {
            size: object.size,
            finalized: object.finalized,
            generation: object.generation,
        })
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        let entry = self.shared.entry(path).await?;
        let object = entry.lock().await;
        if range.start > range.end || range.end > object.size {
            return Err(StorageError::InvalidConfig(format!(
                "read of {range:?} past the persisted size {} of {path}",
                object.size
            )));
        }
        let bytes = self.shared.bytes_of(path, &object).await?;
        Ok(bytes.slice(range.start as usize..range.end as usize))
    }
}

/// A writer of one object in a [`MemoryAppendable`].
#[derive(Debug)]
struct MemoryWriter {
    shared: Arc<Shared>,
    entry: Entry,
    path: Path,
    generation: u64,
    persisted: u64,
    pending: Pending,
    flushes: u64,
    broken: bool,
    /// Which writer of the object this is (`Object::handles` when it was handed out).
    handle: u64,
}

impl MemoryWriter {
    fn new(
        shared: &Arc<Shared>,
        entry: Entry,
        path: &Path,
        generation: u64,
        persisted: u64,
    ) -> MemoryWriter {
        MemoryWriter {
            shared: shared.clone(),
            entry,
            path: path.clone(),
            generation,
            persisted,
            pending: Pending::default(),
            flushes: 0,
            broken: false,
            handle: 0,
        }
    }

    async fn do_flush(&mut self, finalize: bool) -> Result<u64, StorageError> {
        if self.broken {
            return Err(broken(&self.path));
        }
        self.pending
            .check_append_count(&self.path, &self.shared.limits, self.flushes)?;
        let job = FlushJob {
            shared: self.shared.clone(),
            entry: self.entry.clone(),
            path: self.path.clone(),
            generation: self.generation,
            persisted: self.persisted,
            pending: self.pending.clone(),
            finalize,
        };
        // A request on the wire completes even if its caller stops waiting: the flush runs as
        // its own task, so the object's state never stops halfway (bytes written, size not).
        let result = match tokio::spawn(job.run()).await {
            Ok(result) => result,
            Err(join) => Err(StorageError::from(object_store::Error::from(join))),
        };
        match result {
            Ok(size) => {
                if !self.pending.is_empty() {
                    self.flushes += 1;
                }
                self.pending.clear();
                self.persisted = size;
                Ok(size)
            }
            Err(err) => {
                self.broken = true;
                Err(err)
            }
        }
    }
}

/// One flush as the backend sees it: the writer's claim (generation, offset) and its bytes.
struct FlushJob {
    shared: Arc<Shared>,
    entry: Entry,
    path: Path,
    generation: u64,
    persisted: u64,
    pending: Pending,
    finalize: bool,
}

impl FlushJob {
    /// Checks that the writer still owns the object, as the backend would on a request.
    fn check_owner(&self, object: &Object) -> Result<(), StorageError> {
        if object.finalized {
            return Err(finalized(&self.path));
        }
        let fenced = match self.shared.fence {
            FenceKind::Generation => object.generation != self.generation,
            FenceKind::WriteOffset => object.size != self.persisted,
        };
        if fenced {
            return Err(StorageError::Fenced {
                path: self.path.to_string(),
                reason: format!(
                    "taken over: object at generation {} size {}, writer at generation {} offset {}",
                    object.generation, object.size, self.generation, self.persisted
                ),
            });
        }
        Ok(())
    }

    /// Write-through mode: the inner store's copy must still be the size this process last
    /// wrote. Another process's double over the same directory (a second agent on the same
    /// `file://` bucket) fences only within its own process, so this is the check that stops
    /// this writer from appending behind the other's record. Not atomic with the rewrite that
    /// follows: the double is for one agent per bucket, and this only narrows the window.
    async fn check_inner_unchanged(&self, object: &Object) -> Result<(), StorageError> {
        let current = self.shared.inner.head(&self.path).await?.size;
        if current != object.size {
            return Err(StorageError::Fenced {
                path: self.path.to_string(),
                reason: format!(
                    "the object holds {current} bytes, this writer last saw {}: another \
                     process wrote it",
                    object.size
                ),
            });
        }
        Ok(())
    }

    fn tell_landed(&self, bytes: Bytes) {
        if let Some(hook) = self.shared.landed_hook() {
            hook(&self.path, bytes);
        }
    }

    /// Checks ownership and appends the pending bytes under the object's lock; returns the
    /// persisted size.
    async fn run(self) -> Result<u64, StorageError> {
        let entry = self.entry.clone();
        let mut object = entry.lock().await;
        let known = self
            .shared
            .objects()
            .get(&self.path)
            .is_some_and(|e| Arc::ptr_eq(e, &entry));
        if !known {
            // Deleted or replaced by a plain put since this writer opened it.
            return Err(not_found(&self.path));
        }
        self.check_owner(&object)?;
        if !self.pending.is_empty() {
            if self.shared.write_through {
                self.check_inner_unchanged(&object).await?;
                let mut whole = self.shared.bytes_of(&self.path, &object).await?.to_vec();
                for chunk in self.pending.chunks() {
                    whole.extend_from_slice(chunk);
                }
                let whole = Bytes::from(whole);
                self.shared
                    .inner
                    .put(&self.path, PutPayload::from(whole.clone()))
                    .await?;
                self.tell_landed(whole);
            } else {
                for chunk in self.pending.chunks() {
                    object.data.extend_from_slice(chunk);
                }
                if self.shared.landed_hook().is_some() {
                    self.tell_landed(Bytes::copy_from_slice(&object.data));
                }
            }
            object.size += self.pending.len();
        }
        object.finalized = self.finalize;
        if !self.shared.write_through {
            self.shared.sizes().insert(self.path.clone(), object.size);
        }
        Ok(object.size)
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
            &self.shared.limits,
            self.persisted,
            offset,
            data,
        )
    }

    async fn flush(&mut self) -> Result<u64, StorageError> {
        self.do_flush(false).await
    }

    async fn finalize(mut self: Box<Self>) -> Result<u64, StorageError> {
        self.do_flush(true).await
    }

    async fn close(self: Box<Self>) -> Result<(), StorageError> {
        if self.shared.write_through {
            // The inner store has everything; forget the object unless another writer took it
            // over since (a later takeover reloads it from the inner store).
            let object = self.entry.lock().await;
            if object.handles == self.handle && !object.finalized {
                let mut objects = self.shared.objects();
                if objects
                    .get(&self.path)
                    .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
                {
                    objects.remove(&self.path);
                }
            }
        }
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
        let result = self.shared.inner.put_opts(location, payload, opts).await?;
        self.shared.forget(location);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.shared.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let entry = self.shared.objects().get(location).cloned();
        let entry = match entry {
            Some(entry) if !self.shared.write_through => entry,
            // Write-through: the inner store holds every flushed byte.
            _ => return self.shared.inner.get_opts(location, options).await,
        };
        // The placeholder gives the metadata (and the preconditions' e-tag); the size and bytes
        // are the appendable object's persisted ones.
        let head = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        let mut meta = self.shared.inner.get_opts(location, head).await?.meta;
        let data = Bytes::copy_from_slice(&entry.lock().await.data);
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
                    shared.forget(path);
                }
                location
            })
            .boxed();
        self.shared.inner.delete_stream(forgotten)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let shared = self.shared.clone();
        self.shared
            .inner
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
        self.shared
            .inner
            .list_with_offset(prefix, offset)
            .map(move |meta| meta.map(|m| shared.patch(m)))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let mut result = self.shared.inner.list_with_delimiter(prefix).await?;
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
        self.shared.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        refuse_appendable(&self.shared, from)?;
        self.shared.inner.rename_opts(from, to, options).await
    }
}

/// Copies and renames of appendable objects are not something Weir does; refuse them rather
/// than copy a placeholder.
fn refuse_appendable(shared: &Shared, path: &Path) -> object_store::Result<()> {
    if shared.objects().contains_key(path) {
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
    async fn test_write_through_appendable_conformance_on_local_files() {
        let dir = tempfile::tempdir().unwrap();
        for fence in [FenceKind::Generation, FenceKind::WriteOffset] {
            let root = dir.path().join(format!("{fence:?}"));
            let inner = Arc::new(crate::url::local_store(&root).unwrap());
            let store = MemoryAppendable::write_through(inner, fence, AppendLimits::GCS_RAPID);
            conformance::run(&store, Some(Arc::new(store.clone()))).await;
        }
    }

    #[tokio::test]
    async fn test_write_through_appendable_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let inner = Arc::new(crate::url::local_store(dir.path()).unwrap());
            MemoryAppendable::write_through(inner, FenceKind::Generation, AppendLimits::GCS_RAPID)
        };
        let path = Path::from("ingest/restart.weir");
        let before = open();
        let mut writer = before.create(&path).await.unwrap();
        writer
            .append(0, Bytes::from_static(b"durable"))
            .await
            .unwrap();
        writer.flush().await.unwrap();
        writer
            .append(7, Bytes::from_static(b" lost"))
            .await
            .unwrap();
        // The process dies with an unflushed append and the writer still open.
        drop(writer);
        drop(before);
        let after = open();
        let got = after.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"durable");
        assert_eq!(after.stat(&path).await.unwrap().size, 7);
        let mut resumed = after.takeover(&path).await.unwrap();
        resumed.append(7, Bytes::from_static(b"!")).await.unwrap();
        assert_eq!(resumed.flush().await.unwrap(), 8);
        assert!(
            after.create(&path).await.is_err(),
            "the key stays taken after a restart"
        );
        resumed.close().await.unwrap();
        assert_eq!(after.appendable_count(), 0, "closed objects are not kept");
        let listed = after
            .list_with_delimiter(Some(&Path::from("ingest")))
            .await
            .unwrap();
        assert_eq!(listed.objects[0].size, 8);
    }

    #[tokio::test]
    async fn test_write_through_writer_fenced_by_another_process_over_the_same_files() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let inner = Arc::new(crate::url::local_store(dir.path()).unwrap());
            MemoryAppendable::write_through(inner, FenceKind::Generation, AppendLimits::GCS_RAPID)
        };
        let (first, second) = (open(), open());
        let path = Path::from("meta/log/00000000000000000001");
        let mut old = first.create(&path).await.unwrap();
        let mut new = second.takeover(&path).await.unwrap();
        new.append(0, Bytes::from_static(b"theirs")).await.unwrap();
        new.flush().await.unwrap();
        old.append(0, Bytes::from_static(b"ours")).await.unwrap();
        let err = old.flush().await.unwrap_err();
        assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
        let got = second.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"theirs");
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
