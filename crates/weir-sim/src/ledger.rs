//! Every DELETE of a data file the gates saw, with what was durable in the metadata log at that
//! moment, for the auditor's GC-1 check: a file may only be deleted once the durable state no
//! longer indexes it (its release is durable). The gate records a delete before passing it on,
//! so "durable at that moment" is measured before the object can disappear.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use tokio::time::Instant;
use weir_storage::keys;

use crate::archive::LogArchive;

/// One DELETE of a data file, as a gate saw it.
#[derive(Debug, Clone)]
pub(crate) struct DeleteSeen {
    pub(crate) key: Path,
    pub(crate) bucket: usize,
    /// Log slots `0..durable_slots` were all in the metadata bucket when the gate saw it.
    pub(crate) durable_slots: u64,
    /// The key was deleted before (another holder, a retry, a late copy): checked then.
    pub(crate) repeat: bool,
    /// The object was empty when deleted (an unused pooled object: the WriterPool's discard).
    pub(crate) empty: bool,
}

#[derive(Debug)]
pub(crate) struct DeleteLedger {
    /// The log slots written (the bucket may have lost covered ones to log GC).
    archive: Arc<LogArchive>,
    /// Slots known to be durable (the durable prefix only grows).
    durable_hint: AtomicU64,
    /// Not yet checked by the auditor, in the order seen.
    unchecked: Mutex<Vec<DeleteSeen>>,
    /// When each key was first deleted (for fetches that find an object gone).
    first: Mutex<BTreeMap<Path, Instant>>,
    /// PUTs of a data file that landed after a DELETE of it (background copies).
    late_copies: AtomicU64,
    /// The data buckets' raw stores, to see whether a deleted object was empty.
    raws: Vec<Arc<InMemory>>,
}

impl DeleteLedger {
    /// A ledger over the data buckets' raw stores `raws` (indexed as gates name buckets).
    pub(crate) fn new(archive: Arc<LogArchive>, raws: Vec<Arc<InMemory>>) -> DeleteLedger {
        DeleteLedger {
            archive,
            durable_hint: AtomicU64::new(0),
            unchecked: Mutex::new(Vec::new()),
            first: Mutex::new(BTreeMap::new()),
            late_copies: AtomicU64::new(0),
            raws,
        }
    }

    /// How many slots from 0 were written without a hole: what recovery reads (from a
    /// snapshot and the slots after it, once GC deleted the covered ones).
    fn durable_slots(&self) -> u64 {
        let slots = self
            .archive
            .first_missing(self.durable_hint.load(Ordering::SeqCst));
        self.durable_hint.fetch_max(slots, Ordering::SeqCst);
        slots
    }

    /// Notes a DELETE of `key` in `bucket` (other keys than data files are not recorded).
    pub(crate) async fn record(&self, key: &Path, bucket: usize) {
        if !key.prefix_matches(&keys::ingest_prefix())
            && !key.prefix_matches(&keys::compacted_prefix())
        {
            return;
        }
        let durable_slots = self.durable_slots();
        let empty = match self.raws.get(bucket) {
            Some(raw) => raw.head(key).await.is_ok_and(|meta| meta.size == 0),
            None => false,
        };
        let repeat = lock(&self.first).contains_key(key);
        lock(&self.first)
            .entry(key.clone())
            .or_insert_with(Instant::now);
        lock(&self.unchecked).push(DeleteSeen {
            key: key.clone(),
            bucket,
            durable_slots,
            repeat,
            empty,
        });
    }

    /// Notes a PUT of `key` that landed: a late copy if the key was deleted before.
    pub(crate) fn landed(&self, key: &Path) {
        if lock(&self.first).contains_key(key) {
            self.late_copies.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(crate) fn late_copies(&self) -> u64 {
        self.late_copies.load(Ordering::SeqCst)
    }

    /// The deletes seen since the last call, in order.
    pub(crate) fn take(&self) -> Vec<DeleteSeen> {
        std::mem::take(&mut *lock(&self.unchecked))
    }

    /// Every data file key deleted so far, with when it was first deleted.
    pub(crate) fn deleted(&self) -> BTreeMap<Path, Instant> {
        lock(&self.first).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
