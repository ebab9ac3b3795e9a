//! Applying compaction's swap, `ReplaceFiles` (RFC 0005 §4).
//!
//! A swap of this build names **runs** (RFC 0005 §3): consecutive batches of one partition laid
//! out back to back in the output, each run becoming one index entry. Two passes: the first
//! checks every run against the index and changes nothing, the second replaces them. Per run:
//! - its partition is gone, or retention moved the log start past it: **skipped**;
//! - retention removed a prefix of it: the rest is replaced, by an entry starting where the
//!   first remaining batch starts in the output (the run's bytes are its batches in order);
//! - every index entry in its offsets is in one of the job's inputs (never the output), the
//!   first starts and the last ends where the run does, and their count and bytes are what the
//!   worker read: **replaced**;
//! - anything else: **conflict**, and the whole entry is refused.
//!
//! Swaps written before runs name each **batch** (`batches`), and replay applies them as they
//! were applied then, one entry per batch. Two passes again; per batch:
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

use crate::entry::{FileReplace, ReplaceOutcome, ReplacedBatch, ReplacedRun};
use crate::state::{FileMeta, IndexEntry, State};
use crate::ControlError;

/// What the check pass decided for one batch.
enum Verdict {
    Skip,
    /// Replace the entry at this index position.
    Move(usize),
}

