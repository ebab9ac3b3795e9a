use super::*;
use crate::entry::{LogStartCause, LogStartMove};
use proptest::prelude::*;

fn topic_id(n: u8) -> TopicId {
    let mut bytes = [0u8; 16];
    bytes[15] = n;
    bytes[0] = 0x40;
    TopicId(bytes)
}

fn state_with_topic(partitions: i32) -> State {
    let mut state = State::default();
    let result = state.apply(&Entry::CreateTopic {
        name: "t".into(),
        topic_id: topic_id(1),
        partitions,
        configs: BTreeMap::new(),
    });
    assert_eq!(result, EntryResult::CreateTopic(Ok(topic_id(1))));
    state
}

fn batch(partition: i32, span: i32, producer: (i64, i16, i32)) -> BatchCommit {
    BatchCommit {
        topic_id: topic_id(1),
        partition,
        byte_offset: 8,
        len: 100,
        offset_span: span,
        first_timestamp: 1,
        max_timestamp: 1,
        producer_id: producer.0,
        producer_epoch: producer.1,
        base_sequence: producer.2,
    }
}

fn commit(state: &mut State, file: u128, batches: Vec<BatchCommit>) -> Vec<BatchOutcome> {
    match state.apply(&Entry::CommitFile(FileCommit {
        agent: format!("agent-{file}"),
        previous: None,
        file_id: FileId(file),
        size: 1000,
        buckets: vec![0],
        batches,
    })) {
        EntryResult::CommitFile(outcomes) => outcomes,
        other => panic!("unexpected {other:?}"),
    }
}

fn base(outcome: &BatchOutcome) -> i64 {
    match outcome {
        BatchOutcome::Appended { base_offset, .. }
        | BatchOutcome::Duplicate { base_offset, .. } => *base_offset,
        BatchOutcome::Rejected(error) => panic!("rejected: {error}"),
    }
}

#[test]
fn test_state_assigns_dense_offsets_per_partition() {
    let mut state = state_with_topic(2);
    let outcomes = commit(
        &mut state,
        1,
        vec![
            batch(0, 3, (-1, -1, -1)),
            batch(1, 2, (-1, -1, -1)),
            batch(0, 1, (-1, -1, -1)),
        ],
    );
    assert_eq!(outcomes.iter().map(base).collect::<Vec<_>>(), vec![0, 0, 3]);
    let partition = state.partition(&topic_id(1), 0).unwrap();
    assert_eq!(partition.high_watermark, 4);
    assert_eq!(partition.stable_high_watermark, 0, "apply never publishes");
    assert_eq!(partition.index.len(), 2);
    assert_eq!(state.files[&FileId(1)].live_batches, 3);
}

#[test]
fn test_state_rejects_unknown_topic_and_partition() {
    let mut state = state_with_topic(1);
    let outcomes = commit(&mut state, 1, vec![batch(5, 1, (-1, -1, -1))]);
    assert!(matches!(
        outcomes[0],
        BatchOutcome::Rejected(ControlError::UnknownTopicOrPartition(_))
    ));
    assert!(
        !state.files.contains_key(&FileId(1)),
        "a file with no live batch is not referenced"
    );
}

#[test]
fn test_state_idempotent_retry_returns_original_offset() {
    let mut state = state_with_topic(1);
    let EntryResult::InitProducerId(Ok((pid, epoch))) =
        state.apply(&Entry::init_producer_id(None, 0))
    else {
        panic!()
    };
    let first = commit(&mut state, 1, vec![batch(0, 5, (pid, epoch, 0))]);
    let second = commit(&mut state, 2, vec![batch(0, 5, (pid, epoch, 5))]);
    let retry = commit(&mut state, 3, vec![batch(0, 5, (pid, epoch, 0))]);
    assert_eq!(base(&first[0]), 0);
    assert_eq!(base(&second[0]), 5);
    assert!(matches!(
        retry[0],
        BatchOutcome::Duplicate { base_offset: 0, .. }
    ));
    assert_eq!(state.partition(&topic_id(1), 0).unwrap().high_watermark, 10);
    let gap = commit(&mut state, 4, vec![batch(0, 1, (pid, epoch, 42))]);
    assert_eq!(
        gap[0],
        BatchOutcome::Rejected(ControlError::OutOfOrderSequence {
            expected: 10,
            got: 42
        })
    );
}

