//! How a follower reaches the leader (RFC 0002 §3–4): its writes, forwarded on one ordered
//! stream; barriers; the leader's status; the leader's durable records.
//!
//! [`LocalLinks`] connects control planes in one process (tests, the simulator), with a switch
//! that cuts an agent off its peers; the gRPC transport carries the same calls between hosts.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio::sync::broadcast;

use crate::entry::{Entry, EntryResult};
use crate::plane::ControlPlane;
use crate::ControlError;

/// A durable log slot as the leader publishes it: every slot before it is durable too.
#[derive(Debug, Clone)]
pub struct DurableRecord {
    pub seq: u64,
    pub epoch: u64,
    pub entries: Arc<Vec<Entry>>,
}

/// What a leader says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderStatus {
    /// Its epoch.
    pub epoch: u64,
    /// It leads and can write its log now (not recovering, not cut off from its bucket).
    pub available: bool,
    /// Its last durable slot.
    pub durable: u64,
}

/// The durable result of a forwarded entry and its slot: the follower answers its caller once
/// its replica has applied that slot.
pub type Forwarded = BoxFuture<'static, Result<(EntryResult, u64), ControlError>>;

/// A connection to the leader.
#[async_trait]
pub trait LeaderConn: Send + Sync {
    /// Queues `entry` on this connection's stream: the leader sequences a connection's entries
    /// in the order they were sent. An error from the returned future leaves the entry's fate
    /// unknown (it may still become durable).
    async fn send(&self, entry: Entry) -> Result<Forwarded, ControlError>;
    /// The leader's durable position now: everything acknowledged before the call is at or
    /// below it.
    async fn barrier(&self) -> Result<u64, ControlError>;
    async fn status(&self) -> Result<LeaderStatus, ControlError>;
    /// Tells the leader this agent is alive (RFC 0002 §5).
    async fn heartbeat(&self, node_id: i32, incarnation: &str) -> Result<(), ControlError>;
    /// The slots the leader makes durable from now on, in order. The stream ends when the
    /// connection breaks or the subscriber falls too far behind; slots it skipped are read
    /// from the bucket.
    async fn records(&self) -> Result<BoxStream<'static, DurableRecord>, ControlError>;
}

/// How an agent connects to other agents' control planes.
pub trait ControlLink: Send + Sync + fmt::Debug {
    /// Connects to the control plane at `address` (from its epoch object or lease).
    fn connect(&self, address: &str) -> Result<Arc<dyn LeaderConn>, ControlError>;

    /// The cluster id the follower's replica holds (empty until the first `NewEpoch` is
    /// applied): a transport that introduces itself to peers by it takes it from here.
    fn cluster_id_known(&self, _cluster_id: &str) {}
}

/// Control planes of one process, by address.
#[derive(Debug, Clone, Default)]
pub struct LocalLinks {
    net: Arc<Mutex<LocalNet>>,
}

#[derive(Debug, Default)]
struct LocalNet {
    planes: HashMap<String, ControlPlane>,
    /// Agents cut off from every peer (both ways).
    cut: HashSet<String>,
    /// Agents gone (killed): they reach nobody either, whatever their tasks still try.
    gone: HashSet<String>,
    /// Agents that receive the leader's durable records this late (a slow network).
    record_delay: HashMap<String, Duration>,
}

impl LocalLinks {
    /// Makes the control plane at `address` reachable.
    pub fn register(&self, address: &str, plane: ControlPlane) {
        let mut net = self.lock();
        net.gone.remove(address);
        net.planes.insert(address.to_string(), plane);
    }

    /// The agent at `address` is gone (killed or shut down): nobody reaches it, and nothing
    /// it still runs reaches anybody.
    pub fn deregister(&self, address: &str) {
        let mut net = self.lock();
        net.planes.remove(address);
        net.gone.insert(address.to_string());
    }

