//! DeleteRecords v0–v2 (API 21): moves partitions' log start forward (RFC 0003 §3).
//!
//! Each requested offset is checked against the readable state first (once the confirmations
//! of the pending files this agent already serves are durable), so that a client is answered
//! against what consumers see: an unknown topic or partition → 3, a topic whose
//! `cleanup.policy` lacks `delete` → `POLICY_VIOLATION` (44, as Kafka: such a log is only ever
//! compacted), an offset below -1 or above the stable high watermark → `OFFSET_OUT_OF_RANGE`
//! (1); none of these is submitted. -1 ("delete everything") becomes the stable high watermark
//! here rather than in apply, so only records a consumer could have seen are deleted, never
//! those of a produce not yet answered.
//!
//! Then one `AdvanceLogStart` per distinct topic, holding one move per distinct partition (the
//! largest offset asked for it: the start never moves backwards, so the smaller ones are no-ops
//! anyway). The entry is therefore bounded by the topic's partition count, whatever the frame
//! repeats (BAD-1), and every repetition of a partition is answered with that one result.
//!
//! The answer waits until the entry is durable (DUR-1), at most `timeout_ms`; after that the
//! partition is answered `REQUEST_TIMED_OUT` (7), as Kafka does when its followers do not catch
//! up in time. The entry may still take effect: the client learns the outcome from ListOffsets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use kafka_protocol::messages::delete_records_request::DeleteRecordsTopic;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use tokio::time::Instant;
use weir_common::TopicId;
use weir_control::configs::{effective, CLEANUP_POLICY};
use weir_control::{Entry, EntryResult, LogStartCause, LogStartMove, PartitionState, State, Topic};
use weir_protocol::error_code;

use super::control_error_code;
use crate::broker::Broker;
use crate::dispatch::RequestContext;

/// What one partition is answered: its new log start (Kafka's low watermark) or an error code.
type Answer = Result<i64, i16>;

/// Per requested partition (in request order): the partition to answer from its topic's
/// outcome, or the error code it is answered with at once.
type Checked = Vec<Vec<Result<i32, i16>>>;

/// The moves of one topic, checked against the readable state: partition → target offset.
struct TopicPlan {
    topic_id: TopicId,
    targets: BTreeMap<i32, i64>,
}

