//! The real SDK client against the in-memory S3 Express bucket of `fake.rs`; nothing here
//! reaches the network (one test dials a closed loopback port).

use bytes::Bytes;
use object_store::path::Path;
use weir_storage::append::{conformance, AppendLimits, AppendWriter, AppendableStore};
use weir_storage::StorageError;

use crate::fake::{test_config, FakeS3Express, Fault, Seen, BUCKET};
use crate::S3ExpressAppend;

fn store(fake: &FakeS3Express, retries: bool) -> S3ExpressAppend {
    S3ExpressAppend::new(fake.client(retries), BUCKET, None)
}

fn puts(fake: &FakeS3Express) -> Vec<Seen> {
    fake.seen()
        .into_iter()
        .filter(|s| s.method == "PUT")
        .collect()
}

async fn writer_with(
    store: &S3ExpressAppend,
    name: &str,
    data: &'static [u8],
) -> Box<dyn AppendWriter> {
    let mut writer = store.create(&Path::from(name)).await.expect("create");
    writer
        .append(0, Bytes::from_static(data))
        .await
        .expect("append");
    writer
}

fn is_object_store(err: &StorageError, want: fn(&object_store::Error) -> bool) -> bool {
    matches!(err, StorageError::ObjectStore(e) if want(e))
}

#[tokio::test]
async fn test_conformance_on_an_in_memory_express_bucket() {
    let fake = FakeS3Express::new();
    conformance::run(&store(&fake, true), None).await;
    // Every data request carried the session token (the bucket refuses others), and the SDK
    // reused one session for all of them.
    assert_eq!(fake.sessions(), 1);
    assert!(fake.seen().len() > 20, "the suite went through the client");
}

#[tokio::test]
async fn test_conformance_under_a_prefix_keeps_keys_under_it() {
    let fake = FakeS3Express::new();
    let store = S3ExpressAppend::new(fake.client(true), BUCKET, Some("/tenant/a/"));
    conformance::run(&store, None).await;
    assert_eq!(
        fake.object("tenant/a/conformance/flush").as_deref(),
        Some(&b"hello world!"[..])
    );
    assert_eq!(fake.object("conformance/flush"), None);
}

#[tokio::test]
async fn test_requests_carry_create_only_write_offset_and_session_headers() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    let path = Path::from("ingest/a b+c.weir");
    let mut writer = store.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"hello "))
        .await
        .unwrap();
    writer
        .append(6, Bytes::from_static(b"world"))
        .await
        .unwrap();
    assert_eq!(writer.flush().await.unwrap(), 11);
    writer.append(11, Bytes::from_static(b"!")).await.unwrap();
    assert_eq!(writer.flush().await.unwrap(), 12);

    let puts = puts(&fake);
    assert_eq!(puts.len(), 3, "one create, one PutObject per flush");
    let (create, first, second) = (&puts[0], &puts[1], &puts[2]);
    assert_eq!(
        create.key, "ingest/a b+c.weir",
        "the key survives the SDK's encoding"
    );
    assert_eq!(create.header("if-none-match"), Some("*"));
    assert_eq!(create.header("content-length"), Some("0"));
    assert_eq!(create.header("x-amz-write-offset-bytes"), None);
    assert_eq!(first.header("x-amz-write-offset-bytes"), Some("0"));
    assert_eq!(first.header("content-length"), Some("11"));
    assert_eq!(first.body, b"hello world", "both appends in one request");
    assert_eq!(first.header("if-none-match"), None);
    assert_eq!(second.header("x-amz-write-offset-bytes"), Some("11"));
    assert_eq!(second.body, b"!");
    for put in &puts {
        assert!(put.header("x-amz-s3session-token").is_some());
        let auth = put.header("authorization").unwrap_or_default();
        assert!(
            auth.contains("Credential=ASIAWEIRTEST/") && auth.contains("/s3express/"),
            "signed with the session's key for s3express: {auth}"
        );
    }
    assert_eq!(
        fake.object("ingest/a b+c.weir").as_deref(),
        Some(&b"hello world!"[..])
    );
}

