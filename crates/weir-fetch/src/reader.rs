use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use object_store::path::Path;
use weir_common::{FileId, TopicId};
use weir_control::{ControlPlane, IndexEntry};
use weir_protocol::batch::rewrite_offsets;
use weir_storage::{keys, QuorumWriter, ReadCache};

/// Leader epoch Weir reports: there is one logical leader per partition and it never changes.
pub const LEADER_EPOCH: i32 = 0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("offset {offset} is outside [{log_start_offset}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        high_watermark: i64,
    },
    #[error("storage read failed: {0}")]
    Storage(String),
}

/// What to read for one partition, decided under the state lock.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    entries: Vec<(IndexEntry, Vec<u8>)>,
}

impl ReadPlan {
    pub fn byte_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(entry, _)| entry.len as usize)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Data for one partition of a fetch response.
#[derive(Debug, Clone)]
pub struct PartitionData {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Bytes,
}

/// Reads record batches of committed files.
#[derive(Debug, Clone)]
pub struct FetchReader {
    control: ControlPlane,
    buckets: Arc<QuorumWriter>,
    cache: Arc<ReadCache>,
}

impl FetchReader {
    pub fn new(control: ControlPlane, buckets: Arc<QuorumWriter>, cache: Arc<ReadCache>) -> Self {
        Self {
            control,
            buckets,
            cache,
        }
    }

    /// Picks the batches from `offset` up to `max_bytes` (at least one batch if `at_least_one`).
    pub fn plan(
        &self,
        topic_id: &TopicId,
        partition: i32,
        offset: i64,
        max_bytes: usize,
        at_least_one: bool,
    ) -> Result<ReadPlan, FetchError> {
        self.control.read(|state| {
            let Some(partition) = state.partition(topic_id, partition) else {
                return Err(FetchError::UnknownTopicOrPartition);
            };
            let high_watermark = partition.stable_high_watermark;
            let log_start_offset = partition.log_start_offset;
            if offset < log_start_offset || offset > high_watermark {
                return Err(FetchError::OffsetOutOfRange {
                    offset,
                    log_start_offset,
                    high_watermark,
                });
            }
            let first = partition
                .index
                .partition_point(|entry| entry.last_offset < offset);
            let mut entries = Vec::new();
            let mut bytes = 0usize;
            for entry in &partition.index[first..] {
                if entry.base_offset >= high_watermark {
                    break;
                }
                let fits = bytes + entry.len as usize <= max_bytes;
                let must_take_first = at_least_one && entries.is_empty();
                if !(fits || must_take_first) {
                    break;
                }
                let holders = state
                    .files
                    .get(&entry.file_id)
                    .map(|meta| meta.buckets.clone())
                    .unwrap_or_default();
                bytes += entry.len as usize;
                entries.push((*entry, holders));
            }
            Ok(ReadPlan {
                high_watermark,
                log_start_offset,
                entries,
            })
        })
    }

    /// Reads the planned batches, coalescing adjacent ranges of one file into one request, and
    /// rewrites each batch's base offset to its assigned offset.
    pub async fn read(&self, plan: ReadPlan) -> Result<PartitionData, FetchError> {
        let mut out = BytesMut::with_capacity(plan.byte_len());
        let mut index = 0;
        while index < plan.entries.len() {
            let (first, holders) = &plan.entries[index];
            // Fresh batches are cached one range per batch (write-through): serve a hit before
            // coalescing, or a multi-batch range would miss the cache and go to storage.
            let first_key = keys::ingest_file(&first.file_id.to_string(), first.file_id.unix_ms());
            let first_range = first.byte_offset..first.byte_offset + u64::from(first.len);
            if let Some(batch) = self.cache.get(&first_key, first_range) {
                let position = out.len();
                out.extend_from_slice(&batch);
                rewrite_offsets(&mut out[position..], first.base_offset, LEADER_EPOCH);
                index += 1;
                continue;
            }
            let mut end = index + 1;
            while end < plan.entries.len()
                && plan.entries[end].0.file_id == first.file_id
                && plan.entries[end].0.byte_offset
                    == plan.entries[end - 1].0.byte_offset + u64::from(plan.entries[end - 1].0.len)
            {
                end += 1;
            }
            let last = &plan.entries[end - 1].0;
            let range = first.byte_offset..last.byte_offset + u64::from(last.len);
            let bytes = self
                .read_range(first.file_id, holders, range.clone())
                .await?;
            for (entry, _) in &plan.entries[index..end] {
                let start = (entry.byte_offset - range.start) as usize;
                let batch = bytes
                    .get(start..start + entry.len as usize)
                    .ok_or_else(|| FetchError::Storage("short read".into()))?;
                let position = out.len();
                out.extend_from_slice(batch);
                rewrite_offsets(&mut out[position..], entry.base_offset, LEADER_EPOCH);
            }
            index = end;
        }
        Ok(PartitionData {
            high_watermark: plan.high_watermark,
            log_start_offset: plan.log_start_offset,
            records: out.freeze(),
        })
    }

    async fn read_range(
        &self,
        file_id: FileId,
        holders: &[u8],
        range: Range<u64>,
    ) -> Result<Bytes, FetchError> {
        let key: Path = keys::ingest_file(&file_id.to_string(), file_id.unix_ms());
        if let Some(bytes) = self.cache.get(&key, range.clone()) {
            return Ok(bytes);
        }
        let holders: Vec<usize> = holders.iter().map(|h| *h as usize).collect();
        let bytes = self
            .buckets
            .get_range(&holders, &key, range.clone())
            .await
            .map_err(|err| FetchError::Storage(err.to_string()))?;
        self.cache.insert_range(&key, range, bytes.clone());
        Ok(bytes)
    }
}
