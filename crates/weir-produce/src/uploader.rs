//! Uploads one sealed file to a quorum of ingest buckets, retrying transient failures, and
//! writes its batches through to the read cache so fresh data is served without a GET.

use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path;
use object_store::PutPayload;
use tracing::warn;
use weir_common::Backoff;
use weir_format::EncodedFile;
use weir_storage::{QuorumWriter, ReadCache};

/// Returns the indices of the buckets holding the file, or why the upload failed for good.
pub(crate) async fn upload(
    writer: &QuorumWriter,
    cache: &ReadCache,
    key: &Path,
    encoded: &EncodedFile,
    attempts: u32,
    seq: u64,
) -> Result<Vec<usize>, String> {
    let mut backoff = Backoff::new(Duration::from_millis(25), Duration::from_secs(1));
    let mut rng = fastrand::Rng::with_seed(seq);
    let mut attempt = 0;
    // One copy of each part: batches are slices of request frames, and what outlives the
    // request (writes past the quorum to slow buckets, the read cache) would otherwise keep whole
    // frames alive while charged only for the slices. The PUT and the cache share the copies.
    let parts: Vec<Bytes> = encoded
        .parts
        .iter()
        .map(|part| Bytes::copy_from_slice(part))
        .collect();
    let holders = loop {
        attempt += 1;
        let payload: PutPayload = parts.iter().cloned().collect();
        match writer.put(key, payload).await {
            Ok(holders) => break holders,
            Err(err) if attempt < attempts.max(1) && err.is_retryable() => {
                warn!(seq, %key, attempt, error = %err, "file upload failed, retrying");
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
            }
            Err(err) => {
                warn!(seq, %key, attempt, error = %err, "file upload failed for good");
                return Err(err.to_string());
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
        cache.insert_range(key, location.range(), bytes.clone());
    }
    Ok(holders)
}
