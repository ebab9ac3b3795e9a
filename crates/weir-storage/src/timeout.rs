//! A deadline on every object-store request: an [`ObjectStore`] wrapper that fails a request
//! which has not finished within `timeout` with a transient [`object_store::Error::Generic`].
//!
//! Without it one hung PUT blocks its file and, through the ordered commit chain, every later
//! produce of the agent forever, with no error to any client; a hung log write stalls the control
//! plane the same way. With it the callers' retry loops (uploader, metadata log writer, recovery,
//! fetch reads) see an ordinary retriable error. A timed-out request may still take effect (an
//! ambiguous write): every writer above already treats a failed PUT that way (data files are
//! re-put under the same key; log slots are create-only and compare bytes on `AlreadyExists`).
//!
//! For GETs the deadline covers the response headers and then each body chunk: a download that
//! keeps moving is not cut off because the object is large.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};

/// Default deadline per request (`storage.request_timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const STORE: &str = "timeout";

#[derive(Debug, thiserror::Error)]
#[error("{operation} did not finish within {timeout:?}")]
struct TimedOut {
    operation: &'static str,
    timeout: Duration,
}

fn timed_out(operation: &'static str, timeout: Duration) -> object_store::Error {
    object_store::Error::Generic {
        store: STORE,
        source: Box::new(TimedOut { operation, timeout }),
    }
}

async fn within<T>(
    timeout: Duration,
    operation: &'static str,
    work: impl Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(operation, timeout)),
    }
}

/// Each item of `inner` must arrive within `timeout` of the previous one.
fn stream_within<T: Send + 'static>(
    timeout: Duration,
    operation: &'static str,
    inner: BoxStream<'static, object_store::Result<T>>,
) -> BoxStream<'static, object_store::Result<T>> {
    futures::stream::unfold(Some(inner), move |state| async move {
        let mut inner = state?;
        match tokio::time::timeout(timeout, inner.next()).await {
            Ok(Some(item)) => Some((item, Some(inner))),
            Ok(None) => None,
            // The error ends the stream.
            Err(_) => Some((Err(timed_out(operation, timeout)), None)),
        }
    })
    .boxed()
}

/// Wraps a store so that every request has a deadline.
pub struct TimeoutStore {
    inner: Arc<dyn ObjectStore>,
    timeout: Duration,
}

impl TimeoutStore {
    pub fn new(inner: Arc<dyn ObjectStore>, timeout: Duration) -> TimeoutStore {
        TimeoutStore { inner, timeout }
    }
}

impl fmt::Debug for TimeoutStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimeoutStore({:?}, {})", self.timeout, self.inner)
    }
}

impl fmt::Display for TimeoutStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimeoutStore({:?}, {})", self.timeout, self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for TimeoutStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        within(
            self.timeout,
            "put",
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let upload = within(
            self.timeout,
            "multipart create",
            self.inner.put_multipart_opts(location, opts),
        )
        .await?;
        Ok(Box::new(TimeoutUpload {
            upload,
            timeout: self.timeout,
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let mut result =
            within(self.timeout, "get", self.inner.get_opts(location, options)).await?;
        // Local files are read synchronously by the caller: nothing there can hang on a network.
        if let GetResultPayload::Stream(stream) = result.payload {
            result.payload =
                GetResultPayload::Stream(stream_within(self.timeout, "get body", stream));
        }
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        within(
            self.timeout,
            "get ranges",
            self.inner.get_ranges(location, ranges),
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        stream_within(self.timeout, "delete", self.inner.delete_stream(locations))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        stream_within(self.timeout, "list", self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        stream_within(
            self.timeout,
            "list",
            self.inner.list_with_offset(prefix, offset),
        )
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        within(self.timeout, "list", self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        within(
            self.timeout,
            "copy",
            self.inner.copy_opts(from, to, options),
        )
        .await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        within(
            self.timeout,
            "rename",
            self.inner.rename_opts(from, to, options),
        )
        .await
    }
}

#[derive(Debug)]
struct TimeoutUpload {
    upload: Box<dyn MultipartUpload>,
    timeout: Duration,
}

#[async_trait]
impl MultipartUpload for TimeoutUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        // Parts are ordered by call order, so the inner part must be started now.
        let put = self.upload.put_part(data);
        let timeout = self.timeout;
        Box::pin(within(timeout, "upload part", put))
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        within(self.timeout, "upload complete", self.upload.complete()).await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        within(self.timeout, "upload abort", self.upload.abort()).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::ObjectStoreExt;

    use super::*;
    use crate::model::{LatencyProfile, ModelStore};

    fn hung_store() -> Arc<dyn ObjectStore> {
        let hung = LatencyProfile::constant("hung", Duration::from_secs(24 * 3600));
        Arc::new(ModelStore::new(Arc::new(InMemory::new()), hung, 1).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn test_timeout_store_fails_a_hung_put_retriably() {
        let store = TimeoutStore::new(hung_store(), Duration::from_secs(2));
        let started = tokio::time::Instant::now();
        let err = store
            .put(&Path::from("a"), PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(err.to_string().contains("did not finish within"), "{err}");
        assert!(crate::StorageError::from(err).is_retryable());
    }

    #[tokio::test(start_paused = true)]
    async fn test_timeout_store_fails_hung_get_and_list() {
        let store = TimeoutStore::new(hung_store(), Duration::from_secs(2));
        assert!(store.get(&Path::from("a")).await.is_err());
        let listed: Vec<_> = store.list(None).collect().await;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn test_timeout_store_passes_fast_requests_through() {
        let store = TimeoutStore::new(Arc::new(InMemory::new()), Duration::from_secs(2));
        store
            .put(&Path::from("a"), PutPayload::from_static(b"hello"))
            .await
            .unwrap();
        let body = store.get(&Path::from("a")).await.unwrap().bytes().await;
        assert_eq!(body.unwrap(), Bytes::from_static(b"hello"));
        let listed: Vec<_> = store.list(None).collect().await;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].is_ok());
    }
}
