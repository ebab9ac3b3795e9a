//! Parallel persistence (RFC 0006): a sealed file's offsets are reserved in the metadata log
//! while the file uploads, and its tickets are answered once both are durable.
//!
//! The reserver enqueues `ReserveFile` for each file in seal order, chained like today's
//! commits, and hands the file to the acker. The acker answers files strictly in seal order:
//! a file's tickets are answered when its reservation is durable (the offsets) and its upload
//! reached a quorum within `ack_deadline` of its seal (DUR-1). It serves the file to this
//! agent's consumers at once (an acknowledged file is never aborted, see
//! `weir_control::plane::Served`) and hands its confirmation back to the reserver, which
//! enqueues waiting confirmations as one `ConfirmFiles` just before the next reservation, so
//! both share a slot, or after [`CONFIRM_LINGER`] without one. Anything else — an upload that
//! failed or came late, a refused reservation, a failed log write — fails the file's tickets
//! retriably (an upload that failed or came late as [`ProduceError::Unresolved`], "possibly
//! written", since the resolver may still confirm the file) and **abandons the incarnation**:
//! every later file already reserved under it fails too (none can be answered before the
//! failed one), and the reserver starts a new incarnation (a new chain). The abandoned
//! incarnation's pending files are left to the resolver (`resolver.rs`), which confirms those
//! that reached a quorum and aborts the rest once they can no longer be acknowledged. So the
//! agent never has to decide an abort itself, and sequences roll back whole (RFC 0006, "Ack
//! order").

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::Future;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::warn;
use weir_common::FileId;
use weir_control::{
    BatchOutcome, ConfirmedFile, ControlError, ControlPlane, Entry, EntryResult, FileCommit,
};

use crate::batcher::TicketSlot;
use crate::committer::{answer_tickets, fail_tickets};
use crate::metrics::{ProduceMetrics, Stage};
use crate::pipeline::ProduceError;

/// The upload's outcome (the indices of the buckets holding the file, or why it failed), and
/// when it was known.
pub(crate) type UploadResult = (Result<Vec<usize>, String>, Instant);

/// A sealed file whose upload has started.
pub(crate) struct SealedFile {
    pub(crate) commit: FileCommit,
    pub(crate) tickets: Vec<TicketSlot>,
    pub(crate) upload: oneshot::Receiver<UploadResult>,
    pub(crate) sealed_at: Instant,
}

/// The agent's reserving incarnations: `{base}` for the first, `{base}.{n}` after `n`
/// abandonments. Shared with the resolver, which never resolves the live one's files.
#[derive(Debug)]
pub struct Incarnations {
    base: String,
    generation: AtomicU64,
}

impl Incarnations {
    pub fn new(base: String) -> Self {
        Self {
            base,
            generation: AtomicU64::new(0),
        }
    }

    fn name(&self, generation: u64) -> String {
        match generation {
            0 => self.base.clone(),
            n => format!("{}.{n}", self.base),
        }
    }

    fn current(&self) -> (u64, String) {
        let generation = self.generation.load(Ordering::SeqCst);
        (generation, self.name(generation))
    }

    /// The incarnation reserving now.
    pub fn live(&self) -> String {
        self.current().1
    }

    /// Whether `name` is one of these incarnations that is no longer live. Such an incarnation
    /// never answers another ticket: the acker fails every file whose incarnation is not the
    /// live one, checked once the upload is done and with no await between that check and the
    /// answer, and generations only grow. So a file of it that is not in a quorum now was not
    /// acknowledged and never will be, wherever its upload stands.
    pub fn abandoned_here(&self, name: &str) -> bool {
        let generation = if name == self.base {
            0
        } else {
            match name
                .strip_prefix(self.base.as_str())
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(n) if n > 0 => n,
                _ => return false,
            }
        };
        generation < self.generation.load(Ordering::SeqCst)
    }

    /// Abandons the live incarnation `times` times.
    #[cfg(test)]
    pub(crate) fn abandon_for_test(&self, times: u64) {
        for _ in 0..times {
            self.abandon(self.current().0, "a test");
        }
    }

    /// Ends `generation` (if it is still the live one): its unanswered files fail, and the
    /// next reservation starts a new chain.
    fn abandon(&self, generation: u64, why: &str) {
        if self
            .generation
            .compare_exchange(
                generation,
                generation + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            warn!(
                incarnation = %self.name(generation),
                next = %self.name(generation + 1),
                why,
                "abandoning the reserving incarnation; the resolver settles its pending files"
            );
        }
    }
}

