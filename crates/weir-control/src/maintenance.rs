//! Retention: which log starts should move, computed from the durable state and a wall clock,
//! and the task that submits them. The clock decides only *when* data goes; the log records
//! offsets (`AdvanceLogStart`), so replay stays deterministic.
//!
//! Per partition, Kafka's two rules over the durable batches, in whole batches:
//! * time (`retention.ms`): the kept log starts at the first batch whose *running maximum*
//!   timestamp reaches `now - retention.ms`, as Kafka deletes a prefix of segments by their
//!   largest timestamp;
//! * size (`retention.bytes`): drop batches from the front while the rest still holds at least
//!   `retention.bytes` (the partition never shrinks below it).
//!
//! The new start is the later of the two, never past the durable high watermark.

use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};
use weir_common::periodic::{millis, next_pass, pass_interval};
use weir_common::Clock;

use crate::configs;
use crate::entry::{Entry, EntryResult, LogStartCause, LogStartMove};
use crate::plane::ControlPlane;
use crate::state::{PartitionState, State};

/// Broker defaults for topics without their own `retention.ms` / `retention.bytes` (-1: keep
/// forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionDefaults {
    pub ms: i64,
    pub bytes: i64,
}

impl Default for RetentionDefaults {
    /// Kafka's: 7 days, no size limit.
    fn default() -> Self {
        Self {
            ms: 7 * 24 * 3600 * 1000,
            bytes: -1,
        }
    }
}

/// One `AdvanceLogStart` per topic with a partition whose start should move at `now_ms`.
pub fn retention_entries(state: &State, now_ms: i64, defaults: RetentionDefaults) -> Vec<Entry> {
    state
        .topics
        .values()
        .filter_map(|topic| {
            let limit = |name: &str, default: i64| {
                topic
                    .configs
                    .get(name)
                    .and_then(|value| value.parse::<i64>().ok())
                    .unwrap_or(default)
            };
            // Kafka applies time and size retention only to topics whose cleanup.policy
            // includes `delete`; a compacted topic (schemas, Connect configs) keeps its records.
            let deletes = configs::effective(&topic.configs, configs::CLEANUP_POLICY)
                .is_some_and(|policy| policy.split(',').any(|p| p.trim() == "delete"));
            if !deletes {
                return None;
            }
            let ms = limit("retention.ms", defaults.ms);
            let bytes = limit("retention.bytes", defaults.bytes);
            if ms < 0 && bytes < 0 {
                return None;
            }
            let cutoff = (ms >= 0).then(|| now_ms.saturating_sub(ms));
            let moves: Vec<LogStartMove> = topic
                .partitions
                .iter()
                .enumerate()
                .filter_map(|(index, partition)| {
                    let offset = retained_start(partition, cutoff, bytes)?;
                    Some(LogStartMove {
                        partition: index as i32,
                        offset,
                    })
                })
                .collect();
            (!moves.is_empty()).then_some(Entry::AdvanceLogStart {
                topic_id: topic.id,
                partitions: moves,
                cause: LogStartCause::Retention,
            })
        })
        .collect()
}

/// The log start retention asks for on one partition, if it is above the current one.
fn retained_start(partition: &PartitionState, cutoff: Option<i64>, bytes: i64) -> Option<i64> {
    let stable = partition.stable_high_watermark;
    let index = &partition.index;
    let start_of = |position: usize| index.get(position).map_or(stable, |e| e.base_offset);
    let by_time = cutoff.map_or(partition.log_start_offset, |cutoff| {
        start_of(index.first_reaching(0, cutoff).unwrap_or(index.len()))
    });
    let by_size = if bytes >= 0 {
        start_of(index.first_keeping(bytes as u64))
    } else {
        partition.log_start_offset
    };
    let start = by_time.max(by_size).min(stable);
    (start > partition.log_start_offset).then_some(start)
}

/// How often retention runs and with which broker defaults.
#[derive(Debug, Clone, Copy)]
pub struct RetentionSettings {
    pub check_interval: Duration,
    pub defaults: RetentionDefaults,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            check_interval: Duration::from_secs(30),
            defaults: RetentionDefaults::default(),
        }
    }
}