pub(crate) async fn delete_records(
    broker: Arc<Broker>,
    context: RequestContext,
    request: DeleteRecordsRequest,
) -> Option<Bytes> {
    let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
    let deadline = Instant::now() + timeout;
    // What consumers here were shown may be past the stable view by files whose confirmation
    // is on its way (RFC 0006): wait for it, so an offset fetched is one that can be deleted.
    broker.control.settle_acknowledged(deadline).await;
    let (checked, plans) = broker
        .control
        .read(|state| check_request(state, &request.topics));
    let submissions = plans
        .into_iter()
        .map(|(name, plan)| async { (name, submit(&broker, plan, deadline).await) });
    let outcomes: BTreeMap<String, BTreeMap<i32, Answer>> =
        join_all(submissions).await.into_iter().collect();
    let topics = request
        .topics
        .iter()
        .zip(checked)
        .map(|(topic, checked)| {
            let outcome = outcomes.get(topic.name.0.as_str());
            let partitions = topic
                .partitions
                .iter()
                .zip(checked)
                .map(|(requested, checked)| {
                    let answer = checked.and_then(|partition| {
                        outcome
                            .and_then(|outcome| outcome.get(&partition).copied())
                            .unwrap_or(Err(error_code::UNKNOWN_SERVER_ERROR))
                    });
                    partition_result(requested.partition_index, answer)
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    context.encode(&DeleteRecordsResponse::default().with_topics(topics))
}

/// Under the state lock: per requested partition, the partition to move or the error it is
/// answered with; and per distinct topic, the moves to submit.
fn check_request(
    state: &State,
    topics: &[DeleteRecordsTopic],
) -> (Checked, BTreeMap<String, TopicPlan>) {
    let mut plans: BTreeMap<String, TopicPlan> = BTreeMap::new();
    let checked = topics
        .iter()
        .map(|topic| {
            let name = topic.name.0.as_str();
            let found = state.topic(name);
            topic
                .partitions
                .iter()
                .map(|requested| {
                    let index = requested.partition_index;
                    let topic = found.ok_or(error_code::UNKNOWN_TOPIC_OR_PARTITION)?;
                    let partition = topic.partition(index);
                    if partition.is_some() && !deletes(topic) {
                        return Err(error_code::POLICY_VIOLATION);
                    }
                    let target = check_offset(partition, requested.offset)?;
                    let plan = plans.entry(name.to_string()).or_insert_with(|| TopicPlan {
                        topic_id: topic.id,
                        targets: BTreeMap::new(),
                    });
                    let slot = plan.targets.entry(index).or_insert(target);
                    *slot = (*slot).max(target);
                    Ok(index)
                })
                .collect()
        })
        .collect();
    (checked, plans)
}

/// Whether the topic's `cleanup.policy` allows deleting records (`delete`, alone or with
/// `compact`).
fn deletes(topic: &Topic) -> bool {
    effective(&topic.configs, CLEANUP_POLICY)
        .is_none_or(|policy| policy.split(',').any(|p| p.trim() == "delete"))
}

/// The log start `offset` asks for on `partition`, or the error code it is answered with.
fn check_offset(partition: Option<&PartitionState>, offset: i64) -> Result<i64, i16> {
    let partition = partition.ok_or(error_code::UNKNOWN_TOPIC_OR_PARTITION)?;
    let high_watermark = partition.stable_high_watermark;
    match offset {
        -1 => Ok(high_watermark),
        offset if (0..=high_watermark).contains(&offset) => Ok(offset),
        _ => Err(error_code::OFFSET_OUT_OF_RANGE),
    }
}

/// Submits one topic's `AdvanceLogStart` and waits for it until `deadline`: the answer for each
/// partition of the plan.
async fn submit(broker: &Broker, plan: TopicPlan, deadline: Instant) -> BTreeMap<i32, Answer> {
    let moves: Vec<LogStartMove> = plan
        .targets
        .iter()
        .map(|(&partition, &offset)| LogStartMove { partition, offset })
        .collect();
    let entry = Entry::AdvanceLogStart {
        topic_id: plan.topic_id,
        partitions: moves.clone(),
        cause: LogStartCause::DeleteRecords,
    };
    let answers: Vec<Answer> = match tokio::time::timeout_at(deadline, broker.control.submit(entry))
        .await
    {
        Ok(Ok(EntryResult::AdvanceLogStart(results))) if results.len() == moves.len() => results
            .iter()
            .map(|result| result.as_ref().copied().map_err(control_error_code))
            .collect(),
        Ok(Ok(other)) => {
            tracing::error!(?other, "AdvanceLogStart answered with another result");
            vec![Err(error_code::UNKNOWN_SERVER_ERROR); moves.len()]
        }
        Ok(Err(err)) => vec![Err(control_error_code(&err)); moves.len()],
        Err(_elapsed) => vec![Err(error_code::REQUEST_TIMED_OUT); moves.len()],
    };
    // One line per topic, whatever the partition count.
    let failed = answers.iter().filter(|answer| answer.is_err()).count();
    tracing::info!(
        topic_id = %plan.topic_id,
        partitions = moves.len(),
        failed,
        first = ?moves.first().zip(answers.first()),
        "delete records"
    );
    moves.iter().map(|mv| mv.partition).zip(answers).collect()
}

fn partition_result(partition: i32, answer: Answer) -> DeleteRecordsPartitionResult {
    let base = DeleteRecordsPartitionResult::default().with_partition_index(partition);
    match answer {
        Ok(low_watermark) => base.with_low_watermark(low_watermark),
        Err(code) => base.with_low_watermark(-1).with_error_code(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(stable_high_watermark: i64) -> PartitionState {
        PartitionState {
            log_start_offset: 2,
            high_watermark: stable_high_watermark + 5,
            stable_high_watermark,
            ..PartitionState::default()
        }
    }

    #[test]
    fn test_check_offset_bounds_by_the_stable_high_watermark() {
        let p = partition(10);
        assert_eq!(check_offset(Some(&p), 0), Ok(0), "below the start: a no-op");
        assert_eq!(check_offset(Some(&p), 7), Ok(7));
        assert_eq!(check_offset(Some(&p), 10), Ok(10));
        assert_eq!(check_offset(Some(&p), -1), Ok(10), "-1: what consumers see");
        let out_of_range = Err(error_code::OFFSET_OUT_OF_RANGE);
        // Assigned but not yet durable offsets are out of range too.
        assert_eq!(check_offset(Some(&p), 11), out_of_range);
        assert_eq!(check_offset(Some(&p), -2), out_of_range);
        assert_eq!(check_offset(Some(&p), i64::MIN), out_of_range);
        assert_eq!(check_offset(Some(&p), i64::MAX), out_of_range);
        assert_eq!(
            check_offset(None, 0),
            Err(error_code::UNKNOWN_TOPIC_OR_PARTITION)
        );
    }

    #[test]
    fn test_partition_result_carries_minus_one_on_error() {
        let ok = partition_result(3, Ok(42));
        assert_eq!(
            (ok.partition_index, ok.low_watermark, ok.error_code),
            (3, 42, 0)
        );
        let failed = partition_result(4, Err(error_code::REQUEST_TIMED_OUT));
        assert_eq!(
            (
                failed.partition_index,
                failed.low_watermark,
                failed.error_code
            ),
            (4, -1, error_code::REQUEST_TIMED_OUT)
        );
    }
}