type Reserved = Pin<Box<dyn Future<Output = Result<EntryResult, ControlError>> + Send>>;

/// A reserved file waiting to be answered.
struct AckJob {
    generation: u64,
    file_id: FileId,
    reservation: Reserved,
    upload: oneshot::Receiver<UploadResult>,
    tickets: Vec<TicketSlot>,
    sealed_at: Instant,
    reserved_at: Instant,
}

pub(crate) struct Reserver {
    control: ControlPlane,
    sealed: mpsc::UnboundedReceiver<SealedFile>,
    incarnations: Arc<Incarnations>,
    buckets: usize,
    ack_deadline: Duration,
    metrics: ProduceMetrics,
}

impl Reserver {
    pub(crate) fn new(
        control: ControlPlane,
        incarnations: Arc<Incarnations>,
        buckets: usize,
        ack_deadline: Duration,
        metrics: ProduceMetrics,
    ) -> (Self, mpsc::UnboundedSender<SealedFile>) {
        let (sealed_tx, sealed) = mpsc::unbounded_channel();
        let reserver = Self {
            control,
            sealed,
            incarnations,
            buckets,
            ack_deadline,
            metrics,
        };
        (reserver, sealed_tx)
    }

    pub(crate) async fn run(mut self) {
        let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
        let (confirms_tx, mut confirms_rx) = mpsc::unbounded_channel();
        tokio::spawn(acker(
            jobs_rx,
            confirms_tx,
            self.control.clone(),
            self.incarnations.clone(),
            self.ack_deadline,
            self.metrics.clone(),
        ));
        let (mut chain_generation, _) = self.incarnations.current();
        let mut tip: Option<FileId> = None;
        let mut confirms = Confirms::default();
        loop {
            // Biased, here and in every select! the simulator runs through: tokio's random
            // branch choice is seeded per process, so an unbiased select! makes a seed's run
            // differ from its replay. A sealed file first: its reservation takes pending
            // confirmations along (below).
            let file = tokio::select! {
                biased;
                file = self.sealed.recv() => file,
                Some(confirm) = confirms_rx.recv() => {
                    confirms.push(confirm);
                    continue;
                }
                () = sleep_until_or_never(confirms.due), if confirms.due.is_some() => {
                    confirms.flush(&self.control, &self.incarnations, &self.metrics).await;
                    continue;
                }
            };
            let Some(file) = file else { break };
            // Confirmations ride in the reservation's slot (enqueued just before it).
            while let Ok(confirm) = confirms_rx.try_recv() {
                confirms.push(confirm);
            }
            confirms
                .flush(&self.control, &self.incarnations, &self.metrics)
                .await;
            let (generation, agent) = self.incarnations.current();
            if generation != chain_generation {
                // A new incarnation starts a new chain.
                chain_generation = generation;
                tip = None;
            }
            let commit = FileCommit {
                agent,
                previous: tip,
                // Any ingest bucket may come to hold it; the confirmation names the holders.
                buckets: (0..self.buckets).map(|b| b as u8).collect(),
                ..file.commit
            };
            let file_id = commit.file_id;
            let reserved_at = Instant::now();
            match self.control.enqueue(Entry::ReserveFile(commit)).await {
                Ok(reservation) => {
                    tip = Some(file_id);
                    let _ = jobs_tx.send(AckJob {
                        generation,
                        file_id,
                        reservation: Box::pin(reservation),
                        upload: file.upload,
                        tickets: file.tickets,
                        sealed_at: file.sealed_at,
                        reserved_at,
                    });
                }
                Err(err) => {
                    fail_tickets(file.tickets, ProduceError::Control(err));
                    self.incarnations
                        .abandon(generation, "a reservation could not be enqueued");
                }
            }
        }
        // No more files: the acker finishes what it has, then its confirmations go out.
        drop(jobs_tx);
        while let Some(confirm) = confirms_rx.recv().await {
            confirms.push(confirm);
        }
        confirms
            .flush(&self.control, &self.incarnations, &self.metrics)
            .await;
    }
}

