//! The resolver (RFC 0006): settles the pending files of incarnations that no longer reserve —
//! an agent that crashed or restarted, or one of this agent's own abandoned incarnations.
//!
//! Each pass takes every such incarnation's pending files in reservation order and asks the
//! ingest buckets (a HEAD each) where the file is:
//! - in a quorum: confirmed (it may have been acknowledged, so it must become readable);
//! - in at least one bucket, with enough buckets answering "not found" to make up a quorum:
//!   repaired — copied from a holder into those buckets until a quorum holds it — and then
//!   confirmed. Its copy may be one of a quorum whose other members do not answer (a bucket
//!   down across a restart), so it may have been acknowledged; and a file that was not
//!   acknowledged may be confirmed anyway (its records appear, as a timed-out Kafka produce's
//!   may), which spares its partitions an aborted span of empty batches;
//! - in no bucket that answered, in too few for any quorum counting every bucket that did not
//!   answer as a holder, and either sealed more than the ack deadline plus the clock-skew
//!   margin ago or of one of this agent's own abandoned incarnations (which never answer
//!   another ticket, see [`Incarnations::abandoned_here`]): it can never be acknowledged, so
//!   it and every later pending file of its incarnation are aborted, their offsets moved to a
//!   filler file of empty batches uploaded first;
//! - otherwise (still young, or too few buckets answered): asked again next pass.
//!
//! Only the metadata log's leader resolves. Two resolvers racing is harmless: confirming twice
//! does nothing, and an abort the state no longer matches is refused (its filler becomes an
//! orphan for the sweep).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStoreExt, PutPayload};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use weir_common::{Clock, FileId, TopicId};
use weir_control::{ConfirmedFile, ControlPlane, Entry, EntryResult, FileAbort, FillerBatch};
use weir_format::{BatchMeta, FileBuilder};
use weir_storage::{keys, QuorumWriter};

use crate::metrics::{ProduceMetrics, ResolveOutcome};
use crate::reserver::Incarnations;

/// Resolver tuning.
#[derive(Debug, Clone)]
pub struct ResolverSettings {
    /// The reservers' ack deadline (`ProduceSettings::ack_deadline`).
    pub ack_deadline: Duration,
    /// How far agents' wall clocks may differ: a missing file is aborted only once its id time
    /// is `ack_deadline + clock_skew_margin` in the past.
    pub clock_skew_margin: Duration,
    /// Time between passes while files are pending.
    pub interval: Duration,
}

impl Default for ResolverSettings {
    fn default() -> Self {
        Self {
            ack_deadline: Duration::from_secs(10),
            clock_skew_margin: Duration::from_secs(10),
            interval: Duration::from_millis(500),
        }
    }
}

/// Where a pending file is.
#[derive(Debug, PartialEq, Eq)]
enum Whereabouts {
    /// In a quorum: these buckets hold it.
    Quorum(Vec<u8>),
    /// In fewer buckets than a quorum (`holders`, at least one), and the buckets that answered
    /// "not found" (`absent`) make up the rest of one: a copy into them repairs it. `missing`:
    /// no quorum can hold it now, even counting every bucket that did not answer (what to do
    /// if the repair fails).
    Short {
        holders: Vec<u8>,
        absent: Vec<u8>,
        missing: bool,
    },
    /// In too few buckets for a quorum, counting every bucket that did not answer as a holder.
    Missing,
    /// Not known yet (a bucket did not answer).
    Unknown,
}

/// A pending file, the buckets that may hold it, and its size.
type Candidate = (FileId, Vec<u8>, u64);

/// A pending batch to fill: its partition, base offset, span and timestamps.
struct ToFill {
    topic_id: TopicId,
    partition: i32,
    base_offset: i64,
    span: i32,
    first_timestamp: i64,
    max_timestamp: i64,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ResolvePass {
    pub confirmed: usize,
    /// Of those confirmed, how many were first copied into more buckets to make a quorum.
    pub repaired: usize,
    pub aborted: usize,
    /// Pending files left for a later pass.
    pub waiting: usize,
}

pub struct Resolver {
    control: ControlPlane,
    writer: Arc<QuorumWriter>,
    clock: Arc<dyn Clock>,
    /// This agent's reserving incarnations (their live one is not resolved here).
    incarnations: Option<Arc<Incarnations>>,
    settings: ResolverSettings,
    rng: fastrand::Rng,
    metrics: ProduceMetrics,
}

impl Resolver {
    pub fn new(
        control: ControlPlane,
        writer: Arc<QuorumWriter>,
        clock: Arc<dyn Clock>,
        incarnations: Option<Arc<Incarnations>>,
        settings: ResolverSettings,
        seed: u64,
    ) -> Self {
        Self {
            control,
            writer,
            clock,
            incarnations,
            settings,
            rng: fastrand::Rng::with_seed(seed),
            metrics: ProduceMetrics::new(),
        }
    }

