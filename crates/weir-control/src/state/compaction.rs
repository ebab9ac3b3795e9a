//! Applying compaction's swap, `ReplaceFiles` (RFC 0005 §4).
//!
//! Two passes over the entry's batches: the first checks every batch against the index and
//! changes nothing, the second moves them. Per batch:
//! - its partition or topic is gone, or retention moved the log start past it: **skipped** (the
//!   worker read it before it left; nothing to move);
//! - the index holds it at `base_offset` with the same `last_offset` in the file `from`:
//!   **replaced** — the entry now names the output at the batch's new position;
//! - anything else (another file, another range): **conflict** — another compaction moved it
//!   first, or the worker read something the index never held. The whole entry is refused and
//!   nothing changes, so a job that runs twice commits once.
//!
//! The output must be a new id (never committed, not below the sweep horizon), as for commits.
//! An input whose last live batch moved is released (RFC 0003 §5: deleted after the grace); an
//! output none of whose batches was replaced is released at once.

use weir_common::FileId;

use crate::entry::{FileReplace, ReplaceOutcome, ReplacedBatch};
use crate::state::{FileMeta, State};
use crate::ControlError;

/// What the check pass decided for one batch.
enum Verdict {
    Skip,
    /// Replace the entry at this index position.
    Move(usize),
}

impl State {
    pub(super) fn replace_files(
        &mut self,
        replace: &FileReplace,
    ) -> Result<ReplaceOutcome, ControlError> {
        if replace.output.unix_ms() < self.sweep_horizon_ms {
            return Err(ControlError::FileTooOld {
                horizon_ms: self.sweep_horizon_ms,
            });
        }
        if self.knows_file(&replace.output) {
            return Err(ControlError::ReplaceConflict(format!(
                "output {} is already known",
                replace.output
            )));
        }
        let mut named = std::collections::HashSet::new();
        for batch in &replace.batches {
            if !named.insert((batch.topic_id, batch.partition, batch.base_offset)) {
                return Err(ControlError::ReplaceConflict(format!(
                    "{}-{} offset {} is named twice",
                    batch.topic_id, batch.partition, batch.base_offset
                )));
            }
        }
        let verdicts: Vec<Verdict> = replace
            .batches
            .iter()
            .map(|batch| self.check_replaced(batch, &replace.output))
            .collect::<Result<_, _>>()?;
        let mut replaced = 0u32;
        for (batch, verdict) in replace.batches.iter().zip(&verdicts) {
            let Verdict::Move(position) = verdict else {
                continue;
            };
            let moved = self.partition_mut(batch).is_some_and(|p| {
                p.index
                    .relocate(*position, replace.output, batch.byte_offset)
            });
            debug_assert!(moved, "checked in the first pass");
            if moved {
                replaced += 1;
                self.release_batch(batch.from);
            }
        }
        let meta = FileMeta {
            size: replace.size,
            buckets: replace.holders.clone(),
            live_batches: replaced,
            tier: replace.tier,
        };
        if replaced > 0 {
            self.files.insert(replace.output, meta);
        } else {
            self.release_unused_file(replace.output, meta);
        }
        Ok(ReplaceOutcome {
            replaced: replaced as usize,
            skipped: verdicts.len() - replaced as usize,
        })
    }

    fn check_replaced(
        &self,
        batch: &ReplacedBatch,
        output: &FileId,
    ) -> Result<Verdict, ControlError> {
        let Some(partition) = self.partition(&batch.topic_id, batch.partition) else {
            return Ok(Verdict::Skip);
        };
        if batch.last_offset < partition.log_start_offset {
            return Ok(Verdict::Skip);
        }
        let conflict = |why: &str| {
            ControlError::ReplaceConflict(format!(
                "{}-{} offsets {}..={} {why}",
                batch.topic_id, batch.partition, batch.base_offset, batch.last_offset
            ))
        };
        let position = partition
            .index
            .partition_point(|e| e.base_offset < batch.base_offset);
        let Some(entry) = partition.index.get(position) else {
            return Err(conflict("are not in the index"));
        };
        if entry.base_offset != batch.base_offset || entry.last_offset != batch.last_offset {
            return Err(conflict("are not one batch of the index"));
        }
        if entry.file_id != batch.from || entry.file_id == *output {
            return Err(conflict(&format!(
                "are in {}, not in {} (compacted already?)",
                entry.file_id, batch.from
            )));
        }
        if entry.len != batch.len {
            return Err(conflict("changed length"));
        }
        Ok(Verdict::Move(position))
    }

    fn partition_mut(&mut self, batch: &ReplacedBatch) -> Option<&mut super::PartitionState> {
        let name = self.topic_names_by_id.get(&batch.topic_id)?;
        let topic = self.topics.get_mut(name)?;
        usize::try_from(batch.partition)
            .ok()
            .and_then(|index| topic.partitions.get_mut(index))
    }
}

#[cfg(test)]
mod tests;
