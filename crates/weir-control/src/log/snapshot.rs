//! Snapshots: the state after slot `seq`, with the fence slots log GC must keep (RFC 0003 §7).
//! The newest readable one starts replay; log GC keeps the two newest.
//!
//! # Binary, chunked (RFC 0003 §8)
//!
//! A snapshot is written as chunks `meta/snapshot-chunk/{seq:020}/{n:06}` (envelope kind
//! `SnapshotChunk`, at most [`MAX_SNAPSHOT_CHUNK_BYTES`] each, so the envelope's u32 length
//! always fits), then, *last*, its manifest `meta/snapshot/{seq:020}` (kind `SnapshotManifest`,
//! JSON [`Manifest`]: each chunk's length and CRC32C and the section table). The chunks
//! concatenated are the body: a `small` section (the state without batch indexes, plus the
//! fence, as JSON, so it evolves with serde defaults), the file table, and one columnar index
//! section per non-empty partition (`weir_format::index`, ~8 B per batch instead of ~160–190 B
//! of JSON, benchmarks §11).
//!
//! A manifest is written only after every chunk is, so a listed manifest whose chunks do not
//! all read back and verify is damage, not a snapshot in progress: it is skipped like any
//! unreadable snapshot and replay falls back to the previous one. Chunks without a manifest
//! (a crash mid-snapshot) and chunks of collected snapshots are deleted by log GC.
//!
//! Memory: the encoder holds the chunk it fills and one queued for upload, with at most
//! [`MAX_CHUNK_PUTS`] chunk PUTs in flight; recovery GETs at most [`MAX_CHUNK_GETS`] chunks
//! ahead of the decoder.
//!
//! # JSON (legacy)
//!
//! Snapshots written before, one `Snapshot` envelope of `{state, fence}` JSON under the same
//! key, are still read: a state upgraded in place recovers from one, and the first snapshot
//! after that is binary.

mod decode;
mod encode;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::warn;
use weir_format::{decode_envelope, encode_envelope, EnvelopeKind};
use weir_storage::keys;

use super::{FenceSlots, LogError, LogStore};
use crate::state::State;
use encode::{encode_body, BodyLayout, EncodeError};

/// The largest chunk: far below the envelope's 4 GiB, small enough to GET and verify one at a
/// time, large enough that a huge state is few objects.
pub const MAX_SNAPSHOT_CHUNK_BYTES: usize = 64 << 20;
/// Chunk PUTs in flight while a snapshot is written.
pub const MAX_CHUNK_PUTS: usize = 4;
/// Chunk GETs in flight while a snapshot is read.
pub const MAX_CHUNK_GETS: usize = 8;
/// The newest body layout this build reads (`Manifest::format`). 2: the `small` section may hold
/// pending files (RFC 0006). A snapshot is written at the oldest format that holds its state,
/// so a build that would drop pending files (and serve their batches) refuses the snapshot.
const SNAPSHOT_FORMAT: u16 = 2;

/// The manifest of a binary snapshot: what its chunks must be and how the body is laid out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    format: u16,
    chunks: Vec<ChunkInfo>,
    sections: Vec<Section>,
}

/// One chunk as written: its payload length and CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct ChunkInfo {
    len: u64,
    crc32c: u32,
}

/// A byte range of the body and what it holds. The encoder writes them in this order: `small`,
/// `files`, then the index sections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Section {
    /// The state without indexes and the fence, as JSON.
    Small { offset: u64, len: u64 },
    /// `count` file ids, 16 bytes big-endian each: index rows name files by position here.
    Files { offset: u64, len: u64, count: u64 },
    /// One partition's index, `entries` batches in `weir_format::index` blocks.
    Index {
        topic: String,
        partition: u32,
        offset: u64,
        len: u64,
        entries: u64,
    },
}

impl Section {
    fn range(&self) -> (u64, u64) {
        match self {
            Self::Small { offset, len }
            | Self::Files { offset, len, .. }
            | Self::Index { offset, len, .. } => (*offset, *len),
        }
    }
}

/// A legacy JSON snapshot, and a binary snapshot's `small` section.
#[derive(Debug, Deserialize)]
struct SnapshotBody {
    state: State,
    /// Absent in snapshots from before log GC: which slots below them start an epoch is then
    /// unknown, and log GC reads those slots before deleting them.
    #[serde(default = "FenceSlots::unknown")]
    fence: FenceSlots,
}

/// Why a snapshot could not be read: the store failed (an error for the caller), or the
/// snapshot is unusable (skipped, with the reason logged).
#[derive(Debug)]
enum ReadFailure {
    Store(LogError),
    Unreadable(String),
}

impl From<LogError> for ReadFailure {
    fn from(err: LogError) -> Self {
        Self::Store(err)
    }
}

/// What a snapshot write produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotWritten {
    pub chunks: usize,
    /// Bytes of the body (all chunk payloads).
    pub bytes: u64,
    /// Bytes of the index sections, and the batches they hold.
    pub index_bytes: u64,
    pub batches: u64,
}