#[tokio::test]
async fn test_error_answers_to_a_flush_map_and_break_the_writer() {
    type Check = fn(&StorageError) -> bool;
    let fenced: Check = |e| matches!(e, StorageError::Fenced { .. });
    let full: Check = |e| matches!(e, StorageError::ObjectFull { .. });
    let not_found: Check =
        |e| is_object_store(e, |e| matches!(e, object_store::Error::NotFound { .. }));
    let denied: Check = |e| {
        is_object_store(e, |e| {
            matches!(e, object_store::Error::PermissionDenied { .. })
        })
    };
    let unauthenticated: Check = |e| {
        is_object_store(e, |e| {
            matches!(e, object_store::Error::Unauthenticated { .. })
        })
    };
    let generic: Check =
        |e| is_object_store(e, |e| matches!(e, object_store::Error::Generic { .. }));
    let not_implemented: Check = |e| {
        is_object_store(e, |e| {
            matches!(e, object_store::Error::NotImplemented { .. })
        })
    };
    let not_supported: Check =
        |e| is_object_store(e, |e| matches!(e, object_store::Error::NotSupported { .. }));
    let cases: [(Fault, Check, bool); 12] = [
        (Fault::Answer(400, "InvalidWriteOffset"), fenced, false),
        (Fault::Answer(412, "PreconditionFailed"), fenced, false),
        (
            Fault::Answer(409, "ConditionalRequestConflict"),
            fenced,
            false,
        ),
        (Fault::Answer(404, "NoSuchKey"), not_found, false),
        (Fault::Answer(400, "TooManyParts"), full, false),
        (Fault::Answer(401, "Unauthorized"), unauthenticated, false),
        (Fault::Answer(403, "AccessDenied"), denied, false),
        (Fault::Answer(500, "InternalError"), generic, true),
        (Fault::Answer(503, "SlowDown"), generic, true),
        (Fault::Answer(400, "RequestTimeout"), generic, true),
        (Fault::Answer(501, "NotImplemented"), not_implemented, false),
        (Fault::Answer(400, "InvalidRequest"), not_supported, false),
    ];
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    for (i, (fault, check, retryable)) in cases
        .into_iter()
        .chain([(Fault::Refuse, generic, true)])
        .enumerate()
    {
        let mut writer = writer_with(&store, &format!("errors/{i}"), b"abc").await;
        fake.inject(fault);
        let err = writer.flush().await.expect_err("injected");
        assert!(check(&err), "{fault:?}: {err}");
        assert_eq!(err.is_retryable(), retryable, "{fault:?}: {err}");
        // Broken: nothing more is sent for it.
        let before = fake.seen().len();
        let again = writer.append(3, Bytes::from_static(b"d")).await;
        assert!(
            matches!(again, Err(StorageError::Fenced { .. })),
            "{fault:?}"
        );
        assert!(writer.flush().await.is_err());
        assert_eq!(fake.seen().len(), before, "{fault:?}");
    }
}

#[tokio::test]
async fn test_error_answers_to_create_stat_and_read_map() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    let path = Path::from("other/errors");
    fake.inject(Fault::Answer(503, "SlowDown"));
    let err = store.create(&path).await.expect_err("injected");
    assert!(err.is_retryable(), "{err}");
    let mut writer = store
        .create(&path)
        .await
        .expect("create after a transient error");
    writer
        .append(0, Bytes::from_static(b"12345"))
        .await
        .unwrap();
    writer.flush().await.unwrap();

    fake.inject(Fault::Answer(403, "AccessDenied"));
    let err = store.stat(&path).await.expect_err("injected");
    assert!(
        is_object_store(&err, |e| matches!(
            e,
            object_store::Error::PermissionDenied { .. }
        )),
        "{err}"
    );
    fake.inject(Fault::Answer(500, "InternalError"));
    assert!(store
        .takeover(&path)
        .await
        .expect_err("injected")
        .is_retryable());
    fake.inject(Fault::Answer(500, "InternalError"));
    assert!(store
        .read(&path, 0..2)
        .await
        .expect_err("injected")
        .is_retryable());

    // Ranges: S3 answers 416 from the end on and a short body for one that runs past it.
    assert_eq!(&store.read(&path, 1..5).await.unwrap()[..], b"2345");
    assert_eq!(store.read(&path, 5..5).await.unwrap().len(), 0);
    for past in [5..6, 3..6, 6..6] {
        let err = store
            .read(&path, past.clone())
            .await
            .expect_err("past the end");
        assert!(
            matches!(err, StorageError::InvalidConfig(_)),
            "{past:?}: {err}"
        );
        assert!(!err.is_retryable());
    }
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = store.read(&path, 3..2).await;
    assert!(backwards.is_err());
    let missing = store
        .read(&Path::from("missing"), 0..1)
        .await
        .expect_err("missing");
    assert!(is_object_store(&missing, |e| matches!(
        e,
        object_store::Error::NotFound { .. }
    )));
}

