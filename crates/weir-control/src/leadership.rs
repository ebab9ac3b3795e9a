//! The leader's lease (RFC 0002 §2): when a follower may take over.
//!
//! Epochs decide who leads, and create-only log slots fence a deposed leader (CTL-1); nothing
//! here is needed for safety. The lease only tells followers when the leader has stopped:
//! `meta/lease/{epoch}` is written (plain PUT) by that epoch's leader alone, a counter it bumps
//! every renewal. A follower watches the counter on its own monotonic clock and may take over
//! only when it has not moved for the lease timeout, no higher epoch exists and the leader does
//! not answer ([`may_take_over`]). Clocks are never compared across hosts.
//!
//! Not yet used by the agent: the cluster (issue 14) runs the keeper on the leader and the
//! watch on followers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::log::{get_optional, LogError};

/// A host's monotonic clock, on which leases are measured (never compared across hosts). The
/// simulator runs members' clocks fast or slow.
pub trait MonotonicClock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Instant;
    /// The runtime's time that passes while this clock advances `by`: a timer of a fast clock
    /// fires early.
    fn real(&self, by: Duration) -> Duration {
        by
    }
}

/// The runtime's clock (Tokio's, so paused test clocks apply).
#[derive(Debug, Clone, Copy, Default)]
pub struct RuntimeClock;

impl MonotonicClock for RuntimeClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// Format of the lease object.
const LEASE_FORMAT: u32 = 1;

/// Key of epoch `epoch`'s lease: `meta/lease/{epoch:020}`.
pub fn lease_key(epoch: u64) -> Path {
    Path::from_iter(["meta", "lease", &format!("{epoch:020}")])
}

/// What a lease object holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub format: u32,
    pub epoch: u64,
    /// The leader: its node id, the incarnation (one per process start) and control address.
    pub node_id: i32,
    pub incarnation: String,
    pub address: String,
    /// Bumped at every renewal.
    pub counter: u64,
    /// Written by a leader that shut down cleanly: take over at once.
    #[serde(default)]
    pub released: bool,
}

/// Reads epoch `epoch`'s lease; `None` when there is none (not written yet, or collected).
pub async fn read_lease(store: &dyn ObjectStore, epoch: u64) -> Result<Option<Lease>, LogError> {
    let Some(bytes) = get_optional(store, &lease_key(epoch)).await? else {
        return Ok(None);
    };
    // A lease this build cannot read (a newer format, a torn write on a store without atomic
    // PUTs) says nothing: as if absent, so the follower relies on the timeout and the epochs.
    Ok(serde_json::from_slice::<Lease>(&bytes)
        .ok()
        .filter(|lease| lease.format == LEASE_FORMAT && lease.epoch == epoch))
}

/// The leader's side: renews its epoch's lease.
#[derive(Debug)]
pub struct LeaseKeeper {
    store: Arc<dyn ObjectStore>,
    lease: Lease,
}

impl LeaseKeeper {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        epoch: u64,
        node_id: i32,
        incarnation: &str,
        address: &str,
    ) -> LeaseKeeper {
        LeaseKeeper {
            store,
            lease: Lease {
                format: LEASE_FORMAT,
                epoch,
                node_id,
                incarnation: incarnation.to_string(),
                address: address.to_string(),
                counter: 0,
                released: false,
            },
        }
    }

    /// Bumps the counter and writes the lease.
    pub async fn renew(&mut self) -> Result<(), LogError> {
        self.lease.counter += 1;
        self.write().await
    }

    /// Writes the lease as released (a clean shutdown): followers take over without waiting.
    pub async fn release(&mut self) -> Result<(), LogError> {
        self.lease.counter += 1;
        self.lease.released = true;
        self.write().await
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn write(&self) -> Result<(), LogError> {
        let key = lease_key(self.lease.epoch);
        let body = serde_json::to_vec(&self.lease).expect("a lease serialises");
        self.store
            .put(&key, PutPayload::from(Bytes::from(body)))
            .await
            .map(drop)
            .map_err(|source| LogError::Store {
                key: key.to_string(),
                source,
            })
    }
}

/// What a follower's reads of the lease say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// No lease for the epoch (yet): nothing to go by but the timeout since the watch began.
    Absent { since: Duration },
    /// The counter moved within the timeout: the leader is alive.
    Held { node_id: i32, address: String },
    /// The counter has not moved for the timeout (on this host's monotonic clock).
    Stale { node_id: i32, incarnation: String },
    /// The leader shut down cleanly.
    Released,
}

