//! The auditor: after every step it rebuilds the durable state exactly as a recovering writer
//! would (snapshot + replay of the raw metadata log, no faults, no caches), reads each committed
//! batch's header straight from the raw bucket bytes, and checks the invariants against what the
//! clients were told and what the consumers read.
//!
//! The durable log of a partition starts at its log start: retention and DeleteRecords move it
//! forward (DUR-2 permits that), so batches below it are gone legitimately. The auditor keeps
//! every batch it ever saw durable (`history`), so what a consumer read below today's start can
//! still be checked, and an id that turns up at a second place is caught even when the first
//! one has been dropped since. Every DELETE a gate saw is checked against the durable state of
//! that moment (GC-1), replayed incrementally by [`crate::replay::Incremental`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::ObjectStoreExt;
use weir_common::{FileId, TopicId};
use weir_control::log::LogStore;
use weir_control::{IndexEntry, State};
use weir_protocol::batch::BatchHeader;
use weir_storage::keys;

use crate::archive::LogArchive;
use crate::client::{BatchId, Stamps};
use crate::ledger::DeleteLedger;

mod discards;
use crate::replay::Incremental;

/// What a committed batch is, read from its bytes in a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) id: BatchId,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) base_sequence: i32,
    pub(crate) count: i32,
}

/// One batch at its offset in the durable log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    /// The batch (the index entry itself when the entry is one batch).
    pub(crate) entry: IndexEntry,
    pub(crate) seen: Seen,
    /// The last offset of the index entry holding it: a compacted run entry may hold the log
    /// start and batches wholly below it (stored, never served).
    pub(crate) entry_last: i64,
}

/// The durable log of the simulated topic, as recovery would find it.
#[derive(Debug)]
pub(crate) struct Shadow {
    /// Each partition's batches from its log start.
    pub(crate) partitions: Vec<Vec<Placed>>,
    pub(crate) log_starts: Vec<i64>,
    pub(crate) high_watermarks: Vec<i64>,
    /// What readers may see: the high watermark, or the first pending batch (RFC 0006).
    pub(crate) stables: Vec<i64>,
}

impl Shadow {
    pub(crate) fn stable(&self, partition: usize) -> i64 {
        self.stables[partition]
    }

    pub(crate) fn high_watermark(&self, partition: usize) -> i64 {
        self.high_watermarks[partition]
    }

    pub(crate) fn log_start(&self, partition: usize) -> i64 {
        self.log_starts[partition]
    }

    /// The batch starting at `base_offset`, if any.
    pub(crate) fn at(&self, partition: usize, base_offset: i64) -> Option<&Placed> {
        let batches = &self.partitions[partition];
        let index = batches.partition_point(|p| p.entry.base_offset < base_offset);
        batches
            .get(index)
            .filter(|p| p.entry.base_offset == base_offset)
    }

