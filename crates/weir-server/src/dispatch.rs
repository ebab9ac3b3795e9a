//! Request routing: version checks, header and body decoding, and the handler per API.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, FetchResponse, RequestKind};
use kafka_protocol::protocol::Encodable;
use tracing::error;
use weir_protocol::frame::{decode_request_header, encode_response, peek_request};
use weir_protocol::record_set::RecordSet;
use weir_protocol::response::{encode_fetch_response, Frame};
use weir_protocol::versions::is_supported;

use crate::broker::Broker;
use crate::handlers;
use crate::metrics::ResponseError;

tokio::task_local! {
    /// The error code of the response being built on this task, for the request metrics
    /// (`connection.rs` scopes it around each request's response future).
    pub(crate) static RESPONSE_ERROR: std::cell::Cell<Option<i16>>;
}

pub(crate) type ResponseFuture = Pin<Box<dyn Future<Output = Option<Frame>> + Send + 'static>>;

pub(crate) enum Dispatched {
    /// The response (or `None` for acks=0), built by the connection's writer, which polls the
    /// future. Nothing of the request has happened yet when this is returned, except a
    /// produce's entry into the pipeline: the future runs in the request's turn (`order.rs`).
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
    /// Encodes a Fetch response with its record sets' pieces in the frame, not copies;
    /// `record_sets` are the partitions' records in order (see [`encode_fetch_response`]).
    pub(crate) fn encode_fetch(
        &self,
        body: &FetchResponse,
        record_sets: &[RecordSet],
    ) -> Option<Frame> {
        let _ = RESPONSE_ERROR.try_with(|error| error.set(Some(body.error_code())));
        let header_version = self.api_key.response_header_version(self.version);
        let (id, version) = (self.correlation_id, self.version);
        match encode_fetch_response(id, header_version, body, record_sets, version) {
            Ok(frame) => Some(frame),
            Err(err) => {
                error!(version = self.version, error = %err, "fetch response encoding failed");
                None
            }
        }
    }

    /// Encodes `body` as this request's response frame, noting its error code for the metrics.
    pub(crate) fn encode<M: Encodable + ResponseError>(&self, body: &M) -> Option<Bytes> {
        let _ = RESPONSE_ERROR.try_with(|error| error.set(Some(body.error_code())));
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

/// Who sent a request: the header's client id and the peer address (group membership shows both).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) client_id: String,
    /// Formatted as Kafka does: `/` followed by the IP address.
    pub(crate) host: String,
    /// The rack (`client.rack`) an earlier Fetch on this connection named.
    pub(crate) fetch_rack: Option<String>,
}

/// Longest rack id a connection remembers; longer ones are not zones of this cluster.
const MAX_RACK_BYTES: usize = 255;

/// What a connection remembers between its requests: the rack its latest Fetch named (RFC 0002
/// §6: a client's zone when its `client.id` names none).
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionFacts {
    fetch_rack: Arc<std::sync::Mutex<Option<String>>>,
}

impl ConnectionFacts {
    pub(crate) fn fetch_rack(&self) -> Option<String> {
        self.fetch_rack
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note_fetch_rack(&self, rack: &str) {
        if !rack.is_empty() && rack.len() <= MAX_RACK_BYTES {
            *self.fetch_rack.lock().unwrap_or_else(|p| p.into_inner()) = Some(rack.to_string());
        }
    }
}

impl Dispatched {
    /// A response built as one buffer (every API but Fetch).
    pub(crate) fn bytes(work: impl Future<Output = Option<Bytes>> + Send + 'static) -> Self {
        Dispatched::Respond(Box::pin(async move { work.await.map(Frame::from) }))
    }
}

pub(crate) fn ready(response: Option<Bytes>) -> Dispatched {
    Dispatched::bytes(std::future::ready(response))
}

pub(crate) async fn dispatch(
    broker: &Arc<Broker>,
    mut frame: Bytes,
    peer: SocketAddr,
    facts: &ConnectionFacts,
) -> Dispatched {
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
            // Built in the request's turn, like every response, so its error code is counted.
            return Dispatched::bytes(async move { handlers::api_versions::unsupported(context) });
        }
        return Dispatched::Close(format!("unsupported version {version} of {api_key:?}"));
    }
    let header = match decode_request_header(&mut frame, api_key, version) {
        Ok(header) => header,
        Err(err) => return Dispatched::Close(err.to_string()),
    };
    let caller = Caller {
        client_id: header
            .client_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        host: format!("/{}", peer.ip()),
        fetch_rack: facts.fetch_rack(),
    };
    let request = match RequestKind::decode(api_key, &mut frame, version) {
        Ok(request) => request,
        Err(err) => return Dispatched::Close(format!("malformed {api_key:?} v{version}: {err}")),
    };
    if let RequestKind::Fetch(fetch) = &request {
        facts.note_fetch_rack(fetch.rack_id.as_str());
    }
    route(broker, context, caller, request).await
}

