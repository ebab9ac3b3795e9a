//! Consumer group APIs over TCP at every served version: one member's whole life (find the
//! coordinator, MEMBER_ID_REQUIRED round trip, join, sync, heartbeat, commit, fetch, describe,
//! list, offset delete, leave, delete) with each API driven at each of its versions. Every
//! response must encode at the negotiated version (a field that does not exist there must not be
//! set) and carry the right values.

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use weir_protocol::error_code;

use common::*;

const TOPIC: &str = "orders";

/// An agent whose groups complete their first rebalance at once (no initial delay), so each
/// step below gets its answer immediately.
async fn group_agent() -> Agent {
    let settings = weir_server::BrokerSettings {
        groups: weir_groups::GroupSettings {
            initial_rebalance_delay_ms: 0,
            ..weir_groups::GroupSettings::default()
        },
        ..weir_server::BrokerSettings::default()
    };
    Agent::start(settings, weir_produce::ProduceSettings::default()).await
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// A `consumer` protocol subscription (v0) to `TOPIC`.
fn subscription() -> Bytes {
    let mut bytes = BytesMut::new();
    bytes.put_i16(0);
    bytes.put_i32(1);
    bytes.put_i16(TOPIC.len() as i16);
    bytes.put_slice(TOPIC.as_bytes());
    bytes.put_i32(-1);
    bytes.freeze()
}

/// Joins `group` at JoinGroup `version` as a new member; returns (member id, response).
async fn join(client: &mut Client, group: &str, version: i16) -> (String, JoinGroupResponse) {
    let mut request = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(10_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(subscription())]);
    if version >= 1 {
        request.rebalance_timeout_ms = 10_000;
    }
    let mut response = client.call(version, &request).await;
    if version >= 4 {
        assert_eq!(
            response.error_code,
            error_code::MEMBER_ID_REQUIRED,
            "v{version}"
        );
        assert!(
            response.member_id.starts_with("weir-test-"),
            "{:?}",
            response.member_id
        );
        request.member_id = response.member_id.clone();
        response = client.call(version, &request).await;
    }
    assert_eq!(response.error_code, error_code::NONE, "join v{version}");
    (response.member_id.to_string(), response)
}

async fn find_coordinator(client: &mut Client, group: &str, version: i16) -> (i16, i32) {
    let mut request = FindCoordinatorRequest::default();
    if version >= 4 {
        request.coordinator_keys = vec![s(group)];
    } else {
        request.key = s(group);
    }
    let response = client.call(version, &request).await;
    if version >= 4 {
        let coordinator = &response.coordinators[0];
        (coordinator.error_code, coordinator.port)
    } else {
        (response.error_code, response.port)
    }
}

async fn fetch_offset(client: &mut Client, group: &str, version: i16) -> (i64, String) {
    let response: OffsetFetchResponse = if version >= 8 {
        let request =
            OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s(group)))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s(TOPIC)))
                    .with_partition_indexes(vec![0, 1])]))]);
        let response = client.call(version, &request).await;
        let group = &response.groups[0];
        assert_eq!(group.error_code, error_code::NONE);
        let partitions = &group.topics[0].partitions;
        assert_eq!(partitions[1].committed_offset, -1, "never committed");
        return (
            partitions[0].committed_offset,
            partitions[0]
                .metadata
                .clone()
                .unwrap_or_default()
                .to_string(),
        );
    } else {
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_indexes(vec![0, 1])]));
        client.call(version, &request).await
    };
    assert_eq!(response.error_code, error_code::NONE);
    let partitions = &response.topics[0].partitions;
    assert_eq!(partitions[1].committed_offset, -1, "never committed");
    (
        partitions[0].committed_offset,
        partitions[0]
            .metadata
            .clone()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn commit(
    client: &mut Client,
    group: &str,
    member: &str,
    generation: i32,
    version: i16,
    offset: i64,
) -> i16 {
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)
                .with_committed_metadata(Some(s(&format!("meta-{offset}"))))])]);
    let response = client.call(version, &request).await;
    response.topics[0].partitions[0].error_code
}

async fn describe(client: &mut Client, group: &str, version: i16) -> DescribeGroupsResponse {
    let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
    client.call(version, &request).await
}

