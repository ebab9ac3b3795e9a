//! The cases every backend must pass, each on a fresh, empty area of the bucket (its own key
//! prefix, directory or in-memory store), opened exactly as the agent opens a bucket: by URL,
//! wrapped in the storage layer with the default policy.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion, WriteMultipart,
};
use weir_storage::{
    probe, BucketStats, BucketUrl, LayerPolicy, LayerStore, Outcome, PriceTable, RequestClass,
    StorageError,
};

/// One backend under test.
pub(crate) struct Backend {
    /// Short name for the report (`memory`, `file`, `s3 (moto)`, `az (azurite)`).
    pub(crate) name: &'static str,
    /// The URL of a fresh, empty area for the case called `case`.
    pub(crate) url: Box<dyn Fn(&str) -> String + Send + Sync>,
    /// Whether the backend implements compare-and-set (`PutMode::Update`).
    pub(crate) compare_and_set: bool,
}

/// A bucket opened the way the agent opens one, and its counters.
pub(crate) struct Opened {
    /// The layered store.
    pub(crate) store: Arc<LayerStore>,
    /// The bucket's display name.
    pub(crate) name: String,
}

impl Opened {
    /// A copy of the bucket's counters.
    pub(crate) fn snapshot(&self) -> weir_storage::BucketSnapshot {
        self.store.stats().snapshot()
    }
}

/// Opens `url` as the agent does: parse, open with the configured options, wrap in the layer.
pub(crate) fn open_with(url: &str, policy: LayerPolicy) -> Opened {
    let parsed = BucketUrl::parse(url).unwrap_or_else(|e| panic!("parse {url}: {e}"));
    let store = parsed
        .open(&BTreeMap::new())
        .unwrap_or_else(|e| panic!("open {}: {e}", parsed.display_name()));
    let name = parsed.display_name();
    let class = PriceTable::default_class(&parsed.scheme, &parsed.bucket, "local");
    let prices = PriceTable::named(class).expect("built-in price class");
    let stats = Arc::new(BucketStats::new(&name, class, prices));
    Opened {
        store: Arc::new(LayerStore::new(store, policy, stats)),
        name,
    }
}

/// [`open_with`] the default policy.
pub(crate) fn open(url: &str) -> Opened {
    open_with(url, LayerPolicy::default())
}

type CaseFn = for<'a> fn(&'a Backend, &'a Opened) -> futures::future::BoxFuture<'a, ()>;

/// Every case, by name.
pub(crate) const CASES: &[(&str, CaseFn)] = &[
    ("put_get_range_head", |b, o| {
        put_get_range_head(b, o).boxed()
    }),
    ("list_prefix_and_offset", |b, o| {
        list_prefix_and_offset(b, o).boxed()
    }),
    ("list_with_delimiter", |b, o| {
        list_with_delimiter(b, o).boxed()
    }),
    ("delete_and_delete_missing", |b, o| {
        delete_and_delete_missing(b, o).boxed()
    }),
    ("create_only_conflict", |b, o| {
        create_only_conflict(b, o).boxed()
    }),
    ("compare_and_set_conflict", |b, o| {
        compare_and_set_conflict(b, o).boxed()
    }),
    ("multipart_large_object", |b, o| {
        multipart_large_object(b, o).boxed()
    }),
    ("probes", |b, o| probes(b, o).boxed()),
    ("job_queue", |b, o| job_queue(b, o).boxed()),
    ("request_counters", |b, o| request_counters(b, o).boxed()),
    ("os_put_get_delete_list", |_, o| {
        object_store::integration::put_get_delete_list(o.store.as_ref()).boxed()
    }),
    ("os_get_opts", |_, o| {
        object_store::integration::get_opts(o.store.as_ref()).boxed()
    }),
    ("os_put_opts", |b, o| {
        object_store::integration::put_opts(o.store.as_ref(), b.compare_and_set).boxed()
    }),
    ("os_list_uses_directories_correctly", |_, o| {
        object_store::integration::list_uses_directories_correctly(o.store.as_ref()).boxed()
    }),
    ("os_list_with_delimiter", |_, o| {
        object_store::integration::list_with_delimiter(o.store.as_ref()).boxed()
    }),
    ("os_list_with_offset_exclusivity", |_, o| {
        object_store::integration::list_with_offset_exclusivity(o.store.as_ref()).boxed()
    }),
    ("os_rename_and_copy", |_, o| {
        object_store::integration::rename_and_copy(o.store.as_ref()).boxed()
    }),
    // Parts complete out of call order; the layer must keep the call order (part numbers).
    ("os_multipart_out_of_order", |_, o| {
        object_store::integration::multipart_out_of_order(o.store.as_ref()).boxed()
    }),
    ("os_stream_get", |_, o| {
        object_store::integration::stream_get(o.store.as_ref()).boxed()
    }),
];

