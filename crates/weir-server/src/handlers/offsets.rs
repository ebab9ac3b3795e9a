//! ListOffsets v1–v8 and OffsetForLeaderEpoch v2–v4.
//!
//! Timestamp lookups are exact at record precision, as in Kafka: the partition's index keeps a
//! running maximum of timestamps per chunk (`weir_control::ChunkedIndex::first_reaching`, a pass
//! over chunk maxima and a binary search under the state read lock), which names the first batch
//! whose max timestamp reaches the target; outside the lock that batch is read (cache or
//! bucket), decompressed if needed, and its records walked for the first one whose timestamp
//! reaches the target. The read is skipped when the batch's first record already does (the
//! common case of increasing timestamps) and on LogAppendTime topics (every record of a batch
//! has its max timestamp). Max-timestamp (-3) answers the first record holding the partition's
//! largest timestamp, found the same way.
//!
//! Only records at or above the log start are answers. DeleteRecords may put the start inside a
//! batch, which stays stored: its records below the start are skipped in the walk, and when none
//! of the others reaches the target the lookup continues with the batches after it.

use std::sync::Arc;

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
use tracing::warn;
use weir_common::{Tier, TopicId};
use weir_control::configs::{effective, MESSAGE_TIMESTAMP_TYPE};
use weir_control::{IndexEntry, PartitionState};
use weir_fetch::LEADER_EPOCH;
use weir_protocol::batch::split_and_validate;
use weir_protocol::{error_code, records};

use crate::broker::Broker;
use crate::dispatch::RequestContext;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// Weir has no tiered split: the earliest local offset is the earliest offset (KIP-1005).
const EARLIEST_LOCAL: i64 = -4;

/// The answer for one partition as far as the index can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// (offset, timestamp); (-1, -1) when nothing matches.
    Answer(i64, i64),
    /// The first record of this batch at or above `from_offset` with a timestamp at or past
    /// `target` is the answer; if there is none, it lies in the batches after this one.
    WalkBatch {
        entry: IndexEntry,
        target: i64,
        from_offset: i64,
    },
}