/// One member's life with every API at `version` clamped into its served range.
async fn member_life(agent: &Agent, version: i16) {
    let clamp = |min: i16, max: i16| version.clamp(min, max);
    let group = format!("group-v{version}");
    let mut client = agent.connect().await;
    let (code, port) = find_coordinator(&mut client, &group, clamp(0, 5)).await;
    let advertised = weir_server::BrokerSettings::default().advertised_port;
    assert_eq!((code, port), (error_code::NONE, advertised));

    let join_version = clamp(0, 9);
    let (member, joined) = join(&mut client, &group, join_version).await;
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader.to_string(), member, "the only member leads");
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.members.len(), 1);
    assert_eq!(joined.members[0].metadata, subscription());

    let assignment = Bytes::from(format!("assignment bytes v{version}\u{0}\u{ff}").into_bytes());
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(s(&group)))
        .with_generation_id(1)
        .with_member_id(s(&member))
        .with_assignments(vec![SyncGroupRequestAssignment::default()
            .with_member_id(s(&member))
            .with_assignment(assignment.clone())]);
    let synced = client.call(clamp(0, 5), &sync).await;
    assert_eq!(synced.error_code, error_code::NONE);
    assert_eq!(synced.assignment, assignment, "passed through unchanged");

    let heartbeat = HeartbeatRequest::default()
        .with_group_id(GroupId(s(&group)))
        .with_generation_id(1)
        .with_member_id(s(&member));
    assert_eq!(
        client.call(clamp(0, 4), &heartbeat).await.error_code,
        error_code::NONE
    );
    let stale = heartbeat.clone().with_generation_id(0);
    assert_eq!(
        client.call(clamp(0, 4), &stale).await.error_code,
        error_code::ILLEGAL_GENERATION
    );

    let commit_version = clamp(2, 9);
    let offset = 100 + i64::from(version);
    assert_eq!(
        commit(&mut client, &group, &member, 1, commit_version, offset).await,
        0
    );
    assert_eq!(
        commit(&mut client, &group, "stranger", 1, commit_version, 1).await,
        error_code::UNKNOWN_MEMBER_ID
    );
    let (committed, metadata) = fetch_offset(&mut client, &group, clamp(1, 9)).await;
    assert_eq!((committed, metadata), (offset, format!("meta-{offset}")));

    let described = describe(&mut client, &group, clamp(0, 5)).await;
    let described = &described.groups[0];
    assert_eq!(described.error_code, error_code::NONE);
    assert_eq!(described.group_state.to_string(), "Stable");
    assert_eq!(described.protocol_data.to_string(), "range");
    assert_eq!(described.members[0].member_assignment, assignment);
    assert_eq!(described.members[0].client_id.to_string(), "weir-test");

    let listed = client
        .call(clamp(0, 5), &ListGroupsRequest::default())
        .await;
    let ours = listed
        .groups
        .iter()
        .find(|g| g.group_id.to_string() == group)
        .expect("listed");
    assert_eq!(ours.protocol_type.to_string(), "consumer");
    if version >= 4 {
        assert_eq!(ours.group_state.to_string(), "Stable");
    }

    let offset_delete = OffsetDeleteRequest::default()
        .with_group_id(GroupId(s(&group)))
        .with_topics(vec![OffsetDeleteRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(0)
            ])]);
    let refused = client.call(0, &offset_delete).await;
    assert_eq!(
        refused.topics[0].partitions[0].error_code,
        error_code::GROUP_SUBSCRIBED_TO_TOPIC
    );

    let delete = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(&group))]);
    let not_empty = client.call(clamp(0, 2), &delete).await;
    assert_eq!(not_empty.results[0].error_code, error_code::NON_EMPTY_GROUP);

    let leave_version = clamp(0, 5);
    let mut leave = LeaveGroupRequest::default().with_group_id(GroupId(s(&group)));
    if leave_version >= 3 {
        leave.members = vec![MemberIdentity::default().with_member_id(s(&member))];
    } else {
        leave.member_id = s(&member);
    }
    let left = client.call(leave_version, &leave).await;
    assert_eq!(left.error_code, error_code::NONE);
    assert!(left
        .members
        .iter()
        .all(|m| m.error_code == error_code::NONE));
    let described = describe(&mut client, &group, clamp(0, 5)).await;
    assert_eq!(described.groups[0].group_state.to_string(), "Empty");

    let deleted = client.call(clamp(0, 2), &delete).await;
    assert_eq!(deleted.results[0].error_code, error_code::NONE);
    let gone = client.call(clamp(0, 2), &delete).await;
    assert_eq!(gone.results[0].error_code, error_code::GROUP_ID_NOT_FOUND);
    let described = describe(&mut client, &group, clamp(0, 5)).await;
    assert_eq!(described.groups[0].group_state.to_string(), "Dead");
}

