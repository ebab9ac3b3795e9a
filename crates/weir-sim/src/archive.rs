//! Every metadata-log slot object ever written, as the metadata bucket's gates saw it land.
//!
//! Log GC deletes slots that two snapshots cover, so the bucket no longer holds the log from
//! slot 0. The auditor's independent replay ([`crate::replay`]) and its measure of what was
//! durable at a moment ([`crate::ledger`]) read this archive instead: a slot once written stays
//! readable here whatever GC does to the bucket afterwards.
//!
//! Slots are written create-only, so the first create that lands is the slot's record: a later
//! create of the same key can only land after GC deleted the slot (a deposed writer's held PUT,
//! a retried ambiguous write), and no replay of the live log reads it, because replay starts at
//! a snapshot past it. Keeping the first bytes is therefore what "the log" means; a plain
//! overwrite (which no writer does) replaces them, as it would replace the object.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use object_store::path::Path;
use tokio::time::Instant;
use weir_storage::keys;

#[derive(Debug, Default)]
pub(crate) struct LogArchive {
    slots: Mutex<BTreeMap<u64, Bytes>>,
    /// Leadership as it landed (cluster seeds): each epoch object's claimant and when it
    /// landed, and each lease write.
    claims: Mutex<Claims>,
}

/// Epoch claims and lease writes, in the order they landed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Claims {
    /// Epoch → (when its object landed, the claimant's address).
    pub(crate) epochs: BTreeMap<u64, (Instant, String)>,
    /// Epoch → every write of its lease that moved its counter (a retried PUT of the same
    /// counter moves nothing a follower could see): when it landed, the leader's node id,
    /// released.
    pub(crate) leases: BTreeMap<u64, Vec<(Instant, i32, bool)>>,
    /// Epoch → the counter its lease last landed with.
    counters: BTreeMap<u64, u64>,
}

impl LogArchive {
    /// Notes a PUT of `key` that landed in the metadata bucket (other keys are ignored).
    pub(crate) fn landed(&self, key: &Path, bytes: Bytes, create_only: bool) {
        self.note_leadership(key, &bytes);
        let Some(seq) = keys::parse_meta_log(key) else {
            return;
        };
        let mut slots = self.lock();
        if create_only {
            slots.entry(seq).or_insert(bytes);
        } else {
            slots.insert(seq, bytes);
        }
    }

    /// Notes an epoch claim or a lease write that landed.
    fn note_leadership(&self, key: &Path, bytes: &Bytes) {
        let mut parts = key.parts();
        let (Some(meta), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Ok(epoch), "meta") = (name.as_ref().parse::<u64>(), meta.as_ref()) else {
            return;
        };
        let now = Instant::now();
        let mut claims = self
            .claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match kind.as_ref() {
            "epoch" => {
                let address = weir_format::envelope::decode_envelope(bytes)
                    .ok()
                    .and_then(|envelope| {
                        serde_json::from_slice::<serde_json::Value>(envelope.payload).ok()
                    })
                    .and_then(|body| body.get("address")?.as_str().map(str::to_string))
                    .unwrap_or_default();
                claims.epochs.entry(epoch).or_insert((now, address));
            }
            "lease" => {
                if let Ok(lease) = serde_json::from_slice::<weir_control::leadership::Lease>(bytes)
                {
                    if claims.counters.insert(epoch, lease.counter) != Some(lease.counter) {
                        claims.leases.entry(epoch).or_default().push((
                            now,
                            lease.node_id,
                            lease.released,
                        ));
                    }
                }
            }
            _ => {}
        }
    }

    /// Epoch claims and lease writes so far.
    pub(crate) fn claims(&self) -> Claims {
        self.claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The record slot `seq` holds, or held before GC deleted it.
    pub(crate) fn slot(&self, seq: u64) -> Option<Bytes> {
        self.lock().get(&seq).cloned()
    }

    /// The first slot at or after `from` never written: slots `from..` that, with those below
    /// `from`, recovery would read without a hole.
    pub(crate) fn first_missing(&self, from: u64) -> u64 {
        let slots = self.lock();
        let mut seq = from;
        while slots.contains_key(&seq) {
            seq += 1;
        }
        seq
    }

    /// Slots written so far, live or collected.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Bytes>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_archive_keeps_the_first_create_and_ignores_other_keys() {
        let archive = LogArchive::default();
        archive.landed(&keys::meta_log(0), Bytes::from_static(b"a"), true);
        archive.landed(&keys::meta_log(0), Bytes::from_static(b"b"), true);
        archive.landed(&keys::meta_log(1), Bytes::from_static(b"c"), true);
        archive.landed(&keys::meta_log(1), Bytes::from_static(b"d"), false);
        archive.landed(&keys::meta_snapshot(5), Bytes::from_static(b"s"), true);
        assert_eq!(archive.slot(0).as_deref(), Some(&b"a"[..]));
        assert_eq!(archive.slot(1).as_deref(), Some(&b"d"[..]));
        assert_eq!(archive.slot(5), None);
        assert_eq!(archive.first_missing(0), 2);
        assert_eq!(archive.first_missing(3), 3);
        assert_eq!(archive.len(), 2);
    }
}
