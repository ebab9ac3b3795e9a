//! Encoding a binary snapshot body (RFC 0003 §8): the `small` section (the state without batch
//! indexes, as JSON), the file table, then one columnar `index` section per partition, cut into
//! chunks as it is produced so the encoder holds about one chunk at a time.

use std::collections::BTreeMap;

use imbl::OrdMap;
use std::io;

use bytes::{Bytes, BytesMut};
use serde::{Serialize, Serializer};
use weir_common::{FileId, TopicId};
use weir_format::{FormatError, IndexEncoder, IndexRow, INDEX_BLOCK_ROWS};

use super::{ChunkInfo, Section};
use crate::log::FenceSlots;
use crate::state::pending::PendingFile;
use crate::state::{
    FileMeta, GroupOffsets, IndexEntry, PartitionState, ProducerPartitionState, Registry, State,
    Topic,
};

/// Why encoding stopped.
#[derive(Debug)]
pub(super) enum EncodeError {
    /// The consumer of the chunks went away (a chunk PUT failed): nothing more is needed.
    Aborted,
    /// The state cannot be encoded (an index that is not dense).
    Format(FormatError),
    /// The state does not serialise as JSON (a map key serde_json cannot write).
    Json(serde_json::Error),
}

/// Where each chunk and section of an encoded body is.
#[derive(Debug, Default)]
pub(super) struct BodyLayout {
    pub(super) chunks: Vec<ChunkInfo>,
    pub(super) sections: Vec<Section>,
    /// The state holds pending files (manifest format 2).
    pub(super) pending: bool,
}

/// Encodes the snapshot body of `state` and `fence`, handing each chunk of at most
/// `chunk_bytes` to `sink` as soon as it is full; returns the layout for the manifest.
pub(super) fn encode_body(
    state: &State,
    fence: &FenceSlots,
    chunk_bytes: usize,
    sink: &mut dyn FnMut(Bytes) -> Result<(), EncodeError>,
) -> Result<BodyLayout, EncodeError> {
    let mut out = ChunkWriter {
        buf: BytesMut::new(),
        chunk_bytes: chunk_bytes.max(1),
        written: 0,
        chunks: Vec::new(),
        sink,
    };
    let mut sections = vec![write_small(&mut out, state, fence)?];
    let files = FileTable::of(state);
    sections.push(write_file_table(&mut out, &files)?);
    let mut scratch = IndexScratch::default();
    for (name, topic) in &state.topics {
        for (number, partition) in topic.partitions.iter().enumerate() {
            // Only `len()` and `iter()`: the index type is about to become a chunked one.
            let entries = partition.index.len() as u64;
            if entries == 0 {
                continue;
            }
            let (offset, len) = write_index(&mut out, partition, &files, &mut scratch)?;
            sections.push(Section::Index {
                topic: name.clone(),
                partition: number as u32,
                offset,
                len,
                entries,
            });
        }
    }
    out.finish()?;
    Ok(BodyLayout {
        chunks: out.chunks,
        sections,
        pending: state.has_pending(),
    })
}

/// The `small` section, streamed through the chunk writer as serde produces it.
fn write_small(
    out: &mut ChunkWriter<'_>,
    state: &State,
    fence: &FenceSlots,
) -> Result<Section, EncodeError> {
    let offset = out.written;
    let small = SmallRef {
        state: StateRef::new(state),
        fence,
    };
    serde_json::to_writer(&mut *out, &small).map_err(|err| match err.io_error_kind() {
        Some(_) => EncodeError::Aborted,
        None => EncodeError::Json(err),
    })?;
    Ok(Section::Small {
        offset,
        len: out.written - offset,
    })
}

fn write_file_table(out: &mut ChunkWriter<'_>, files: &FileTable) -> Result<Section, EncodeError> {
    let offset = out.written;
    for id in &files.ids {
        out.put(&id.0.to_be_bytes())?;
    }
    Ok(Section::Files {
        offset,
        len: out.written - offset,
        count: files.ids.len() as u64,
    })
}

/// Buffers reused across partitions: one block of rows and its encoding.
#[derive(Default)]
struct IndexScratch {
    rows: Vec<IndexRow>,
    block: Vec<u8>,
}

/// One partition's index section, block by block; returns its offset and length.
fn write_index(
    out: &mut ChunkWriter<'_>,
    partition: &PartitionState,
    files: &FileTable,
    scratch: &mut IndexScratch,
) -> Result<(u64, u64), EncodeError> {
    let offset = out.written;
    let mut encoder = IndexEncoder::new();
    let mut entries = partition.index.iter().peekable();
    let mut hint = 0;
    while entries.peek().is_some() {
        scratch.rows.clear();
        let block = entries.by_ref().take(INDEX_BLOCK_ROWS);
        scratch
            .rows
            .extend(block.map(|entry| files.row(entry, &mut hint)));
        scratch.block.clear();
        encoder
            .encode_block(&scratch.rows, &mut scratch.block)
            .map_err(EncodeError::Format)?;
        out.put(&scratch.block)?;
    }
    Ok((offset, out.written - offset))
}

