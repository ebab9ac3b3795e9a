//! ListOffsets v1–v8 and OffsetForLeaderEpoch v2–v4.
//!
//! Timestamp lookups work at batch granularity: the answer is the first batch whose max
//! timestamp reaches the target; when the batch's first record is already at or past the
//! target (the common case of increasing timestamps) the answer is exact. Max-timestamp (-3)
//! returns the last offset of the batch holding the largest timestamp.

use bytes::Bytes;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
};
use weir_control::PartitionState;
use weir_fetch::LEADER_EPOCH;
use weir_protocol::error_code;

use crate::broker::Broker;
use crate::dispatch::RequestContext;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// Weir has no tiered split: the earliest local offset is the earliest offset (KIP-1005).
const EARLIEST_LOCAL: i64 = -4;

pub(crate) fn list_offsets(
    broker: &Broker,
    context: RequestContext,
    request: ListOffsetsRequest,
) -> Option<Bytes> {
    let topics = broker.control.read(|state| {
        request
            .topics
            .iter()
            .map(|topic| {
                let found = state.topic(&topic.name);
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let base = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_timestamp(-1)
                            .with_offset(-1)
                            .with_leader_epoch(if context.version >= 4 {
                                LEADER_EPOCH
                            } else {
                                -1
                            });
                        let partition = found.and_then(|t| t.partition(p.partition_index));
                        match partition {
                            None => base.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                            Some(partition) => {
                                let (offset, timestamp) = lookup(partition, p.timestamp);
                                base.with_offset(offset).with_timestamp(timestamp)
                            }
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(topic.name.clone())
                    .with_partitions(partitions)
            })
            .collect()
    });
    context.encode(&ListOffsetsResponse::default().with_topics(topics))
}

/// Returns (offset, timestamp) for a ListOffsets target; (-1, -1) when nothing matches.
fn lookup(partition: &PartitionState, target: i64) -> (i64, i64) {
    let high_watermark = partition.stable_high_watermark;
    let visible = partition
        .index
        .iter()
        .filter(|e| e.base_offset >= partition.log_start_offset && e.base_offset < high_watermark);
    match target {
        LATEST => (high_watermark, -1),
        EARLIEST | EARLIEST_LOCAL => (partition.log_start_offset, -1),
        MAX_TIMESTAMP => visible
            .max_by_key(|e| (e.max_timestamp, std::cmp::Reverse(e.base_offset)))
            .map_or((-1, -1), |e| (e.last_offset, e.max_timestamp)),
        target if target >= 0 => visible
            .into_iter()
            .find(|e| e.max_timestamp >= target)
            .map_or((-1, -1), |e| {
                let timestamp = if e.first_timestamp >= target {
                    e.first_timestamp
                } else {
                    e.max_timestamp
                };
                (e.base_offset, timestamp)
            }),
        _ => (-1, -1),
    }
}

pub(crate) fn offset_for_leader_epoch(
    broker: &Broker,
    context: RequestContext,
    request: OffsetForLeaderEpochRequest,
) -> Option<Bytes> {
    let topics = broker.control.read(|state| {
        request
            .topics
            .iter()
            .map(|topic| {
                let found = state.topic(&topic.topic);
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        let base = EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_leader_epoch(-1)
                            .with_end_offset(-1);
                        let partition = found.and_then(|t| t.partition(p.partition));
                        match partition {
                            None => base.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                            Some(_) if p.current_leader_epoch > LEADER_EPOCH => {
                                base.with_error_code(error_code::UNKNOWN_LEADER_EPOCH)
                            }
                            // Epochs above ours are unknown: undefined epoch and offset.
                            Some(_) if p.leader_epoch > LEADER_EPOCH => base,
                            Some(partition) => base
                                .with_leader_epoch(LEADER_EPOCH)
                                .with_end_offset(partition.stable_high_watermark),
                        }
                    })
                    .collect();
                OffsetForLeaderTopicResult::default()
                    .with_topic(topic.topic.clone())
                    .with_partitions(partitions)
            })
            .collect()
    });
    context.encode(&OffsetForLeaderEpochResponse::default().with_topics(topics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_common::FileId;
    use weir_control::IndexEntry;

    fn partition() -> PartitionState {
        let entry = |base: i64, last: i64, first_ts: i64, max_ts: i64| IndexEntry {
            base_offset: base,
            last_offset: last,
            file_id: FileId(1),
            byte_offset: 0,
            len: 1,
            first_timestamp: first_ts,
            max_timestamp: max_ts,
        };
        PartitionState {
            high_watermark: 6,
            stable_high_watermark: 6,
            index: vec![
                entry(0, 1, 100, 200),
                entry(2, 4, 300, 500),
                entry(5, 5, 400, 400),
            ],
            ..PartitionState::default()
        }
    }

    #[test]
    fn test_offsets_lookup_by_timestamp_and_specials() {
        let p = partition();
        assert_eq!(lookup(&p, LATEST), (6, -1));
        assert_eq!(lookup(&p, EARLIEST), (0, -1));
        assert_eq!(lookup(&p, 50), (0, 100));
        assert_eq!(lookup(&p, 300), (2, 300));
        assert_eq!(lookup(&p, 501), (-1, -1));
        assert_eq!(lookup(&p, MAX_TIMESTAMP), (4, 500));
    }
}