    /// Cuts the agent at `address` off its peers, or heals it. Calls in flight fail as they
    /// finish; a forwarded entry may still become durable.
    pub fn set_cut(&self, address: &str, cut: bool) {
        let mut net = self.lock();
        if cut {
            net.cut.insert(address.to_string());
        } else {
            net.cut.remove(address);
        }
    }

    /// The leader's durable records reach the agent at `address` `delay` late from now on
    /// (zero: at once), so its replica trails the leader.
    pub fn delay_records(&self, address: &str, delay: Duration) {
        self.lock().record_delay.insert(address.to_string(), delay);
    }

    fn record_delay(&self, address: &str) -> Duration {
        self.lock()
            .record_delay
            .get(address)
            .copied()
            .unwrap_or_default()
    }

    /// The links as the agent at `address` uses them.
    pub fn link_for(&self, address: &str) -> Arc<dyn ControlLink> {
        Arc::new(LocalLink {
            links: self.clone(),
            me: address.to_string(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LocalNet> {
        self.net.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plane at `to` as `from` reaches it now.
    fn reach(&self, from: &str, to: &str) -> Result<ControlPlane, ControlError> {
        let net = self.lock();
        if net.cut.contains(from) || net.cut.contains(to) || net.gone.contains(from) {
            return Err(unreachable(to, "cut off"));
        }
        net.planes
            .get(to)
            .cloned()
            .ok_or_else(|| unreachable(to, "no such agent"))
    }
}

fn unreachable(address: &str, why: &str) -> ControlError {
    ControlError::Unavailable(format!("control plane at {address} unreachable: {why}"))
}

#[derive(Debug)]
struct LocalLink {
    links: LocalLinks,
    me: String,
}

impl ControlLink for LocalLink {
    fn connect(&self, address: &str) -> Result<Arc<dyn LeaderConn>, ControlError> {
        self.links.reach(&self.me, address)?;
        Ok(Arc::new(LocalConn {
            links: self.links.clone(),
            me: self.me.clone(),
            to: address.to_string(),
        }))
    }
}

struct LocalConn {
    links: LocalLinks,
    me: String,
    to: String,
}

#[async_trait]
impl LeaderConn for LocalConn {
    async fn send(&self, entry: Entry) -> Result<Forwarded, ControlError> {
        let plane = self.links.reach(&self.me, &self.to)?;
        let result = plane.accept_forwarded(entry).await?;
        let (links, me, to) = (self.links.clone(), self.me.clone(), self.to.clone());
        Ok(async move {
            let result = result.await;
            // The answer crosses the network too: cut meanwhile, it is lost.
            links.reach(&me, &to)?;
            result
        }
        .boxed())
    }

    async fn barrier(&self) -> Result<u64, ControlError> {
        self.links.reach(&self.me, &self.to)?.leader_barrier()
    }

    async fn status(&self) -> Result<LeaderStatus, ControlError> {
        Ok(self.links.reach(&self.me, &self.to)?.leader_status())
    }

    async fn heartbeat(&self, node_id: i32, incarnation: &str) -> Result<(), ControlError> {
        self.links
            .reach(&self.me, &self.to)?
            .heard_from(node_id, incarnation);
        Ok(())
    }

    async fn records(&self) -> Result<BoxStream<'static, DurableRecord>, ControlError> {
        let receiver = self.links.reach(&self.me, &self.to)?.durable_records();
        let (links, me, to) = (self.links.clone(), self.me.clone(), self.to.clone());
        Ok(futures::stream::unfold(receiver, move |mut receiver| {
            let (links, me, to) = (links.clone(), me.clone(), to.clone());
            async move {
                // Lagged or closed: the stream ends and the follower reads the bucket.
                let record = receiver.recv().await.ok()?;
                let delay = links.record_delay(&me);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                links.reach(&me, &to).ok()?;
                Some((record, receiver))
            }
        })
        .boxed())
    }
}

/// The leader's publisher of durable records (a bounded ring: subscribers that fall behind
/// lose their stream and catch up from the bucket).
pub(crate) fn durable_channel() -> broadcast::Sender<DurableRecord> {
    broadcast::channel(1024).0
}
