//! The error code a response reports, for `weir_kafka_requests_total{error}`: its top-level
//! code, else the first partition's (or topic's, group's) code that is not NONE.
//!
//! [`RequestContext::encode`](crate::dispatch::RequestContext::encode) requires this of every
//! response it encodes, so a new handler cannot forget its label.

use std::iter::once;

use kafka_protocol::messages::*;

/// The error code a response reports (0: none).
pub(crate) trait ResponseError {
    fn error_code(&self) -> i16;
}

fn first(codes: impl IntoIterator<Item = i16>) -> i16 {
    codes.into_iter().find(|&code| code != 0).unwrap_or(0)
}

/// Responses with only a top-level code.
macro_rules! top_level {
    ($($response:ty),* $(,)?) => {
        $(impl ResponseError for $response {
            fn error_code(&self) -> i16 {
                self.error_code
            }
        })*
    };
}

top_level!(
    ApiVersionsResponse,
    DescribeClusterResponse,
    HeartbeatResponse,
    InitProducerIdResponse,
    JoinGroupResponse,
    ListGroupsResponse,
    SyncGroupResponse,
);

/// Responses whose codes are in a list of items (topics, groups, results).
macro_rules! per_item {
    ($($response:ty => $items:ident),* $(,)?) => {
        $(impl ResponseError for $response {
            fn error_code(&self) -> i16 {
                first(self.$items.iter().map(|item| item.error_code))
            }
        })*
    };
}

per_item!(
    DescribeGroupsResponse => groups,
    DeleteGroupsResponse => results,
    DescribeConfigsResponse => results,
    CreateTopicsResponse => topics,
    DeleteTopicsResponse => responses,
    CreatePartitionsResponse => results,
);

/// Responses whose codes are per partition, in a list of topics.
macro_rules! per_partition {
    ($($response:ty => $topics:ident . $partitions:ident),* $(,)?) => {
        $(impl ResponseError for $response {
            fn error_code(&self) -> i16 {
                first(
                    self.$topics
                        .iter()
                        .flat_map(|topic| &topic.$partitions)
                        .map(|partition| partition.error_code),
                )
            }
        })*
    };
}

per_partition!(
    ProduceResponse => responses.partition_responses,
    OffsetCommitResponse => topics.partitions,
    ListOffsetsResponse => topics.partitions,
    OffsetForLeaderEpochResponse => topics.partitions,
    DeleteRecordsResponse => topics.partitions,
);

impl ResponseError for FetchResponse {
    fn error_code(&self) -> i16 {
        first(
            once(self.error_code).chain(
                self.responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            ),
        )
    }
}

impl ResponseError for MetadataResponse {
    fn error_code(&self) -> i16 {
        let topics = self.topics.iter().map(|t| t.error_code);
        let partitions = self
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| p.error_code);
        first(once(self.error_code).chain(topics).chain(partitions))
    }
}

impl ResponseError for FindCoordinatorResponse {
    fn error_code(&self) -> i16 {
        first(once(self.error_code).chain(self.coordinators.iter().map(|c| c.error_code)))
    }
}

impl ResponseError for LeaveGroupResponse {
    fn error_code(&self) -> i16 {
        first(once(self.error_code).chain(self.members.iter().map(|m| m.error_code)))
    }
}

impl ResponseError for OffsetFetchResponse {
    fn error_code(&self) -> i16 {
        let v7 = self
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| p.error_code);
        let groups = self.groups.iter().map(|g| g.error_code);
        let v8 = self
            .groups
            .iter()
            .flat_map(|g| &g.topics)
            .flat_map(|t| &t.partitions)
            .map(|p| p.error_code);
        first(once(self.error_code).chain(v7).chain(groups).chain(v8))
    }
}

impl ResponseError for OffsetDeleteResponse {
    fn error_code(&self) -> i16 {
        first(
            once(self.error_code).chain(
                self.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| p.error_code),
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };

    use super::*;

    #[test]
    fn test_first_nonzero_partition_code_or_top_level_first() {
        let partition = |code| PartitionProduceResponse::default().with_error_code(code);
        let produce = ProduceResponse::default().with_responses(vec![
            TopicProduceResponse::default().with_partition_responses(vec![partition(0)]),
            TopicProduceResponse::default()
                .with_partition_responses(vec![partition(0), partition(3)]),
        ]);
        assert_eq!(produce.error_code(), 3);
        assert_eq!(ProduceResponse::default().error_code(), 0);
        let fetch = FetchResponse::default()
            .with_error_code(70)
            .with_responses(vec![FetchableTopicResponse::default()
                .with_partitions(vec![PartitionData::default().with_error_code(1)])]);
        assert_eq!(fetch.error_code(), 70);
    }
}
