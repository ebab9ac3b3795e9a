//! Fetch v4–v16 with long-poll: answer as soon as `min_bytes` are available or `max_wait_ms`
//! passes, woken by durable commits and by files this agent acknowledges. Weir hands out no
//! fetch sessions (session id 0), so every fetch is a full fetch, which KIP-227 allows.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse};
use tokio::time::Instant;
use tracing::debug;
use uuid::Uuid;
use weir_common::TopicId;
use weir_fetch::{FetchError, ReadPlan};
use weir_protocol::error_code;
use weir_protocol::record_set::RecordSet;
use weir_protocol::response::Frame;

use super::{topic_id, topic_name};
use crate::broker::Broker;
use crate::dispatch::RequestContext;
use crate::memory::Grant;

/// Error for an incremental fetch session we never created.
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

struct Wanted {
    name: String,
    id: Uuid,
    /// `None` when the topic is unknown.
    resolved: Option<TopicId>,
    /// The topic's name in the state (requests from v13 on name topics by id only), for the
    /// per-topic metrics.
    resolved_name: Option<String>,
    partitions: Vec<(i32, i64, usize)>,
}

pub(crate) async fn handle(
    broker: Arc<Broker>,
    context: RequestContext,
    request: FetchRequest,
) -> Option<Frame> {
    if request.session_id != 0 {
        let response = FetchResponse::default().with_error_code(FETCH_SESSION_ID_NOT_FOUND);
        return context.encode_fetch(&response, &[]);
    }
    let wanted = resolve(&broker, context.version, &request);
    let max_bytes = usize::try_from(request.max_bytes.max(0))
        .unwrap_or(0)
        .min(broker.settings.max_fetch_bytes);
    let min_bytes = usize::try_from(request.min_bytes.max(0)).unwrap_or(0);
    let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64)
        .min(broker.settings.max_fetch_wait);
    let deadline = Instant::now() + wait;
    let mut commits = broker.control.subscribe_served();
    loop {
        commits.mark_seen();
        let read = read_all(&broker, &wanted, max_bytes, context.version).await;
        // A follower's replica trails the leader by moments (RFC 0002 §3): an offset above its
        // high watermark may be one the leader already acknowledged, so it waits (within the
        // fetch's wait) for its replica before answering OFFSET_OUT_OF_RANGE.
        let catching_up = read.above_high_watermark
            && matches!(
                *broker.control.role().borrow(),
                weir_control::plane::Role::Follower { .. }
            );
        // min_bytes = 0 answers at once, with or without data (as in Kafka).
        let answer = (read.bytes >= min_bytes || read.errors) && !catching_up;
        if answer || Instant::now() >= deadline {
            return respond(&broker, &context, &wanted, read);
        }
        // Too little: return its memory, wait for a durable commit (or the deadline), read again.
        drop(read);
        if tokio::time::timeout_at(deadline, commits.changed())
            .await
            .is_err()
        {
            let read = read_all(&broker, &wanted, max_bytes, context.version).await;
            return respond(&broker, &context, &wanted, read);
        }
    }
}

/// Encodes the response. The record sets' pieces go into the frame as they were read (not
/// copied again), and the frame keeps the read's memory grant until the connection has written
/// it: the grant becomes what the frame keeps alive, which is the response's own fields, the
/// record sets' copies and the buffers their slices point into (at most about twice the
/// records, see `weir_fetch`'s `assemble`).
fn respond(
    broker: &Broker,
    context: &RequestContext,
    wanted: &[Wanted],
    read: Read,
) -> Option<Frame> {
    let Read {
        topics,
        record_sets,
        mut grant,
        ..
    } = read;
    count_fetched(broker, wanted, &topics, &record_sets);
    let response = FetchResponse::default().with_responses(topics);
    let mut frame = context.encode_fetch(&response, &record_sets)?;
    let records: usize = record_sets.iter().map(RecordSet::len).sum();
    let pinned: usize = record_sets.iter().map(RecordSet::pinned).sum();
    // A response without records is a few bytes of fields, charged nothing.
    let held = if records == 0 {
        0
    } else {
        frame.len().saturating_sub(records) + pinned
    };
    grant.resize(held);
    frame.hold(grant);
    Some(frame)
}

