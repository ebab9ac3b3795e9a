//! `weir-objq`: a FIFO, at-least-once job queue whose whole state is one object, written only
//! by compare-and-set (RFC 0005 §5).
//!
//! - **One writer.** A broker ([`broker`]) holds the state and is the object's only writer. It
//!   group-commits: one compare-and-set write in flight, carrying every request that arrived
//!   while the previous one was in flight, and answers each request only after the write that
//!   carries it succeeded.
//! - **Finding the broker.** The object names the broker's address; a [`Member`] reads it and
//!   sends its requests there through a [`Network`] ([`LocalNetwork`]: channels in one process;
//!   the cluster's control service is the other implementation, with the multi-agent issue).
//! - **Takeover.** A member whose requests fail for [`Settings::broker_timeout`] on its own clock
//!   (or that finds no broker named) starts a broker itself, which writes the object with itself
//!   as broker and the epoch + 1 by compare-and-set on the version the member read. Of racing
//!   members one wins; the others' writes fail and they talk to the winner. The replaced broker's
//!   next write fails: it answers `NotBroker` and stops, and clients resend to the new one — so a
//!   push answered by no one may land twice (at-least-once).
//! - **Leases.** A claimed job has a lease on the broker's monotonic clock; heartbeats extend it
//!   without a write. A new broker restarts every claimed job's lease at takeover, so a job is
//!   handed out again only after a whole lease without heartbeats.
//! - **Bounded.** Acked jobs leave the object; a push past [`Settings::max_jobs`] is refused.
//! - **Compare-and-set everywhere** ([`cas`]): `object_store`'s conditional puts, and on a local
//!   directory a `flock`ed counter file ([`cas::local::LocalCas`]).

pub mod broker;
pub mod cas;
pub mod state;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use crate::broker::{Envelope, Expected};
use crate::cas::{CasError, CasObject};
use crate::state::BrokerInfo;
pub use crate::state::{Claimed, QueueState, Request, Response};

/// How the queue behaves (RFC 0005 §5 gives the defaults' reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// A claimed job without heartbeats for this long is handed out again.
    pub lease: Duration,
    /// A member whose requests have failed this long takes over.
    pub broker_timeout: Duration,
    /// The most jobs the queue holds (pushes past it are refused).
    pub max_jobs: usize,
    /// Pause between retries (of a failed write, of a failed call).
    pub write_retry: Duration,
    /// Requests waiting at a broker before senders wait.
    pub inbox: usize,
    /// How long a member trusts the broker it last read from the object before reading again.
    pub recheck: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            lease: Duration::from_secs(60),
            broker_timeout: Duration::from_secs(10),
            max_jobs: 256,
            write_retry: Duration::from_millis(200),
            inbox: 1024,
            recheck: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue object: {0}")]
    Cas(#[from] CasError),
    #[error("{0}")]
    Corrupt(String),
    /// Another member took the object over first.
    #[error("another member took the queue over first")]
    LostTakeover,
    /// The push would exceed the queue's bound.
    #[error("the queue is full ({bound} jobs)")]
    Full { bound: usize },
    /// The job is not held by this worker.
    #[error("job {job} is not held by this worker")]
    NotHeld { job: u64 },
    /// The broker answered something the request cannot get (a bug).
    #[error("unexpected answer {0:?}")]
    Unexpected(Response),
}

/// Why a request did not reach a broker.
#[derive(Debug, thiserror::Error)]
#[error("broker at {address} unreachable: {reason}")]
pub struct Unreachable {
    pub address: String,
    pub reason: String,
}

/// How members reach brokers and brokers receive requests.
#[async_trait]
pub trait Network: Send + Sync + std::fmt::Debug + 'static {
    /// Sends `request` to the broker at `address` and waits for its answer.
    async fn call(&self, address: &str, request: Request) -> Result<Response, Unreachable>;
    /// Starts receiving the requests sent to `address`.
    fn listen(&self, address: &str) -> mpsc::Receiver<Envelope>;
    /// Stops receiving at `address`: calls to it fail from now on.
    fn close(&self, address: &str);
}