pub(crate) async fn list_offsets(
    broker: Arc<Broker>,
    context: RequestContext,
    request: ListOffsetsRequest,
) -> Option<Bytes> {
    broker.read_your_writes().await;
    // Under the state lock: index lookups only.
    let mut pending = Vec::new();
    let mut topics: Vec<ListOffsetsTopicResponse> = broker.control.read_served(|served| {
        let state = served.state();
        request
            .topics
            .iter()
            .enumerate()
            .map(|(topic_index, topic)| {
                let found = state.topic(&topic.name);
                let log_append_time = found.is_some_and(|t| {
                    effective(&t.configs, MESSAGE_TIMESTAMP_TYPE) == Some("LogAppendTime")
                });
                let partitions = topic
                    .partitions
                    .iter()
                    .enumerate()
                    .map(|(partition_index, p)| {
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
                        match (found, partition) {
                            (Some(t), Some(partition)) => {
                                // An ingest entry is one batch, whose records all carry its
                                // append time; a compacted run entry is walked.
                                let append_time_batch = |e: &IndexEntry| {
                                    log_append_time
                                        && state
                                            .files
                                            .get(&e.file_id)
                                            .is_none_or(|m| m.tier == Tier::Ingest)
                                };
                                // What fetch serves here: LATEST is where a consumer's next
                                // fetch finds the next record.
                                let high_watermark =
                                    served.high_watermark(&t.id, p.partition_index, partition);
                                match lookup(
                                    partition,
                                    high_watermark,
                                    p.timestamp,
                                    &append_time_batch,
                                ) {
                                    Lookup::Answer(offset, timestamp) => {
                                        base.with_offset(offset).with_timestamp(timestamp)
                                    }
                                    walk @ Lookup::WalkBatch { .. } => {
                                        pending.push((
                                            topic_index,
                                            partition_index,
                                            t.id,
                                            p.partition_index,
                                            walk,
                                        ));
                                        base
                                    }
                                }
                            }
                            _ => base.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(topic.name.clone())
                    .with_partitions(partitions)
            })
            .collect()
    });
    // Outside the lock: read and walk the batches that hold the answers.
    for (topic_index, partition_index, topic_id, partition, walk) in pending {
        let response = &mut topics[topic_index].partitions[partition_index];
        match resolve(&broker, &topic_id, partition, walk).await {
            Ok((offset, timestamp)) => {
                response.offset = offset;
                response.timestamp = timestamp;
            }
            Err(code) => response.error_code = code,
        }
    }
    context.encode(&ListOffsetsResponse::default().with_topics(topics))
}

/// Walks the batch a lookup named. When no record of it at or above the log start reaches the
/// target (a batch the start falls inside), looks again from the next batch: at most once more,
/// since no later batch straddles the start.
async fn resolve(
    broker: &Broker,
    topic_id: &TopicId,
    partition: i32,
    mut walk: Lookup,
) -> Result<(i64, i64), i16> {
    loop {
        let (entry, target, from_offset) = match walk {
            Lookup::Answer(offset, timestamp) => return Ok((offset, timestamp)),
            Lookup::WalkBatch {
                entry,
                target,
                from_offset,
            } => (entry, target, from_offset),
        };
        if let Some(found) =
            find_in_batch(broker, topic_id, partition, &entry, target, from_offset).await?
        {
            return Ok(found);
        }
        // Only CreateTime lookups walk (LogAppendTime answers from the index).
        walk = broker
            .control
            .read_served(|served| {
                let p = served.state().partition(topic_id, partition)?;
                let high_watermark = served.high_watermark(topic_id, partition, p);
                Some(lookup_from(
                    p,
                    high_watermark,
                    entry.last_offset + 1,
                    target,
                    &|_| false,
                ))
            })
            .ok_or(error_code::UNKNOWN_TOPIC_OR_PARTITION)?;
    }
}

/// What the index says for a ListOffsets target.
/// `append_time_batch`: whether an entry is one batch of a LogAppendTime topic (every record
/// has the batch's max timestamp), answered from the index without a read.
fn lookup(
    partition: &PartitionState,
    high_watermark: i64,
    target: i64,
    append_time_batch: &dyn Fn(&IndexEntry) -> bool,
) -> Lookup {
    lookup_from(
        partition,
        high_watermark,
        partition.log_start_offset,
        target,
        append_time_batch,
    )
}

/// `lookup` among the records at or above `start` (the log start, or past a batch already
/// walked) and below `high_watermark` (what this agent serves: the stable high watermark, or
/// past it over pending files it acknowledged).
fn lookup_from(
    partition: &PartitionState,
    high_watermark: i64,
    start: i64,
    target: i64,
    append_time_batch: &dyn Fn(&IndexEntry) -> bool,
) -> Lookup {
    let index = &partition.index;
    // Visible batches: those holding records from `start` up to the durable high watermark.
    let from = index.partition_point(|e| e.last_offset < start);
    let to = index.partition_point(|e| e.base_offset < high_watermark);
    let from = from.min(to);
    let answer_in = |entry: &IndexEntry, target: i64| {
        if append_time_batch(entry) {
            Lookup::Answer(entry.base_offset.max(start), entry.max_timestamp)
        } else if entry.first_timestamp >= target && entry.base_offset >= start {
            // The batch's first record (its timestamp is the batch's first timestamp) reaches
            // the target already.
            Lookup::Answer(entry.base_offset, entry.first_timestamp)
        } else {
            Lookup::WalkBatch {
                entry: *entry,
                target,
                from_offset: start,
            }
        }
    };
    match target {
        LATEST => Lookup::Answer(high_watermark, -1),
        EARLIEST | EARLIEST_LOCAL => Lookup::Answer(partition.log_start_offset, -1),
        // The largest timestamp of the visible batches (chunk maxima, and a scan only of the
        // partial chunks at the ends), then the first batch reaching it, which holds it.
        MAX_TIMESTAMP => index
            .max_timestamp_between(from, to)
            .map_or(Lookup::Answer(-1, -1), |(position, max)| {
                answer_in(&index[position], max)
            }),
        target if target >= 0 => index
            .first_reaching(from, target)
            .filter(|&position| position < to)
            .map_or(Lookup::Answer(-1, -1), |position| {
                answer_in(&index[position], target)
            }),
        _ => Lookup::Answer(-1, -1),
    }
}

/// Reads one index entry (a batch, or a compacted run of batches) and returns its first record
/// at or above `from_offset` whose timestamp reaches `target`, if any.
async fn find_in_batch(
    broker: &Broker,
    topic_id: &TopicId,
    partition: i32,
    entry: &IndexEntry,
    target: i64,
    from_offset: i64,
) -> Result<Option<(i64, i64)>, i16> {
    let plan = broker
        .fetch
        // Reads below the log start are refused; the batch holding the start is read from it.
        // The entry's length as the budget: the whole entry and nothing after it.
        .plan(
            topic_id,
            partition,
            entry.base_offset.max(from_offset),
            entry.len as usize,
            true,
        )
        .map_err(|_| error_code::UNKNOWN_TOPIC_OR_PARTITION)?;
    let data = broker.fetch.read(plan).await.map_err(|error| {
        warn!(%error, "list offsets: batch read failed");
        error_code::KAFKA_STORAGE_ERROR
    })?;
    let fallback = Some((entry.base_offset.max(from_offset), entry.max_timestamp));
    let Some(batches) = split_and_validate(&data.records.to_bytes())
        .ok()
        .filter(|batches| !batches.is_empty())
    else {
        warn!(
            base_offset = entry.base_offset,
            "list offsets: stored batch does not parse"
        );
        return Ok(fallback);
    };
    for batch in batches
        .iter()
        .filter(|b| b.header.base_offset <= entry.last_offset)
    {
        let header = &batch.header;
        let walked = records::decode(header, &batch.bytes, broker.settings.max_decompressed_bytes)
            .and_then(|section| {
                let mut found = None;
                records::walk(header, &section, |record| {
                    let timestamp = record.timestamp(header);
                    let offset = header.base_offset + i64::from(record.offset_delta);
                    if found.is_none() && offset >= from_offset && timestamp >= target {
                        found = Some((offset, timestamp));
                    }
                })?;
                Ok(found)
            });
        match walked {
            Ok(Some(found)) => return Ok(Some(found)),
            Ok(None) => {}
            Err(error) => {
                // Batches stored before record validation existed may not decode: answer at
                // batch precision rather than not at all.
                warn!(%error, base_offset = header.base_offset, "list offsets: batch records do not decode");
                return Ok(Some((
                    header.base_offset.max(from_offset),
                    header.max_timestamp,
                )));
            }
        }
    }
    Ok(None)
}

pub(crate) fn offset_for_leader_epoch(
    broker: &Broker,
    context: RequestContext,
    request: OffsetForLeaderEpochRequest,
) -> Option<Bytes> {
    let topics = broker.control.read_served(|served| {
        let state = served.state();
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
                        let partition = found.and_then(|t| Some((t.id, t.partition(p.partition)?)));
                        match partition {
                            None => base.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                            Some(_) if p.current_leader_epoch > LEADER_EPOCH => {
                                base.with_error_code(error_code::UNKNOWN_LEADER_EPOCH)
                            }
                            // Epochs above ours are unknown: undefined epoch and offset.
                            Some(_) if p.leader_epoch > LEADER_EPOCH => base,
                            // What fetch serves: a consumer validating a position it
                            // fetched to must not see it past the end (a truncation).
                            Some((topic_id, partition)) => {
                                base.with_leader_epoch(LEADER_EPOCH).with_end_offset(
                                    served.high_watermark(&topic_id, p.partition, partition),
                                )
                            }
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
            index: [
                entry(0, 1, 100, 200),
                entry(2, 4, 300, 500),
                entry(5, 5, 400, 400),
            ]
            .into_iter()
            .collect(),
            ..PartitionState::default()
        }
    }

    #[test]
    fn test_offsets_lookup_by_timestamp_and_specials() {
        let mut p = partition();
        assert_eq!(
            lookup(&p, p.stable_high_watermark, LATEST, &|_| false),
            Lookup::Answer(6, -1)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, EARLIEST, &|_| false),
            Lookup::Answer(0, -1)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 50, &|_| false),
            Lookup::Answer(0, 100)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 300, &|_| false),
            Lookup::Answer(2, 300)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 501, &|_| false),
            Lookup::Answer(-1, -1)
        );
        // Inside a batch: the batch must be read and walked.
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 350, &|_| false),
            Lookup::WalkBatch {
                entry: p.index[1],
                target: 350,
                from_offset: 0
            }
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, MAX_TIMESTAMP, &|_| false),
            Lookup::WalkBatch {
                entry: p.index[1],
                target: 500,
                from_offset: 0
            }
        );
        // LogAppendTime: every record of a batch carries its max timestamp.
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 350, &|_| true),
            Lookup::Answer(2, 500)
        );
        // Not yet durable batches are invisible.
        p.stable_high_watermark = 2;
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 350, &|_| false),
            Lookup::Answer(-1, -1)
        );
    }

    /// DeleteRecords put the log start at 3, inside the batch 2–4: only its records from 3 on
    /// are answers, so it is walked even where its first record would answer.
    #[test]
    fn test_offsets_lookup_skips_records_below_a_start_inside_a_batch() {
        let mut p = partition();
        p.log_start_offset = 3;
        let walk = |target| Lookup::WalkBatch {
            entry: p.index[1],
            target,
            from_offset: 3,
        };
        assert_eq!(
            lookup(&p, p.stable_high_watermark, EARLIEST, &|_| false),
            Lookup::Answer(3, -1)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 50, &|_| false),
            walk(50),
            "not the deleted batch 0-1"
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 300, &|_| false),
            walk(300),
            "not record 2"
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 350, &|_| false),
            walk(350)
        );
        assert_eq!(
            lookup(&p, p.stable_high_watermark, 350, &|_| true),
            Lookup::Answer(3, 500)
        );
        // After the straddling batch yields nothing: the batches after it.
        assert_eq!(
            lookup_from(&p, p.stable_high_watermark, 5, 350, &|_| false),
            Lookup::Answer(5, 400)
        );
        assert_eq!(
            lookup_from(&p, p.stable_high_watermark, 5, 450, &|_| false),
            Lookup::Answer(-1, -1)
        );
    }
}
