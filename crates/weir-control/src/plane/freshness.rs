//! How stale a follower's reads may be (RFC 0002 §3).
//!
//! A follower serves reads from its replica. Cut off from its leader and from the bucket, the
//! replica stops moving while the log goes on, and the leader's deleter removes files `gc.grace`
//! after the log released them: a fetch planned from a replica that old may name a file that is
//! gone. So a follower serves reads only while it knows its replica held the whole durable log
//! at most `max_read_staleness` ago: it asks the leader its durable position on every tick and,
//! once its replica holds that slot, records when it asked; when no available leader answers,
//! the bucket may confirm it instead (`Replica::holds_whole_log`). A fetch plan made then names
//! only files the log still held within `max_read_staleness` of planning, and is read within
//! plan TTL + read deadline of that, which the deleter's grace exceeds.
//!
//! A leader's state is the log (a leader deposed while cut off serves its last view until it
//! learns of the later epoch; docs/reliability.md). A control plane outside a cluster is always
//! fresh.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::leadership::MonotonicClock;

#[derive(Debug)]
pub(crate) struct Freshness {
    /// `None`: not a cluster member.
    member: Option<(Arc<dyn MonotonicClock>, Duration)>,
    state: Mutex<FollowerView>,
}

#[derive(Debug, Default)]
struct FollowerView {
    /// Leaders are fresh; a member starting or following is not until it confirms.
    leading: bool,
    /// When the replica was last known to hold the whole durable log, on the member's clock.
    confirmed_at: Option<Instant>,
}

impl Freshness {
    pub(crate) fn new(member: Option<(Arc<dyn MonotonicClock>, Duration)>) -> Freshness {
        Freshness {
            member,
            state: Mutex::default(),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, FollowerView> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The member follows from now on, with nothing confirmed yet.
    pub(crate) fn follow(&self) {
        *self.view() = FollowerView::default();
    }

    /// The member leads from now on.
    pub(crate) fn lead(&self) {
        *self.view() = FollowerView {
            leading: true,
            confirmed_at: None,
        };
    }

    /// The replica held every slot the leader called durable when it was asked at `asked`.
    pub(crate) fn confirmed(&self, asked: Instant) {
        let mut view = self.view();
        if !view.leading && view.confirmed_at.is_none_or(|at| at < asked) {
            view.confirmed_at = Some(asked);
        }
    }

    /// Whether reads may be served from the readable state now.
    pub(crate) fn fresh(&self) -> bool {
        let Some((clock, bound)) = &self.member else {
            return true;
        };
        let view = self.view();
        view.leading
            || view
                .confirmed_at
                .is_some_and(|at| clock.now().saturating_duration_since(at) <= *bound)
    }
}
