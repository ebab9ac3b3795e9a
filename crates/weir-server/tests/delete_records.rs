//! DeleteRecords (API 21) over TCP: low watermarks at every served version, what ListOffsets and
//! Fetch see afterwards, bad offsets and partitions (BAD-1), repetitions bounded to one move per
//! partition, and `timeout_ms` while the metadata log cannot be written.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, DeleteRecordsRequest, DeleteRecordsResponse, FetchRequest, ListOffsetsRequest,
};
use object_store::memory::InMemory;
use weir_produce::ProduceSettings;
use weir_protocol::records::{build_batch, RecordSpec};
use weir_protocol::Compression;
use weir_server::BrokerSettings;
use weir_storage::hold::{HeldStore, Hold};

use common::*;

const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const REQUEST_TIMED_OUT: i16 = 7;
const POLICY_VIOLATION: i16 = 44;
const EARLIEST: i64 = -2;
const TOPIC: &str = "dr";
/// Four batches of two records each: offsets 0..8, batches starting at 0, 2, 4 and 6.
const BATCHES: [i32; 4] = [2, 2, 2, 2];
const HIGH_WATERMARK: i64 = 8;

/// `(partition, offset)` moves per topic.
type Moves<'a> = &'a [(&'a str, &'a [(i32, i64)])];

