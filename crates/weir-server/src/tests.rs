//! Fetch response memory: responses that clients do not read stay within the agent-wide budget
//! (plus one first batch each), every fetch still returns at least one batch, and a response's
//! memory is returned once the connection has written it.
//!
//! Tests that wait for time to pass run on Tokio's paused clock (`start_paused`): the clock moves
//! only when every task is blocked, so a sleep there means "once the agent has done everything
//! it can", and timeouts fire in a fixed order, whatever the machine's speed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProduceRequest, ProduceResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{
    encode_request_header_into_buffer, Decodable, Encodable, HeaderVersion, StrBytes,
};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use weir_common::{Clock, SystemClock};
use weir_control::{ControlPlane, ControlPlaneSettings};
use weir_fetch::FetchReader;
use weir_produce::{
    PartitionBatches, PartitionOutcome, ProducePipeline, ProduceSettings, ProduceTicket,
};
use weir_protocol::batch::{build_test_batch, split_and_validate};
use weir_storage::{QuorumWriter, ReadCache};

use crate::dispatch::{dispatch, ConnectionFacts, Dispatched, RequestContext};
use crate::handlers::fetch;
use crate::{Broker, BrokerSettings};

const FETCH_VERSION: i16 = 12;
pub(crate) const TOPIC: &str = "memory";
/// Each record of a test batch is 8 bytes: 2,000 make a ~16 KiB batch.
const SMALL_BATCH_RECORDS: i32 = 2_000;
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// A broker over in-memory buckets whose request and response budgets are `budget` bytes,
/// holding `batches` equal batches of `records` records in partition 0 of `TOPIC`. Returns it
/// and the length of one batch.
pub(crate) async fn broker_with_data(
    budget: usize,
    records: i32,
    batches: usize,
) -> (Arc<Broker>, usize) {
    broker_with(budget, records, batches, BrokerSettings::default()).await
}

/// `broker_with_data` with the rest of its settings from `settings`.
pub(crate) async fn broker_with(
    budget: usize,
    records: i32,
    batches: usize,
    settings: BrokerSettings,
) -> (Arc<Broker>, usize) {
    let meta: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let control = ControlPlane::open(meta, ControlPlaneSettings::default(), 3)
        .await
        .unwrap();
    let settings = BrokerSettings {
        max_frame_bytes: budget,
        max_inflight_request_bytes: budget,
        max_inflight_fetch_bytes: budget,
        ..settings
    };
    let broker = broker_over(&control, settings);
    control
        .create_topic(TOPIC, 1, BTreeMap::new(), 77)
        .await
        .unwrap();
    let batch = build_test_batch(records, 1_000, (-1, -1, -1));
    for _ in 0..batches {
        append(&broker, &batch).await;
    }
    (broker, batch.len())
}

/// Commits `batch` to partition 0 of `TOPIC` through the broker's produce pipeline.
pub(crate) async fn append(broker: &Broker, batch: &Bytes) {
    let topic_id = broker
        .control
        .read(|s| s.topic(TOPIC).map(|topic| topic.id))
        .expect("the test topic");
    let ticket = ProduceTicket {
        partitions: vec![PartitionBatches {
            topic_id,
            partition: 0,
            batches: split_and_validate(batch).unwrap(),
        }],
    };
    let outcome = broker.produce.submit(ticket).await.await;
    assert!(
        matches!(outcome[..], [PartitionOutcome::Committed { .. }]),
        "{outcome:?}"
    );
}

/// A broker over `control`, with one in-memory ingest bucket.
fn broker_over(control: &ControlPlane, settings: BrokerSettings) -> Arc<Broker> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
    let cache = Arc::new(ReadCache::new(64 * 1024 * 1024));
    let produce = ProducePipeline::start(
        ProduceSettings::default(),
        writer.clone(),
        control.clone(),
        cache.clone(),
        clock.clone(),
        5,
    );
    let fetch_reader = FetchReader::new(control.clone(), writer, cache);
    Arc::new(Broker::new(
        settings,
        control.clone(),
        produce,
        fetch_reader,
        clock,
        11,
    ))
}

