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

/// How big the state is, for `/metrics` (`weir_state_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateCounts {
    pub topics: usize,
    pub partitions: usize,
    /// Batch index entries over every partition.
    pub index_entries: usize,
    /// Idempotent producer ids with state.
    pub producers: usize,
    /// Groups with committed offsets.
    pub groups: usize,
    /// Files the log names (live and released).
    pub files: usize,
}

/// A consumer group's lag: over its committed partitions, high watermark − committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLag {
    pub group: String,
    pub lag: i64,
    /// Partitions with a committed offset in a topic that still exists.
    pub partitions: usize,
}

impl State {
    /// The sizes of the state's collections.
    pub fn counts(&self) -> StateCounts {
        let partitions = self.topics.values().flat_map(|t| &t.partitions);
        StateCounts {
            topics: self.topics.len(),
            partitions: partitions.clone().count(),
            index_entries: partitions.map(|p| p.index.len()).sum(),
            producers: self.producer_epochs.len(),
            groups: self.group_offsets.len(),
            files: self.files.len() + self.released.len(),
        }
    }

    /// Every group's lag, in group order. A commit past the high watermark counts as no lag.
    pub fn group_lags(&self) -> Vec<GroupLag> {
        self.group_offsets
            .iter()
            .map(|(group, topics)| {
                let mut lag = GroupLag {
                    group: group.clone(),
                    lag: 0,
                    partitions: 0,
                };
                for (topic, partitions) in topics {
                    let Some(topic) = self.topics.get(topic) else {
                        continue;
                    };
                    for (&partition, committed) in partitions {
                        if let Some(state) = topic.partition(partition) {
                            lag.lag += (state.high_watermark - committed.offset).max(0);
                            lag.partitions += 1;
                        }
                    }
                }
                lag
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_common::FileId;

    use super::*;
    use crate::entry::{BatchCommit, Entry, FileCommit, OffsetCommit};

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
        let counts = state.counts();
        assert_eq!((counts.topics, counts.partitions), (2, 4));
        assert_eq!(
            (counts.index_entries, counts.files, counts.groups),
            (100, 100, 0)
        );

        // Partition b-1 has 100 records: a group at 40 lags 60, one past the end lags 0, and a
        // commit of a partition that does not exist is not counted.
        let commit = |group: &str, partition: i32, offset: i64| Entry::CommitOffsets {
            group: group.into(),
            offsets: vec![OffsetCommit {
                topic: "b".into(),
                partition,
                offset,
                leader_epoch: -1,
                metadata: None,
            }],
            at_ms: 0,
            coordinator: None,
        };
        state.apply(&commit("g1", 1, 40));
        state.apply(&commit("g1", 9, 0));
        state.apply(&commit("g2", 1, 500));
        let lags = state.group_lags();
        assert_eq!(
            lags,
            vec![
                GroupLag {
                    group: "g1".into(),
                    lag: 60,
                    partitions: 1
                },
                GroupLag {
                    group: "g2".into(),
                    lag: 0,
                    partitions: 1
                },
            ]
        );
        assert_eq!(state.counts().groups, 2);
    }
}
