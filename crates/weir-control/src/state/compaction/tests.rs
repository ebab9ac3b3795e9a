use std::collections::BTreeMap;

use weir_common::{FileId, Tier, TopicId};

use crate::entry::{
    BatchCommit, Entry, EntryResult, FileCommit, FileReplace, LogStartCause, LogStartMove,
    ReplaceOutcome, ReplacedBatch, ReplacedRun,
};
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
    // File 1: p0 offsets 0..=1, p1 0..=0; file 2: p0 2..=4.
    commit(&mut state, 1, &[(0, 2), (1, 1)]);
    commit(&mut state, 2, &[(0, 3)]);
    state
}

fn commit(state: &mut State, file: u128, batches: &[(i32, i32)]) {
    let batches = batches
        .iter()
        .enumerate()
        .map(|(i, &(partition, span))| BatchCommit {
            topic_id: TOPIC,
            partition,
            byte_offset: 8 + 100 * i as u64,
            len: 100,
            offset_span: span,
            first_timestamp: 1,
            max_timestamp: 1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        })
        .collect();
    state.apply(&Entry::CommitFile(FileCommit {
        agent: format!("agent-{file}"),
        previous: None,
        file_id: FileId(file),
        size: 1000,
        buckets: vec![0, 1],
        batches,
    }));
}

fn moved(partition: i32, base: i64, last: i64, from: u128, at: u64) -> ReplacedBatch {
    ReplacedBatch {
        topic_id: TOPIC,
        partition,
        base_offset: base,
        last_offset: last,
        from: FileId(from),
        byte_offset: at,
        len: 100,
    }
}

fn replace(output: u128, batches: Vec<ReplacedBatch>) -> Entry {
    Entry::ReplaceFiles(FileReplace {
        job: 7,
        output: FileId(output),
        tier: Tier::Regional,
        holders: vec![0],
        size: 4096,
        batches,
        inputs: Vec::new(),
        runs: Vec::new(),
    })
}

fn all_three(output: u128) -> Entry {
    replace(
        output,
        vec![
            moved(0, 0, 1, 1, 8),
            moved(0, 2, 4, 2, 108),
            moved(1, 0, 0, 1, 208),
        ],
    )
}

fn result(state: &mut State, entry: &Entry) -> Result<ReplaceOutcome, ControlError> {
    match state.apply(entry) {
        EntryResult::ReplaceFiles(result) => result,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn test_replace_moves_batches_and_releases_inputs() {
    let mut state = state();
    let outcome = result(&mut state, &all_three(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 3,
            skipped: 0
        }
    );
    let p0 = state.partition(&TOPIC, 0).unwrap();
    assert_eq!(
        spans(&state, 0),
        vec![(0, 1, FileId(10), 8, 100), (2, 4, FileId(10), 108, 100)],
        "offsets and lengths stay; file and position change"
    );
    assert_eq!(p0.high_watermark, 5);
    let output = &state.files[&FileId(10)];
    assert_eq!(
        (output.tier, output.live_batches, &output.buckets),
        (Tier::Regional, 3, &vec![0])
    );
    assert!(!state.files.contains_key(&FileId(1)) && !state.files.contains_key(&FileId(2)));
    assert_eq!(state.released[&FileId(1)].tier, Tier::Ingest);
    assert!(state.released.contains_key(&FileId(2)));

    // Replay gives the same state.
    let mut replay = state_for_replay();
    result(&mut replay, &all_three(10)).unwrap();
    assert_eq!(
        serde_json::to_value(&replay).unwrap(),
        serde_json::to_value(&state).unwrap()
    );
}

fn state_for_replay() -> State {
    state()
}

#[test]
fn test_replace_runs_once_a_second_run_conflicts_and_changes_nothing() {
    let mut state = state();
    result(&mut state, &all_three(10)).unwrap();
    let before = serde_json::to_value(&state).unwrap();
    // The same job run again by another worker: another output, the same inputs.
    let err = result(&mut state, &all_three(11)).unwrap_err();
    assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
    // The same output id again.
    let err = result(&mut state, &all_three(10)).unwrap_err();
    assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
    assert_eq!(serde_json::to_value(&state).unwrap(), before);
}

#[test]
fn test_replace_with_one_wrong_batch_changes_nothing() {
    let mut state = state();
    let before = serde_json::to_value(&state).unwrap();
    let wrong_file = replace(10, vec![moved(0, 0, 1, 1, 8), moved(0, 2, 4, 1, 108)]);
    let wrong_range = replace(10, vec![moved(0, 0, 1, 1, 8), moved(0, 2, 3, 2, 108)]);
    let not_a_batch = replace(10, vec![moved(0, 1, 1, 1, 8)]);
    let beyond = replace(10, vec![moved(0, 5, 5, 2, 8)]);
    let twice = replace(10, vec![moved(0, 0, 1, 1, 8), moved(0, 0, 1, 1, 8)]);
    for entry in [wrong_file, wrong_range, not_a_batch, beyond, twice] {
        let err = result(&mut state, &entry).unwrap_err();
        assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
        assert_eq!(serde_json::to_value(&state).unwrap(), before);
    }
}

#[test]
fn test_replace_skips_what_retention_or_topic_deletion_removed() {
    let mut state = state();
    // Retention moved p0's start past file 1's batch after the worker read it.
    state.apply(&Entry::AdvanceLogStart {
        topic_id: TOPIC,
        partitions: vec![LogStartMove {
            partition: 0,
            offset: 2,
        }],
        cause: LogStartCause::DeleteRecords,
    });
    let outcome = result(&mut state, &all_three(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 2,
            skipped: 1
        }
    );
    assert_eq!(state.files[&FileId(10)].live_batches, 2);
    assert!(state.released.contains_key(&FileId(1)));

    // Everything gone: the output is released at once.
    let mut state = self::state();
    state.apply(&Entry::DeleteTopic { name: "t".into() });
    let outcome = result(&mut state, &all_three(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 0,
            skipped: 3
        }
    );
    assert!(!state.files.contains_key(&FileId(10)));
    assert_eq!(state.released[&FileId(10)].tier, Tier::Regional);
}

#[test]
fn test_replace_output_below_the_sweep_horizon_is_refused() {
    let mut state = state();
    state.apply(&Entry::SweepHorizon { horizon_ms: 1 });
    let err = result(&mut state, &all_three(10)).unwrap_err();
    assert!(matches!(err, ControlError::FileTooOld { .. }), "{err}");
}

/// The entry and the regional tier survive the log's encoding; a record without a tier is an
/// ingest file, as before tiers existed.
#[test]
fn test_replace_entry_and_regional_tier_encode() {
    let entry = all_three(10);
    let json = serde_json::to_string(&entry).unwrap();
    assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), entry);
    assert!(json.contains("\"regional\""), "{json}");
    let mut state = state();
    result(&mut state, &entry).unwrap();
    let encoded = serde_json::to_string(&state.files[&FileId(10)]).unwrap();
    assert!(encoded.contains("\"tier\":\"regional\""), "{encoded}");
}