pub(crate) fn fetch_request(offset: i64, max_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(max_bytes)])])
}

fn context(correlation_id: i32) -> RequestContext {
    RequestContext {
        api_key: ApiKey::Fetch,
        version: FETCH_VERSION,
        correlation_id,
    }
}

/// Record bytes of partition 0 in a response frame (length prefix included).
pub(crate) fn records_in(mut frame: Bytes) -> usize {
    frame.advance(4 + 4); // length, correlation id
    if FetchResponse::header_version(FETCH_VERSION) >= 1 {
        frame.advance(1); // no tagged fields
    }
    let response = FetchResponse::decode(&mut frame, FETCH_VERSION).unwrap();
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    partition.records.as_ref().map_or(0, Bytes::len)
}

#[tokio::test]
async fn test_unread_fetch_responses_stay_within_the_response_budget() {
    let budget = 256 * 1024;
    let (broker, batch) = broker_with_data(budget, SMALL_BATCH_RECORDS, 40).await;
    assert_eq!(broker.fetch_memory.capacity(), budget);
    // Responses nobody writes out, as for clients that never read their sockets. Each asks for
    // everything (2 GiB); the partition holds 40 batches (~640 KiB), more than the budget.
    let mut held = Vec::new();
    let mut starved = 0;
    for i in 0..30 {
        let frame = fetch::handle(broker.clone(), context(i), fetch_request(0, i32::MAX))
            .await
            .expect("a response");
        let records = records_in(frame.to_bytes());
        assert_eq!(records % batch, 0);
        if records == 0 {
            // Only once first batches over the budget reach half of it (agent-wide bound).
            assert!(
                broker.fetch_memory.used() + 2 * batch > budget + budget / 2,
                "fetch {i} got nothing with {} in use",
                broker.fetch_memory.used()
            );
            starved += 1;
        }
        held.push(frame);
        let in_use = broker.fetch_memory.used();
        // Responses without records are a few header bytes, charged nothing.
        let frames: usize = held
            .iter()
            .filter(|frame| records_in(frame.to_bytes()) > 0)
            .map(|frame| frame.len())
            .sum();
        // Each held response is charged at least its size, and all together stay within the
        // budget plus half of it for first batches.
        assert!(frames <= in_use, "{frames} bytes held, {in_use} charged");
        assert!(
            in_use <= budget + budget / 2,
            "{in_use} bytes in use after {} responses, budget {budget}",
            held.len()
        );
    }
    // The first response read what the budget allowed; once it is used up, fetches read one
    // batch each (KIP-74) until those first batches reach half the budget, then nothing (they
    // long-poll and try again) instead of growing the agent's memory with every connection.
    assert!(records_in(held[0].to_bytes()) > batch);
    assert!(records_in(held[0].to_bytes()) <= budget / 2);
    assert!(
        held.iter()
            .any(|frame| records_in(frame.to_bytes()) == batch),
        "no fetch got exactly its first batch past the budget"
    );
    assert!(
        starved > 0,
        "30 unread fetches never reached the first-batch bound"
    );
    assert_eq!(records_in(held[29].to_bytes()), 0);
    drop(held);
    assert_eq!(
        broker.fetch_memory.used(),
        0,
        "dropped responses return their memory"
    );
    let frame = fetch::handle(broker.clone(), context(99), fetch_request(0, i32::MAX))
        .await
        .unwrap();
    assert!(
        records_in(frame.to_bytes()) > batch,
        "the whole budget is free again"
    );
}

#[tokio::test(start_paused = true)]
async fn test_fetch_without_data_holds_no_memory_while_long_polling() {
    let (broker, _) = broker_with_data(256 * 1024, SMALL_BATCH_RECORDS, 4).await;
    let hw = 4 * i64::from(SMALL_BATCH_RECORDS);
    let polling = tokio::spawn(fetch::handle(
        broker.clone(),
        context(1),
        fetch_request(hw, i32::MAX).with_max_wait_ms(200),
    ));
    // Paused clock: this returns once the fetch is parked in its long poll, 100 ms into 200.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!polling.is_finished(), "the fetch did not wait for data");
    assert_eq!(broker.fetch_memory.used(), 0);
    let frame = polling.await.unwrap().unwrap();
    assert_eq!(records_in(frame.to_bytes()), 0);
    assert_eq!(broker.fetch_memory.used(), 0);
}

