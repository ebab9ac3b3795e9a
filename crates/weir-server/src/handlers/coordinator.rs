//! FindCoordinator v0–v5. Consumer groups and transactions are not implemented yet, so every
//! key gets COORDINATOR_NOT_AVAILABLE, the retriable answer a Kafka broker gives while its
//! coordinator is loading. Listing the API matters beyond groups: librdkafka only enables LZ4
//! for brokers that advertise FindCoordinator.

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use weir_protocol::error_code;

use super::text;
use crate::dispatch::RequestContext;

const REASON: &str = "consumer groups and transactions are not available on this agent yet";

pub(crate) fn find_coordinator(
    context: RequestContext,
    request: FindCoordinatorRequest,
) -> Option<Bytes> {
    let mut response = FindCoordinatorResponse::default();
    if context.version >= 4 {
        response.coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(-1))
                    .with_port(-1)
                    .with_error_code(error_code::COORDINATOR_NOT_AVAILABLE)
                    .with_error_message(Some(text(REASON)))
            })
            .collect();
    } else {
        response.error_code = error_code::COORDINATOR_NOT_AVAILABLE;
        response.node_id = BrokerId(-1);
        response.port = -1;
        if context.version >= 1 {
            response.error_message = Some(text(REASON));
        }
    }
    context.encode(&response)
}