/// Counts the records and bytes a response returns, by topic (`weir_fetched_*`). The response
/// has one topic per wanted topic and one record set per partition, in order (`read_all`).
fn count_fetched(
    broker: &Broker,
    wanted: &[Wanted],
    topics: &[FetchableTopicResponse],
    record_sets: &[RecordSet],
) {
    let mut sets = record_sets.iter();
    for (want, topic) in wanted.iter().zip(topics) {
        let (records, bytes) = sets
            .by_ref()
            .take(topic.partitions.len())
            .fold((0, 0), |(r, b), set| {
                (r + set.records(), b + set.len() as u64)
            });
        let Some(name) = &want.resolved_name else {
            continue;
        };
        if bytes > 0 {
            broker.metrics.fetched(name, records, bytes);
        }
    }
}

fn resolve(broker: &Broker, version: i16, request: &FetchRequest) -> Vec<Wanted> {
    broker.control.read(|state| {
        request
            .topics
            .iter()
            .map(|topic| {
                let found = if version >= 13 {
                    state.topic_by_id(&topic_id(topic.topic_id))
                } else {
                    state.topic(&topic.topic)
                };
                Wanted {
                    name: topic.topic.0.to_string(),
                    id: topic.topic_id,
                    resolved: found.map(|t| t.id),
                    resolved_name: found.map(|t| t.name.clone()),
                    partitions: topic
                        .partitions
                        .iter()
                        .map(|p| {
                            (
                                p.partition,
                                p.fetch_offset,
                                usize::try_from(p.partition_max_bytes.max(0)).unwrap_or(0),
                            )
                        })
                        .collect(),
                }
            })
            .collect()
    })
}

/// What one pass over the wanted partitions read.
struct Read {
    /// The response's topics, each partition's `records` an empty placeholder for its set.
    topics: Vec<FetchableTopicResponse>,
    /// One record set per partition of `topics`, in order.
    record_sets: Vec<RecordSet>,
    /// Record bytes gathered.
    bytes: usize,
    /// Whether any partition has an error (which ends long-polling, as in Kafka).
    errors: bool,
    /// Whether a partition's fetch offset is above its high watermark.
    above_high_watermark: bool,
    /// The response memory these records hold.
    grant: Grant,
}