/// The files the indexes name, sorted: an index row names its file by position here (a few
/// bytes) instead of by id (16).
struct FileTable {
    ids: Vec<FileId>,
}

impl FileTable {
    /// Apply keeps every file an index entry names in `State::files`, so the table is those
    /// keys (already sorted); an indexed file missing there is added all the same.
    fn of(state: &State) -> Self {
        let mut table = Self {
            ids: state.files.keys().copied().collect(),
        };
        let mut missing = Vec::new();
        for partition in state.topics.values().flat_map(|t| t.partitions.iter()) {
            let mut hint = 0;
            for entry in partition.index.iter() {
                if table.find(entry.file_id, &mut hint).is_none() {
                    missing.push(entry.file_id);
                }
            }
        }
        if !missing.is_empty() {
            table.ids.extend(missing);
            table.ids.sort_unstable();
            table.ids.dedup();
        }
        table
    }

    /// The position of `id`, searched from `hint` (the previous entry's position, updated):
    /// a partition's files mostly grow, so a short gallop forward usually finds it.
    fn find(&self, id: FileId, hint: &mut usize) -> Option<usize> {
        let ids = &self.ids;
        let start = (*hint).min(ids.len());
        let range = if ids.get(start).is_some_and(|at| *at <= id) {
            let (mut end, mut step) = (start + 1, 1);
            while end < ids.len() && ids[end] <= id {
                step *= 2;
                end = start + step;
            }
            start..end.min(ids.len())
        } else {
            0..ids.len()
        };
        let position = range.start + ids[range].binary_search(&id).ok()?;
        *hint = position;
        Some(position)
    }

    fn row(&self, entry: &IndexEntry, hint: &mut usize) -> IndexRow {
        // `of` put every indexed file in the table.
        let file = self
            .find(entry.file_id, hint)
            .expect("the file table holds every indexed file");
        IndexRow {
            base_offset: entry.base_offset,
            last_offset: entry.last_offset,
            file: file as u32,
            byte_offset: entry.byte_offset,
            len: entry.len,
            first_timestamp: entry.first_timestamp,
            max_timestamp: entry.max_timestamp,
        }
    }
}

/// Cuts the body into chunks of `chunk_bytes` (the last shorter) as bytes arrive.
struct ChunkWriter<'s> {
    buf: BytesMut,
    chunk_bytes: usize,
    /// Body bytes written so far (section offsets).
    written: u64,
    chunks: Vec<ChunkInfo>,
    sink: &'s mut dyn FnMut(Bytes) -> Result<(), EncodeError>,
}

impl ChunkWriter<'_> {
    fn put(&mut self, mut data: &[u8]) -> Result<(), EncodeError> {
        self.written += data.len() as u64;
        while !data.is_empty() {
            let room = self.chunk_bytes - self.buf.len();
            let (now, later) = data.split_at(room.min(data.len()));
            self.buf.extend_from_slice(now);
            data = later;
            if self.buf.len() == self.chunk_bytes {
                self.emit()?;
            }
        }
        Ok(())
    }

    fn emit(&mut self) -> Result<(), EncodeError> {
        let chunk = self.buf.split().freeze();
        self.chunks.push(ChunkInfo {
            len: chunk.len() as u64,
            crc32c: crc32c::crc32c(&chunk),
        });
        (self.sink)(chunk)
    }

    /// Emits the last, partial chunk.
    fn finish(&mut self) -> Result<(), EncodeError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.emit()
    }
}

impl io::Write for ChunkWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.put(data)
            .map_err(|_| io::Error::other("snapshot chunk consumer stopped"))?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The `small` section: the snapshot's state with every partition's index left empty (the
/// index sections carry them), and its fence slots. It reads back as the legacy
/// `{state, fence}` JSON, so the state's serde defaults apply to it as to any state JSON.
#[derive(Serialize)]
struct SmallRef<'a> {
    state: StateRef<'a>,
    fence: &'a FenceSlots,
}

