use std::sync::atomic::{AtomicU32, Ordering};

use object_store::memory::InMemory;
use object_store::{ObjectStoreExt, PutMode};

use super::*;
use crate::model::{LatencyProfile, ModelStore};
use crate::stats::PriceTable;

fn stats() -> Arc<BucketStats> {
    Arc::new(BucketStats::new(
        "memory://test",
        "s3-standard",
        PriceTable::named("s3-standard").unwrap(),
    ))
}

fn hung_store() -> Arc<dyn ObjectStore> {
    let hung = LatencyProfile::constant("hung", Duration::from_secs(24 * 3600));
    Arc::new(ModelStore::new(Arc::new(InMemory::new()), hung, 1).unwrap())
}

fn policy(timeout: Duration) -> LayerPolicy {
    LayerPolicy::default().with_request_timeout(timeout)
}

/// A store whose next `failures` writes, and next `list_failures` listings (before any key), fail
/// with the error `make` builds; then it behaves.
struct Flaky {
    inner: InMemory,
    failures: AtomicU32,
    attempts: AtomicU32,
    list_failures: AtomicU32,
    listings: AtomicU32,
    make: Box<dyn Fn() -> object_store::Error + Send + Sync>,
}

impl Flaky {
    fn new(failures: u32, make: impl Fn() -> object_store::Error + Send + Sync + 'static) -> Flaky {
        Flaky {
            inner: InMemory::new(),
            failures: AtomicU32::new(failures),
            attempts: AtomicU32::new(0),
            list_failures: AtomicU32::new(0),
            listings: AtomicU32::new(0),
            make: Box::new(make),
        }
    }

    /// Takes one failure from `counter`, if any is left.
    fn fail(&self, counter: &AtomicU32) -> Option<object_store::Error> {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .ok()
            .map(|_| (self.make)())
    }
}

impl fmt::Debug for Flaky {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flaky")
    }
}

impl fmt::Display for Flaky {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Flaky")
    }
}

#[async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if let Some(err) = self.fail(&self.failures) {
            return Err(err);
        }
        self.inner.put_opts(location, payload, opts).await
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
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        if let Some(err) = self.fail(&self.list_failures) {
            return futures::stream::once(async { Err(err) }).boxed();
        }
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn status_error(status: &str) -> object_store::Error {
    #[derive(Debug, thiserror::Error)]
    #[error("Server returned non-2xx status code: {0}: <Error><Code>X</Code></Error>")]
    struct Status(String);
    #[derive(Debug, thiserror::Error)]
    #[error("Error performing PUT http://127.0.0.1/b/k in 2ms")]
    struct Outer(#[source] Status);
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(Outer(Status(status.to_string()))),
    }
}

#[tokio::test(start_paused = true)]
async fn test_layer_fails_a_hung_put_retriably_within_the_request_deadline() {
    let store = LayerStore::new(hung_store(), policy(Duration::from_secs(2)), stats());
    let started = Instant::now();
    let err = store
        .put(&Path::from("a"), PutPayload::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(started.elapsed() <= Duration::from_secs(2) + Duration::from_millis(50));
    assert!(err.to_string().contains("did not finish within"), "{err}");
    assert!(crate::StorageError::from(err).is_retryable());
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Timeout), 1);
}

#[tokio::test(start_paused = true)]
async fn test_layer_retries_a_hung_attempt_when_time_is_left() {
    let mut policy = policy(Duration::from_secs(10));
    policy.attempt_timeout = Duration::from_secs(1);
    let store = LayerStore::new(hung_store(), policy, stats());
    let err = store
        .put(&Path::from("a"), PutPayload::from_static(b"x"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("did not finish within"), "{err}");
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Timeout), 3);
    assert_eq!(snap.retries_of(RequestClass::Put), 2);
}

#[tokio::test(start_paused = true)]
async fn test_layer_fails_hung_get_and_list() {
    let store = LayerStore::new(hung_store(), policy(Duration::from_secs(2)), stats());
    assert!(store.get(&Path::from("a")).await.is_err());
    let listed: Vec<_> = store.list(None).collect().await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].is_err());
}

