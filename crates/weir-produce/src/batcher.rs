//! The FileBatcher: packs tickets from every connection into one open file and seals it.
//! Sealed files are numbered in seal order and handed to uploads; the upload-concurrency permit
//! is taken before sealing the next file, so a slow store pushes back on the ticket queue rather
//! than growing memory.
//!
//! When a file seals (adaptive sealing, issue 16), at the earliest of:
//! - it holds `target_file_bytes` (a big file is worth its PUT at once), or `max_file_bytes`
//!   when that is smaller;
//! - its oldest batch has waited `flush_interval` (the upper bound on any batch's wait);
//! - *eagerly*: fewer than `eager_uploads` files are uploading (the pipeline has room; by
//!   default none is) and the last seal was at least `spacing(rate)` ago, where `rate` is the
//!   recent arrival rate in bytes per second and
//!   `spacing(rate) = flush_interval × clamp(rate × flush_interval / target_file_bytes, ¼, 1)`.
//!
//! So a batch that arrives after a quiet spell seals at once (latency is one upload), batches
//! arriving more often share files sealed at most four per interval, and as the rate grows
//! seals space out until, from `target_file_bytes / flush_interval` on, every file waits the
//! whole interval or fills to the target: few PUTs per GiB where it matters. A seal is never
//! later than under a fixed interval, and a slow store grows files (no eager seal while
//! `eager_uploads` files are in flight). The rate is read when the batcher wakes (a ticket, an
//! upload done), so while it sleeps a decaying rate does not bring the eager point forward: a
//! seal can come later than the spacing says, never later than the interval.
//!
//! On time: a deadline is compared with the clock whenever the batcher wakes. When nothing
//! else wakes it, a timer does; for the interval, an upper bound, it is armed `timer_lag`
//! early (`SealTimer`), because tokio fires about a millisecond late
//! (`weir_common::TOKIO_TIMER_LAG`); the spacing, a minimum, is never armed early. Left to
//! tokio, 17–21 % of the batches at 50 MiB/s with a 2 ms interval waited past it; now 10–15 %
//! (docs/benchmarks.md §33).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;
use tracing::debug;
use weir_common::{Clock, FileId, TopicId};
use weir_control::{BatchCommit, FileCommit};
use weir_format::{BatchMeta, FileBuilder};

use crate::committer::UploadedFile;
use crate::metrics::{ProduceMetrics, Stage};
use crate::pipeline::{ProduceSettings, QueuedTicket, TicketOutcome};
use crate::reserver::SealedFile;
use crate::uploader::{self, Destination};

type SectionKey = (TopicId, i32);

/// Most tickets taken from the queue in one go before the seal deadline is looked at again.
const DRAIN_TICKETS: usize = 64;

/// The shortest spacing of eager seals, as a fraction of `flush_interval`: at most four seals
/// per interval while batches keep coming, so a moderate rate does not pay one PUT per request
/// (measured at 1,000 msg/s on `s3-express`: docs/benchmarks.md §16).
const MIN_SPACING: f64 = 0.25;

/// A ticket's place in a file: per ticket partition, (section, first batch in section, count).
pub(crate) struct TicketSlot {
    pub(crate) reply: oneshot::Sender<TicketOutcome>,
    pub(crate) placements: Vec<(SectionKey, usize, usize)>,
    /// When its batches entered the open file (the `batch_wait` stage starts).
    pub(crate) appended_at: Instant,
}

struct OpenFile {
    builder: FileBuilder,
    tickets: Vec<TicketSlot>,
    section_counts: HashMap<SectionKey, usize>,
    /// When its first batch arrived.
    opened: Instant,
}

/// Bytes per second arriving at the batcher, decayed exponentially over `tau`.
struct ArrivalRate {
    tau: f64,
    /// Decayed byte sum as of `at`; the rate is `sum / tau`.
    sum: f64,
    at: Instant,
}

