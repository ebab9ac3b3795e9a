//! The leader's side: `weir.cluster.v1.Control` over one control plane, written by hand the way
//! `tonic-build` would generate it (one path per method).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::server::{Grpc, NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};
use weir_control::plane::Role;
use weir_control::{ControlError, ControlPlane, Entry};

use crate::proto::{
    BarrierReply, Empty, HeartbeatRequest, QueueAnswer, QueueCall, Record, StatusReply,
    SubmitReply, SubmitRequest,
};
use crate::queue::QueueNetwork;
use crate::{CLUSTER_ID_HEADER, MAX_MESSAGE_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION, SERVICE};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Serves `control`, and the brokers of `queues` when given, on `listener` until `shutdown`
/// completes.
pub async fn serve(
    listener: TcpListener,
    control: ControlPlane,
    queues: Option<Arc<QueueNetwork>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let mut service = ControlService::new(control);
    service.queues = queues;
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(service, TcpListenerStream::new(listener), shutdown)
        .await
}

/// The service; cheap to clone.
#[derive(Debug, Clone)]
pub struct ControlService {
    control: Arc<ControlPlane>,
    queues: Option<Arc<QueueNetwork>>,
}

impl ControlService {
    pub fn new(control: ControlPlane) -> Self {
        Self {
            control: Arc::new(control),
            queues: None,
        }
    }
}

impl NamedService for ControlService {
    const NAME: &'static str = SERVICE;
}

/// The handshake: the caller's cluster id and protocol version must be ours.
fn check_peer<T>(control: &ControlPlane, request: &Request<T>) -> Result<(), Status> {
    let header = |key| {
        request
            .metadata()
            .get(key)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    };
    let protocol = header(PROTOCOL_HEADER);
    if protocol != PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "cluster protocol {protocol:?}, this agent speaks {PROTOCOL_VERSION}"
        )));
    }
    let ours = control.read(|state| state.cluster_id.clone());
    let theirs = header(CLUSTER_ID_HEADER);
    if theirs != ours {
        warn!(theirs, ours, "refused a peer of another cluster");
        return Err(Status::failed_precondition(format!(
            "cluster id {theirs:?} is not this cluster's ({ours:?})"
        )));
    }
    Ok(())
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("entries, results and errors serialise")
}

struct StatusSvc(Arc<ControlPlane>);

impl UnaryService<Empty> for StatusSvc {
    type Response = StatusReply;
    type Future = BoxFuture<Result<Response<StatusReply>, Status>>;

    fn call(&mut self, request: Request<Empty>) -> Self::Future {
        let control = self.0.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let status = control.leader_status();
            Ok(Response::new(StatusReply {
                epoch: status.epoch,
                available: status.available,
                durable: status.durable,
            }))
        })
    }
}

/// Incarnations are 16 hex digits; anything much longer is not a peer of this build.
const MAX_INCARNATION_BYTES: usize = 256;

struct HeartbeatSvc(Arc<ControlPlane>);

impl UnaryService<HeartbeatRequest> for HeartbeatSvc {
    type Response = Empty;
    type Future = BoxFuture<Result<Response<Empty>, Status>>;

    fn call(&mut self, request: Request<HeartbeatRequest>) -> Self::Future {
        let control = self.0.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let heartbeat = request.into_inner();
            if heartbeat.node_id < 0 || heartbeat.incarnation.len() > MAX_INCARNATION_BYTES {
                return Err(Status::invalid_argument("malformed heartbeat"));
            }
            if !matches!(*control.role().borrow(), Role::Leader { .. }) {
                // A follower pointed at a deposed leader looks for the new one.
                return Err(Status::failed_precondition("not the control-plane leader"));
            }
            control.heard_from(heartbeat.node_id, &heartbeat.incarnation);
            Ok(Response::new(Empty {}))
        })
    }
}

struct QueueSvc(Arc<ControlPlane>, Option<Arc<QueueNetwork>>);

impl UnaryService<QueueCall> for QueueSvc {
    type Response = QueueAnswer;
    type Future = BoxFuture<Result<Response<QueueAnswer>, Status>>;

    fn call(&mut self, request: Request<QueueCall>) -> Self::Future {
        let control = self.0.clone();
        let queues = self.1.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let answer = crate::queue::serve_call(queues.as_deref(), request.into_inner()).await?;
            Ok(Response::new(answer))
        })
    }
}

struct BarrierSvc(Arc<ControlPlane>);

impl UnaryService<Empty> for BarrierSvc {
    type Response = BarrierReply;
    type Future = BoxFuture<Result<Response<BarrierReply>, Status>>;