pub(crate) fn encode_fetch(correlation_id: i32, request: &FetchRequest) -> Bytes {
    length_prefixed(&request_frame_with(
        ApiKey::Fetch,
        FETCH_VERSION,
        correlation_id,
        request,
    ))
}

/// `frame` as a client sends it: its length, then the frame.
pub(crate) fn length_prefixed(frame: &[u8]) -> Bytes {
    let mut prefixed = BytesMut::with_capacity(4 + frame.len());
    prefixed.put_i32(frame.len() as i32);
    prefixed.extend_from_slice(frame);
    prefixed.freeze()
}

pub(crate) async fn read_response(stream: &mut TcpStream) -> Bytes {
    let mut prefix = [0u8; 4];
    stream.read_exact(&mut prefix).await.unwrap();
    let mut frame = prefix.to_vec();
    frame.resize(4 + i32::from_be_bytes(prefix) as usize, 0);
    stream.read_exact(&mut frame[4..]).await.unwrap();
    Bytes::from(frame)
}

pub(crate) async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Request memory (`kafka.max_inflight_request_bytes`) held by frames read but not yet handled.
pub(crate) fn request_memory_in_use(broker: &Broker) -> usize {
    broker.request_memory.used()
}

/// A request frame as a connection reads it (without the length prefix).
fn request_frame<R: Encodable>(key: ApiKey, version: i16, request: &R) -> Bytes {
    request_frame_with(key, version, 5, request)
}

/// `request_frame` with the correlation id `correlation`.
pub(crate) fn request_frame_with<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    request: &R,
) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("weir-test")));
    let mut frame = BytesMut::new();
    encode_request_header_into_buffer(&mut frame, &header).unwrap();
    request.encode(&mut frame, version).unwrap();
    frame.freeze()
}

/// A Fetch naming a rack (`client.rack`, v11+) sets the zone later Metadata requests on the
/// same connection are answered for (when their client id names none); an empty or absurdly
/// long rack changes nothing, and another connection knows nothing of it.
#[tokio::test]
async fn test_a_connection_remembers_the_rack_its_fetches_name() {
    let (broker, _) = broker_with_data(1024 * 1024, 2, 1).await;
    let peer = "127.0.0.1:1".parse().unwrap();
    let facts = ConnectionFacts::default();
    let fetch = |rack: &str| {
        request_frame(
            ApiKey::Fetch,
            11,
            &fetch_request(0, 1024).with_rack_id(StrBytes::from_string(rack.to_string())),
        )
    };
    assert_eq!(facts.fetch_rack(), None);
    assert!(matches!(
        dispatch(&broker, fetch("zone-b"), peer, &facts).await,
        Dispatched::Respond(_)
    ));
    assert_eq!(facts.fetch_rack().as_deref(), Some("zone-b"));
    dispatch(&broker, fetch(&"x".repeat(300)), peer, &facts).await;
    dispatch(&broker, fetch(""), peer, &facts).await;
    assert_eq!(facts.fetch_rack().as_deref(), Some("zone-b"));
    assert_eq!(ConnectionFacts::default().fetch_rack(), None);
}

/// One request through `dispatch` (as a connection would hand it over); returns the response
/// body after the length prefix, correlation id and (flexible versions) header tags.
async fn roundtrip<R: Encodable>(
    broker: &Arc<Broker>,
    key: ApiKey,
    version: i16,
    request: &R,
    response_header_version: i16,
) -> Bytes {
    let facts = ConnectionFacts::default();
    roundtrip_on(
        broker,
        &facts,
        key,
        version,
        request,
        response_header_version,
    )
    .await
}