/// Runs every case on `backend`, each on a fresh area; returns `(case, failure)` for each that
/// failed (a case fails by panicking, so object_store's helpers fit in as they are).
pub(crate) async fn run_all(backend: &Backend) -> Vec<(&'static str, String)> {
    let mut failures = Vec::new();
    for (case, run) in CASES {
        let opened = open(&(backend.url)(case));
        let outcome = AssertUnwindSafe(run(backend, &opened)).catch_unwind().await;
        match outcome {
            Ok(()) => eprintln!("conformance: {:<36} {:<14} pass", case, backend.name),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                eprintln!("conformance: {:<36} {:<14} FAIL: {why}", case, backend.name);
                failures.push((*case, why));
            }
        }
    }
    failures
}

fn create() -> PutOptions {
    PutMode::Create.into()
}

async fn read(store: &dyn ObjectStore, key: &Path) -> Bytes {
    store
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("get body {key}: {e}"))
}

async fn keys(
    stream: futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>,
) -> Vec<String> {
    let mut keys: Vec<String> = stream
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list");
    keys.sort();
    keys
}

async fn put_get_range_head(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    let key = Path::from("ingest/2026-12-01-07/file.weir");
    let body: Bytes = (0..=255u8).cycle().take(10_000).collect::<Vec<u8>>().into();
    store.put(&key, body.clone().into()).await.expect("put");
    assert_eq!(read(store, &key).await, body);
    let range = store.get_range(&key, 100..1_100).await.expect("ranged get");
    assert_eq!(range, body.slice(100..1_100));
    let ranges = store
        .get_ranges(&key, &[0..10, 9_990..10_000])
        .await
        .expect("get_ranges");
    assert_eq!(ranges, vec![body.slice(0..10), body.slice(9_990..10_000)]);
    let meta = store.head(&key).await.expect("head");
    assert_eq!(meta.size, 10_000);
    assert_eq!(meta.location, key);
    let missing = store.get(&Path::from("ingest/none")).await.unwrap_err();
    assert!(
        matches!(missing, object_store::Error::NotFound { .. }),
        "{missing}"
    );
    let missing = store.head(&Path::from("ingest/none")).await.unwrap_err();
    assert!(
        matches!(missing, object_store::Error::NotFound { .. }),
        "{missing}"
    );
}

async fn list_prefix_and_offset(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    for key in ["a/1", "a/2", "a/3", "ab/1", "b/1"] {
        store.put(&Path::from(key), key.into()).await.expect("put");
    }
    assert_eq!(
        keys(store.list(Some(&Path::from("a")))).await,
        ["a/1", "a/2", "a/3"],
        "a prefix is a whole path segment: ab/1 is not under a"
    );
    assert_eq!(
        keys(store.list(None)).await,
        ["a/1", "a/2", "a/3", "ab/1", "b/1"]
    );
    assert_eq!(
        keys(store.list_with_offset(None, &Path::from("a/2"))).await,
        ["a/3", "ab/1", "b/1"],
        "the offset itself is excluded"
    );
    assert_eq!(
        keys(store.list_with_offset(Some(&Path::from("a")), &Path::from("a/1"))).await,
        ["a/2", "a/3"]
    );
    assert!(keys(store.list(Some(&Path::from("c")))).await.is_empty());
}

async fn list_with_delimiter(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    for key in ["d/x", "d/sub/y", "d/sub/z", "e"] {
        store.put(&Path::from(key), key.into()).await.expect("put");
    }
    let top = store.list_with_delimiter(None).await.expect("list top");
    let objects: Vec<String> = top.objects.iter().map(|m| m.location.to_string()).collect();
    let prefixes: Vec<String> = top.common_prefixes.iter().map(|p| p.to_string()).collect();
    assert_eq!(objects, ["e"]);
    assert_eq!(prefixes, ["d"]);
    let d = store
        .list_with_delimiter(Some(&Path::from("d")))
        .await
        .expect("list d");
    let objects: Vec<String> = d.objects.iter().map(|m| m.location.to_string()).collect();
    let prefixes: Vec<String> = d.common_prefixes.iter().map(|p| p.to_string()).collect();
    assert_eq!(objects, ["d/x"]);
    assert_eq!(prefixes, ["d/sub"]);
}