fn delete(moves: Moves<'_>, timeout_ms: i32) -> DeleteRecordsRequest {
    DeleteRecordsRequest::default()
        .with_timeout_ms(timeout_ms)
        .with_topics(
            moves
                .iter()
                .map(|(topic, partitions)| {
                    DeleteRecordsTopic::default()
                        .with_name(name(topic))
                        .with_partitions(
                            partitions
                                .iter()
                                .map(|&(partition, offset)| {
                                    DeleteRecordsPartition::default()
                                        .with_partition_index(partition)
                                        .with_offset(offset)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// `(topic, partition, low watermark, error code)` in response order.
fn answers(response: &DeleteRecordsResponse) -> Vec<(String, i32, i64, i16)> {
    response
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(|p| {
                (
                    topic.name.0.to_string(),
                    p.partition_index,
                    p.low_watermark,
                    p.error_code,
                )
            })
        })
        .collect()
}

fn answer(topic: &str, partition: i32, low_watermark: i64, code: i16) -> (String, i32, i64, i16) {
    (topic.to_string(), partition, low_watermark, code)
}

/// An agent with `TOPIC` of two partitions, each holding `BATCHES`.
async fn agent_with_records(control_store: Arc<dyn object_store::ObjectStore>) -> Agent {
    let agent = Agent::start_on(
        BrokerSettings::default(),
        ProduceSettings::default(),
        control_store,
    )
    .await;
    agent.create_topic(TOPIC, 2).await;
    let mut client = agent.connect().await;
    for partition in 0..2 {
        // One batch per produce, as Kafka requires.
        for count in BATCHES {
            let request = produce(TOPIC, partition, records(&[count]), -1);
            let response = client.call(PRODUCE_VERSION, &request).await;
            assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
        }
    }
    assert_eq!(agent.watermarks(TOPIC, 0), (HIGH_WATERMARK, HIGH_WATERMARK));
    agent
}

async fn earliest(client: &mut Client, partition: i32) -> i64 {
    list_offsets(client, TOPIC, partition, EARLIEST).await.0
}

/// ListOffsets (offset, timestamp) for `target` (a timestamp or a special value).
async fn list_offsets(client: &mut Client, topic: &str, partition: i32, target: i64) -> (i64, i64) {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(target)])]);
    let response = client.call(LIST_OFFSETS_VERSION, &request).await;
    let answered = &response.topics[0].partitions[0];
    assert_eq!(answered.error_code, 0);
    (answered.offset, answered.timestamp)
}

/// (error code, base offset of the first batch returned) of a fetch at `offset`.
async fn fetch_at(client: &mut Client, offset: i64) -> (i16, Option<i64>) {
    let request: FetchRequest = fetch(TOPIC, 0, offset, 0);
    let response = client.call(FETCH_VERSION, &request).await;
    let partition = &response.responses[0].partitions[0];
    let first_base = partition
        .records
        .as_ref()
        .filter(|records| records.len() >= 8)
        .map(|records| i64::from_be_bytes(records[..8].try_into().unwrap()));
    (partition.error_code, first_base)
}

/// Each served version moves the start further; ListOffsets EARLIEST follows, a fetch below the
/// start is out of range, and a start inside a batch keeps that batch (its first records are
/// dropped by the client, as with Kafka).
#[tokio::test]
async fn test_delete_records_at_every_version_moves_the_low_watermark() {
    let agent = agent_with_records(Arc::new(InMemory::new())).await;
    let mut client = agent.connect().await;
    for (version, offset, expected) in [(0, 3, 3), (1, 4, 4), (2, -1, HIGH_WATERMARK)] {
        let request = delete(&[(TOPIC, &[(0, offset)])], 30_000);
        let response = client.call(version, &request).await;
        assert_eq!(
            answers(&response),
            vec![answer(TOPIC, 0, expected, 0)],
            "v{version}"
        );
        assert_eq!(earliest(&mut client, 0).await, expected, "v{version}");
        if expected == 3 {
            assert_eq!(fetch_at(&mut client, 2).await.0, OFFSET_OUT_OF_RANGE);
            assert_eq!(fetch_at(&mut client, 3).await, (0, Some(2)), "mid-batch");
        }
    }
    assert_eq!(fetch_at(&mut client, HIGH_WATERMARK).await, (0, None));
    agent.control.read(|state| {
        let partitions = &state.topic(TOPIC).unwrap().partitions;
        assert!(partitions[0].index.is_empty(), "every batch left the index");
        assert_eq!(partitions[1].log_start_offset, 0, "the other partition");
        assert_eq!(partitions[1].index.len(), BATCHES.len());
    });
}

/// A start inside a batch: ListOffsets by timestamp answers only records at or above it, from
/// that batch (its first records skipped) or, when none of its kept records reaches the target,
/// from the next batch.
#[tokio::test]
async fn test_list_offsets_by_timestamp_skips_records_below_a_start_inside_a_batch() {
    let agent = Agent::start_default().await;
    let topic = "dr-times";
    agent.create_topic(topic, 1).await;
    let mut client = agent.connect().await;
    let batch = |timestamps: &[i64]| {
        let records: Vec<RecordSpec> = timestamps
            .iter()
            .map(|&timestamp| RecordSpec {
                key: None,
                value: Some(b"v".to_vec()),
                timestamp,
            })
            .collect();
        build_batch(Compression::None, &records)
    };
    // Offsets 0-3 with timestamps 100, 400, 200, 300; offsets 4-5 with 500, 600.
    for timestamps in [&[100, 400, 200, 300][..], &[500, 600]] {
        let response = client
            .call(PRODUCE_VERSION, &produce(topic, 0, batch(timestamps), -1))
            .await;
        assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
    }
    let request = delete(&[(topic, &[(0, 2)])], 30_000);
    assert_eq!(
        answers(&client.call(2, &request).await),
        vec![answer(topic, 0, 2, 0)]
    );
    for (target, expected) in [
        (0, (2, 200)),   // not offset 0 (100), deleted
        (150, (2, 200)), // not offset 1 (400), deleted
        (250, (3, 300)),
        (350, (4, 500)), // offset 1 (400) is deleted: the next batch
        (600, (5, 600)),
        (601, (-1, -1)),
    ] {
        assert_eq!(
            list_offsets(&mut client, topic, 0, target).await,
            expected,
            "timestamp {target}"
        );
    }
}

/// Offsets outside [-1, high watermark], partitions the topic does not have and unknown topics
/// are answered with errors and move nothing; the good partition of the same request moves,
/// and a start below the current one answers the current one (never backwards).
#[tokio::test]
async fn test_delete_records_bad_input_answers_errors_and_moves_nothing_else() {
    let agent = agent_with_records(Arc::new(InMemory::new())).await;
    let mut client = agent.connect().await;
    let bad: &[(i32, i64)] = &[
        (0, HIGH_WATERMARK + 1),
        (0, -2),
        (0, i64::MIN),
        (0, i64::MAX),
        (1, 5),
        (2, 0),
        (-1, 0),
        (i32::MIN, -1),
    ];
    let request = delete(
        &[(TOPIC, bad), ("no-such-topic", &[(0, 0), (1, -1)])],
        30_000,
    );
    let response = client.call(2, &request).await;
    assert_eq!(
        answers(&response),
        vec![
            answer(TOPIC, 0, -1, OFFSET_OUT_OF_RANGE),
            answer(TOPIC, 0, -1, OFFSET_OUT_OF_RANGE),
            answer(TOPIC, 0, -1, OFFSET_OUT_OF_RANGE),
            answer(TOPIC, 0, -1, OFFSET_OUT_OF_RANGE),
            answer(TOPIC, 1, 5, 0),
            answer(TOPIC, 2, -1, UNKNOWN_TOPIC_OR_PARTITION),
            answer(TOPIC, -1, -1, UNKNOWN_TOPIC_OR_PARTITION),
            answer(TOPIC, i32::MIN, -1, UNKNOWN_TOPIC_OR_PARTITION),
            answer("no-such-topic", 0, -1, UNKNOWN_TOPIC_OR_PARTITION),
            answer("no-such-topic", 1, -1, UNKNOWN_TOPIC_OR_PARTITION),
        ]
    );
    assert_eq!(earliest(&mut client, 0).await, 0);
    assert_eq!(earliest(&mut client, 1).await, 5);
    let backwards = client.call(1, &delete(&[(TOPIC, &[(1, 2)])], 30_000)).await;
    assert_eq!(answers(&backwards), vec![answer(TOPIC, 1, 5, 0)]);
    assert_eq!(earliest(&mut client, 1).await, 5);
    assert!(agent
        .control
        .read(|state| state.topic("no-such-topic").is_none()));
}

/// Records of a compacted topic cannot be deleted, as in Kafka: `POLICY_VIOLATION` for its
/// known partitions (3 for the others), nothing moves; with `compact,delete` they can.
#[tokio::test]
async fn test_delete_records_needs_the_delete_cleanup_policy() {
    let agent = agent_with_records(Arc::new(InMemory::new())).await;
    let policy = |value: &str| [("cleanup.policy".to_string(), value.to_string())].into();
    // Seeds of their own: `create_topic_with` always uses one seed, hence one topic id.
    for (seed, topic, value) in [
        (100, "compacted", "compact"),
        (101, "both", "compact,delete"),
    ] {
        let created = agent.control.create_topic(topic, 1, policy(value), seed);
        created.await.unwrap();
    }
    let mut client = agent.connect().await;
    let response = client
        .call(
            2,
            &delete(
                &[("compacted", &[(0, 0), (1, 0)]), ("both", &[(0, -1)])],
                30_000,
            ),
        )
        .await;
    assert_eq!(
        answers(&response),
        vec![
            answer("compacted", 0, -1, POLICY_VIOLATION),
            answer("compacted", 1, -1, UNKNOWN_TOPIC_OR_PARTITION),
            answer("both", 0, 0, 0),
        ]
    );
}

/// A partition repeated many times, in a topic repeated twice, becomes one move to the largest
/// offset asked: every repetition gets that answer. An empty request gets an empty answer.
#[tokio::test]
async fn test_delete_records_repeated_partitions_answer_the_largest_offset() {
    let agent = agent_with_records(Arc::new(InMemory::new())).await;
    let mut client = agent.connect().await;
    let repeated: Vec<(i32, i64)> = (0..20_000).map(|i| (0, i % 6)).collect();
    let request = delete(&[(TOPIC, &repeated), (TOPIC, &[(0, 1), (1, 2)])], 30_000);
    let response = client.call(2, &request).await;
    let got = answers(&response);
    assert_eq!(got.len(), repeated.len() + 2);
    assert!(
        got[..repeated.len()] == vec![answer(TOPIC, 0, 5, 0); repeated.len()],
        "every repetition answers the largest offset"
    );
    assert_eq!(
        got[repeated.len()..],
        [answer(TOPIC, 0, 5, 0), answer(TOPIC, 1, 2, 0)]
    );
    assert_eq!(earliest(&mut client, 0).await, 5);

    let empty = client.call(0, &DeleteRecordsRequest::default()).await;
    assert!(empty.topics.is_empty());
}

/// Versions outside 0–2 and bodies that do not decode (a partition count with nothing behind
/// it, a count far beyond the frame) close the connection; the log start is unchanged.
#[tokio::test]
async fn test_delete_records_bad_frames_close_the_connection() {
    let agent = agent_with_records(Arc::new(InMemory::new())).await;
    let mut unknown_version = header(1, 3);
    unknown_version.put_u8(0); // header tagged fields
    unknown_version.extend_from_slice(&[0u8; 16]);
    let mut truncated = header(1, 0);
    truncated.put_i32(1); // one topic
    truncated.put_i16(2);
    truncated.extend_from_slice(b"dr");
    truncated.put_i32(i32::MAX); // partitions, with none behind the count
    for frame in [framed(&unknown_version), framed(&truncated)] {
        let mut client = agent.connect().await;
        client.write_raw(&frame).await;
        client.expect_closed().await;
    }
    assert_agent_answers(&agent).await;
    let mut client = agent.connect().await;
    assert_eq!(earliest(&mut client, 0).await, 0);
}

/// A DeleteRecords frame is bounded like every request other than Produce: above
/// `max_nonproduce_frame_bytes` the connection closes before the body is decoded; below it the
/// same partitions are answered.
#[tokio::test]
async fn test_delete_records_frame_above_the_nonproduce_limit_closes_the_connection() {
    let settings = BrokerSettings {
        max_nonproduce_frame_bytes: 4096,
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    let partitions = |n: i32| -> Vec<(i32, i64)> { (0..n).map(|p| (p, 0)).collect() };
    let large = encode_request(0, 1, &delete(&[(TOPIC, &partitions(1000))], 30_000));
    assert!(large.len() > 4096);
    let mut client = agent.connect().await;
    client.write_raw(&large).await;
    client.expect_closed().await;
    let mut client = agent.connect().await;
    let response = client
        .call(0, &delete(&[(TOPIC, &partitions(100))], 30_000))
        .await;
    let got = answers(&response);
    assert_eq!(got.len(), 100);
    assert!(got
        .iter()
        .all(|(_, _, low, code)| (*low, *code) == (-1, UNKNOWN_TOPIC_OR_PARTITION)));
}

/// While the metadata log cannot be written, the answer comes after `timeout_ms` with
/// REQUEST_TIMED_OUT; once the log is writable again DeleteRecords succeeds.
#[tokio::test]
async fn test_delete_records_times_out_while_the_log_is_unwritable() {
    let hold = Hold::released();
    let store = Arc::new(HeldStore::new(
        Arc::new(InMemory::new()),
        "meta",
        hold.clone(),
    ));
    let agent = agent_with_records(store).await;
    let mut client = agent.connect().await;
    hold.engage();
    let response = client
        .call(1, &delete(&[(TOPIC, &[(0, 4), (1, 2)])], 200))
        .await;
    assert_eq!(
        answers(&response),
        vec![
            answer(TOPIC, 0, -1, REQUEST_TIMED_OUT),
            answer(TOPIC, 1, -1, REQUEST_TIMED_OUT),
        ]
    );
    hold.release();
    // The control plane retries its write or recovers; either way a new request succeeds.
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    loop {
        let response = client.call(1, &delete(&[(TOPIC, &[(0, 6)])], 5_000)).await;
        if answers(&response) == vec![answer(TOPIC, 0, 6, 0)] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{response:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(earliest(&mut client, 0).await, 6);
}

/// A request header (v2, flexible) for DeleteRecords `version` with a null client id.
fn header(correlation: i32, version: i16) -> bytes::BytesMut {
    let mut header = bytes::BytesMut::new();
    header.put_i16(21);
    header.put_i16(version);
    header.put_i32(correlation);
    header.put_i16(-1);
    header
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(payload);
    frame
}
