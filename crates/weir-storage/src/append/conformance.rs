//! The conformance suite every [`AppendableStore`] passes: the in-memory double under both fence
//! kinds, the model and layer wrappers over it, and the GCS Rapid client driven through its own
//! mocking interface. Built for tests and behind the `conformance` feature for other crates.
//!
//! Each check uses its own keys under `conformance/`, so the suite runs on any empty bucket.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{AppendableStore, FenceKind};
use crate::StorageError;

/// Runs every check against `store`; `objects` is the same bucket's [`ObjectStore`] view when
/// the backend has one (GETs and LISTs of open objects are then checked too).
pub async fn run(store: &dyn AppendableStore, objects: Option<Arc<dyn ObjectStore>>) {
    create_is_exclusive_and_visible(store, objects.as_deref()).await;
    flushed_bytes_are_readable(store, objects.as_deref()).await;
    append_checks_its_offset(store).await;
    takeover_fences_the_old_writer(store).await;
    unflushed_bytes_are_lost_on_close(store).await;
    finalize_seals(store, objects.as_deref()).await;
    takeover_of_missing_object_is_not_found(store).await;
}

fn key(name: &str) -> Path {
    Path::from(format!("conformance/{name}"))
}

fn is_already_exists(err: &StorageError) -> bool {
    matches!(
        err,
        StorageError::ObjectStore(object_store::Error::AlreadyExists { .. })
    )
}

async fn create_is_exclusive_and_visible(
    store: &dyn AppendableStore,
    objects: Option<&dyn ObjectStore>,
) {
    let path = key("create");
    let writer = store.create(&path).await.expect("create");
    assert_eq!((writer.offset(), writer.persisted()), (0, 0));
    let meta = store.stat(&path).await.expect("stat");
    assert_eq!((meta.size, meta.finalized), (0, false));
    let err = store.create(&path).await.expect_err("second create");
    assert!(is_already_exists(&err), "second create: {err}");
    assert!(!err.is_retryable());
    if let Some(objects) = objects {
        let head = objects.head(&path).await.expect("head of an open object");
        assert_eq!(head.size, 0);
    }
    writer.close().await.expect("close");
}

async fn flushed_bytes_are_readable(
    store: &dyn AppendableStore,
    objects: Option<&dyn ObjectStore>,
) {
    let path = key("flush");
    let mut writer = store.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"hello "))
        .await
        .expect("append");
    writer
        .append(6, Bytes::from_static(b"world"))
        .await
        .expect("append");
    assert_eq!((writer.offset(), writer.persisted()), (11, 0));
    // Appended but not flushed: not there yet.
    assert_eq!(store.stat(&path).await.expect("stat").size, 0);
    assert!(store.read(&path, 0..5).await.is_err());
    assert_eq!(writer.flush().await.expect("flush"), 11);
    assert_eq!(writer.persisted(), 11);
    assert_eq!(writer.flushes(), 1);
    assert_eq!(&store.read(&path, 6..11).await.expect("read")[..], b"world");
    assert!(store.read(&path, 6..12).await.is_err(), "read past the end");
    // A flush with nothing appended is not an append.
    assert_eq!(writer.flush().await.expect("empty flush"), 11);
    assert_eq!(writer.flushes(), 1);
    writer
        .append(11, Bytes::from_static(b"!"))
        .await
        .expect("append");
    assert_eq!(writer.flush().await.expect("flush"), 12);
    if let Some(objects) = objects {
        let got = objects.get(&path).await.expect("get").bytes().await;
        assert_eq!(&got.expect("body")[..], b"hello world!");
        let range = objects.get_range(&path, 0..5).await.expect("range");
        assert_eq!(&range[..], b"hello");
        let listed = objects
            .list_with_delimiter(Some(&key("")))
            .await
            .expect("list");
        let entry = listed.objects.iter().find(|m| m.location == path);
        assert_eq!(entry.map(|m| m.size), Some(12), "listed size");
    }
    writer.close().await.expect("close");
}