/// How long idle producer ids and commit-chain tips are kept.
#[derive(Debug, Clone, Copy)]
pub struct ExpirySettings {
    /// Kafka's `producer.id.expiration.ms` (1 day).
    pub producer_id_expiration: Duration,
    /// Commit-chain tips of agent incarnations (1 day).
    pub agent_tip_expiry: Duration,
}

impl Default for ExpirySettings {
    fn default() -> Self {
        Self {
            producer_id_expiration: Duration::from_secs(24 * 3600),
            agent_tip_expiry: Duration::from_secs(24 * 3600),
        }
    }
}

/// Runs retention and expiry every `check_interval` until `stop` turns true.
pub async fn run_maintenance(
    control: ControlPlane,
    retention: RetentionSettings,
    expiry: ExpirySettings,
    clock: std::sync::Arc<dyn Clock>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = pass_interval(retention.check_interval);
    while next_pass(&mut ticks, &mut stop).await {
        apply_retention(&control, clock.now_ms(), retention.defaults).await;
        apply_expiry(&control, clock.now_ms(), expiry).await;
    }
}

/// Expires idle producer ids and stale commit-chain tips, writing an entry only when one is due.
pub async fn apply_expiry(control: &ControlPlane, now_ms: i64, settings: ExpirySettings) {
    let producers_before = now_ms.saturating_sub(millis(settings.producer_id_expiration));
    let tips_before = now_ms.saturating_sub(millis(settings.agent_tip_expiry));
    let (producers_due, tips_due) = control.read(|state| {
        (
            state
                .producer_last_ms
                .values()
                .any(|last| *last < producers_before),
            state
                .agent_tips
                .values()
                .any(|tip| tip.unix_ms() < tips_before),
        )
    });
    let mut entries = Vec::new();
    if producers_due {
        entries.push(Entry::ExpireProducers {
            before_ms: producers_before,
        });
    }
    if tips_due {
        entries.push(Entry::ExpireAgentTips {
            before_ms: tips_before,
        });
    }
    for entry in entries {
        match control.submit(entry).await {
            Ok(EntryResult::ExpireProducers(count)) if count > 0 => {
                info!(count, "expired idle producer ids")
            }
            Ok(EntryResult::ExpireAgentTips(count)) if count > 0 => {
                info!(count, "expired commit chains of idle agent incarnations")
            }
            Ok(_) => {}
            Err(error) => {
                warn!(%error, "expiry pass failed; it runs again at the next check interval")
            }
        }
    }
}

/// One retention pass: submits each topic's moves and logs what moved.
pub async fn apply_retention(control: &ControlPlane, now_ms: i64, defaults: RetentionDefaults) {
    let entries = control.read(|state| retention_entries(state, now_ms, defaults));
    for entry in entries {
        let Entry::AdvanceLogStart {
            topic_id,
            partitions,
            ..
        } = &entry
        else {
            continue;
        };
        let (topic_id, partitions) = (*topic_id, partitions.clone());
        match control.submit(entry).await {
            Ok(EntryResult::AdvanceLogStart(results)) => {
                let topic = control.read(|state| {
                    state
                        .topic_by_id(&topic_id)
                        .map_or_else(|| topic_id.to_string(), |t| t.name.clone())
                });
                for (mv, result) in partitions.iter().zip(results) {
                    match result {
                        Ok(start) => info!(
                            topic = %topic,
                            partition = mv.partition,
                            log_start_offset = start,
                            "retention advanced the log start"
                        ),
                        Err(error) => warn!(
                            topic = %topic,
                            partition = mv.partition,
                            %error,
                            "retention could not advance the log start"
                        ),
                    }
                }
            }
            Ok(other) => warn!(?other, "unexpected result of a retention entry"),
            Err(error) => warn!(
                %error,
                "retention pass failed; it runs again at the next check interval"
            ),
        }
    }
}

#[cfg(test)]
mod tests;