#[tokio::test]
async fn test_an_append_whose_answer_is_lost_is_found_by_a_takeover() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    let mut writer = writer_with(&store, "lost/answer", b"landed").await;
    fake.inject(Fault::LoseAnswer);
    let err = writer.flush().await.expect_err("answer lost");
    assert!(err.is_retryable(), "{err}");
    assert!(writer.flush().await.is_err(), "broken");
    let resumed = store.takeover(&Path::from("lost/answer")).await.unwrap();
    assert_eq!(resumed.offset(), 6, "the bytes landed");
}

#[tokio::test]
async fn test_sdk_retries_of_an_append() {
    let fake = FakeS3Express::new();
    let store = store(&fake, true);
    // A throttled append is retried at the same offset and lands once.
    let mut writer = writer_with(&store, "retry/throttled", b"once").await;
    fake.inject(Fault::Answer(503, "SlowDown"));
    assert_eq!(writer.flush().await.unwrap(), 4);
    assert_eq!(
        fake.object("retry/throttled").as_deref(),
        Some(&b"once"[..])
    );
    assert_eq!(puts(&fake).len(), 3, "create, throttled append, its retry");

    // An append that landed but lost its answer is retried at the same offset, which S3
    // refuses: the flush says fenced although its own bytes landed (see the crate docs).
    let mut writer = writer_with(&store, "retry/lost", b"landed").await;
    fake.inject(Fault::LoseAnswer);
    let err = writer.flush().await.expect_err("retry refused");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert_eq!(fake.object("retry/lost").as_deref(), Some(&b"landed"[..]));
}

#[tokio::test]
async fn test_append_count_limit_is_checked_before_sending() {
    let fake = FakeS3Express::new();
    let limits = AppendLimits {
        max_appends: 2,
        ..AppendLimits::S3_EXPRESS
    };
    let store = store(&fake, false).with_limits(limits, 16);
    let mut writer = store.create(&Path::from("limit")).await.unwrap();
    for i in 0..2 {
        writer.append(i, Bytes::from_static(b"x")).await.unwrap();
        writer.flush().await.unwrap();
    }
    writer.append(2, Bytes::from_static(b"y")).await.unwrap();
    let sent = puts(&fake).len();
    let err = writer.flush().await.expect_err("limit");
    assert!(matches!(err, StorageError::ObjectFull { .. }), "{err}");
    assert_eq!(puts(&fake).len(), sent, "nothing sent past the limit");
    let held = writer.append(3, Bytes::from(vec![0; 8])).await;
    assert!(
        held.is_ok(),
        "the refused flush left the writer usable; appends are not flushes"
    );
}

#[tokio::test]
async fn test_part_limit_of_the_bucket_is_object_full() {
    let fake = FakeS3Express::new();
    fake.set_max_parts(2);
    let store = store(&fake, false);
    // The create is part 1 (as the fake counts), the first append part 2.
    let mut writer = writer_with(&store, "parts", b"a").await;
    writer.flush().await.unwrap();
    writer.append(1, Bytes::from_static(b"b")).await.unwrap();
    let err = writer.flush().await.expect_err("TooManyParts");
    assert!(matches!(err, StorageError::ObjectFull { .. }), "{err}");
}

#[tokio::test]
async fn test_object_size_answer_that_disagrees_breaks_the_writer() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    let mut writer = writer_with(&store, "size/answer", b"abc").await;
    fake.inject(Fault::ReportSize(999));
    let err = writer.flush().await.expect_err("size mismatch");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert!(writer.flush().await.is_err());
}

