//! Startup checks of what a bucket must support.
//!
//! Weir's safety rests on conditional writes: metadata log slots, epochs and bucket ids are
//! create-only (`If-None-Match: *` / `ifGenerationMatch=0`), and the job queue of compaction will
//! need compare-and-set (`If-Match: <etag>`). A store that silently ignores those headers would
//! let two writers both "win" a slot and lose acknowledged data, so the agent probes every bucket
//! it writes to before it serves anything and refuses to start when a capability is missing —
//! it never runs unsafely. Probe objects live under `weir/probe/` and are deleted afterwards.

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use crate::{keys, StorageError};

/// Create-only writes, as the capability is named in errors.
pub const CREATE_ONLY: &str = "create-only writes (If-None-Match: *)";
/// Compare-and-set writes, as the capability is named in errors.
pub const COMPARE_AND_SET: &str = "compare-and-set writes (If-Match: <etag>)";

fn nonce() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn create() -> PutOptions {
    PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    }
}

fn missing(
    bucket: &str,
    capability: &'static str,
    needed_for: &'static str,
    detail: String,
) -> StorageError {
    StorageError::MissingCapability {
        bucket: bucket.to_string(),
        capability,
        detail,
        needed_for,
    }
}

async fn read(
    store: &dyn ObjectStore,
    key: &object_store::path::Path,
) -> Result<Bytes, StorageError> {
    Ok(store.get(key).await?.bytes().await?)
}

/// Checks that a second create-only write of one key fails and leaves the first one in place.
/// A first write answered "already exists" may be our own timed-out attempt that landed (the
/// layer retried it): the probe then starts over on a fresh key, up to three times.
pub async fn create_only(
    store: &dyn ObjectStore,
    bucket: &str,
    needed_for: &'static str,
) -> Result<(), StorageError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let key = keys::probe(&nonce());
        let result = probe_create_only(store, bucket, needed_for, &key).await;
        // Best effort: a leftover probe object is harmless.
        let _ = store.delete(&key).await;
        match result {
            Err(StorageError::ObjectStore(object_store::Error::AlreadyExists { .. }))
                if tries < 3 => {}
            other => return other,
        }
    }
}

async fn probe_create_only(
    store: &dyn ObjectStore,
    bucket: &str,
    needed_for: &'static str,
    key: &object_store::path::Path,
) -> Result<(), StorageError> {
    let missing = |detail: String| missing(bucket, CREATE_ONLY, needed_for, detail);
    match store
        .put_opts(key, PutPayload::from_static(b"first"), create())
        .await
    {
        Ok(_) => {}
        Err(
            object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. },
        ) => return Err(missing("the store does not implement them".into())),
        Err(e) => return Err(e.into()),
    }
    match store
        .put_opts(key, PutPayload::from_static(b"second"), create())
        .await
    {
        Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {}
        Ok(_) => {
            return Err(missing(
                "a second create-only write of one probe key succeeded (the store ignores the condition)".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    let stored = read(store, key).await?;
    if stored.as_ref() != b"first" {
        return Err(missing(format!(
            "the losing create-only write replaced the object ({:?} stored)",
            String::from_utf8_lossy(&stored)
        )));
    }
    Ok(())
}

/// Checks that an update conditional on the current version succeeds and one conditional on a
/// stale version fails.
pub async fn compare_and_set(
    store: &dyn ObjectStore,
    bucket: &str,
    needed_for: &'static str,
) -> Result<(), StorageError> {
    let key = keys::probe(&nonce());
    let result = probe_compare_and_set(store, bucket, needed_for, &key).await;
    let _ = store.delete(&key).await;
    result
}

async fn probe_compare_and_set(
    store: &dyn ObjectStore,
    bucket: &str,
    needed_for: &'static str,
    key: &object_store::path::Path,
) -> Result<(), StorageError> {
    let missing = |detail: String| missing(bucket, COMPARE_AND_SET, needed_for, detail);
    let first = store
        .put_opts(key, PutPayload::from_static(b"v1"), create())
        .await?;
    let update = |result: &object_store::PutResult| PutOptions {
        mode: PutMode::Update(UpdateVersion {
            e_tag: result.e_tag.clone(),
            version: result.version.clone(),
        }),
        ..Default::default()
    };
    let second = match store
        .put_opts(key, PutPayload::from_static(b"v2"), update(&first))
        .await
    {
        Ok(result) => result,
        Err(
            object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. },
        ) => return Err(missing("the store does not implement them".into())),
        Err(e) => {
            return Err(missing(format!(
                "an update conditional on the current version failed: {e}"
            )))
        }
    };
    match store
        .put_opts(key, PutPayload::from_static(b"v3"), update(&first))
        .await
    {
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => {}
        Ok(_) => return Err(missing(
            "an update conditional on a stale version succeeded (the store ignores the condition)"
                .into(),
        )),
        Err(e) => return Err(e.into()),
    }
    let _ = second;
    let stored = read(store, key).await?;
    if stored.as_ref() != b"v2" {
        return Err(missing(format!(
            "a stale conditional update replaced the object ({:?} stored)",
            String::from_utf8_lossy(&stored)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;
    use crate::model::{LatencyProfile, ModelStore};

    #[tokio::test]
    async fn test_probe_memory_and_file_have_create_only() {
        let memory = InMemory::new();
        create_only(&memory, "memory://", "the metadata log")
            .await
            .unwrap();
        compare_and_set(&memory, "memory://", "the job queue")
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = crate::local_store(dir.path()).unwrap();
        create_only(&file, "file://x", "the metadata log")
            .await
            .unwrap();
        // The local backend has no compare-and-set: the probe says so instead of passing.
        let err = compare_and_set(&file, "file://x", "the job queue")
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::MissingCapability { capability, .. } if capability == COMPARE_AND_SET),
            "{err}"
        );
        // Probe objects are cleaned up.
        let left: Vec<_> = futures::StreamExt::collect::<Vec<_>>(memory.list(None)).await;
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn test_probe_refuses_a_store_that_ignores_conditions() {
        // The latency model can pretend conditions are ignored, like a proxy that strips them.
        let store = ModelStore::new(
            Arc::new(InMemory::new()),
            LatencyProfile::named("local").unwrap(),
            7,
        )
        .unwrap();
        store.set_ignore_conditions(true);
        let err = create_only(&store, "s3://weir-meta", "the metadata log")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("s3://weir-meta") && text.contains("create-only"),
            "{text}"
        );
        assert!(!err.is_retryable());
        let err = compare_and_set(&store, "s3://weir-meta", "the job queue")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("compare-and-set"), "{err}");
    }
}
