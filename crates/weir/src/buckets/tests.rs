use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_storage::{LayerPolicy, LayerStore, RequestClass};

use super::*;
use crate::agent::config_from_flags;

#[tokio::test]
async fn test_buckets_slow_and_down_buckets_are_wrapped() {
    let config = config_from_flags(&[
        "--ingest-bucket",
        "memory://a",
        "--ingest-bucket",
        "memory://b",
        "--ingest-bucket",
        "memory://c",
        "--quorum",
        "2",
        "--slow-bucket",
        "1",
        "--slow-bucket",
        "2",
        "--down-bucket",
        "2",
    ])
    .unwrap();
    assert_eq!(config.storage.slow_buckets, vec![1, 2]);
    let buckets = Buckets::open(&config, 1).await.unwrap();
    let names: Vec<String> = buckets
        .ingest
        .iter()
        .map(|b| b.direct.to_string())
        .collect();
    // Every bucket has the storage layer outermost (under its hold), slow-bucket delays included.
    assert!(buckets.ingest[0]
        .store
        .to_string()
        .starts_with("Held(Layer(memory://a"));
    assert!(
        names[0].starts_with("Layer(memory://a, 10s, InMemory"),
        "{names:?}"
    );
    assert!(
        names[1].starts_with("Layer(memory://b, 10s, ModelStore(slow-bucket-1, InMemory"),
        "{names:?}"
    );
    assert!(
        names[2].starts_with(
            "Layer(memory://c, 10s, ModelStore(slow-bucket-2, ModelStore(local, InMemory"
        ),
        "{names:?}"
    );
    // The metadata log stays in bucket 0 by default.
    assert!(Arc::ptr_eq(
        &buckets.metadata.store,
        &buckets.ingest[0].store
    ));
    assert!(!buckets.separate_metadata);
    // Three ingest buckets and the regional one beside them (memory://compacted).
    assert_eq!(buckets.stats.snapshot().len(), 4);
    assert_eq!(
        buckets.regional.as_ref().unwrap().name,
        "memory://compacted"
    );

    let err = config_from_flags(&["--ingest-bucket", "memory://a", "--slow-bucket", "1"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("storage.slow_buckets names bucket 1"), "{err}");
}

#[tokio::test]
async fn test_buckets_metadata_bucket_gets_the_fault_model_and_its_price() {
    let config = config_from_flags(&[
        "--ingest-bucket",
        "memory://a",
        "--ingest-bucket",
        "memory://b?price=s3-standard",
        "--down-bucket",
        "0",
        "--metadata-bucket",
        "memory://meta",
        "--storage-profile",
        "s3-express",
    ])
    .unwrap();
    let buckets = Buckets::open(&config, 1).await.unwrap();
    let metadata = &buckets.metadata.direct;
    assert!(!buckets
        .ingest
        .iter()
        .any(|b| Arc::ptr_eq(&b.direct, metadata)));
    assert!(
        metadata
            .to_string()
            .starts_with("Layer(memory://meta, 10s, ModelStore(s3-express, MemoryAppendable"),
        "{metadata}"
    );
    // Local buckets are priced by their profile unless they name a price class.
    let classes: Vec<String> = buckets
        .stats
        .snapshot()
        .into_iter()
        .map(|b| format!("{}={}", b.name, b.price_class))
        .collect();
    assert_eq!(
        classes,
        [
            "memory://a=s3-express",
            "memory://b=s3-standard",
            "memory://meta=s3-express",
            "memory://compacted=s3-standard"
        ]
    );

    let err = config_from_flags(&["--ingest-bucket", "memory://a", "--down-bucket", "0"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("metadata log"), "{err}");
    let config = config_from_flags(&["--ingest-bucket", "memory://a?price=gold"]).unwrap();
    let err = Buckets::open(&config, 1).await.err().unwrap().to_string();
    assert!(err.contains("unknown price class \"gold\""), "{err}");
}

fn file_flags(dirs: &[&std::path::Path], meta: &std::path::Path) -> Vec<String> {
    let mut flags = Vec::new();
    for dir in dirs {
        flags.push("--ingest-bucket".to_string());
        flags.push(format!("file://{}", dir.display()));
    }
    flags.push("--metadata-bucket".into());
    flags.push(format!("file://{}", meta.display()));
    flags
}

async fn verify_with(flags: &[String]) -> anyhow::Result<()> {
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let config = config_from_flags(&refs)?;
    Buckets::open(&config, 1).await?.verify().await.map(|_| ())
}

#[tokio::test]
async fn test_buckets_reordered_ingest_buckets_refuse_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, meta) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("m"),
    );
    verify_with(&file_flags(&[&a, &b], &meta)).await.unwrap();
    verify_with(&file_flags(&[&a, &b], &meta)).await.unwrap();
    let err = verify_with(&file_flags(&[&b, &a], &meta))
        .await
        .unwrap_err()
        .to_string();
    let want = format!(
        "fix: list the buckets in this order: [file://{}, file://{}]",
        a.display(),
        b.display()
    );
    assert!(err.contains(&want), "{err}");
    // Adding a bucket at the end is fine.
    let c = tmp.path().join("c");
    verify_with(&file_flags(&[&a, &b, &c], &meta))
        .await
        .unwrap();
}

