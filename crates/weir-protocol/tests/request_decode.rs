//! Request decoding never panics (BAD-1): random bytes and mutated valid requests go through the
//! same sequence as `weir-server`'s `dispatch` — prefix, API key, version check, header, body.
//!
//! This is the always-on, deterministic companion of the libFuzzer target
//! `fuzz/fuzz_targets/request_frame.rs` (see `fuzz/README.md`).

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{encode_request_header_into_buffer, StrBytes};
use proptest::prelude::*;
use weir_protocol::batch::build_test_batch;
use weir_protocol::frame::{decode_request_header, peek_request};
use weir_protocol::versions::{is_supported, SUPPORTED_APIS};

/// How far a frame got through the decode sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    ShortFrame,
    UnknownKey,
    UnsupportedVersion,
    BadHeader,
    BadBody,
    Decoded,
}

/// The decode steps of `dispatch`, without the broker.
fn decode_like_dispatch(frame: Bytes) -> Outcome {
    let mut frame = frame;
    let Ok(prefix) = peek_request(&frame) else {
        return Outcome::ShortFrame;
    };
    let Ok(api_key) = ApiKey::try_from(prefix.api_key) else {
        return Outcome::UnknownKey;
    };
    let version = prefix.api_version;
    if !is_supported(api_key, version) {
        return Outcome::UnsupportedVersion;
    }
    if decode_request_header(&mut frame, api_key, version).is_err() {
        return Outcome::BadHeader;
    }
    match RequestKind::decode(api_key, &mut frame, version) {
        Ok(_) => Outcome::Decoded,
        Err(_) => Outcome::BadBody,
    }
}

fn s(text: &'static str) -> StrBytes {
    StrBytes::from_static_str(text)
}

/// A request with a little content in every list, so that mutations hit nested lengths.
fn rich_request(key: ApiKey) -> RequestKind {
    let topic = || TopicName::from(s("topic-a"));
    match key {
        ApiKey::Produce => RequestKind::Produce(
            ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(topic())
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(build_test_batch(2, 1_000, (-1, -1, -1)))),
                        PartitionProduceData::default()
                            .with_index(1)
                            .with_records(Some(build_test_batch(1, 2_000, (7, 0, 3)))),
                    ])]),
        ),
        ApiKey::Fetch => RequestKind::Fetch(
            FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(1 << 20)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(topic())
                    .with_partitions(vec![FetchPartition::default()
                        .with_partition(3)
                        .with_fetch_offset(42)
                        .with_partition_max_bytes(1 << 16)])]),
        ),
        ApiKey::ListOffsets => RequestKind::ListOffsets(
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(topic())
                    .with_partitions(vec![
                        ListOffsetsPartition::default().with_timestamp(-1),
                        ListOffsetsPartition::default()
                            .with_partition_index(1)
                            .with_timestamp(1_700_000_000_000),
                    ])]),
        ),
        ApiKey::Metadata => {
            RequestKind::Metadata(MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic())),
            ])))
        }
        ApiKey::ApiVersions => RequestKind::ApiVersions(
            ApiVersionsRequest::default()
                .with_client_software_name(s("fuzz"))
                .with_client_software_version(s("1.0")),
        ),
        ApiKey::FindCoordinator => {
            RequestKind::FindCoordinator(FindCoordinatorRequest::default().with_key(s("group")))
        }
        ApiKey::CreateTopics => RequestKind::CreateTopics(
            CreateTopicsRequest::default()
                .with_timeout_ms(1_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(topic())
                    .with_num_partitions(8)
                    .with_replication_factor(1)
                    .with_configs(vec![CreatableTopicConfig::default()
                        .with_name(s("retention.ms"))
                        .with_value(Some(s("1000")))])]),
        ),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(
            DeleteTopicsRequest::default()
                .with_topic_names(vec![topic(), TopicName::from(s("b"))])
                .with_timeout_ms(1_000),
        ),
        ApiKey::InitProducerId => RequestKind::InitProducerId(
            InitProducerIdRequest::default()
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        ),
        ApiKey::OffsetForLeaderEpoch => RequestKind::OffsetForLeaderEpoch(
            OffsetForLeaderEpochRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![OffsetForLeaderTopic::default()
                    .with_topic(topic())
                    .with_partitions(vec![OffsetForLeaderPartition::default()
                        .with_partition(0)
                        .with_leader_epoch(0)])]),
        ),
        ApiKey::DescribeConfigs => {
            RequestKind::DescribeConfigs(DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("topic-a"))
                    .with_configuration_keys(Some(vec![s("retention.ms")])),
            ]))
        }
        ApiKey::CreatePartitions => RequestKind::CreatePartitions(
            CreatePartitionsRequest::default()
                .with_timeout_ms(1_000)
                .with_topics(vec![CreatePartitionsTopic::default()
                    .with_name(topic())
                    .with_count(16)]),
        ),
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        key => rich_group_request(key),
    }
}