/// Reads every wanted partition within the byte budgets.
///
/// Budgets are settled on the plans (exact byte counts, under the state lock); the reads of all
/// partitions then run concurrently, so a fetch over many partitions pays one storage round trip.
///
/// The records, and then the encoded frame, are held in memory until the client has read the
/// response, so they come out of the agent-wide response budget: a fetch reads at most half of
/// what it could take from it (its batches may pin buffers up to twice their size), but always
/// its first batch, even when the budget is used up by responses that clients are not reading.
async fn read_all(broker: &Broker, wanted: &[Wanted], max_bytes: usize, version: i16) -> Read {
    let mut grant = broker.fetch_memory.take_up_to(max_bytes.saturating_mul(2));
    let (mut plans, mut planned) = plan_all(broker, wanted, grant.bytes() / 2, true);
    if grant.bytes() / 2 < max_bytes && planned >= grant.bytes() / 2 {
        debug!(
            planned,
            max_bytes,
            in_use = broker.fetch_memory.used(),
            capacity = broker.fetch_memory.capacity(),
            "fetch response budget used up: reading fewer bytes"
        );
    }
    // Return what the plans do not need, or take a first batch that did not fit, within the
    // agent-wide bound on first batches; past it, read no records now (the caller long-polls).
    if !grant.try_resize_first_batch(planned.saturating_mul(2)) {
        debug!(
            planned,
            in_use = broker.fetch_memory.used(),
            "fetch response budget used up by first batches: reading no records this time"
        );
        (plans, planned) = plan_all(broker, wanted, 0, false);
        grant.resize(planned);
    }
    let reads = futures::future::join_all(plans.into_iter().map(|plan| async move {
        match plan {
            None => None,
            Some(Ok(plan)) => Some(broker.fetch.read(plan).await),
            Some(Err(err)) => Some(Err(err)),
        }
    }))
    .await;
    let mut reads = reads.into_iter();
    let mut total = 0usize;
    let mut any_error = false;
    let mut above_high_watermark = false;
    let mut topics = Vec::with_capacity(wanted.len());
    let mut record_sets = Vec::new();
    for topic in wanted {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (partition, _, _) in &topic.partitions {
            let base = PartitionData::default()
                .with_partition_index(*partition)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_high_watermark(-1)
                .with_preferred_read_replica(BrokerId(-1))
                .with_records(Some(Bytes::new()));
            let data = match reads.next().flatten() {
                None => {
                    any_error = true;
                    let code = if version >= 13 {
                        error_code::UNKNOWN_TOPIC_ID
                    } else {
                        error_code::UNKNOWN_TOPIC_OR_PARTITION
                    };
                    record_sets.push(RecordSet::default());
                    base.with_error_code(code)
                }
                Some(Ok(data)) => {
                    total += data.records.len();
                    record_sets.push(data.records);
                    base.with_high_watermark(data.high_watermark)
                        .with_last_stable_offset(data.high_watermark)
                        .with_log_start_offset(data.log_start_offset)
                }
                Some(Err(err)) => {
                    any_error = true;
                    above_high_watermark |= matches!(
                        err,
                        FetchError::OffsetOutOfRange { offset, high_watermark, .. }
                            if offset > high_watermark
                    );
                    record_sets.push(RecordSet::default());
                    base.with_error_code(fetch_error_code(&err))
                }
            };
            partitions.push(data);
        }
        if version < 5 {
            for partition in &mut partitions {
                partition.log_start_offset = -1;
            }
        }
        let response = FetchableTopicResponse::default().with_partitions(partitions);
        topics.push(if version >= 13 {
            response.with_topic_id(topic.id)
        } else {
            response.with_topic(topic_name(&topic.name))
        });
    }
    Read {
        topics,
        record_sets,
        bytes: total,
        errors: any_error,
        above_high_watermark,
        grant,
    }
}

type Plans = Vec<Option<Result<ReadPlan, FetchError>>>;

/// Plans every wanted partition within `budget` bytes in all (`None` for an unknown topic);
/// with `first_batch`, the first partition with data gets its first batch whatever its size.
fn plan_all(
    broker: &Broker,
    wanted: &[Wanted],
    budget: usize,
    first_batch: bool,
) -> (Plans, usize) {
    let mut remaining = budget;
    let mut planned = 0usize;
    let mut plans = Vec::new();
    for topic in wanted {
        for (partition, offset, partition_max) in &topic.partitions {
            let plan = topic.resolved.map(|resolved| {
                let partition_budget = (*partition_max).min(remaining);
                let first = first_batch && planned == 0;
                let plan =
                    broker
                        .fetch
                        .plan(&resolved, *partition, *offset, partition_budget, first);
                if let Ok(plan) = &plan {
                    planned += plan.byte_len();
                    remaining = remaining.saturating_sub(plan.byte_len());
                }
                plan
            });
            plans.push(plan);
        }
    }
    (plans, planned)
}

fn fetch_error_code(error: &FetchError) -> i16 {
    match error {
        FetchError::UnknownTopicOrPartition => error_code::UNKNOWN_TOPIC_OR_PARTITION,
        FetchError::OffsetOutOfRange { .. } => error_code::OFFSET_OUT_OF_RANGE,
        FetchError::Storage(_) | FetchError::PlanExpired(_) => error_code::KAFKA_STORAGE_ERROR,
    }
}