/// `roundtrip` on a connection that remembers `facts`.
async fn roundtrip_on<R: Encodable>(
    broker: &Arc<Broker>,
    facts: &ConnectionFacts,
    key: ApiKey,
    version: i16,
    request: &R,
    response_header_version: i16,
) -> Bytes {
    let frame = request_frame(key, version, request);
    let peer = "127.0.0.1:1".parse().unwrap();
    let Dispatched::Respond(work) = dispatch(broker, frame, peer, facts).await else {
        panic!("{key:?} v{version}: the connection was closed");
    };
    let mut response = work.await.expect("a response").to_bytes();
    response.advance(4);
    assert_eq!(response.get_i32(), 5, "correlation id");
    if response_header_version >= 1 {
        response.advance(1); // no tagged fields
    }
    response
}

/// docs/compatibility.md: "agent shutting down → NOT_LEADER_OR_FOLLOWER (6)". Once the control
/// plane has shut down (the last step of a graceful stop), a produce and an InitProducerId are
/// answered with 6, retriable for clients, rather than a generic error or no answer.
#[tokio::test(start_paused = true)]
async fn test_produce_and_init_producer_id_while_shutting_down() {
    let (broker, _) = broker_with_data(1024 * 1024, 2, 1).await;
    broker.control.shutdown().await;

    let records = build_test_batch(2, 1_000, (-1, -1, -1));
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let mut body = roundtrip(&broker, ApiKey::Produce, 8, &request, 0).await;
    let response = ProduceResponse::decode(&mut body, 8).unwrap();
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, 6, "{response:?}");

    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000);
    let mut body = roundtrip(&broker, ApiKey::InitProducerId, 1, &request, 0).await;
    let response = InitProducerIdResponse::decode(&mut body, 1).unwrap();
    assert_eq!(response.error_code, 6, "{response:?}");
}

/// A client looping on InitProducerId gets THROTTLING_QUOTA_EXCEEDED with a throttle time once
/// its burst is spent, and no new producer id is created for the refused requests; an epoch
/// bump of a known id is not throttled (it adds no state).
#[tokio::test]
async fn test_init_producer_id_loop_is_throttled() {
    let (broker, _) = broker_with_data(1024 * 1024, 2, 1).await;
    let burst = broker.settings.producer_admission.burst as usize;
    let init = |existing: Option<(i64, i16)>| {
        let (id, epoch) = existing.unwrap_or((-1, -1));
        InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(id))
            .with_producer_epoch(epoch)
    };
    let mut last = None;
    for _ in 0..burst {
        let mut body = roundtrip(&broker, ApiKey::InitProducerId, 3, &init(None), 1).await;
        let response = InitProducerIdResponse::decode(&mut body, 3).unwrap();
        assert_eq!(response.error_code, 0, "{response:?}");
        last = Some((response.producer_id.0, response.producer_epoch));
    }
    let mut body = roundtrip(&broker, ApiKey::InitProducerId, 3, &init(None), 1).await;
    let refused = InitProducerIdResponse::decode(&mut body, 3).unwrap();
    assert_eq!(refused.error_code, 89, "{refused:?}");
    assert!(refused.throttle_time_ms > 0);
    let ids = broker.control.read(|state| state.producer_epochs.len());
    assert_eq!(ids, burst);
    let mut body = roundtrip(&broker, ApiKey::InitProducerId, 3, &init(last), 1).await;
    let bumped = InitProducerIdResponse::decode(&mut body, 3).unwrap();
    assert_eq!(bumped.error_code, 0, "{bumped:?}");
    assert_eq!(bumped.producer_epoch, last.unwrap().1 + 1);
}