/// What the check pass decided for one run.
enum RunVerdict {
    /// Nothing of it is left: this many index entries skipped.
    Skip(u32),
    /// Replace this many index entries by `entry`; `trimmed` of the run's entries were gone.
    Replace {
        entry: IndexEntry,
        count: usize,
        trimmed: u32,
    },
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
        if !replace.batches.is_empty() && !replace.runs.is_empty() {
            return Err(ControlError::ReplaceConflict(
                "a swap names either batches or runs".into(),
            ));
        }
        let (replaced, skipped) = if replace.runs.is_empty() {
            self.replace_batches(replace)?
        } else {
            self.replace_runs(replace)?
        };
        Ok(ReplaceOutcome { replaced, skipped })
    }

    /// The runs of `replace`: (index entries replaced, index entries skipped). The output's
    /// live entries are its runs.
    fn replace_runs(&mut self, replace: &FileReplace) -> Result<(usize, usize), ControlError> {
        let inputs: std::collections::HashSet<FileId> = replace.inputs.iter().copied().collect();
        let mut spans: Vec<_> = replace
            .runs
            .iter()
            .map(|r| (r.topic_id, r.partition, r.base_offset, r.last_offset))
            .collect();
        spans.sort();
        for pair in spans.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if (a.0, a.1) == (b.0, b.1) && b.2 <= a.3 {
                return Err(ControlError::ReplaceConflict(format!(
                    "{}-{} runs overlap at offset {}",
                    b.0, b.1, b.2
                )));
            }
        }
        let verdicts: Vec<RunVerdict> = replace
            .runs
            .iter()
            .map(|run| self.check_run(run, &inputs, &replace.output))
            .collect::<Result<_, _>>()?;
        let (mut replaced, mut skipped, mut runs) = (0usize, 0usize, 0u32);
        for (run, verdict) in replace.runs.iter().zip(&verdicts) {
            let RunVerdict::Replace {
                entry,
                count,
                trimmed,
            } = verdict
            else {
                if let RunVerdict::Skip(entries) = verdict {
                    skipped += *entries as usize;
                }
                continue;
            };
            let Some(partition) = self.partition_mut(run.topic_id, run.partition) else {
                continue;
            };
            let index = &mut partition.index;
            let from = index.partition_point(|e| e.base_offset < entry.base_offset);
            let sources: Vec<FileId> = index
                .iter_from(from)
                .take(*count)
                .map(|e| e.file_id)
                .collect();
            let moved = index.replace_range(from, from + count, *entry);
            debug_assert!(moved, "checked in the first pass");
            if moved {
                runs += 1;
                replaced += count;
                skipped += *trimmed as usize;
                for source in sources {
                    self.release_batch(source);
                }
            }
        }
        self.add_output(replace, runs);
        Ok((replaced, skipped))
    }

    fn check_run(
        &self,
        run: &ReplacedRun,
        inputs: &std::collections::HashSet<FileId>,
        output: &FileId,
    ) -> Result<RunVerdict, ControlError> {
        let Some(partition) = self.partition(&run.topic_id, run.partition) else {
            return Ok(RunVerdict::Skip(run.entries));
        };
        if run.last_offset < partition.log_start_offset {
            return Ok(RunVerdict::Skip(run.entries));
        }
        let conflict = |why: String| {
            ControlError::ReplaceConflict(format!(
                "{}-{} run {}..={} {why}",
                run.topic_id, run.partition, run.base_offset, run.last_offset
            ))
        };
        let index = &partition.index;
        let from = index.partition_point(|e| e.last_offset < run.base_offset);
        let to = index.partition_point(|e| e.base_offset <= run.last_offset);
        let (Some(first), Some(last)) = (
            index.get(from),
            to.checked_sub(1).and_then(|l| index.get(l)),
        ) else {
            return Err(conflict("is not in the index".into()));
        };
        if from >= to || last.last_offset != run.last_offset {
            return Err(conflict("does not end where an index entry ends".into()));
        }
        // A prefix may be gone only if retention took it: the first entry left holds the
        // log start.
        let trimmed_front = first.base_offset > run.base_offset
            && from == 0
            && first.base_offset <= partition.log_start_offset;
        if first.base_offset != run.base_offset && !trimmed_front {
            return Err(conflict(
                "does not start where an index entry starts".into(),
            ));
        }
        if let Some(stray) = index
            .iter_from(from)
            .take(to - from)
            .find(|e| !inputs.contains(&e.file_id) || e.file_id == *output)
        {
            return Err(conflict(format!(
                "holds {}..={} in {}, not in the job's inputs (compacted already?)",
                stray.base_offset, stray.last_offset, stray.file_id
            )));
        }
        let count = to - from;
        let bytes = index.bytes_between(from, to);
        let expected =
            !trimmed_front && count == run.entries as usize && bytes == u64::from(run.len);
        let fits = trimmed_front && count < run.entries as usize && bytes < u64::from(run.len);
        if !(expected || fits) {
            return Err(conflict(format!(
                "is {count} entries and {bytes} bytes in the index, {} and {} in the output",
                run.entries, run.len
            )));
        }
        let Ok(len) = u32::try_from(bytes) else {
            return Err(conflict("is too long".into()));
        };
        let max_timestamp = index
            .max_timestamp_between(from, to)
            .map_or(first.max_timestamp, |(_, max)| max);
        Ok(RunVerdict::Replace {
            entry: IndexEntry {
                base_offset: first.base_offset,
                last_offset: run.last_offset,
                file_id: *output,
                byte_offset: run.byte_offset + (u64::from(run.len) - bytes),
                len,
                first_timestamp: first.first_timestamp,
                max_timestamp,
            },
            count,
            trimmed: run.entries - count as u32,
        })
    }

    /// The output of a swap that put `live` index entries in it: live, or released at once
    /// when nothing of it is used.
    fn add_output(&mut self, replace: &FileReplace, live: u32) {
        let meta = FileMeta {
            size: replace.size,
            buckets: replace.holders.clone(),
            live_batches: live,
            tier: replace.tier,
        };
        if live > 0 {
            self.files.insert(replace.output, meta);
        } else {
            self.release_unused_file(replace.output, meta);
        }
    }

    /// The per-batch `batches` of a swap from before runs: (replaced, skipped).
    fn replace_batches(&mut self, replace: &FileReplace) -> Result<(usize, usize), ControlError> {
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
            let moved = self
                .partition_mut(batch.topic_id, batch.partition)
                .is_some_and(|p| {
                    p.index
                        .relocate(*position, replace.output, batch.byte_offset)
                });
            debug_assert!(moved, "checked in the first pass");
            if moved {
                replaced += 1;
                self.release_batch(batch.from);
            }
        }
        self.add_output(replace, replaced);
        Ok((replaced as usize, verdicts.len() - replaced as usize))
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

    fn partition_mut(
        &mut self,
        topic_id: weir_common::TopicId,
        partition: i32,
    ) -> Option<&mut super::PartitionState> {
        let name = self.topic_names_by_id.get(&topic_id)?;
        let topic = self.topics.get_mut(name)?;
        usize::try_from(partition)
            .ok()
            .and_then(|index| topic.partitions.get_mut(index))
    }
}

#[cfg(test)]
mod tests;