/// A follower's watch on one epoch's lease.
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    timeout: Duration,
    epoch: u64,
    started: Instant,
    /// The last counter read and when it was first read with that value.
    seen: Option<(u64, Instant)>,
}

impl LeaseWatch {
    /// Watches epoch `epoch`'s lease from `now`.
    pub fn new(epoch: u64, timeout: Duration, now: Instant) -> LeaseWatch {
        LeaseWatch {
            timeout,
            epoch,
            started: now,
            seen: None,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Notes a read of the lease sent at `asked` and answered at `answered`, and says what it
    /// means. A counter counts as seen from when its first read was answered, and as unmoved
    /// until the latest read was sent: the store may have answered from any moment in between,
    /// so only that span is known to be quiet.
    pub fn observe(
        &mut self,
        lease: Option<&Lease>,
        asked: Instant,
        answered: Instant,
    ) -> LeaseState {
        let Some(lease) = lease.filter(|l| l.epoch == self.epoch) else {
            return LeaseState::Absent {
                since: asked.saturating_duration_since(self.started),
            };
        };
        if lease.released {
            return LeaseState::Released;
        }
        let since = match self.seen {
            Some((counter, since)) if counter == lease.counter => since,
            _ => {
                self.seen = Some((lease.counter, answered));
                answered
            }
        };
        if asked.saturating_duration_since(since) >= self.timeout {
            LeaseState::Stale {
                node_id: lease.node_id,
                incarnation: lease.incarnation.clone(),
            }
        } else {
            LeaseState::Held {
                node_id: lease.node_id,
                address: lease.address.clone(),
            }
        }
    }
}

/// Who is asking to take over.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub node_id: i32,
    pub incarnation: &'a str,
}

/// Whether a follower may claim the epoch after `watched`: the lease says the leader stopped
/// (stale for the timeout, released, or never written within the timeout), no epoch above the
/// watched one exists (`highest_epoch` from a listing of `meta/epoch/`), and the leader does not
/// answer over the network. A stale lease of the candidate's own node id (its previous
/// incarnation) needs no network check: that process is gone.
pub fn may_take_over(
    state: &LeaseState,
    watched: &LeaseWatch,
    highest_epoch: u64,
    leader_answers: bool,
    me: Candidate<'_>,
) -> bool {
    if highest_epoch > watched.epoch {
        return false;
    }
    match state {
        LeaseState::Held { .. } => false,
        LeaseState::Released => true,
        LeaseState::Absent { since } => *since >= watched.timeout && !leader_answers,
        LeaseState::Stale {
            node_id,
            incarnation,
        } => {
            let my_previous_self = *node_id == me.node_id && incarnation != me.incarnation;
            my_previous_self || !leader_answers
        }
    }
}

/// What a starting agent does, from two reads of the highest epoch's lease (`highest`, 0 when
/// no epoch was ever claimed) taken a while apart (RFC 0002 §2 "Start").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtStart {
    /// The counter moved: a live leader holds it.
    Follow,
    /// A new cluster, a released lease, or one that did not move and names this node (its
    /// previous incarnation, killed): recover and lead, as a single agent always did. A lease
    /// of another node that did not move is not enough: the watch decides after the timeout.
    Lead,
    /// A lease of another node that did not move between the reads, or none for an epoch that
    /// exists (its leader may still be recovering, or the log is from before clusters): watch it
    /// for the timeout.
    Watch,
    /// The lease moved and names this node id under another incarnation: another live agent
    /// has this node id.
    DuplicateNodeId { address: String },
}

pub fn at_start(
    highest: u64,
    first: Option<&Lease>,
    second: Option<&Lease>,
    me: Candidate<'_>,
) -> AtStart {
    let Some(second) = second else {
        return if highest == 0 {
            AtStart::Lead
        } else {
            AtStart::Watch
        };
    };
    if second.released {
        return AtStart::Lead;
    }
    let moved = first.is_none_or(|first| first.counter != second.counter);
    let mine = second.node_id == me.node_id;
    match (moved, mine) {
        (true, true) if second.incarnation != me.incarnation => AtStart::DuplicateNodeId {
            address: second.address.clone(),
        },
        (true, _) => AtStart::Follow,
        (false, true) => AtStart::Lead,
        (false, false) => AtStart::Watch,
    }
}

#[cfg(test)]
mod tests;
