//! Expiry of committed offsets of groups without members (Kafka's `offsets.retention.minutes`).
//! The coordinator knows membership (in memory), the control plane knows commit times (in the
//! log), so the coordinator's agent decides and writes `ExpireGroup` with a time bound; apply
//! keeps the offsets if a commit landed after the bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};
use weir_common::periodic::{millis, next_pass, pass_interval};
use weir_control::{Entry, EntryResult};
use weir_groups::GroupState;

use crate::broker::Broker;

#[derive(Debug, Clone, Copy)]
pub struct GroupExpirySettings {
    /// Offsets of a group with no members go once none was committed for this long.
    pub offsets_retention: Duration,
    /// A group must be seen without members for this long first (members of live groups
    /// rejoin after a restart within their session timeout).
    pub startup_delay: Duration,
    pub check_interval: Duration,
}

/// Runs group expiry every `check_interval` until `stop` turns true.
pub async fn run_group_expiry(
    broker: Arc<Broker>,
    settings: GroupExpirySettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = pass_interval(settings.check_interval);
    let mut empty_since = HashMap::new();
    while next_pass(&mut ticks, &mut stop).await {
        expire_groups(&broker, &settings, &mut empty_since).await;
    }
}

/// One pass. `empty_since` remembers when this agent first saw each candidate without members.
pub(crate) async fn expire_groups(
    broker: &Broker,
    settings: &GroupExpirySettings,
    empty_since: &mut HashMap<String, Instant>,
) {
    let retention = millis(settings.offsets_retention);
    let bound = broker.clock.now_ms().saturating_sub(retention);
    let candidates: Vec<String> = broker.control.read(|state| {
        state
            .group_offsets
            .keys()
            .filter(|group| {
                state
                    .group_last_commit_ms(group)
                    .is_some_and(|t| t <= bound)
            })
            .cloned()
            .collect()
    });
    empty_since.retain(|group, _| candidates.contains(group));
    let now = Instant::now();
    for group in candidates {
        let Some(coordinator) = broker.coordination(&group) else {
            continue;
        };
        let empty = broker
            .groups
            .describe(&group)
            .is_none_or(|g| g.state == GroupState::Empty);
        if !empty {
            empty_since.remove(&group);
            continue;
        }
        let since = *empty_since.entry(group.clone()).or_insert(now);
        if now.duration_since(since) < settings.startup_delay {
            continue;
        }
        // Dead while the entry is written, so no member joins meanwhile (as DeleteGroups).
        if broker.groups.begin_delete(&group).is_err() {
            continue;
        }
        let outcome = broker
            .control
            .submit(Entry::ExpireGroup {
                group: group.clone(),
                last_commit_at_most_ms: bound,
                coordinator,
            })
            .await;
        broker.groups.finish_delete(&group);
        match outcome {
            Ok(EntryResult::ExpireGroup(true)) => {
                empty_since.remove(&group);
                info!(group = %group, "expired the committed offsets of a group without members");
            }
            Ok(_) => {}
            Err(error) => warn!(group = %group, %error, "group expiry failed; retrying next pass"),
        }
    }
}

#[cfg(test)]
mod tests {
    use weir_control::OffsetCommit;

    use super::*;
    use crate::tests::{broker_with_data, TOPIC};

    async fn commit(broker: &Broker, group: &str, at_ms: i64) {
        let entry = Entry::CommitOffsets {
            coordinator: None,
            group: group.into(),
            offsets: vec![OffsetCommit {
                topic: TOPIC.into(),
                partition: 0,
                offset: 1,
                leader_epoch: -1,
                metadata: None,
            }],
            at_ms,
        };
        broker.control.submit(entry).await.unwrap();
    }

    fn has_offsets(broker: &Broker, group: &str) -> bool {
        broker
            .control
            .read(|state| state.group_offsets.contains_key(group))
    }

    #[tokio::test]
    async fn test_group_expiry_needs_idle_commits_and_an_empty_group_seen_long_enough() {
        let (broker, _) = broker_with_data(1 << 20, 1, 1).await;
        let now = broker.clock.now_ms();
        commit(&broker, "idle", now - 60_000).await;
        commit(&broker, "recent", now).await;
        let mut empty_since = HashMap::new();
        let patient = GroupExpirySettings {
            offsets_retention: Duration::from_secs(30),
            startup_delay: Duration::from_secs(3600),
            check_interval: Duration::from_secs(1),
        };
        // Seen empty only just now: not yet.
        expire_groups(&broker, &patient, &mut empty_since).await;
        assert!(has_offsets(&broker, "idle"));
        assert!(empty_since.contains_key("idle") && !empty_since.contains_key("recent"));
        let due = GroupExpirySettings {
            startup_delay: Duration::ZERO,
            ..patient
        };
        expire_groups(&broker, &due, &mut empty_since).await;
        assert!(!has_offsets(&broker, "idle"));
        assert!(
            has_offsets(&broker, "recent"),
            "committed within the retention"
        );
    }
}
