//! The FileBatcher: packs tickets from every connection into one open file and seals it on
//! `flush_interval` or `max_file_bytes`. Sealed files are numbered in seal order and handed to
//! uploads; the upload-concurrency permit is taken before sealing the next file, so a slow
//! store pushes back on the ticket queue rather than growing memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tracing::debug;
use weir_common::{Clock, FileId, TopicId};
use weir_control::{BatchCommit, FileCommit};
use weir_format::{BatchMeta, FileBuilder};

use crate::committer::UploadedFile;
use crate::metrics::{ProduceMetrics, Stage};
use crate::pipeline::{ProduceSettings, QueuedTicket, TicketOutcome};
use crate::uploader::{self, Destination};

type SectionKey = (TopicId, i32);

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
    deadline: Instant,
}

pub(crate) struct Batcher {
    settings: ProduceSettings,
    destination: Arc<Destination>,
    clock: Arc<dyn Clock>,
    rng: fastrand::Rng,
    sealed_count: Arc<AtomicU64>,
    uploads: mpsc::UnboundedSender<UploadedFile>,
    permits: Arc<Semaphore>,
    metrics: ProduceMetrics,
}

impl Batcher {
    pub(crate) fn new(
        settings: ProduceSettings,
        destination: Destination,
        clock: Arc<dyn Clock>,
        seed: u64,
        sealed_count: Arc<AtomicU64>,
        uploads: mpsc::UnboundedSender<UploadedFile>,
        metrics: ProduceMetrics,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(settings.max_inflight_uploads.max(1)));
        Self {
            settings,
            destination: Arc::new(destination),
            clock,
            rng: fastrand::Rng::with_seed(seed),
            sealed_count,
            uploads,
            permits,
            metrics,
        }
    }

    pub(crate) async fn run(mut self, mut tickets: mpsc::Receiver<QueuedTicket>) {
        let mut open: Option<OpenFile> = None;
        loop {
            let deadline = open.as_ref().map(|file| file.deadline);
            // Biased, deadline first: a due file seals even under a steady stream of tickets,
            // and the order of events depends only on the inputs (the simulator replays seeds).
            tokio::select! {
                biased;
                _ = sleep_until_opt(deadline), if deadline.is_some() => {
                    let due = open.take().expect("deadline implies an open file");
                    self.seal(due).await;
                }
                queued = tickets.recv() => {
                    let Some(queued) = queued else { break };
                    let file = open.get_or_insert_with(|| OpenFile {
                        builder: FileBuilder::new(),
                        tickets: Vec::new(),
                        section_counts: HashMap::new(),
                        deadline: Instant::now() + self.settings.flush_interval,
                    });
                    self.metrics.observe(Stage::Queue, queued.queued_at);
                    append(file, queued);
                    if file.builder.batch_bytes() >= self.settings.max_file_bytes {
                        let full = open.take().expect("just appended");
                        self.seal(full).await;
                    }
                }
            }
        }
        if let Some(file) = open.take() {
            self.seal(file).await;
        }
    }

    async fn seal(&mut self, file: OpenFile) {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        let seq = self.sealed_count.fetch_add(1, Ordering::SeqCst) + 1;
        for slot in &file.tickets {
            self.metrics.observe(Stage::BatchWait, slot.appended_at);
        }
        // The id on the PUT path; a pooled item brings its own.
        let file_id = FileId::new(self.clock.now_ms(), &mut self.rng);
        let encoded = file.builder.finish();
        self.metrics.files_sealed.inc();
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
        let uploads = self.uploads.clone();
        let attempts = self.settings.upload_attempts;
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            metrics.uploads_in_flight.inc();
            let (file_id, result) =
                uploader::upload(&destination, file_id, &encoded, attempts, seq, &metrics).await;
            metrics.uploads_in_flight.dec();
            metrics.observe(Stage::Upload, started);
            drop(permit);
            let _ = uploads.send(UploadedFile {
                seq,
                result,
                commit: FileCommit { file_id, ..commit },
                tickets,
            });
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

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