impl LogStore {
    /// Writes the snapshot of `state` (and its fence slots) taken after slot `seq`, encoding on
    /// the calling task: chunks (at most [`MAX_CHUNK_PUTS`] PUTs in flight), then the manifest.
    /// The encoded chunks wait in memory for their PUTs, so this suits small states and the
    /// deterministic simulator; [`Self::write_snapshot_in_background`] streams.
    pub async fn write_snapshot(
        &self,
        epoch: u64,
        seq: u64,
        state: &State,
        fence: &FenceSlots,
    ) -> Result<SnapshotWritten, LogError> {
        let mut chunks = Vec::new();
        let layout = encode_body(state, fence, self.snapshot_chunk_bytes, &mut |chunk| {
            chunks.push(chunk);
            Ok(())
        })
        .map_err(|err| encode_failed(seq, err))?;
        self.put_chunks(epoch, seq, futures::stream::iter(chunks))
            .await?;
        self.put_manifest(epoch, seq, layout).await
    }

    /// Like [`Self::write_snapshot`], but encodes on a blocking thread while the chunks
    /// upload: the encoder holds the chunk it fills and one queued, so memory stays a few
    /// chunks whatever the state's size.
    pub async fn write_snapshot_in_background(
        &self,
        epoch: u64,
        seq: u64,
        state: Box<State>,
        fence: FenceSlots,
    ) -> Result<SnapshotWritten, LogError> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let chunk_bytes = self.snapshot_chunk_bytes;
        let encoder = tokio::task::spawn_blocking(move || {
            encode_body(&state, &fence, chunk_bytes, &mut |chunk| {
                tx.blocking_send(chunk).map_err(|_| EncodeError::Aborted)
            })
        });
        let chunks = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        let uploaded = self.put_chunks(epoch, seq, chunks).await;
        let layout = encoder
            .await
            .map_err(|err| LogError::SnapshotEncoder(err.to_string()))?;
        // An upload failure stops the encoder (`Aborted`): report the upload's error.
        uploaded?;
        let layout = layout.map_err(|err| encode_failed(seq, err))?;
        self.put_manifest(epoch, seq, layout).await
    }

    /// PUTs chunks `0, 1, …` of snapshot `seq` as they come, at most [`MAX_CHUNK_PUTS`] at a
    /// time. Stops at the first failure (dropping `chunks` stops a background encoder).
    async fn put_chunks(
        &self,
        epoch: u64,
        seq: u64,
        chunks: impl futures::Stream<Item = Bytes>,
    ) -> Result<(), LogError> {
        let log = self.clone();
        chunks
            .enumerate()
            .map(Ok)
            .try_for_each_concurrent(MAX_CHUNK_PUTS, move |(n, payload)| {
                let log = log.clone();
                async move {
                    let key = keys::meta_snapshot_chunk(seq, n as u32);
                    let bytes = encode_envelope(EnvelopeKind::SnapshotChunk, epoch, seq, &payload)
                        .map_err(|source| LogError::Encode {
                            key: key.to_string(),
                            source,
                        })?;
                    drop(payload);
                    log.put(&key, bytes).await
                }
            })
            .await
    }

    /// Writes the manifest, after every chunk: from now on the snapshot exists.
    async fn put_manifest(
        &self,
        epoch: u64,
        seq: u64,
        layout: BodyLayout,
    ) -> Result<SnapshotWritten, LogError> {
        let mut written = SnapshotWritten {
            chunks: layout.chunks.len(),
            bytes: layout.chunks.iter().map(|c| c.len).sum(),
            index_bytes: 0,
            batches: 0,
        };
        for section in &layout.sections {
            if let Section::Index { len, entries, .. } = section {
                written.index_bytes += len;
                written.batches += entries;
            }
        }
        let manifest = Manifest {
            format: if layout.pending { 2 } else { 1 },
            chunks: layout.chunks,
            sections: layout.sections,
        };
        let key = keys::meta_snapshot(seq);
        let json = serde_json::to_vec(&manifest).expect("a manifest serialises");
        let bytes = encode_envelope(EnvelopeKind::SnapshotManifest, epoch, seq, &json).map_err(
            |source| LogError::Encode {
                key: key.to_string(),
                source,
            },
        )?;
        self.put(&key, bytes).await?;
        Ok(written)
    }

    async fn put(&self, key: &Path, bytes: Bytes) -> Result<(), LogError> {
        match self.store.put(key, PutPayload::from(bytes)).await {
            Ok(_) => Ok(()),
            Err(source) => Err(LogError::Store {
                key: key.to_string(),
                source,
            }),
        }
    }

    /// The newest snapshot that reads back, as replay starts from it.
    pub(super) async fn load_snapshot(&self) -> Result<Option<(u64, State, FenceSlots)>, LogError> {
        for seq in self
            .list_seqs(&keys::meta_snapshot_prefix())
            .await?
            .into_iter()
            .rev()
        {
            match self.read_snapshot(seq).await? {
                Some(Ok((state, fence))) => return Ok(Some((seq, state, fence))),
                Some(Err(reason)) => warn!(
                    key = %keys::meta_snapshot(seq),
                    %reason,
                    "skipping unreadable snapshot, falling back to an older one or the log"
                ),
                None => {}
            }
        }
        Ok(None)
    }

    /// Reads snapshot `seq`, binary or legacy JSON: `None` when absent, `Some(Err(reason))`
    /// when it does not decode or a chunk is missing or does not verify.
    pub(super) async fn read_snapshot(
        &self,
        seq: u64,
    ) -> Result<Option<Result<(State, FenceSlots), String>>, LogError> {
        let Some(bytes) = self.get(&keys::meta_snapshot(seq)).await? else {
            return Ok(None);
        };
        let envelope = match decode_envelope(&bytes) {
            Ok(envelope) if envelope.seq == seq => envelope,
            Ok(envelope) => {
                return Ok(Some(Err(format!(
                    "envelope says {:?} of slot {}, key says snapshot of slot {seq}",
                    envelope.kind, envelope.seq
                ))))
            }
            Err(err) => return Ok(Some(Err(err.to_string()))),
        };
        let decoded = match envelope.kind {
            EnvelopeKind::Snapshot => serde_json::from_slice::<SnapshotBody>(envelope.payload)
                .map(|body| (body.state, body.fence))
                .map_err(|err| ReadFailure::Unreadable(err.to_string())),
            EnvelopeKind::SnapshotManifest => self.read_binary(seq, envelope.payload).await,
            other => Err(ReadFailure::Unreadable(format!(
                "a {other:?} envelope under a snapshot key"
            ))),
        };
        match decoded {
            Ok(snapshot) => Ok(Some(Ok(snapshot))),
            Err(ReadFailure::Unreadable(reason)) => Ok(Some(Err(reason))),
            Err(ReadFailure::Store(err)) => Err(err),
        }
    }

    /// Reads the chunks a manifest names, [`MAX_CHUNK_GETS`] ahead, and decodes the body.
    async fn read_binary(
        &self,
        seq: u64,
        manifest: &[u8],
    ) -> Result<(State, FenceSlots), ReadFailure> {
        let manifest: Manifest = serde_json::from_slice(manifest)
            .map_err(|err| ReadFailure::Unreadable(format!("manifest: {err}")))?;
        decode::check_manifest(&manifest)?;
        // Owned closures and futures: borrowing ones trip the compiler's `Send` inference
        // for the spawned writer task.
        let infos: Vec<ChunkInfo> = manifest.chunks.clone();
        let log = self.clone();
        let chunks = futures::stream::iter(infos.into_iter().enumerate())
            .map(move |(n, info)| {
                let log = log.clone();
                async move { log.read_chunk(seq, n as u32, info).await }
            })
            .buffered(MAX_CHUNK_GETS);
        let decoded = decode::decode_body(&manifest, std::pin::pin!(chunks)).await;
        decoded
    }

    /// Chunk `n` of snapshot `seq`, checked against the manifest's length and CRC32C.
    async fn read_chunk(&self, seq: u64, n: u32, info: ChunkInfo) -> Result<Bytes, ReadFailure> {
        let key = keys::meta_snapshot_chunk(seq, n);
        let Some(bytes) = self.get(&key).await? else {
            return Err(ReadFailure::Unreadable(format!("{key} is missing")));
        };
        let bad = |reason: String| ReadFailure::Unreadable(format!("{key}: {reason}"));
        let envelope = decode_envelope(&bytes).map_err(|err| bad(err.to_string()))?;
        if envelope.kind != EnvelopeKind::SnapshotChunk || envelope.seq != seq {
            return Err(bad(format!(
                "a {:?} envelope of slot {}",
                envelope.kind, envelope.seq
            )));
        }
        let crc = crc32c::crc32c(envelope.payload);
        if envelope.payload.len() as u64 != info.len || crc != info.crc32c {
            return Err(bad(format!(
                "{} bytes with CRC32C {crc:#010x}, the manifest says {} bytes with {:#010x}",
                envelope.payload.len(),
                info.len,
                info.crc32c
            )));
        }
        Ok(bytes.slice_ref(envelope.payload))
    }
}

/// The snapshot writer of before binary snapshots, kept to test that recovery still reads its
/// output: one `Snapshot` envelope of `{state, fence}` JSON.
#[cfg(test)]
pub(crate) fn encode_json_snapshot(
    epoch: u64,
    seq: u64,
    state: &State,
    fence: &FenceSlots,
) -> Bytes {
    #[derive(Serialize)]
    struct SnapshotRef<'a> {
        state: &'a State,
        fence: &'a FenceSlots,
    }
    let payload = serde_json::to_vec(&SnapshotRef { state, fence }).expect("state serialises");
    encode_envelope(EnvelopeKind::Snapshot, epoch, seq, &payload).expect("a test state fits")
}

fn encode_failed(seq: u64, err: EncodeError) -> LogError {
    match err {
        EncodeError::Format(source) => LogError::Encode {
            key: keys::meta_snapshot(seq).to_string(),
            source,
        },
        EncodeError::Json(err) => LogError::SnapshotEncoder(err.to_string()),
        EncodeError::Aborted => LogError::SnapshotEncoder("the chunk upload stopped".into()),
    }
}