/// Brokers and members in one process, connected by channels.
#[derive(Debug, Default)]
pub struct LocalNetwork {
    inboxes: Mutex<HashMap<String, mpsc::Sender<Envelope>>>,
    inbox: usize,
}

impl LocalNetwork {
    pub fn new(settings: &Settings) -> Arc<LocalNetwork> {
        Arc::new(LocalNetwork {
            inboxes: Mutex::new(HashMap::new()),
            inbox: settings.inbox.max(1),
        })
    }

    fn inboxes(&self) -> MutexGuard<'_, HashMap<String, mpsc::Sender<Envelope>>> {
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Network for LocalNetwork {
    async fn call(&self, address: &str, request: Request) -> Result<Response, Unreachable> {
        let unreachable = |reason: &str| Unreachable {
            address: address.to_string(),
            reason: reason.to_string(),
        };
        let inbox = self
            .inboxes()
            .get(address)
            .cloned()
            .ok_or_else(|| unreachable("nothing listens there"))?;
        let (reply, answer) = oneshot::channel();
        inbox
            .send((request, reply))
            .await
            .map_err(|_| unreachable("the broker stopped"))?;
        answer
            .await
            .map_err(|_| unreachable("the broker stopped before answering"))
    }

    fn listen(&self, address: &str) -> mpsc::Receiver<Envelope> {
        let (tx, rx) = mpsc::channel(self.inbox);
        self.inboxes().insert(address.to_string(), tx);
        rx
    }

    fn close(&self, address: &str) {
        self.inboxes().remove(address);
    }
}

/// One participant: pushes and works jobs, and runs the broker when it has to.
#[derive(Debug)]
pub struct Member {
    id: String,
    address: String,
    cas: Arc<dyn CasObject>,
    network: Arc<dyn Network>,
    settings: Settings,
    broker: Mutex<Option<JoinHandle<()>>>,
    /// The broker the object named when last read, and when: asked first, so a healthy queue
    /// costs one read of the object per [`Settings::recheck`] instead of one per request. (A
    /// broker replaced while alive answers requests that change nothing from its memory until it
    /// next writes; the re-read bounds how long a member keeps asking it.)
    known: Mutex<Option<(BrokerInfo, Instant)>>,
}

impl Member {
    /// A member `id` whose broker (when it runs one) listens at `address`.
    pub fn new(
        id: &str,
        address: &str,
        cas: Arc<dyn CasObject>,
        network: Arc<dyn Network>,
        settings: Settings,
    ) -> Member {
        Member {
            id: id.to_string(),
            address: address.to_string(),
            cas,
            network,
            settings,
            broker: Mutex::new(None),
            known: Mutex::new(None),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Appends `payloads` as jobs, in order; returns their ids.
    pub async fn push(&self, payloads: Vec<String>) -> Result<Vec<u64>, QueueError> {
        match self.call(Request::Push { payloads }).await? {
            Response::Pushed(ids) => Ok(ids),
            other => Err(answer_error(other)),
        }
    }

    /// The first job nobody holds, now held by `worker`; `None` when there is none.
    pub async fn claim(&self, worker: &str) -> Result<Option<Claimed>, QueueError> {
        let request = Request::Claim {
            worker: worker.to_string(),
        };
        match self.call(request).await? {
            Response::Claimed(job) => Ok(job),
            other => Err(answer_error(other)),
        }
    }

    pub async fn heartbeat(&self, worker: &str, job: u64) -> Result<(), QueueError> {
        let request = Request::Heartbeat {
            worker: worker.to_string(),
            job,
        };
        self.done(request).await
    }

    pub async fn ack(&self, worker: &str, job: u64) -> Result<(), QueueError> {
        let request = Request::Ack {
            worker: worker.to_string(),
            job,
        };
        self.done(request).await
    }

    pub async fn nack(&self, worker: &str, job: u64) -> Result<(), QueueError> {
        let request = Request::Nack {
            worker: worker.to_string(),
            job,
        };
        self.done(request).await
    }

    /// The queue as the object holds it now (not through the broker).
    pub async fn snapshot(&self) -> Result<QueueState, QueueError> {
        Ok(match self.cas.read().await? {
            None => QueueState::default(),
            Some((bytes, _)) => QueueState::decode(&bytes)?,
        })
    }

    /// Stops this member's broker, if it runs one (as if its process died: requests waiting
    /// there get no answer).
    pub fn stop_broker(&self) {
        self.network.close(&self.address);
        if let Some(task) = self.broker_task().take() {
            task.abort();
        }
    }

    /// Whether this member's broker is running.
    pub fn runs_broker(&self) -> bool {
        self.broker_task()
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    fn known_broker(&self) -> MutexGuard<'_, Option<(BrokerInfo, Instant)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn broker_task(&self) -> MutexGuard<'_, Option<JoinHandle<()>>> {
        self.broker.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn done(&self, request: Request) -> Result<(), QueueError> {
        match self.call(request).await? {
            Response::Done => Ok(()),
            other => Err(answer_error(other)),
        }
    }

    /// Sends `request` to the broker the object names, taking over when there is none or it has
    /// not answered for `broker_timeout`.
    async fn call(&self, request: Request) -> Result<Response, QueueError> {
        let known = self
            .known_broker()
            .clone()
            .filter(|(_, read)| read.elapsed() < self.settings.recheck);
        if let Some((known, _)) = known {
            match self.ask(&known.address, &request).await {
                Ok(Response::NotBroker) | Err(_) => {}
                Ok(answer) => return Ok(answer),
            }
        }
        *self.known_broker() = None;
        let mut failing_since: Option<Instant> = None;
        loop {
            let (broker, version) = match self.cas.read().await? {
                None => (None, None),
                Some((bytes, version)) => (QueueState::decode(&bytes)?.broker, Some(version)),
            };
            if let Some(named) = &broker {
                match self.ask(&named.address, &request).await {
                    Ok(Response::NotBroker) => {
                        // Replaced: the object names the new one (or will shortly).
                        failing_since = None;
                    }
                    Ok(answer) => {
                        *self.known_broker() = Some((named.clone(), Instant::now()));
                        return Ok(answer);
                    }
                    Err(unreachable) => {
                        debug!(member = %self.id, %unreachable, "queue broker did not answer");
                        failing_since.get_or_insert_with(Instant::now);
                    }
                }
            }
            let timed_out =
                failing_since.is_some_and(|since| since.elapsed() >= self.settings.broker_timeout);
            if broker.is_none() || timed_out {
                let expected = Expected { version, broker };
                match self.start_broker(&expected).await {
                    Ok(()) | Err(QueueError::LostTakeover) => {
                        failing_since = None;
                        continue;
                    }
                    Err(other) => return Err(other),
                }
            }
            tokio::time::sleep(self.settings.write_retry).await;
        }
    }

    /// Sends `request` to the broker at `address`; a broker that has not answered within
    /// `broker_timeout` (its process hangs or died mid-request) counts as unreachable.
    async fn ask(&self, address: &str, request: &Request) -> Result<Response, Unreachable> {
        match tokio::time::timeout(
            self.settings.broker_timeout,
            self.network.call(address, request.clone()),
        )
        .await
        {
            Ok(answer) => answer,
            Err(_) => Err(Unreachable {
                address: address.to_string(),
                reason: format!("no answer within {:?}", self.settings.broker_timeout),
            }),
        }
    }

    /// Takes the object over and runs a broker here.
    async fn start_broker(&self, expected: &Expected) -> Result<(), QueueError> {
        self.stop_broker();
        let inbox = self.network.listen(&self.address);
        let me = BrokerInfo {
            id: self.id.clone(),
            address: self.address.clone(),
            epoch: 0,
        };
        match broker::take_over(self.cas.as_ref(), &me, expected).await {
            Ok((state, version)) => {
                let task = tokio::spawn(broker::run(
                    self.cas.clone(),
                    self.settings,
                    state,
                    version,
                    inbox,
                ));
                *self.broker_task() = Some(task);
                Ok(())
            }
            Err(err) => {
                self.network.close(&self.address);
                Err(err)
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop_broker();
    }
}

fn answer_error(answer: Response) -> QueueError {
    match answer {
        Response::Full { bound } => QueueError::Full { bound },
        Response::NotHeld { job } => QueueError::NotHeld { job },
        other => QueueError::Unexpected(other),
    }
}
