//! Public types of the produce path and the handle connections use.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use weir_common::{Clock, TopicId};
use weir_control::{BatchOutcome, ControlError, ControlPlane};
use weir_protocol::ValidatedBatch;
use weir_storage::{QuorumWriter, ReadCache};

use crate::batcher::{Batcher, Sink};
use crate::committer::Committer;
use crate::metrics::ProduceMetrics;
use crate::reserver::{Incarnations, Reserver};
use crate::uploader::{Destination, IngestWrites};
use tracing::info;

/// Produce-path tuning. Each knob trades latency against object-store cost.
#[derive(Debug, Clone)]
pub struct ProduceSettings {
    /// Longest a batch waits in the open file, and the longest spacing of eager seals (see
    /// the batcher). Lower: lower latency at high rates, more PUTs per GiB.
    pub flush_interval: Duration,
    /// A file seals once it holds this many bytes: the size worth a PUT at once. With
    /// `flush_interval` it sets the rate (`target_file_bytes / flush_interval`) from which every
    /// file waits the interval or fills to the target; below it, seals come sooner.
    pub target_file_bytes: usize,
    /// A file seals once it holds this many bytes, whatever the target (a ticket is never
    /// split, so the last one can take a file past it). Higher: fewer PUTs, more memory in
    /// flight.
    pub max_file_bytes: usize,
    /// Files uploading at once. Bounds memory and hides per-PUT latency.
    pub max_inflight_uploads: usize,
    /// An eager seal waits until fewer than this many files upload (see the batcher). 1: only
    /// when none does, so at moderate rates files are sealed back to back, one upload at a
    /// time. Higher: uploads overlap and a batch waits less for its file to seal, for more
    /// PUTs per GiB below `target_file_bytes / flush_interval` (docs/benchmarks.md §21).
    pub eager_uploads: usize,
    /// Upload attempts per file before the file fails.
    pub upload_attempts: u32,
    /// Tickets queued in front of the batcher before connections feel back-pressure.
    pub queue_depth: usize,
    /// Reserve a file's offsets in the metadata log while it uploads, and acknowledge once
    /// both are durable (RFC 0006): an acknowledgement costs `max(upload, log write)` instead
    /// of their sum. Needs the PUT write path; the appendable pool keeps commit-after-upload.
    pub parallel_persistence: bool,
    /// With `parallel_persistence`, a file not in a quorum this long after its seal is never
    /// acknowledged (its tickets fail retriably), so the resolver may abort it once this plus
    /// the clock-skew margin has passed.
    pub ack_deadline: Duration,
    /// How late tokio's timer fires on this runtime: the batcher arms its timer for a file's
    /// `flush_interval` bound this much early, so files seal at the bound on average instead of
    /// about a millisecond past it (`weir_common::TOKIO_TIMER_LAG` on real time). The eager
    /// spacing, a minimum, is never armed early. Zero under a paused clock (tests, the
    /// simulator), whose timers are exact.
    pub timer_lag: Duration,
}

impl Default for ProduceSettings {
    fn default() -> Self {
        Self {
            flush_interval: Duration::from_millis(5),
            target_file_bytes: 1024 * 1024,
            max_file_bytes: 8 * 1024 * 1024,
            max_inflight_uploads: 32,
            eager_uploads: 1,
            upload_attempts: 3,
            queue_depth: 1024,
            parallel_persistence: false,
            ack_deadline: Duration::from_secs(10),
            timer_lag: Duration::ZERO,
        }
    }
}

/// The validated batches of one partition in a produce request.
#[derive(Debug, Clone)]
pub struct PartitionBatches {
    pub topic_id: TopicId,
    pub partition: i32,
    pub batches: Vec<ValidatedBatch>,
}

/// One produce request's worth of batches, appended to a single file as a unit.
#[derive(Debug, Clone, Default)]
pub struct ProduceTicket {
    pub partitions: Vec<PartitionBatches>,
}

impl ProduceTicket {
    pub fn byte_len(&self) -> usize {
        self.partitions
            .iter()
            .flat_map(|p| &p.batches)
            .map(|b| b.bytes.len())
            .sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProduceError {
    #[error("upload failed: {0}")]
    Storage(String),
    #[error("an earlier file of this agent failed, so this one was not committed")]
    EarlierFileFailed,
    /// A reserved file (parallel persistence) that was not acknowledged: its reservation may
    /// be in the log, so the resolver may still confirm it (its batches become readable at the
    /// reserved offsets) or abort it. Answered `REQUEST_TIMED_OUT`, Kafka's "possibly
    /// written", never `KAFKA_STORAGE_ERROR`, which tells clients that nothing was written.
    #[error("not acknowledged, and may still become readable: {0}")]
    Unresolved(String),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("the produce pipeline is shutting down")]
    ShuttingDown,
}

/// Per-partition outcome, in the order of [`ProduceTicket::partitions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionOutcome {
    /// Base offset of the partition's first batch (original offset for an idempotent retry).
    Committed {
        base_offset: i64,
        log_start_offset: i64,
    },
    Failed(ProduceError),
}

