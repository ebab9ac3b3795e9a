//! The committer: receives upload results in any order and commits files to the control plane
//! strictly in seal order (ORD-2), pipelined: a commit is enqueued as soon as every earlier file
//! is enqueued, and results are awaited concurrently. Outcomes fan out to each file's tickets.
//!
//! Commits form a chain: each names the agent's previous file, and the control plane rejects a
//! commit whose predecessor is not the agent's last committed file. So when a commit fails (for
//! instance a metadata-log write that failed and was rolled back by recovery), the commits queued
//! behind it are rejected instead of overtaking it. The committer then waits for its in-flight
//! commits to settle and for the control plane to have recovered, reads the agent's last
//! committed file, and continues the chain from there. The plane turns unavailable before it
//! answers any caller of a failed log write, so a chain broken by one always waits for recovery:
//! only recovery knows whether the failed write landed after all (an ambiguous PUT), and a tip
//! read before it could be stale. Files that come up while the control plane is still recovering fail at once with its
//! retriable `Unavailable`, as their commits would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::warn;
use weir_common::{failpoint, FileId};
use weir_control::{BatchOutcome, ControlError, ControlPlane, Entry, EntryResult, FileCommit};

use crate::batcher::TicketSlot;
use crate::metrics::{ProduceMetrics, Stage};
use crate::pipeline::{partition_outcome, PartitionOutcome, ProduceError};

pub(crate) struct UploadedFile {
    pub(crate) seq: u64,
    pub(crate) result: Result<Vec<usize>, String>,
    pub(crate) commit: FileCommit,
    pub(crate) tickets: Vec<TicketSlot>,
}

pub(crate) struct Committer {
    control: ControlPlane,
    sealed_count: Arc<AtomicU64>,
    uploads: mpsc::UnboundedReceiver<UploadedFile>,
    agent: String,
    metrics: ProduceMetrics,
}

/// Where the commit chain stands.
struct Chain {
    /// The file the next commit names as `previous`.
    tip: Option<FileId>,
    /// Commits enqueued whose result has not come back.
    in_flight: usize,
    /// A commit failed: hold new commits until in-flight ones settle, then re-read the tip.
    broken: bool,
}

impl Committer {
    pub(crate) fn new(
        control: ControlPlane,
        sealed_count: Arc<AtomicU64>,
        agent: String,
        metrics: ProduceMetrics,
    ) -> (Self, mpsc::UnboundedSender<UploadedFile>) {
        let (uploads_tx, uploads_rx) = mpsc::unbounded_channel();
        let committer = Self {
            control,
            sealed_count,
            uploads: uploads_rx,
            agent,
            metrics,
        };
        (committer, uploads_tx)
    }

