//! The auditor: after every step it rebuilds the durable state exactly as a recovering writer
//! would (snapshot + replay of the raw metadata log, no faults, no caches), reads each committed
//! batch's header straight from the raw bucket bytes, and checks the invariants against what the
//! clients were told and what the consumers read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::ObjectStoreExt;
use weir_common::{FileId, TopicId};
use weir_control::log::LogStore;
use weir_control::{IndexEntry, State};
use weir_protocol::batch::BatchHeader;
use weir_storage::keys;

use crate::client::BatchId;

/// What a committed batch is, read from its bytes in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) id: BatchId,
    pub(crate) producer_id: i64,
    pub(crate) base_sequence: i32,
    pub(crate) count: i32,
}

/// One batch at its offset in the durable log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) entry: IndexEntry,
    pub(crate) seen: Seen,
}

/// The durable log of the simulated topic, as recovery would find it.
#[derive(Debug)]
pub(crate) struct Shadow {
    pub(crate) partitions: Vec<Vec<Placed>>,
}

impl Shadow {
    pub(crate) fn high_watermark(&self, partition: usize) -> i64 {
        self.partitions[partition]
            .last()
            .map_or(0, |placed| placed.entry.last_offset + 1)
    }

    /// The batch starting at `base_offset`, if any.
    pub(crate) fn at(&self, partition: usize, base_offset: i64) -> Option<&Placed> {
        let batches = &self.partitions[partition];
        let index = batches.partition_point(|p| p.entry.base_offset < base_offset);
        batches
            .get(index)
            .filter(|p| p.entry.base_offset == base_offset)
    }
}

/// Counts of invariant breaches found in one audit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breaches {
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub gaps: u64,
}

impl Breaches {
    pub fn total(&self) -> u64 {
        self.lost + self.duplicated + self.reordered + self.gaps
    }
}

pub(crate) struct Auditor {
    raw_control: Arc<InMemory>,
    raw_buckets: Vec<Arc<InMemory>>,
    quorum: usize,
    /// Batch identity by (file, byte offset): files never change once written.
    identities: BTreeMap<(FileId, u64), Seen>,
    /// Files whose holders were checked to hold them.
    files_checked: BTreeSet<FileId>,
    /// Most dead slots (of deposed writers) one replay skipped.
    pub(crate) max_dead_slots: u64,
}

impl Auditor {
    pub(crate) fn new(
        raw_control: Arc<InMemory>,
        raw_buckets: Vec<Arc<InMemory>>,
        quorum: usize,
    ) -> Auditor {
        Auditor {
            raw_control,
            raw_buckets,
            quorum,
            identities: BTreeMap::new(),
            files_checked: BTreeSet::new(),
            max_dead_slots: 0,
        }
    }

    /// Forgets what was read, so the next audit re-reads every batch from the raw buckets
    /// (the final audit: acknowledged data must still be there, DUR-2).
    pub(crate) fn forget_reads(&mut self) {
        self.identities.clear();
        self.files_checked.clear();
    }

    /// Replays the raw metadata log twice, through production `LogStore::replay` and through
    /// the auditor's own [`crate::replay`], and reports any difference.
    pub(crate) async fn cross_check_replay(&self, violations: &mut Vec<String>) {
        let production = LogStore::new(self.raw_control.clone(), 1).replay().await;
        let independent = crate::replay::replay_from_zero(&self.raw_control).await;
        match (production, independent) {
            (Ok(production), Ok(independent)) => {
                violations.extend(crate::replay::compare(&production.state, &independent));
            }
            (Err(err), _) => violations.push(format!("production replay failed: {err}")),
            (_, Err(err)) => violations.push(format!("independent replay failed: {err}")),
        }
    }

    /// Replays the raw metadata log; problems go to `violations`.
    pub(crate) async fn shadow(
        &mut self,
        topic: TopicId,
        partitions: i32,
        violations: &mut Vec<String>,
    ) -> Option<Shadow> {
        let log = LogStore::new(self.raw_control.clone(), 1);
        let state = match log.replay().await {
            Ok(replayed) => {
                self.max_dead_slots = self.max_dead_slots.max(replayed.dead);
                replayed.state
            }
            Err(err) => {
                violations.push(format!("the durable metadata log does not replay: {err}"));
                return None;
            }
        };
        let mut out = Vec::new();
        for partition in 0..partitions {
            let Some(p) = state.partition(&topic, partition) else {
                violations.push(format!("partition {partition} missing from durable state"));
                return None;
            };
            if p.stable_high_watermark != p.high_watermark {
                violations.push(format!(
                    "p{partition}: replayed state has stable {} != high watermark {}",
                    p.stable_high_watermark, p.high_watermark
                ));
            }
            let mut placed = Vec::with_capacity(p.index.len());
            for entry in &p.index {
                let seen = self.identify(&state, entry, violations).await?;
                placed.push(Placed {
                    entry: *entry,
                    seen,
                });
            }
            let last = placed.last().map_or(0, |b| b.entry.last_offset + 1);
            if last != p.high_watermark {
                violations.push(format!(
                    "p{partition}: index ends at {last}, high watermark {}",
                    p.high_watermark
                ));
            }
            out.push(placed);
        }
        Some(Shadow { partitions: out })
    }

