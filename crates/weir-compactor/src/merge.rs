//! The worker's pure part: what a job's inputs hold (from the index, never from their footers:
//! only the index knows assigned offsets and which batches were rejected) and the output file
//! built from their bytes.

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::{Bytes, BytesMut};
use weir_common::{FileId, TopicId};
use weir_control::{IndexEntry, ReplacedRun, State};
use weir_format::{BatchMeta, EncodedFile, FileBuilder};
use weir_protocol::batch::{rewrite_offsets, BatchHeader};

/// The live batches of a job's inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gathered {
    /// Each input still live: its size and holders (positions in the ingest bucket list).
    pub inputs: BTreeMap<FileId, (u64, Vec<u8>)>,
    /// Per partition, in (topic id, partition) order: its batches in the inputs, in offset
    /// order.
    pub partitions: Vec<((TopicId, i32), Vec<IndexEntry>)>,
}

impl Gathered {
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    pub fn batch_count(&self) -> usize {
        self.partitions.iter().map(|(_, e)| e.len()).sum()
    }
}

/// The durable batches of `inputs` that the index of `state` holds.
pub fn gather(state: &State, inputs: &[FileId]) -> Gathered {
    let wanted: HashSet<FileId> = inputs
        .iter()
        .filter(|id| state.files.contains_key(*id))
        .copied()
        .collect();
    let mut gathered = Gathered {
        inputs: wanted
            .iter()
            .map(|id| {
                let meta = &state.files[id];
                (*id, (meta.size, meta.buckets.clone()))
            })
            .collect(),
        partitions: Vec::new(),
    };
    if wanted.is_empty() {
        return gathered;
    }
    let mut by_partition: BTreeMap<(TopicId, i32), Vec<IndexEntry>> = BTreeMap::new();
    for topic in state.topics.values() {
        for (p, partition) in topic.partitions.iter().enumerate() {
            let durable = partition.stable_high_watermark;
            let entries: Vec<IndexEntry> = partition
                .index
                .iter()
                .filter(|e| wanted.contains(&e.file_id) && e.last_offset < durable)
                .copied()
                .collect();
            if !entries.is_empty() {
                by_partition.insert((topic.id, p as i32), entries);
            }
        }
    }
    gathered.partitions = by_partition.into_iter().collect();
    gathered
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MergeError {
    #[error("input {file} was not read")]
    Missing { file: FileId },
    #[error("input {file}: batch at {base_offset} ({range:?}) is not a record batch: {why}")]
    Corrupt {
        file: FileId,
        base_offset: i64,
        range: std::ops::Range<u64>,
        why: String,
    },
}

/// An output file and its runs: what becomes one index entry each.
#[derive(Debug, Clone)]
pub struct Output {
    pub file: EncodedFile,
    pub runs: Vec<ReplacedRun>,
}

/// Lays the gathered batches out partition by partition in offset order, each batch's header
/// carrying its assigned base offset (the CRC does not cover it), from the inputs' bytes, and
/// cuts them into runs (RFC 0005 §3): consecutive offsets of one partition, back to back in the
/// output, at most `max_run_bytes` (a run of one batch may be longer).
pub fn build(
    gathered: &Gathered,
    bytes: &HashMap<FileId, Bytes>,
    max_run_bytes: u32,
) -> Result<Output, MergeError> {
    let mut builder = FileBuilder::new();
    let mut sources = Vec::with_capacity(gathered.batch_count());
    for ((topic_id, partition), entries) in &gathered.partitions {
        for entry in entries {
            let file = entry.file_id;
            let input = bytes.get(&file).ok_or(MergeError::Missing { file })?;
            let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
            let corrupt = |why: String| MergeError::Corrupt {
                file,
                base_offset: entry.base_offset,
                range: range.clone(),
                why,
            };
            let slice = input
                .get(range.start as usize..range.end as usize)
                .ok_or_else(|| corrupt(format!("the file has {} bytes", input.len())))?;
            let header = BatchHeader::parse(slice).map_err(|e| corrupt(e.to_string()))?;
            if header.total_len() != slice.len()
                || header.offset_span() != entry.last_offset - entry.base_offset + 1
            {
                return Err(corrupt(format!(
                    "header says {} bytes and {} offsets",
                    header.total_len(),
                    header.offset_span()
                )));
            }
            let mut batch = BytesMut::from(slice);
            rewrite_offsets(&mut batch, entry.base_offset, header.partition_leader_epoch);
            let meta = BatchMeta {
                record_count: header.records_count,
                first_timestamp: header.first_timestamp,
                max_timestamp: header.max_timestamp,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                base_sequence: header.base_sequence,
            };
            builder.push(topic_id.0, *partition, batch.freeze(), meta);
            sources.push((*topic_id, *partition, *entry));
        }
    }
    let file = builder.finish();
    let locations = file.footer.partitions.iter().flat_map(|p| p.batches.iter());
    let mut runs: Vec<ReplacedRun> = Vec::new();
    for ((topic_id, partition, entry), location) in sources.into_iter().zip(locations) {
        let extends = runs.last().is_some_and(|run| {
            (run.topic_id, run.partition) == (topic_id, partition)
                && run.last_offset + 1 == entry.base_offset
                && run.byte_offset + u64::from(run.len) == location.offset
                && run.len.saturating_add(location.len) <= max_run_bytes
        });
        match runs.last_mut() {
            Some(run) if extends => {
                run.last_offset = entry.last_offset;
                run.len += location.len;
                run.entries += 1;
            }
            _ => runs.push(ReplacedRun {
                topic_id,
                partition,
                base_offset: entry.base_offset,
                last_offset: entry.last_offset,
                byte_offset: location.offset,
                len: location.len,
                entries: 1,
            }),
        }
    }
    Ok(Output { file, runs })
}
