//! Requests on one connection take effect in the order they were sent (docs/architecture.md,
//! "Request order"): pipelined commits never land out of order, and a read behind a write on the
//! same connection sees the write.

mod common;

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_protocol::error_code;

use common::*;

const TOPIC: &str = "ordered";
const COMMIT_VERSION: i16 = 8;
const OFFSET_FETCH_VERSION: i16 = 7;

fn commit(group: &str, offset: i64) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(name(TOPIC))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)])])
}

fn offset_fetch(group: &str) -> OffsetFetchRequest {
    OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(name(TOPIC))
            .with_partition_indexes(vec![0])]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pipelined_commits_and_fetch_take_effect_in_request_order() {
    let agent = Agent::start_default().await;
    agent.create_topic(TOPIC, 1).await;
    let mut client = agent.connect().await;
    let group = "pipelined";
    for round in 0..1_000i64 {
        let first = round * 2;
        // Written back to back, before any response is read.
        let commit_a = client.send(COMMIT_VERSION, &commit(group, first)).await;
        let commit_b = client.send(COMMIT_VERSION, &commit(group, first + 1)).await;
        let fetch = client
            .send(OFFSET_FETCH_VERSION, &offset_fetch(group))
            .await;
        for sent in [commit_a, commit_b] {
            let (correlation, response) = client.recv::<OffsetCommitRequest>(COMMIT_VERSION).await;
            assert_eq!(correlation, sent, "responses out of request order");
            let code = response.topics[0].partitions[0].error_code;
            assert_eq!(code, error_code::NONE, "round {round}: commit failed");
        }
        let (correlation, response) = client
            .recv::<OffsetFetchRequest>(OFFSET_FETCH_VERSION)
            .await;
        assert_eq!(correlation, fetch);
        let committed = response.topics[0].partitions[0].committed_offset;
        assert_eq!(
            committed,
            first + 1,
            "round {round}: OffsetFetch behind two commits saw {committed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_fetch_behind_produce_on_one_connection_sees_the_records() {
    let agent = Agent::start_default().await;
    agent.create_topic(TOPIC, 1).await;
    let mut client = agent.connect().await;
    for round in 0..50i64 {
        let produced = client
            .send(PRODUCE_VERSION, &produce(TOPIC, 0, records(&[1]), -1))
            .await;
        let latest = client
            .send(LIST_OFFSETS_VERSION, &list_latest(TOPIC, 0))
            .await;
        let (correlation, response) = client.recv::<ProduceRequest>(PRODUCE_VERSION).await;
        assert_eq!(correlation, produced);
        let partition = &response.responses[0].partition_responses[0];
        assert_eq!(partition.error_code, error_code::NONE);
        let (correlation, response) = client
            .recv::<ListOffsetsRequest>(LIST_OFFSETS_VERSION)
            .await;
        assert_eq!(correlation, latest);
        let end = response.topics[0].partitions[0].offset;
        assert_eq!(end, round + 1, "ListOffsets behind a produce missed it");
    }
}
