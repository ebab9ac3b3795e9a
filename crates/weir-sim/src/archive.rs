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
use weir_storage::keys;

#[derive(Debug, Default)]
pub(crate) struct LogArchive {
    slots: Mutex<BTreeMap<u64, Bytes>>,
}

impl LogArchive {
    /// Notes a PUT of `key` that landed in the metadata bucket (other keys are ignored).
    pub(crate) fn landed(&self, key: &Path, bytes: Bytes, create_only: bool) {
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