async fn route(
    broker: &Arc<Broker>,
    context: RequestContext,
    caller: Caller,
    request: RequestKind,
) -> Dispatched {
    use handlers::*;
    let broker = broker.clone();
    match request {
        RequestKind::ApiVersions(_) => lazy(broker, move |_| api_versions::handle(context)),
        RequestKind::FindCoordinator(request) => lazy(broker, move |broker| {
            coordinator::find_coordinator(&broker, context, request)
        }),
        RequestKind::JoinGroup(request) => {
            spawn(membership::join_group(broker, context, caller, request))
        }
        RequestKind::SyncGroup(request) => spawn(membership::sync_group(broker, context, request)),
        RequestKind::Heartbeat(request) => lazy(broker, move |broker| {
            membership::heartbeat(&broker, context, request)
        }),
        RequestKind::LeaveGroup(request) => lazy(broker, move |broker| {
            membership::leave_group(&broker, context, request)
        }),
        RequestKind::OffsetCommit(request) => {
            spawn(group_offsets::offset_commit(broker, context, request))
        }
        RequestKind::OffsetFetch(request) => spawn(async move {
            broker.read_your_writes().await;
            group_offsets::offset_fetch(&broker, context, request)
        }),
        RequestKind::OffsetDelete(request) => {
            spawn(group_offsets::offset_delete(broker, context, request))
        }
        RequestKind::ListGroups(request) => lazy(broker, move |broker| {
            group_admin::list_groups(&broker, context, request)
        }),
        RequestKind::DescribeGroups(request) => lazy(broker, move |broker| {
            group_admin::describe_groups(&broker, context, request)
        }),
        RequestKind::DeleteGroups(request) => {
            spawn(group_admin::delete_groups(broker, context, request))
        }
        RequestKind::Produce(request) => produce::handle(broker, context, request).await,
        RequestKind::Fetch(request) => {
            Dispatched::Respond(Box::pin(fetch::handle(broker, context, request)))
        }
        RequestKind::Metadata(request) => spawn(metadata::handle(broker, context, caller, request)),
        RequestKind::ListOffsets(request) => spawn(offsets::list_offsets(broker, context, request)),
        RequestKind::OffsetForLeaderEpoch(request) => lazy(broker, move |broker| {
            offsets::offset_for_leader_epoch(&broker, context, request)
        }),
        RequestKind::CreateTopics(request) => spawn(admin::create_topics(broker, context, request)),
        RequestKind::DeleteTopics(request) => spawn(admin::delete_topics(broker, context, request)),
        RequestKind::DeleteRecords(request) => {
            spawn(delete_records::delete_records(broker, context, request))
        }
        RequestKind::CreatePartitions(request) => {
            spawn(admin::create_partitions(broker, context, request))
        }
        RequestKind::DescribeConfigs(request) => lazy(broker, move |broker| {
            configs::describe_configs(&broker, context, request)
        }),
        RequestKind::DescribeCluster(request) => lazy(broker, move |broker| {
            admin::describe_cluster(&broker, context, request)
        }),
        RequestKind::InitProducerId(request) => {
            spawn(admin::init_producer_id(broker, context, caller, request))
        }
        other => Dispatched::Close(format!(
            "no handler for {:?}",
            std::mem::discriminant(&other)
        )),
    }
}

fn spawn(work: impl Future<Output = Option<Bytes>> + Send + 'static) -> Dispatched {
    Dispatched::bytes(work)
}

/// A synchronous handler, run when the connection gives the request its turn (not now: the
/// requests before it may not have taken effect yet).
fn lazy(
    broker: Arc<Broker>,
    handler: impl FnOnce(Arc<Broker>) -> Option<Bytes> + Send + 'static,
) -> Dispatched {
    Dispatched::bytes(async move { handler(broker) })
}
