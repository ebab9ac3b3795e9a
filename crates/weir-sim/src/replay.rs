//! An independent, minimal replay of the metadata log, so a bug in the production replay
//! (`LogStore::replay`: snapshot choice, where replay starts and stops, the dead-slot rule) or
//! in log GC (a slot deleted that replay still needed) cannot fool both the system and its
//! auditor. It ignores snapshots, reads every slot from 0 until the first missing one from the
//! [`LogArchive`] of every slot written (log GC deletes covered slots from the bucket), and restates the dead-slot rule: a record whose epoch is below
//! the highest epoch seen so far was written by a deposed writer and is skipped. Only the
//! state machine (`State::apply`) and the envelope decoder are shared with production.

use weir_control::log::LogRecord;
use weir_control::State;
use weir_format::{decode_envelope, EnvelopeKind};
use weir_storage::keys;

use crate::archive::LogArchive;
use crate::expiry_audit::ExpiryAudit;
use crate::group_audit::GroupAudit;

/// The durable state after every live slot, replayed from slot 0.
pub(crate) fn replay_from_zero(archive: &LogArchive) -> Result<State, String> {
    let mut replay = Incremental::default();
    replay.advance(archive, u64::MAX)?;
    let mut state = replay.state;
    state.mark_all_stable();
    Ok(state)
}

/// The same replay, kept between calls and extended slot by slot as the log grows, so the
/// auditor can ask what was durable at a given moment (a slot count) without replaying again.
#[derive(Debug, Default)]
pub(crate) struct Incremental {
    state: State,
    /// Producer expiry checked on every entry applied.
    expiry: ExpiryAudit,
    /// Group coordinators checked on every stamped offset commit.
    groups: GroupAudit,
    highest_epoch: u64,
    next_seq: u64,
}

impl Incremental {
    /// The state after slots `0..self.next_seq()`.
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Producer expiry (RFC 0003 check e) and group coordinator (GRP-1) breaches found since
    /// the last call.
    pub(crate) fn take_breaches(&mut self) -> Vec<String> {
        let mut breaches = self.expiry.take();
        breaches.extend(self.groups.take());
        breaches
    }

    /// Applies the slots from `next_seq` up to `limit` (exclusive) or the first missing one.
    pub(crate) fn advance(&mut self, archive: &LogArchive, limit: u64) -> Result<(), String> {
        while self.next_seq < limit {
            let seq = self.next_seq;
            let key = keys::meta_log(seq);
            let Some(bytes) = archive.slot(seq) else {
                break;
            };
            let envelope = decode_envelope(&bytes).map_err(|err| format!("{key}: {err}"))?;
            if envelope.kind != EnvelopeKind::LogEntry || envelope.seq != seq {
                return Err(format!(
                    "{key}: holds {:?} of slot {}",
                    envelope.kind, envelope.seq
                ));
            }
            self.next_seq += 1;
            if envelope.epoch < self.highest_epoch {
                continue;
            }
            self.highest_epoch = envelope.epoch;
            let record: LogRecord =
                serde_json::from_slice(envelope.payload).map_err(|err| format!("{key}: {err}"))?;
            for entry in &record.entries {
                let before = self.groups.before(&self.state, entry);
                let result = self.expiry.apply(&mut self.state, entry, seq);
                if let Some(before) = before {
                    self.groups.after(before, entry, &result, seq);
                }
            }
        }
        Ok(())
    }
}

/// Differences between the production replay's state and the independent one (empty: equal).
pub(crate) fn compare(production: &State, independent: &State) -> Vec<String> {
    fn json<T: serde::Serialize>(value: &T) -> String {
        serde_json::to_string(value).expect("state serialises")
    }
    let fields = [
        (
            "cluster id",
            json(&production.cluster_id),
            json(&independent.cluster_id),
        ),
        ("epoch", json(&production.epoch), json(&independent.epoch)),
        (
            "producer ids",
            json(&(production.next_producer_id, &production.producer_epochs)),
            json(&(independent.next_producer_id, &independent.producer_epochs)),
        ),
        (
            "topics",
            json(&production.topics),
            json(&independent.topics),
        ),
        ("files", json(&production.files), json(&independent.files)),
        (
            "released files",
            json(&production.released),
            json(&independent.released),
        ),
        (
            "agent tips",
            json(&production.agent_tips),
            json(&independent.agent_tips),
        ),
        (
            "group offsets",
            json(&production.group_offsets),
            json(&independent.group_offsets),
        ),
        (
            "agent registry",
            json(&production.registry),
            json(&independent.registry),
        ),
    ];
    fields
        .into_iter()
        .filter(|(_, production, independent)| production != independent)
        .map(|(field, _, _)| {
            format!("production and independent replays of the metadata log disagree on {field}")
        })
        .collect()
}