async fn append_checks_its_offset(store: &dyn AppendableStore) {
    let path = key("offset");
    let mut writer = store.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"abc"))
        .await
        .expect("append");
    let err = writer
        .append(0, Bytes::from_static(b"xyz"))
        .await
        .expect_err("append over appended bytes");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    let err = writer
        .append(4, Bytes::from_static(b"xyz"))
        .await
        .expect_err("append past the end");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert_eq!(writer.flush().await.expect("flush"), 3);
    assert_eq!(&store.read(&path, 0..3).await.expect("read")[..], b"abc");
    writer.close().await.expect("close");
}

async fn takeover_fences_the_old_writer(store: &dyn AppendableStore) {
    let path = key("takeover");
    let mut old = store.create(&path).await.expect("create");
    old.append(0, Bytes::from_static(b"one"))
        .await
        .expect("append");
    old.flush().await.expect("flush");
    let mut new = store.takeover(&path).await.expect("takeover");
    assert_eq!((new.offset(), new.persisted()), (3, 3));
    if store.fence() == FenceKind::Generation {
        // Fenced at once, before the new writer wrote anything.
        old.append(3, Bytes::from_static(b"OLD"))
            .await
            .expect("buffered append");
        let err = old.flush().await.expect_err("old writer after takeover");
        assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
        assert!(!err.is_retryable());
    }
    new.append(3, Bytes::from_static(b"two"))
        .await
        .expect("append");
    assert_eq!(new.flush().await.expect("new flush"), 6);
    // Whatever the fence kind, once the new writer has appended the old one cannot.
    let attempt = async {
        old.append(old.offset(), Bytes::from_static(b"OLD")).await?;
        old.flush().await
    };
    let err = attempt
        .await
        .expect_err("old writer after the new one appended");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    // A fenced writer stays broken.
    assert!(old.flush().await.is_err());
    assert_eq!(&store.read(&path, 0..6).await.expect("read")[..], b"onetwo");
    new.close().await.expect("close");
    let _ = old.close().await;
}

async fn unflushed_bytes_are_lost_on_close(store: &dyn AppendableStore) {
    let path = key("close");
    let mut writer = store.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"kept"))
        .await
        .expect("append");
    writer.flush().await.expect("flush");
    writer
        .append(4, Bytes::from_static(b"lost"))
        .await
        .expect("append");
    writer.close().await.expect("close");
    let meta = store.stat(&path).await.expect("stat");
    assert_eq!((meta.size, meta.finalized), (4, false));
    let resumed = store.takeover(&path).await.expect("takeover after close");
    assert_eq!(resumed.offset(), 4);
    resumed.close().await.expect("close");
}

async fn finalize_seals(store: &dyn AppendableStore, objects: Option<&dyn ObjectStore>) {
    let path = key("finalize");
    let mut writer = store.create(&path).await.expect("create");
    writer
        .append(0, Bytes::from_static(b"sealed"))
        .await
        .expect("append");
    assert_eq!(writer.finalize().await.expect("finalize"), 6);
    let meta = store.stat(&path).await.expect("stat");
    assert_eq!((meta.size, meta.finalized), (6, true));
    let err = store
        .takeover(&path)
        .await
        .expect_err("takeover of a finalized object");
    assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
    assert_eq!(&store.read(&path, 0..6).await.expect("read")[..], b"sealed");
    if let Some(objects) = objects {
        let got = objects.get_range(&path, 2..6).await.expect("get");
        assert_eq!(&got[..], b"aled");
    }
}

async fn takeover_of_missing_object_is_not_found(store: &dyn AppendableStore) {
    let err = store
        .takeover(&key("missing"))
        .await
        .expect_err("takeover of nothing");
    assert!(
        matches!(
            err,
            StorageError::ObjectStore(object_store::Error::NotFound { .. })
        ),
        "{err}"
    );
}