impl ArrivalRate {
    fn new(tau: Duration) -> Self {
        Self {
            tau: tau.as_secs_f64().max(1e-3),
            sum: 0.0,
            at: Instant::now(),
        }
    }

    fn add(&mut self, bytes: usize, now: Instant) {
        self.sum = self.decayed(now) + bytes as f64;
        self.at = now;
    }

    fn decayed(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.sum * (-elapsed / self.tau).exp()
    }

    fn bytes_per_sec(&self, now: Instant) -> f64 {
        self.decayed(now) / self.tau
    }
}

/// Why a file sealed (`weir_files_sealed_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SealReason {
    /// `max_file_bytes` or `target_file_bytes`.
    Size,
    /// Its oldest batch waited `flush_interval`.
    Interval,
    /// The pipeline had room and the rate's spacing had passed.
    Eager,
    /// The pipeline is shutting down.
    Shutdown,
}

impl SealReason {
    pub(crate) const ALL: [SealReason; 4] = [
        SealReason::Size,
        SealReason::Interval,
        SealReason::Eager,
        SealReason::Shutdown,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            SealReason::Size => "size",
            SealReason::Interval => "interval",
            SealReason::Eager => "eager",
            SealReason::Shutdown => "shutdown",
        }
    }
}

/// Where sealed files go.
pub(crate) enum Sink {
    /// To the committer once uploaded (commit after upload).
    Serial(mpsc::UnboundedSender<UploadedFile>),
    /// To the reserver at seal, while they upload (RFC 0006).
    Parallel(mpsc::UnboundedSender<SealedFile>),
}

pub(crate) struct Batcher {
    settings: ProduceSettings,
    destination: Arc<Destination>,
    clock: Arc<dyn Clock>,
    rng: fastrand::Rng,
    sealed_count: Arc<AtomicU64>,
    sink: Sink,
    permits: Arc<Semaphore>,
    /// Signalled when an upload finishes: a file waiting for room may seal.
    upload_done: Arc<Notify>,
    last_seal: Option<Instant>,
    arrivals: ArrivalRate,
    metrics: ProduceMetrics,
}

