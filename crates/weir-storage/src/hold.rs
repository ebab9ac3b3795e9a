//! Holding a bucket out of use.
//!
//! An ingest bucket that could not be reached at startup has an unchecked identity: if the
//! operator reordered the bucket list while it was down, using it at its configured position
//! would write files under another bucket's holder number. [`HeldStore`] keeps such a bucket out
//! of every write and read (each request fails retriably, as if the bucket were down) until a
//! background check has read its `weir/bucket-id` and found it where the log expects it, and
//! then [`Hold::release`]s it.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;

use crate::append::{AppendLimits, AppendWriter, AppendableMeta, AppendableStore, FenceKind};
use crate::StorageError;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// The switch of one [`HeldStore`]; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Hold(Arc<AtomicBool>);

impl Hold {
    /// A hold that is not in effect.
    pub fn released() -> Hold {
        Hold::default()
    }

    /// Keeps the bucket out of use.
    pub fn engage(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Lets requests through again.
    pub fn release(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Whether the bucket is held.
    pub fn is_held(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "bucket {0} is held out of use until its bucket id is verified (it was unreachable at startup)"
)]
struct Held(String);

/// A store whose requests fail retriably while its [`Hold`] is engaged.
pub struct HeldStore {
    inner: Arc<dyn ObjectStore>,
    name: String,
    hold: Hold,
}

impl HeldStore {
    /// Wraps `inner` (the bucket called `name`) behind `hold`.
    pub fn new(inner: Arc<dyn ObjectStore>, name: &str, hold: Hold) -> HeldStore {
        HeldStore {
            inner,
            name: name.to_string(),
            hold,
        }
    }

    fn check(&self) -> object_store::Result<()> {
        if self.hold.is_held() {
            return Err(object_store::Error::Generic {
                store: "held",
                source: Box::new(Held(self.name.clone())),
            });
        }
        Ok(())
    }

    fn check_stream<T: Send + 'static>(
        &self,
        inner: impl FnOnce() -> BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        match self.check() {
            Ok(()) => inner(),
            Err(err) => futures::stream::once(async move { Err(err) }).boxed(),
        }
    }
}

impl fmt::Debug for HeldStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for HeldStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Held({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for HeldStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check()?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check()?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check()?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.check()?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.check_stream(|| self.inner.delete_stream(locations))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.check_stream(|| self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.check_stream(|| self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.check()?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check()?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.check()?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// The appendable view of a held bucket: creates, takeovers, stats and reads fail while the
/// hold is engaged (writers made before it was engaged keep working, as requests already sent
/// to a bucket would).
#[derive(Debug)]
struct HeldAppendable {
    inner: Arc<dyn AppendableStore>,
    name: String,
    hold: Hold,
}

impl HeldStore {
    /// `inner`, the same bucket's appendable view, under this store's hold.
    pub fn appendable(&self, inner: Arc<dyn AppendableStore>) -> Arc<dyn AppendableStore> {
        Arc::new(HeldAppendable {
            inner,
            name: self.name.clone(),
            hold: self.hold.clone(),
        })
    }
}

impl HeldAppendable {
    fn check(&self) -> Result<(), StorageError> {
        if self.hold.is_held() {
            return Err(StorageError::ObjectStore(object_store::Error::Generic {
                store: "held",
                source: Box::new(Held(self.name.clone())),
            }));
        }
        Ok(())
    }
}

#[async_trait]
impl AppendableStore for HeldAppendable {
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
        self.check()?;
        self.inner.create(path).await
    }

    async fn takeover(&self, path: &Path) -> Result<Box<dyn AppendWriter>, StorageError> {
        self.check()?;
        self.inner.takeover(path).await
    }

    async fn stat(&self, path: &Path) -> Result<AppendableMeta, StorageError> {
        self.check()?;
        self.inner.stat(path).await
    }

    async fn read(&self, path: &Path, range: Range<u64>) -> Result<Bytes, StorageError> {
        self.check()?;
        self.inner.read(path, range).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    use super::*;

    #[tokio::test]
    async fn test_hold_fails_everything_retriably_until_released() {
        let hold = Hold::released();
        let store = HeldStore::new(Arc::new(InMemory::new()), "s3://b", hold.clone());
        let key = Path::from("k");
        store
            .put(&key, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        hold.engage();
        let err = store.get(&key).await.unwrap_err();
        assert!(err.to_string().contains("held out of use"), "{err}");
        assert!(crate::layer::is_retryable(&err));
        assert!(store
            .put(&key, PutPayload::from_static(b"y"))
            .await
            .is_err());
        let listed: Vec<_> = store.list(None).collect().await;
        assert!(matches!(listed.as_slice(), [Err(_)]));
        hold.release();
        let body = store.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(&body[..], b"x");
    }
}