    pub(crate) async fn run(mut self) {
        let (results_tx, mut results_rx) = mpsc::unbounded_channel::<bool>();
        let mut next_seq = 1u64;
        let mut waiting: BTreeMap<u64, UploadedFile> = BTreeMap::new();
        // Files with seq <= fail_through fail without committing (an earlier upload failed).
        let mut fail_through = 0u64;
        let mut chain = Chain {
            tip: None,
            in_flight: 0,
            broken: false,
        };
        let mut available = self.control.availability();
        loop {
            // Biased so the order of events depends only on the inputs (simulator replay).
            tokio::select! {
                biased;
                Some(committed) = results_rx.recv() => {
                    chain.in_flight -= 1;
                    if !committed {
                        chain.broken = true;
                    }
                }
                uploaded = self.uploads.recv() => {
                    let Some(uploaded) = uploaded else { break };
                    waiting.insert(uploaded.seq, uploaded);
                }
                // Wakes a broken chain when the control plane has recovered.
                Ok(()) = available.changed(), if chain.broken => {}
            }
            if chain.broken && chain.in_flight == 0 {
                if *available.borrow_and_update() {
                    chain.tip = self
                        .control
                        .read(|state| state.agent_tips.get(&self.agent).copied());
                    chain.broken = false;
                    warn!(agent = %self.agent, tip = ?chain.tip, "commit chain resumed after a failed commit");
                } else {
                    // Still recovering: what is waiting cannot commit yet; answer it now.
                    while let Some(file) = waiting.remove(&next_seq) {
                        next_seq += 1;
                        let error = match file.result {
                            Err(reason) if file.seq > fail_through => {
                                // As below: later files sealed so far must not overtake it.
                                fail_through = self.sealed_count.load(Ordering::SeqCst);
                                ProduceError::Storage(reason)
                            }
                            _ => ProduceError::Control(ControlError::Unavailable(
                                "the control plane is recovering its metadata log".into(),
                            )),
                        };
                        fail_tickets(file.tickets, error);
                    }
                }
            }
            while !chain.broken {
                let Some(file) = waiting.remove(&next_seq) else {
                    break;
                };
                next_seq += 1;
                if file.seq <= fail_through {
                    fail_tickets(file.tickets, ProduceError::EarlierFileFailed);
                    continue;
                }
                match file.result {
                    Ok(holders) => {
                        self.commit(file.commit, holders, file.tickets, &mut chain, &results_tx)
                            .await
                    }
                    Err(reason) => {
                        // Every file sealed so far is later than this one and not committed.
                        fail_through = self.sealed_count.load(Ordering::SeqCst);
                        warn!(
                            seq = file.seq,
                            fail_through, "upload failed; failing later uncommitted files"
                        );
                        fail_tickets(file.tickets, ProduceError::Storage(reason));
                    }
                }
            }
        }
    }

    async fn commit(
        &self,
        mut commit: FileCommit,
        holders: Vec<usize>,
        tickets: Vec<TicketSlot>,
        chain: &mut Chain,
        results: &mpsc::UnboundedSender<bool>,
    ) {
        failpoint::hit(failpoint::AFTER_UPLOAD_BEFORE_COMMIT);
        commit.buckets = holders.iter().map(|h| *h as u8).collect();
        commit.agent = self.agent.clone();
        commit.previous = chain.tip;
        let file_id = commit.file_id;
        let started = tokio::time::Instant::now();
        let pending = match self.control.enqueue(Entry::CommitFile(commit)).await {
            Ok(pending) => pending,
            Err(err) => return fail_tickets(tickets, ProduceError::Control(err)),
        };
        chain.tip = Some(file_id);
        chain.in_flight += 1;
        let results = results.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let committed = pending.await;
            metrics.observe(Stage::Commit, started);
            let committed = match committed {
                Ok(EntryResult::CommitFile(outcomes)) => {
                    failpoint::hit(failpoint::AFTER_COMMIT_BEFORE_ACK);
                    // A commit rejected whole did not become the chain's tip.
                    let chained = !outcomes.iter().any(|o| {
                        matches!(
                            o,
                            BatchOutcome::Rejected(
                                ControlError::CommitOutOfOrder { .. }
                                    | ControlError::FileTooOld { .. }
                            )
                        )
                    });
                    answer_tickets(tickets, &outcomes);
                    chained
                }
                Ok(other) => {
                    let error = ControlError::Unavailable(format!("unexpected {other:?}"));
                    fail_tickets(tickets, ProduceError::Control(error));
                    false
                }
                Err(err) => {
                    fail_tickets(tickets, ProduceError::Control(err));
                    false
                }
            };
            let _ = results.send(committed);
        });
    }
}

pub(crate) fn answer_tickets(tickets: Vec<TicketSlot>, outcomes: &[BatchOutcome]) {
    for slot in tickets {
        let result = slot
            .placements
            .iter()
            .map(
                |(_, first, count)| match outcomes.get(*first..*first + *count) {
                    Some(batch_outcomes) => partition_outcome(batch_outcomes),
                    None => {
                        PartitionOutcome::Failed(ProduceError::Storage("missing outcome".into()))
                    }
                },
            )
            .collect();
        let _ = slot.reply.send(result);
    }
}

pub(crate) fn fail_tickets(tickets: Vec<TicketSlot>, error: ProduceError) {
    for slot in tickets {
        let outcome = vec![PartitionOutcome::Failed(error.clone()); slot.placements.len()];
        let _ = slot.reply.send(outcome);
    }
}