#[tokio::test(start_paused = true)]
async fn test_layer_passes_fast_requests_through_and_counts_them() {
    let store = LayerStore::new(
        Arc::new(InMemory::new()),
        policy(Duration::from_secs(2)),
        stats(),
    );
    store
        .put(&Path::from("a"), PutPayload::from_static(b"hello"))
        .await
        .unwrap();
    let body = store.get(&Path::from("a")).await.unwrap().bytes().await;
    assert_eq!(body.unwrap(), Bytes::from_static(b"hello"));
    store.head(&Path::from("a")).await.unwrap();
    assert!(store.head(&Path::from("missing")).await.is_err());
    let listed: Vec<_> = store.list(None).collect().await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].is_ok());
    store.delete(&Path::from("a")).await.unwrap();
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Ok), 1);
    assert_eq!(snap.requests(RequestClass::Get, Outcome::Ok), 1);
    assert_eq!(snap.requests(RequestClass::Head, Outcome::Ok), 1);
    assert_eq!(snap.requests(RequestClass::Head, Outcome::NotFound), 1);
    assert_eq!(snap.requests(RequestClass::List, Outcome::Ok), 1);
    assert_eq!(snap.requests(RequestClass::Delete, Outcome::Ok), 1);
    assert_eq!(snap.bytes_up, 5);
    assert_eq!(snap.bytes_down, 5);
    assert_eq!(snap.total_requests(), 6);
}

#[tokio::test(start_paused = true)]
async fn test_layer_retries_throttling_and_server_errors_then_succeeds() {
    for status in [
        "503 Service Unavailable",
        "500 Internal Server Error",
        "429 Too Many Requests",
    ] {
        let flaky = Arc::new(Flaky::new(2, move || status_error(status)));
        let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(10)), stats());
        store
            .put(&Path::from("a"), PutPayload::from_static(b"x"))
            .await
            .unwrap_or_else(|e| panic!("{status}: {e}"));
        assert_eq!(flaky.attempts.load(Ordering::SeqCst), 3, "{status}");
        let snap = store.stats().snapshot();
        assert_eq!(snap.retries_of(RequestClass::Put), 2);
        let throttled = snap.requests(RequestClass::Put, Outcome::Throttled);
        let errors = snap.requests(RequestClass::Put, Outcome::Error);
        if status.starts_with('5') && !status.starts_with("500") || status.starts_with("429") {
            assert_eq!((throttled, errors), (2, 0), "{status}");
        } else {
            assert_eq!((throttled, errors), (0, 2), "{status}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn test_layer_gives_up_after_max_attempts() {
    let flaky = Arc::new(Flaky::new(10, || status_error("503 Service Unavailable")));
    let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(60)), stats());
    let err = store
        .put(&Path::from("a"), PutPayload::from_static(b"x"))
        .await
        .unwrap_err();
    assert_eq!(http_status(&err), Some(503));
    assert_eq!(flaky.attempts.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn test_layer_answers_are_not_retried() {
    type MakeError = Box<dyn Fn() -> object_store::Error + Send + Sync>;
    let cases: Vec<(&str, MakeError)> = vec![
        ("400", Box::new(|| status_error("400 Bad Request"))),
        ("403", Box::new(|| status_error("403 Forbidden"))),
        (
            "precondition",
            Box::new(|| object_store::Error::Precondition {
                path: "a".into(),
                source: "etag".into(),
            }),
        ),
    ];
    for (name, make) in cases {
        let flaky = Arc::new(Flaky::new(1, make));
        let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(10)), stats());
        assert!(store
            .put(&Path::from("a"), PutPayload::from_static(b"x"))
            .await
            .is_err());
        assert_eq!(
            flaky.attempts.load(Ordering::SeqCst),
            1,
            "{name} was retried"
        );
    }
    // A create-only conflict is an answer too.
    let store = LayerStore::new(
        Arc::new(InMemory::new()),
        policy(Duration::from_secs(2)),
        stats(),
    );
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    let key = Path::from("k");
    store
        .put_opts(&key, PutPayload::from_static(b"1"), create())
        .await
        .unwrap();
    let err = store
        .put_opts(&key, PutPayload::from_static(b"2"), create())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err}"
    );
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Conflict), 1);
    assert_eq!(snap.retries_of(RequestClass::Put), 0);
}