fn run(partition: i32, base: i64, last: i64, at: u64, len: u32, entries: u32) -> ReplacedRun {
    ReplacedRun {
        topic_id: TOPIC,
        partition,
        base_offset: base,
        last_offset: last,
        byte_offset: at,
        len,
        entries,
    }
}

fn replace_runs(output: u128, inputs: &[u128], runs: Vec<ReplacedRun>) -> Entry {
    Entry::ReplaceFiles(FileReplace {
        job: 8,
        output: FileId(output),
        tier: Tier::Regional,
        holders: vec![0],
        size: 300,
        batches: Vec::new(),
        inputs: inputs.iter().map(|&i| FileId(i)).collect(),
        runs,
    })
}

/// p0's two batches (files 1 and 2) as one run at 0..200, p1's one batch at 200..300.
fn both_runs(output: u128) -> Entry {
    replace_runs(
        output,
        &[1, 2],
        vec![run(0, 0, 4, 0, 200, 2), run(1, 0, 0, 200, 100, 1)],
    )
}

fn spans(state: &State, partition: i32) -> Vec<(i64, i64, FileId, u64, u32)> {
    state
        .partition(&TOPIC, partition)
        .unwrap()
        .index
        .iter()
        .map(|e| {
            (
                e.base_offset,
                e.last_offset,
                e.file_id,
                e.byte_offset,
                e.len,
            )
        })
        .collect()
}

#[test]
fn test_replace_runs_become_one_entry_each_and_release_inputs() {
    let mut state = state();
    let outcome = result(&mut state, &both_runs(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 3,
            skipped: 0
        }
    );
    assert_eq!(spans(&state, 0), vec![(0, 4, FileId(10), 0, 200)]);
    assert_eq!(spans(&state, 1), vec![(0, 0, FileId(10), 200, 100)]);
    let p0 = state.partition(&TOPIC, 0).unwrap();
    assert_eq!((p0.high_watermark, p0.log_start_offset), (5, 0));
    assert_eq!(state.files[&FileId(10)].live_batches, 2, "one per run");
    assert!(state.released.contains_key(&FileId(1)) && state.released.contains_key(&FileId(2)));

    let mut replay = state_for_replay();
    result(&mut replay, &both_runs(10)).unwrap();
    assert_eq!(
        serde_json::to_value(&replay).unwrap(),
        serde_json::to_value(&state).unwrap()
    );
    // Run entries leave like batches: retention past the run drops it and releases the output.
    state.apply(&Entry::AdvanceLogStart {
        topic_id: TOPIC,
        partitions: vec![LogStartMove {
            partition: 0,
            offset: 5,
        }],
        cause: LogStartCause::DeleteRecords,
    });
    assert_eq!(state.files[&FileId(10)].live_batches, 1);
}