    /// Reads the batch's header from a holder (first time only) and checks every holder has
    /// the file (DUR-1: the file is in a quorum before its commit).
    async fn identify(
        &mut self,
        state: &State,
        entry: &IndexEntry,
        violations: &mut Vec<String>,
    ) -> Option<Seen> {
        if let Some(seen) = self.identities.get(&(entry.file_id, entry.byte_offset)) {
            return Some(*seen);
        }
        let key = keys::ingest_file(&entry.file_id.to_string(), entry.file_id.unix_ms());
        let Some(meta) = state.files.get(&entry.file_id) else {
            violations.push(format!(
                "file {} is indexed but has no metadata",
                entry.file_id
            ));
            return None;
        };
        if self.files_checked.insert(entry.file_id) {
            if meta.buckets.len() < self.quorum {
                violations.push(format!(
                    "file {} committed with {} holders, quorum is {}",
                    entry.file_id,
                    meta.buckets.len(),
                    self.quorum
                ));
            }
            for holder in &meta.buckets {
                let present = match self.raw_buckets.get(usize::from(*holder)) {
                    Some(bucket) => bucket.head(&key).await.is_ok(),
                    None => false,
                };
                if !present {
                    violations.push(format!(
                        "file {} is not in bucket {holder} that the index names",
                        entry.file_id
                    ));
                }
            }
        }
        let holder = usize::from(*meta.buckets.first()?);
        let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
        let bytes = match self.raw_buckets[holder].get_range(&key, range).await {
            Ok(bytes) => bytes,
            Err(err) => {
                violations.push(format!("batch of {} unreadable: {err}", entry.file_id));
                return None;
            }
        };
        let header = match BatchHeader::parse(&bytes) {
            Ok(header) => header,
            Err(err) => {
                violations.push(format!("batch of {} unparsable: {err}", entry.file_id));
                return None;
            }
        };
        let Some(id) = BatchId::from_timestamp(header.first_timestamp) else {
            violations.push(format!(
                "batch of {} has a foreign timestamp {}",
                entry.file_id, header.first_timestamp
            ));
            return None;
        };
        let seen = Seen {
            id,
            producer_id: header.producer_id,
            base_sequence: header.base_sequence,
            count: header.last_offset_delta + 1,
        };
        if i64::from(seen.count) != entry.last_offset - entry.base_offset + 1 {
            violations.push(format!(
                "{id}: index span {}..={} but the batch holds {} records",
                entry.base_offset, entry.last_offset, seen.count
            ));
        }
        self.identities
            .insert((entry.file_id, entry.byte_offset), seen);
        Some(seen)
    }
}

/// Structure of the durable log: dense offsets (gaps), each batch once (duplicates), each
/// idempotent producer's sequences contiguous and each plain client's batches in send order
/// (reordered). Idempotent producers are told apart by producer id, plain clients by client.
pub(crate) fn check_log(shadow: &Shadow, violations: &mut Vec<String>) -> Breaches {
    let mut breaches = Breaches::default();
    for (partition, batches) in shadow.partitions.iter().enumerate() {
        let mut next_offset = 0i64;
        let mut seen_ids: BTreeMap<BatchId, i64> = BTreeMap::new();
        let mut next_sequence: BTreeMap<i64, i32> = BTreeMap::new();
        let mut last_plain: BTreeMap<u32, u32> = BTreeMap::new();
        for placed in batches {
            let entry = placed.entry;
            let seen = placed.seen;
            if entry.base_offset != next_offset {
                breaches.gaps += 1;
                violations.push(format!(
                    "p{partition}: gap, batch {} at {} but next offset is {next_offset}",
                    seen.id, entry.base_offset
                ));
            }
            next_offset = entry.last_offset + 1;
            if let Some(first) = seen_ids.insert(seen.id, entry.base_offset) {
                breaches.duplicated += 1;
                violations.push(format!(
                    "p{partition}: {} duplicated at offsets {first} and {}",
                    seen.id, entry.base_offset
                ));
            }
            if seen.producer_id >= 0 {
                // Simulated producers start every partition at sequence 0 and never skip.
                let expected = next_sequence.get(&seen.producer_id).copied().unwrap_or(0);
                if seen.base_sequence != expected {
                    breaches.reordered += 1;
                    violations.push(format!(
                        "p{partition}: producer {} sequence {} at offset {} (expected {expected})",
                        seen.producer_id, seen.base_sequence, entry.base_offset
                    ));
                }
                next_sequence.insert(seen.producer_id, seen.base_sequence + seen.count);
            } else {
                if let Some(previous) = last_plain.get(&seen.id.client) {
                    if seen.id.number <= *previous {
                        breaches.reordered += 1;
                        violations.push(format!(
                            "p{partition}: {} at offset {} after batch #{previous}",
                            seen.id, entry.base_offset
                        ));
                    }
                }
                last_plain.insert(seen.id.client, seen.id.number);
            }
        }
    }
    breaches
}