#[test]
fn test_layer_attempt_deadline_grows_with_size_and_backoff_is_bounded() {
    let policy = LayerPolicy::default();
    assert_eq!(policy.attempt_deadline(0), policy.attempt_timeout);
    assert_eq!(
        policy.attempt_deadline(8 << 20),
        policy.attempt_timeout + Duration::from_secs(2)
    );
    let mut rng = fastrand::Rng::with_seed(3);
    for attempt in 1..40 {
        assert!(policy.backoff(attempt, true, &mut rng) <= policy.backoff_max);
        assert!(policy.backoff(attempt, false, &mut rng) <= policy.backoff_max);
    }
    assert!(LayerPolicy {
        max_attempts: 0,
        ..policy
    }
    .validate()
    .is_err());
    assert!(policy.validate().is_ok());
}

#[tokio::test]
async fn test_layer_streams_may_be_polled_again_after_they_end() {
    // object_store's `GetResult::bytes` polls a body again after it ended (an empty object on
    // S3 or Azure has no chunks at all), so the layer's streams must be fused.
    let mut body = metered_body(
        stats(),
        Duration::from_secs(1),
        Instant::now() + Duration::from_secs(1),
        futures::stream::empty().boxed(),
    );
    assert!(body.next().await.is_none());
    assert!(body.next().await.is_none());
    let store = LayerStore::new(
        Arc::new(InMemory::new()),
        policy(Duration::from_secs(2)),
        stats(),
    );
    let mut listed = store.list(None);
    assert!(listed.next().await.is_none());
    assert!(listed.next().await.is_none());
}

#[tokio::test]
async fn test_layer_delete_stream_goes_on_after_a_failed_item() {
    // Each key of a bulk delete is its own answer: a missing key (NotFound on local files) must
    // not end the stream, or the keys after it are silently never deleted.
    let dir = tempfile::tempdir().unwrap();
    let store = LayerStore::new(
        Arc::new(crate::local_store(dir.path()).unwrap()),
        policy(Duration::from_secs(2)),
        stats(),
    );
    let present = Path::from("present");
    store
        .put(&present, PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let keys = vec![Ok(Path::from("missing")), Ok(present.clone())];
    let results: Vec<_> = store
        .delete_stream(futures::stream::iter(keys).boxed())
        .collect()
        .await;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(
        matches!(results[0], Err(object_store::Error::NotFound { .. })),
        "{results:?}"
    );
    assert_eq!(results[1].as_ref().unwrap(), &present);
    assert!(
        store.head(&present).await.is_err(),
        "present was not deleted"
    );
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Delete, Outcome::NotFound), 1);
    assert_eq!(snap.requests(RequestClass::Delete, Outcome::Ok), 1);
}

#[tokio::test]
async fn test_layer_head_of_a_local_file_downloads_nothing() {
    // A local GET hands back the open file; a HEAD reads none of it and must not be counted as
    // downloading the object.
    let dir = tempfile::tempdir().unwrap();
    let store = LayerStore::new(
        Arc::new(crate::local_store(dir.path()).unwrap()),
        policy(Duration::from_secs(2)),
        stats(),
    );
    let key = Path::from("a");
    store
        .put(&key, PutPayload::from(vec![1u8; 1000]))
        .await
        .unwrap();
    assert_eq!(store.head(&key).await.unwrap().size, 1000);
    assert_eq!(store.stats().snapshot().bytes_down, 0);
    store.get_range(&key, 0..10).await.unwrap();
    assert_eq!(store.stats().snapshot().bytes_down, 10);
}

/// A store that ignores the offset of `list_with_offset`, as azurite does with `startFrom` when
/// the client does not know it is talking to the emulator (an `az://` URL with an `endpoint`).
#[derive(Debug)]
struct IgnoresOffset(InMemory);

impl fmt::Display for IgnoresOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IgnoresOffset")
    }
}

