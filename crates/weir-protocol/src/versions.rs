//! The APIs and versions Weir implements. ApiVersions advertises exactly this table.

use kafka_protocol::messages::ApiKey;

/// One supported API with its inclusive version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SupportedApi {
    pub key: ApiKey,
    pub min: i16,
    pub max: i16,
    /// The minimum advertised in ApiVersions, when it must differ from what is served.
    pub advertised_min: i16,
}

/// Every API Weir serves. Produce stops at v12: v13 identifies topics by id only.
///
/// Produce is advertised from v0 although only v3+ is served, as Kafka 4.0 does (KAFKA-18659):
/// librdkafka before 2.10 enables gzip and snappy only if the broker's Produce range includes
/// v0. Those clients never send v0–v2 when v3+ is available; a v0–v2 request closes the
/// connection.
pub const SUPPORTED_APIS: &[SupportedApi] = &[
    SupportedApi {
        key: ApiKey::Produce,
        min: 3,
        max: 12,
        advertised_min: 0,
    },
    api(ApiKey::Fetch, 4, 16),
    api(ApiKey::ListOffsets, 1, 8),
    api(ApiKey::Metadata, 0, 12),
    api(ApiKey::ApiVersions, 0, 4),
    api(ApiKey::FindCoordinator, 0, 5),
    api(ApiKey::OffsetCommit, 2, 9),
    api(ApiKey::OffsetFetch, 1, 9),
    api(ApiKey::JoinGroup, 0, 9),
    api(ApiKey::Heartbeat, 0, 4),
    api(ApiKey::LeaveGroup, 0, 5),
    api(ApiKey::SyncGroup, 0, 5),
    api(ApiKey::DescribeGroups, 0, 5),
    api(ApiKey::ListGroups, 0, 5),
    api(ApiKey::CreateTopics, 2, 7),
    api(ApiKey::DeleteTopics, 1, 6),
    api(ApiKey::InitProducerId, 0, 5),
    api(ApiKey::OffsetForLeaderEpoch, 2, 4),
    api(ApiKey::DescribeConfigs, 1, 4),
    api(ApiKey::CreatePartitions, 0, 3),
    api(ApiKey::DescribeCluster, 0, 1),
    api(ApiKey::DeleteGroups, 0, 2),
    api(ApiKey::OffsetDelete, 0, 0),
    api(ApiKey::DeleteRecords, 0, 2),
];

const fn api(key: ApiKey, min: i16, max: i16) -> SupportedApi {
    SupportedApi {
        key,
        min,
        max,
        advertised_min: min,
    }
}

/// The supported range of `key`, if Weir serves it at all.
pub fn supported_range(key: ApiKey) -> Option<SupportedApi> {
    SUPPORTED_APIS.iter().copied().find(|api| api.key == key)
}

/// Whether `version` of `key` is served.
pub fn is_supported(key: ApiKey, version: i16) -> bool {
    supported_range(key).is_some_and(|api| api.min <= version && version <= api.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Message;

    #[test]
    fn test_versions_within_what_the_codec_can_decode() {
        use kafka_protocol::messages::*;
        fn check<M: Message>(key: ApiKey) {
            let ours = supported_range(key).expect("listed");
            assert!(
                M::VERSIONS.min <= ours.min && ours.max <= M::VERSIONS.max,
                "{key:?}"
            );
        }
        check::<ProduceRequest>(ApiKey::Produce);
        check::<FetchRequest>(ApiKey::Fetch);
        check::<ListOffsetsRequest>(ApiKey::ListOffsets);
        check::<MetadataRequest>(ApiKey::Metadata);
        check::<ApiVersionsRequest>(ApiKey::ApiVersions);
        check::<CreateTopicsRequest>(ApiKey::CreateTopics);
        check::<DeleteTopicsRequest>(ApiKey::DeleteTopics);
        check::<InitProducerIdRequest>(ApiKey::InitProducerId);
        check::<OffsetForLeaderEpochRequest>(ApiKey::OffsetForLeaderEpoch);
        check::<DescribeConfigsRequest>(ApiKey::DescribeConfigs);
        check::<CreatePartitionsRequest>(ApiKey::CreatePartitions);
        check::<DescribeClusterRequest>(ApiKey::DescribeCluster);
        check::<FindCoordinatorRequest>(ApiKey::FindCoordinator);
        check::<OffsetCommitRequest>(ApiKey::OffsetCommit);
        check::<OffsetFetchRequest>(ApiKey::OffsetFetch);
        check::<JoinGroupRequest>(ApiKey::JoinGroup);
        check::<HeartbeatRequest>(ApiKey::Heartbeat);
        check::<LeaveGroupRequest>(ApiKey::LeaveGroup);
        check::<SyncGroupRequest>(ApiKey::SyncGroup);
        check::<DescribeGroupsRequest>(ApiKey::DescribeGroups);
        check::<ListGroupsRequest>(ApiKey::ListGroups);
        check::<DeleteGroupsRequest>(ApiKey::DeleteGroups);
        check::<OffsetDeleteRequest>(ApiKey::OffsetDelete);
        check::<DeleteRecordsRequest>(ApiKey::DeleteRecords);
        for api in SUPPORTED_APIS {
            assert!(api.min <= api.max, "{:?}", api.key);
        }
    }

    #[test]
    fn test_is_supported_respects_bounds() {
        assert!(is_supported(ApiKey::Produce, 3));
        assert!(!is_supported(ApiKey::Produce, 13));
        assert!(!is_supported(ApiKey::Produce, 2));
        assert!(is_supported(ApiKey::JoinGroup, 0));
        assert!(!is_supported(ApiKey::JoinGroup, 10));
        assert!(!is_supported(ApiKey::OffsetCommit, 1));
    }
}
