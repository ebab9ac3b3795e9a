//! Request routing: version checks, header and body decoding, and the handler per API.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind};
use kafka_protocol::protocol::Encodable;
use tracing::error;
use weir_protocol::frame::{decode_request_header, encode_response, peek_request};
use weir_protocol::versions::is_supported;

use crate::broker::Broker;
use crate::handlers;

pub(crate) type ResponseFuture = Pin<Box<dyn Future<Output = Option<Bytes>> + Send + 'static>>;

pub(crate) enum Dispatched {
    /// The response (or `None` for acks=0), produced in the background.
    Respond(ResponseFuture),
    /// The request cannot be answered in a way the client understands: close the connection.
    Close(String),
}

/// Identifies a request for encoding its response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestContext {
    pub(crate) api_key: ApiKey,
    pub(crate) version: i16,
    pub(crate) correlation_id: i32,
}

impl RequestContext {
    /// Encodes `body` as this request's response frame.
    pub(crate) fn encode<M: Encodable>(&self, body: &M) -> Option<Bytes> {
        let header_version = self.api_key.response_header_version(self.version);
        match encode_response(self.correlation_id, header_version, body, self.version) {
            Ok(bytes) => Some(bytes),
            Err(err) => {
                error!(api = ?self.api_key, version = self.version, error = %err, "response encoding failed");
                None
            }
        }
    }
}

pub(crate) fn ready(response: Option<Bytes>) -> Dispatched {
    Dispatched::Respond(Box::pin(std::future::ready(response)))
}

pub(crate) async fn dispatch(broker: &Arc<Broker>, mut frame: Bytes) -> Dispatched {
    let prefix = match peek_request(&frame) {
        Ok(prefix) => prefix,
        Err(err) => return Dispatched::Close(err.to_string()),
    };
    let Ok(api_key) = ApiKey::try_from(prefix.api_key) else {
        return Dispatched::Close(format!("unknown api key {}", prefix.api_key));
    };
    let version = prefix.api_version;
    let context = RequestContext {
        api_key,
        version,
        correlation_id: prefix.correlation_id,
    };
    if !is_supported(api_key, version) {
        if api_key == ApiKey::ApiVersions {
            return ready(handlers::api_versions::unsupported(context));
        }
        return Dispatched::Close(format!("unsupported version {version} of {api_key:?}"));
    }
    if let Err(err) = decode_request_header(&mut frame, api_key, version) {
        return Dispatched::Close(err.to_string());
    }
    let request = match RequestKind::decode(api_key, &mut frame, version) {
        Ok(request) => request,
        Err(err) => return Dispatched::Close(format!("malformed {api_key:?} v{version}: {err}")),
    };
    route(broker, context, request).await
}

async fn route(broker: &Arc<Broker>, context: RequestContext, request: RequestKind) -> Dispatched {
    use handlers::*;
    let broker = broker.clone();
    match request {
        RequestKind::ApiVersions(_) => ready(api_versions::handle(context)),
        RequestKind::FindCoordinator(request) => {
            ready(coordinator::find_coordinator(context, request))
        }
        RequestKind::Produce(request) => produce::handle(broker, context, request).await,
        RequestKind::Fetch(request) => spawn(fetch::handle(broker, context, request)),
        RequestKind::Metadata(request) => spawn(metadata::handle(broker, context, request)),
        RequestKind::ListOffsets(request) => {
            ready(offsets::list_offsets(&broker, context, request))
        }
        RequestKind::OffsetForLeaderEpoch(request) => {
            ready(offsets::offset_for_leader_epoch(&broker, context, request))
        }
        RequestKind::CreateTopics(request) => spawn(admin::create_topics(broker, context, request)),
        RequestKind::DeleteTopics(request) => spawn(admin::delete_topics(broker, context, request)),
        RequestKind::CreatePartitions(request) => {
            spawn(admin::create_partitions(broker, context, request))
        }
        RequestKind::DescribeConfigs(request) => {
            ready(configs::describe_configs(&broker, context, request))
        }
        RequestKind::DescribeCluster(request) => {
            ready(admin::describe_cluster(&broker, context, request))
        }
        RequestKind::InitProducerId(request) => {
            spawn(admin::init_producer_id(broker, context, request))
        }
        other => Dispatched::Close(format!(
            "no handler for {:?}",
            std::mem::discriminant(&other)
        )),
    }
}

fn spawn(work: impl Future<Output = Option<Bytes>> + Send + 'static) -> Dispatched {
    Dispatched::Respond(Box::pin(work))
}