async fn delete_and_delete_missing(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    let key = Path::from("meta/log/00000000000000000001");
    store.put(&key, "entry".into()).await.expect("put");
    store.delete(&key).await.expect("delete");
    let err = store.get(&key).await.unwrap_err();
    assert!(matches!(err, object_store::Error::NotFound { .. }), "{err}");
    // Deleting what is not there is an answer, never a failure: Ok or NotFound (stores differ),
    // not retried.
    let before = opened.snapshot();
    let answer = match store.delete(&Path::from("meta/log/missing")).await {
        Ok(()) => "ok",
        Err(object_store::Error::NotFound { .. }) => "not found",
        Err(e) => panic!("delete of a missing key failed: {e}"),
    };
    eprintln!(
        "conformance: {}: delete of a missing key answers {answer}",
        opened.name
    );
    let delta = opened.snapshot().since(&before);
    assert_eq!(delta.requests_of(RequestClass::Delete), 1);
    assert_eq!(delta.retries_of(RequestClass::Delete), 0);
}

async fn create_only_conflict(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    let key = Path::from("meta/log/00000000000000000007");
    store
        .put_opts(&key, "first".into(), create())
        .await
        .expect("first create-only put");
    let before = opened.snapshot();
    let err = store
        .put_opts(&key, "second".into(), create())
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "second create-only put: {err}"
    );
    assert!(!StorageError::from(err).is_retryable());
    assert_eq!(read(store, &key).await.as_ref(), b"first");
    // A lost race is an answer: counted as a conflict, not retried.
    let delta = opened.snapshot().since(&before);
    assert_eq!(delta.requests(RequestClass::Put, Outcome::Conflict), 1);
    assert_eq!(delta.retries_of(RequestClass::Put), 0);
}

async fn compare_and_set_conflict(backend: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    let key = Path::from("queue/compaction");
    let v1 = store
        .put_opts(&key, "v1".into(), create())
        .await
        .expect("create");
    let update = |r: &object_store::PutResult| -> PutOptions {
        PutMode::Update(UpdateVersion {
            e_tag: r.e_tag.clone(),
            version: r.version.clone(),
        })
        .into()
    };
    let result = store.put_opts(&key, "v2".into(), update(&v1)).await;
    if !backend.compare_and_set {
        let err = result.unwrap_err();
        assert!(
            matches!(err, object_store::Error::NotImplemented { .. }),
            "a backend without CAS must say so: {err}"
        );
        assert_eq!(read(store, &key).await.as_ref(), b"v1");
        return;
    }
    let v2 = result.expect("update on the current version");
    assert_eq!(read(store, &key).await.as_ref(), b"v2");
    let before = opened.snapshot();
    let err = store
        .put_opts(&key, "v3".into(), update(&v1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, object_store::Error::Precondition { .. }),
        "update on a stale version: {err}"
    );
    assert_eq!(read(store, &key).await.as_ref(), b"v2");
    let delta = opened.snapshot().since(&before);
    assert_eq!(delta.requests(RequestClass::Put, Outcome::Conflict), 1);
    assert_eq!(delta.retries_of(RequestClass::Put), 0);
    store
        .put_opts(&key, "v4".into(), update(&v2))
        .await
        .expect("update on the new current version");
    assert_eq!(read(store, &key).await.as_ref(), b"v4");
}

async fn multipart_large_object(_: &Backend, opened: &Opened) {
    const PART: usize = 5 << 20;
    let store = opened.store.as_ref();
    let key = Path::from("compacted/large.weir");
    let body: Bytes = (0..2 * PART + 4_321)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let before = opened.snapshot();
    let upload = store.put_multipart(&key).await.expect("start multipart");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    writer.write(&body);
    writer.finish().await.expect("complete multipart");
    let delta = opened.snapshot().since(&before);
    // create + 3 parts (5 MiB, 5 MiB, the rest) + complete, all counted as PUT-class requests.
    assert_eq!(delta.requests(RequestClass::Put, Outcome::Ok), 5);
    assert_eq!(delta.bytes_up, body.len() as u64);
    assert_eq!(
        store.head(&key).await.expect("head").size,
        body.len() as u64
    );
    let got = read(store, &key).await;
    assert!(got == body, "multipart object read back differs");
    let tail = store
        .get_range(&key, (2 * PART - 10) as u64..(2 * PART + 10) as u64)
        .await
        .expect("range across the part boundary");
    assert_eq!(tail, body.slice(2 * PART - 10..2 * PART + 10));
}

