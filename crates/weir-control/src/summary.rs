//! Light views of topics for readers that need names, ids and partition counts only (Metadata):
//! taken under the state read lock without copying any partition's batch index or producer
//! state, so their cost does not grow with the batches ever written.

use weir_common::TopicId;

use crate::state::{State, Topic};

/// What a topic is, without its partitions' contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSummary {
    pub name: String,
    pub id: TopicId,
    pub partitions: usize,
}

impl Topic {
    pub fn summary(&self) -> TopicSummary {
        TopicSummary {
            name: self.name.clone(),
            id: self.id,
            partitions: self.partitions.len(),
        }
    }
}

impl State {
    /// Every topic, in name order.
    pub fn topic_summaries(&self) -> Vec<TopicSummary> {
        self.topics.values().map(Topic::summary).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_common::FileId;

    use super::*;
    use crate::entry::{BatchCommit, Entry, FileCommit};

    #[test]
    fn test_summary_names_partition_counts_without_indexes() {
        let mut state = State::default();
        for (name, partitions, id) in [("b", 3, 2u8), ("a", 1, 1)] {
            state.apply(&Entry::CreateTopic {
                name: name.into(),
                topic_id: TopicId([id; 16]),
                partitions,
                configs: BTreeMap::new(),
            });
        }
        for file in 0..100u128 {
            state.apply(&Entry::CommitFile(FileCommit {
                agent: "x".into(),
                previous: file.checked_sub(1).map(FileId),
                file_id: FileId(file),
                size: 10,
                buckets: vec![0],
                batches: vec![BatchCommit {
                    topic_id: TopicId([2; 16]),
                    partition: 1,
                    byte_offset: 0,
                    len: 10,
                    offset_span: 1,
                    first_timestamp: 0,
                    max_timestamp: 0,
                    producer_id: -1,
                    producer_epoch: -1,
                    base_sequence: -1,
                }],
            }));
        }
        assert_eq!(state.topic("b").unwrap().partitions[1].index.len(), 100);
        let summaries = state.topic_summaries();
        assert_eq!(
            summaries,
            vec![
                TopicSummary {
                    name: "a".into(),
                    id: TopicId([1; 16]),
                    partitions: 1
                },
                TopicSummary {
                    name: "b".into(),
                    id: TopicId([2; 16]),
                    partitions: 3
                },
            ]
        );
    }
}