/// A producer's first batch on a partition must have sequence 0: a later batch whose file
/// committed while the first one's upload failed must not start the stream (found by weir-sim).
#[test]
fn test_state_first_batch_of_a_producer_must_start_at_sequence_zero() {
    let mut state = state_with_topic(2);
    let EntryResult::InitProducerId(Ok((pid, epoch))) =
        state.apply(&Entry::init_producer_id(None, 0))
    else {
        panic!()
    };
    let early = commit(&mut state, 1, vec![batch(0, 2, (pid, epoch, 3))]);
    assert_eq!(
        early[0],
        BatchOutcome::Rejected(ControlError::OutOfOrderSequence {
            expected: 0,
            got: 3
        })
    );
    assert_eq!(state.partition(&topic_id(1), 0).unwrap().high_watermark, 0);
    let in_order = commit(
        &mut state,
        2,
        vec![batch(0, 3, (pid, epoch, 0)), batch(0, 2, (pid, epoch, 3))],
    );
    assert_eq!(in_order.iter().map(base).collect::<Vec<_>>(), vec![0, 3]);
    // Each partition starts its own stream at 0.
    let other = commit(&mut state, 3, vec![batch(1, 1, (pid, epoch, 0))]);
    assert_eq!(base(&other[0]), 0);
}

#[test]
fn test_state_old_epoch_is_fenced_and_unknown_pid_rejected() {
    let mut state = state_with_topic(1);
    let EntryResult::InitProducerId(Ok((pid, _))) = state.apply(&Entry::init_producer_id(None, 0))
    else {
        panic!()
    };
    let EntryResult::InitProducerId(Ok((same, bumped))) =
        state.apply(&Entry::init_producer_id(Some((pid, 0)), 0))
    else {
        panic!()
    };
    assert_eq!((same, bumped), (pid, 1));
    let fenced = commit(&mut state, 1, vec![batch(0, 1, (pid, 0, 0))]);
    assert!(matches!(
        fenced[0],
        BatchOutcome::Rejected(ControlError::InvalidProducerEpoch { .. })
    ));
    let unknown = commit(&mut state, 2, vec![batch(0, 1, (999, 0, 0))]);
    assert_eq!(
        unknown[0],
        BatchOutcome::Rejected(ControlError::UnknownProducerId(999))
    );
}

#[test]
fn test_state_topic_lifecycle() {
    let mut state = state_with_topic(1);
    let duplicate = state.apply(&Entry::CreateTopic {
        name: "t".into(),
        topic_id: topic_id(2),
        partitions: 1,
        configs: BTreeMap::new(),
    });
    assert_eq!(
        duplicate,
        EntryResult::CreateTopic(Err(ControlError::TopicAlreadyExists("t".into())))
    );
    assert_eq!(
        state.apply(&Entry::CreatePartitions {
            name: "t".into(),
            total: 4
        }),
        EntryResult::CreatePartitions(Ok(()))
    );
    assert_eq!(state.topic("t").unwrap().partitions.len(), 4);
    assert!(matches!(
        state.apply(&Entry::CreatePartitions {
            name: "t".into(),
            total: 2
        }),
        EntryResult::CreatePartitions(Err(ControlError::InvalidPartitions(_)))
    ));
    commit(&mut state, 9, vec![batch(0, 1, (-1, -1, -1))]);
    assert_eq!(
        state.apply(&Entry::DeleteTopic { name: "t".into() }),
        EntryResult::DeleteTopic(Ok(()))
    );
    assert!(state.topic_by_id(&topic_id(1)).is_none());
    assert!(
        state.files.is_empty(),
        "files of a deleted topic are no longer referenced"
    );
}

#[test]
fn test_state_agent_commits_form_a_chain() {
    let mut state = state_with_topic(1);
    let file = |id: u128, previous: Option<u128>| {
        Entry::CommitFile(FileCommit {
            agent: "a".into(),
            previous: previous.map(FileId),
            file_id: FileId(id),
            size: 10,
            buckets: vec![0],
            batches: vec![batch(0, 1, (-1, -1, -1))],
        })
    };
    assert!(
        matches!(state.apply(&file(1, None)), EntryResult::CommitFile(o) if matches!(o[0], BatchOutcome::Appended { .. }))
    );
    // File 2 failed to commit; file 3 (chained on 2) must not overtake it.
    let skipped = state.apply(&file(3, Some(2)));
    assert_eq!(
        skipped,
        EntryResult::CommitFile(vec![BatchOutcome::Rejected(
            ControlError::CommitOutOfOrder {
                last_committed: Some(FileId(1))
            }
        )])
    );
    assert!(
        matches!(state.apply(&file(4, Some(1))), EntryResult::CommitFile(o) if matches!(o[0], BatchOutcome::Appended { base_offset: 1, .. }))
    );
    assert_eq!(state.agent_tips["a"], FileId(4));
}

