//! An in-process agent over in-memory storage and a minimal Kafka wire client for tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsRequest, BrokerId, FetchRequest, ListOffsetsRequest, MetadataRequest,
    ProduceRequest, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{
    encode_request_header_into_buffer, Decodable, HeaderVersion, Request, StrBytes,
};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use weir_common::{Clock, SystemClock, TopicId};
use weir_control::{ControlPlane, ControlPlaneSettings};
use weir_fetch::FetchReader;
use weir_produce::{ProducePipeline, ProduceSettings};
use weir_server::{Broker, BrokerSettings, Server};
use weir_storage::{QuorumWriter, ReadCache};

/// Guard against hangs: a test waiting this long for a response has failed.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(60);

pub(crate) const PRODUCE_VERSION: i16 = 9;
pub(crate) const FETCH_VERSION: i16 = 12;
pub(crate) const METADATA_VERSION: i16 = 12;
pub(crate) const LIST_OFFSETS_VERSION: i16 = 7;
pub(crate) const API_VERSIONS_VERSION: i16 = 3;

pub(crate) struct Agent {
    pub(crate) addr: SocketAddr,
    pub(crate) control: ControlPlane,
    pub(crate) stop: watch::Sender<bool>,
    pub(crate) serving: JoinHandle<()>,
}

impl Agent {
    pub(crate) async fn start(settings: BrokerSettings, produce: ProduceSettings) -> Agent {
        Agent::start_on(settings, produce, Arc::new(InMemory::new())).await
    }

    /// An agent whose metadata log lives in `control_store` (a test may make it fail).
    pub(crate) async fn start_on(
        settings: BrokerSettings,
        produce: ProduceSettings,
        control_store: Arc<dyn ObjectStore>,
    ) -> Agent {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let control = ControlPlane::open(control_store, ControlPlaneSettings::default(), 3)
            .await
            .unwrap();
        let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
        let cache = Arc::new(ReadCache::new(64 * 1024 * 1024));
        let pipeline = ProducePipeline::start(
            produce,
            writer.clone(),
            control.clone(),
            cache.clone(),
            clock.clone(),
            5,
        );
        let fetch = FetchReader::new(control.clone(), writer, cache);
        let broker = Arc::new(Broker::new(
            settings,
            control.clone(),
            pipeline,
            fetch,
            clock,
            11,
        ));
        let server = Server::bind("127.0.0.1:0", broker).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stop_rx) = watch::channel(false);
        let serving = tokio::spawn(server.run(stop_rx));
        Agent {
            addr,
            control,
            stop,
            serving,
        }
    }

    pub(crate) async fn start_default() -> Agent {
        Agent::start(BrokerSettings::default(), ProduceSettings::default()).await
    }

    pub(crate) async fn create_topic(&self, name: &str, partitions: i32) -> TopicId {
        self.create_topic_with(name, partitions, BTreeMap::new())
            .await
    }

    pub(crate) async fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> TopicId {
        self.control
            .create_topic(name, partitions, configs, 77)
            .await
            .unwrap()
    }

    /// (high watermark, stable high watermark) of a partition.
    pub(crate) fn watermarks(&self, topic: &str, partition: usize) -> (i64, i64) {
        self.control.read(|state| {
            let p = &state.topic(topic).unwrap().partitions[partition];
            (p.high_watermark, p.stable_high_watermark)
        })
    }

    pub(crate) async fn connect(&self) -> Client {
        Client::connect(self.addr).await
    }
}

