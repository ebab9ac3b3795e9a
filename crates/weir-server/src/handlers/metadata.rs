//! Metadata v0–v12: brokers (every live agent, its zone as rack), topics with partitions and
//! topic ids, auto-create. Each partition's leader is an agent of the client's zone (RFC 0002
//! §6): `weir_az=`/`ws_az=` in its client id, else the rack an earlier Fetch on the connection
//! named (`client.rack`), else the answering agent's zone.

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
use crate::agents::{client_zone, LiveAgent};
use crate::broker::Broker;
use crate::dispatch::{Caller, RequestContext};

/// Sentinel for "authorized operations not requested".
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;

enum Wanted {
    Name(String),
    Id(Uuid),
}

pub(crate) async fn handle(
    broker: Arc<Broker>,
    context: RequestContext,
    caller: Caller,
    request: MetadataRequest,
) -> Option<Bytes> {
    let agents = broker.live_agents();
    let zone = client_zone(&caller.client_id)
        .map(str::to_string)
        .or(caller.fetch_rack)
        .or_else(|| broker.settings.rack.clone());
    let place = Placement {
        agents: &agents,
        zone: zone.as_deref(),
    };
    let wanted = wanted_topics(context.version, &request);
    let auto_create = broker.settings.auto_create_topics
        && (context.version < 4 || request.allow_auto_topic_creation);
    let mut topics = Vec::new();
    match wanted {
        None => {
            // Names, ids and partition counts only: never a partition's index under the lock.
            let all: Vec<TopicSummary> = broker.control.read(State::topic_summaries);
            topics.extend(all.iter().map(|topic| describe(&place, topic)));
        }
        Some(list) => {
            for item in list {
                topics.push(resolve(&broker, &place, item, auto_create).await);
            }
        }
    }
    let cluster_id = broker.control.read(|s| s.cluster_id.clone());
    let version = context.version;
    let mut response = MetadataResponse::default()
        .with_brokers(
            agents
                .iter()
                .map(|agent| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(agent.node_id))
                        .with_host(text(agent.host.clone()))
                        .with_port(agent.port)
                        .with_rack(agent.rack.clone().map(text))
                })
                .collect(),
        )
        .with_topics(topics)
        .with_cluster_authorized_operations(OPERATIONS_NOT_REQUESTED);
    if version >= 1 {
        response.controller_id = BrokerId(broker.controller(&agents));
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

async fn resolve(
    broker: &Broker,
    place: &Placement<'_>,
    wanted: Wanted,
    auto_create: bool,
) -> MetadataResponseTopic {
    let name = match wanted {
        Wanted::Id(id) => {
            let found = broker
                .control
                .read(|s| s.topic_by_id(&topic_id(id)).map(Topic::summary));
            return match found {
                Some(topic) => describe(place, &topic),
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
        return describe(place, &topic);
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
                Some(topic) => describe(place, &topic),
                None => error(error_code::UNKNOWN_TOPIC_OR_PARTITION),
            }
        }
        Err(err) => error(control_error_code(&err)),
    }
}

/// The agents partition leaders are chosen from, and the client's zone.
struct Placement<'a> {
    agents: &'a [LiveAgent],
    zone: Option<&'a str>,
}

fn describe(place: &Placement<'_>, topic: &TopicSummary) -> MetadataResponseTopic {
    let partitions = (0..topic.partitions as i32)
        .map(|index| {
            let node = BrokerId(Broker::partition_leader(
                place.agents,
                place.zone,
                topic.id,
                index,
            ));
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
