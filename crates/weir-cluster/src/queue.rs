//! Job queues across agents (RFC 0005 §5, RFC 0002 §8): [`QueueNetwork`] is `weir-objq`'s
//! [`Network`] over the control service, so the one broker of a queue (the compaction queue)
//! serves the members of every agent.
//!
//! A broker on this agent listens at `{control address}/{queue}`. A call to an address of this
//! agent goes to the broker's inbox directly; any other goes to that agent's control service as
//! a `Queue` call, which hands it to the broker listening there. A call that finds no broker, or
//! no answer within the link's timeout, is [`Unreachable`]: the member reads the queue object
//! again and, after `broker_timeout`, takes the queue over, exactly as in one process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tracing::debug;
use weir_objq::broker::Envelope;
use weir_objq::{Network, Request, Response, Unreachable};

use crate::client::GrpcConn;
use crate::proto::{QueueAnswer, QueueCall};
use crate::GrpcLink;

/// The most peer connections kept; past it the cache starts again (peers are a handful).
const MAX_PEERS: usize = 64;

/// The queues' network of one agent. Cheap to share: hand one `Arc` to the queue's members
/// and to [`crate::serve`].
pub struct QueueNetwork {
    /// This agent's control address (`host:port`, as its peers reach it).
    local: String,
    link: GrpcLink,
    /// Brokers listening on this agent, by queue name.
    inboxes: Mutex<HashMap<String, mpsc::Sender<Envelope>>>,
    peers: Mutex<HashMap<String, Arc<GrpcConn>>>,
    inbox: usize,
}

impl QueueNetwork {
    /// The network of the agent whose control service other agents reach at `local`; calls to
    /// peers go through `link` (its cluster id and timeout). Give it the queue's broker timeout:
    /// a call that times out is sent again, and a push answered late would be pushed twice.
    pub fn new(local: &str, link: GrpcLink, inbox: usize) -> Arc<QueueNetwork> {
        Arc::new(QueueNetwork {
            local: local.to_string(),
            link,
            inboxes: Mutex::default(),
            peers: Mutex::default(),
            inbox: inbox.max(1),
        })
    }

    /// Where this agent's broker of `queue` listens.
    pub fn address(&self, queue: &str) -> String {
        format!("{}/{queue}", self.local)
    }

    fn inboxes(&self) -> MutexGuard<'_, HashMap<String, mpsc::Sender<Envelope>>> {
        self.inboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `request` to this agent's broker of `queue` and waits for its answer.
    pub(crate) async fn deliver(&self, queue: &str, request: Request) -> Result<Response, String> {
        let inbox = self
            .inboxes()
            .get(queue)
            .cloned()
            .ok_or_else(|| format!("no broker of queue {queue:?} runs here"))?;
        let (reply, answer) = oneshot::channel();
        inbox
            .send((request, reply))
            .await
            .map_err(|_| "the broker stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the broker stopped before answering".to_string())
    }

    fn peer(&self, address: &str) -> Result<Arc<GrpcConn>, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = peers.get(address) {
            return Ok(conn.clone());
        }
        if peers.len() >= MAX_PEERS {
            peers.clear();
        }
        let conn = Arc::new(self.link.conn(address).map_err(|e| e.to_string())?);
        peers.insert(address.to_string(), conn.clone());
        Ok(conn)
    }
}

impl std::fmt::Debug for QueueNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueNetwork")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// `{host:port}/{queue}` → its two parts.
fn split(address: &str) -> Option<(&str, &str)> {
    address
        .split_once('/')
        .filter(|(peer, queue)| !peer.is_empty() && !queue.is_empty())
}

#[async_trait]
impl Network for QueueNetwork {
    async fn call(&self, address: &str, request: Request) -> Result<Response, Unreachable> {
        let unreachable = |reason: String| Unreachable {
            address: address.to_string(),
            reason,
        };
        let (peer, queue) =
            split(address).ok_or_else(|| unreachable("not a cluster queue address".to_string()))?;
        if peer == self.local {
            return self.deliver(queue, request).await.map_err(unreachable);
        }
        let call = QueueCall {
            queue: queue.to_string(),
            request: serde_json::to_vec(&request).expect("queue requests serialise"),
        };
        let conn = self.peer(peer).map_err(unreachable)?;
        let answer: QueueAnswer = conn
            .unary("Queue", call)
            .await
            .map_err(|err| unreachable(err.to_string()))?;
        serde_json::from_slice(&answer.response)
            .map_err(|err| unreachable(format!("undecodable answer: {err}")))
    }

    fn listen(&self, address: &str) -> mpsc::Receiver<Envelope> {
        let (tx, rx) = mpsc::channel(self.inbox);
        match split(address) {
            Some((_, queue)) => {
                self.inboxes().insert(queue.to_string(), tx);
            }
            // Nothing can reach it: the broker's first write names an address no call finds,
            // and members take the queue over after their broker timeout.
            None => debug!(address, "a queue broker listens at an address of no agent"),
        }
        rx
    }

    fn close(&self, address: &str) {
        if let Some((_, queue)) = split(address) {
            self.inboxes().remove(queue);
        }
    }
}

/// The service's side of a `Queue` call.
pub(crate) async fn serve_call(
    queues: Option<&QueueNetwork>,
    call: QueueCall,
) -> Result<QueueAnswer, Status> {
    let queues = queues.ok_or_else(|| Status::unavailable("this agent runs no job queues"))?;
    let request: Request = serde_json::from_slice(&call.request)
        .map_err(|err| Status::invalid_argument(format!("not a queue request: {err}")))?;
    let response = queues
        .deliver(&call.queue, request)
        .await
        .map_err(Status::unavailable)?;
    Ok(QueueAnswer {
        response: serde_json::to_vec(&response).expect("queue responses serialise"),
    })
}