/// A fetch through a follower above its replica's high watermark, at an offset the leader has
/// already acknowledged, waits for the replica (RFC 0002 §3) instead of answering
/// OFFSET_OUT_OF_RANGE. The follower is cut off its peers, so its replica only catches up from
/// the bucket at its next lease read.
#[tokio::test]
async fn test_a_fetch_through_a_lagging_follower_waits_for_its_replica() {
    use weir_control::link::LocalLinks;
    use weir_control::plane::{ClusterSettings, Role};
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let meta: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let member = |node: i32| ControlPlaneSettings {
        address: format!("node-{node}"),
        cluster: Some(ClusterSettings {
            lease_renew: Duration::from_millis(100),
            lease_timeout: Duration::from_secs(30),
            ..ClusterSettings::new(node, "test", links.link_for(&format!("node-{node}")))
        }),
        ..ControlPlaneSettings::default()
    };
    let leader = ControlPlane::open(meta.clone(), member(1), 1)
        .await
        .unwrap();
    links.register("node-1", leader.clone());
    let follower = ControlPlane::open(meta, member(2), 2).await.unwrap();
    links.register("node-2", follower.clone());
    assert!(matches!(*follower.role().borrow(), Role::Follower { .. }));
    let topic_id = leader
        .create_topic(TOPIC, 1, BTreeMap::new(), 77)
        .await
        .unwrap();
    links.set_cut("node-2", true);
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = Arc::new(QuorumWriter::new(vec![bucket], 1).unwrap());
    let cache = Arc::new(ReadCache::new(1 << 20));
    let pipeline = |control: &ControlPlane| {
        ProducePipeline::start(
            ProduceSettings::default(),
            writer.clone(),
            control.clone(),
            cache.clone(),
            clock.clone(),
            5,
        )
    };
    let batch = build_test_batch(10, 100, (-1, -1, -1));
    let producing = pipeline(&leader);
    for _ in 0..2 {
        let ticket = ProduceTicket {
            partitions: vec![PartitionBatches {
                topic_id,
                partition: 0,
                batches: split_and_validate(&batch).unwrap(),
            }],
        };
        let outcome = producing.submit(ticket).await.await;
        assert!(
            matches!(outcome[..], [PartitionOutcome::Committed { .. }]),
            "{outcome:?}"
        );
    }
    let broker = Arc::new(Broker::new(
        BrokerSettings::default(),
        follower.clone(),
        pipeline(&follower),
        FetchReader::new(follower.clone(), writer.clone(), cache.clone()),
        clock.clone(),
        11,
    ));
    // The leader holds offsets 0..20; the follower's replica may not even know the topic's
    // batches yet. Offset 10 is the second batch.
    let request = fetch_request(10, 1 << 20).with_max_wait_ms(5_000);
    let frame = fetch::handle(broker, context(1), request)
        .await
        .expect("a response");
    assert!(
        records_in(frame.to_bytes()) > 0,
        "the second batch, not OFFSET_OUT_OF_RANGE"
    );
}

/// A control plane whose registry holds agents (node id, zone), each at 10.0.0.{node id}.
async fn registry_of(agents: &[(i32, &str)]) -> ControlPlane {
    registry_on(Arc::new(InMemory::new()), agents).await
}

/// As [`registry_of`], with the log in `meta`.
async fn registry_on(meta: Arc<dyn ObjectStore>, agents: &[(i32, &str)]) -> ControlPlane {
    use weir_control::{AgentRegistration, Entry};
    let control = ControlPlane::open(meta, ControlPlaneSettings::default(), 3)
        .await
        .unwrap();
    for &(node_id, zone) in agents {
        let registration = AgentRegistration {
            node_id,
            incarnation: format!("i{node_id}"),
            zone: zone.to_string(),
            host: format!("10.0.0.{node_id}"),
            port: 9000 + node_id,
            control_address: format!("10.0.0.{node_id}:7000"),
            at_ms: 0,
        };
        control
            .submit(Entry::RegisterAgent(registration))
            .await
            .unwrap();
    }
    control
}

/// A broker of node 1 (zone a) in a cluster whose registry holds `agents`.
async fn cluster_broker(agents: &[(i32, &str)]) -> Arc<Broker> {
    let control = registry_of(agents).await;
    let settings = BrokerSettings {
        node_id: 1,
        rack: Some("zone-a".into()),
        cluster_incarnation: Some("i1".into()),
        ..BrokerSettings::default()
    };
    broker_over(&control, settings)
}

