//! CreateTopics, DeleteTopics, CreatePartitions, DescribeCluster and InitProducerId.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};
use weir_control::configs::{self, validate_topic_name, TOPIC_CONFIGS};
use weir_control::state::MAX_PARTITIONS;
use weir_control::{ControlError, Entry, EntryResult};
use weir_protocol::error_code;

use super::configs::default_value;
use super::{control_error_code, text, topic_id, topic_name, uuid};
use crate::broker::Broker;
use crate::dispatch::{Caller, RequestContext};

/// Source code for a config set on the topic (DescribeConfigs / CreateTopics v5+).
pub(crate) const SOURCE_TOPIC: i8 = 1;
pub(crate) const SOURCE_DEFAULT: i8 = 5;

pub(crate) async fn create_topics(
    broker: Arc<Broker>,
    context: RequestContext,
    request: CreateTopicsRequest,
) -> Option<Bytes> {
    let mut seen = HashSet::new();
    let duplicated: HashSet<String> = request
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|name| !seen.insert(name.clone()))
        .collect();
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let result = if duplicated.contains(&name) {
            Err((
                error_code::INVALID_REQUEST,
                format!("topic {name} appears twice in the request"),
            ))
        } else {
            create_one(&broker, &topic, request.validate_only).await
        };
        let base = CreatableTopicResult::default()
            .with_name(topic_name(&name))
            .with_num_partitions(-1)
            .with_replication_factor(-1);
        let version = context.version;
        results.push(match result {
            Ok((id, _, _)) if version < 5 => {
                base.with_topic_id(id.filter(|_| version >= 7).map(uuid).unwrap_or_default())
            }
            Ok((id, partitions, overrides)) => base
                .with_topic_id(id.filter(|_| version >= 7).map(uuid).unwrap_or_default())
                .with_num_partitions(partitions)
                .with_replication_factor(1)
                .with_configs(Some(described_configs(&broker, &overrides))),
            Err((code, message)) => base
                .with_error_code(code)
                .with_error_message(Some(text(message))),
        });
    }
    context.encode(&CreateTopicsResponse::default().with_topics(results))
}

type Created = (Option<weir_common::TopicId>, i32, BTreeMap<String, String>);

async fn create_one(
    broker: &Broker,
    topic: &CreatableTopic,
    validate_only: bool,
) -> Result<Created, (i16, String)> {
    let name = topic.name.0.to_string();
    let fail = |err: ControlError| (control_error_code(&err), err.to_string());
    validate_topic_name(&name).map_err(fail)?;
    let partitions = if !topic.assignments.is_empty() {
        topic.assignments.len() as i32
    } else if topic.num_partitions == -1 {
        broker.settings.default_partitions
    } else {
        topic.num_partitions
    };
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err((
            error_code::INVALID_PARTITIONS,
            format!("invalid partition count {partitions}"),
        ));
    }
    if topic.replication_factor == 0 || topic.replication_factor < -1 {
        return Err((
            error_code::INVALID_REPLICATION_FACTOR,
            format!("invalid replication factor {}", topic.replication_factor),
        ));
    }
    let overrides: BTreeMap<String, String> = topic
        .configs
        .iter()
        .filter_map(|c| {
            c.value
                .as_ref()
                .map(|v| (c.name.to_string(), v.to_string()))
        })
        .collect();
    configs::validate(&overrides).map_err(fail)?;
    if validate_only {
        if broker.control.read(|s| s.topic(&name).is_some()) {
            return Err(fail(ControlError::TopicAlreadyExists(name)));
        }
        return Ok((None, partitions, overrides));
    }
    let id = broker
        .control
        .create_topic(&name, partitions, overrides.clone(), broker.next_seed())
        .await
        .map_err(fail)?;
    tracing::info!(topic = %name, partitions, "created topic");
    Ok((Some(id), partitions, overrides))
}

fn described_configs(
    broker: &Broker,
    overrides: &BTreeMap<String, String>,
) -> Vec<CreatableTopicConfigs> {
    TOPIC_CONFIGS
        .iter()
        .map(|config| {
            let (value, source) = match overrides.get(config.name) {
                Some(value) => (value.clone(), SOURCE_TOPIC),
                None => (default_value(&broker.settings, config), SOURCE_DEFAULT),
            };
            CreatableTopicConfigs::default()
                .with_name(text(config.name))
                .with_value(Some(text(value)))
                .with_config_source(source)
        })
        .collect()
}