/// How long a confirmation waits for a reservation to ride with before it takes a slot of its
/// own: under load a file is sealed far sooner, so confirmations cost no log slot; when idle,
/// the log's stable view (other agents, a restart, retention, `ListOffsets`) trails this
/// agent's served view by at most this.
pub(crate) const CONFIRM_LINGER: Duration = Duration::from_millis(50);

/// Confirmations of acknowledged files waiting for a slot, with the incarnation that
/// acknowledged each.
#[derive(Default)]
struct Confirms {
    files: Vec<(u64, ConfirmedFile)>,
    /// When the oldest of them stops waiting for a reservation.
    due: Option<Instant>,
}

impl Confirms {
    fn push(&mut self, confirm: (u64, ConfirmedFile)) {
        self.files.push(confirm);
        self.due
            .get_or_insert_with(|| Instant::now() + CONFIRM_LINGER);
    }

    /// Enqueues one `ConfirmFiles` for every waiting file; once its slot is settled the files
    /// leave this agent's served overlay (a failed write abandons their incarnations: the
    /// resolver confirms the files instead).
    async fn flush(
        &mut self,
        control: &ControlPlane,
        incarnations: &Arc<Incarnations>,
        metrics: &ProduceMetrics,
    ) {
        self.due = None;
        if self.files.is_empty() {
            return;
        }
        let (generations, files): (Vec<u64>, Vec<ConfirmedFile>) = self.files.drain(..).unzip();
        let file_ids: Vec<FileId> = files.iter().map(|file| file.file_id).collect();
        let enqueued = control.enqueue(Entry::ConfirmFiles { files }).await;
        let (control, incarnations) = (control.clone(), incarnations.clone());
        let gauge = metrics.acknowledged_unconfirmed.clone();
        tokio::spawn(async move {
            let durable = match enqueued {
                Ok(confirmed) => confirmed.await.is_ok(),
                Err(_) => false,
            };
            if !durable {
                for generation in generations {
                    incarnations.abandon(generation, "a confirmation's log write failed");
                }
            }
            for file_id in &file_ids {
                control.forget_acknowledged(file_id);
            }
            gauge.set(control.acknowledged_unconfirmed() as i64);
        });
    }
}

/// The answer for a file whose incarnation an earlier file abandoned: its reservation may be
/// durable and its upload may land, so the resolver may confirm it.
fn earlier_file_failed() -> ProduceError {
    ProduceError::Unresolved(EARLIER_FILE_FAILED.to_string())
}

pub(crate) const EARLIER_FILE_FAILED: &str =
    "an earlier file of this agent failed, so this one was not acknowledged";

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

