//! Pending files (RFC 0006): reserve, confirm and abort in the state machine.

use std::collections::BTreeMap;

use proptest::prelude::*;

use weir_common::{FileId, TopicId};

use crate::entry::{
    BatchCommit, BatchOutcome, ConfirmedFile, Entry, EntryResult, FileAbort, FileCommit,
    FillerBatch, LogStartCause, LogStartMove,
};
use crate::log::{LogRecord, LOG_RECORD_VERSION};
use crate::state::State;
use crate::ControlError;

const TOPIC: TopicId = TopicId([0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

fn state() -> State {
    let mut state = State::default();
    state.apply(&Entry::CreateTopic {
        name: "t".into(),
        topic_id: TOPIC,
        partitions: 2,
        configs: BTreeMap::new(),
    });
    state
}

fn producer(state: &mut State) -> (i64, i16) {
    match state.apply(&Entry::init_producer_id(None, 1)) {
        EntryResult::InitProducerId(Ok(id)) => id,
        other => panic!("unexpected {other:?}"),
    }
}

/// A batch of `span` records at `byte_offset` (100 bytes); `sequence` -1: not idempotent.
fn batch(partition: i32, span: i32, producer: (i64, i16), sequence: i32) -> BatchCommit {
    let idempotent = sequence >= 0;
    BatchCommit {
        topic_id: TOPIC,
        partition,
        byte_offset: 64,
        len: 100,
        offset_span: span,
        first_timestamp: 5,
        max_timestamp: 6,
        producer_id: if idempotent { producer.0 } else { -1 },
        producer_epoch: if idempotent { producer.1 } else { -1 },
        base_sequence: sequence,
    }
}

/// Agent `agent`'s file `n` (its chain continues from file `n - 1` when `n > 1`).
fn file_commit(agent: &str, n: u128, batches: Vec<BatchCommit>) -> FileCommit {
    FileCommit {
        agent: agent.into(),
        previous: (n > 1).then(|| file(agent, n - 1)),
        file_id: file(agent, n),
        size: 1000,
        buckets: vec![0, 1, 2],
        batches,
    }
}

fn file(agent: &str, n: u128) -> FileId {
    FileId((u128::from(agent.as_bytes()[0]) << 64) | n)
}

fn reserve(state: &mut State, commit: FileCommit) -> Vec<BatchOutcome> {
    match state.apply_durable(&Entry::ReserveFile(commit)) {
        EntryResult::ReserveFile(outcomes) => outcomes,
        other => panic!("unexpected {other:?}"),
    }
}

fn base(outcome: &BatchOutcome) -> i64 {
    match outcome {
        BatchOutcome::Appended { base_offset, .. } => *base_offset,
        other => panic!("not appended: {other:?}"),
    }
}

fn confirm(state: &mut State, files: &[FileId]) -> usize {
    let files = files
        .iter()
        .map(|file_id| ConfirmedFile {
            file_id: *file_id,
            buckets: vec![0, 2],
        })
        .collect();
    match state.apply_durable(&Entry::ConfirmFiles { files }) {
        EntryResult::ConfirmFiles(n) => n,
        other => panic!("unexpected {other:?}"),
    }
}

/// An abort of `files` with a filler batch (61 bytes each) for every pending batch they hold.
fn abort_entry(state: &State, agent: &str, files: &[FileId]) -> FileAbort {
    let batches = state
        .pending
        .get(agent)
        .into_iter()
        .flatten()
        .filter(|pending| files.contains(&pending.file_id))
        .flat_map(|pending| &pending.batches)
        .enumerate()
        .map(|(i, batch)| FillerBatch {
            topic_id: batch.topic_id,
            partition: batch.partition,
            base_offset: batch.base_offset,
            byte_offset: 8 + 61 * i as u64,
            len: 61,
        })
        .collect();
    FileAbort {
        agent: agent.into(),
        files: files.to_vec(),
        filler: FileId(0xF111E4),
        size: 500,
        buckets: vec![0, 1],
        batches,
    }
}

fn abort(state: &mut State, abort: FileAbort) -> Result<usize, ControlError> {
    match state.apply_durable(&Entry::AbortFiles(abort)) {
        EntryResult::AbortFiles(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

fn watermarks(state: &State, partition: usize) -> (i64, i64) {
    let p = &state.topics["t"].partitions[partition];
    (p.stable_high_watermark, p.high_watermark)
}

#[test]
fn test_reserved_batches_are_unreadable_until_every_earlier_one_is_confirmed() {
    let mut state = state();
    let first = reserve(
        &mut state,
        file_commit("a", 1, vec![batch(0, 3, (0, 0), -1)]),
    );
    let second = reserve(
        &mut state,
        file_commit("a", 2, vec![batch(0, 2, (0, 0), -1)]),
    );
    assert_eq!((base(&first[0]), base(&second[0])), (0, 3));
    assert_eq!(
        watermarks(&state, 0),
        (0, 5),
        "offsets assigned, nothing readable"
    );
    assert_eq!(state.first_pending(&TOPIC, 0), Some(0));

    assert_eq!(confirm(&mut state, &[file("a", 2)]), 1);
    assert_eq!(
        watermarks(&state, 0),
        (0, 5),
        "the later file is confirmed, but the earlier one still holds the bound"
    );
    assert_eq!(confirm(&mut state, &[file("a", 1), file("a", 1)]), 1);
    assert_eq!(watermarks(&state, 0), (5, 5));
    assert!(!state.has_pending());
    assert_eq!(
        state.files[&file("a", 1)].buckets,
        [0, 2],
        "holders from the confirmation"
    );
    assert_eq!(
        confirm(&mut state, &[file("a", 1)]),
        0,
        "confirming twice does nothing"
    );

    // A plain commit after a pending reservation is readable only up to the pending batch.
    reserve(
        &mut state,
        file_commit("a", 3, vec![batch(1, 4, (0, 0), -1)]),
    );
    let committed = state.apply_durable(&Entry::CommitFile(file_commit(
        "b",
        1,
        vec![batch(1, 1, (0, 0), -1)],
    )));
    assert!(matches!(committed, EntryResult::CommitFile(_)));
    assert_eq!(watermarks(&state, 1), (0, 5));
}

#[test]
fn test_abort_moves_batches_to_the_filler_and_rolls_sequences_back() {
    let mut state = state();
    let pid = producer(&mut state);
    let settled = reserve(&mut state, file_commit("a", 1, vec![batch(0, 2, pid, 0)]));
    assert_eq!(base(&settled[0]), 0);
    confirm(&mut state, &[file("a", 1)]);
    reserve(
        &mut state,
        file_commit("a", 2, vec![batch(0, 3, pid, 2), batch(1, 1, pid, 0)]),
    );
    reserve(&mut state, file_commit("a", 3, vec![batch(0, 1, pid, 5)]));
    assert_eq!(watermarks(&state, 0), (2, 6));
    let bytes_before = state.topics["t"].partitions[0].index.bytes_between(0, 3);
    assert_eq!(bytes_before, 300);

    // Not the agent's last pending files: refused, nothing changes.
    let not_last = abort_entry(&state, "a", &[file("a", 2)]);
    let refused = abort(&mut state, not_last);
    assert!(
        matches!(refused, Err(ControlError::AbortMismatch(_))),
        "{refused:?}"
    );
    let mut missing = abort_entry(&state, "a", &[file("a", 2), file("a", 3)]);
    missing.batches.pop();
    assert!(matches!(
        abort(&mut state, missing),
        Err(ControlError::AbortMismatch(_))
    ));
    assert_eq!(state.pending["a"].len(), 2);

    let entry = abort_entry(&state, "a", &[file("a", 2), file("a", 3)]);
    assert_eq!(abort(&mut state, entry), Ok(3));
    assert!(!state.has_pending());
    assert_eq!(
        watermarks(&state, 0),
        (6, 6),
        "the offsets stay, as empty batches"
    );
    assert_eq!(watermarks(&state, 1), (1, 1));
    let index = &state.topics["t"].partitions[0].index;
    let files: Vec<(FileId, i64, i64, u32)> = index
        .iter()
        .map(|e| (e.file_id, e.base_offset, e.last_offset, e.len))
        .collect();
    let filler = FileId(0xF111E4);
    assert_eq!(
        files,
        [
            (file("a", 1), 0, 1, 100),
            (filler, 2, 4, 61),
            (filler, 5, 5, 61)
        ],
        "dense, the aborted batches in the filler"
    );
    assert_eq!(
        index.bytes_between(0, 3),
        100 + 61 + 61,
        "byte totals follow the filler"
    );
    assert_eq!(state.files[&filler].live_batches, 3);
    assert!(
        state.released.contains_key(&file("a", 2)) && state.released.contains_key(&file("a", 3))
    );
    assert_eq!(
        state.released[&file("a", 2)].buckets,
        [0, 1, 2],
        "released with every bucket that may hold a partial copy"
    );

    // The sequences rolled back: the retries append anew, in a later file.
    let retried = reserve(
        &mut state,
        file_commit("a", 4, vec![batch(0, 3, pid, 2), batch(1, 1, pid, 0)]),
    );
    assert_eq!((base(&retried[0]), base(&retried[1])), (6, 1));
    let out_of_order = reserve(&mut state, file_commit("a", 5, vec![batch(0, 1, pid, 9)]));
    assert!(matches!(
        out_of_order[0],
        BatchOutcome::Rejected(ControlError::OutOfOrderSequence { expected: 5, .. })
    ));
}

#[test]
fn test_retries_of_pending_batches_wait_for_their_outcome() {
    let mut state = state();
    let pid = producer(&mut state);
    reserve(&mut state, file_commit("a", 1, vec![batch(0, 2, pid, 0)]));
    // A retry while the original is pending: its offset may still be aborted.
    let retry = reserve(&mut state, file_commit("a", 2, vec![batch(0, 2, pid, 0)]));
    assert_eq!(
        retry[0],
        BatchOutcome::Rejected(ControlError::SequencePending { producer_id: pid.0 })
    );
    assert!(ControlError::SequencePending { producer_id: 0 }.is_retryable());
    // The same incarnation may go on past its own pending batch ...
    let next = reserve(&mut state, file_commit("a", 3, vec![batch(0, 1, pid, 2)]));
    assert_eq!(base(&next[0]), 2);
    // ... another may not: an abort of `a`'s files would roll the sequence back under it.
    let elsewhere = reserve(&mut state, file_commit("b", 1, vec![batch(0, 1, pid, 3)]));
    assert!(matches!(
        elsewhere[0],
        BatchOutcome::Rejected(ControlError::SequencePending { .. })
    ));
    let committed = state.apply(&Entry::CommitFile(file_commit(
        "c",
        1,
        vec![batch(0, 1, pid, 3)],
    )));
    assert!(
        matches!(&committed, EntryResult::CommitFile(o) if matches!(o[0], BatchOutcome::Rejected(ControlError::SequencePending { .. }))),
        "a follower's serial commit waits too"
    );

    confirm(&mut state, &[file("a", 1), file("a", 3)]);
    let retry = reserve(&mut state, file_commit("a", 4, vec![batch(0, 2, pid, 0)]));
    assert!(
        matches!(retry[0], BatchOutcome::Duplicate { base_offset: 0, .. }),
        "confirmed: the retry is a duplicate with the original's offset"
    );
    let elsewhere = reserve(&mut state, file_commit("b", 2, vec![batch(0, 1, pid, 3)]));
    assert_eq!(base(&elsewhere[0]), 3);
}

#[test]
fn test_log_start_never_passes_a_pending_batch() {
    let mut state = state();
    state.apply_durable(&Entry::CommitFile(file_commit(
        "b",
        1,
        vec![batch(0, 4, (0, 0), -1)],
    )));
    reserve(
        &mut state,
        file_commit("a", 1, vec![batch(0, 2, (0, 0), -1)]),
    );
    let advance = |offset| Entry::AdvanceLogStart {
        topic_id: TOPIC,
        partitions: vec![LogStartMove {
            partition: 0,
            offset,
        }],
        cause: LogStartCause::DeleteRecords,
    };
    assert_eq!(
        state.apply(&advance(-1)),
        EntryResult::AdvanceLogStart(vec![Ok(4)]),
        "everything readable, not the pending batch"
    );
    assert!(matches!(
        state.apply(&advance(5)),
        EntryResult::AdvanceLogStart(r) if matches!(r[0], Err(ControlError::OffsetOutOfRange { .. }))
    ));
    confirm(&mut state, &[file("a", 1)]);
    assert_eq!(
        state.apply(&advance(-1)),
        EntryResult::AdvanceLogStart(vec![Ok(6)])
    );
}

#[test]
fn test_pending_files_survive_serialisation_and_recovery_keeps_them_unreadable() {
    let mut state = state();
    let pid = producer(&mut state);
    reserve(&mut state, file_commit("a", 1, vec![batch(0, 2, pid, 0)]));
    let json = serde_json::to_string(&state).unwrap();
    let mut restored: State = serde_json::from_str(&json).unwrap();
    restored.rebuild_indexes();
    restored.mark_all_stable();
    assert_eq!(
        watermarks(&restored, 0),
        (0, 2),
        "recovery marks stable up to the pending batch"
    );
    assert_eq!(restored.first_pending(&TOPIC, 0), Some(0));
    let retry = reserve(
        &mut restored,
        file_commit("b", 1, vec![batch(0, 2, pid, 0)]),
    );
    assert!(matches!(
        retry[0],
        BatchOutcome::Rejected(ControlError::SequencePending { .. })
    ));
    let entry = abort_entry(&restored, "a", &[file("a", 1)]);
    assert_eq!(abort(&mut restored, entry), Ok(1));
    assert_eq!(watermarks(&restored, 0), (2, 2));
}

#[test]
fn test_records_take_the_oldest_version_that_holds_their_entries() {
    let commit = Entry::CommitFile(file_commit("a", 1, vec![]));
    assert_eq!(
        LogRecord::new(vec![commit.clone()]).version,
        4,
        "readable by builds before RFC 0006"
    );
    let reserve = Entry::ReserveFile(file_commit("a", 1, vec![]));
    let record = LogRecord::new(vec![commit, reserve]);
    assert_eq!(record.version, 5);
    assert_eq!(LOG_RECORD_VERSION, 5);
    // Today's records (version 4, no pending entries) still decode and replay with nothing pending.
    let v4 = r#"{"v":4,"entries":[{"CreateTopic":{"name":"t","topic_id":[64,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"partitions":1,"configs":{}}},{"CommitFile":{"agent":"a","previous":null,"file_id":7,"size":10,"buckets":[0],"batches":[{"topic_id":[64,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"partition":0,"byte_offset":0,"len":10,"offset_span":3,"first_timestamp":1,"max_timestamp":1,"producer_id":-1,"producer_epoch":-1,"base_sequence":-1}]}}]}"#;
    let decoded: LogRecord = serde_json::from_str(v4).unwrap();
    let mut replayed = State::default();
    for entry in &decoded.entries {
        replayed.apply(entry);
    }
    replayed.mark_all_stable();
    assert!(!replayed.has_pending());
    assert_eq!(watermarks(&replayed, 0), (3, 3));
}

#[derive(Debug, Clone)]
enum Op {
    InitPid,
    /// Agent, partition, span, sequence mode (0: none, 1: next, 2: repeat the last).
    Reserve(u8, i32, i32, u8),
    /// A follower's serial commit: partition, span, sequence mode.
    Commit(i32, i32, u8),
    /// Agent, which pending file.
    Confirm(u8, usize),
    /// Agent, how many of its last pending files.
    Abort(u8, usize),
    /// Partition, offset (-1: as far as allowed).
    Advance(i32, i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::InitPid),
        (0u8..2, 0i32..2, 1i32..4, 0u8..3).prop_map(|(a, p, s, m)| Op::Reserve(a, p, s, m)),
        (0i32..2, 1i32..4, 0u8..3).prop_map(|(p, s, m)| Op::Commit(p, s, m)),
        (0u8..2, 0usize..4).prop_map(|(a, k)| Op::Confirm(a, k)),
        (0u8..2, 1usize..4).prop_map(|(a, n)| Op::Abort(a, n)),
        (0i32..2, -1i64..12).prop_map(|(p, o)| Op::Advance(p, o)),
    ]
}

/// A batch of producer 0 (if it exists) whose sequence follows or repeats its last one.
fn sequenced(state: &State, partition: i32, span: i32, mode: u8) -> BatchCommit {
    let Some(&epoch) = state.producer_epochs.get(&0).filter(|_| mode > 0) else {
        return batch(partition, span, (0, 0), -1);
    };
    let last = state.topics["t"].partitions[partition as usize]
        .producers
        .get(&0)
        .and_then(|producer| producer.recent.back().copied());
    match (mode, last) {
        (2, Some(last)) => batch(
            partition,
            last.last_sequence - last.first_sequence + 1,
            (0, epoch),
            last.first_sequence,
        ),
        (_, Some(last)) => batch(partition, span, (0, epoch), last.last_sequence + 1),
        (_, None) => batch(partition, span, (0, epoch), 0),
    }
}

/// The entry for `op`, made against `state` (the chain tip, the pending files, the sequences)
/// as the committer and the resolver make theirs.
fn to_entry(op: &Op, index: usize, state: &State) -> Entry {
    let agent = |a: &u8| format!("r{a}");
    match op {
        Op::InitPid => Entry::init_producer_id(None, index as i64),
        Op::Reserve(a, partition, span, mode) => Entry::ReserveFile(FileCommit {
            agent: agent(a),
            previous: state.agent_tips.get(&agent(a)).copied(),
            file_id: FileId(index as u128 + 1),
            size: 1000,
            buckets: vec![0, 1, 2],
            batches: vec![sequenced(state, *partition, *span, *mode)],
        }),
        Op::Commit(partition, span, mode) => Entry::CommitFile(FileCommit {
            agent: format!("plain{index}"),
            previous: None,
            file_id: FileId(index as u128 + 1),
            size: 1000,
            buckets: vec![0],
            batches: vec![sequenced(state, *partition, *span, *mode)],
        }),
        Op::Confirm(a, k) => {
            let files = state.pending.get(&agent(a)).map_or(&[][..], Vec::as_slice);
            let files = files
                .get(k % files.len().max(1))
                .map(|file| ConfirmedFile {
                    file_id: file.file_id,
                    buckets: vec![1, 2],
                })
                .into_iter()
                .collect();
            Entry::ConfirmFiles { files }
        }
        Op::Abort(a, n) => {
            let pending = state.pending.get(&agent(a)).map_or(&[][..], Vec::as_slice);
            let files: Vec<FileId> = pending[pending.len().saturating_sub(*n)..]
                .iter()
                .map(|file| file.file_id)
                .collect();
            let mut abort = if files.is_empty() {
                abort_entry(&State::default(), "", &[])
            } else {
                abort_entry(state, &agent(a), &files)
            };
            abort.agent = agent(a);
            abort.filler = FileId(1_000_000 + index as u128);
            Entry::AbortFiles(abort)
        }
        Op::Advance(partition, offset) => Entry::AdvanceLogStart {
            topic_id: TOPIC,
            partitions: vec![LogStartMove {
                partition: *partition,
                offset: *offset,
            }],
            cause: LogStartCause::Retention,
        },
    }
}

proptest! {
    /// Reservations, confirmations and aborts in any order: replay (also from a snapshot
    /// midway) gives the same results; the index stays dense; nothing pending is ever below
    /// the stable high watermark; live counts stay exact; and every producer's remembered
    /// sequences stay contiguous through rollbacks (IDM-1).
    #[test]
    fn test_pending_files_keep_the_state_dense_and_deterministic(
        ops in proptest::collection::vec(op(), 0..50),
        cut in 0usize..50,
    ) {
        let mut first = state();
        let mut durable = state();
        let mut entries = Vec::new();
        let mut results = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            let entry = to_entry(op, index, &first);
            let result = first.apply(&entry);
            prop_assert_eq!(&durable.apply_durable(&entry), &result);
            results.push(result);
            entries.push(entry);
            for (number, partition) in durable.topics["t"].partitions.iter().enumerate() {
                let bound = durable
                    .first_pending(&TOPIC, number as i32)
                    .map_or(partition.high_watermark, |first| first.min(partition.high_watermark));
                prop_assert_eq!(partition.stable_high_watermark, bound);
            }
        }
        let cut = cut.min(entries.len());
        let mut second = state();
        for entry in &entries[..cut] {
            second.apply(entry);
        }
        let mut restored: State = serde_json::from_str(&serde_json::to_string(&second).unwrap()).unwrap();
        restored.rebuild_indexes();
        let replayed: Vec<EntryResult> = entries[cut..].iter().map(|e| restored.apply(e)).collect();
        prop_assert_eq!(&results[cut..], &replayed[..]);
        prop_assert_eq!(serde_json::to_string(&first).unwrap(), serde_json::to_string(&restored).unwrap());

        let mut live: BTreeMap<FileId, u32> = BTreeMap::new();
        for partition in &first.topics["t"].partitions {
            let mut next = partition.index.first().map_or(partition.log_start_offset, |e| e.base_offset);
            let mut bytes = 0;
            for entry in &partition.index {
                *live.entry(entry.file_id).or_default() += 1;
                prop_assert_eq!(entry.base_offset, next);
                next = entry.last_offset + 1;
                bytes += u64::from(entry.len);
                if entry.file_id.0 >= 1_000_000 {
                    prop_assert_eq!(entry.len, 61, "a filler batch");
                }
            }
            prop_assert_eq!(next, partition.high_watermark);
            prop_assert_eq!(partition.index.bytes_between(0, partition.index.len()), bytes);
            for producer in partition.producers.values() {
                for pair in producer.recent.iter().collect::<Vec<_>>().windows(2) {
                    prop_assert_eq!(pair[0].last_sequence + 1, pair[1].first_sequence, "{:?}", producer);
                }
                // A remembered sequence names a batch that holds records, never an aborted one:
                // a retry of an aborted batch must append anew, not be taken for a duplicate.
                for seen in &producer.recent {
                    let position = partition.index.partition_point(|e| e.base_offset < seen.base_offset);
                    let entry = partition.index.get(position).filter(|e| e.base_offset == seen.base_offset);
                    if let Some(entry) = entry {
                        prop_assert!(entry.file_id.0 < 1_000_000, "{:?} names a filler", seen);
                    }
                }
            }
        }
        let counted: BTreeMap<FileId, u32> =
            first.files.iter().map(|(id, meta)| (*id, meta.live_batches)).collect();
        prop_assert_eq!(counted, live);
        for id in first.released.keys() {
            prop_assert!(!first.files.contains_key(id));
        }
    }
}

/// A deleted topic's pending batches leave `pending`: no abort could name a filler for them, so
/// they would otherwise hold their incarnation's later files (on other topics) back for ever.
#[test]
fn test_deleting_a_topic_forgets_its_pending_batches() {
    let mut state = state();
    let other = TopicId([0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    state.apply(&Entry::CreateTopic {
        name: "u".into(),
        topic_id: other,
        partitions: 1,
        configs: BTreeMap::new(),
    });
    let on_other = BatchCommit {
        topic_id: other,
        ..batch(0, 2, (0, 0), -1)
    };
    reserve(
        &mut state,
        file_commit("a", 1, vec![batch(0, 1, (0, 0), -1)]),
    );
    reserve(
        &mut state,
        file_commit("a", 2, vec![batch(1, 1, (0, 0), -1), on_other]),
    );
    reserve(&mut state, file_commit("a", 3, vec![on_other]));
    state.apply_durable(&Entry::DeleteTopic { name: "t".into() });
    let left: Vec<(FileId, usize)> = state.pending["a"]
        .iter()
        .map(|file| (file.file_id, file.batches.len()))
        .collect();
    assert_eq!(left, [(file("a", 2), 1), (file("a", 3), 1)]);
    let entry = abort_entry(&state, "a", &[file("a", 2), file("a", 3)]);
    assert_eq!(
        abort(&mut state, entry),
        Ok(2),
        "the rest can still be aborted"
    );
    assert!(!state.has_pending());
}

/// A producer whose batch is pending does not expire: the batch may still be confirmed, and a
/// retry must then be found a duplicate, not refused as an unknown id (the client would bump
/// its epoch and append the batch a second time; seed 155).
#[test]
fn test_a_producer_with_a_pending_batch_does_not_expire() {
    let mut state = state();
    let pid = producer(&mut state);
    reserve(&mut state, file_commit("a", 1, vec![batch(0, 2, pid, 0)]));
    assert_eq!(
        state.apply(&Entry::ExpireProducers {
            before_ms: i64::MAX
        }),
        EntryResult::ExpireProducers(0)
    );
    assert!(state.producer_epochs.contains_key(&pid.0));
    assert!(state.topics["t"].partitions[0]
        .producers
        .contains_key(&pid.0));
    confirm(&mut state, &[file("a", 1)]);
    assert_eq!(
        state.apply(&Entry::ExpireProducers {
            before_ms: i64::MAX
        }),
        EntryResult::ExpireProducers(1),
        "confirmed, it expires as before"
    );
}
