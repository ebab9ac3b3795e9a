//! Uploads one sealed file to a quorum of ingest buckets, retrying transient failures, and
//! writes its batches through to the read cache so fresh data is served without a GET.
//!
//! Two ways to write a file ([`IngestWrites`]): a whole-object PUT per bucket under a key chosen
//! at seal (a retry re-puts the same key), or an append + flush into a pooled item whose key was
//! chosen when the item was made (a retry takes a fresh item, so a new key: the failed item's
//! objects are left to the orphan sweep).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use object_store::PutPayload;
use tracing::warn;
use weir_common::{Backoff, FileId};
use weir_format::EncodedFile;
use weir_storage::append::ingest::IngestLoader;
use weir_storage::pool::WriterPool;
use weir_storage::{keys, QuorumWriter, ReadCache, StorageError};

/// The pool of ready ingest objects on appendable buckets.
pub type IngestPool = WriterPool<IngestLoader>;

/// How sealed files reach the ingest buckets.
#[derive(Clone, Default)]
pub enum IngestWrites {
    /// One whole-object PUT per file and bucket.
    #[default]
    Put,
    /// Append + flush into objects the pool created ahead of need (GCS Rapid, S3 Express).
    Pool(IngestPool),
}

impl std::fmt::Debug for IngestWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IngestWrites::Put => f.write_str("Put"),
            IngestWrites::Pool(pool) => write!(f, "Pool({:?})", pool.settings()),
        }
    }
}

/// Where sealed files go: the ingest buckets, the way they are written, and the read cache
/// their batches are written through to.
pub(crate) struct Destination {
    pub(crate) writer: Arc<QuorumWriter>,
    pub(crate) writes: IngestWrites,
    pub(crate) cache: Arc<ReadCache>,
}

/// Uploads `encoded` to `destination` (`put_id` is the file's id on the PUT path). Returns the
/// id the file was written under and the indices of the buckets holding it, or why the upload
/// failed for good.
pub(crate) async fn upload(
    destination: &Destination,
    put_id: FileId,
    encoded: &EncodedFile,
    attempts: u32,
    seq: u64,
    metrics: &crate::ProduceMetrics,
) -> (FileId, Result<Vec<usize>, String>) {
    let mut backoff = Backoff::new(Duration::from_millis(25), Duration::from_secs(1));
    let mut rng = fastrand::Rng::with_seed(seq);
    let mut attempt = 0;
    let copy = FileCopy::of(encoded, destination.writer.contiguous_payloads());
    let parts = &copy.parts;
    let (file_id, key, holders) = loop {
        attempt += 1;
        let (file_id, key, result) = write_once(destination, put_id, &copy).await;
        match result {
            Ok(holders) => break (file_id, key, holders),
            Err(err) if attempt < attempts.max(1) && err.is_retryable() => {
                warn!(seq, %key, attempt, error = %err, "file upload failed, retrying");
                metrics.upload_retries.inc();
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
            }
            Err(err) => {
                warn!(seq, %key, attempt, error = %err, "file upload failed for good");
                return (file_id, Err(err.to_string()));
            }
        }
    };
    // parts = [header, batch…, footer+trailer]; batches are in footer order.
    let batch_parts = parts.iter().skip(1);
    let locations = encoded
        .footer
        .partitions
        .iter()
        .flat_map(|section| &section.batches);
    for (location, bytes) in locations.zip(batch_parts) {
        destination
            .cache
            .insert_range(&key, location.range(), bytes.clone());
    }
    (file_id, Ok(holders))
}

/// The uploader's own copy of a sealed file: batches are slices of request frames, and what
/// outlives the request (writes past the quorum to slow buckets, the read cache) would otherwise
/// keep whole frames alive while charged only for the slices. The PUT and the cache share it.
struct FileCopy {
    /// `[header, batch…, footer+trailer]`, batches in footer order.
    parts: Vec<Bytes>,
    /// The whole file in one buffer, `parts` slices of it: for in-process buckets, which keep a
    /// one-part payload as it is but would join several parts into a buffer of their own. Only
    /// there: elsewhere a cached batch would keep its whole file alive, charged for the batch
    /// alone, once the rest of the file has left the cache.
    whole: Option<Bytes>,
}

impl FileCopy {
    fn of(encoded: &EncodedFile, contiguous: bool) -> FileCopy {
        if !contiguous {
            let parts = encoded
                .parts
                .iter()
                .map(|part| Bytes::copy_from_slice(part))
                .collect();
            return FileCopy { parts, whole: None };
        }
        let len = encoded.parts.iter().map(Bytes::len).sum();
        let mut buffer = BytesMut::with_capacity(len);
        for part in &encoded.parts {
            buffer.extend_from_slice(part);
        }
        let whole = buffer.freeze();
        let mut at = 0;
        let parts = encoded
            .parts
            .iter()
            .map(|part| {
                at += part.len();
                whole.slice(at - part.len()..at)
            })
            .collect();
        FileCopy {
            parts,
            whole: Some(whole),
        }
    }

    /// What a write sends: the whole file as one part where there is one.
    fn payload_parts(&self) -> &[Bytes] {
        match &self.whole {
            Some(whole) => std::slice::from_ref(whole),
            None => &self.parts,
        }
    }
}

/// One attempt: the file's id and key, and the holders or the error.
async fn write_once(
    destination: &Destination,
    put_id: FileId,
    copy: &FileCopy,
) -> (FileId, Path, Result<Vec<usize>, StorageError>) {
    let writer = &destination.writer;
    let parts = copy.payload_parts();
    match &destination.writes {
        IngestWrites::Put => {
            let key = keys::data_file(keys::Tier::Ingest, &put_id);
            let payload: PutPayload = parts.iter().cloned().collect();
            let result = writer.put(&key, payload).await;
            (put_id, key, result)
        }
        IngestWrites::Pool(pool) => match pool.take().await {
            Ok(item) => {
                let result = writer.append_flush(&item.key, item.writers, parts).await;
                (item.file_id, item.key, result)
            }
            Err(err) => {
                let key = keys::data_file(keys::Tier::Ingest, &put_id);
                (put_id, key, Err(err))
            }
        },
    }
}
