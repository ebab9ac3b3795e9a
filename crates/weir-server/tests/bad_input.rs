//! BAD-1 over TCP: malformed, oversize or invalid input gets a Kafka error code or a closed
//! connection, never a dead agent or a change to stored data.

mod common;

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiVersionsRequest, ProduceRequest};
use weir_produce::ProduceSettings;
use weir_server::BrokerSettings;

use common::*;

const CORRUPT_MESSAGE: i16 = 2;
const MESSAGE_TOO_LARGE: i16 = 10;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const UNSUPPORTED_VERSION: i16 = 35;

/// A request header (v1, non-flexible) with no body.
fn bare_header(api_key: i16, version: i16, correlation: i32) -> BytesMut {
    let mut header = BytesMut::new();
    header.put_i16(api_key);
    header.put_i16(version);
    header.put_i32(correlation);
    header.put_i16(-1); // null client id
    header
}

fn framed(payload: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(4 + payload.len());
    frame.put_i32(payload.len() as i32);
    frame.extend_from_slice(payload);
    frame.freeze()
}

#[tokio::test]
async fn test_connection_oversize_frame_closes_connection_agent_survives() {
    let settings = BrokerSettings {
        max_frame_bytes: 64 * 1024,
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    for declared in [64 * 1024 + 1, 100 * 1024 * 1024, i32::MAX] {
        let mut client = agent.connect().await;
        client.write_raw(&declared.to_be_bytes()).await;
        client.expect_closed().await;
    }
    // A frame at the limit is still read (and this one is answered).
    let mut client = agent.connect().await;
    let response = client.call(API_VERSIONS_VERSION, &api_versions()).await;
    assert_eq!(response.error_code, 0);
    assert_agent_answers(&agent).await;
}

#[tokio::test]
async fn test_connection_short_or_negative_frame_closes_connection() {
    let agent = Agent::start_default().await;
    for declared in [0i32, 3, 7, -1, i32::MIN] {
        let mut client = agent.connect().await;
        client.write_raw(&declared.to_be_bytes()).await;
        client.write_raw(&[0u8; 8]).await;
        client.expect_closed().await;
    }
    assert_agent_answers(&agent).await;
}

/// Frames whose body does not decode close only their own connection; a good request sent
/// before the garbage on the same connection is still answered first.
#[tokio::test]
async fn test_connection_garbage_frame_closes_connection() {
    let agent = Agent::start_default().await;
    // Metadata v1 declaring 5 topics with nothing behind the count.
    let mut truncated = bare_header(3, 1, 1);
    truncated.put_i32(5);
    // Produce v9 (flexible) with a body of 0xff bytes.
    let mut produce_garbage = bare_header(0, 9, 1);
    produce_garbage.put_u8(0); // header tagged fields
    produce_garbage.extend_from_slice(&[0xff; 40]);
    // Metadata v12 with a topic name length far beyond the frame.
    let mut long_name = bare_header(3, 12, 1);
    long_name.put_u8(0);
    long_name.put_u8(2); // one topic
    long_name.extend_from_slice(&[0u8; 16]); // topic id
    long_name.extend_from_slice(&[0xff, 0xff, 0x03]); // compact string length ~65k
    long_name.extend_from_slice(b"abc");
    for garbage in [truncated, produce_garbage, long_name] {
        let mut client = agent.connect().await;
        let sent = client.send(API_VERSIONS_VERSION, &api_versions()).await;
        client.write_raw(&framed(&garbage)).await;
        let (correlation, response) = client
            .recv::<ApiVersionsRequest>(API_VERSIONS_VERSION)
            .await;
        assert_eq!((correlation, response.error_code), (sent, 0));
        client.expect_closed().await;
    }
    assert_agent_answers(&agent).await;
}

#[tokio::test]
async fn test_connection_unknown_api_key_or_version_closes_connection() {
    let agent = Agent::start_default().await;
    let cases = [
        (999i16, 0i16), // not a Kafka API
        (-1, 0),        // negative key
        (26, 0),        // EndTxn: a Kafka API Weir does not serve
        (0, 2),         // Produce below the served range
        (3, 99),        // Metadata above the served range
    ];
    for (api_key, version) in cases {
        let mut client = agent.connect().await;
        let mut payload = bare_header(api_key, version, 5);
        payload.extend_from_slice(&[0u8; 16]);
        client.write_raw(&framed(&payload)).await;
        client.expect_closed().await;
    }
    assert_agent_answers(&agent).await;
}

/// KIP-511: an ApiVersions request at a version the agent does not know gets
/// UNSUPPORTED_VERSION in a v0 body, with the key list so the client can retry.
#[tokio::test]
async fn test_api_versions_unknown_version_answers_v0_with_error() {
    let agent = Agent::start_default().await;
    let mut client = agent.connect().await;
    // v99 uses the flexible header (v2): client id, then empty tagged fields; no body needed.
    let mut payload = bare_header(18, 99, 42);
    payload.put_u8(0);
    client.write_raw(&framed(&payload)).await;
    let frame = client.read_frame().await.expect("an answer");
    let (correlation, response) = decode_response::<ApiVersionsRequest>(frame, 0);
    assert_eq!(correlation, 42);
    assert_eq!(response.error_code, UNSUPPORTED_VERSION);
    let listed = response
        .api_keys
        .iter()
        .find(|api| api.api_key == 18)
        .expect("ApiVersions is listed");
    assert_eq!((listed.min_version, listed.max_version), (0, 4));
    // The connection stays usable.
    let response = client.call(API_VERSIONS_VERSION, &api_versions()).await;
    assert_eq!(response.error_code, 0);
}

#[tokio::test]
async fn test_metadata_invalid_topic_name_gets_invalid_topic() {
    let agent = Agent::start_default().await;
    let mut client = agent.connect().await;
    let too_long = "t".repeat(250);
    let names = ["bad/name", "..", ".", "", "sp ace", too_long.as_str()];
    let request = metadata(&names).with_allow_auto_topic_creation(true);
    let response = client.call(METADATA_VERSION, &request).await;
    assert_eq!(response.topics.len(), names.len());
    for topic in &response.topics {
        assert_eq!(
            topic.error_code, INVALID_TOPIC_EXCEPTION,
            "{:?}",
            topic.name
        );
    }
    assert!(
        agent.control.read(|state| state.topics.is_empty()),
        "nothing auto-created"
    );
}

/// A batch with a bad CRC gets CORRUPT_MESSAGE and is not stored; a good partition in the same
/// request is committed.
#[tokio::test]
async fn test_produce_corrupt_crc_gets_corrupt_message() {
    let agent = Agent::start_default().await;
    agent.create_topic("crc", 2).await;
    let mut corrupt = records(&[3]).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x01;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name("crc"))
            .with_partition_data(vec![
                PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(corrupt))),
                PartitionProduceData::default()
                    .with_index(1)
                    .with_records(Some(records(&[2]))),
            ])]);
    let mut client = agent.connect().await;
    let response = client.call(PRODUCE_VERSION, &request).await;
    let partitions = &response.responses[0].partition_responses;
    assert_eq!(
        (
            partitions[0].index,
            partitions[0].error_code,
            partitions[0].base_offset
        ),
        (0, CORRUPT_MESSAGE, -1)
    );
    assert_eq!(
        (
            partitions[1].index,
            partitions[1].error_code,
            partitions[1].base_offset
        ),
        (1, 0, 0)
    );
    assert_eq!(agent.watermarks("crc", 0), (0, 0), "nothing stored");
    assert_eq!(agent.watermarks("crc", 1), (2, 2));
}