    /// The batches from `base_offset` on.
    pub(crate) fn from(&self, partition: usize, base_offset: i64) -> &[Placed] {
        let batches = &self.partitions[partition];
        let index = batches.partition_point(|p| p.entry.base_offset < base_offset);
        &batches[index..]
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
    /// Every log slot written, for the independent replay (GC deletes from `raw_control`).
    archive: Arc<LogArchive>,
    raw_buckets: Vec<Arc<InMemory>>,
    /// The regional bucket of compaction seeds (compacted files have one holder, in it).
    raw_regional: Option<Arc<InMemory>>,
    quorum: usize,
    /// The batches of an index entry by (file, byte offset, length): files never change once
    /// written. An ingest entry is one batch; a compacted run entry is several (RFC 0005 §3).
    identities: BTreeMap<(FileId, u64, u32), Vec<Placed>>,
    /// Files whose holders were checked to hold them (cleared after any delete).
    files_checked: BTreeSet<FileId>,
    /// Most dead slots (of deposed writers) one replay skipped.
    pub(crate) max_dead_slots: u64,
    /// The DELETEs the data buckets' gates saw.
    ledger: Arc<DeleteLedger>,
    /// The independent replay, as far as the log was durable when last asked.
    durable: Incremental,
    /// Per partition, every batch ever seen in a durable shadow, by base offset.
    history: Vec<BTreeMap<i64, Placed>>,
    /// Where each batch was first seen durable (partition, base offset).
    first_place: BTreeMap<BatchId, (usize, i64)>,
    /// Per partition, the log start of the last shadow.
    log_starts: Vec<i64>,
    /// Offsets the durable log starts moved forward by, over all partitions.
    pub(crate) log_start_advance: u64,
    /// On the appendable path: files deleted while no log entry named them (the WriterPool
    /// discarding unused objects), by the bucket that saw it. None of them may commit later.
    pool_discards: Option<BTreeMap<FileId, usize>>,
    /// Compaction seeds: outputs a worker deleted after its swap was refused (no entry names
    /// them). None of them may be named later.
    output_discards: Option<BTreeMap<FileId, usize>>,
}

impl Auditor {
    pub(crate) fn new(
        raw_control: Arc<InMemory>,
        archive: Arc<LogArchive>,
        raw_buckets: Vec<Arc<InMemory>>,
        quorum: usize,
        ledger: Arc<DeleteLedger>,
    ) -> Auditor {
        Auditor {
            raw_control,
            archive,
            raw_buckets,
            raw_regional: None,
            quorum,
            identities: BTreeMap::new(),
            files_checked: BTreeSet::new(),
            max_dead_slots: 0,
            ledger,
            durable: Incremental::default(),
            history: Vec::new(),
            first_place: BTreeMap::new(),
            log_starts: Vec::new(),
            log_start_advance: 0,
            pool_discards: None,
            output_discards: None,
        }
    }

    /// Reads compacted files from `raw` (the regional bucket), and accepts DELETEs of
    /// compacted files no entry names (a worker removing the output of a refused swap),
    /// checking instead that no entry ever names them afterwards.
    pub(crate) fn with_regional(mut self, raw: Arc<InMemory>) -> Auditor {
        self.raw_regional = Some(raw);
        self.output_discards = Some(BTreeMap::new());
        self
    }

    /// The raw store of holder `holder` of a file of `tier`.
    fn raw_of(&self, tier: weir_common::Tier, holder: u8) -> Option<&Arc<InMemory>> {
        match tier {
            weir_common::Tier::Ingest => self.raw_buckets.get(usize::from(holder)),
            weir_common::Tier::Regional => self.raw_regional.as_ref().filter(|_| holder == 0),
        }
    }

    /// Accepts DELETEs of empty files no entry names (a WriterPool discarding unused objects),
    /// and checks instead that no such file commits afterwards. A DELETE of a written file stays
    /// subject to the release and sweep rules.
    pub(crate) fn with_pool_discards(mut self) -> Auditor {
        self.pool_discards = Some(BTreeMap::new());
        self
    }