/// Consumer group APIs, each with a little content in every list.
fn rich_group_request(key: ApiKey) -> RequestKind {
    let group = || GroupId::from(s("group-a"));
    let topic = || TopicName::from(s("topic-a"));
    match key {
        ApiKey::JoinGroup => RequestKind::JoinGroup(
            JoinGroupRequest::default()
                .with_group_id(group())
                .with_session_timeout_ms(10_000)
                .with_member_id(s("member-1"))
                .with_protocol_type(s("consumer"))
                .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default(
                )
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"\x00\x01meta"))]),
        ),
        ApiKey::SyncGroup => RequestKind::SyncGroup(
            SyncGroupRequest::default()
                .with_group_id(group())
                .with_generation_id(3)
                .with_member_id(s("member-1"))
                .with_assignments(vec![
                    sync_group_request::SyncGroupRequestAssignment::default()
                        .with_member_id(s("member-1"))
                        .with_assignment(Bytes::from_static(b"\x00\x01assignment")),
                ]),
        ),
        ApiKey::Heartbeat => RequestKind::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(group())
                .with_generation_id(3)
                .with_member_id(s("member-1")),
        ),
        ApiKey::LeaveGroup => RequestKind::LeaveGroup(
            LeaveGroupRequest::default()
                .with_group_id(group())
                .with_members(vec![leave_group_request::MemberIdentity::default()
                    .with_member_id(s("member-1"))
                    .with_group_instance_id(Some(s("instance-1")))]),
        ),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(
            OffsetCommitRequest::default()
                .with_group_id(group())
                .with_generation_id_or_member_epoch(3)
                .with_member_id(s("member-1"))
                .with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            offset_commit_request::OffsetCommitRequestPartition::default()
                                .with_partition_index(0)
                                .with_committed_offset(42)
                                .with_committed_metadata(Some(s("meta"))),
                        ]),
                ]),
        ),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(
            OffsetFetchRequest::default()
                .with_group_id(group())
                .with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(topic())
                        .with_partition_indexes(vec![0, 1]),
                ])),
        ),
        ApiKey::DescribeGroups => RequestKind::DescribeGroups(
            DescribeGroupsRequest::default().with_groups(vec![group(), GroupId::from(s("b"))]),
        ),
        ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(
            DeleteGroupsRequest::default().with_groups_names(vec![group()]),
        ),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(
            OffsetDeleteRequest::default()
                .with_group_id(group())
                .with_topics(vec![
                    offset_delete_request::OffsetDeleteRequestTopic::default()
                        .with_name(topic())
                        .with_partitions(vec![
                            offset_delete_request::OffsetDeleteRequestPartition::default()
                                .with_partition_index(0),
                        ]),
                ]),
        ),
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(
            DeleteRecordsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![delete_records_request::DeleteRecordsTopic::default()
                    .with_name(topic())
                    .with_partitions(vec![
                        delete_records_request::DeleteRecordsPartition::default()
                            .with_partition_index(0)
                            .with_offset(-1),
                    ])]),
        ),
        other => panic!("no request builder for {other:?}"),
    }
}