#[tokio::test]
async fn test_finalized_record_is_local_and_bounded() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false).with_limits(AppendLimits::S3_EXPRESS, 2);
    for name in ["f/1", "f/2", "f/3"] {
        let writer = writer_with(&store, name, b"sealed").await;
        assert_eq!(writer.finalize().await.unwrap(), 6);
    }
    let meta = store.stat(&Path::from("f/3")).await.unwrap();
    assert_eq!((meta.size, meta.finalized, meta.generation), (6, true, 0));
    assert!(matches!(
        store.takeover(&Path::from("f/2")).await,
        Err(StorageError::Fenced { .. })
    ));
    // The oldest key aged out of the record: an ordinary open object again.
    assert!(!store.stat(&Path::from("f/1")).await.unwrap().finalized);
    assert!(store.takeover(&Path::from("f/1")).await.is_ok());
    // Another process knows nothing of this one's finalizes.
    let other = S3ExpressAppend::new(fake.client(false), BUCKET, None);
    assert!(!other.stat(&Path::from("f/3")).await.unwrap().finalized);
    let mut late = other.takeover(&Path::from("f/3")).await.unwrap();
    late.append(6, Bytes::from_static(b"!")).await.unwrap();
    assert_eq!(late.flush().await.unwrap(), 7);
}

#[tokio::test]
async fn test_finalize_with_nothing_held_checks_the_offset() {
    let fake = FakeS3Express::new();
    let store = store(&fake, false);
    let path = Path::from("finalize/fenced");
    let mut old = writer_with(&store, "finalize/fenced", b"one").await;
    old.flush().await.unwrap();
    let mut new = store.takeover(&path).await.unwrap();
    new.append(3, Bytes::from_static(b"two")).await.unwrap();
    new.flush().await.unwrap();
    let err = old.finalize().await.expect_err("another writer appended");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert!(!store.stat(&path).await.unwrap().finalized);
    // The key stays taken after a finalize; once deleted, a new object under it is open.
    assert_eq!(new.finalize().await.unwrap(), 6);
    assert!(store.create(&path).await.is_err());
    fake.remove("finalize/fenced");
    let fresh = store.create(&path).await.expect("create after a delete");
    assert!(!store.stat(&path).await.unwrap().finalized);
    fresh.close().await.unwrap();
}

#[tokio::test]
async fn test_refused_connection_through_the_default_https_client_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    // No http_client: the SDK's default (hyper 1 + rustls) client.
    let config = test_config(&format!("http://127.0.0.1:{port}"), false).build();
    let store = S3ExpressAppend::new(aws_sdk_s3::Client::from_conf(config), BUCKET, None);
    let err = store
        .create(&Path::from("refused"))
        .await
        .expect_err("closed port");
    assert!(
        is_object_store(&err, |e| matches!(e, object_store::Error::Generic { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("dispatch failure"), "{err}");
    assert!(err.is_retryable());
}

/// The client the agent builds signs with `object_store`'s credentials for the bucket: the
/// session is created with its key id, and every append then carries the session's token.
#[tokio::test]
async fn test_connect_client_signs_with_object_store_credentials() {
    use object_store::aws::AwsCredential;
    use object_store::StaticCredentialProvider;
    use std::sync::Arc;

    let fake = FakeS3Express::new();
    let settings = crate::connect::Settings {
        region: "us-east-1".to_string(),
        endpoint: Some(crate::fake::ENDPOINT.to_string()),
        credentials: Arc::new(StaticCredentialProvider::new(AwsCredential {
            key_id: "AKIDFROMOBJECTSTORE".to_string(),
            secret_key: "shared-secret".to_string(),
            token: None,
        })),
    };
    let client = fake.client_with(crate::connect::config(&settings));
    let store = S3ExpressAppend::new(client, BUCKET, Some("p"));
    let mut writer = writer_with(&store, "connect/one", b"bytes").await;
    assert_eq!(writer.flush().await.unwrap(), 5);
    assert_eq!(fake.object("p/connect/one").as_deref(), Some(&b"bytes"[..]));
    let seen = fake.seen();
    let session = seen
        .iter()
        .find(|s| s.key.is_empty())
        .expect("CreateSession");
    let auth = session.header("authorization").expect("signed");
    assert!(
        auth.contains("Credential=AKIDFROMOBJECTSTORE/"),
        "CreateSession signed with object_store's key: {auth}"
    );
    assert_eq!(fake.sessions(), 1);
}
