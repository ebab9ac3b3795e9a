//! DescribeConfigs v1–v4: every topic config with its effective value and source, and the
//! agent's broker configs.

use bytes::Bytes;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use weir_control::configs::{ConfigKey, ConfigKind, TOPIC_CONFIGS};
use weir_protocol::error_code;

use super::admin::{SOURCE_DEFAULT, SOURCE_TOPIC};
use super::text;
use crate::broker::{Broker, BrokerSettings};
use crate::dispatch::RequestContext;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SOURCE_STATIC_BROKER: i8 = 4;
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;

struct Described {
    name: String,
    value: String,
    source: i8,
    config_type: i8,
    doc: String,
}

pub(crate) fn describe_configs(
    broker: &Broker,
    context: RequestContext,
    request: DescribeConfigsRequest,
) -> Option<Bytes> {
    let results = request
        .resources
        .iter()
        .map(|resource| {
            let base = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            let name = resource.resource_name.to_string();
            let described = match resource.resource_type {
                RESOURCE_TOPIC => topic_configs(broker, &name),
                RESOURCE_BROKER
                    if name.is_empty() || name == broker.settings.node_id.to_string() =>
                {
                    Ok(broker_configs(broker))
                }
                RESOURCE_BROKER => registered_broker_configs(broker, &name).ok_or_else(|| {
                    (
                        error_code::INVALID_REQUEST,
                        format!("unknown broker {name}"),
                    )
                }),
                other => Err((
                    error_code::INVALID_REQUEST,
                    format!("resource type {other} is not supported"),
                )),
            };
            match described {
                Ok(configs) => {
                    let wanted = resource.configuration_keys.as_ref();
                    let configs = configs
                        .into_iter()
                        .filter(|c| {
                            wanted.is_none_or(|keys| keys.iter().any(|k| k.as_str() == c.name))
                        })
                        .map(|c| {
                            DescribeConfigsResourceResult::default()
                                .with_name(text(c.name))
                                .with_value(Some(text(c.value)))
                                .with_config_source(c.source)
                                .with_config_type(if context.version >= 3 {
                                    c.config_type
                                } else {
                                    0
                                })
                                .with_documentation(
                                    (context.version >= 3 && request.include_documentation)
                                        .then(|| text(c.doc)),
                                )
                        })
                        .collect();
                    base.with_configs(configs)
                }
                Err((code, message)) => base
                    .with_error_code(code)
                    .with_error_message(Some(text(message))),
            }
        })
        .collect();
    context.encode(&DescribeConfigsResponse::default().with_results(results))
}

fn topic_configs(broker: &Broker, name: &str) -> Result<Vec<Described>, (i16, String)> {
    let overrides = broker
        .control
        .read(|s| s.topic(name).map(|t| t.configs.clone()))
        .ok_or_else(|| {
            (
                error_code::UNKNOWN_TOPIC_OR_PARTITION,
                format!("unknown topic {name}"),
            )
        })?;
    Ok(TOPIC_CONFIGS
        .iter()
        .map(|config| {
            let (value, source) = match overrides.get(config.name) {
                Some(value) => (value.clone(), SOURCE_TOPIC),
                None => (default_value(&broker.settings, config), SOURCE_DEFAULT),
            };
            let config_type = match config.kind {
                ConfigKind::Long { .. } => TYPE_LONG,
                ConfigKind::Int { .. } => TYPE_INT,
                ConfigKind::Bool => TYPE_BOOLEAN,
                ConfigKind::OneOf(_) | ConfigKind::Text => TYPE_STRING,
            };
            Described {
                name: config.name.to_string(),
                value,
                source,
                config_type,
                doc: config.doc.to_string(),
            }
        })
        .collect())
}

/// The value of `config` on a topic that does not set it: the agent's retention defaults for
/// `retention.ms` / `retention.bytes` (what retention enforces there), else Kafka's default.
pub(crate) fn default_value(settings: &BrokerSettings, config: &ConfigKey) -> String {
    match config.name {
        "retention.ms" => settings.retention.ms.to_string(),
        "retention.bytes" => settings.retention.bytes.to_string(),
        _ => config.default.to_string(),
    }
}

fn broker_entry(name: &str, value: String, config_type: i8, doc: &str) -> Described {
    Described {
        name: name.to_string(),
        value,
        source: SOURCE_STATIC_BROKER,
        config_type,
        doc: doc.to_string(),
    }
}

/// Another agent of the cluster, as the registry in this agent's replica knows it: its id,
/// address and zone (its own settings are its own to answer).
fn registered_broker_configs(broker: &Broker, name: &str) -> Option<Vec<Described>> {
    let node_id: i32 = name.parse().ok()?;
    let agent = broker
        .live_agents()
        .into_iter()
        .find(|agent| agent.node_id == node_id)?;
    Some(vec![
        broker_entry(
            "broker.id",
            agent.node_id.to_string(),
            TYPE_INT,
            "Node id of the agent (from the cluster's registry).",
        ),
        broker_entry(
            "advertised.listeners",
            format!("PLAINTEXT://{}:{}", agent.host, agent.port),
            TYPE_STRING,
            "Address clients connect to (from the cluster's registry).",
        ),
        broker_entry(
            "broker.rack",
            agent.rack.unwrap_or_default(),
            TYPE_STRING,
            "Zone of the agent (from the cluster's registry).",
        ),
    ])
}

fn broker_configs(broker: &Broker) -> Vec<Described> {
    let settings = &broker.settings;
    let entry = broker_entry;
    vec![
        entry(
            "broker.id",
            settings.node_id.to_string(),
            TYPE_INT,
            "Node id this agent advertises.",
        ),
        entry(
            "broker.rack",
            settings.rack.clone().unwrap_or_default(),
            TYPE_STRING,
            "Zone of this agent (agent.rack, --zone).",
        ),
        entry(
            "advertised.listeners",
            format!(
                "PLAINTEXT://{}:{}",
                settings.advertised_host, settings.advertised_port
            ),
            TYPE_STRING,
            "Address clients connect to.",
        ),
        entry(
            "auto.create.topics.enable",
            settings.auto_create_topics.to_string(),
            TYPE_BOOLEAN,
            "Create unknown topics on Metadata requests.",
        ),
        entry(
            "num.partitions",
            settings.default_partitions.to_string(),
            TYPE_INT,
            "Partitions of auto-created topics and CreateTopics with -1.",
        ),
        entry(
            "default.replication.factor",
            "1".into(),
            TYPE_INT,
            "Reported only: durability comes from the object-store quorum.",
        ),
        entry(
            "socket.request.max.bytes",
            settings.max_frame_bytes.to_string(),
            TYPE_INT,
            "Largest request frame accepted.",
        ),
        entry(
            "message.max.bytes",
            "1048588".into(),
            TYPE_INT,
            "Default max.message.bytes of topics.",
        ),
        entry(
            "log.retention.ms",
            settings.retention.ms.to_string(),
            TYPE_LONG,
            "Default retention.ms of topics (retention.default_ms).",
        ),
        entry(
            "log.retention.bytes",
            settings.retention.bytes.to_string(),
            TYPE_LONG,
            "Default retention.bytes of topics (retention.default_bytes).",
        ),
        entry(
            "fetch.max.bytes",
            settings.max_fetch_bytes.to_string(),
            TYPE_INT,
            "Largest fetch response.",
        ),
    ]
}
