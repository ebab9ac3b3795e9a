//! The auditor's check of producer expiry (RFC 0003 §4), restated independently of apply and
//! run on every entry of the independent replay ([`crate::replay`]):
//!
//! * (e) a batch of a producer id the state does not know (expired) is appended only at
//!   sequence 0 (which revives the id), or after such a batch of its partition in the same
//!   entry: never at another sequence;
//! * `ExpireProducers { before_ms }` forgets only ids whose last activity is before `before_ms`.
//!   Activity is restated here from the log: an `InitProducerId`'s `at_ms`, and the file id
//!   time of every batch appended or recognised as a duplicate.

use std::collections::{BTreeMap, BTreeSet};

use weir_control::{BatchOutcome, Entry, EntryResult, State};

#[derive(Debug, Default)]
pub(crate) struct ExpiryAudit {
    /// Producer id → last activity (ms), for ids the log has not expired.
    activity: BTreeMap<i64, i64>,
    /// Breaches found, not yet taken.
    breaches: Vec<String>,
}

impl ExpiryAudit {
    /// Applies `entry` (of slot `seq`) to `state`, checking it; its result.
    pub(crate) fn apply(&mut self, state: &mut State, entry: &Entry, seq: u64) -> EntryResult {
        let known: BTreeSet<i64> = match entry {
            Entry::CommitFile(_) | Entry::ExpireProducers { .. } => {
                state.producer_epochs.keys().copied().collect()
            }
            _ => BTreeSet::new(),
        };
        let result = state.apply(entry);
        match (entry, &result) {
            (Entry::CommitFile(commit), EntryResult::CommitFile(outcomes)) => {
                self.check_commit(commit, outcomes, &known, seq);
            }
            (Entry::InitProducerId { at_ms, .. }, EntryResult::InitProducerId(Ok((id, _)))) => {
                self.active(*id, *at_ms);
            }
            (Entry::ExpireProducers { before_ms }, _) => {
                self.check_expiry(state, *before_ms, &known, seq);
            }
            _ => {}
        }
        result
    }

    /// The breaches found since the last call.
    pub(crate) fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.breaches)
    }

    fn active(&mut self, producer_id: i64, at_ms: i64) {
        let last = self.activity.entry(producer_id).or_insert(at_ms);
        *last = (*last).max(at_ms);
    }

    fn check_commit(
        &mut self,
        commit: &weir_control::FileCommit,
        outcomes: &[BatchOutcome],
        known: &BTreeSet<i64>,
        seq: u64,
    ) {
        let mut revived = BTreeSet::new();
        for (batch, outcome) in commit.batches.iter().zip(outcomes) {
            if batch.producer_id < 0 || matches!(outcome, BatchOutcome::Rejected(_)) {
                continue;
            }
            self.active(batch.producer_id, commit.file_id.unix_ms());
            if known.contains(&batch.producer_id)
                || !matches!(outcome, BatchOutcome::Appended { .. })
            {
                continue;
            }
            let stream = (batch.producer_id, batch.partition);
            if batch.base_sequence == 0 {
                revived.insert(stream);
            } else if !revived.contains(&stream) {
                self.breaches.push(format!(
                    "slot {seq}: a batch of unknown (expired) producer {} was appended at \
                     sequence {} on p{}, not 0",
                    batch.producer_id, batch.base_sequence, batch.partition
                ));
            }
        }
    }

    fn check_expiry(&mut self, state: &State, before_ms: i64, known: &BTreeSet<i64>, seq: u64) {
        for id in known {
            let last = self.activity.get(id).copied().unwrap_or(0);
            let kept = state.producer_epochs.contains_key(id);
            if !kept && last >= before_ms {
                self.breaches.push(format!(
                    "slot {seq}: ExpireProducers before {before_ms} forgot producer {id}, active \
                     at {last}"
                ));
            }
        }
        self.activity.retain(|_, last| *last >= before_ms);
    }
}
