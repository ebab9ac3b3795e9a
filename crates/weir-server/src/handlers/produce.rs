//! Produce v3–v12: validate every batch header and CRC and its records (`record_checks`),
//! build one ticket per request, queue it in order (the reader does not wait for durability),
//! answer once the ticket is committed.
//!
//! Each partition is checked on its own: a bad partition gets its error (with KIP-467
//! `record_errors` where records are at fault), the others of the request are unaffected.
//! Produce v3+ carries exactly one batch per partition; more is INVALID_RECORD, and nothing of
//! that partition is written.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use weir_produce::{PartitionBatches, PartitionOutcome, ProduceError, ProduceTicket};
use weir_protocol::batch::split_and_validate;
use weir_protocol::{error_code, BatchError, ValidatedBatch};

use super::record_checks::{check_batch, stamp_log_append_time, Rejection, TopicPolicy};
use super::{control_error_code, text, topic_name};
use crate::broker::Broker;
use crate::dispatch::{ready, Dispatched, RequestContext};

/// Where each partition's answer comes from: decided now (an error) or from the ticket (with
/// the append time of a LogAppendTime topic, else -1, and its records and bytes for the
/// metrics).
enum Slot {
    Error(Rejection),
    Ticket(usize, i64, (u64, u64)),
}

struct PartitionSlot {
    topic: usize,
    index: i32,
    slot: Slot,
}

pub(crate) async fn handle(
    broker: Arc<Broker>,
    context: RequestContext,
    request: ProduceRequest,
) -> Dispatched {
    let acks = request.acks;
    let topics: Vec<String> = request
        .topic_data
        .iter()
        .map(|t| t.name.0.to_string())
        .collect();
    let mut slots = Vec::new();
    let mut ticket = ProduceTicket::default();
    let request_error = if request.transactional_id.is_some() {
        Some(Rejection::new(
            error_code::INVALID_REQUEST,
            "transactions are not supported yet",
        ))
    } else if !matches!(acks, -1..=1) {
        Some(Rejection::new(
            error_code::INVALID_REQUIRED_ACKS,
            format!("acks={acks} is not -1, 0 or 1"),
        ))
    } else {
        None
    };
    let now_ms = broker.clock.now_ms();
    for (topic_index, topic) in request.topic_data.into_iter().enumerate() {
        let name = topic.name.0.to_string();
        let found = broker.control.read(|s| {
            s.topic(&name).map(|t| {
                (
                    t.id,
                    t.partitions.len() as i32,
                    TopicPolicy::from_configs(&t.configs),
                )
            })
        });
        for partition in topic.partition_data {
            let slot = match (&request_error, found) {
                (Some(rejection), _) => Slot::Error(rejection.clone()),
                (None, None) => Slot::Error(Rejection::new(
                    error_code::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("unknown topic {name}"),
                )),
                (None, Some((_, count, _))) if partition.index < 0 || partition.index >= count => {
                    Slot::Error(Rejection::new(
                        error_code::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("{name} has {count} partitions"),
                    ))
                }
                (None, Some((topic_id, _, policy))) => {
                    match validate(&broker, partition.records.as_ref(), &policy, now_ms) {
                        Ok(mut batches) => {
                            let append_time = if policy.log_append_time {
                                batches
                                    .iter_mut()
                                    .for_each(|batch| stamp_log_append_time(batch, now_ms));
                                now_ms
                            } else {
                                -1
                            };
                            let records = batches
                                .iter()
                                .map(|b| u64::try_from(b.header.records_count).unwrap_or(0))
                                .sum();
                            let bytes = batches.iter().map(|b| b.bytes.len() as u64).sum();
                            ticket.partitions.push(PartitionBatches {
                                topic_id,
                                partition: partition.index,
                                batches,
                            });
                            Slot::Ticket(ticket.partitions.len() - 1, append_time, (records, bytes))
                        }
                        Err(rejection) => Slot::Error(rejection),
                    }
                }
            };
            slots.push(PartitionSlot {
                topic: topic_index,
                index: partition.index,
                slot,
            });
        }
    }
    let has_ticket = !ticket.partitions.is_empty();
    let outcome = if has_ticket {
        Some(broker.produce.submit(ticket).await)
    } else {
        None
    };
    if !has_ticket && acks == 0 {
        return ready(None);
    }
    Dispatched::bytes(async move {
        let outcomes = match outcome {
            Some(pending) => pending.await,
            None => Vec::new(),
        };
        let mut per_topic = vec![(0u64, 0u64); topics.len()];
        for slot in &slots {
            if let Slot::Ticket(position, _, (records, bytes)) = slot.slot {
                if let Some(PartitionOutcome::Committed { .. }) = outcomes.get(position) {
                    per_topic[slot.topic].0 += records;
                    per_topic[slot.topic].1 += bytes;
                }
            }
        }
        for (topic, (records, bytes)) in topics.iter().zip(per_topic) {
            if bytes > 0 {
                broker.metrics.produced(topic, records, bytes);
            }
        }
        if acks == 0 {
            return None;
        }
        context.encode(&build_response(&topics, slots, &outcomes, context.version))
    })
}