/// [`State`] by reference, field for field except the partitions' indexes. A test checks that
/// it has exactly `State`'s fields, so a field added there cannot be left out here.
#[derive(Serialize)]
pub(super) struct StateRef<'a> {
    cluster_id: &'a str,
    epoch: u64,
    next_producer_id: i64,
    producer_epochs: &'a OrdMap<i64, i16>,
    producer_last_ms: &'a OrdMap<i64, i64>,
    #[serde(serialize_with = "topics_without_index")]
    topics: &'a BTreeMap<String, Topic>,
    files: &'a OrdMap<FileId, FileMeta>,
    agent_tips: &'a BTreeMap<String, FileId>,
    group_offsets: &'a BTreeMap<String, GroupOffsets>,
    released: &'a OrdMap<FileId, FileMeta>,
    sweep_horizon_ms: i64,
    registry: &'a Registry,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pending: &'a BTreeMap<String, Vec<PendingFile>>,
}

impl<'a> StateRef<'a> {
    pub(super) fn new(state: &'a State) -> Self {
        Self {
            cluster_id: &state.cluster_id,
            epoch: state.epoch,
            next_producer_id: state.next_producer_id,
            producer_epochs: &state.producer_epochs,
            producer_last_ms: &state.producer_last_ms,
            topics: &state.topics,
            files: &state.files,
            agent_tips: &state.agent_tips,
            group_offsets: &state.group_offsets,
            released: &state.released,
            sweep_horizon_ms: state.sweep_horizon_ms,
            registry: &state.registry,
            pending: &state.pending,
        }
    }
}

fn topics_without_index<S: Serializer>(
    topics: &&BTreeMap<String, Topic>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(
        topics
            .iter()
            .map(|(name, topic)| (name, TopicRef::new(topic))),
    )
}

/// [`Topic`] by reference, with index-less partitions.
#[derive(Serialize)]
struct TopicRef<'a> {
    name: &'a str,
    id: TopicId,
    configs: &'a BTreeMap<String, String>,
    partitions: Vec<PartitionRef<'a>>,
}

impl<'a> TopicRef<'a> {
    fn new(topic: &'a Topic) -> Self {
        Self {
            name: &topic.name,
            id: topic.id,
            configs: &topic.configs,
            partitions: topic.partitions.iter().map(PartitionRef::new).collect(),
        }
    }
}

/// [`PartitionState`] by reference with an empty `index` (legacy readers require the field).
#[derive(Serialize)]
struct PartitionRef<'a> {
    log_start_offset: i64,
    high_watermark: i64,
    stable_high_watermark: i64,
    index: [IndexEntry; 0],
    producers: &'a OrdMap<i64, ProducerPartitionState>,
}

impl<'a> PartitionRef<'a> {
    fn new(partition: &'a PartitionState) -> Self {
        Self {
            log_start_offset: partition.log_start_offset,
            high_watermark: partition.high_watermark,
            stable_high_watermark: partition.stable_high_watermark,
            index: [],
            producers: &partition.producers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_file_table_finds_every_file_from_any_hint() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut ids: Vec<FileId> = (0..300).map(|_| FileId(rng.u128(..1 << 20))).collect();
        ids.sort_unstable();
        ids.dedup();
        let table = FileTable { ids: ids.clone() };
        for _ in 0..5_000 {
            let mut hint = rng.usize(..ids.len() + 3);
            let want = rng.usize(..ids.len());
            assert_eq!(table.find(ids[want], &mut hint), Some(want));
            assert_eq!(hint, want);
            let absent = FileId(ids[want].0 + 1);
            if ids.binary_search(&absent).is_err() {
                let before = hint;
                assert_eq!(table.find(absent, &mut hint), None);
                assert_eq!(hint, before, "a miss leaves the hint");
            }
        }
    }

    /// An indexed file that `State::files` lacks (apply never leaves one) still gets a place
    /// in the table instead of failing the snapshot.
    #[test]
    fn test_file_table_adds_indexed_files_missing_from_the_file_map() {
        let mut state = State::default();
        let mut partition = PartitionState::default();
        let entry = |base: i64, file: u128| IndexEntry {
            base_offset: base,
            last_offset: base,
            file_id: FileId(file),
            byte_offset: 0,
            len: 1,
            first_timestamp: 0,
            max_timestamp: 0,
        };
        partition.index = [entry(0, 5), entry(1, 9), entry(2, 5)]
            .into_iter()
            .collect();
        state.files.insert(
            FileId(9),
            FileMeta {
                size: 1,
                buckets: vec![],
                live_batches: 1,
                tier: Default::default(),
            },
        );
        state.topics.insert(
            "t".into(),
            Topic {
                name: "t".into(),
                id: TopicId([1; 16]),
                configs: BTreeMap::new(),
                partitions: vec![partition],
            },
        );
        let table = FileTable::of(&state);
        assert_eq!(table.ids, [FileId(5), FileId(9)]);
    }
}