#[tokio::test]
async fn test_produce_batch_over_max_message_bytes_gets_message_too_large() {
    let agent = Agent::start_default().await;
    let configs = BTreeMap::from([("max.message.bytes".to_string(), "200".to_string())]);
    agent.create_topic_with("small", 1, configs).await;
    let big = records(&[40]);
    assert!(big.len() > 200, "{} bytes", big.len());
    let mut client = agent.connect().await;
    let response = client
        .call(PRODUCE_VERSION, &produce("small", 0, big, -1))
        .await;
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(
        (partition.error_code, partition.base_offset),
        (MESSAGE_TOO_LARGE, -1)
    );
    assert_eq!(agent.watermarks("small", 0), (0, 0));

    let fits = records(&[2]);
    assert!(fits.len() <= 200);
    let response = client
        .call(PRODUCE_VERSION, &produce("small", 0, fits, -1))
        .await;
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!((partition.error_code, partition.base_offset), (0, 0));
}

/// Requests other than Produce decode into many small objects, so they get a tighter frame
/// limit: a Metadata request above it closes the connection, a Produce of the same size is read.
#[tokio::test]
async fn test_connection_nonproduce_frame_limit_closes_connection() {
    let settings = BrokerSettings {
        max_nonproduce_frame_bytes: 1024,
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    // Metadata v0 declaring 1000 topics with empty names: 4 KB on the wire.
    let mut metadata = bare_header(3, 0, 1);
    metadata.put_i32(1000);
    for _ in 0..1000 {
        metadata.put_i16(0);
    }
    let mut client = agent.connect().await;
    client.write_raw(&framed(&metadata)).await;
    client.expect_closed().await;
    assert_agent_answers(&agent).await;
}