/// Metadata names partition leaders in the client's zone: from `weir_az=` in the client id, else
/// the rack of an earlier Fetch on the same connection, else the answering agent's zone.
#[tokio::test]
async fn test_metadata_leaders_follow_the_rack_an_earlier_fetch_named() {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let broker = cluster_broker(&[(1, "zone-a"), (2, "zone-b"), (3, "zone-b")]).await;
    broker
        .control
        .create_topic("zoned", 16, BTreeMap::new(), 9)
        .await
        .unwrap();
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("zoned"))))]));
    let leaders = |mut body: Bytes| {
        let response = MetadataResponse::decode(&mut body, 9).unwrap();
        response.topics[0]
            .partitions
            .iter()
            .map(|p| p.leader_id.0)
            .collect::<std::collections::BTreeSet<i32>>()
    };
    let facts = ConnectionFacts::default();
    let here = roundtrip_on(&broker, &facts, ApiKey::Metadata, 9, &request, 1).await;
    assert_eq!(leaders(here), [1].into(), "the answering agent's zone");
    let fetch = fetch_request(0, 1024).with_rack_id(StrBytes::from_static_str("zone-b"));
    roundtrip_on(&broker, &facts, ApiKey::Fetch, 11, &fetch, 0).await;
    let there = roundtrip_on(&broker, &facts, ApiKey::Metadata, 9, &request, 1).await;
    assert_eq!(
        leaders(there),
        [2, 3].into(),
        "the zone of the connection's Fetch"
    );
    let other = roundtrip(&broker, ApiKey::Metadata, 9, &request, 1).await;
    assert_eq!(leaders(other), [1].into(), "another connection");
}

/// DescribeConfigs of another agent's broker resource answers from the cluster's registry (its
/// address and zone); a node id the registry does not hold is INVALID_REQUEST.
#[tokio::test]
async fn test_describe_configs_of_another_agent_reads_the_registry() {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
    let broker = cluster_broker(&[(1, "zone-a"), (2, "zone-b")]).await;
    let resource = |name: &str| {
        DescribeConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(None)
    };
    let request =
        DescribeConfigsRequest::default().with_resources(vec![resource("2"), resource("7")]);
    let mut body = roundtrip(&broker, ApiKey::DescribeConfigs, 1, &request, 0).await;
    let response = DescribeConfigsResponse::decode(&mut body, 1).unwrap();
    let [other, unknown] = &response.results[..] else {
        panic!("{response:?}");
    };
    assert_eq!(other.error_code, 0, "{other:?}");
    let value = |name: &str| {
        other
            .configs
            .iter()
            .find(|c| c.name.as_str() == name)
            .and_then(|c| c.value.as_ref())
            .map(|v| v.to_string())
    };
    assert_eq!(value("broker.id").as_deref(), Some("2"));
    assert_eq!(
        value("advertised.listeners").as_deref(),
        Some("PLAINTEXT://10.0.0.2:9002")
    );
    assert_eq!(value("broker.rack").as_deref(), Some("zone-b"));
    assert_eq!(unknown.error_code, 42, "{unknown:?}");
}

/// A cluster agent that has not registered yet lists itself (a restart serves clients while it
/// waits for its predecessor's fence) for the registration grace, then only the registry's
/// agents; group coordinators are only ever placed on registered agents.
#[tokio::test]
async fn test_an_unregistered_agent_lists_itself_only_for_the_grace() {
    let control = registry_of(&[(2, "zone-b")]).await;
    let with_grace = |grace: Duration| {
        broker_over(
            &control,
            BrokerSettings {
                node_id: 1,
                cluster_incarnation: Some("i1".into()),
                registration_grace: grace,
                ..BrokerSettings::default()
            },
        )
    };
    let ids =
        |broker: &Broker| -> Vec<i32> { broker.live_agents().iter().map(|a| a.node_id).collect() };
    let starting = with_grace(Duration::from_secs(60));
    assert_eq!(ids(&starting), [1, 2]);
    assert_eq!(starting.controller(&starting.live_agents()), 1);
    for group in ["a", "b", "c", "d", "e"] {
        assert_eq!(starting.coordinator_of(group).unwrap().node_id, 2);
    }
    let late = with_grace(Duration::ZERO);
    assert_eq!(ids(&late), [2]);
    assert_eq!(late.controller(&late.live_agents()), 2, "a listed agent");
}