    /// GC-1: every DELETE a gate saw since the last call was of a file the durable state of that
    /// moment no longer indexes; then the incremental replay catches up with the durable log.
    /// After any delete, every indexed file's holders are checked again (DUR-1 after deletes).
    pub(crate) async fn catch_up(&mut self, violations: &mut Vec<String>) {
        let deletes = self.ledger.take();
        if !deletes.is_empty() {
            self.files_checked.clear();
        }
        for delete in deletes {
            if let Err(err) = self.durable.advance(&self.archive, delete.durable_slots) {
                violations.push(format!("the durable metadata log does not replay: {err}"));
                return;
            }
            let file = delete.key.filename().unwrap_or_default();
            let indexed = self
                .durable
                .state()
                .files
                .keys()
                .find(|id| file == format!("{id}.weir"));
            if let Some(id) = indexed {
                violations.push(format!(
                    "GC-1: bucket {} saw a DELETE of file {id}, which the durable state (slots \
                     0..{}) still indexes",
                    delete.bucket,
                    self.durable.next_seq()
                ));
            } else if !(delete.repeat
                || self.deletable(&delete.key)
                || (delete.empty && self.pool_discard(&delete.key, delete.bucket))
                || self.output_discard(&delete.key, delete.bucket))
            {
                violations.push(format!(
                    "GC-1: bucket {} saw a DELETE of {}, neither released in the durable state \
                     (slots 0..{}) nor an orphan below its sweep horizon {}",
                    delete.bucket,
                    delete.key,
                    self.durable.next_seq(),
                    self.durable.state().sweep_horizon_ms
                ));
            }
        }
        if let Err(err) = self.durable.advance(&self.archive, u64::MAX) {
            violations.push(format!("the durable metadata log does not replay: {err}"));
        }
        if let Some(discards) = &self.pool_discards {
            let state = self.durable.state();
            for (id, bucket) in discards {
                if state.knows_file(id) {
                    violations.push(format!(
                        "GC-1: file {id} committed after bucket {bucket} deleted it as an unused \
                         pooled object"
                    ));
                }
            }
        }
        if let Some(discards) = &self.output_discards {
            let state = self.durable.state();
            for (id, bucket) in discards {
                if state.knows_file(id) {
                    violations.push(format!(
                        "GC-1: compacted file {id} swapped in after bucket {bucket} deleted it \
                         as the output of a refused swap"
                    ));
                }
            }
        }
        violations.extend(self.durable.take_breaches());
    }

    /// A data file the durable state lets go: released (the deleter's), or never named and
    /// with an id time below a durable sweep horizon (an orphan: no commit of it can apply).
    fn deletable(&self, key: &object_store::path::Path) -> bool {
        let Some((_, id)) = weir_storage::keys::parse_data_file(key) else {
            return false;
        };
        let state = self.durable.state();
        state.released.contains_key(&id)
            || (!state.knows_file(&id) && id.unix_ms() < state.sweep_horizon_ms)
    }

    /// The durable log start of `partition` as of the last [`Self::catch_up`] (0 before the
    /// topic is durable).
    pub(crate) fn durable_log_start(&self, topic: &TopicId, partition: i32) -> i64 {
        self.durable
            .state()
            .partition(topic, partition)
            .map_or(0, |p| p.log_start_offset)
    }

    /// The slots replayed so far (`0..durable_next_seq`), as of the last [`Self::catch_up`].
    pub(crate) fn durable_next_seq(&self) -> u64 {
        self.durable.next_seq()
    }

    /// The epoch of the newest writer in the durable log as of the last [`Self::catch_up`].
    pub(crate) fn durable_epoch(&self) -> u64 {
        self.durable.state().epoch
    }

    /// The batch that was durable at `base_offset` of `partition` at some audit, if any.
    pub(crate) fn ever_placed(&self, partition: usize, base_offset: i64) -> Option<&Placed> {
        self.history.get(partition)?.get(&base_offset)
    }

    /// Every batch ever seen durable from `base_offset` on, in offset order.
    pub(crate) fn ever_placed_from(
        &self,
        partition: usize,
        base_offset: i64,
    ) -> std::iter::Peekable<impl Iterator<Item = &Placed>> {
        self.history
            .get(partition)
            .into_iter()
            .flat_map(move |batches| batches.range(base_offset..).map(|(_, p)| p))
            .peekable()
    }

    /// Forgets what was read, so the next audit re-reads every batch from the raw buckets
    /// (the final audit: acknowledged data must still be there, DUR-2).
    pub(crate) fn forget_reads(&mut self) {
        self.identities.clear();
        self.files_checked.clear();
    }