pub type TicketOutcome = Vec<PartitionOutcome>;

pub(crate) struct QueuedTicket {
    pub(crate) ticket: ProduceTicket,
    pub(crate) reply: oneshot::Sender<TicketOutcome>,
    /// When the handler submitted it (the `queue` stage starts).
    pub(crate) queued_at: tokio::time::Instant,
}

/// Handle to the agent's produce pipeline; cheap to clone.
#[derive(Debug, Clone)]
pub struct ProducePipeline {
    tickets: mpsc::Sender<QueuedTicket>,
    metrics: ProduceMetrics,
    incarnations: Option<Arc<Incarnations>>,
}

impl std::fmt::Debug for QueuedTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueuedTicket({} partitions)",
            self.ticket.partitions.len()
        )
    }
}

impl ProducePipeline {
    /// Starts the batcher, uploader and committer tasks, writing files with whole-object PUTs.
    pub fn start(
        settings: ProduceSettings,
        writer: Arc<QuorumWriter>,
        control: ControlPlane,
        cache: Arc<ReadCache>,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Self {
        Self::start_with(
            settings,
            writer,
            IngestWrites::Put,
            control,
            cache,
            clock,
            seed,
        )
    }

    /// Starts the pipeline writing files the way `ingest` says.
    pub fn start_with(
        settings: ProduceSettings,
        writer: Arc<QuorumWriter>,
        ingest: IngestWrites,
        control: ControlPlane,
        cache: Arc<ReadCache>,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Self {
        let (tickets_tx, tickets_rx) = mpsc::channel(settings.queue_depth.max(1));
        let sealed_count = Arc::new(AtomicU64::new(0));
        let agent = format!("agent-{seed:016x}");
        let metrics = ProduceMetrics::new();
        let parallel = settings.parallel_persistence && matches!(ingest, IngestWrites::Put);
        if settings.parallel_persistence && !parallel {
            info!("parallel persistence needs whole-object PUTs; appendable ingest commits after upload");
        }
        let (sink, incarnations) = if parallel {
            let incarnations = Arc::new(Incarnations::new(agent));
            let (reserver, sealed_tx) = Reserver::new(
                control,
                incarnations.clone(),
                writer.buckets().len(),
                settings.ack_deadline,
                metrics.clone(),
            );
            tokio::spawn(reserver.run());
            (Sink::Parallel(sealed_tx), Some(incarnations))
        } else {
            let (committer, uploads_tx) =
                Committer::new(control, sealed_count.clone(), agent, metrics.clone());
            tokio::spawn(committer.run());
            (Sink::Serial(uploads_tx), None)
        };
        let batcher = Batcher::new(
            settings,
            Destination {
                writer,
                writes: ingest,
                cache,
            },
            clock,
            seed,
            sealed_count,
            sink,
            metrics.clone(),
        );
        tokio::spawn(batcher.run(tickets_rx));
        Self {
            tickets: tickets_tx,
            metrics,
            incarnations,
        }
    }

    /// With parallel persistence, the pipeline's reserving incarnations (the resolver leaves
    /// the live one's pending files alone).
    pub fn incarnations(&self) -> Option<Arc<Incarnations>> {
        self.incarnations.clone()
    }

    /// The pipeline's metrics, for the agent to register.
    pub fn metrics(&self) -> &ProduceMetrics {
        &self.metrics
    }

    /// Queues a ticket (waiting if the pipeline is full) and returns a future for its outcome.
    /// Tickets queued from one task keep their order into files and hence into offsets.
    pub async fn submit(
        &self,
        ticket: ProduceTicket,
    ) -> impl std::future::Future<Output = TicketOutcome> {
        let partitions = ticket.partitions.len();
        let (reply, outcome) = oneshot::channel();
        let sent = self
            .tickets
            .send(QueuedTicket {
                ticket,
                reply,
                queued_at: tokio::time::Instant::now(),
            })
            .await
            .is_ok();
        async move {
            if !sent {
                return vec![PartitionOutcome::Failed(ProduceError::ShuttingDown); partitions];
            }
            outcome.await.unwrap_or_else(|_| {
                vec![PartitionOutcome::Failed(ProduceError::ShuttingDown); partitions]
            })
        }
    }
}

/// Folds the per-batch outcomes of one partition into the partition's outcome.
pub(crate) fn partition_outcome(outcomes: &[BatchOutcome]) -> PartitionOutcome {
    let mut first: Option<(i64, i64)> = None;
    for outcome in outcomes {
        match outcome {
            BatchOutcome::Appended {
                base_offset,
                log_start_offset,
            }
            | BatchOutcome::Duplicate {
                base_offset,
                log_start_offset,
            } => {
                first.get_or_insert((*base_offset, *log_start_offset));
            }
            BatchOutcome::Rejected(error) => {
                return PartitionOutcome::Failed(ProduceError::Control(error.clone()))
            }
        }
    }
    match first {
        Some((base_offset, log_start_offset)) => PartitionOutcome::Committed {
            base_offset,
            log_start_offset,
        },
        None => PartitionOutcome::Failed(ProduceError::Storage("empty partition".into())),
    }
}
