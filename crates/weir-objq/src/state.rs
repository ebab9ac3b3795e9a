//! The queue object's contents and the pure rules that change them.
//!
//! Leases are not in the object: a lease is a deadline on the broker's own monotonic clock,
//! which another host cannot read. The object says *who* holds a job; a new broker gives every
//! claimed job a fresh lease at its takeover (so a job is handed out again only after a whole
//! lease without heartbeats), and heartbeats move only the in-memory deadline, so they cost no
//! write.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The format of the queue object this build writes (and the only one it reads).
pub const FORMAT: u32 = 1;

/// The whole queue: what the object holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    pub format: u32,
    /// Counts writes, so two writes never store the same bytes (a writer that lost an answer
    /// recognises its own write by its bytes).
    pub write_seq: u64,
    pub broker: Option<BrokerInfo>,
    pub next_job: u64,
    /// In FIFO order.
    pub jobs: VecDeque<Job>,
}

impl Default for QueueState {
    fn default() -> QueueState {
        QueueState {
            format: FORMAT,
            write_seq: 0,
            broker: None,
            next_job: 1,
            jobs: VecDeque::new(),
        }
    }
}

/// The broker the object names: the sole writer until another takes over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    /// Who runs it (a member id).
    pub id: String,
    /// Where clients reach it.
    pub address: String,
    /// Raised by each takeover.
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: u64,
    pub payload: String,
    /// The worker holding it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// How many times it was handed out.
    #[serde(default)]
    pub attempts: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub worker: String,
}

/// A job as a worker gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimed {
    pub id: u64,
    pub payload: String,
    /// 1 the first time it is handed out; more means an earlier holder's lease ran out or it
    /// gave the job back.
    pub attempts: u32,
}

/// What a client asks the broker (its JSON crosses the network between agents).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Appends jobs at the tail, in order.
    Push { payloads: Vec<String> },
    /// Hands `worker` the first job nobody holds (or whose lease ran out).
    Claim { worker: String },
    /// Extends `worker`'s lease on `job`.
    Heartbeat { worker: String, job: u64 },
    /// `worker` finished `job`: it leaves the queue.
    Ack { worker: String, job: u64 },
    /// `worker` gives `job` back: it keeps its place and can be claimed again.
    Nack { worker: String, job: u64 },
}

/// The broker's answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Pushed(Vec<u64>),
    Claimed(Option<Claimed>),
    Done,
    /// The job is not held by this worker (its lease ran out and another took it, or it was
    /// acked already).
    NotHeld {
        job: u64,
    },
    /// The push would take the queue past its bound; nothing was added.
    Full {
        bound: usize,
    },
    /// This broker was replaced (or is stopping): read the object and ask the new one.
    NotBroker,
}

/// The in-memory deadlines of claimed jobs.
pub type Leases = HashMap<u64, Instant>;

impl QueueState {
    /// Applies `request` at `now`; returns the answer and whether the object changed.
    pub fn apply(
        &mut self,
        request: &Request,
        now: Instant,
        leases: &mut Leases,
        lease: Duration,
        max_jobs: usize,
    ) -> (Response, bool) {
        match request {
            Request::Push { payloads } => {
                if self.jobs.len() + payloads.len() > max_jobs {
                    return (Response::Full { bound: max_jobs }, false);
                }
                let mut ids = Vec::with_capacity(payloads.len());
                for payload in payloads {
                    let id = self.next_job;
                    self.next_job += 1;
                    self.jobs.push_back(Job {
                        id,
                        payload: payload.clone(),
                        claim: None,
                        attempts: 0,
                    });
                    ids.push(id);
                }
                let changed = !ids.is_empty();
                (Response::Pushed(ids), changed)
            }
            Request::Claim { worker } => {
                let free = self.jobs.iter_mut().find(|job| match &job.claim {
                    None => true,
                    Some(_) => leases.get(&job.id).is_none_or(|until| *until <= now),
                });
                let Some(job) = free else {
                    return (Response::Claimed(None), false);
                };
                job.claim = Some(Claim {
                    worker: worker.clone(),
                });
                job.attempts += 1;
                leases.insert(job.id, now + lease);
                let claimed = Claimed {
                    id: job.id,
                    payload: job.payload.clone(),
                    attempts: job.attempts,
                };
                (Response::Claimed(Some(claimed)), true)
            }
            Request::Heartbeat { worker, job } => {
                if self.held_by(*job, worker).is_none() {
                    return (Response::NotHeld { job: *job }, false);
                }
                leases.insert(*job, now + lease);
                (Response::Done, false)
            }
            Request::Ack { worker, job } => match self.held_by(*job, worker) {
                None => (Response::NotHeld { job: *job }, false),
                Some(index) => {
                    self.jobs.remove(index);
                    leases.remove(job);
                    (Response::Done, true)
                }
            },
            Request::Nack { worker, job } => match self.held_by(*job, worker) {
                None => (Response::NotHeld { job: *job }, false),
                Some(index) => {
                    self.jobs[index].claim = None;
                    leases.remove(job);
                    (Response::Done, true)
                }
            },
        }
    }

    /// The position of `job` if `worker` holds it.
    fn held_by(&self, job: u64, worker: &str) -> Option<usize> {
        self.jobs.iter().position(|j| {
            j.id == job && j.claim.as_ref().is_some_and(|claim| claim.worker == worker)
        })
    }

    /// Fresh leases for every claimed job, from `now` (a new broker's view).
    pub fn restart_leases(&self, now: Instant, lease: Duration) -> Leases {
        self.jobs
            .iter()
            .filter(|job| job.claim.is_some())
            .map(|job| (job.id, now + lease))
            .collect()
    }

    pub fn encode(&self) -> bytes::Bytes {
        bytes::Bytes::from(serde_json::to_vec(self).expect("queue state serialises"))
    }

    pub fn decode(bytes: &[u8]) -> Result<QueueState, crate::QueueError> {
        let state: QueueState = serde_json::from_slice(bytes)
            .map_err(|e| crate::QueueError::Corrupt(format!("queue object: {e}")))?;
        if state.format != FORMAT {
            return Err(crate::QueueError::Corrupt(format!(
                "queue object format {} (this build reads {FORMAT})",
                state.format
            )));
        }
        Ok(state)
    }
}
