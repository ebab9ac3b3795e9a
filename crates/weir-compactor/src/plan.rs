//! The planner's pure part: which ingest files go into which job (RFC 0005 §6).
//!
//! Live ingest files old enough (`min_input_age`), oldest first, never a file already in an
//! outstanding job, are grouped into jobs of at most `target_file_bytes` and `max_inputs`. A full
//! group is a job; the last, partial group becomes one only once its oldest file has waited
//! `max_input_age`, so a slow topic still gets compacted within that lag.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use weir_common::{FileId, Tier};
use weir_control::State;

use crate::Settings;

/// A compaction job as it travels through the queue: the input files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// File ids as text (ULIDs), oldest first.
    pub inputs: Vec<String>,
}

impl JobSpec {
    pub fn new(inputs: &[FileId]) -> JobSpec {
        JobSpec {
            inputs: inputs.iter().map(FileId::to_string).collect(),
        }
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a job spec serialises")
    }

    /// The spec in `payload`, or `None` for a payload this build cannot read (acked and
    /// dropped: the files are planned again).
    pub fn decode(payload: &str) -> Option<JobSpec> {
        serde_json::from_str(payload).ok()
    }

    /// The input ids; `None` if one does not parse.
    pub fn files(&self) -> Option<Vec<FileId>> {
        self.inputs.iter().map(|id| FileId::parse(id)).collect()
    }
}

/// The jobs to push now, given the durable `state`, the wall clock and the files already in
/// outstanding jobs.
pub fn plan(
    state: &State,
    now_ms: i64,
    outstanding: &HashSet<FileId>,
    settings: &Settings,
) -> Vec<Vec<FileId>> {
    let min_age = settings.min_input_age.as_millis() as i64;
    let max_age = settings.max_input_age.as_millis() as i64;
    let candidates = state.files.iter().filter(|(id, meta)| {
        meta.tier == Tier::Ingest
            && !outstanding.contains(id)
            && now_ms.saturating_sub(id.unix_ms()) >= min_age
    });
    let mut jobs = Vec::new();
    let mut group: Vec<FileId> = Vec::new();
    let mut bytes = 0u64;
    // `files` is ordered by id, and ids start with their creation time: oldest first.
    for (id, meta) in candidates {
        group.push(*id);
        bytes += meta.size;
        if bytes >= settings.target_file_bytes || group.len() >= settings.max_inputs.max(1) {
            jobs.push(std::mem::take(&mut group));
            bytes = 0;
        }
    }
    if let Some(oldest) = group.first() {
        if now_ms.saturating_sub(oldest.unix_ms()) >= max_age {
            jobs.push(group);
        }
    }
    jobs
}