    /// Counts what it settles in `metrics` (`weir_resolver_files_total`) instead of counters of
    /// its own.
    pub fn with_metrics(mut self, metrics: ProduceMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Resolves every `interval` while something is pending, until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                // Biased: the simulator replays a seed exactly only without tokio's random
                // choice.
                biased;
                _ = tokio::time::sleep(self.settings.interval) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                return;
            }
            if !self.has_work() {
                continue;
            }
            let pass = self.pass().await;
            if pass != ResolvePass::default() {
                debug!(?pass, "resolver pass");
            }
        }
    }

    /// Whether there is anything for this agent to resolve: it leads the log and a file is
    /// pending.
    fn has_work(&self) -> bool {
        self.control.leader_status().available && self.control.read(|state| state.has_pending())
    }

    /// One pass within `timeout`, if there is anything to resolve, for a starting agent to await
    /// before it serves. Files an earlier run acknowledged but had not confirmed when it stopped
    /// (a crash) are pending in the log, and consumers would not see them until the first pass
    /// of [`Resolver::run`]; this one confirms those in a quorum, so a client reads what was
    /// acknowledged from its first fetch after a restart. What it leaves (a bucket not
    /// answering, a young missing file) is left to `run`.
    pub async fn pass_before_serving(&mut self, timeout: Duration) {
        if !self.has_work() {
            return;
        }
        match tokio::time::timeout(timeout, self.pass()).await {
            Ok(pass) => info!(
                confirmed = pass.confirmed,
                repaired = pass.repaired,
                aborted = pass.aborted,
                waiting = pass.waiting,
                "resolved pending files of an earlier run before serving"
            ),
            Err(_) => warn!(
                ?timeout,
                "pending files of an earlier run not resolved before serving; the resolver goes on"
            ),
        }
    }

    /// One pass over every incarnation's pending files but the live one's.
    pub async fn pass(&mut self) -> ResolvePass {
        let live = self.incarnations.as_ref().map(|i| i.live());
        let buckets = self.writer.buckets().len();
        let work: Vec<(String, Vec<Candidate>)> = self.control.read(|state| {
            state
                .pending
                .iter()
                .filter(|(agent, _)| Some(agent.as_str()) != live.as_deref())
                .map(|(agent, files)| {
                    let files = files
                        .iter()
                        .map(|file| {
                            let meta = state.files.get(&file.file_id);
                            let candidates = meta
                                .map(|meta| meta.buckets.clone())
                                .filter(|buckets| !buckets.is_empty())
                                .unwrap_or_else(|| (0..buckets).map(|b| b as u8).collect());
                            (file.file_id, candidates, meta.map_or(0, |meta| meta.size))
                        })
                        .collect();
                    (agent.clone(), files)
                })
                .collect()
        });
        let mut pass = ResolvePass::default();
        let mut silent = HashSet::new();
        let give_up_ms = (self.settings.ack_deadline + self.settings.clock_skew_margin).as_millis();
        let now_ms = self.clock.now_ms();
        let old = |file_id: &FileId| {
            i128::from(now_ms) - i128::from(file_id.unix_ms()) > give_up_ms as i128
        };
        for (agent, files) in work {
            // A file of an incarnation of this process that no longer reserves can never be
            // acknowledged: missing, it is aborted at once. The deadline and margin are for
            // other processes' incarnations, which may still be running.
            let own = self
                .incarnations
                .as_ref()
                .is_some_and(|incarnations| incarnations.abandoned_here(&agent));
            let abortable = |file_id: &FileId| own || old(file_id);
            let mut confirmed = Vec::new();
            let mut repaired = 0;
            let mut abort_from = None;
            for (position, (file_id, candidates, size)) in files.iter().enumerate() {
                match self.locate(file_id, candidates, &mut silent).await {
                    Whereabouts::Quorum(holders) => confirmed.push(ConfirmedFile {
                        file_id: *file_id,
                        buckets: holders,
                    }),
                    Whereabouts::Short {
                        holders,
                        absent,
                        missing,
                    } => match self.repair(&agent, file_id, *size, holders, absent).await {
                        Some(holders) => {
                            repaired += 1;
                            confirmed.push(ConfirmedFile {
                                file_id: *file_id,
                                buckets: holders,
                            });
                        }
                        // The copies did not land (a bucket that answers HEADs but refuses
                        // PUTs: a full disk): as if the file had not been found, but only past
                        // the deadline even for this agent's own incarnations, so that a file
                        // with a copy gets passes to be repaired before its offsets are given
                        // up as a hole.
                        None if missing && old(file_id) => {
                            abort_from = Some(position);
                            break;
                        }
                        None => break,
                    },
                    Whereabouts::Missing if abortable(file_id) => {
                        abort_from = Some(position);
                        break;
                    }
                    Whereabouts::Missing | Whereabouts::Unknown => break,
                }
            }
            let settled = confirmed.len() + abort_from.map_or(0, |from| files.len() - from);
            pass.waiting += files.len() - settled;
            if !confirmed.is_empty() {
                let count = confirmed.len();
                match self
                    .control
                    .submit(Entry::ConfirmFiles { files: confirmed })
                    .await
                {
                    Ok(EntryResult::ConfirmFiles(n)) => {
                        pass.confirmed += n;
                        pass.repaired += repaired.min(n);
                        let metric = |outcome| self.metrics.resolved(outcome);
                        metric(ResolveOutcome::Repaired).inc_by(repaired.min(n) as u64);
                        metric(ResolveOutcome::Confirmed).inc_by(n.saturating_sub(repaired) as u64);
                        info!(
                            agent,
                            confirmed = n,
                            "resolver confirmed pending files in a quorum"
                        );
                    }
                    other => {
                        warn!(agent, count, result = ?other, "resolver could not confirm");
                        continue;
                    }
                }
            }
            if let Some(from) = abort_from {
                let aborted: Vec<FileId> = files[from..].iter().map(|(id, _, _)| *id).collect();
                match self.abort(&agent, aborted).await {
                    Ok(n) => {
                        pass.aborted += n;
                        self.metrics
                            .resolved(ResolveOutcome::Aborted)
                            .inc_by(n as u64);
                    }
                    Err(why) => {
                        pass.waiting += files.len() - from;
                        warn!(agent, why, "resolver could not abort; retrying next pass");
                    }
                }
            }
        }
        pass
    }

    /// Asks each candidate bucket whether it holds `file_id`. A bucket in `silent` (it did not
    /// answer earlier in this pass) is not asked again and counts as not answering: during an
    /// outage a pass costs one failed HEAD (with its retries, up to the request timeout when
    /// the bucket hangs) per bucket, not one per pending file.
    async fn locate(
        &self,
        file_id: &FileId,
        candidates: &[u8],
        silent: &mut HashSet<u8>,
    ) -> Whereabouts {
        let key = keys::data_file(keys::Tier::Ingest, file_id);
        let quorum = self.writer.quorum();
        let mut holders = Vec::new();
        let mut absent = Vec::new();
        let mut unanswered = 0;
        for &bucket in candidates {
            let Some(store) = self.writer.buckets().get(usize::from(bucket)) else {
                continue;
            };
            if silent.contains(&bucket) {
                unanswered += 1;
                continue;
            }
            match store.head(&key).await {
                Ok(_) => holders.push(bucket),
                Err(object_store::Error::NotFound { .. }) => absent.push(bucket),
                Err(_) => {
                    silent.insert(bucket);
                    unanswered += 1;
                }
            }
        }
        if holders.len() >= quorum {
            Whereabouts::Quorum(holders)
        } else if !holders.is_empty() && holders.len() + absent.len() >= quorum {
            let missing = holders.len() + unanswered < quorum;
            Whereabouts::Short {
                holders,
                absent,
                missing,
            }
        } else if holders.len() + unanswered < quorum {
            Whereabouts::Missing
        } else {
            Whereabouts::Unknown
        }
    }

    /// Copies `file_id` from one of `holders` into buckets of `absent` until a quorum holds it,
    /// and returns the holders then; `None` (asked again next pass) when no holder's copy could
    /// be read whole or too few copies landed. A copy whose length is not the reserved size is
    /// not copied: PUTs are atomic, so that is a different object, not a partial one.
    async fn repair(
        &self,
        agent: &str,
        file_id: &FileId,
        size: u64,
        mut holders: Vec<u8>,
        absent: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let key = keys::data_file(keys::Tier::Ingest, file_id);
        let buckets = self.writer.buckets();
        let mut bytes = None;
        for &holder in &holders {
            let Some(store) = buckets.get(usize::from(holder)) else {
                continue;
            };
            match store.get(&key).await {
                Ok(got) => match got.bytes().await {
                    Ok(body) if body.len() as u64 == size => {
                        bytes = Some(body);
                        break;
                    }
                    Ok(body) => warn!(
                        agent,
                        %file_id,
                        holder,
                        len = body.len(),
                        size,
                        "pending file's copy is not the size reserved; not repairing from it"
                    ),
                    Err(err) => debug!(%file_id, holder, %err, "repair read failed"),
                },
                Err(err) => debug!(%file_id, holder, %err, "repair read failed"),
            }
        }
        let bytes = bytes?;
        let from = holders.clone();
        for bucket in absent {
            if holders.len() >= self.writer.quorum() {
                break;
            }
            let Some(store) = buckets.get(usize::from(bucket)) else {
                continue;
            };
            match store.put(&key, PutPayload::from(bytes.clone())).await {
                Ok(_) => holders.push(bucket),
                Err(err) => debug!(%file_id, bucket, %err, "repair copy failed"),
            }
        }
        if holders.len() < self.writer.quorum() {
            return None;
        }
        holders.sort_unstable();
        info!(
            agent,
            %file_id,
            ?from,
            ?holders,
            "resolver repaired a pending file found in too few buckets: copied it to a quorum"
        );
        Some(holders)
    }

    /// Uploads a filler for `files` (the last pending files of `agent`) and aborts them.
    /// Returns how many files were aborted.
    async fn abort(&mut self, agent: &str, files: Vec<FileId>) -> Result<usize, String> {
        // Each pending batch still in the index: its place, span and timestamps.
        let batches: Vec<ToFill> = self.control.read(|state| {
            let pending = state.pending.get(agent).map_or(&[][..], Vec::as_slice);
            pending
                .iter()
                .filter(|file| files.contains(&file.file_id))
                .flat_map(|file| &file.batches)
                .filter_map(|batch| {
                    let partition = state.partition(&batch.topic_id, batch.partition)?;
                    let position = partition
                        .index
                        .partition_point(|e| e.base_offset < batch.base_offset);
                    let entry = partition
                        .index
                        .get(position)
                        .filter(|e| e.base_offset == batch.base_offset)?;
                    let span = i32::try_from(entry.last_offset - entry.base_offset + 1).ok()?;
                    Some(ToFill {
                        topic_id: batch.topic_id,
                        partition: batch.partition,
                        base_offset: batch.base_offset,
                        span,
                        first_timestamp: entry.first_timestamp,
                        max_timestamp: entry.max_timestamp,
                    })
                })
                .collect()
        });
        let mut builder = FileBuilder::new();
        let mut order: HashMap<(TopicId, i32), VecDeque<i64>> = HashMap::new();
        for fill in &batches {
            let (first, max) = (fill.first_timestamp, fill.max_timestamp);
            let meta = BatchMeta {
                record_count: fill.span,
                first_timestamp: first,
                max_timestamp: max,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
            };
            let bytes = weir_protocol::batch::empty_batch(fill.span, first, max);
            builder.push(fill.topic_id.0, fill.partition, bytes, meta);
            order
                .entry((fill.topic_id, fill.partition))
                .or_default()
                .push_back(fill.base_offset);
        }
        let encoded = builder.finish();
        let mut fillers = Vec::with_capacity(batches.len());
        for section in &encoded.footer.partitions {
            let key = (TopicId(section.topic_id), section.partition);
            for location in &section.batches {
                let base_offset = order
                    .get_mut(&key)
                    .and_then(VecDeque::pop_front)
                    .ok_or("filler layout does not match its batches")?;
                fillers.push(FillerBatch {
                    topic_id: key.0,
                    partition: key.1,
                    base_offset,
                    byte_offset: location.offset,
                    len: location.len,
                });
            }
        }
        let filler = FileId::new(self.clock.now_ms(), &mut self.rng);
        let key = keys::data_file(keys::Tier::Ingest, &filler);
        let payload: PutPayload = encoded.parts.iter().cloned().collect();
        let holders = self
            .writer
            .put(&key, payload)
            .await
            .map_err(|err| format!("filler upload failed: {err}"))?;
        let abort = FileAbort {
            agent: agent.to_string(),
            files: files.clone(),
            filler,
            size: encoded.total_len,
            buckets: holders.iter().map(|h| *h as u8).collect(),
            batches: fillers,
        };
        match self.control.submit(Entry::AbortFiles(abort)).await {
            Ok(EntryResult::AbortFiles(Ok(moved))) => {
                warn!(
                    agent,
                    files = files.len(),
                    batches = moved,
                    %filler,
                    "resolver aborted pending files that never reached a quorum; their offsets hold empty batches"
                );
                Ok(files.len())
            }
            other => Err(format!("abort refused: {other:?}")),
        }
    }
}
