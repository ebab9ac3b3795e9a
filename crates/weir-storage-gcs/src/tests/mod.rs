//! [`GcsRapid`] through the real client API, against the in-memory bucket of [`crate::fake`].

use std::time::Duration;

use bytes::Bytes;
use google_cloud_gax::error::rpc::Code;
use google_cloud_storage::client::Storage;
use object_store::path::Path;
use weir_storage::append::{conformance, AppendLimits, AppendableStore, FenceKind};
use weir_storage::StorageError;

use crate::fake::FakeRapid;
use crate::GcsRapid;

fn store() -> (GcsRapid<FakeRapid>, FakeRapid) {
    let bucket = FakeRapid::new("rapid");
    let store = GcsRapid::new("rapid", Storage::from_stub(bucket.clone())).expect("bucket name");
    (store, bucket)
}

fn is_fenced(err: &StorageError) -> bool {
    matches!(err, StorageError::Fenced { .. })
}

#[tokio::test]
async fn test_gcs_rapid_conformance_through_the_client() {
    let (store, _) = store();
    assert_eq!(store.fence(), FenceKind::Generation);
    assert_eq!(store.limits(), AppendLimits::GCS_RAPID);
    conformance::run(&store, None).await;
}

#[test]
fn test_gcs_rapid_bucket_names() {
    let client = || Storage::from_stub(FakeRapid::new("b"));
    for name in ["b", "projects/_/buckets/b"] {
        let store = GcsRapid::new(name, client()).expect(name);
        assert_eq!(store.bucket(), "projects/_/buckets/b");
    }
    for name in ["", "projects/_/buckets/", "a/b", "projects/p/buckets/b"] {
        let err = GcsRapid::new(name, client()).expect_err(name);
        assert!(
            matches!(err, StorageError::InvalidConfig(_)),
            "{name}: {err}"
        );
    }
}

#[tokio::test]
async fn test_gcs_rapid_requests_carry_the_preconditions() {
    let (store, bucket) = store();
    let path = Path::from("ingest/one");
    let writer = store.create(&path).await.expect("create");
    let opens = bucket.opens();
    let spec = &opens.last().expect("one open").spec;
    assert_eq!(spec.if_generation_match, Some(0), "create is create-only");
    assert_eq!(spec.appendable, Some(true));
    let resource = spec.resource.as_ref().expect("resource");
    assert_eq!(resource.bucket, "projects/_/buckets/rapid");
    assert_eq!(resource.name, "ingest/one");
    writer.close().await.expect("close");

    let generation = store.stat(&path).await.expect("stat").generation;
    let taken = store.takeover(&path).await.expect("takeover");
    let reopen = bucket.reopens().pop().expect("one reopen");
    assert_eq!(reopen.object, "ingest/one");
    assert_eq!(reopen.write_handle, None, "a takeover, not a resume");
    assert!(reopen.generation > 0, "the object's generation names it");
    assert_eq!(
        reopen.generation as u64, generation,
        "the takeover reopens the object's current generation"
    );
    assert_eq!(
        taken.generation(),
        generation,
        "a takeover keeps the generation"
    );
}

#[tokio::test]
async fn test_gcs_rapid_lost_flush_answer_breaks_the_writer() {
    let (store, bucket) = store();
    let path = Path::from("lost-answer");
    let mut writer = store.create(&path).await.expect("create");
    writer.append(0, Bytes::from_static(b"abc")).await.unwrap();
    bucket.fail_next_flush(Code::Unavailable, true);
    let err = writer.flush().await.expect_err("injected");
    assert!(err.is_retryable(), "{err}");
    // Broken: every later call fails, fenced, whatever happened to the bytes.
    assert!(is_fenced(
        &writer
            .append(0, Bytes::from_static(b"x"))
            .await
            .unwrap_err()
    ));
    assert!(is_fenced(&writer.flush().await.unwrap_err()));
    writer.close().await.expect("a broken writer closes");
    // The bytes landed; only a takeover learns it.
    let resumed = store.takeover(&path).await.expect("takeover");
    assert_eq!(resumed.offset(), 3);
}