/// Answers reserved files in seal order (module docs).
async fn acker(
    mut jobs: mpsc::UnboundedReceiver<AckJob>,
    confirms: mpsc::UnboundedSender<(u64, ConfirmedFile)>,
    control: ControlPlane,
    incarnations: Arc<Incarnations>,
    ack_deadline: Duration,
    metrics: ProduceMetrics,
) {
    while let Some(job) = jobs.recv().await {
        let generation = job.generation;
        if incarnations.current().0 != generation {
            fail_tickets(job.tickets, earlier_file_failed());
            continue;
        }
        let reserved = job.reservation.await;
        metrics.observe(Stage::Commit, job.reserved_at);
        let outcomes = match reserved {
            Ok(EntryResult::ReserveFile(outcomes)) if !refused_whole(&outcomes) => outcomes,
            Ok(other) => {
                let error = ControlError::Unavailable(format!("reservation refused: {other:?}"));
                fail_tickets(job.tickets, ProduceError::Control(error));
                incarnations.abandon(generation, "a reservation was refused");
                continue;
            }
            Err(err) => {
                incarnations.abandon(generation, "a reservation's log write failed");
                // When the data failed too (a full disk under both), say so: clients and
                // operators see KAFKA_STORAGE_ERROR, as on the serial path, rather than a
                // timeout. Waited for aside, so the next incarnation's files are not held
                // behind an upload that may hang until the deadline.
                let deadline = job.sealed_at + ack_deadline;
                let (upload, tickets) = (job.upload, job.tickets);
                tokio::spawn(async move {
                    let error = match tokio::time::timeout_at(deadline, upload).await {
                        Ok(Ok((Err(reason), _))) => ProduceError::Storage(reason),
                        _ => ProduceError::Control(err),
                    };
                    fail_tickets(tickets, error);
                });
                continue;
            }
        };
        weir_common::failpoint::hit(weir_common::failpoint::AFTER_RESERVE_BEFORE_ACK);
        let deadline = job.sealed_at + ack_deadline;
        // The deadline is judged by when the upload reached its quorum, not by when this loop
        // got to the file: a file that landed late must never be acknowledged, however soon
        // after its result is read (the resolver may abort what was missing past it).
        let holders = match tokio::time::timeout_at(deadline, job.upload).await {
            Ok(Ok((Ok(holders), landed_at))) if landed_at <= deadline => {
                if incarnations.current().0 != generation {
                    fail_tickets(job.tickets, earlier_file_failed());
                    continue;
                }
                holders
            }
            Ok(Ok((Err(reason), _))) => {
                // Reserved, and perhaps in a bucket: the resolver may repair and confirm it.
                fail_tickets(job.tickets, ProduceError::Unresolved(reason));
                incarnations.abandon(generation, "an upload failed");
                continue;
            }
            Ok(Ok((Ok(_), _))) | Ok(Err(_)) | Err(_) => {
                let reason = format!(
                    "the file did not reach a quorum within the ack deadline ({ack_deadline:?})"
                );
                fail_tickets(job.tickets, ProduceError::Unresolved(reason));
                incarnations.abandon(generation, "an upload missed the ack deadline");
                continue;
            }
        };
        weir_common::failpoint::hit(weir_common::failpoint::AFTER_COMMIT_BEFORE_ACK);
        let holders: Vec<u8> = holders.iter().map(|h| *h as u8).collect();
        // Acknowledged, so certain to be confirmed: consumers here may read it now
        // (`weir_control::plane::Served`), before the tickets are answered, so a client that
        // reads its own write finds it.
        control.serve_acknowledged(job.file_id, holders.clone());
        metrics
            .acknowledged_unconfirmed
            .set(control.acknowledged_unconfirmed() as i64);
        answer_tickets(job.tickets, &outcomes);
        let confirm = ConfirmedFile {
            file_id: job.file_id,
            buckets: holders,
        };
        if confirms.send((generation, confirm)).is_err() {
            // The reserver is gone (shutting down): the resolver confirms it after a restart.
            control.forget_acknowledged(&job.file_id);
        }
    }
}

/// A reservation rejected whole did not become the chain's tip.
fn refused_whole(outcomes: &[BatchOutcome]) -> bool {
    outcomes.iter().any(|outcome| {
        matches!(
            outcome,
            BatchOutcome::Rejected(
                ControlError::CommitOutOfOrder { .. } | ControlError::FileTooOld { .. }
            )
        )
    })
}