fn advance(state: &mut State, partition: i32, offset: i64) -> Result<i64, ControlError> {
    let entry = Entry::AdvanceLogStart {
        topic_id: topic_id(1),
        partitions: vec![LogStartMove { partition, offset }],
        cause: LogStartCause::DeleteRecords,
    };
    match state.apply(&entry) {
        EntryResult::AdvanceLogStart(mut results) => results.remove(0),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn test_state_log_start_moves_forward_in_whole_batches_and_releases_files() {
    let mut state = state_with_topic(2);
    // Files 1..=3 hold one batch of 3 offsets each on partition 0: offsets 0..9.
    for file in 1..=3 {
        commit(&mut state, file, vec![batch(0, 3, (-1, -1, -1))]);
    }
    assert!(matches!(
        advance(&mut state, 0, 10),
        Err(ControlError::OffsetOutOfRange {
            offset: 10,
            high_watermark: 9,
            ..
        })
    ));
    assert!(matches!(
        advance(&mut state, 0, -2),
        Err(ControlError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        advance(&mut state, 2, 0),
        Err(ControlError::UnknownTopicOrPartition(_))
    ));
    // Mid-batch: the start moves to 4, the batch 3..=5 stays, file 1 is released.
    assert_eq!(advance(&mut state, 0, 4), Ok(4));
    let partition = state.partition(&topic_id(1), 0).unwrap();
    assert_eq!(partition.log_start_offset, 4);
    assert_eq!(partition.index.first().map(|e| e.base_offset), Some(3));
    assert!(state.released.contains_key(&FileId(1)));
    assert!(!state.files.contains_key(&FileId(1)));
    // Never backwards: a lower offset answers the current start and changes nothing.
    assert_eq!(advance(&mut state, 0, 1), Ok(4));
    // -1: everything up to the high watermark.
    assert_eq!(advance(&mut state, 0, -1), Ok(9));
    assert!(state.partition(&topic_id(1), 0).unwrap().index.is_empty());
    assert!(state.files.is_empty());
    assert_eq!(state.released.len(), 3);
    // Appends continue at the high watermark.
    let appended = commit(&mut state, 4, vec![batch(0, 1, (-1, -1, -1))]);
    assert_eq!(base(&appended[0]), 9);
    // FilesDeleted forgets released files only.
    assert_eq!(
        state.apply(&Entry::FilesDeleted {
            files: vec![FileId(1), FileId(4), FileId(77)]
        }),
        EntryResult::FilesDeleted(1)
    );
    assert!(!state.released.contains_key(&FileId(1)));
    assert!(state.files.contains_key(&FileId(4)));
}

#[test]
fn test_state_released_or_unused_file_ids_never_commit_again() {
    let mut state = state_with_topic(1);
    let pid = match state.apply(&Entry::init_producer_id(None, 0)) {
        EntryResult::InitProducerId(Ok((pid, _))) => pid,
        other => panic!("unexpected {other:?}"),
    };
    commit(&mut state, 1, vec![batch(0, 1, (pid, 0, 0))]);
    // A file holding only a duplicate is named by no index entry: released at once.
    let duplicate = commit(&mut state, 2, vec![batch(0, 1, (pid, 0, 0))]);
    assert!(matches!(duplicate[0], BatchOutcome::Duplicate { .. }));
    assert!(state.released.contains_key(&FileId(2)));
    // Committing a known id again (live or released), even on a fresh chain, is refused whole.
    for file in [1, 2] {
        let again = state.apply(&Entry::CommitFile(FileCommit {
            agent: format!("fresh-{file}"),
            previous: None,
            file_id: FileId(file),
            size: 10,
            buckets: vec![0],
            batches: vec![batch(0, 1, (-1, -1, -1))],
        }));
        assert!(matches!(
            again,
            EntryResult::CommitFile(ref o) if matches!(o[0], BatchOutcome::Rejected(ControlError::CommitOutOfOrder { .. }))
        ));
    }
    assert_eq!(state.partition(&topic_id(1), 0).unwrap().high_watermark, 1);
}

#[test]
fn test_state_time_index_forgets_the_trimmed_prefix() {
    let mut state = state_with_topic(1);
    let mut old = batch(0, 1, (-1, -1, -1));
    old.max_timestamp = 1_000;
    commit(&mut state, 1, vec![old]);
    let mut young = batch(0, 1, (-1, -1, -1));
    young.max_timestamp = 10;
    commit(&mut state, 2, vec![young]);
    advance(&mut state, 0, 1).unwrap();
    let partition = state.partition(&topic_id(1), 0).unwrap();
    // Only the kept batch (max 10) exists: nothing reaches 500.
    assert_eq!(partition.index.first_reaching(0, 500), None);
    assert_eq!(partition.index.first_reaching(0, 10), Some(0));
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8, i32),
    Delete(u8),
    Commit(u8, i32, i32),
    InitPid,
    CommitOffset(u8, u8, i32, i64),
    DeleteGroup(u8),
    AdvanceLogStart(u8, i32, i64),
    FilesDeleted(usize),
    ExpireProducers(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, -1i32..5).prop_map(|(t, p)| Op::Create(t, p)),
        (0u8..3).prop_map(Op::Delete),
        (0u8..3, -1i32..5, -1i32..4).prop_map(|(t, p, s)| Op::Commit(t, p, s)),
        Just(Op::InitPid),
        (0u8..2, 0u8..3, -1i32..5, 0i64..100).prop_map(|(g, t, p, o)| Op::CommitOffset(g, t, p, o)),
        (0u8..2).prop_map(Op::DeleteGroup),
        (0u8..3, -1i32..5, -2i64..12).prop_map(|(t, p, o)| Op::AdvanceLogStart(t, p, o)),
        (0usize..60).prop_map(Op::FilesDeleted),
        (0i64..60).prop_map(Op::ExpireProducers),
    ]
}

fn to_entry(op: &Op, index: usize) -> Entry {
    match op {
        Op::Create(t, partitions) => Entry::CreateTopic {
            name: format!("topic{t}"),
            topic_id: topic_id(10 + *t + (index as u8 % 50) * 3),
            partitions: *partitions,
            configs: BTreeMap::new(),
        },
        Op::Delete(t) => Entry::DeleteTopic {
            name: format!("topic{t}"),
        },
        // Each file its own agent's first: one agent with `previous: None` would have every
        // commit after its first refused as out of order.
        Op::Commit(t, partition, span) => Entry::CommitFile(FileCommit {
            agent: format!("prop{index}"),
            previous: None,
            file_id: FileId(index as u128),
            size: 10,
            buckets: vec![0],
            batches: vec![BatchCommit {
                topic_id: topic_id(10 + *t),
                partition: *partition,
                byte_offset: 0,
                len: 1,
                offset_span: *span,
                first_timestamp: 0,
                max_timestamp: 0,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
            }],
        }),
        Op::InitPid => Entry::init_producer_id(None, index as i64),
        Op::ExpireProducers(before_ms) => Entry::ExpireProducers {
            before_ms: *before_ms,
        },
        Op::CommitOffset(group, t, partition, offset) => Entry::CommitOffsets {
            coordinator: None,
            group: format!("group{group}"),
            at_ms: 0,
            offsets: vec![OffsetCommit {
                topic: format!("topic{t}"),
                partition: *partition,
                offset: *offset,
                leader_epoch: -1,
                metadata: Some(format!("m{offset}")),
            }],
        },
        Op::DeleteGroup(group) => Entry::DeleteGroup {
            group: format!("group{group}"),
            coordinator: None,
        },
        Op::AdvanceLogStart(t, partition, offset) => Entry::AdvanceLogStart {
            topic_id: topic_id(10 + *t),
            partitions: vec![LogStartMove {
                partition: *partition,
                offset: *offset,
            }],
            cause: LogStartCause::Retention,
        },
        // Forgets the file committed by entry `n` (deleted or not: unknown ids are ignored).
        Op::FilesDeleted(n) => Entry::FilesDeleted {
            files: vec![FileId(*n as u128)],
        },
    }
}

fn commit_offset(
    state: &mut State,
    group: &str,
    partition: i32,
    offset: i64,
    metadata: &str,
) -> Result<(), ControlError> {
    let entry = Entry::CommitOffsets {
        coordinator: None,
        group: group.into(),
        at_ms: 0,
        offsets: vec![OffsetCommit {
            topic: "t".into(),
            partition,
            offset,
            leader_epoch: 3,
            metadata: Some(metadata.into()),
        }],
    };
    match state.apply(&entry) {
        EntryResult::CommitOffsets(mut results) => results.remove(0),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn test_state_group_offsets_commit_overwrite_and_validate() {
    let mut state = state_with_topic(2);
    commit_offset(&mut state, "g", 0, 5, "first").unwrap();
    commit_offset(&mut state, "g", 0, 7, "second").unwrap();
    commit_offset(&mut state, "g", 1, 1, "").unwrap();
    let committed = state.committed_offset("g", "t", 0).unwrap();
    assert_eq!((committed.offset, committed.leader_epoch), (7, 3));
    assert_eq!(committed.metadata.as_deref(), Some("second"));
    assert!(matches!(
        commit_offset(&mut state, "g", 2, 1, ""),
        Err(ControlError::UnknownTopicOrPartition(_))
    ));
    let long = "x".repeat(crate::state::MAX_OFFSET_METADATA_BYTES + 1);
    assert!(matches!(
        commit_offset(&mut state, "g", 0, 9, &long),
        Err(ControlError::OffsetMetadataTooLarge { .. })
    ));
    assert_eq!(
        state.committed_offset("g", "t", 0).unwrap().offset,
        7,
        "refused commit changes nothing"
    );
    state.apply(&Entry::DeleteGroupOffsets {
        group: "g".into(),
        partitions: vec![("t".into(), 0)],
        coordinator: None,
    });
    assert!(state.committed_offset("g", "t", 0).is_none());
    assert!(state.committed_offset("g", "t", 1).is_some());
    let delete = Entry::DeleteGroup {
        group: "g".into(),
        coordinator: None,
    };
    assert_eq!(state.apply(&delete), EntryResult::DeleteGroup(Ok(true)));
    assert_eq!(state.apply(&delete), EntryResult::DeleteGroup(Ok(false)));
    assert!(state.group_offsets.is_empty());
}

#[test]
fn test_state_group_offsets_deleted_with_topic_and_survive_snapshot() {
    let mut state = state_with_topic(1);
    commit_offset(&mut state, "a", 0, 5, "m").unwrap();
    commit_offset(&mut state, "b", 0, 6, "m").unwrap();
    let json = serde_json::to_string(&state).unwrap();
    let restored: State = serde_json::from_str(&json).unwrap();
    assert_eq!(restored.committed_offset("b", "t", 0).unwrap().offset, 6);
    // Snapshots written before group offsets existed still load.
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old.as_object_mut().unwrap().remove("group_offsets");
    let loaded: State = serde_json::from_value(old).unwrap();
    assert!(loaded.group_offsets.is_empty());
    assert_eq!(
        state.apply(&Entry::DeleteTopic { name: "t".into() }),
        EntryResult::DeleteTopic(Ok(()))
    );
    assert!(
        state.group_offsets.is_empty(),
        "offsets go with their topic"
    );
}

proptest! {
    /// Replaying the same entries (also through a JSON snapshot midway) reproduces the same
    /// results and state, and every partition's index stays dense (ORD-1).
    #[test]
    fn test_state_apply_is_deterministic_and_dense(ops in proptest::collection::vec(op(), 0..60), cut in 0usize..60) {
        let entries: Vec<Entry> = ops.iter().enumerate().map(|(i, op)| to_entry(op, i)).collect();
        let mut first = State::default();
        let results: Vec<EntryResult> = entries.iter().map(|e| first.apply(e)).collect();
        let cut = cut.min(entries.len());
        let mut second = State::default();
        for entry in &entries[..cut] {
            second.apply(entry);
        }
        let json = serde_json::to_string(&second).unwrap();
        let mut restored: State = serde_json::from_str(&json).unwrap();
        restored.rebuild_indexes();
        let replayed: Vec<EntryResult> = entries[cut..].iter().map(|e| restored.apply(e)).collect();
        prop_assert_eq!(&results[cut..], &replayed[..]);
        prop_assert_eq!(serde_json::to_string(&first).unwrap(), serde_json::to_string(&restored).unwrap());
        // The index's derived lookups (timestamps, bytes) are the same maintained or reloaded.
        for (topic, restored_topic) in first.topics.values().zip(restored.topics.values()) {
            for (partition, restored_partition) in topic.partitions.iter().zip(&restored_topic.partitions) {
                let (index, restored_index) = (&partition.index, &restored_partition.index);
                prop_assert_eq!(index, restored_index);
                for target in [i64::MIN, 0, 1, 5, i64::MAX] {
                    prop_assert_eq!(index.first_reaching(0, target), restored_index.first_reaching(0, target));
                }
                prop_assert_eq!(index.bytes_between(0, index.len()), restored_index.bytes_between(0, index.len()));
            }
        }
        let mut live: BTreeMap<FileId, u32> = BTreeMap::new();
        for topic in first.topics.values() {
            for partition in &topic.partitions {
                // Dense from the batch holding the log start (it may start below it).
                let mut next = partition.index.first().map_or(partition.log_start_offset, |e| e.base_offset);
                prop_assert!(next <= partition.log_start_offset);
                prop_assert!(partition.log_start_offset <= partition.high_watermark);
                if let Some(first_entry) = partition.index.first() {
                    prop_assert!(first_entry.last_offset >= partition.log_start_offset);
                }
                for entry in &partition.index {
                    *live.entry(entry.file_id).or_default() += 1;
                    prop_assert_eq!(entry.base_offset, next);
                    prop_assert!(entry.last_offset >= entry.base_offset);
                    next = entry.last_offset + 1;
                }
                prop_assert_eq!(next, partition.high_watermark);
            }
        }
        // Every file an index entry names is live with the right count; released files are
        // named by none (GC-1: deleting them cannot lose data).
        let counted: BTreeMap<FileId, u32> =
            first.files.iter().map(|(id, meta)| (*id, meta.live_batches)).collect();
        prop_assert_eq!(counted, live);
        for id in first.released.keys() {
            prop_assert!(!first.files.contains_key(id));
        }
    }
}

fn init_pid(state: &mut State, existing: Option<(i64, i16)>, at_ms: i64) -> (i64, i16) {
    match state.apply(&Entry::init_producer_id(existing, at_ms)) {
        EntryResult::InitProducerId(Ok(id)) => id,
        other => panic!("unexpected {other:?}"),
    }
}

fn commit_at(state: &mut State, file_ms: i64, n: u128, batch: BatchCommit) -> BatchOutcome {
    // A file id whose ULID time is `file_ms`.
    let file_id = FileId((u128::from(file_ms as u64) << 80) | n);
    match state.apply(&Entry::CommitFile(FileCommit {
        agent: format!("agent-{n}"),
        previous: None,
        file_id,
        size: 10,
        buckets: vec![0],
        batches: vec![batch],
    })) {
        EntryResult::CommitFile(mut outcomes) => outcomes.remove(0),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn test_state_producers_expire_by_inactivity_on_every_partition_at_once() {
    let mut state = state_with_topic(2);
    let (idle, _) = init_pid(&mut state, None, 1_000);
    let (busy, _) = init_pid(&mut state, None, 1_000);
    commit_at(&mut state, 2_000, 1, batch(0, 1, (idle, 0, 0)));
    commit_at(&mut state, 2_000, 2, batch(1, 1, (busy, 0, 0)));
    // The busy producer writes again later; the log start moving past both changes nothing.
    commit_at(&mut state, 9_000, 3, batch(1, 1, (busy, 0, 1)));
    for partition in 0..2 {
        let entry = Entry::AdvanceLogStart {
            topic_id: topic_id(1),
            partitions: vec![LogStartMove {
                partition,
                offset: -1,
            }],
            cause: LogStartCause::Retention,
        };
        state.apply(&entry);
    }
    assert_eq!(state.producer_last_ms[&idle], 2_000);
    assert!(state
        .partition(&topic_id(1), 0)
        .unwrap()
        .producers
        .contains_key(&idle));
    assert_eq!(
        state.apply(&Entry::ExpireProducers { before_ms: 5_000 }),
        EntryResult::ExpireProducers(1)
    );
    assert!(!state.producer_epochs.contains_key(&idle));
    assert!(!state
        .partition(&topic_id(1), 0)
        .unwrap()
        .producers
        .contains_key(&idle));
    // The live producer keeps its sequence on the partition it wrote.
    let next = commit_at(&mut state, 9_500, 4, batch(1, 1, (busy, 0, 2)));
    assert!(matches!(next, BatchOutcome::Appended { .. }), "{next:?}");
    // A retry of the expired producer (a sequence past 0) is refused: its state is gone.
    let refused = commit_at(&mut state, 9_600, 5, batch(0, 1, (idle, 0, 1)));
    assert_eq!(
        refused,
        BatchOutcome::Rejected(ControlError::UnknownProducerId(idle))
    );
    // Its InitProducerId epoch bump (Java, kafka-python) gets a fresh id.
    let (fresh, epoch) = init_pid(&mut state, Some((idle, 0)), 9_700);
    assert!(fresh > busy && epoch == 0);
    let restarted = commit_at(&mut state, 9_800, 8, batch(0, 1, (fresh, 0, 0)));
    assert!(matches!(restarted, BatchOutcome::Appended { .. }));
    // librdkafka bumps the epoch locally and restarts at sequence 0: the id comes back.
    let local_bump = commit_at(&mut state, 9_900, 9, batch(0, 1, (idle, 1, 0)));
    assert!(
        matches!(local_bump, BatchOutcome::Appended { .. }),
        "{local_bump:?}"
    );
    assert_eq!(state.producer_epochs[&idle], 1);
    let next = commit_at(&mut state, 9_950, 10, batch(0, 1, (idle, 1, 1)));
    assert!(matches!(next, BatchOutcome::Appended { .. }), "{next:?}");
    // An id this state never allocated is refused even at sequence 0.
    let stranger = commit_at(&mut state, 9_990, 11, batch(0, 1, (10_000, 0, 0)));
    assert_eq!(
        stranger,
        BatchOutcome::Rejected(ControlError::UnknownProducerId(10_000))
    );
}

#[test]
fn test_state_records_before_fresh_if_unknown_still_answer_unknown_producer() {
    let mut state = State::default();
    let old = Entry::InitProducerId {
        existing: Some((42, 0)),
        at_ms: 0,
        fresh_if_unknown: false,
    };
    assert_eq!(
        state.apply(&old),
        EntryResult::InitProducerId(Err(ControlError::UnknownProducerId(42)))
    );
    assert_eq!(state.next_producer_id, 0);
    // A record from before the field existed parses to the old behaviour.
    let parsed: Entry = serde_json::from_str(r#"{"InitProducerId":{"existing":[42,0]}}"#).unwrap();
    assert_eq!(parsed, old);
}

#[test]
fn test_state_group_expiry_loses_to_a_later_commit_and_clocks_start_at_upgrade() {
    let mut state = state_with_topic(1);
    // Offsets and a producer from before activity times existed (a v1 log).
    commit_offset(&mut state, "g", 0, 5, "").unwrap();
    state
        .group_offsets
        .get_mut("g")
        .unwrap()
        .get_mut("t")
        .unwrap()
        .get_mut(&0)
        .unwrap()
        .commit_ms = 0;
    state.producer_epochs.insert(7, 0);
    state.next_producer_id = 8;
    state.apply(&Entry::NewEpoch {
        epoch: 2,
        cluster_id: "c".into(),
        at_ms: 50_000,
    });
    assert_eq!(state.producer_last_ms[&7], 50_000);
    assert_eq!(state.group_last_commit_ms("g"), Some(50_000));
    // Not idle long enough: the bound is before the commit.
    assert_eq!(
        state.apply(&Entry::ExpireGroup {
            group: "g".into(),
            last_commit_at_most_ms: 49_999,
            coordinator: None,
        }),
        EntryResult::ExpireGroup(false)
    );
    assert_eq!(
        state.apply(&Entry::ExpireGroup {
            group: "g".into(),
            last_commit_at_most_ms: 50_000,
            coordinator: None,
        }),
        EntryResult::ExpireGroup(true)
    );
    assert!(state.group_offsets.is_empty());
}

#[test]
fn test_state_agent_tips_expire_by_file_time() {
    let mut state = state_with_topic(1);
    commit_at(&mut state, 1_000, 1, batch(0, 1, (-1, -1, -1)));
    commit_at(&mut state, 9_000, 2, batch(0, 1, (-1, -1, -1)));
    assert_eq!(
        state.apply(&Entry::ExpireAgentTips { before_ms: 5_000 }),
        EntryResult::ExpireAgentTips(1)
    );
    assert!(!state.agent_tips.contains_key("agent-1"));
    assert!(state.agent_tips.contains_key("agent-2"));
}

#[test]
fn test_state_file_tier_defaults_to_ingest_and_is_left_out_of_records() {
    let old = r#"{"size":10,"buckets":[0,2],"live_batches":1}"#;
    let meta: FileMeta = serde_json::from_str(old).unwrap();
    assert_eq!(meta.tier, Tier::Ingest);
    assert_eq!(meta.buckets, vec![0, 2]);
    // An ingest file's record stays what it was before tiers, so older readers load it.
    assert_eq!(serde_json::to_string(&meta).unwrap(), old);
    let mut state = state_with_topic(1);
    commit(&mut state, 1, vec![batch(0, 1, (-1, -1, -1))]);
    assert_eq!(state.files[&FileId(1)].tier, Tier::Ingest);
}

#[test]
fn test_state_coordinator_fence_refuses_a_stale_coordinators_commit_and_old_records_pass() {
    let mut state = state_with_topic(1);
    let register = |node_id: i32, incarnation: &str| {
        Entry::RegisterAgent(crate::entry::AgentRegistration {
            node_id,
            incarnation: incarnation.into(),
            zone: String::new(),
            host: "127.0.0.1".into(),
            port: 9000 + node_id,
            control_address: String::new(),
            at_ms: 0,
        })
    };
    state.apply(&register(1, "a"));
    let since = state.registry.version;
    let commit =
        |offset: i64, stamp: Option<crate::entry::CoordinatorStamp>| Entry::CommitOffsets {
            group: "g".into(),
            offsets: vec![OffsetCommit {
                topic: "t".into(),
                partition: 0,
                offset,
                leader_epoch: 0,
                metadata: None,
            }],
            at_ms: 0,
            coordinator: stamp,
        };
    let stamp = |node_id: i32, incarnation: &str, since: u64| {
        Some(crate::entry::CoordinatorStamp {
            node_id,
            incarnation: incarnation.into(),
            since,
        })
    };
    assert_eq!(
        state.apply(&commit(10, stamp(1, "a", since))),
        EntryResult::CommitOffsets(vec![Ok(())])
    );
    // Node 1 is fenced and comes back as another incarnation: the old one's commit is refused
    // and changes nothing.
    state.apply(&Entry::FenceAgent {
        node_id: 1,
        incarnation: "a".into(),
        at_ms: 0,
    });
    state.apply(&register(1, "b"));
    let EntryResult::CommitOffsets(results) = state.apply(&commit(5, stamp(1, "a", since))) else {
        panic!("a commit result");
    };
    assert!(
        matches!(results[..], [Err(ControlError::NotCoordinator(_))]),
        "{results:?}"
    );
    assert_eq!(state.committed_offset("g", "t", 0).unwrap().offset, 10);
    // A record from before the registry (no stamp) is not checked.
    assert_eq!(
        state.apply(&commit(12, None)),
        EntryResult::CommitOffsets(vec![Ok(())])
    );
    // A record of this build decodes, and one without the field decodes as unchecked.
    let json = serde_json::to_string(&commit(1, stamp(1, "b", 3))).unwrap();
    assert!(json.contains("coordinator"), "{json}");
    let old = r#"{"CommitOffsets":{"group":"g","offsets":[],"at_ms":0}}"#;
    assert!(matches!(
        serde_json::from_str::<Entry>(old).unwrap(),
        Entry::CommitOffsets {
            coordinator: None,
            ..
        }
    ));
    // Deletes are fenced alike: the old incarnation deletes nothing, the current one does.
    let delete_offsets = |stamp| Entry::DeleteGroupOffsets {
        group: "g".into(),
        partitions: vec![("t".into(), 0)],
        coordinator: stamp,
    };
    let refused = state.apply(&delete_offsets(stamp(1, "a", since)));
    assert!(
        matches!(
            refused,
            EntryResult::DeleteGroupOffsets(Err(ControlError::NotCoordinator(_)))
        ),
        "{refused:?}"
    );
    let delete_group = |stamp| Entry::DeleteGroup {
        group: "g".into(),
        coordinator: stamp,
    };
    let refused = state.apply(&delete_group(stamp(1, "a", since)));
    assert!(
        matches!(
            refused,
            EntryResult::DeleteGroup(Err(ControlError::NotCoordinator(_)))
        ),
        "{refused:?}"
    );
    assert_eq!(state.committed_offset("g", "t", 0).unwrap().offset, 12);
    let current = stamp(1, "b", state.registry.version);
    assert_eq!(
        state.apply(&delete_offsets(current.clone())),
        EntryResult::DeleteGroupOffsets(Ok(()))
    );
    assert!(state.committed_offset("g", "t", 0).is_none());
    assert!(matches!(
        state.apply(&delete_group(current)),
        EntryResult::DeleteGroup(Ok(_))
    ));
    // An expiry by the old incarnation expires nothing.
    state.apply(&commit(20, stamp(1, "b", state.registry.version)));
    let expire = Entry::ExpireGroup {
        group: "g".into(),
        last_commit_at_most_ms: i64::MAX,
        coordinator: stamp(1, "a", since),
    };
    assert_eq!(state.apply(&expire), EntryResult::ExpireGroup(false));
    assert_eq!(state.committed_offset("g", "t", 0).unwrap().offset, 20);
    let old = r#"{"DeleteGroup":{"group":"g"}}"#;
    assert!(matches!(
        serde_json::from_str::<Entry>(old).unwrap(),
        Entry::DeleteGroup {
            coordinator: None,
            ..
        }
    ));
}