    /// Replays the metadata log twice, through production `LogStore::replay` (snapshot and the
    /// bucket's slots after it) and through the auditor's own [`crate::replay`] (every slot
    /// from 0, from the archive), and reports any difference.
    pub(crate) async fn cross_check_replay(&self, violations: &mut Vec<String>) {
        let production = LogStore::new(self.raw_control.clone(), 1).replay().await;
        let independent = crate::replay::replay_from_zero(&self.archive);
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
        stamps: &Stamps,
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
        let mut log_starts = Vec::new();
        let mut high_watermarks = Vec::new();
        let mut stables = Vec::new();
        for partition in 0..partitions {
            let Some(p) = state.partition(&topic, partition) else {
                violations.push(format!("partition {partition} missing from durable state"));
                return None;
            };
            let first_pending = state.first_pending(&topic, partition);
            let stable = first_pending.map_or(p.high_watermark, |f| f.min(p.high_watermark));
            if p.stable_high_watermark != stable {
                violations.push(format!(
                    "p{partition}: replayed state has stable {} != {stable} (high watermark {}, \
                     first pending {first_pending:?})",
                    p.stable_high_watermark, p.high_watermark
                ));
            }
            let mut placed = Vec::with_capacity(p.index.len());
            // Batches of pending files: not yet durable placements (an abort may still turn
            // them into fillers, and their resends land elsewhere).
            let mut pending = BTreeSet::new();
            for entry in &p.index {
                let batches = if Self::is_pending(&state, entry.file_id) {
                    let batches = self
                        .identify_pending(&state, entry, stamps, violations)
                        .await?;
                    pending.extend(batches.iter().map(|b| b.entry.base_offset));
                    batches
                } else {
                    self.identify(&state, entry, stamps, violations).await?
                };
                placed.extend(batches);
            }
            let last = placed
                .last()
                .map_or(p.log_start_offset, |b| b.entry.last_offset + 1);
            if last != p.high_watermark {
                violations.push(format!(
                    "p{partition}: index ends at {last}, high watermark {}",
                    p.high_watermark
                ));
            }
            self.check_log_start(
                partition as usize,
                p.log_start_offset,
                p.high_watermark,
                violations,
            );
            self.remember(partition as usize, &placed, &pending, violations);
            log_starts.push(p.log_start_offset);
            high_watermarks.push(p.high_watermark);
            stables.push(stable);
            out.push(placed);
        }
        Some(Shadow {
            partitions: out,
            log_starts,
            high_watermarks,
            stables,
        })
    }

    /// DUR-2 and the log start's rules: it never moves backwards and never past the high
    /// watermark.
    fn check_log_start(
        &mut self,
        partition: usize,
        start: i64,
        high_watermark: i64,
        violations: &mut Vec<String>,
    ) {
        if self.log_starts.len() <= partition {
            self.log_starts.resize(partition + 1, 0);
        }
        let previous = self.log_starts[partition];
        if start < previous {
            violations.push(format!(
                "p{partition}: the durable log start went back from {previous} to {start}"
            ));
        } else {
            self.log_start_advance += (start - previous) as u64;
        }
        if start > high_watermark {
            violations.push(format!(
                "p{partition}: the durable log start {start} is past the high watermark \
                 {high_watermark}"
            ));
        }
        self.log_starts[partition] = start;
    }

    /// Adds a shadow's batches to the history; a batch durable at two places is a breach even
    /// when one of them is below today's log start.
    fn remember(
        &mut self,
        partition: usize,
        placed: &[Placed],
        pending: &BTreeSet<i64>,
        violations: &mut Vec<String>,
    ) {
        if self.history.len() <= partition {
            self.history.resize_with(partition + 1, BTreeMap::new);
        }
        for batch in placed {
            let here = (partition, batch.entry.base_offset);
            if batch.seen.id.is_filler() || pending.contains(&batch.entry.base_offset) {
                self.history[partition].insert(batch.entry.base_offset, *batch);
                continue;
            }
            let first = *self.first_place.entry(batch.seen.id).or_insert(here);
            if first != here {
                violations.push(format!(
                    "{} durable at p{}@{} and earlier at p{}@{}",
                    batch.seen.id, here.0, here.1, first.0, first.1
                ));
            }
            self.history[partition].insert(batch.entry.base_offset, *batch);
        }
    }

