//! Encoding a binary snapshot body (RFC 0003 §8): the `small` section (the state without batch
//! indexes, as JSON), the file table, then one columnar `index` section per partition, cut into
//! chunks as it is produced so the encoder holds about one chunk at a time.

use std::collections::BTreeMap;
use std::io;

use bytes::{Bytes, BytesMut};
use serde::{Serialize, Serializer};
use weir_common::{FileId, TopicId};
use weir_format::{FormatError, IndexEncoder, IndexRow, INDEX_BLOCK_ROWS};

use super::{ChunkInfo, Section};
use crate::log::FenceSlots;
use crate::state::{
    FileMeta, GroupOffsets, IndexEntry, PartitionState, ProducerPartitionState, State, Topic,
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
    let mut sections = Vec::new();

    let start = out.written;
    let small = SmallRef {
        state: StateRef::new(state),
        fence,
    };
    serde_json::to_writer(&mut out, &small).map_err(|err| match err.io_error_kind() {
        Some(_) => EncodeError::Aborted,
        None => EncodeError::Json(err),
    })?;
    sections.push(Section::Small {
        offset: start,
        len: out.written - start,
    });

    let files = FileTable::of(state);
    let start = out.written;
    for id in &files.ids {
        out.put(&id.0.to_be_bytes())?;
    }
    sections.push(Section::Files {
        offset: start,
        len: out.written - start,
        count: files.ids.len() as u64,
    });

    let mut rows = Vec::with_capacity(INDEX_BLOCK_ROWS);
    let mut block = Vec::new();
    for (name, topic) in &state.topics {
        for (number, partition) in topic.partitions.iter().enumerate() {
            let count = partition.index.len();
            if count == 0 {
                continue;
            }
            let start = out.written;
            let mut encoder = IndexEncoder::new();
            let mut entries = partition.index.iter().peekable();
            while entries.peek().is_some() {
                rows.clear();
                rows.extend(
                    entries
                        .by_ref()
                        .take(INDEX_BLOCK_ROWS)
                        .map(|e| files.row(e)),
                );
                block.clear();
                encoder
                    .encode_block(&rows, &mut block)
                    .map_err(EncodeError::Format)?;
                out.put(&block)?;
            }
            sections.push(Section::Index {
                topic: name.clone(),
                partition: number as u32,
                offset: start,
                len: out.written - start,
                entries: count as u64,
            });
        }
    }
    out.finish()?;
    Ok(BodyLayout {
        chunks: out.chunks,
        sections,
    })
}

/// The files the indexes name, sorted: an index row names its file by position here (a few
/// bytes) instead of by id (16).
struct FileTable {
    ids: Vec<FileId>,
}

impl FileTable {
    fn of(state: &State) -> Self {
        let mut ids = Vec::new();
        for partition in state.topics.values().flat_map(|t| t.partitions.iter()) {
            let mut last = None;
            for entry in partition.index.iter() {
                if last != Some(entry.file_id) {
                    ids.push(entry.file_id);
                    last = Some(entry.file_id);
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Self { ids }
    }

    fn row(&self, entry: &IndexEntry) -> IndexRow {
        // Built from these very entries: every file is in the table.
        let file = self
            .ids
            .binary_search(&entry.file_id)
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
    producer_epochs: &'a BTreeMap<i64, i16>,
    producer_last_ms: &'a BTreeMap<i64, i64>,
    #[serde(serialize_with = "topics_without_index")]
    topics: &'a BTreeMap<String, Topic>,
    files: &'a BTreeMap<FileId, FileMeta>,
    agent_tips: &'a BTreeMap<String, FileId>,
    group_offsets: &'a BTreeMap<String, GroupOffsets>,
    released: &'a BTreeMap<FileId, FileMeta>,
    sweep_horizon_ms: i64,
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
    producers: &'a BTreeMap<i64, ProducerPartitionState>,
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