fn default_request(key: ApiKey) -> RequestKind {
    match key {
        ApiKey::Produce => RequestKind::Produce(ProduceRequest::default()),
        ApiKey::Fetch => RequestKind::Fetch(FetchRequest::default()),
        ApiKey::ListOffsets => RequestKind::ListOffsets(ListOffsetsRequest::default()),
        ApiKey::Metadata => RequestKind::Metadata(MetadataRequest::default()),
        ApiKey::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
        ApiKey::FindCoordinator => RequestKind::FindCoordinator(FindCoordinatorRequest::default()),
        ApiKey::CreateTopics => RequestKind::CreateTopics(CreateTopicsRequest::default()),
        ApiKey::DeleteTopics => RequestKind::DeleteTopics(DeleteTopicsRequest::default()),
        ApiKey::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default()),
        ApiKey::OffsetForLeaderEpoch => {
            RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default())
        }
        ApiKey::DescribeConfigs => RequestKind::DescribeConfigs(DescribeConfigsRequest::default()),
        ApiKey::CreatePartitions => {
            RequestKind::CreatePartitions(CreatePartitionsRequest::default())
        }
        ApiKey::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        ApiKey::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default()),
        ApiKey::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default()),
        ApiKey::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default()),
        ApiKey::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default()),
        ApiKey::OffsetCommit => RequestKind::OffsetCommit(OffsetCommitRequest::default()),
        ApiKey::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default()),
        ApiKey::DescribeGroups => RequestKind::DescribeGroups(DescribeGroupsRequest::default()),
        ApiKey::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
        ApiKey::DeleteGroups => RequestKind::DeleteGroups(DeleteGroupsRequest::default()),
        ApiKey::OffsetDelete => RequestKind::OffsetDelete(OffsetDeleteRequest::default()),
        ApiKey::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default()),
        other => panic!("no request builder for {other:?}"),
    }
}

/// A full frame body (header + request) as a client would send it.
fn encode_frame(key: ApiKey, version: i16, request: &RequestKind) -> Option<Bytes> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(s("weir-fuzz")));
    let mut buf = BytesMut::new();
    encode_request_header_into_buffer(&mut buf, &header).ok()?;
    request.encode(&mut buf, version).ok()?;
    Some(buf.freeze())
}

/// One valid frame per served (API, version): the rich request where the version can carry it,
/// else the default one.
fn valid_frames() -> &'static [(ApiKey, i16, Bytes)] {
    static FRAMES: OnceLock<Vec<(ApiKey, i16, Bytes)>> = OnceLock::new();
    FRAMES.get_or_init(build_valid_frames)
}