    fn call(&mut self, request: Request<Empty>) -> Self::Future {
        let control = self.0.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let durable = control
                .leader_barrier()
                .map_err(|err| Status::unavailable(err.to_string()))?;
            Ok(Response::new(BarrierReply { durable }))
        })
    }
}

struct RecordsSvc(Arc<ControlPlane>);

impl ServerStreamingService<Empty> for RecordsSvc {
    type Response = Record;
    type ResponseStream = BoxStream<Record>;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Empty>) -> Self::Future {
        let control = self.0.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let receiver = control.durable_records();
            // Lagged or closed: the stream ends and the follower reads the bucket.
            let records = futures::stream::unfold(receiver, |mut receiver| async move {
                let record = receiver.recv().await.ok()?;
                let record = Record {
                    seq: record.seq,
                    epoch: record.epoch,
                    entries: json(&*record.entries),
                };
                Some((Ok(record), receiver))
            });
            Ok(Response::new(Box::pin(records) as Self::ResponseStream))
        })
    }
}

struct SubmitSvc(Arc<ControlPlane>);

impl StreamingService<SubmitRequest> for SubmitSvc {
    type Response = SubmitReply;
    type ResponseStream = BoxStream<SubmitReply>;
    type Future = BoxFuture<Result<Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: Request<Streaming<SubmitRequest>>) -> Self::Future {
        let control = self.0.clone();
        Box::pin(async move {
            check_peer(&control, &request)?;
            let mut requests = request.into_inner();
            // Bounded: a follower with this many writes unanswered waits before sending more.
            let (replies, answers) = mpsc::channel(1024);
            tokio::spawn(async move {
                // In arrival order: each entry is sequenced before the next is read.
                while let Some(next) = requests.next().await {
                    let request = match next {
                        Ok(request) => request,
                        Err(status) => {
                            // Undecodable or oversized: the stream ends with its status.
                            debug!(%status, "submit stream failed");
                            let _ = replies.send(Err(status)).await;
                            return;
                        }
                    };
                    let entry: Entry = match serde_json::from_slice(&request.entry) {
                        Ok(entry) => entry,
                        Err(err) => {
                            let status = Status::invalid_argument(format!(
                                "submit {}: not a log entry: {err}",
                                request.id
                            ));
                            let _ = replies.send(Err(status)).await;
                            return;
                        }
                    };
                    let id = request.id;
                    match control.accept_forwarded(entry).await {
                        Ok(result) => {
                            let replies = replies.clone();
                            tokio::spawn(async move {
                                let reply = answer(id, result.await);
                                let _ = replies.send(Ok(reply)).await;
                            });
                        }
                        Err(err) => {
                            // Refused (not the leader any more, or not forwardable): the
                            // stream ends here, so no later entry of it is sequenced ahead of
                            // this one after all.
                            let _ = replies.send(Ok(answer(id, Err(err)))).await;
                            return;
                        }
                    }
                }
            });
            Ok(Response::new(
                Box::pin(ReceiverStream::new(answers)) as Self::ResponseStream
            ))
        })
    }
}

/// A server half for one method, with the message size bounds.
fn grpc<Reply, Req>() -> Grpc<tonic_prost::ProstCodec<Reply, Req>>
where
    Reply: prost::Message + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
{
    Grpc::new(tonic_prost::ProstCodec::default())
        .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES))
}

fn answer(id: u64, result: Result<(weir_control::EntryResult, u64), ControlError>) -> SubmitReply {
    match result {
        Ok((result, seq)) => SubmitReply {
            id,
            result: json(&result),
            seq,
            error: Vec::new(),
        },
        Err(err) => SubmitReply {
            id,
            result: Vec::new(),
            seq: 0,
            error: json(&err),
        },
    }
}

impl<B> tower::Service<http::Request<B>> for ControlService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let control = self.control.clone();
        let queues = self.queues.clone();
        let method = request
            .uri()
            .path()
            .strip_prefix(&format!("/{SERVICE}/"))
            .unwrap_or_default()
            .to_string();
        Box::pin(async move {
            Ok(match method.as_str() {
                "Status" => grpc().unary(StatusSvc(control), request).await,
                "Barrier" => grpc().unary(BarrierSvc(control), request).await,
                "Heartbeat" => grpc().unary(HeartbeatSvc(control), request).await,
                "Records" => grpc().server_streaming(RecordsSvc(control), request).await,
                "Submit" => grpc().streaming(SubmitSvc(control), request).await,
                "Queue" => grpc().unary(QueueSvc(control, queues), request).await,
                _ => Status::unimplemented(format!("no method {method:?}")).into_http(),
            })
        })
    }
}