#[tokio::test]
async fn test_group_apis_at_every_served_version() {
    let agent = group_agent().await;
    agent.create_topic(TOPIC, 2).await;
    for version in 0..=9 {
        member_life(&agent, version).await;
    }
}

/// Offsets committed without group membership ("simple" commits, generation −1) work for a
/// group nobody joined, and are deleted with the topic.
#[tokio::test]
async fn test_group_simple_commit_and_topic_deletion() {
    let agent = group_agent().await;
    agent.create_topic(TOPIC, 2).await;
    let mut client = agent.connect().await;
    assert_eq!(commit(&mut client, "simple", "", -1, 8, 42).await, 0);
    assert_eq!(fetch_offset(&mut client, "simple", 7).await.0, 42);
    assert_eq!(
        commit(&mut client, "simple", "", 3, 8, 43).await,
        error_code::ILLEGAL_GENERATION,
        "a generation for a group nobody joined"
    );
    let listed = client.call(3, &ListGroupsRequest::default()).await;
    assert_eq!(listed.groups.len(), 1);
    assert_eq!(
        listed.groups[0].protocol_type.to_string(),
        "",
        "offsets-only group"
    );
    let delete_topic = DeleteTopicsRequest::default().with_topic_names(vec![TopicName(s(TOPIC))]);
    let deleted = client.call(4, &delete_topic).await;
    assert_eq!(deleted.responses[0].error_code, error_code::NONE);
    let listed = client.call(3, &ListGroupsRequest::default()).await;
    assert!(listed.groups.is_empty(), "offsets went with the topic");
}

/// Bad input from one client: thousands of joins without ever coming back with the member id,
/// oversized protocol metadata, a session timeout out of bounds. Error codes, bounded state.
#[tokio::test]
async fn test_group_join_flood_and_bad_joins_are_bounded() {
    let agent = group_agent().await;
    let mut client = agent.connect().await;
    let join = |metadata: Bytes, session_timeout_ms: i32| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s("flood")))
            .with_session_timeout_ms(session_timeout_ms)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(metadata)])
    };
    let limit = weir_groups::GroupSettings::default().max_members_per_group;
    let mut codes = std::collections::BTreeMap::<i16, usize>::new();
    for _ in 0..limit + 200 {
        let response = client.call(5, &join(subscription(), 10_000)).await;
        *codes.entry(response.error_code).or_default() += 1;
    }
    assert_eq!(codes.get(&error_code::MEMBER_ID_REQUIRED), Some(&limit));
    assert_eq!(codes.get(&error_code::GROUP_MAX_SIZE_REACHED), Some(&200));

    let huge = Bytes::from(vec![7u8; 2 * 1024 * 1024]);
    let response = client.call(5, &join(huge, 10_000)).await;
    assert_eq!(response.error_code, error_code::INVALID_REQUEST);
    let response = client.call(0, &join(subscription(), 1_000)).await;
    assert_eq!(response.error_code, error_code::INVALID_SESSION_TIMEOUT);
    let response = client
        .call(
            5,
            &join(subscription(), 10_000).with_group_id(GroupId(s(""))),
        )
        .await;
    assert_eq!(response.error_code, error_code::INVALID_GROUP_ID);
    let wrong_type = join(subscription(), 10_000)
        .with_group_id(GroupId(s("typed")))
        .with_protocol_type(s(""));
    let response = client.call(5, &wrong_type).await;
    assert_eq!(response.error_code, error_code::INCONSISTENT_GROUP_PROTOCOL);
}
