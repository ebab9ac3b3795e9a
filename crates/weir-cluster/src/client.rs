//! The follower's side: [`GrpcLink`] connects to a leader's [`crate::serve`].

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use http::uri::PathAndQuery;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};
use weir_control::link::{ControlLink, DurableRecord, Forwarded, LeaderConn, LeaderStatus};
use weir_control::{ControlError, Entry, EntryResult};

use crate::proto::{
    BarrierReply, Empty, HeartbeatRequest, Record, StatusReply, SubmitReply, SubmitRequest,
};
use crate::{CLUSTER_ID_HEADER, MAX_MESSAGE_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION, SERVICE};

/// Connections to other agents' control planes over gRPC.
#[derive(Debug, Clone)]
pub struct GrpcLink {
    /// This agent's cluster id, sent in every call (known once the log is replayed).
    cluster_id: Arc<RwLock<String>>,
    /// Bounds connecting, every unary call and the opening of a stream; HTTP/2 keepalives time
    /// out a silently dead peer's open streams after as long.
    timeout: Duration,
}

impl Default for GrpcLink {
    fn default() -> Self {
        Self::new(Duration::from_secs(5))
    }
}

impl GrpcLink {
    pub fn new(timeout: Duration) -> Self {
        Self {
            cluster_id: Arc::default(),
            timeout,
        }
    }

    /// The same link (its cluster id follows this one's) with another bound on each call.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            cluster_id: self.cluster_id.clone(),
            timeout,
        }
    }

    /// Sets the cluster id sent to peers (the state's `cluster_id` after the first replay).
    pub fn set_cluster_id(&self, cluster_id: &str) {
        *self.cluster_id.write().unwrap_or_else(|p| p.into_inner()) = cluster_id.to_string();
    }
}

impl GrpcLink {
    /// A lazy connection to the control service at `address`.
    pub(crate) fn conn(&self, address: &str) -> Result<GrpcConn, ControlError> {
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|err| unavailable(address, err))?
            .connect_timeout(self.timeout)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(self.timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let grpc = Grpc::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(GrpcConn {
            address: address.to_string(),
            grpc,
            cluster_id: self.cluster_id.clone(),
            timeout: self.timeout,
            submit: Mutex::new(None),
        })
    }
}

impl ControlLink for GrpcLink {
    fn connect(&self, address: &str) -> Result<Arc<dyn LeaderConn>, ControlError> {
        Ok(Arc::new(self.conn(address)?))
    }

    fn cluster_id_known(&self, cluster_id: &str) {
        if !cluster_id.is_empty() {
            self.set_cluster_id(cluster_id);
        }
    }
}

fn unavailable(address: &str, err: impl std::fmt::Display) -> ControlError {
    ControlError::Unavailable(format!("control plane at {address}: {err}"))
}

type Pending =
    Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Result<(EntryResult, u64), ControlError>>>>>;

/// The open `Submit` stream of a connection.
struct SubmitStream {
    requests: mpsc::Sender<SubmitRequest>,
    pending: Pending,
    next_id: u64,
}

pub(crate) struct GrpcConn {
    address: String,
    grpc: Grpc<Channel>,
    cluster_id: Arc<RwLock<String>>,
    timeout: Duration,
    /// One ordered stream per connection, opened at the first write and again after it broke.
    submit: Mutex<Option<SubmitStream>>,
}

