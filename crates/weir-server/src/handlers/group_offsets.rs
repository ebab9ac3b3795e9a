//! OffsetCommit v2–v9, OffsetFetch v1–v9 (several groups at v8+) and OffsetDelete v0.
//!
//! Committed offsets are control-plane state: a commit is validated by the coordinator (member
//! and generation) and sequenced as one `CommitOffsets` entry in one step, then answered once
//! durable.
//! Fetches read the control-plane state directly.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse,
};
use weir_control::{CommittedOffset, ControlError, Entry, EntryResult, OffsetCommit, State};
use weir_groups::{CommitIdentity, GroupError};
use weir_protocol::error_code;

use super::{control_error_code, group_error_code, text, topic_name};
use crate::broker::Broker;
use crate::dispatch::RequestContext;

pub(crate) async fn offset_commit(
    broker: Arc<Broker>,
    context: RequestContext,
    request: OffsetCommitRequest,
) -> Option<Bytes> {
    let version = context.version;
    let group_id = request.group_id.0.to_string();
    let offsets: Vec<OffsetCommit> = request
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(|partition| OffsetCommit {
                topic: topic.name.0.to_string(),
                partition: partition.partition_index,
                offset: partition.committed_offset,
                leader_epoch: if version >= 6 {
                    partition.committed_leader_epoch
                } else {
                    -1
                },
                metadata: partition.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let codes = commit_codes(&broker, &request, group_id, &offsets).await;
    let mut codes = codes.into_iter();
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let partitions = topic
                .partitions
                .iter()
                .map(|partition| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(partition.partition_index)
                        .with_error_code(codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    context.encode(&OffsetCommitResponse::default().with_topics(topics))
}

/// One error code per offset, in request order.
async fn commit_codes(
    broker: &Broker,
    request: &OffsetCommitRequest,
    group_id: String,
    offsets: &[OffsetCommit],
) -> Vec<i16> {
    let everyone = |code: i16| vec![code; offsets.len()];
    if group_id.is_empty() {
        return everyone(error_code::INVALID_GROUP_ID);
    }
    let Some(coordinator) = broker.coordination(&group_id) else {
        return everyone(error_code::NOT_COORDINATOR);
    };
    let identity = CommitIdentity {
        group_id: group_id.clone(),
        generation_id: request.generation_id_or_member_epoch,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|id| id.to_string()),
    };
    let entry = Entry::CommitOffsets {
        group: group_id,
        offsets: offsets.to_vec(),
        at_ms: broker.clock.now_ms(),
        coordinator,
    };
    let reservation = match broker.control.reserve().await {
        Ok(reservation) => reservation,
        Err(error) => return everyone(control_error_code(&error)),
    };
    // Validation and sequencing happen under the coordinator's lock: a rebalance cannot end the
    // generation in between, so a zombie's commit never lands after the new generation's.
    let pending = match broker
        .groups
        .validate_commit_then(&identity, || reservation.enqueue(entry))
    {
        Ok(pending) => pending,
        Err(error) => return everyone(group_error_code(&error)),
    };
    match pending.await {
        Ok(EntryResult::CommitOffsets(results)) => {
            if let Some(Err(ControlError::NotCoordinator(why))) = results.first() {
                // The coordinator fence: another agent coordinated the group meanwhile.
                broker.lost_group(&identity.group_id, why);
            }
            results
                .iter()
                .map(|result| {
                    result
                        .as_ref()
                        .err()
                        .map_or(error_code::NONE, control_error_code)
                })
                .collect()
        }
        Ok(_) => everyone(error_code::UNKNOWN_SERVER_ERROR),
        Err(error) => everyone(control_error_code(&error)),
    }
}

/// Wanted partitions of one group: `None` means every committed offset of the group.
type Wanted = Option<Vec<(String, Vec<i32>)>>;

/// (topic, [(partition, committed offset or none)]) for one group, in request order.
type Fetched = Vec<(String, Vec<(i32, Option<CommittedOffset>)>)>;

fn fetch_group(state: &State, group_id: &str, wanted: &Wanted) -> Fetched {
    match wanted {
        Some(topics) => topics
            .iter()
            .map(|(topic, partitions)| {
                let found = partitions
                    .iter()
                    .map(|p| (*p, state.committed_offset(group_id, topic, *p).cloned()))
                    .collect();
                (topic.clone(), found)
            })
            .collect(),
        None => state
            .group_offsets
            .get(group_id)
            .map(|topics| {
                topics
                    .iter()
                    .map(|(topic, partitions)| {
                        let found = partitions
                            .iter()
                            .map(|(p, committed)| (*p, Some(committed.clone())))
                            .collect();
                        (topic.clone(), found)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// (offset, leader epoch, metadata) as OffsetFetch reports them; −1 and "" when none.
fn reported(committed: Option<CommittedOffset>, version: i16) -> (i64, i32, String) {
    match committed {
        Some(c) => (
            c.offset,
            if version >= 5 { c.leader_epoch } else { -1 },
            c.metadata.unwrap_or_default(),
        ),
        None => (-1, -1, String::new()),
    }
}

pub(crate) fn offset_fetch(
    broker: &Broker,
    context: RequestContext,
    request: OffsetFetchRequest,
) -> Option<Bytes> {
    let version = context.version;
    if version >= 8 {
        let groups = request
            .groups
            .into_iter()
            .map(|group| {
                let wanted: Wanted = group.topics.map(|topics| {
                    topics
                        .into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                fetch_group_v8(broker, version, group.group_id, &wanted)
            })
            .collect();
        return context.encode(&OffsetFetchResponse::default().with_groups(groups));
    }
    let group_id = request.group_id.0.to_string();
    let wanted: Wanted = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let (fetched, group_code) = if broker.coordinates(&group_id) {
        (
            broker.control.read(|s| fetch_group(s, &group_id, &wanted)),
            error_code::NONE,
        )
    } else {
        (Vec::new(), error_code::NOT_COORDINATOR)
    };
    let topics = fetched
        .into_iter()
        .map(|(topic, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, committed)| {
                    let (offset, epoch, metadata) = reported(committed, version);
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(epoch)
                        .with_metadata(Some(text(metadata)))
                        .with_error_code(group_code)
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(topic_name(&topic))
                .with_partitions(partitions)
        })
        .collect();
    let mut response = OffsetFetchResponse::default().with_topics(topics);
    if version >= 2 {
        response.error_code = group_code;
    }
    context.encode(&response)
}

fn fetch_group_v8(
    broker: &Broker,
    version: i16,
    group_id: GroupId,
    wanted: &Wanted,
) -> OffsetFetchResponseGroup {
    let id = group_id.0.to_string();
    if !broker.coordinates(&id) {
        return OffsetFetchResponseGroup::default()
            .with_group_id(group_id)
            .with_error_code(error_code::NOT_COORDINATOR);
    }
    let fetched = broker.control.read(|s| fetch_group(s, &id, wanted));
    let topics = fetched
        .into_iter()
        .map(|(topic, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, committed)| {
                    let (offset, epoch, metadata) = reported(committed, version);
                    OffsetFetchResponsePartitions::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(epoch)
                        .with_metadata(Some(text(metadata)))
                })
                .collect();
            OffsetFetchResponseTopics::default()
                .with_name(topic_name(&topic))
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponseGroup::default()
        .with_group_id(group_id)
        .with_topics(topics)
}

pub(crate) async fn offset_delete(
    broker: Arc<Broker>,
    context: RequestContext,
    request: OffsetDeleteRequest,
) -> Option<Bytes> {
    let group_id = request.group_id.0.to_string();
    let failed = |code: i16| context.encode(&OffsetDeleteResponse::default().with_error_code(code));
    let Some(coordinator) = broker.coordination(&group_id) else {
        return failed(error_code::NOT_COORDINATOR);
    };
    let protected = match broker.groups.offset_delete_guard(&group_id) {
        Ok(protected) => protected.unwrap_or_default(),
        Err(error) => return failed(group_error_code(&error)),
    };
    let known_group = broker.groups.describe(&group_id).is_some()
        || broker
            .control
            .read(|s| s.group_offsets.contains_key(&group_id));
    if !known_group {
        return failed(group_error_code(&GroupError::GroupIdNotFound(group_id)));
    }
    // Per partition: refused (subscribed topic, unknown topic) or deleted.
    let mut codes: BTreeMap<(String, i32), i16> = BTreeMap::new();
    let mut deletable = Vec::new();
    for topic in &request.topics {
        let name = topic.name.0.to_string();
        let partition_count = broker
            .control
            .read(|s| s.topic(&name).map(|t| t.partitions.len()));
        for partition in &topic.partitions {
            let index = partition.partition_index;
            let exists = partition_count
                .is_some_and(|count| usize::try_from(index).is_ok_and(|i| i < count));
            let code = if protected.contains(&name) {
                error_code::GROUP_SUBSCRIBED_TO_TOPIC
            } else if !exists {
                error_code::UNKNOWN_TOPIC_OR_PARTITION
            } else {
                deletable.push((name.clone(), index));
                error_code::NONE
            };
            codes.insert((name.clone(), index), code);
        }
    }
    if !deletable.is_empty() {
        let entry = Entry::DeleteGroupOffsets {
            group: group_id.clone(),
            partitions: deletable,
            coordinator,
        };
        match broker.control.submit(entry).await {
            Ok(EntryResult::DeleteGroupOffsets(Ok(()))) => {}
            Ok(EntryResult::DeleteGroupOffsets(Err(error))) | Err(error) => {
                if let ControlError::NotCoordinator(why) = &error {
                    broker.lost_group(&group_id, why);
                }
                return failed(control_error_code(&error));
            }
            Ok(_) => return failed(control_error_code(&ControlError::Unavailable("".into()))),
        }
    }
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    OffsetDeleteResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(codes[&(name.clone(), p.partition_index)])
                })
                .collect();
            OffsetDeleteResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    context.encode(&OffsetDeleteResponse::default().with_topics(topics))
}