#[tokio::test]
async fn test_buckets_down_ingest_bucket_does_not_block_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, meta) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("m"),
    );
    let mut flags = file_flags(&[&a, &b], &meta);
    flags.extend(["--down-bucket".to_string(), "1".to_string()]);
    flags.extend(["--storage-error-rate".to_string(), "0".to_string()]);
    // Long enough for a write to the healthy buckets on a loaded machine (200 ms was not, in
    // a CI dry run, nor was 1 s: the metadata bucket's startup check took longer while other
    // tests ran), short enough that the down bucket does not hold the start up for long.
    std::env::set_var("WEIR_STORAGE_REQUEST_TIMEOUT", "5s");
    let result = verify_with(&flags).await;
    std::env::remove_var("WEIR_STORAGE_REQUEST_TIMEOUT");
    result.unwrap();
    // ... and without the down bucket the next start records the list.
    verify_with(&file_flags(&[&a, &b], &meta)).await.unwrap();
    assert!(meta.join("meta/buckets").read_dir().unwrap().count() == 1);
}

#[tokio::test]
async fn test_buckets_store_ignoring_conditions_refuses_to_start() {
    let model = weir_storage::ModelStore::new(
        Arc::new(InMemory::new()),
        weir_storage::LatencyProfile::named("local").unwrap(),
        1,
    )
    .unwrap();
    model.set_ignore_conditions(true);
    let stats = Arc::new(weir_storage::BucketStats::new(
        "s3://weir-meta",
        "s3-standard",
        weir_storage::PriceTable::named("s3-standard").unwrap(),
    ));
    let store: Arc<dyn ObjectStore> = Arc::new(LayerStore::new(
        Arc::new(model),
        LayerPolicy::default(),
        stats.clone(),
    ));
    let good: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let buckets = Buckets {
        ingest: vec![Bucket::new("s3://weir-a".into(), good)],
        metadata: Bucket::new("s3://weir-meta".into(), store),
        separate_metadata: true,
        regional: None,
        stats: StorageStats::new(),
    };
    let err = match buckets.verify().await {
        Ok(_) => panic!("a store ignoring conditions passed"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("s3://weir-meta") && err.contains("create-only"),
        "{err}"
    );
    // The probe's requests went through the layer and were counted.
    assert!(stats.snapshot().requests_of(RequestClass::Put) >= 2);
}

/// The error opening the buckets of `flags` gives ("" when they open).
async fn open_error(flags: &[&str]) -> String {
    let opened = match config_from_flags(flags) {
        Ok(config) => Buckets::open(&config, 1).await,
        Err(e) => Err(e),
    };
    opened.err().map(|e| format!("{e:#}")).unwrap_or_default()
}

#[tokio::test]
async fn test_buckets_list_mistakes_are_refused() {
    let err = open_error;
    let twice = err(&[
        "--ingest-bucket",
        "s3://weir-a?region=us-east-1",
        "--ingest-bucket",
        "s3a://weir-a",
    ])
    .await;
    assert!(twice.contains("one bucket twice"), "{twice}");
    // Two memory:// buckets are two stores.
    assert_eq!(
        err(&[
            "--ingest-bucket",
            "memory://",
            "--ingest-bucket",
            "memory://"
        ])
        .await,
        ""
    );
    std::env::set_var(
        "WEIR_STORAGE_BUCKET_OPTIONS",
        r#"{ "s3://weir-b/" = { endpoint = "http://127.0.0.1:1" } }"#,
    );
    let unknown = err(&["--ingest-bucket", "s3://weir-b"]).await;
    std::env::remove_var("WEIR_STORAGE_BUCKET_OPTIONS");
    assert!(unknown.contains("not a configured bucket"), "{unknown}");
    std::env::set_var("WEIR_STORAGE_OPTIONS", r#"{ account_name = "x" }"#);
    let foreign = err(&["--ingest-bucket", "s3://weir-b"]).await;
    std::env::remove_var("WEIR_STORAGE_OPTIONS");
    assert!(foreign.contains("applies to none"), "{foreign}");
}

#[tokio::test]
async fn test_buckets_options_merge_by_meaning_bucket_over_global() {
    // The bucket's own `aws_endpoint` beats the global `endpoint` (same option, other spelling),
    // and the global `region` reaches s3:// but not the memory:// bucket.
    std::env::set_var(
        "WEIR_STORAGE_OPTIONS",
        r#"{ endpoint = "http://127.0.0.1:1", region = "eu-west-1", allow_http = "true", access_key_id = "k", secret_access_key = "s" }"#,
    );
    std::env::set_var(
        "WEIR_STORAGE_BUCKET_OPTIONS",
        r#"{ "s3://weir-b" = { aws_endpoint = "http://127.0.0.1:2" } }"#,
    );
    let config = config_from_flags(&[
        "--ingest-bucket",
        "s3://weir-b",
        "--ingest-bucket",
        "memory://m",
    ]);
    std::env::remove_var("WEIR_STORAGE_OPTIONS");
    std::env::remove_var("WEIR_STORAGE_BUCKET_OPTIONS");
    let config = config.unwrap();
    assert!(Buckets::open(&config, 1).await.is_ok());
    let stats = StorageStats::new();
    let (_, raw, _) = open_raw(&config.storage, "s3://weir-b", &stats)
        .await
        .unwrap();
    let s3 = format!("{:?}", raw.store);
    assert!(
        s3.contains("127.0.0.1:2") && !s3.contains("127.0.0.1:1"),
        "{s3}"
    );
    assert!(s3.contains("eu-west-1"), "{s3}");
}

fn small_layer(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    let stats = Arc::new(weir_storage::BucketStats::new(
        "b",
        "free",
        weir_storage::PriceTable::FREE,
    ));
    let policy = LayerPolicy::default().with_request_timeout(std::time::Duration::from_millis(300));
    Arc::new(LayerStore::new(store, policy, stats))
}

/// An agent's buckets over shared in-memory stores: `(name, store, down)` in configured order;
/// a down bucket sits behind an outage the test can end.
fn buckets_over(
    layout: &[(&str, &Arc<InMemory>, bool)],
    meta: &Arc<InMemory>,
) -> (Buckets, Vec<Arc<weir_storage::ModelStore>>) {
    let mut outages = Vec::new();
    let mut ingest = Vec::new();
    for (name, raw, down) in layout {
        let store: Arc<dyn ObjectStore> = if *down {
            let outage = Arc::new(
                weir_storage::ModelStore::new(
                    (*raw).clone(),
                    weir_storage::LatencyProfile::named("local").unwrap(),
                    1,
                )
                .unwrap(),
            );
            outage.set_outage(true);
            outages.push(outage.clone());
            outage
        } else {
            (*raw).clone()
        };
        ingest.push(Bucket::new(name.to_string(), small_layer(store)));
    }
    let buckets = Buckets {
        ingest,
        metadata: Bucket::new("s3://meta".into(), small_layer(meta.clone())),
        separate_metadata: true,
        regional: None,
        stats: StorageStats::new(),
    };
    (buckets, outages)
}

#[tokio::test]
async fn test_buckets_unreachable_bucket_is_held_until_its_id_is_verified() {
    let (a, b, c, d, meta) = (
        Arc::new(InMemory::new()),
        Arc::new(InMemory::new()),
        Arc::new(InMemory::new()),
        Arc::new(InMemory::new()),
        Arc::new(InMemory::new()),
    );
    let (first, _) = buckets_over(
        &[
            ("s3://a", &a, false),
            ("s3://b", &b, false),
            ("s3://c", &c, false),
        ],
        &meta,
    );
    assert!(first.verify().await.unwrap().is_none());

    // b is down at the next start: held, out of every request, until it answers.
    let (second, outages) = buckets_over(
        &[
            ("s3://a", &a, false),
            ("s3://b", &b, true),
            ("s3://c", &c, false),
        ],
        &meta,
    );
    let mut pending = second.verify().await.unwrap().expect("b is pending");
    assert!(second.ingest[1].hold.is_held());
    let err = second.ingest[1]
        .store
        .put(&object_store::path::Path::from("x"), "x".into())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("held out of use"), "{err}");
    assert!(!pending.check_once().await, "still down");
    outages[0].set_outage(false);
    assert!(pending.check_once().await);
    assert!(!second.ingest[1].hold.is_held());
    second.ingest[1]
        .store
        .put(&object_store::path::Path::from("x"), "x".into())
        .await
        .unwrap();

    // A new bucket d configured in b's place while d is down passes the startup check (nothing
    // contradicts it yet), but once d answers its id does not match holder #1: it stays held.
    let (third, outages) = buckets_over(
        &[
            ("s3://a", &a, false),
            ("s3://d", &d, true),
            ("s3://c", &c, false),
        ],
        &meta,
    );
    let mut pending = third.verify().await.unwrap().expect("d is pending");
    outages[0].set_outage(false);
    assert!(!pending.check_once().await);
    assert!(
        third.ingest[1].hold.is_held(),
        "a wrong bucket was released"
    );
    assert!(third.ingest[1]
        .store
        .put(&object_store::path::Path::from("y"), "y".into())
        .await
        .is_err());
    assert!(d.head(&object_store::path::Path::from("y")).await.is_err());
}

/// Real zonal buckets get their cloud's appendable client, built from the same options as
/// their object view (nothing is sent: the endpoints are closed loopback ports).
#[tokio::test]
async fn test_buckets_zonal_cloud_buckets_get_their_appendable_clients() {
    let config = config_from_flags(&[
        "--ingest-bucket",
        "s3://weir--use1-az4--x-s3/pre?region=us-east-1&endpoint=http://127.0.0.1:1&allow_http=true&access_key_id=k&secret_access_key=s",
        "--ingest-bucket",
        "gs://weir-zonal/pre?rapid=true&skip_signature=true&grpc_endpoint=http://127.0.0.1:1",
        "--ingest-bucket",
        "gs://weir-regional?skip_signature=true",
        "--ingest-bucket",
        "gs://weir-zonal-b?rapid=true&skip_signature=true&grpc_endpoint=http://127.0.0.1:1",
        "--quorum",
        "3",
    ])
    .unwrap();
    let buckets = Buckets::open(&config, 1).await.unwrap();
    let views: Vec<String> = buckets
        .ingest
        .iter()
        .map(|b| format!("{:?}", b.appendable))
        .collect();
    assert!(views[0].contains("S3ExpressAppend"), "{}", views[0]);
    assert!(
        views[0].contains("weir--use1-az4--x-s3") && views[0].contains("pre/"),
        "{}",
        views[0]
    );
    assert!(views[1].contains("GcsRapid"), "{}", views[1]);
    assert!(views[1].contains("pre/"), "{}", views[1]);
    assert_eq!(views[2], "None", "a regional bucket cannot append");
    let objects = format!("{:?}", buckets.ingest[3].direct);
    assert!(objects.contains("RapidObjects"), "{objects}");
    // Not every bucket can append, so the data path cannot use appends.
    assert!(buckets.ingest_appendable().is_none());

    let err = open_error(&["--ingest-bucket", "gs://weir-zonal?rapid=perhaps"]).await;
    assert!(
        err.contains("gs://weir-zonal") && err.contains("rapid"),
        "{err}"
    );
    let err = open_error(&[
        "--ingest-bucket",
        "gs://weir-zonal?rapid=true&service_account_key=nope",
    ])
    .await;
    assert!(err.contains("gs://weir-zonal"), "{err}");
}

/// Where compacted files go when `storage.compacted_bucket` is empty: beside the first local
/// ingest bucket, in memory for memory buckets, nowhere (compaction off) for cloud buckets.
#[test]
fn test_buckets_compacted_bucket_defaults() {
    let url = |flags: &[&str]| {
        let config = config_from_flags(flags).unwrap();
        let ingest = if config.storage.ingest_buckets.is_empty() {
            vec!["file:///data/bucket".to_string()]
        } else {
            config.storage.ingest_buckets.clone()
        };
        compacted_url(&config, &ingest).unwrap()
    };
    assert_eq!(url(&[]).as_deref(), Some("file:///data/compacted"));
    assert_eq!(
        url(&[
            "--ingest-bucket",
            "file:///d/b0",
            "--ingest-bucket",
            "file:///d/b1"
        ])
        .as_deref(),
        Some("file:///d/compacted")
    );
    assert_eq!(
        url(&["--ingest-bucket", "memory://a"]).as_deref(),
        Some("memory://compacted")
    );
    assert_eq!(
        url(&["--ingest-bucket", "s3://zonal--use1-az4--x-s3"]),
        None
    );
    assert_eq!(
        url(&[
            "--ingest-bucket",
            "s3://zonal--use1-az4--x-s3",
            "--compacted-bucket",
            "s3://regional"
        ])
        .as_deref(),
        Some("s3://regional")
    );
}
