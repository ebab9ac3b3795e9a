//! The agent over TCP with hand-built frames: response order (ORD-3), acks=0, fetch long-poll.

mod common;

use std::time::Duration;

use kafka_protocol::messages::{ApiVersionsRequest, FetchRequest, MetadataRequest, ProduceRequest};
use weir_produce::ProduceSettings;
use weir_protocol::batch::split_and_validate;
use weir_server::BrokerSettings;

use common::*;

/// Base offset and error code of the single partition of a produce response.
fn produce_result(response: &kafka_protocol::messages::ProduceResponse) -> (i16, i64) {
    let partition = &response.responses[0].partition_responses[0];
    (partition.error_code, partition.base_offset)
}

/// ORD-3: produces, a Metadata and an ApiVersions request written back to back on one
/// connection are answered in request order, with offsets in request order. The produces wait
/// for a flush interval, so the Metadata and ApiVersions answers are ready long before them.
#[tokio::test]
async fn test_connection_pipelined_responses_in_request_order() {
    let produce_settings = ProduceSettings {
        flush_interval: Duration::from_millis(50),
        ..ProduceSettings::default()
    };
    let agent = Agent::start(BrokerSettings::default(), produce_settings).await;
    agent.create_topic("ord3", 1).await;
    let mut client = agent.connect().await;

    let mut frames = Vec::new();
    let mut expected = Vec::new();
    let push_produce = |client: &mut Client, frames: &mut Vec<u8>, count: i32| {
        let correlation = client.next_correlation();
        frames.extend_from_slice(&encode_request(
            PRODUCE_VERSION,
            correlation,
            &produce("ord3", 0, records(&[count]), -1),
        ));
        (correlation, count)
    };
    expected.push(("produce", push_produce(&mut client, &mut frames, 3)));
    expected.push(("produce", push_produce(&mut client, &mut frames, 2)));
    let correlation = client.next_correlation();
    frames.extend_from_slice(&encode_request(
        METADATA_VERSION,
        correlation,
        &metadata(&["ord3"]),
    ));
    expected.push(("metadata", (correlation, 0)));
    expected.push(("produce", push_produce(&mut client, &mut frames, 4)));
    let correlation = client.next_correlation();
    frames.extend_from_slice(&encode_request(
        API_VERSIONS_VERSION,
        correlation,
        &api_versions(),
    ));
    expected.push(("api_versions", (correlation, 0)));
    expected.push(("produce", push_produce(&mut client, &mut frames, 1)));
    client.write_raw(&frames).await;

    let mut next_offset = 0i64;
    for (kind, (correlation, count)) in expected {
        let frame = client.read_frame().await.expect("response");
        match kind {
            "produce" => {
                let (got, response) = decode_response::<ProduceRequest>(frame, PRODUCE_VERSION);
                assert_eq!(got, correlation);
                assert_eq!(produce_result(&response), (0, next_offset));
                next_offset += i64::from(count);
            }
            "metadata" => {
                let (got, response) = decode_response::<MetadataRequest>(frame, METADATA_VERSION);
                assert_eq!(got, correlation);
                assert_eq!(response.topics[0].error_code, 0);
                assert_eq!(response.topics[0].partitions.len(), 1);
            }
            _ => {
                let (got, response) =
                    decode_response::<ApiVersionsRequest>(frame, API_VERSIONS_VERSION);
                assert_eq!(got, correlation);
                assert_eq!(response.error_code, 0);
            }
        }
    }
    assert_eq!(next_offset, 10);
    assert_eq!(agent.watermarks("ord3", 0), (10, 10));
}

/// acks=0 gets no response, but the data is committed: the next response on the connection is
/// the Fetch behind it, which long-polls until the data is there.
#[tokio::test]
async fn test_produce_acks_zero_no_response_but_committed() {
    let agent = Agent::start_default().await;
    agent.create_topic("fire", 1).await;
    let mut client = agent.connect().await;
    // Produce v3+ carries one batch per partition: two requests, both fire-and-forget.
    for count in [2, 3] {
        client
            .send(PRODUCE_VERSION, &produce("fire", 0, records(&[count]), 0))
            .await;
    }
    let fetch_correlation = client
        .send(FETCH_VERSION, &fetch("fire", 0, 0, 30_000))
        .await;
    let (correlation, response) = client.recv::<FetchRequest>(FETCH_VERSION).await;
    assert_eq!(correlation, fetch_correlation, "no response to acks=0");
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.high_watermark, 5);
    let batches = split_and_validate(partition.records.as_ref().unwrap()).unwrap();
    let offsets: Vec<(i64, i32)> = batches
        .iter()
        .map(|b| (b.header.base_offset, b.header.records_count))
        .collect();
    assert_eq!(offsets, vec![(0, 2), (2, 3)]);

    let latest = client
        .call(LIST_OFFSETS_VERSION, &list_latest("fire", 0))
        .await;
    let partition = &latest.topics[0].partitions[0];
    assert_eq!((partition.error_code, partition.offset), (0, 5));
}

