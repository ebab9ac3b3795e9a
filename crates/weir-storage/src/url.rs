//! Opening an object store by URL.
//!
//! Supported: `memory://` (in-process, lost on exit) and `file:///abs/path` or
//! `file://relative/path` (local directory, created if missing, fsync on). Cloud schemes
//! (`s3://`, `gs://`, `az://`) are not built in yet and return
//! [`StorageError::UnsupportedScheme`].

use std::sync::Arc;

use object_store::{local::LocalFileSystem, memory::InMemory, ObjectStore};

use crate::StorageError;

/// Opens the object store named by `url`.
pub fn open_store(url: &str) -> Result<Arc<dyn ObjectStore>, StorageError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(StorageError::InvalidConfig(format!(
            "object store URL {url:?} has no scheme (expected e.g. file:///path or memory://)"
        )));
    };
    match scheme {
        "memory" => Ok(Arc::new(InMemory::new())),
        "file" => {
            // `file:///abs` → "/abs"; `file://rel/dir` → "rel/dir".
            if rest.is_empty() {
                return Err(StorageError::InvalidConfig(format!(
                    "file URL {url:?} has no path"
                )));
            }
            Ok(Arc::new(local_store(std::path::Path::new(rest))?))
        }
        other => Err(StorageError::UnsupportedScheme(other.to_string())),
    }
}

/// A [`LocalFileSystem`] rooted at `dir` (created if missing) with fsync enabled.
///
/// With fsync on, `object_store` 0.14 `sync_all`s each written file before publishing it by
/// rename/hard link and then fsyncs the parent directory (and any directories it created), so a
/// successful put is durable as DUR-1 requires.
pub fn local_store(dir: &std::path::Path) -> Result<LocalFileSystem, StorageError> {
    std::fs::create_dir_all(dir)?;
    Ok(LocalFileSystem::new_with_prefix(dir)?.with_fsync(true))
}

#[cfg(test)]
mod tests {
    use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

    use super::*;

    #[test]
    fn test_url_local_store_has_fsync_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = local_store(dir.path()).unwrap();
        let debug = format!("{store:?}");
        assert!(debug.contains("fsync: true"), "{debug}");

        let url = format!("file://{}", dir.path().join("sub").display());
        let opened = open_store(&url).unwrap();
        let debug = format!("{opened:?}");
        assert!(debug.contains("LocalFileSystem"), "{debug}");
        assert!(debug.contains("fsync: true"), "{debug}");
        assert!(dir.path().join("sub").is_dir());
    }

    #[test]
    fn test_url_schemes() {
        assert!(open_store("memory://").is_ok());
        assert!(matches!(
            open_store("s3://bucket/x"),
            Err(StorageError::UnsupportedScheme(s)) if s == "s3"
        ));
        assert!(matches!(
            open_store("/no/scheme"),
            Err(StorageError::InvalidConfig(_))
        ));
        assert!(matches!(
            open_store("file://"),
            Err(StorageError::InvalidConfig(_))
        ));
    }

    #[tokio::test]
    async fn test_url_file_put_create_conflict_is_already_exists() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&format!("file://{}", dir.path().display())).unwrap();
        let key = crate::keys::meta_log(1);
        let create = || PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        store
            .put_opts(&key, PutPayload::from_static(b"first"), create())
            .await
            .unwrap();
        let err = store
            .put_opts(&key, PutPayload::from_static(b"second"), create())
            .await
            .unwrap_err();
        assert!(
            matches!(err, object_store::Error::AlreadyExists { .. }),
            "{err:?}"
        );
        let got = store.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"first");
        // the file really is on disk under the directory
        assert!(dir.path().join("meta/log/00000000000000000001").is_file());
    }
}