pub(crate) async fn delete_topics(
    broker: Arc<Broker>,
    context: RequestContext,
    request: DeleteTopicsRequest,
) -> Option<Bytes> {
    // v6 names topics by name or id; earlier versions by name only.
    let targets: Vec<(Option<String>, uuid::Uuid)> = if context.version >= 6 {
        request
            .topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    let mut results = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        let resolved = broker.control.read(|s| match &name {
            Some(name) => s.topic(name).map(|t| (t.name.clone(), t.id)),
            None => s.topic_by_id(&topic_id(id)).map(|t| (t.name.clone(), t.id)),
        });
        let base = DeletableTopicResult::default()
            .with_name(name.as_deref().map(topic_name))
            .with_topic_id(id);
        let Some((found_name, found_id)) = resolved else {
            let code = if name.is_some() {
                error_code::UNKNOWN_TOPIC_OR_PARTITION
            } else {
                error_code::UNKNOWN_TOPIC_ID
            };
            results.push(base.with_error_code(code));
            continue;
        };
        let outcome = broker
            .control
            .submit(Entry::DeleteTopic {
                name: found_name.clone(),
            })
            .await;
        let shown_id = if context.version >= 6 {
            uuid(found_id)
        } else {
            uuid::Uuid::nil()
        };
        let result = base
            .with_name(Some(topic_name(&found_name)))
            .with_topic_id(shown_id);
        results.push(match outcome {
            Ok(EntryResult::DeleteTopic(Ok(()))) => {
                tracing::info!(topic = %found_name, "deleted topic");
                result
            }
            Ok(EntryResult::DeleteTopic(Err(err))) | Err(err) => result
                .with_error_code(control_error_code(&err))
                .with_error_message((context.version >= 5).then(|| text(err.to_string()))),
            Ok(_) => result.with_error_code(error_code::UNKNOWN_SERVER_ERROR),
        });
    }
    context.encode(&DeleteTopicsResponse::default().with_responses(results))
}

pub(crate) async fn create_partitions(
    broker: Arc<Broker>,
    context: RequestContext,
    request: CreatePartitionsRequest,
) -> Option<Bytes> {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let base = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        let current = broker
            .control
            .read(|s| s.topic(&name).map(|t| t.partitions.len() as i32));
        let outcome: Result<(), ControlError> = match current {
            None => Err(ControlError::UnknownTopicOrPartition(name.clone())),
            Some(current) if topic.count <= current || topic.count > MAX_PARTITIONS => {
                Err(ControlError::InvalidPartitions(format!(
                    "topic {name} has {current} partitions; {} is not a valid new total",
                    topic.count
                )))
            }
            Some(_) if request.validate_only => Ok(()),
            Some(_) => match broker
                .control
                .submit(Entry::CreatePartitions {
                    name: name.clone(),
                    total: topic.count,
                })
                .await
            {
                Ok(EntryResult::CreatePartitions(result)) => result,
                Ok(other) => Err(ControlError::Unavailable(format!("unexpected {other:?}"))),
                Err(err) => Err(err),
            },
        };
        results.push(match outcome {
            Ok(()) => base,
            Err(err) => base
                .with_error_code(control_error_code(&err))
                .with_error_message(Some(text(err.to_string()))),
        });
    }
    context.encode(&CreatePartitionsResponse::default().with_results(results))
}

pub(crate) fn describe_cluster(
    broker: &Broker,
    context: RequestContext,
    _request: DescribeClusterRequest,
) -> Option<Bytes> {
    let agents = broker.live_agents();
    let response = DescribeClusterResponse::default()
        .with_cluster_id(text(broker.control.read(|s| s.cluster_id.clone())))
        .with_controller_id(BrokerId(broker.controller(&agents)))
        .with_endpoint_type(1)
        .with_cluster_authorized_operations(i32::MIN)
        .with_brokers(
            agents
                .into_iter()
                .map(|agent| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(agent.node_id))
                        .with_host(text(agent.host))
                        .with_port(agent.port)
                        .with_rack(agent.rack.map(text))
                })
                .collect(),
        );
    context.encode(&response)
}

pub(crate) async fn init_producer_id(
    broker: Arc<Broker>,
    context: RequestContext,
    caller: Caller,
    request: InitProducerIdRequest,
) -> Option<Bytes> {
    let base = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if request.transactional_id.is_some() {
        return context.encode(&base.with_error_code(error_code::INVALID_REQUEST));
    }
    let existing =
        (request.producer_id.0 >= 0).then_some((request.producer_id.0, request.producer_epoch));
    // A bump of a known id adds no state; a new (or expired) id is admitted first.
    let (known, live_ids) = broker.control.read(|state| {
        (
            existing.is_some_and(|(id, _)| state.producer_epochs.contains_key(&id)),
            state.producer_epochs.len(),
        )
    });
    if !known {
        if let Err(throttle_ms) =
            broker
                .producer_admission
                .admit(&caller.client_id, broker.clock.now_ms(), live_ids)
        {
            tracing::debug!(
                client_id = %caller.client_id,
                throttle_ms,
                "InitProducerId throttled"
            );
            return context.encode(
                &base
                    .with_error_code(error_code::THROTTLING_QUOTA_EXCEEDED)
                    .with_throttle_time_ms(throttle_ms),
            );
        }
    }
    let response = match broker
        .control
        .submit(Entry::init_producer_id(existing, broker.clock.now_ms()))
        .await
    {
        Ok(EntryResult::InitProducerId(Ok((producer_id, epoch)))) => base
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch),
        Ok(EntryResult::InitProducerId(Err(err))) | Err(err) => {
            base.with_error_code(control_error_code(&err))
        }
        Ok(_) => base.with_error_code(error_code::UNKNOWN_SERVER_ERROR),
    };
    context.encode(&response)
}