impl GrpcConn {
    fn request<T>(&self, message: T) -> Result<Request<T>, ControlError> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        let value = |text: &str| {
            text.parse()
                .map_err(|_| unavailable(&self.address, "cluster id is not ASCII"))
        };
        let cluster_id = self
            .cluster_id
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        metadata.insert(CLUSTER_ID_HEADER, value(&cluster_id)?);
        metadata.insert(PROTOCOL_HEADER, value(PROTOCOL_VERSION)?);
        Ok(request)
    }

    async fn ready(&self) -> Result<Grpc<Channel>, ControlError> {
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|err| unavailable(&self.address, err))?;
        Ok(grpc)
    }

    /// `call` within the link's timeout.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ControlError>>,
    ) -> Result<T, ControlError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(unavailable(
                    &self.address,
                    format!("no answer within {:?}", self.timeout),
                ))
            })
    }

    fn status_error(&self, status: Status) -> ControlError {
        unavailable(
            &self.address,
            format!("{:?}: {}", status.code(), status.message()),
        )
    }

    pub(crate) async fn unary<Message, Reply>(
        &self,
        method: &'static str,
        message: Message,
    ) -> Result<Reply, ControlError>
    where
        Message: prost::Message + Send + Sync + 'static,
        Reply: prost::Message + Default + Send + 'static,
    {
        let request = self.request(message)?;
        let path =
            PathAndQuery::from_maybe_shared(format!("/{SERVICE}/{method}")).expect("a valid path");
        let reply = self
            .bounded(async {
                self.ready()
                    .await?
                    .unary(
                        request,
                        path,
                        tonic_prost::ProstCodec::<Message, Reply>::default(),
                    )
                    .await
                    .map_err(|status| self.status_error(status))
            })
            .await?;
        Ok(reply.into_inner())
    }

    /// Opens the `Submit` stream, with a task that answers each reply's waiter and fails them
    /// all when the stream ends.
    async fn open_submit(&self) -> Result<SubmitStream, ControlError> {
        let (requests, outgoing) = mpsc::channel(1024);
        let request = self.request(ReceiverStream::new(outgoing))?;
        let path =
            PathAndQuery::from_maybe_shared(format!("/{SERVICE}/Submit")).expect("a valid path");
        let mut replies = self
            .bounded(async {
                self.ready()
                    .await?
                    .streaming(
                        request,
                        path,
                        tonic_prost::ProstCodec::<SubmitRequest, SubmitReply>::default(),
                    )
                    .await
                    .map_err(|status| self.status_error(status))
            })
            .await?
            .into_inner();
        let pending: Pending = Arc::default();
        let waiters = pending.clone();
        let address = self.address.clone();
        tokio::spawn(async move {
            let end = loop {
                match replies.message().await {
                    Ok(Some(reply)) => {
                        let waiter = waiters
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&reply.id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(decode_reply(&address, &reply));
                        }
                    }
                    Ok(None) => break "the leader closed the stream".to_string(),
                    Err(status) => break format!("{:?}: {}", status.code(), status.message()),
                };
            };
            // Their fate is unknown: each may still become durable.
            let waiters = std::mem::take(&mut *waiters.lock().unwrap_or_else(|p| p.into_inner()));
            for (_, waiter) in waiters {
                let _ = waiter.send(Err(unavailable(&address, &end)));
            }
        });
        Ok(SubmitStream {
            requests,
            pending,
            next_id: 0,
        })
    }
}

fn decode_reply(address: &str, reply: &SubmitReply) -> Result<(EntryResult, u64), ControlError> {
    if !reply.error.is_empty() {
        return Err(serde_json::from_slice(&reply.error)
            .unwrap_or_else(|err| unavailable(address, format!("undecodable error: {err}"))));
    }
    let result = serde_json::from_slice(&reply.result)
        .map_err(|err| unavailable(address, format!("undecodable result: {err}")))?;
    Ok((result, reply.seq))
}

#[async_trait]
impl LeaderConn for GrpcConn {
    async fn send(&self, entry: Entry) -> Result<Forwarded, ControlError> {
        let body = serde_json::to_vec(&entry).expect("an entry serialises");
        let mut submit = self.submit.lock().await;
        if submit.as_ref().is_none_or(|s| s.requests.is_closed()) {
            *submit = Some(self.open_submit().await?);
        }
        let stream = submit.as_mut().expect("opened above");
        let id = stream.next_id;
        stream.next_id += 1;
        let (waiter, result) = oneshot::channel();
        stream
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, waiter);
        if stream
            .requests
            .send(SubmitRequest { id, entry: body })
            .await
            .is_err()
        {
            *submit = None;
            return Err(unavailable(&self.address, "the submit stream broke"));
        }
        let address = self.address.clone();
        Ok(async move {
            result
                .await
                .map_err(|_| unavailable(&address, "the submit stream broke"))?
        }
        .boxed())
    }

    async fn barrier(&self) -> Result<u64, ControlError> {
        let reply: BarrierReply = self.unary("Barrier", Empty {}).await?;
        Ok(reply.durable)
    }

    async fn status(&self) -> Result<LeaderStatus, ControlError> {
        let status: StatusReply = self.unary("Status", Empty {}).await?;
        Ok(LeaderStatus {
            epoch: status.epoch,
            available: status.available,
            durable: status.durable,
        })
    }

    async fn heartbeat(&self, node_id: i32, incarnation: &str) -> Result<(), ControlError> {
        let heartbeat = HeartbeatRequest {
            node_id,
            incarnation: incarnation.to_string(),
        };
        let _: Empty = self.unary("Heartbeat", heartbeat).await?;
        Ok(())
    }

    async fn records(&self) -> Result<BoxStream<'static, DurableRecord>, ControlError> {
        let request = self.request(Empty {})?;
        let path =
            PathAndQuery::from_maybe_shared(format!("/{SERVICE}/Records")).expect("a valid path");
        let records = self
            .bounded(async {
                self.ready()
                    .await?
                    .server_streaming(
                        request,
                        path,
                        tonic_prost::ProstCodec::<Empty, Record>::default(),
                    )
                    .await
                    .map_err(|status| self.status_error(status))
            })
            .await?
            .into_inner();
        // Ends at the first error or undecodable record: the follower reads the bucket.
        Ok(records
            .take_while(|record| futures::future::ready(record.is_ok()))
            .filter_map(|record| async move {
                let record = record.ok()?;
                let entries: Vec<Entry> = serde_json::from_slice(&record.entries).ok()?;
                Some(DurableRecord {
                    seq: record.seq,
                    epoch: record.epoch,
                    entries: Arc::new(entries),
                })
            })
            .boxed())
    }
}