async fn probes(backend: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    probe::create_only(store, &opened.name, "the metadata log")
        .await
        .unwrap_or_else(|e| panic!("create-only probe: {e}"));
    let cas = probe::compare_and_set(store, &opened.name, "the job queue").await;
    match (backend.compare_and_set, cas) {
        (true, Ok(())) => {}
        (false, Err(StorageError::MissingCapability { capability, .. })) => {
            assert_eq!(capability, probe::COMPARE_AND_SET);
        }
        (expected, got) => panic!("compare-and-set probe (expected support: {expected}): {got:?}"),
    }
    // Probe objects are cleaned up.
    assert!(keys(store.list(None)).await.is_empty());
}

async fn request_counters(_: &Backend, opened: &Opened) {
    let store = opened.store.as_ref();
    let before = opened.snapshot();
    let a = Path::from("c/a");
    store
        .put(&a, PutPayload::from(vec![7u8; 1_000]))
        .await
        .expect("put a");
    store
        .put(&Path::from("c/b"), PutPayload::from(vec![8u8; 24]))
        .await
        .expect("put b");
    assert_eq!(read(store, &a).await.len(), 1_000);
    store.get_range(&a, 0..10).await.expect("ranged get");
    store.head(&a).await.expect("head");
    assert_eq!(keys(store.list(Some(&Path::from("c")))).await.len(), 2);
    store.delete(&a).await.expect("delete");
    let missing = store.get(&a).await.unwrap_err();
    assert!(
        matches!(missing, object_store::Error::NotFound { .. }),
        "{missing}"
    );
    let delta = opened.snapshot().since(&before);
    let counts: Vec<(RequestClass, Outcome, u64)> = RequestClass::ALL
        .iter()
        .flat_map(|&c| Outcome::ALL.iter().map(move |&o| (c, o)))
        .map(|(c, o)| (c, o, delta.requests(c, o)))
        .filter(|(_, _, n)| *n > 0)
        .collect();
    assert_eq!(
        counts,
        [
            (RequestClass::Put, Outcome::Ok, 2),
            (RequestClass::Get, Outcome::Ok, 2),
            (RequestClass::Get, Outcome::NotFound, 1),
            (RequestClass::List, Outcome::Ok, 1),
            (RequestClass::Delete, Outcome::Ok, 1),
            (RequestClass::Head, Outcome::Ok, 1),
        ]
    );
    assert_eq!(delta.total_requests(), 8);
    assert_eq!(
        RequestClass::ALL
            .iter()
            .map(|&c| delta.retries_of(c))
            .sum::<u64>(),
        0
    );
    assert_eq!(delta.bytes_up, 1_024);
    assert_eq!(delta.bytes_down, 1_010);
}

/// The job queue (weir-objq) on the bucket as the agent opens it: through the storage layer's
/// conditional puts where the backend has compare-and-set, else (`file://`) through the local
/// compare-and-set on the same directory. Three members, the broker killed once.
async fn job_queue(backend: &Backend, opened: &Opened) {
    use weir_objq::cas::{local::LocalCas, CasObject, ObjectStoreCas};
    use weir_objq::{LocalNetwork, Member, Settings};

    let cas: Arc<dyn CasObject> = if backend.compare_and_set {
        Arc::new(ObjectStoreCas::new(
            opened.store.clone(),
            Path::from("queue/conformance.json"),
        ))
    } else {
        let dir = opened
            .name
            .strip_prefix("file://")
            .expect("only file:// lacks compare-and-set");
        Arc::new(LocalCas::new(std::path::Path::new(dir), "queue.json").expect("local cas"))
    };
    let settings = Settings {
        broker_timeout: std::time::Duration::from_millis(300),
        write_retry: std::time::Duration::from_millis(20),
        ..Settings::default()
    };
    let network = LocalNetwork::new(&settings);
    let members: Vec<Member> = (0..3)
        .map(|i| {
            let address = format!("local:{i}");
            Member::new(
                &format!("m{i}"),
                &address,
                cas.clone(),
                network.clone(),
                settings,
            )
        })
        .collect();
    let payloads = |r: std::ops::Range<u32>| r.map(|i| format!("job-{i}")).collect::<Vec<_>>();
    assert_eq!(
        members[0].push(payloads(0..3)).await.unwrap(),
        vec![1, 2, 3]
    );
    let job = members[1].claim("w").await.unwrap().expect("a job");
    assert_eq!(job.id, 1);
    members[1].ack("w", job.id).await.unwrap();
    members[0].stop_broker();
    assert_eq!(members[2].push(payloads(3..4)).await.unwrap(), vec![4]);
    let state = members[1].snapshot().await.unwrap();
    assert_eq!(
        state.broker.map(|b| (b.id, b.epoch)),
        Some(("m2".to_string(), 2))
    );
    let ids: Vec<u64> = state.jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![2, 3, 4]);
}