/// Node 1 of a registry of two (zones a and b) with `registration_grace`, its metadata bucket
/// (to take down), control plane and broker.
async fn member_one_of_two(
    registration_grace: Duration,
) -> (Arc<weir_storage::ModelStore>, ControlPlane, Arc<Broker>) {
    use weir_storage::{LatencyProfile, ModelStore};
    let meta =
        Arc::new(ModelStore::new(Arc::new(InMemory::new()), LatencyProfile::local(), 1).unwrap());
    let control = registry_on(meta.clone(), &[(1, "zone-a"), (2, "zone-b")]).await;
    let broker = broker_over(
        &control,
        BrokerSettings {
            node_id: 1,
            cluster_incarnation: Some("i1".into()),
            registration_grace,
            ..BrokerSettings::default()
        },
    );
    (meta, control, broker)
}

/// The node ids `broker` lists.
fn live_ids(broker: &Broker) -> Vec<i32> {
    broker.live_agents().iter().map(|a| a.node_id).collect()
}

/// A registered cluster member whose control plane stays unavailable (a leader that cannot
/// write its log) stops listing itself after the registration grace, so its clients, which ask
/// it for Metadata, move to the agents that can acknowledge; available again, it lists itself.
#[tokio::test]
async fn test_an_agent_cut_off_from_its_log_stops_listing_itself() {
    let (meta, control, broker) = member_one_of_two(Duration::ZERO).await;
    let ids = || live_ids(&broker);
    assert_eq!(ids(), [1, 2]);
    meta.set_outage(true);
    let writer = control.clone();
    let failed = tokio::spawn(async move { writer.create_topic("t", 1, BTreeMap::new(), 1).await });
    let mut available = control.availability();
    tokio::time::timeout(Duration::from_secs(30), available.wait_for(|up| !*up))
        .await
        .expect("the failed log write makes the plane unavailable")
        .unwrap();
    assert_eq!(ids(), [2]);
    assert_eq!(broker.controller(&broker.live_agents()), 2);
    meta.set_outage(false);
    tokio::time::timeout(Duration::from_secs(30), available.wait_for(|up| *up))
        .await
        .expect("recovery once the bucket is back")
        .unwrap();
    assert_eq!(ids(), [1, 2]);
    let _ = failed.await;
}

/// An outage that ended while no call looked does not count toward the next: the agent lists
/// itself until the new outage itself has lasted the grace. (It used to keep the first
/// unavailable look's time, so a member whose plane was briefly unavailable at startup and
/// again a grace later left itself out at once.)
#[tokio::test]
async fn test_an_outage_that_ended_unseen_does_not_count_toward_the_next() {
    const GRACE: Duration = Duration::from_secs(2);
    let (meta, control, broker) = member_one_of_two(GRACE).await;
    let ids = || live_ids(&broker);
    let mut available = control.availability();
    let outage = |name: &'static str| {
        meta.set_outage(true);
        let writer = control.clone();
        tokio::spawn(async move { writer.create_topic(name, 1, BTreeMap::new(), 1).await })
    };
    let first = outage("first");
    tokio::time::timeout(Duration::from_secs(30), available.wait_for(|up| !*up))
        .await
        .expect("unavailable")
        .unwrap();
    assert_eq!(ids(), [1, 2], "within the grace");
    meta.set_outage(false);
    tokio::time::timeout(Duration::from_secs(30), available.wait_for(|up| *up))
        .await
        .expect("available again")
        .unwrap();
    let _ = first.await;
    // Nobody lists the agents while it is available; a grace later it is cut off again.
    tokio::time::sleep(GRACE + Duration::from_millis(100)).await;
    let second = outage("second");
    tokio::time::timeout(Duration::from_secs(30), available.wait_for(|up| !*up))
        .await
        .expect("unavailable again")
        .unwrap();
    assert_eq!(ids(), [1, 2], "a new outage, not yet as long as the grace");
    meta.set_outage(false);
    let _ = second.await;
}