#[async_trait]
impl ObjectStore for IgnoresOffset {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.0.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        _offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[tokio::test]
async fn test_layer_list_with_offset_holds_when_the_store_ignores_the_offset() {
    let store = LayerStore::new(
        Arc::new(IgnoresOffset(InMemory::new())),
        policy(Duration::from_secs(2)),
        stats(),
    );
    for key in ["log/1", "log/2", "log/3"] {
        store
            .put(&Path::from(key), PutPayload::from_static(b"x"))
            .await
            .unwrap();
    }
    let mut after: Vec<String> = store
        .list_with_offset(Some(&Path::from("log")), &Path::from("log/2"))
        .map(|meta| meta.unwrap().location.to_string())
        .collect()
        .await;
    after.sort();
    assert_eq!(after, ["log/3"]);
    assert_eq!(
        store
            .stats()
            .snapshot()
            .requests(RequestClass::List, Outcome::Ok),
        1
    );
}

fn conditional_conflict() -> object_store::Error {
    #[derive(Debug, thiserror::Error)]
    #[error("Server returned non-2xx status code: 409 Conflict: <Error><Code>ConditionalRequestConflict</Code></Error>")]
    struct Conflict;
    object_store::Error::AlreadyExists {
        path: "k".into(),
        source: Box::new(Conflict),
    }
}

#[tokio::test(start_paused = true)]
async fn test_layer_retries_s3_conditional_request_conflict() {
    // S3's 409 ConditionalRequestConflict reaches us as AlreadyExists, but says nothing about
    // the object: the create-only write is retried, and lands.
    let flaky = Arc::new(Flaky::new(1, conditional_conflict));
    let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(10)), stats());
    let create = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    store
        .put_opts(&Path::from("k"), PutPayload::from_static(b"x"), create)
        .await
        .unwrap();
    assert_eq!(flaky.attempts.load(Ordering::SeqCst), 2);
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Error), 1);
    assert_eq!(snap.requests(RequestClass::Put, Outcome::Conflict), 0);
}

#[tokio::test(start_paused = true)]
async fn test_layer_retries_a_listing_that_fails_before_its_first_key() {
    let flaky = Arc::new(Flaky::new(0, || status_error("503 Slow Down")));
    flaky.list_failures.store(2, Ordering::SeqCst);
    flaky
        .inner
        .put(&Path::from("a/1"), PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(10)), stats());
    let listed: Vec<_> = store.list(Some(&Path::from("a"))).collect().await;
    assert_eq!(listed.len(), 1);
    assert!(listed[0].is_ok(), "{listed:?}");
    assert_eq!(flaky.listings.load(Ordering::SeqCst), 3);
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::List, Outcome::Throttled), 2);
    assert_eq!(snap.requests(RequestClass::List, Outcome::Ok), 1);
    assert_eq!(snap.retries_of(RequestClass::List), 2);

    // Always failing: the error comes out after max_attempts, counted once per attempt.
    flaky.list_failures.store(10, Ordering::SeqCst);
    let store = LayerStore::new(flaky.clone(), policy(Duration::from_secs(10)), stats());
    let listed: Vec<_> = store.list(None).collect().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(http_status(listed[0].as_ref().unwrap_err()), Some(503));
    let snap = store.stats().snapshot();
    assert_eq!(snap.requests(RequestClass::List, Outcome::Throttled), 3);
}

#[tokio::test(start_paused = true)]
async fn test_layer_body_must_arrive_within_its_deadline() {
    // A body that trickles (a chunk every 900 ms, each within the 1 s chunk timeout) is still
    // cut at the whole-body deadline.
    let trickle = futures::stream::unfold(0u32, |n| async move {
        tokio::time::sleep(Duration::from_millis(900)).await;
        Some((Ok(Bytes::from_static(b"x")), n + 1))
    })
    .boxed();
    let stats = stats();
    let body = metered_body(
        stats.clone(),
        Duration::from_secs(1),
        Instant::now() + Duration::from_secs(5),
        trickle,
    );
    let got: Vec<_> = body.collect().await;
    assert!(got.len() <= 7, "{}", got.len());
    let last = got.last().unwrap().as_ref().unwrap_err();
    assert!(
        last.to_string().contains("get body did not finish"),
        "{last}"
    );
    assert_eq!(
        stats
            .snapshot()
            .requests(RequestClass::Get, Outcome::Timeout),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn test_layer_large_payload_gets_a_whole_attempt() {
    // 64 MiB at 4 MiB/s is 3 s + 16 s: more than request_timeout (10 s), still one attempt.
    let slow = LatencyProfile::constant("slow", Duration::from_secs(15));
    let store: Arc<dyn ObjectStore> =
        Arc::new(ModelStore::new(Arc::new(InMemory::new()), slow, 1).unwrap());
    let store = LayerStore::new(store, policy(Duration::from_secs(10)), stats());
    store
        .put(&Path::from("big"), PutPayload::from(vec![0u8; 64 << 20]))
        .await
        .unwrap();
}
