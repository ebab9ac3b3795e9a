//! What the produce path exports to `/metrics`: where a produce spends its time, and the files
//! it seals and uploads. Created unregistered with the pipeline; the agent registers them.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};
use weir_common::metrics::{counter, counter_vec, gauge, histogram, latency_vec};

use crate::batcher::SealReason;

/// The stages of [`ProduceMetrics::stage`], in the order a produce passes them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stage {
    /// From the handler's submit to the batcher taking the request (per request).
    Queue,
    /// From the request's batches entering the open file to the file's seal (per request).
    BatchWait,
    /// From the seal to the file in a quorum of ingest buckets, retries included (per file).
    Upload,
    /// From the upload to the commit durable in the metadata log (per file).
    Commit,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::BatchWait => "batch_wait",
            Stage::Upload => "upload",
            Stage::Commit => "commit",
        }
    }
}

/// The produce path's metrics.
#[derive(Debug, Clone)]
pub struct ProduceMetrics {
    stage: HistogramVec,
    files_sealed: IntCounterVec,
    pub(crate) file_size: Histogram,
    pub(crate) uploads_in_flight: IntGauge,
    pub(crate) upload_retries: IntCounter,
    pub(crate) acknowledged_unconfirmed: IntGauge,
    resolved: IntCounterVec,
}

impl Default for ProduceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProduceMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> Self {
        // 1 KiB to 64 MiB by powers of four.
        let sizes = prometheus::exponential_buckets(1024.0, 4.0, 9).expect("valid buckets");
        Self {
            stage: latency_vec(
                "weir_produce_stage_duration_seconds",
                "Time a produce spends in each stage: queue and batch_wait per request, upload \
                 and commit per file",
                &["stage"],
            ),
            files_sealed: counter_vec(
                "weir_files_sealed_total",
                "Files sealed by the batcher (each is one upload to every ingest bucket), by why: \
                 size (target or max bytes), interval (flush_interval), eager (the pipeline had \
                 room at a low rate), shutdown",
                &["reason"],
            ),
            file_size: histogram("weir_file_size_bytes", "Sizes of sealed files", sizes),
            uploads_in_flight: gauge(
                "weir_uploads_in_flight",
                "Files uploading now (bounded by produce.max_inflight_uploads)",
            ),
            upload_retries: counter(
                "weir_upload_retries_total",
                "File uploads attempted again after a retriable failure",
            ),
            acknowledged_unconfirmed: gauge(
                "weir_acknowledged_unconfirmed_files",
                "Parallel persistence: files acknowledged and served here whose confirmation \
                 is not durable yet",
            ),
            resolved: counter_vec(
                "weir_resolver_files_total",
                "Parallel persistence: pending files of stopped or abandoned incarnations this \
                 agent settled, by outcome: confirmed (found in a quorum), repaired (found in too \
                 few buckets, copied to a quorum, then confirmed), aborted (in no quorum past the \
                 ack deadline: their offsets hold empty batches)",
                &["outcome"],
            ),
        }
    }

    /// Registers every metric with `registry` (every seal reason starts at zero).
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for reason in SealReason::ALL {
            self.seals(reason);
        }
        registry.register(Box::new(self.stage.clone()))?;
        registry.register(Box::new(self.files_sealed.clone()))?;
        registry.register(Box::new(self.file_size.clone()))?;
        registry.register(Box::new(self.uploads_in_flight.clone()))?;
        registry.register(Box::new(self.acknowledged_unconfirmed.clone()))?;
        for outcome in ResolveOutcome::ALL {
            self.resolved(outcome);
        }
        registry.register(Box::new(self.resolved.clone()))?;
        registry.register(Box::new(self.upload_retries.clone()))
    }

    /// The seal counter for `reason`.
    pub(crate) fn seals(&self, reason: SealReason) -> IntCounter {
        self.files_sealed.with_label_values(&[reason.label()])
    }

    /// The resolver's counter of files settled with `outcome`.
    pub fn resolved(&self, outcome: ResolveOutcome) -> IntCounter {
        self.resolved.with_label_values(&[outcome.label()])
    }

    pub(crate) fn observe(&self, stage: Stage, since: tokio::time::Instant) {
        self.stage
            .with_label_values(&[stage.name()])
            .observe(since.elapsed().as_secs_f64());
    }
}

/// How the resolver settled a pending file (`weir_resolver_files_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveOutcome {
    /// In a quorum already.
    Confirmed,
    /// Copied from too few buckets to a quorum, then confirmed.
    Repaired,
    /// In no quorum past the ack deadline: its offsets hold empty batches.
    Aborted,
}

impl ResolveOutcome {
    const ALL: [ResolveOutcome; 3] = [Self::Confirmed, Self::Repaired, Self::Aborted];

    fn label(self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Repaired => "repaired",
            Self::Aborted => "aborted",
        }
    }
}