/// A long-polling Fetch on an empty partition returns with the data as soon as a produce on
/// another connection commits.
#[tokio::test]
async fn test_fetch_long_poll_returns_data_after_commit() {
    let agent = Agent::start_default().await;
    agent.create_topic("poll", 1).await;
    let mut consumer = agent.connect().await;
    let sent = consumer
        .send(FETCH_VERSION, &fetch("poll", 0, 0, 5_000))
        .await;
    let waiting = tokio::spawn(async move { consumer.recv::<FetchRequest>(FETCH_VERSION).await });
    // Let the fetch find the partition empty and park (not needed for correctness).
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut producer = agent.connect().await;
    let response = producer
        .call(PRODUCE_VERSION, &produce("poll", 0, records(&[4]), -1))
        .await;
    assert_eq!(produce_result(&response), (0, 0));

    let (correlation, response) = waiting.await.unwrap();
    assert_eq!(correlation, sent);
    let partition = &response.responses[0].partitions[0];
    assert_eq!((partition.error_code, partition.high_watermark), (0, 4));
    let batches = split_and_validate(partition.records.as_ref().unwrap()).unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].header.records_count, 4);
}

/// The long-poll is woken by the commit rather than by its deadline: with a wait far beyond the
/// hang guard, the fetch can only answer in time if the commit woke it.
#[tokio::test]
async fn test_fetch_long_poll_woken_by_commit_not_deadline() {
    let settings = BrokerSettings {
        max_fetch_wait: Duration::from_secs(3_600),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    agent.create_topic("wake", 1).await;
    let mut consumer = agent.connect().await;
    consumer
        .send(FETCH_VERSION, &fetch("wake", 0, 0, i32::MAX))
        .await;
    let waiting = tokio::spawn(async move { consumer.recv::<FetchRequest>(FETCH_VERSION).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "an empty fetch waits");

    let mut producer = agent.connect().await;
    let response = producer
        .call(PRODUCE_VERSION, &produce("wake", 0, records(&[2]), 1))
        .await;
    assert_eq!(produce_result(&response), (0, 0));
    // `recv` panics after the hang guard, far below the fetch's own wait.
    let (_, response) = waiting
        .await
        .expect("the commit did not wake the long-poll");
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.high_watermark, 2);
    assert!(!partition.records.as_ref().unwrap().is_empty());
}

/// A Fetch at offset 0 of an unknown topic answers at once with an error instead of waiting.
#[tokio::test]
async fn test_fetch_unknown_topic_answers_without_waiting() {
    let settings = BrokerSettings {
        max_fetch_wait: Duration::from_secs(3_600),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    let mut client = agent.connect().await;
    let response = client
        .call(FETCH_VERSION, &fetch("missing", 0, 0, i32::MAX))
        .await;
    assert_eq!(response.responses[0].partitions[0].error_code, 3);
}

/// `min_bytes = 0` answers at once, with no data, instead of long-polling for `max_wait_ms`
/// (as in Kafka). The hang guard (60 s) is far below the hour the fetch may wait.
#[tokio::test]
async fn test_fetch_min_bytes_zero_answers_without_waiting() {
    let settings = BrokerSettings {
        max_fetch_wait: Duration::from_secs(3_600),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    agent.create_topic("empty", 1).await;
    let mut client = agent.connect().await;
    let request = fetch("empty", 0, 0, i32::MAX).with_min_bytes(0);
    let response = client.call(FETCH_VERSION, &request).await;
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.high_watermark, 0);
    assert!(partition.records.as_ref().is_none_or(|r| r.is_empty()));
}

/// Fetches pipelined on one connection are served one at a time (the next waits for the previous
/// response to be written) and requests behind them still answer, in order.
#[tokio::test]
async fn test_fetch_pipelined_fetches_answer_in_order() {
    let agent = Agent::start_default().await;
    agent.create_topic("pipe", 1).await;
    let mut producer = agent.connect().await;
    let response = producer
        .call(PRODUCE_VERSION, &produce("pipe", 0, records(&[2]), -1))
        .await;
    assert_eq!(produce_result(&response), (0, 0));
    let mut consumer = agent.connect().await;
    let first = consumer
        .send(FETCH_VERSION, &fetch("pipe", 0, 0, 100))
        .await;
    let second = consumer
        .send(FETCH_VERSION, &fetch("pipe", 0, 2, 100))
        .await;
    let third = consumer
        .send(FETCH_VERSION, &fetch("pipe", 0, 0, 100))
        .await;
    for expected in [first, second, third] {
        let (correlation, response) = consumer.recv::<FetchRequest>(FETCH_VERSION).await;
        assert_eq!(correlation, expected);
        assert_eq!(response.responses[0].partitions[0].error_code, 0);
    }
}