impl Batcher {
    pub(crate) fn new(
        settings: ProduceSettings,
        destination: Destination,
        clock: Arc<dyn Clock>,
        seed: u64,
        sealed_count: Arc<AtomicU64>,
        sink: Sink,
        metrics: ProduceMetrics,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(settings.max_inflight_uploads.max(1)));
        // The rate follows changes within a few intervals, and a burst does not carry over
        // for longer than a second.
        let tau = settings
            .flush_interval
            .saturating_mul(4)
            .clamp(Duration::from_millis(20), Duration::from_secs(1));
        Self {
            settings,
            destination: Arc::new(destination),
            clock,
            rng: fastrand::Rng::with_seed(seed),
            sealed_count,
            sink,
            permits,
            upload_done: Arc::new(Notify::new()),
            last_seal: None,
            arrivals: ArrivalRate::new(tau),
            metrics,
        }
    }

    /// Files uploading now (sealed, not yet in a quorum or failed).
    fn uploading(&self) -> usize {
        self.settings
            .max_inflight_uploads
            .max(1)
            .saturating_sub(self.permits.available_permits())
    }

    /// The size at which a file seals: the target, or the maximum when that is smaller.
    fn full_bytes(&self) -> usize {
        self.settings
            .target_file_bytes
            .min(self.settings.max_file_bytes)
            .max(1)
    }

    /// The least time between two eager seals at the current arrival rate (module docs).
    fn spacing(&self, now: Instant) -> Duration {
        let interval = self.settings.flush_interval;
        let target = self.full_bytes() as f64;
        let fill = self.arrivals.bytes_per_sec(now) * interval.as_secs_f64() / target;
        interval.mul_f64(fill.clamp(MIN_SPACING, 1.0))
    }

    /// When `file` seals if nothing else happens, and why: the eager point if the pipeline has
    /// room, else the bound (an upload finishing wakes the batcher to look again).
    fn seal_at(&self, file: &OpenFile, now: Instant) -> (Instant, SealReason) {
        let bound = file.opened + self.settings.flush_interval;
        let eager = match self.last_seal {
            Some(last) => (last + self.spacing(now)).max(file.opened),
            None => file.opened,
        };
        if eager >= bound || self.uploading() >= self.settings.eager_uploads.max(1) {
            // No room: the file grows until an upload finishes (`upload_done`) or the bound.
            return (bound, SealReason::Interval);
        }
        (eager, SealReason::Eager)
    }

    pub(crate) async fn run(mut self, mut tickets: mpsc::Receiver<QueuedTicket>) {
        let mut open: Option<OpenFile> = None;
        let upload_done = self.upload_done.clone();
        let mut timer = SealTimer::new(self.settings.timer_lag);
        loop {
            let now = Instant::now();
            let due = open.as_ref().map(|file| self.seal_at(file, now));
            // Checked against the clock on every wake (a ticket, an upload done), not left to
            // the timer: tokio would fire a deadline already past at its next millisecond tick.
            if let Some((at, reason)) = due {
                if at <= now {
                    let file = open.take().expect("a deadline implies an open file");
                    self.seal(file, reason).await;
                    continue;
                }
            }
            let wake = due.map(|(at, reason)| timer.wake_for(at, reason, now));
            // Biased, deadline first: a due file seals even under a steady stream of tickets,
            // and the order of events depends only on the inputs (the simulator replays seeds).
            tokio::select! {
                biased;
                _ = sleep_until_opt(wake), if wake.is_some() => {
                    let file = open.take().expect("a deadline implies an open file");
                    let (_, reason) = due.expect("a wake implies a deadline");
                    self.seal(file, reason).await;
                }
                // Room in the pipeline: the deadline is recomputed.
                _ = upload_done.notified(), if due.is_some() => {}
                queued = tickets.recv() => {
                    let Some(queued) = queued else { break };
                    // Tickets that arrived together go into one file: an eager seal is decided
                    // only once the queue is empty (or after a bounded number of tickets).
                    let mut next = Some(queued);
                    let mut taken = 0;
                    while let Some(queued) = next.take() {
                        if let Some(full) = self.accept(&mut open, queued) {
                            self.seal(full, SealReason::Size).await;
                        }
                        taken += 1;
                        if taken < DRAIN_TICKETS {
                            next = tickets.try_recv().ok();
                        }
                    }
                }
            }
        }
        if let Some(file) = open.take() {
            self.seal(file, SealReason::Shutdown).await;
        }
    }

    /// Appends a ticket to the open file (opening one); returns the file when it is full.
    fn accept(&mut self, open: &mut Option<OpenFile>, queued: QueuedTicket) -> Option<OpenFile> {
        let now = Instant::now();
        self.arrivals.add(queued.ticket.byte_len(), now);
        let file = open.get_or_insert_with(|| OpenFile {
            builder: FileBuilder::new(),
            tickets: Vec::new(),
            section_counts: HashMap::new(),
            opened: now,
        });
        self.metrics.observe(Stage::Queue, queued.queued_at);
        append(file, queued);
        if file.builder.batch_bytes() >= self.full_bytes() {
            open.take()
        } else {
            None
        }
    }

    async fn seal(&mut self, file: OpenFile, reason: SealReason) {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        self.last_seal = Some(Instant::now());
        self.metrics.seals(reason).inc();
        let seq = self.sealed_count.fetch_add(1, Ordering::SeqCst) + 1;
        for slot in &file.tickets {
            self.metrics.observe(Stage::BatchWait, slot.appended_at);
        }
        // The id on the PUT path; a pooled item brings its own.
        let file_id = FileId::new(self.clock.now_ms(), &mut self.rng);
        // With the id's time: the ack deadline runs from here (RFC 0006).
        let sealed_at = Instant::now();
        let encoded = file.builder.finish();
        self.metrics.file_size.observe(encoded.total_len as f64);
        let mut section_starts: HashMap<SectionKey, usize> = HashMap::new();
        let mut batches = Vec::new();
        for section in &encoded.footer.partitions {
            let section_key = (TopicId(section.topic_id), section.partition);
            section_starts.insert(section_key, batches.len());
            for location in &section.batches {
                batches.push(BatchCommit {
                    topic_id: section_key.0,
                    partition: section.partition,
                    byte_offset: location.offset,
                    len: location.len,
                    offset_span: location.meta.record_count,
                    first_timestamp: location.meta.first_timestamp,
                    max_timestamp: location.meta.max_timestamp,
                    producer_id: location.meta.producer_id,
                    producer_epoch: location.meta.producer_epoch,
                    base_sequence: location.meta.base_sequence,
                });
            }
        }
        let tickets = file
            .tickets
            .into_iter()
            .map(|slot| resolve_placements(slot, &section_starts))
            .collect();
        debug!(
            seq,
            bytes = encoded.total_len,
            batches = batches.len(),
            "sealed file"
        );
        let commit_id = file_id;
        let commit = FileCommit {
            // Set by the committer, which owns the commit chain.
            agent: String::new(),
            previous: None,
            file_id,
            size: encoded.total_len,
            buckets: Vec::new(),
            batches,
        };
        let destination = self.destination.clone();
        let attempts = self.settings.upload_attempts;
        let metrics = self.metrics.clone();
        let upload_done = self.upload_done.clone();
        let (serial, parallel) = match &self.sink {
            Sink::Serial(uploads) => (Some((uploads.clone(), commit, tickets)), None),
            Sink::Parallel(reserver) => {
                let (done, upload) = oneshot::channel();
                let _ = reserver.send(SealedFile {
                    commit,
                    tickets,
                    upload,
                    sealed_at,
                });
                (None, Some(done))
            }
        };
        tokio::spawn(async move {
            let started = Instant::now();
            metrics.uploads_in_flight.inc();
            let (file_id, result) =
                uploader::upload(&destination, file_id, &encoded, attempts, seq, &metrics).await;
            metrics.uploads_in_flight.dec();
            metrics.observe(Stage::Upload, started);
            drop(permit);
            upload_done.notify_one();
            if let Some((uploads, commit, tickets)) = serial {
                let _ = uploads.send(UploadedFile {
                    seq,
                    result,
                    commit: FileCommit { file_id, ..commit },
                    tickets,
                });
            } else if let Some(done) = parallel {
                // The PUT path writes the id chosen at seal, which the reservation names.
                debug_assert_eq!(file_id, commit_id);
                let _ = done.send((result, Instant::now()));
            }
        });
    }
}

