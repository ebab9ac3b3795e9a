//! The object view of a Rapid bucket: Weir's whole-object reads and writes through the gRPC
//! API the appendable objects use, listing and deleting through another store (the JSON API).
//!
//! Google documents reads and writes of objects in zonal buckets through the gRPC bidi streams
//! (`BidiReadObject`, `BidiWriteObject`), and the objects Weir appends to are unfinalized, so
//! every read goes through [`GcsRapid`]'s read stream, which sees the persisted bytes of open
//! objects. A whole-object put is an appendable object opened, written and finalized in one
//! stream, with the put's condition as the open's generation precondition:
//!
//! | put mode | precondition |
//! |---|---|
//! | `Create` | `ifGenerationMatch: 0` (refused: `AlreadyExists`) |
//! | `Overwrite` | none (a new generation replaces the object) |
//! | `Update` (version = generation) | `ifGenerationMatch: version` (refused: `Precondition`) |
//!
//! Listing, deleting and copying are metadata operations and go to `listing`
//! (`object_store`'s GCS client). Multipart uploads are refused: Weir writes only small files
//! to zonal buckets. An object's `version` is its generation, its `e_tag` the service's etag.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use google_cloud_storage::model::Object;
use google_cloud_storage::stub;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions,
};
use weir_storage::StorageError;

use crate::{non_negative, read_range, GcsRapid};

/// The store name in the errors this view makes itself.
const STORE: &str = "GcsRapidObjects";

/// A Rapid bucket's [`ObjectStore`] (see the module docs).
pub struct RapidObjects<S = stub::DefaultStorage>
where
    S: stub::Storage + 'static,
{
    rapid: GcsRapid<S>,
    listing: Arc<dyn ObjectStore>,
}

impl<S> fmt::Debug for RapidObjects<S>
where
    S: stub::Storage + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RapidObjects")
            .field("rapid", &self.rapid)
            .field("listing", &self.listing)
            .finish()
    }
}

impl<S> fmt::Display for RapidObjects<S>
where
    S: stub::Storage + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RapidObjects({})", self.rapid.bucket())
    }
}

impl<S> RapidObjects<S>
where
    S: stub::Storage + 'static,
{
    /// Reads and writes through `rapid`; lists, deletes and copies through `listing` (the same
    /// bucket, without a prefix: wrap the whole view in a `PrefixStore` for one).
    pub fn new(rapid: GcsRapid<S>, listing: Arc<dyn ObjectStore>) -> RapidObjects<S> {
        RapidObjects { rapid, listing }
    }
}

/// Maps an error of this view to `object_store`'s.
fn into_object_store(err: StorageError) -> object_store::Error {
    match err {
        StorageError::ObjectStore(err) => err,
        StorageError::Fenced { path, reason } => object_store::Error::Precondition {
            path,
            source: reason.into(),
        },
        other => object_store::Error::Generic {
            store: STORE,
            source: Box::new(other),
        },
    }
}

fn meta_of(location: &Path, object: &Object) -> Result<ObjectMeta, StorageError> {
    let last_modified = object
        .update_time
        .as_ref()
        .or(object.create_time.as_ref())
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds(), t.nanos().max(0) as u32))
        .unwrap_or_default();
    Ok(ObjectMeta {
        location: location.clone(),
        last_modified,
        size: non_negative(location, "size", object.size)?,
        e_tag: Some(object.etag.clone()).filter(|e| !e.is_empty()),
        version: Some(object.generation.to_string()),
    })
}

impl<S> RapidObjects<S>
where
    S: stub::Storage + 'static,
{
    async fn get(&self, location: &Path, options: GetOptions) -> Result<GetResult, StorageError> {
        if options.version.is_some() {
            return Err(object_store::Error::NotSupported {
                source: "reads of a given generation of a Rapid object".into(),
            }
            .into());
        }
        let descriptor = self.rapid.open(location).await?;
        let meta = meta_of(location, &descriptor.object())?;
        options.check_preconditions(&meta)?;
        let range: Range<u64> = match &options.range {
            Some(range) => range
                .as_range(meta.size)
                .map_err(|e| object_store::Error::Generic {
                    store: STORE,
                    source: Box::new(e),
                })?,
            None => 0..meta.size,
        };
        let body = if options.head || range.is_empty() {
            Bytes::new()
        } else {
            read_range(location, &descriptor, range.clone()).await?
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(body) }).boxed()),
            meta,
            range,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    async fn put(
        &self,
        location: &Path,
        payload: PutPayload,
        mode: &PutMode,
    ) -> Result<PutResult, StorageError> {
        let precondition = match mode {
            PutMode::Create => Some(0),
            PutMode::Overwrite => None,
            PutMode::Update(version) => {
                let generation = version
                    .version
                    .as_deref()
                    .and_then(|v| v.parse::<i64>().ok())
                    .ok_or_else(|| object_store::Error::Precondition {
                        path: location.to_string(),
                        source: "an update of a Rapid object names the generation it replaces \
                                 as its version"
                            .into(),
                    })?;
                Some(generation)
            }
        };
        let generation = self
            .rapid
            .write_whole(location, Bytes::from(payload), precondition)
            .await?;
        Ok(PutResult {
            e_tag: None,
            version: Some(generation.to_string()),
            extensions: Default::default(),
        })
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S> ObjectStore for RapidObjects<S>
where
    S: stub::Storage + 'static,
{
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.put(location, payload, &opts.mode)
            .await
            .map_err(into_object_store)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(object_store::Error::NotSupported {
            source: format!("multipart upload of {location} to a Rapid bucket").into(),
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.get(location, options).await.map_err(into_object_store)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            out.push(self.get_range(location, range.clone()).await?);
        }
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.listing.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listing.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.listing.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.listing.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.listing.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.listing.rename_opts(from, to, options).await
    }
}