#[tokio::test]
async fn test_gcs_rapid_failed_flush_that_did_not_land() {
    let (store, bucket) = store();
    let path = Path::from("not-landed");
    let mut writer = store.create(&path).await.expect("create");
    writer.append(0, Bytes::from_static(b"abc")).await.unwrap();
    bucket.fail_next_flush(Code::Internal, false);
    assert!(writer.flush().await.expect_err("injected").is_retryable());
    let err = writer.finalize().await.expect_err("broken");
    assert!(is_fenced(&err), "{err}");
    let mut resumed = store.takeover(&path).await.expect("takeover");
    assert_eq!(resumed.offset(), 0);
    resumed.append(0, Bytes::from_static(b"abc")).await.unwrap();
    assert_eq!(resumed.flush().await.expect("flush"), 3);
}

#[tokio::test]
async fn test_gcs_rapid_deleted_object_is_not_found() {
    let (store, bucket) = store();
    let path = Path::from("deleted");
    let mut writer = store.create(&path).await.expect("create");
    bucket.delete("deleted");
    writer.append(0, Bytes::from_static(b"abc")).await.unwrap();
    let err = writer.flush().await.expect_err("deleted");
    assert!(
        matches!(
            err,
            StorageError::ObjectStore(object_store::Error::NotFound { .. })
        ),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert!(store.stat(&path).await.is_err());
}

#[tokio::test]
async fn test_gcs_rapid_limits() {
    let (store, _) = store();
    let limits = AppendLimits {
        max_bytes: 4,
        max_appends: 2,
        max_age: Duration::from_secs(60),
    };
    let store = store.with_limits(limits);
    let mut writer = store.create(&Path::from("limits")).await.expect("create");
    let err = writer.append(0, Bytes::from_static(b"12345")).await;
    assert!(matches!(err, Err(StorageError::ObjectFull { .. })));
    for i in 0..2u64 {
        writer.append(i, Bytes::from_static(b"x")).await.unwrap();
        writer.flush().await.expect("flush");
    }
    writer.append(2, Bytes::from_static(b"y")).await.unwrap();
    let err = writer.flush().await.expect_err("third append");
    assert!(matches!(err, StorageError::ObjectFull { .. }), "{err}");
    // Full is not broken: nothing was sent.
    assert_eq!(writer.persisted(), 2);
}

#[tokio::test]
async fn test_gcs_rapid_reads() {
    let (store, _) = store();
    let path = Path::from("reads");
    let mut writer = store.create(&path).await.expect("create");
    writer.append(0, Bytes::from_static(b"0123")).await.unwrap();
    writer.append(4, Bytes::from_static(b"4567")).await.unwrap();
    writer.flush().await.expect("flush");
    assert_eq!(&store.read(&path, 2..6).await.expect("read")[..], b"2345");
    assert_eq!(
        &store.read(&path, 0..8).await.expect("read")[..],
        b"01234567"
    );
    // An empty range is empty, not "to the end" (a zero read limit means no limit).
    assert!(store.read(&path, 8..8).await.expect("empty").is_empty());
    assert!(store.read(&path, 9..9).await.is_err(), "past the end");
    let missing = store.read(&Path::from("missing"), 0..1).await.unwrap_err();
    assert!(!missing.is_retryable(), "{missing}");
}

/// The real gRPC transport (no stub), dialling a loopback port where nothing listens: the
/// bidi-enabled client builds, a create goes through the client's own connect path, and the
/// failure comes back retryable. Nothing leaves the machine (anonymous credentials, loopback).
#[tokio::test]
async fn test_gcs_rapid_real_transport_unreachable_is_transient() {
    use google_cloud_auth::credentials::anonymous::Builder as Anonymous;
    use google_cloud_gax::retry_policy::NeverRetry;

    let client = Storage::builder()
        .with_endpoint("http://127.0.0.1:1")
        .with_credentials(Anonymous::new().build())
        .with_retry_policy(NeverRetry)
        .build()
        .await
        .expect("client");
    let store = GcsRapid::new("rapid", client).expect("bucket name");
    let err = store
        .create(&Path::from("x"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_retryable(), "{err}");
    let err = store
        .stat(&Path::from("x"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_retryable(), "{err}");
}

mod objects;