#[test]
fn test_replace_runs_refuses_what_the_worker_did_not_read_and_changes_nothing() {
    let mut state = state();
    let before = serde_json::to_value(&state).unwrap();
    let refused = [
        // File 2 is not an input.
        replace_runs(10, &[1], vec![run(0, 0, 4, 0, 200, 2)]),
        // Not where entries start or end.
        replace_runs(10, &[1, 2], vec![run(0, 1, 4, 0, 200, 2)]),
        replace_runs(10, &[1, 2], vec![run(0, 0, 3, 0, 200, 2)]),
        // Another count or length than the index holds.
        replace_runs(10, &[1, 2], vec![run(0, 0, 4, 0, 200, 3)]),
        replace_runs(10, &[1, 2], vec![run(0, 0, 4, 0, 201, 2)]),
        // Overlapping runs.
        replace_runs(
            10,
            &[1, 2],
            vec![run(0, 0, 1, 0, 100, 1), run(0, 0, 4, 100, 200, 2)],
        ),
        // Beyond the high watermark.
        replace_runs(10, &[1, 2], vec![run(0, 5, 9, 0, 100, 1)]),
    ];
    for entry in refused {
        let err = result(&mut state, &entry).unwrap_err();
        assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
        assert_eq!(serde_json::to_value(&state).unwrap(), before);
    }
    let Entry::ReplaceFiles(mut mixed) = both_runs(10) else {
        unreachable!()
    };
    mixed.batches = vec![moved(0, 0, 1, 1, 8)];
    let err = result(&mut state, &Entry::ReplaceFiles(mixed)).unwrap_err();
    assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
    // A job run twice commits once.
    result(&mut state, &both_runs(10)).unwrap();
    let after = serde_json::to_value(&state).unwrap();
    let err = result(&mut state, &both_runs(11)).unwrap_err();
    assert!(matches!(err, ControlError::ReplaceConflict(_)), "{err}");
    assert_eq!(serde_json::to_value(&state).unwrap(), after);
}

#[test]
fn test_replace_runs_keep_what_retention_left_of_them() {
    // The log start inside the first batch: nothing left the index, the whole run moves.
    let mut state = state();
    let advance = |state: &mut State, offset| {
        state.apply(&Entry::AdvanceLogStart {
            topic_id: TOPIC,
            partitions: vec![LogStartMove {
                partition: 0,
                offset,
            }],
            cause: LogStartCause::DeleteRecords,
        });
    };
    advance(&mut state, 1);
    result(&mut state, &both_runs(10)).unwrap();
    assert_eq!(spans(&state, 0), vec![(0, 4, FileId(10), 0, 200)]);

    // The first batch gone: the entry starts at the second batch's bytes in the output.
    let mut state = self::state();
    advance(&mut state, 2);
    let outcome = result(&mut state, &both_runs(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 2,
            skipped: 1
        }
    );
    assert_eq!(spans(&state, 0), vec![(2, 4, FileId(10), 100, 100)]);
    assert!(state.released.contains_key(&FileId(1)));

    // The whole run gone.
    let mut state = self::state();
    advance(&mut state, 5);
    let outcome = result(&mut state, &both_runs(10)).unwrap();
    assert_eq!(
        outcome,
        ReplaceOutcome {
            replaced: 1,
            skipped: 2
        }
    );
    assert!(spans(&state, 0).is_empty());
    assert_eq!(state.files[&FileId(10)].live_batches, 1);
}

/// A swap of this build survives the log's encoding; a swap record from before runs (no
/// `inputs`, no `runs`) decodes to the per-batch form and applies as it did.
#[test]
fn test_replace_runs_encode_and_old_records_decode() {
    let entry = both_runs(10);
    let json = serde_json::to_string(&entry).unwrap();
    assert_eq!(serde_json::from_str::<Entry>(&json).unwrap(), entry);
    let old = r#"{"ReplaceFiles":{"job":7,"output":10,"tier":"regional","holders":[0],"size":4096,
        "batches":[{"topic_id":[64,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1],"partition":1,"base_offset":0,
        "last_offset":0,"from":1,"byte_offset":208,"len":100}]}}"#;
    let decoded: Entry = serde_json::from_str(old).unwrap();
    let Entry::ReplaceFiles(decoded) = decoded else {
        panic!("{decoded:?}")
    };
    assert!(decoded.runs.is_empty() && decoded.inputs.is_empty());
    let mut state = state();
    let outcome = result(&mut state, &Entry::ReplaceFiles(decoded)).unwrap();
    assert_eq!(outcome.replaced, 1);
    assert_eq!(spans(&state, 1), vec![(0, 0, FileId(10), 208, 100)]);
}