/// Appends a whole ticket to the open file, recording where each partition's batches land.
fn append(file: &mut OpenFile, queued: QueuedTicket) {
    let mut placements = Vec::with_capacity(queued.ticket.partitions.len());
    for partition in queued.ticket.partitions {
        let section_key = (partition.topic_id, partition.partition);
        let count = file.section_counts.entry(section_key).or_insert(0);
        placements.push((section_key, *count, partition.batches.len()));
        *count += partition.batches.len();
        for batch in partition.batches {
            let header = &batch.header;
            let meta = BatchMeta {
                record_count: header.records_count,
                first_timestamp: header.first_timestamp,
                max_timestamp: header.max_timestamp,
                producer_id: header.producer_id,
                producer_epoch: header.producer_epoch,
                base_sequence: header.base_sequence,
            };
            file.builder
                .push(partition.topic_id.0, partition.partition, batch.bytes, meta);
        }
    }
    file.tickets.push(TicketSlot {
        reply: queued.reply,
        placements,
        appended_at: Instant::now(),
    });
}

/// Turns per-section positions into indices of the file's `FileCommit::batches`.
fn resolve_placements(
    mut slot: TicketSlot,
    section_starts: &HashMap<SectionKey, usize>,
) -> TicketSlot {
    for (section_key, first, _) in &mut slot.placements {
        *first += section_starts.get(section_key).copied().unwrap_or(0);
    }
    slot
}

