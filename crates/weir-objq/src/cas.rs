//! Compare-and-set on one object: read it with its version, write it only if the version is
//! still the one read.
//!
//! - [`ObjectStoreCas`]: `object_store`'s `PutMode::Create` and `PutMode::Update` (S3 conditional
//!   writes, GCS generations, Azure etags, `memory://`).
//! - [`local::LocalCas`]: a directory on one host, where `object_store` has no compare-and-set.

pub mod local;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

/// An object's version as its store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub e_tag: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CasError {
    /// The object is not at the expected version (or exists when it was expected absent).
    #[error("the object changed since it was read")]
    Conflict,
    /// The store cannot compare-and-set.
    #[error("no compare-and-set on this store: {0}")]
    Unsupported(String),
    /// Anything else; the write may or may not have landed.
    #[error("store: {0}")]
    Store(String),
}

/// One object updated only by compare-and-set.
#[async_trait]
pub trait CasObject: Send + Sync + fmt::Debug + 'static {
    /// The object and its version; `None` when it does not exist.
    async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError>;

    /// Writes `data` if the object is at `expected` (`None`: if it does not exist).
    async fn write(&self, data: Bytes, expected: Option<&Version>) -> Result<Version, CasError>;
}

/// Compare-and-set through `object_store`'s conditional puts.
#[derive(Debug, Clone)]
pub struct ObjectStoreCas {
    store: Arc<dyn ObjectStore>,
    path: Path,
}

impl ObjectStoreCas {
    pub fn new(store: Arc<dyn ObjectStore>, path: Path) -> ObjectStoreCas {
        ObjectStoreCas { store, path }
    }
}

fn store_error(err: object_store::Error) -> CasError {
    match err {
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            CasError::Conflict
        }
        object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. } => {
            CasError::Unsupported(err.to_string())
        }
        other => CasError::Store(other.to_string()),
    }
}

#[async_trait]
impl CasObject for ObjectStoreCas {
    async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError> {
        let got = match self.store.get(&self.path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(err) => return Err(store_error(err)),
        };
        let version = Version {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.map_err(store_error)?;
        Ok(Some((bytes, version)))
    }

    async fn write(&self, data: Bytes, expected: Option<&Version>) -> Result<Version, CasError> {
        let mode = match expected {
            None => PutMode::Create,
            Some(version) => PutMode::Update(UpdateVersion {
                e_tag: version.e_tag.clone(),
                version: version.version.clone(),
            }),
        };
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let result = self
            .store
            .put_opts(&self.path, PutPayload::from(data), options)
            .await
            .map_err(store_error)?;
        Ok(Version {
            e_tag: result.e_tag,
            version: result.version,
        })
    }
}
