//! The committer: receives upload results in any order and commits files to the control plane
//! strictly in seal order (ORD-2), pipelined: a commit is enqueued as soon as every earlier file
//! is enqueued, and results are awaited concurrently. Outcomes fan out to each file's tickets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::warn;
use weir_control::{BatchOutcome, ControlError, ControlPlane, Entry, EntryResult, FileCommit};

use crate::batcher::TicketSlot;
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
}

impl Committer {
    pub(crate) fn new(
        control: ControlPlane,
        sealed_count: Arc<AtomicU64>,
    ) -> (Self, mpsc::UnboundedSender<UploadedFile>) {
        let (uploads_tx, uploads_rx) = mpsc::unbounded_channel();
        let committer = Self {
            control,
            sealed_count,
            uploads: uploads_rx,
        };
        (committer, uploads_tx)
    }

    pub(crate) async fn run(mut self) {
        let mut next_seq = 1u64;
        let mut waiting: BTreeMap<u64, UploadedFile> = BTreeMap::new();
        // Files with seq <= fail_through fail without committing (an earlier file failed).
        let mut fail_through = 0u64;
        while let Some(uploaded) = self.uploads.recv().await {
            waiting.insert(uploaded.seq, uploaded);
            while let Some(file) = waiting.remove(&next_seq) {
                next_seq += 1;
                if file.seq <= fail_through {
                    fail_tickets(file.tickets, ProduceError::EarlierFileFailed);
                    continue;
                }
                match file.result {
                    Ok(holders) => self.commit(file.commit, holders, file.tickets).await,
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

    async fn commit(&self, mut commit: FileCommit, holders: Vec<usize>, tickets: Vec<TicketSlot>) {
        commit.buckets = holders.iter().map(|h| *h as u8).collect();
        let pending = match self.control.enqueue(Entry::CommitFile(commit)).await {
            Ok(pending) => pending,
            Err(err) => return fail_tickets(tickets, ProduceError::Control(err)),
        };
        tokio::spawn(async move {
            match pending.await {
                Ok(EntryResult::CommitFile(outcomes)) => answer_tickets(tickets, &outcomes),
                Ok(other) => fail_tickets(
                    tickets,
                    ProduceError::Control(ControlError::Unavailable(format!(
                        "unexpected {other:?}"
                    ))),
                ),
                Err(err) => fail_tickets(tickets, ProduceError::Control(err)),
            }
        });
    }
}

fn answer_tickets(tickets: Vec<TicketSlot>, outcomes: &[BatchOutcome]) {
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

fn fail_tickets(tickets: Vec<TicketSlot>, error: ProduceError) {
    for slot in tickets {
        let outcome = vec![PartitionOutcome::Failed(error.clone()); slot.placements.len()];
        let _ = slot.reply.send(outcome);
    }
}