/// Where the batcher's timer is armed for the seal deadline ahead.
struct SealTimer {
    lag: Duration,
    /// The bound last armed for, and the instant its timer was armed at.
    armed: Option<(Instant, Instant)>,
}

impl SealTimer {
    fn new(lag: Duration) -> Self {
        Self { lag, armed: None }
    }

    /// When to arm tokio's timer for a seal due `at`.
    ///
    /// The interval is an upper bound on a batch's wait: its timer is armed `lag` early if that
    /// was still ahead when the bound was first seen, so that the timer, which fires about
    /// `lag` late, seals on time on average (a single seal up to `lag` early). That instant is
    /// kept while the bound stands: requests that wake the batcher in its last `lag` (they come
    /// in bursts a millisecond or so apart) must not move the timer back to `at`, where it
    /// would fire a millisecond late again.
    ///
    /// The eager spacing is the least time between seals, so its timer is armed at `at` and
    /// never fires early (only late, unless a request arriving after `at` seals it exactly:
    /// `Batcher::run`). Armed early, eager seals came up to a millisecond before their spacing:
    /// 2 % more PUTs per GiB at the defaults at 20 MiB/s, and 9 % more files (against 6–7 %
    /// now) at 5,000 msg/s with `eager_uploads` 3 (docs/benchmarks.md §33).
    fn wake_for(&mut self, at: Instant, reason: SealReason, now: Instant) -> Instant {
        if reason != SealReason::Interval {
            return at;
        }
        if let Some((bound, wake)) = self.armed {
            if bound == at {
                return wake;
            }
        }
        let wake = match at.checked_sub(self.lag) {
            Some(early) if early > now => early,
            _ => at,
        };
        self.armed = Some((at, wake));
        wake
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: SealReason = SealReason::Interval;

    #[test]
    fn test_the_bound_timer_is_armed_early_only_while_that_is_ahead() {
        let now = Instant::now();
        let lag = Duration::from_millis(1);
        let at = now + Duration::from_millis(5);
        assert_eq!(SealTimer::new(lag).wake_for(at, BOUND, now), at - lag);
        // Due within the lag: armed for the deadline itself, never for a past instant (which
        // would fire at once and seal early by up to the lag on every wake).
        let soon = now + Duration::from_micros(400);
        assert_eq!(SealTimer::new(lag).wake_for(soon, BOUND, now), soon);
        assert_eq!(
            SealTimer::new(lag).wake_for(now + lag, BOUND, now),
            now + lag
        );
        assert_eq!(SealTimer::new(Duration::ZERO).wake_for(at, BOUND, now), at);
    }

    #[test]
    fn test_a_wake_in_the_last_lag_keeps_the_early_timer() {
        let now = Instant::now();
        let lag = Duration::from_millis(1);
        let mut timer = SealTimer::new(lag);
        let at = now + Duration::from_millis(2);
        assert_eq!(timer.wake_for(at, BOUND, now), at - lag);
        // A burst of requests 1.5 ms in, inside the last lag before the same deadline.
        let later = now + Duration::from_micros(1_500);
        assert_eq!(timer.wake_for(at, BOUND, later), at - lag);
        // A new deadline is armed afresh.
        let next = later + Duration::from_millis(2);
        assert_eq!(timer.wake_for(next, BOUND, later), next - lag);
        assert_eq!(timer.wake_for(at, BOUND, later), at);
    }

    #[test]
    fn test_the_eager_spacing_is_never_armed_early() {
        let now = Instant::now();
        let lag = Duration::from_millis(1);
        let mut timer = SealTimer::new(lag);
        let at = now + Duration::from_millis(5);
        assert_eq!(timer.wake_for(at, SealReason::Eager, now), at);
        // Nor does an earlier bound's early instant carry over to it.
        assert_eq!(timer.wake_for(at, BOUND, now), at - lag);
        assert_eq!(timer.wake_for(at, SealReason::Eager, now), at);
    }
}
