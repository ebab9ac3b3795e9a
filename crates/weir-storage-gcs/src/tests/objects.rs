//! The object view of a Rapid bucket ([`RapidObjects`]) and the client settings of
//! [`crate::connect`], against the in-memory bucket of [`crate::fake`].

use std::sync::Arc;

use bytes::Bytes;
use google_cloud_storage::client::Storage;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use weir_storage::append::AppendableStore;
use weir_storage::StorageError;

use crate::connect::{self, GcsCredentials, Settings};
use crate::fake::FakeRapid;
use crate::{GcsRapid, RapidObjects};

fn objects() -> (RapidObjects<FakeRapid>, GcsRapid<FakeRapid>, Arc<InMemory>) {
    let bucket = FakeRapid::new("rapid");
    let rapid = GcsRapid::new("rapid", Storage::from_stub(bucket)).expect("bucket name");
    let listing = Arc::new(InMemory::new());
    let view = RapidObjects::new(rapid.clone(), listing.clone());
    (view, rapid, listing)
}

fn put_mode(mode: PutMode) -> PutOptions {
    PutOptions {
        mode,
        ..PutOptions::default()
    }
}

#[tokio::test]
async fn test_rapid_objects_put_modes_are_generation_preconditions() {
    let (view, _, _) = objects();
    let path = Path::from("meta/log/0001");
    let first = view
        .put_opts(
            &path,
            PutPayload::from_static(b"one"),
            put_mode(PutMode::Create),
        )
        .await
        .expect("create");
    let err = view
        .put_opts(
            &path,
            PutPayload::from_static(b"two"),
            put_mode(PutMode::Create),
        )
        .await
        .expect_err("create-only");
    assert!(
        matches!(err, object_store::Error::AlreadyExists { .. }),
        "{err}"
    );
    assert_eq!(
        &view.get(&path).await.unwrap().bytes().await.unwrap()[..],
        b"one"
    );

    // Compare-and-set on the generation: the current one wins once, a stale one is refused.
    let update = |version: Option<String>| {
        put_mode(PutMode::Update(UpdateVersion {
            e_tag: None,
            version,
        }))
    };
    let second = view
        .put_opts(
            &path,
            PutPayload::from_static(b"three"),
            update(first.version.clone()),
        )
        .await
        .expect("update at the current generation");
    assert_ne!(second.version, first.version);
    let err = view
        .put_opts(
            &path,
            PutPayload::from_static(b"four"),
            update(first.version),
        )
        .await
        .expect_err("stale generation");
    assert!(
        matches!(err, object_store::Error::Precondition { .. }),
        "{err}"
    );
    let err = view
        .put_opts(&path, PutPayload::from_static(b"four"), update(None))
        .await
        .expect_err("no generation");
    assert!(
        matches!(err, object_store::Error::Precondition { .. }),
        "{err}"
    );

    view.put_opts(
        &path,
        PutPayload::from_static(b"five"),
        put_mode(PutMode::Overwrite),
    )
    .await
    .expect("overwrite");
    let meta = view.head(&path).await.unwrap();
    assert_eq!(meta.size, 4);
    assert_eq!(meta.location, path);
    assert_eq!(&view.get_range(&path, 1..3).await.unwrap()[..], b"iv");
    let err = view.get(&Path::from("missing")).await.expect_err("missing");
    assert!(matches!(err, object_store::Error::NotFound { .. }), "{err}");
}

/// A file appended (not finalized) through the prefixed appendable view reads through the
/// object view under the same prefix, flushed bytes only.
#[tokio::test]
async fn test_rapid_objects_read_open_appendable_objects_under_one_prefix() {
    let (view, rapid, _) = objects();
    let appendable = rapid.clone().with_prefix("/tenant/");
    let view = PrefixStore::new(view, "tenant");
    let path = Path::from("ingest/f1");
    let mut writer = appendable.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"batch-1"))
        .await
        .unwrap();
    assert_eq!(writer.flush().await.unwrap(), 7);
    writer.append(7, Bytes::from_static(b"held")).await.unwrap();
    let got = view.get(&path).await.expect("read an open object");
    assert_eq!(got.meta.size, 7);
    assert_eq!(&got.bytes().await.unwrap()[..], b"batch-1");
    // The unprefixed name does not exist; the prefixed one does.
    assert!(rapid.stat(&path).await.is_err());
    assert_eq!(
        rapid
            .stat(&Path::from("tenant/ingest/f1"))
            .await
            .unwrap()
            .size,
        7
    );
    // Preconditions on reads are checked against the object's etag/generation metadata.
    let head = view.head(&path).await.unwrap();
    let stale = GetOptions {
        if_none_match: head.e_tag.clone().or(Some("*".to_string())),
        ..GetOptions::default()
    };
    assert!(view.get_opts(&path, stale).await.is_err());
}

#[tokio::test]
async fn test_rapid_objects_list_and_delete_go_to_the_listing_store() {
    let (view, _, listing) = objects();
    let path = Path::from("ingest/listed");
    listing
        .put(&path, PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let listed: Vec<_> = futures::StreamExt::collect::<Vec<_>>(view.list(None)).await;
    assert_eq!(listed.len(), 1);
    view.delete(&path).await.unwrap();
    assert!(listing.head(&path).await.is_err());
    let err = view
        .put_multipart(&path)
        .await
        .expect_err("no multipart to a zonal bucket");
    assert!(
        matches!(err, object_store::Error::NotSupported { .. }),
        "{err}"
    );
}

#[test]
fn test_connect_credentials_refuse_what_is_not_a_service_account_key() {
    let err = connect::credentials(&GcsCredentials::ServiceAccountKey("{".into())).unwrap_err();
    assert!(matches!(err, StorageError::InvalidConfig(_)), "{err}");
    let user = r#"{"type": "authorized_user", "client_id": "x"}"#;
    let err = connect::credentials(&GcsCredentials::ServiceAccountKey(user.into())).unwrap_err();
    assert!(
        err.to_string().contains("not a service account key"),
        "{err}"
    );
    let missing = GcsCredentials::ServiceAccountFile("/nonexistent/weir-key.json".into());
    let err = connect::credentials(&missing).unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/weir-key.json"),
        "{err}"
    );
    // The key's secrets never reach a Debug line.
    let key = GcsCredentials::ServiceAccountKey("secret-json".into());
    assert!(!format!("{key:?}").contains("secret-json"));
}

/// The client the agent builds goes to the configured endpoint with the configured attempts:
/// against a closed loopback port the create and the read come back retryable, and the object
/// view maps the failure to a transient `object_store` error.
#[tokio::test]
async fn test_connect_client_reaches_only_its_endpoint() {
    let mut settings = Settings::new(GcsCredentials::Anonymous);
    settings.endpoint = Some("http://127.0.0.1:1".to_string());
    settings.attempts = 1;
    let client = connect::client(&settings).await.expect("client");
    let rapid = GcsRapid::new("rapid", client).expect("bucket name");
    let err = rapid
        .create(&Path::from("x"))
        .await
        .expect_err("nothing listens");
    assert!(err.is_retryable(), "{err}");
    let view = RapidObjects::new(rapid, Arc::new(InMemory::new()));
    let err = view
        .head(&Path::from("x"))
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, object_store::Error::Generic { .. }), "{err}");
}
