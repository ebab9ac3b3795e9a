//! FindCoordinator v0–v5 (batched keys at v4+). A group's coordinator is the agent chosen by
//! hashing the group id over the live agents of the registry (`weir_groups::coordinator_for`).
//! Transactions do not exist yet, so transaction keys get COORDINATOR_NOT_AVAILABLE. Listing this API also matters
//! beyond groups: librdkafka only enables LZ4 for brokers that advertise FindCoordinator.

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use weir_protocol::error_code;

use super::text;
use crate::broker::Broker;
use crate::dispatch::RequestContext;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// Where a key's coordinator is, or why there is none.
struct Located {
    error_code: i16,
    message: Option<&'static str>,
    node_id: i32,
    host: String,
    port: i32,
}

fn locate(broker: &Broker, key_type: i8, key: &str) -> Located {
    let unavailable = |error_code, message| Located {
        error_code,
        message: Some(message),
        node_id: -1,
        host: String::new(),
        port: -1,
    };
    match key_type {
        KEY_TYPE_GROUP => {}
        KEY_TYPE_TRANSACTION => {
            return unavailable(
                error_code::COORDINATOR_NOT_AVAILABLE,
                "transactions are not available on this agent",
            )
        }
        _ => return unavailable(error_code::INVALID_REQUEST, "unknown coordinator key type"),
    }
    match broker.coordinator_of(key) {
        Some(agent) => Located {
            error_code: error_code::NONE,
            message: None,
            node_id: agent.node_id,
            host: agent.host,
            port: agent.port,
        },
        None => unavailable(
            error_code::COORDINATOR_NOT_AVAILABLE,
            "no agent is available to coordinate",
        ),
    }
}

pub(crate) fn find_coordinator(
    broker: &Broker,
    context: RequestContext,
    request: FindCoordinatorRequest,
) -> Option<Bytes> {
    let mut response = FindCoordinatorResponse::default();
    if context.version >= 4 {
        response.coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let located = locate(broker, request.key_type, &key);
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(located.node_id))
                    .with_host(text(located.host))
                    .with_port(located.port)
                    .with_error_code(located.error_code)
                    .with_error_message(located.message.map(text))
            })
            .collect();
    } else {
        let key_type = if context.version >= 1 {
            request.key_type
        } else {
            KEY_TYPE_GROUP
        };
        let located = locate(broker, key_type, &request.key);
        response.error_code = located.error_code;
        response.node_id = BrokerId(located.node_id);
        response.host = text(located.host);
        response.port = located.port;
        if context.version >= 1 {
            response.error_message = located.message.map(text);
        }
    }
    context.encode(&response)
}