fn validate(
    broker: &Broker,
    records: Option<&Bytes>,
    policy: &TopicPolicy,
    now_ms: i64,
) -> Result<Vec<ValidatedBatch>, Rejection> {
    let Some(records) = records else {
        return Err(Rejection::new(
            error_code::INVALID_RECORD,
            "null record set",
        ));
    };
    let batches = split_and_validate(records)
        .map_err(|err| Rejection::new(batch_error_code(&err), err.to_string()))?;
    // Produce v3+ (all Weir accepts) carries exactly one batch per partition, as in Kafka.
    if batches.len() != 1 {
        return Err(Rejection::new(
            error_code::INVALID_RECORD,
            format!(
                "produce v3+ carries exactly one record batch per partition, got {}",
                batches.len()
            ),
        ));
    }
    for batch in &batches {
        let max_message_bytes = policy.max_message_bytes;
        if batch.bytes.len() > max_message_bytes {
            return Err(Rejection::new(
                error_code::MESSAGE_TOO_LARGE,
                format!(
                    "batch of {} bytes exceeds max.message.bytes {max_message_bytes}",
                    batch.bytes.len()
                ),
            ));
        }
        if batch.header.is_transactional() || batch.header.is_control() {
            return Err(Rejection::new(
                error_code::INVALID_RECORD,
                "transactional batches are not supported yet",
            ));
        }
        check_batch(
            batch,
            policy,
            broker.settings.produce_validation,
            broker.settings.max_decompressed_bytes,
            now_ms,
        )?;
    }
    Ok(batches)
}

fn batch_error_code(error: &BatchError) -> i16 {
    match error {
        BatchError::BadCompression(_) => error_code::UNSUPPORTED_COMPRESSION_TYPE,
        BatchError::BadCount { .. } | BatchError::Empty => error_code::INVALID_RECORD,
        BatchError::TruncatedHeader { .. }
        | BatchError::TruncatedBatch { .. }
        | BatchError::BadLength(_)
        | BatchError::BadMagic(_)
        | BatchError::CrcMismatch { .. } => error_code::CORRUPT_MESSAGE,
    }
}

fn produce_error_code(error: &ProduceError) -> i16 {
    match error {
        ProduceError::Storage(_) | ProduceError::EarlierFileFailed => {
            error_code::KAFKA_STORAGE_ERROR
        }
        // Possibly written (RFC 0006): librdkafka marks the message POSSIBLY_PERSISTED, as
        // after a timeout, instead of NOT_PERSISTED.
        ProduceError::Unresolved(_) => error_code::REQUEST_TIMED_OUT,
        ProduceError::Control(control) => control_error_code(control),
        ProduceError::ShuttingDown => error_code::NOT_LEADER_OR_FOLLOWER,
    }
}

fn build_response(
    topics: &[String],
    slots: Vec<PartitionSlot>,
    outcomes: &[PartitionOutcome],
    version: i16,
) -> ProduceResponse {
    let mut responses: Vec<TopicProduceResponse> = topics
        .iter()
        .map(|name| TopicProduceResponse::default().with_name(topic_name(name)))
        .collect();
    for PartitionSlot { topic, index, slot } in slots {
        let base = PartitionProduceResponse::default()
            .with_index(index)
            .with_log_append_time_ms(-1);
        let partition = match slot {
            Slot::Error(rejection) => base
                .with_error_code(rejection.code)
                .with_base_offset(-1)
                .with_log_start_offset(-1)
                .with_error_message(Some(text(rejection.message)))
                .with_record_errors(
                    rejection
                        .record_errors
                        .into_iter()
                        .map(|(batch_index, message)| {
                            BatchIndexAndErrorMessage::default()
                                .with_batch_index(batch_index)
                                .with_batch_index_error_message(Some(text(message)))
                        })
                        .collect(),
                ),
            Slot::Ticket(position, append_time, _) => match outcomes.get(position) {
                Some(PartitionOutcome::Committed {
                    base_offset,
                    log_start_offset,
                }) => base
                    .with_base_offset(*base_offset)
                    .with_log_start_offset(*log_start_offset)
                    .with_log_append_time_ms(append_time),
                Some(PartitionOutcome::Failed(error)) => base
                    .with_error_code(produce_error_code(error))
                    .with_base_offset(-1)
                    .with_log_start_offset(-1)
                    .with_error_message(Some(text(error.to_string()))),
                None => base
                    .with_error_code(error_code::UNKNOWN_SERVER_ERROR)
                    .with_base_offset(-1),
            },
        };
        let mut partition = partition;
        if version < 5 {
            partition.log_start_offset = -1;
        }
        if version < 8 {
            partition.error_message = None;
            partition.record_errors.clear();
        }
        responses[topic].partition_responses.push(partition);
    }
    ProduceResponse::default().with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_failure_that_may_still_become_readable_is_answered_as_possibly_written() {
        let unresolved = ProduceError::Unresolved("the upload missed the ack deadline".into());
        assert_eq!(
            produce_error_code(&unresolved),
            error_code::REQUEST_TIMED_OUT
        );
        let nothing_written = ProduceError::Storage("no space left on device".into());
        assert_eq!(
            produce_error_code(&nothing_written),
            error_code::KAFKA_STORAGE_ERROR
        );
    }
}
