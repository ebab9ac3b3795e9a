//! The log start: retention and DeleteRecords move it forward (`AdvanceLogStart`), which drops
//! index entries from the front and releases the files whose last live batch left. Released
//! files wait in `State::released` until the deleter has removed them from every bucket and
//! says so with `FilesDeleted` (GC-1: only a release that is durable in the log is deleted).

use weir_common::{FileId, TopicId};

use super::{FileMeta, PartitionState, State};
use crate::entry::LogStartMove;
use crate::ControlError;

impl State {
    /// Applies an `AdvanceLogStart`: one result per move, in order (the new log start).
    pub(super) fn advance_log_start(
        &mut self,
        topic_id: &TopicId,
        moves: &[LogStartMove],
    ) -> Vec<Result<i64, ControlError>> {
        let Some(name) = self.topic_names_by_id.get(topic_id).cloned() else {
            let error = ControlError::UnknownTopicOrPartition(topic_id.to_string());
            return vec![Err(error); moves.len()];
        };
        let mut released = Vec::new();
        // A log start never passes a pending batch (RFC 0006): it may still be aborted, and
        // what is below the log start is gone for good.
        let first_pending: Vec<Option<i64>> = moves
            .iter()
            .map(|mv| self.first_pending(topic_id, mv.partition))
            .collect();
        let results = moves
            .iter()
            .zip(first_pending)
            .map(|(mv, first_pending)| {
                let partition = self
                    .topics
                    .get_mut(&name)
                    .and_then(|topic| {
                        usize::try_from(mv.partition)
                            .ok()
                            .and_then(|index| topic.partitions.get_mut(index))
                    })
                    .ok_or_else(|| {
                        ControlError::UnknownTopicOrPartition(format!("{name}-{}", mv.partition))
                    })?;
                advance_partition(partition, mv.offset, first_pending, &mut released)
            })
            .collect();
        for file_id in released {
            self.release_batch(file_id);
        }
        results
    }

    /// One batch of `file_id` left the index: the file is released with its last live batch.
    pub(super) fn release_batch(&mut self, file_id: FileId) {
        if let Some(meta) = self.files.get_mut(&file_id) {
            meta.live_batches = meta.live_batches.saturating_sub(1);
            if meta.live_batches == 0 {
                if let Some(meta) = self.files.remove(&file_id) {
                    self.released.insert(file_id, meta);
                }
            }
        }
    }

    /// A committed file none of whose batches was appended (all duplicates or rejected): no
    /// index entry will ever name it, so it is released at once.
    pub(super) fn release_unused_file(&mut self, file_id: FileId, meta: FileMeta) {
        self.released.insert(file_id, meta);
    }

    /// Applies a `FilesDeleted`: forgets the released files the deleter removed.
    pub(super) fn files_deleted(&mut self, files: &[FileId]) -> usize {
        files
            .iter()
            .filter(|id| self.released.remove(*id).is_some())
            .count()
    }

    /// Whether `file_id` was ever committed and is still remembered (live or released). No
    /// entry may commit such an id again: the deleter may be removing its objects.
    pub fn knows_file(&self, file_id: &FileId) -> bool {
        self.files.contains_key(file_id) || self.released.contains_key(file_id)
    }
}

/// Moves one partition's log start to `offset` (-1: the high watermark). Never backwards, never
/// past the high watermark or the first pending batch; batches wholly below the new start leave the index and their files
/// are pushed to `released` (one push per batch).
fn advance_partition(
    partition: &mut PartitionState,
    offset: i64,
    first_pending: Option<i64>,
    released: &mut Vec<FileId>,
) -> Result<i64, ControlError> {
    let high_watermark = first_pending.map_or(partition.high_watermark, |first| {
        first.min(partition.high_watermark)
    });
    let offset = if offset == -1 { high_watermark } else { offset };
    if offset < 0 || offset > high_watermark {
        return Err(ControlError::OffsetOutOfRange {
            offset,
            log_start_offset: partition.log_start_offset,
            high_watermark,
        });
    }
    if offset <= partition.log_start_offset {
        return Ok(partition.log_start_offset);
    }
    partition.log_start_offset = offset;
    let dropped = partition
        .index
        .partition_point(|entry| entry.last_offset < offset);
    partition
        .index
        .remove_front(dropped, |entry| released.push(entry.file_id));
    Ok(offset)
}
