//! The async coordinator: wraps [`CoordinatorCore`] in a mutex, turns parked JoinGroup and
//! SyncGroup requests into oneshot channels, and runs a timer task that calls `tick` at the
//! core's next deadline (or when a request may have moved it earlier).
//!
//! A client that disconnects while parked just drops its receiver; the member stays until it
//! rejoins, leaves, or its session or the rebalance times out, as in Kafka.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use weir_common::Clock;

use crate::core::{CoordinatorCore, Effects, GroupSettings};
use crate::types::{
    CommitIdentity, GroupDescription, GroupListing, HeartbeatRequest, JoinRequest, JoinResponse,
    LeavingMember, SyncRequest, SyncResponse, Token,
};
use crate::GroupError;

/// Longest the timer sleeps without looking at the clock (the injected clock may jump).
const MAX_TIMER_SLEEP: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Inner {
    core: CoordinatorCore,
    next_token: Token,
    joins: HashMap<Token, oneshot::Sender<JoinResponse>>,
    syncs: HashMap<Token, oneshot::Sender<SyncResponse>>,
}

impl Inner {
    fn deliver(&mut self, effects: Effects) {
        for (token, response) in effects.joins {
            if let Some(sender) = self.joins.remove(&token) {
                let _ = sender.send(response);
            }
        }
        for (token, response) in effects.syncs {
            if let Some(sender) = self.syncs.remove(&token) {
                let _ = sender.send(response);
            }
        }
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        self.next_token
    }
}

/// Handle to the coordinator; cheap to clone.
#[derive(Debug, Clone)]
pub struct GroupCoordinator {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
    wake: Arc<Notify>,
}

impl GroupCoordinator {
    /// Creates the coordinator and spawns its timer task on the current tokio runtime.
    pub fn start(settings: GroupSettings, clock: Arc<dyn Clock>, seed: u64) -> Self {
        let coordinator = Self {
            inner: Arc::new(Mutex::new(Inner {
                core: CoordinatorCore::new(settings, clock.clone(), seed),
                next_token: 0,
                joins: HashMap::new(),
                syncs: HashMap::new(),
            })),
            clock,
            wake: Arc::new(Notify::new()),
        };
        tokio::spawn(coordinator.clone().run_timer());
        coordinator
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn join(&self, request: JoinRequest) -> JoinResponse {
        let member_id = request.member_id.clone();
        let (sender, receiver) = oneshot::channel();
        {
            let mut inner = self.lock();
            let token = inner.token();
            inner.joins.insert(token, sender);
            let effects = inner.core.join(token, request);
            inner.deliver(effects);
        }
        self.wake.notify_one();
        receiver.await.unwrap_or_else(|_| {
            JoinResponse::failed(
                GroupError::CoordinatorNotAvailable("coordinator stopped".into()),
                member_id,
            )
        })
    }

    pub async fn sync(&self, request: SyncRequest) -> SyncResponse {
        let (sender, receiver) = oneshot::channel();
        {
            let mut inner = self.lock();
            let token = inner.token();
            inner.syncs.insert(token, sender);
            let effects = inner.core.sync(token, request);
            inner.deliver(effects);
        }
        self.wake.notify_one();
        receiver.await.unwrap_or_else(|_| {
            SyncResponse::failed(GroupError::CoordinatorNotAvailable(
                "coordinator stopped".into(),
            ))
        })
    }

    pub fn heartbeat(&self, request: &HeartbeatRequest) -> Result<(), GroupError> {
        let result = self.lock().core.heartbeat(request);
        self.wake.notify_one();
        result
    }

    pub fn leave(&self, group_id: &str, members: &[LeavingMember]) -> Vec<Result<(), GroupError>> {
        let results = {
            let mut inner = self.lock();
            let (results, effects) = inner.core.leave(group_id, members);
            inner.deliver(effects);
            results
        };
        self.wake.notify_one();
        results
    }

    pub fn validate_commit(&self, identity: &CommitIdentity) -> Result<(), GroupError> {
        self.lock().core.validate_commit(identity)
    }

    /// Validates a commit and, if it is valid, runs `then` before any rebalance can end the
    /// generation it was validated against: `then` sequences the commit, so a zombie's commit
    /// either lands before the new generation's commits or is refused.
    pub fn validate_commit_then<T>(
        &self,
        identity: &CommitIdentity,
        then: impl FnOnce() -> T,
    ) -> Result<T, GroupError> {
        let mut inner = self.lock();
        inner.core.validate_commit(identity)?;
        Ok(then())
    }

    pub fn list(&self) -> Vec<GroupListing> {
        self.lock().core.list()
    }

    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        self.lock().core.describe(group_id)
    }

    pub fn begin_delete(&self, group_id: &str) -> Result<bool, GroupError> {
        self.lock().core.begin_delete(group_id)
    }

    /// See [`CoordinatorCore::unload`].
    pub fn unload(&self, group_id: &str) {
        let mut inner = self.lock();
        let effects = inner.core.unload(group_id);
        inner.deliver(effects);
    }

    pub fn finish_delete(&self, group_id: &str) {
        self.lock().core.finish_delete(group_id);
    }

    pub fn offset_delete_guard(
        &self,
        group_id: &str,
    ) -> Result<Option<BTreeSet<String>>, GroupError> {
        self.lock().core.offset_delete_guard(group_id)
    }

    /// Applies due timeouts, then sleeps until the next deadline or a wake-up.
    async fn run_timer(self) {
        loop {
            let sleep_for = {
                let mut inner = self.lock();
                let effects = inner.core.tick();
                inner.deliver(effects);
                let now_ms = self.clock.now_ms();
                inner
                    .core
                    .next_deadline()
                    .map(|deadline| {
                        Duration::from_millis(deadline.saturating_sub(now_ms).max(1) as u64)
                    })
                    .unwrap_or(MAX_TIMER_SLEEP)
                    .min(MAX_TIMER_SLEEP)
            };
            // Stop when every handle but this task's own is gone.
            if Arc::strong_count(&self.inner) == 1 {
                return;
            }
            tokio::select! {
                // Biased: the simulator replays a seed exactly only without tokio's random
                // choice; a wake-up first, so a due timer never delays it.
                biased;
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep_for) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use weir_common::ManualClock;

    use super::*;

    /// `then` (which sequences an OffsetCommit) runs before any other coordinator call can act:
    /// a LeaveGroup (or a rebalance) issued meanwhile completes only after it. Before, validation
    /// released the lock and the commit was sequenced later, so a rebalance could slip between.
    #[tokio::test]
    async fn test_service_commit_is_sequenced_before_a_concurrent_membership_change() {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000));
        let coordinator = GroupCoordinator::start(GroupSettings::default(), clock, 1);
        let identity = CommitIdentity {
            group_id: "g".into(),
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: None,
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        let result = coordinator.validate_commit_then(&identity, || {
            let other = coordinator.clone();
            let log = events.clone();
            let leaving = std::thread::spawn(move || {
                let member = LeavingMember {
                    member_id: "m".into(),
                    group_instance_id: None,
                };
                let _ = other.leave("g", &[member]);
                log.lock().unwrap().push("membership changed");
            });
            // Room for the other call to overtake, were the lock not held.
            std::thread::sleep(Duration::from_millis(50));
            events.lock().unwrap().push("commit sequenced");
            leaving
        });
        let leaving = result.expect("a simple commit to an unknown group is valid");
        leaving.join().unwrap();
        assert_eq!(
            *events.lock().unwrap(),
            vec!["commit sequenced", "membership changed"]
        );
    }
}