pub(crate) struct Client {
    pub(crate) stream: TcpStream,
    next_correlation: i32,
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            next_correlation: 1,
        }
    }

    pub(crate) fn next_correlation(&mut self) -> i32 {
        let id = self.next_correlation;
        self.next_correlation += 1;
        id
    }

    /// Encodes and writes one request; returns its correlation id.
    pub(crate) async fn send<R: Request>(&mut self, version: i16, body: &R) -> i32 {
        let correlation = self.next_correlation();
        let frame = encode_request(version, correlation, body);
        self.stream.write_all(&frame).await.unwrap();
        correlation
    }

    pub(crate) async fn write_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Reads one response frame (without the length prefix); `None` if the server closed.
    pub(crate) async fn read_frame(&mut self) -> Option<Bytes> {
        tokio::time::timeout(HANG_GUARD, read_frame(&mut self.stream))
            .await
            .expect("no response within the hang guard")
    }

    /// Reads and decodes one response of `R` at `version`; returns (correlation id, body).
    pub(crate) async fn recv<R: Request>(&mut self, version: i16) -> (i32, R::Response) {
        let frame = self.read_frame().await.expect("connection closed");
        decode_response::<R>(frame, version)
    }

    pub(crate) async fn call<R: Request>(&mut self, version: i16, body: &R) -> R::Response {
        let sent = self.send(version, body).await;
        let (correlation, response) = self.recv::<R>(version).await;
        assert_eq!(correlation, sent);
        response
    }

    /// Asserts the server closes the connection without sending anything more.
    pub(crate) async fn expect_closed(&mut self) {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(HANG_GUARD, self.stream.read(&mut buf))
            .await
            .expect("server neither answered nor closed");
        match read {
            Ok(0) | Err(_) => {}
            Ok(n) => panic!("expected a closed connection, got {n} bytes"),
        }
    }
}

async fn read_frame(stream: &mut TcpStream) -> Option<Bytes> {
    let mut prefix = [0u8; 4];
    if stream.read_exact(&mut prefix).await.is_err() {
        return None;
    }
    let len = i32::from_be_bytes(prefix);
    assert!(len >= 4, "bad response length {len}");
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.ok()?;
    Some(Bytes::from(body))
}

pub(crate) fn encode_request<R: Request>(version: i16, correlation: i32, body: &R) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("weir-test")));
    let mut payload = BytesMut::new();
    encode_request_header_into_buffer(&mut payload, &header).unwrap();
    body.encode(&mut payload, version).unwrap();
    let mut frame = BytesMut::with_capacity(4 + payload.len());
    frame.put_i32(payload.len() as i32);
    frame.extend_from_slice(&payload);
    frame.freeze()
}

pub(crate) fn decode_response<R: Request>(mut frame: Bytes, version: i16) -> (i32, R::Response) {
    let correlation = frame.get_i32();
    if <R::Response as HeaderVersion>::header_version(version) >= 1 {
        let tagged = frame.get_u8();
        assert_eq!(tagged, 0, "no tagged fields in the response header");
    }
    let body = R::Response::decode(&mut frame, version).unwrap();
    assert!(frame.is_empty(), "{} trailing bytes", frame.len());
    (correlation, body)
}

pub(crate) fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// Concatenated record batches of `counts` records each (no producer id).
pub(crate) fn records(counts: &[i32]) -> Bytes {
    let mut out = BytesMut::new();
    for (i, count) in counts.iter().enumerate() {
        out.extend_from_slice(&weir_protocol::batch::build_test_batch(
            *count,
            1_000 + i as i64,
            (-1, -1, -1),
        ));
    }
    out.freeze()
}

pub(crate) fn produce(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

pub(crate) fn fetch(topic: &str, partition: i32, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1024 * 1024)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1024 * 1024)])])
}

pub(crate) fn list_latest(topic: &str, partition: i32) -> ListOffsetsRequest {
    ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(-1)])])
}

pub(crate) fn metadata(topics: &[&str]) -> MetadataRequest {
    MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(Some(
            topics
                .iter()
                .map(|topic| MetadataRequestTopic::default().with_name(Some(name(topic))))
                .collect(),
        ))
}

pub(crate) fn api_versions() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("weir-test"))
        .with_client_software_version(StrBytes::from_static_str("1.0"))
}

/// A fresh connection still gets a good ApiVersions answer: the agent is alive.
pub(crate) async fn assert_agent_answers(agent: &Agent) {
    let mut client = agent.connect().await;
    let response = client.call(API_VERSIONS_VERSION, &api_versions()).await;
    assert_eq!(response.error_code, 0);
    assert!(!response.api_keys.is_empty());
    assert!(
        !agent.serving.is_finished(),
        "the listener is still running"
    );
}