fn build_valid_frames() -> Vec<(ApiKey, i16, Bytes)> {
    let mut frames = Vec::new();
    for api in SUPPORTED_APIS {
        for version in api.min..=api.max {
            let frame = encode_frame(api.key, version, &rich_request(api.key))
                .or_else(|| encode_frame(api.key, version, &default_request(api.key)))
                .unwrap_or_else(|| panic!("cannot encode {:?} v{version}", api.key));
            frames.push((api.key, version, frame));
        }
    }
    frames
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Set { at: usize, value: u8 },
    Insert { at: usize, bytes: Vec<u8> },
    Remove { at: usize, len: usize },
    Truncate { keep: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (
            any::<usize>(),
            prop_oneof![Just(0u8), Just(0x7f), Just(0x80), Just(0xff), any::<u8>()]
        )
            .prop_map(|(at, value)| Mutation::Set { at, value }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..8).prop_map(|(at, len)| Mutation::Remove { at, len }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
    ]
}

/// Applies `mutation` to `frame`, keeping the 8-byte prefix (key, version, correlation id) intact
/// unless `touch_prefix` says otherwise, so most cases reach the body decoder.
fn mutate(frame: &mut Vec<u8>, mutation: &Mutation, touch_prefix: bool) {
    let floor = if touch_prefix { 0 } else { 8.min(frame.len()) };
    let span = frame.len() - floor;
    let pick = |at: usize, extra: usize| floor + at % (span + extra).max(1);
    match mutation {
        Mutation::Flip { at, mask } if span > 0 => frame[pick(*at, 0)] ^= mask,
        Mutation::Set { at, value } if span > 0 => frame[pick(*at, 0)] = *value,
        Mutation::Insert { at, bytes } => {
            let at = pick(*at, 1).min(frame.len());
            frame.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove { at, len } if span > 0 => {
            let at = pick(*at, 0);
            let end = (at + len).min(frame.len());
            frame.drain(at..end);
        }
        Mutation::Truncate { keep } => frame.truncate(floor + keep % (span + 1)),
        _ => {}
    }
}

#[test]
fn test_every_served_version_round_trips_through_dispatch_decode() {
    let frames = valid_frames();
    let expected: usize = SUPPORTED_APIS
        .iter()
        .map(|api| (api.max - api.min + 1) as usize)
        .sum();
    assert_eq!(frames.len(), expected);
    for (key, version, frame) in frames {
        assert_eq!(
            decode_like_dispatch(frame.clone()),
            Outcome::Decoded,
            "{key:?} v{version}"
        );
    }
}

#[test]
fn test_truncating_a_valid_request_never_panics() {
    // Every prefix of every valid frame: exhaustive, deterministic.
    for (_, _, frame) in valid_frames() {
        for keep in 0..frame.len() {
            let _ = decode_like_dispatch(frame.slice(..keep));
        }
    }
}

#[test]
fn test_every_byte_of_every_valid_request_overwritten_never_panics() {
    // Exhaustive and deterministic: each byte after the prefix set to values that turn lengths
    // and counts into -1, 0, huge, or varint continuations.
    let mut outcomes = std::collections::BTreeMap::new();
    for (_, _, frame) in valid_frames() {
        for at in 8..frame.len() {
            for value in [0x00u8, 0x01, 0x7f, 0x80, 0xfe, 0xff, frame[at] ^ 0xff] {
                let mut bytes = frame.to_vec();
                bytes[at] = value;
                let outcome = decode_like_dispatch(Bytes::from(bytes));
                *outcomes.entry(format!("{outcome:?}")).or_insert(0usize) += 1;
            }
        }
    }
    // The mutations must reach the body decoder, not just stop at the header.
    assert!(
        outcomes.get("BadBody").copied().unwrap_or(0) > 1000,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("Decoded").copied().unwrap_or(0) > 1000,
        "{outcomes:?}"
    );
}

#[test]
fn test_unknown_and_unserved_prefixes_stop_before_the_body() {
    let mut frame = vec![0u8; 16];
    frame[0..2].copy_from_slice(&i16::MAX.to_be_bytes());
    assert_eq!(
        decode_like_dispatch(Bytes::from(frame.clone())),
        Outcome::UnknownKey
    );
    frame[0..2].copy_from_slice(&(ApiKey::Produce as i16).to_be_bytes());
    frame[2..4].copy_from_slice(&2i16.to_be_bytes());
    assert_eq!(
        decode_like_dispatch(Bytes::from(frame.clone())),
        Outcome::UnsupportedVersion
    );
    frame[0..2].copy_from_slice(&(ApiKey::EndTxn as i16).to_be_bytes());
    frame[2..4].copy_from_slice(&0i16.to_be_bytes());
    assert_eq!(
        decode_like_dispatch(Bytes::from(frame)),
        Outcome::UnsupportedVersion
    );
    assert_eq!(
        decode_like_dispatch(Bytes::from_static(&[0, 0, 0])),
        Outcome::ShortFrame
    );
}

// Against unpatched kafka-protocol 0.18 both properties below abort the test binary within a few
// cases (see `test_huge_array_length_in_tiny_frame_is_rejected`).
proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Arbitrary bytes, and arbitrary bodies behind a served (key, version) prefix.
    #[test]
    fn test_random_frames_never_panic(
        api_index in 0..SUPPORTED_APIS.len(),
        version_offset in 0i16..16,
        keep_prefix in any::<bool>(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let api = SUPPORTED_APIS[api_index];
        let version = api.min + version_offset % (api.max - api.min + 1);
        let mut frame = Vec::with_capacity(8 + body.len());
        if keep_prefix {
            frame.extend_from_slice(&(api.key as i16).to_be_bytes());
            frame.extend_from_slice(&version.to_be_bytes());
            frame.extend_from_slice(&7i32.to_be_bytes());
        }
        frame.extend_from_slice(&body);
        let _ = decode_like_dispatch(Bytes::from(frame));
    }

    /// Valid requests of every served (key, version) with one to four byte-level mutations.
    #[test]
    fn test_mutated_valid_requests_never_panic(
        frame_index in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(mutation(), 1..5),
        touch_prefix in proptest::bool::weighted(0.1),
    ) {
        let frames = valid_frames();
        let (_, _, frame) = &frames[frame_index.index(frames.len())];
        let mut bytes = frame.to_vec();
        for m in &mutations {
            mutate(&mut bytes, m, touch_prefix);
        }
        let _ = decode_like_dispatch(Bytes::from(bytes));
    }
}

/// BAD-1: crates.io kafka-protocol 0.18 pre-allocates `Vec::with_capacity(count)` from an array's
/// declared length before checking that the bytes exist (`Array` and `CompactArray` in its
/// `protocol/types.rs`). This 14-byte Metadata v0 body declaring 2^31-1 topics asks for
/// 154,618,822,584 bytes (72 per `MetadataRequestTopic`); the allocator refuses and the process
/// aborts with SIGABRT — not a panic, so nothing can catch it. The compact (flexible-version) form
/// asks for 309,237,645,168 bytes. The vendored copy (`third_party/kafka-protocol`) caps the
/// pre-allocation at the bytes left in the frame; this test aborts again if that patch is lost.
#[test]
fn test_huge_array_length_in_tiny_frame_is_rejected() {
    let classic: &[u8] = &[
        0x00, 0x03, // Metadata
        0x00, 0x00, // v0
        0x00, 0x00, 0x00, 0x07, // correlation id
        0xff, 0xff, // client id: null
        0x7f, 0xff, 0xff, 0xff, // topics: 2^31-1 entries
    ];
    assert_eq!(
        decode_like_dispatch(Bytes::from_static(classic)),
        Outcome::BadBody
    );
    let compact: &[u8] = &[
        0x00, 0x03, // Metadata
        0x00, 0x09, // v9 (flexible: request header v2)
        0x00, 0x00, 0x00, 0x07, // correlation id
        0xff, 0xff, // client id: null
        0x00, // header tagged fields: none
        0xff, 0xff, 0xff, 0xff, 0x0f, // topics: compact length 2^32-1, i.e. 2^32-2 entries
    ];
    assert_eq!(
        decode_like_dispatch(Bytes::from_static(compact)),
        Outcome::BadBody
    );
}

/// Writes one valid frame per served (API, version) as a seed corpus for the libFuzzer target:
/// into `WEIR_FUZZ_SEED_DIR` when set (`.ci/run` and `fuzz/README.md` use this), otherwise into a
/// temporary directory. Either way the written files are read back and must be exactly the valid
/// frames, each decoding as dispatch would, so the corpus the fuzzers start from is checked.
#[test]
fn test_write_fuzz_seed_corpus_writes_every_served_version() {
    let temp = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("WEIR_FUZZ_SEED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    for (key, version, frame) in valid_frames() {
        std::fs::write(dir.join(format!("{key:?}-v{version}")), frame).unwrap();
    }
    for (key, version, frame) in valid_frames() {
        let written = std::fs::read(dir.join(format!("{key:?}-v{version}"))).unwrap();
        assert_eq!(written, frame.as_ref(), "{key:?} v{version}");
        assert_eq!(
            decode_like_dispatch(Bytes::from(written)),
            Outcome::Decoded,
            "{key:?} v{version}"
        );
    }
}
