//! Metadata v0–v12: brokers (this agent), topics with partitions and topic ids, auto-create.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse};
use uuid::Uuid;
use weir_control::configs::validate_topic_name;
use weir_control::{ControlError, State, Topic, TopicSummary};
use weir_protocol::error_code;

use super::{control_error_code, text, topic_id, topic_name, uuid};
use crate::broker::Broker;
use crate::dispatch::RequestContext;

/// Sentinel for "authorized operations not requested".
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;

enum Wanted {
    Name(String),
    Id(Uuid),
}

pub(crate) async fn handle(
    broker: Arc<Broker>,
    context: RequestContext,
    request: MetadataRequest,
) -> Option<Bytes> {
    let wanted = wanted_topics(context.version, &request);
    let auto_create = broker.settings.auto_create_topics
        && (context.version < 4 || request.allow_auto_topic_creation);
    let mut topics = Vec::new();
    match wanted {
        None => {
            // Names, ids and partition counts only: never a partition's index under the lock.
            let all: Vec<TopicSummary> = broker.control.read(State::topic_summaries);
            topics.extend(all.iter().map(|topic| describe(&broker, topic)));
        }
        Some(list) => {
            for item in list {
                topics.push(resolve(&broker, item, auto_create).await);
            }
        }
    }
    let settings = &broker.settings;
    let cluster_id = broker.control.read(|s| s.cluster_id.clone());
    let version = context.version;
    let mut response = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(settings.node_id))
            .with_host(text(settings.advertised_host.clone()))
            .with_port(settings.advertised_port)
            .with_rack(settings.rack.clone().map(text))])
        .with_topics(topics)
        .with_cluster_authorized_operations(OPERATIONS_NOT_REQUESTED);
    if version >= 1 {
        response.controller_id = BrokerId(settings.node_id);
    }
    if version >= 2 {
        response.cluster_id = Some(text(cluster_id));
    }
    for topic in &mut response.topics {
        if version < 10 {
            topic.topic_id = Uuid::nil();
        }
        if version < 7 {
            for partition in &mut topic.partitions {
                partition.leader_epoch = -1;
            }
        }
    }
    context.encode(&response)
}

/// `None` means every topic. v0 sends an empty array for "all"; v1+ sends null.
fn wanted_topics(version: i16, request: &MetadataRequest) -> Option<Vec<Wanted>> {
    let list = request.topics.as_ref()?;
    if version == 0 && list.is_empty() {
        return None;
    }
    Some(
        list.iter()
            .map(|topic| match &topic.name {
                Some(name) => Wanted::Name(name.0.to_string()),
                None => Wanted::Id(topic.topic_id),
            })
            .collect(),
    )
}

async fn resolve(broker: &Broker, wanted: Wanted, auto_create: bool) -> MetadataResponseTopic {
    let name = match wanted {
        Wanted::Id(id) => {
            let found = broker
                .control
                .read(|s| s.topic_by_id(&topic_id(id)).map(Topic::summary));
            return match found {
                Some(topic) => describe(broker, &topic),
                None => MetadataResponseTopic::default()
                    .with_topic_id(id)
                    .with_error_code(error_code::UNKNOWN_TOPIC_ID)
                    .with_topic_authorized_operations(OPERATIONS_NOT_REQUESTED),
            };
        }
        Wanted::Name(name) => name,
    };
    let error = |code: i16| {
        MetadataResponseTopic::default()
            .with_name(Some(topic_name(&name)))
            .with_error_code(code)
            .with_topic_authorized_operations(OPERATIONS_NOT_REQUESTED)
    };
    if validate_topic_name(&name).is_err() {
        return error(error_code::INVALID_TOPIC_EXCEPTION);
    }
    if let Some(topic) = broker.control.read(|s| s.topic(&name).map(Topic::summary)) {
        return describe(broker, &topic);
    }
    if !auto_create {
        return error(error_code::UNKNOWN_TOPIC_OR_PARTITION);
    }
    let created = broker
        .control
        .create_topic(
            &name,
            broker.settings.default_partitions,
            BTreeMap::new(),
            broker.next_seed(),
        )
        .await;
    match created {
        Ok(_) | Err(ControlError::TopicAlreadyExists(_)) => {
            tracing::info!(topic = %name, "auto-created topic");
            match broker.control.read(|s| s.topic(&name).map(Topic::summary)) {
                Some(topic) => describe(broker, &topic),
                None => error(error_code::UNKNOWN_TOPIC_OR_PARTITION),
            }
        }
        Err(err) => error(control_error_code(&err)),
    }
}

fn describe(broker: &Broker, topic: &TopicSummary) -> MetadataResponseTopic {
    let node = BrokerId(broker.settings.node_id);
    let partitions = (0..topic.partitions as i32)
        .map(|index| {
            MetadataResponsePartition::default()
                .with_partition_index(index)
                .with_leader_id(node)
                .with_leader_epoch(weir_fetch::LEADER_EPOCH)
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(topic_name(&topic.name)))
        .with_topic_id(uuid(topic.id))
        .with_partitions(partitions)
        .with_topic_authorized_operations(OPERATIONS_NOT_REQUESTED)
}