    /// Reads the entry's batches' headers from a holder (first time only) and checks every
    /// holder has the file (DUR-1: the file is in a quorum before its commit).
    async fn identify(
        &mut self,
        state: &State,
        entry: &IndexEntry,
        stamps: &Stamps,
        violations: &mut Vec<String>,
    ) -> Option<Vec<Placed>> {
        let Some(meta) = state.files.get(&entry.file_id) else {
            violations.push(format!(
                "file {} is indexed but has no metadata",
                entry.file_id
            ));
            return None;
        };
        let key = keys::data_file(meta.tier, &entry.file_id);
        if self.files_checked.insert(entry.file_id) {
            let quorum = match meta.tier {
                weir_common::Tier::Ingest => self.quorum,
                weir_common::Tier::Regional => 1,
            };
            if meta.buckets.len() < quorum {
                violations.push(format!(
                    "file {} committed with {} holders, quorum is {}",
                    entry.file_id,
                    meta.buckets.len(),
                    quorum
                ));
            }
            for holder in &meta.buckets {
                let present = match self.raw_of(meta.tier, *holder) {
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
        let cache_key = (entry.file_id, entry.byte_offset, entry.len);
        if let Some(placed) = self.identities.get(&cache_key) {
            return Some(placed.clone());
        }
        let raw = self.raw_of(meta.tier, *meta.buckets.first()?)?.clone();
        let range = entry.byte_offset..entry.byte_offset + u64::from(entry.len);
        let bytes = match raw.get_range(&key, range).await {
            Ok(bytes) => bytes,
            Err(err) => {
                violations.push(format!("batch of {} unreadable: {err}", entry.file_id));
                return None;
            }
        };
        // The entry's batches, back to back, at consecutive offsets from its base.
        let mut placed = Vec::new();
        let (mut position, mut base) = (0usize, entry.base_offset);
        while position < bytes.len() {
            let header = match BatchHeader::parse(&bytes[position..]) {
                Ok(header) => header,
                Err(err) => {
                    violations.push(format!("batch of {} unparsable: {err}", entry.file_id));
                    return None;
                }
            };
            let id = if is_filler(&header) {
                BatchId::FILLER
            } else if let Some(id) = stamps.id(header.first_timestamp) {
                id
            } else {
                violations.push(format!(
                    "batch of {} has a foreign timestamp {}",
                    entry.file_id, header.first_timestamp
                ));
                return None;
            };
            let seen = Seen {
                id,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                base_sequence: header.base_sequence,
                count: header.last_offset_delta + 1,
            };
            let len = header.total_len().min(bytes.len() - position);
            placed.push(Placed {
                entry: IndexEntry {
                    base_offset: base,
                    last_offset: base + i64::from(seen.count) - 1,
                    file_id: entry.file_id,
                    byte_offset: entry.byte_offset + position as u64,
                    len: len as u32,
                    first_timestamp: header.first_timestamp,
                    max_timestamp: header.max_timestamp,
                },
                seen,
                entry_last: entry.last_offset,
            });
            base += i64::from(seen.count);
            position += len;
        }
        if base != entry.last_offset + 1 {
            violations.push(format!(
                "{}: index span {}..={} but its batches hold {} records",
                entry.file_id,
                entry.base_offset,
                entry.last_offset,
                base - entry.base_offset
            ));
        }
        if let [one] = placed.as_mut_slice() {
            // One batch: the entry itself (its timestamps are the commit's).
            one.entry = *entry;
        }
        self.identities.insert(cache_key, placed.clone());
        Some(placed)
    }
}

/// An empty batch with no producer: a filler an abort left (RFC 0006). Simulated clients never
/// send empty batches.
pub(crate) fn is_filler(header: &BatchHeader) -> bool {
    header.records_count == 0 && header.producer_id < 0 && !header.is_control()
}

impl Auditor {
    fn is_pending(state: &State, file_id: FileId) -> bool {
        state
            .pending
            .values()
            .flatten()
            .any(|file| file.file_id == file_id)
    }

    /// A pending file's entry (RFC 0006): the file may be in any bucket, or none yet. In a
    /// quorum, it is identified from a bucket that holds it; in fewer, its offsets are placed
    /// as unreadable (a filler), so that an acknowledged batch there counts as lost.
    async fn identify_pending(
        &mut self,
        state: &State,
        entry: &IndexEntry,
        stamps: &Stamps,
        violations: &mut Vec<String>,
    ) -> Option<Vec<Placed>> {
        let key = keys::data_file(weir_common::Tier::Ingest, &entry.file_id);
        let mut holders = Vec::new();
        for (index, bucket) in self.raw_buckets.iter().enumerate() {
            if bucket.head(&key).await.is_ok() {
                holders.push(index as u8);
            }
        }
        if holders.len() >= self.quorum {
            let mut view = state.clone();
            if let Some(meta) = view.files.get_mut(&entry.file_id) {
                meta.buckets = holders;
            }
            // Checked as a confirmed file would be: every holder named has it.
            return self.identify(&view, entry, stamps, violations).await;
        }
        let seen = Seen {
            id: BatchId::UNREAD,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            count: (entry.last_offset - entry.base_offset + 1) as i32,
        };
        Some(vec![Placed {
            entry: *entry,
            seen,
            entry_last: entry.last_offset,
        }])
    }
}

/// Structure of the durable log: dense offsets (gaps), each batch once (duplicates), each
/// idempotent producer's sequences contiguous and each plain client's batches in send order
/// (reordered). Idempotent producers are told apart by producer id, plain clients by client.
pub(crate) fn check_log(
    shadow: &Shadow,
    stamps: &crate::client::Stamps,
    violations: &mut Vec<String>,
) -> Breaches {
    let mut breaches = Breaches::default();
    for (partition, batches) in shadow.partitions.iter().enumerate() {
        let start = shadow.log_start(partition);
        // The first batch holds the log start (the start may fall inside it).
        let mut next_offset = match batches.first() {
            Some(first) if first.entry.base_offset <= start => first.entry.base_offset,
            _ => start,
        };
        if let Some(first) = batches.first().filter(|b| b.entry_last < start) {
            breaches.gaps += 1;
            violations.push(format!(
                "p{partition}: batch {} at {} is wholly below the log start {start} yet indexed",
                first.seen.id, first.entry.base_offset
            ));
        }
        let mut seen_ids: BTreeMap<BatchId, i64> = BTreeMap::new();
        // Per producer: its epoch and next sequence (a new epoch restarts at 0).
        let mut next_sequence: BTreeMap<i64, (i16, i32)> = BTreeMap::new();
        let mut last_plain: BTreeMap<u32, u32> = BTreeMap::new();
        let mut resynced = false;
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
            if seen.id == BatchId::UNREAD {
                // A pending batch not yet in a quorum: whose sequences it holds is unknown, so
                // every producer may continue anywhere after it.
                next_sequence.clear();
                resynced = true;
                continue;
            }
            if seen.id.is_filler() {
                // An aborted batch's offsets (RFC 0006): no client's batch, no sequence (the
                // abort rolled its producer's sequences back).
                continue;
            }
            if let Some(first) = seen_ids.insert(seen.id, entry.base_offset) {
                breaches.duplicated += 1;
                violations.push(format!(
                    "p{partition}: {} duplicated at offsets {first} and {}",
                    seen.id, entry.base_offset
                ));
            }
            if seen.producer_id >= 0 {
                // Simulated producers start every partition at sequence 0 and never skip, and
                // restart at 0 under a new epoch; a producer's first batch above a moved log
                // start may continue anywhere.
                let expected = match next_sequence.get(&seen.producer_id) {
                    Some((epoch, _)) if *epoch < seen.producer_epoch => 0,
                    Some((_, next)) => *next,
                    None if start > 0 || resynced => seen.base_sequence,
                    None => 0,
                };
                if seen.base_sequence != expected {
                    breaches.reordered += 1;
                    violations.push(format!(
                        "p{partition}: producer {} sequence {} at offset {} (expected {expected})",
                        seen.producer_id, seen.base_sequence, entry.base_offset
                    ));
                }
                next_sequence.insert(
                    seen.producer_id,
                    (seen.producer_epoch, seen.base_sequence + seen.count),
                );
            } else if !stamps.is_abandoned(&seen.id) {
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
