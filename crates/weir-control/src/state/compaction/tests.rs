use std::collections::BTreeMap;

use weir_common::{FileId, Tier, TopicId};

use crate::entry::{
    BatchCommit, Entry, EntryResult, FileCommit, FileReplace, LogStartCause, LogStartMove,
    ReplaceOutcome, ReplacedBatch,
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
    let entries: Vec<_> = p0
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
        .collect();
    assert_eq!(
        entries,
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
