use std::collections::BTreeMap;

use weir_common::{FileId, TopicId};

use super::*;
use crate::entry::{BatchCommit, FileCommit};

const TOPIC: TopicId = TopicId([7; 16]);

/// A topic with one partition holding batches of (len, max_timestamp), one file each, all
/// durable.
fn state(configs: &[(&str, &str)], batches: &[(u32, i64)]) -> State {
    let mut state = State::default();
    state.apply(&Entry::CreateTopic {
        name: "t".into(),
        topic_id: TOPIC,
        partitions: 1,
        configs: configs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    });
    let mut previous = None;
    for (i, &(len, max_timestamp)) in batches.iter().enumerate() {
        let file_id = FileId(i as u128 + 1);
        state.apply(&Entry::CommitFile(FileCommit {
            agent: "a".into(),
            previous,
            file_id,
            size: u64::from(len),
            buckets: vec![0],
            batches: vec![BatchCommit {
                topic_id: TOPIC,
                partition: 0,
                byte_offset: 0,
                len,
                offset_span: 2,
                first_timestamp: max_timestamp,
                max_timestamp,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
            }],
        }));
        previous = Some(file_id);
    }
    state.mark_all_stable();
    state
}

fn starts(state: &State, now_ms: i64, defaults: RetentionDefaults) -> Vec<i64> {
    retention_entries(state, now_ms, defaults)
        .into_iter()
        .flat_map(|entry| match entry {
            Entry::AdvanceLogStart { partitions, .. } => partitions
                .into_iter()
                .map(|mv| mv.offset)
                .collect::<Vec<_>>(),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

const FOREVER: RetentionDefaults = RetentionDefaults { ms: -1, bytes: -1 };

#[test]
fn test_retention_by_time_drops_a_prefix_by_running_maximum() {
    // Batch offsets 0,2,4,6; max timestamps 100, 900, 200, 1000.
    let state = state(
        &[("retention.ms", "500")],
        &[(10, 100), (10, 900), (10, 200), (10, 1000)],
    );
    // Cutoff 400: batch 0 (100) goes; batch 1 (900) reaches it, so batch 2 (200) stays too.
    assert_eq!(starts(&state, 900, FOREVER), vec![2]);
    // Cutoff 950: the running maximum first reaches it at the last batch.
    assert_eq!(starts(&state, 1450, FOREVER), vec![6]);
    // Everything older: the start moves to the high watermark.
    assert_eq!(starts(&state, 5000, FOREVER), vec![8]);
    // Nothing old enough: no entry.
    assert!(starts(&state, 100, FOREVER).is_empty());
}

#[test]
fn test_retention_by_bytes_keeps_at_least_the_limit() {
    let state = state(
        &[("retention.bytes", "25")],
        &[(10, 0), (10, 0), (10, 0), (10, 0)],
    );
    // 40 bytes: dropping one leaves 30 ≥ 25, dropping two would leave 20 < 25.
    assert_eq!(starts(&state, 0, FOREVER), vec![2]);
    let exact = state_with(&[("retention.bytes", "20")]);
    assert_eq!(starts(&exact, 0, FOREVER), vec![4]);
}

fn state_with(configs: &[(&str, &str)]) -> State {
    state(configs, &[(10, 0), (10, 0), (10, 0), (10, 0)])
}

#[test]
fn test_retention_defaults_overrides_and_forever() {
    let old = [(10, 0), (10, 0)];
    // Broker default applies to a topic without its own limit.
    let by_default = state(&[], &old);
    let defaults = RetentionDefaults { ms: 10, bytes: -1 };
    assert_eq!(starts(&by_default, 1_000, defaults), vec![4]);
    // A topic's -1 overrides the broker default.
    let forever = state(&[("retention.ms", "-1")], &old);
    assert!(starts(&forever, 1_000, defaults).is_empty());
    // Kafka's defaults keep a week.
    assert!(starts(&by_default, 1_000, RetentionDefaults::default()).is_empty());
}

#[test]
fn test_retention_never_passes_the_durable_high_watermark_or_goes_back() {
    let mut state = state(&[("retention.ms", "0")], &[(10, 0), (10, 0)]);
    // The last batch is assigned but not durable yet.
    for partition in state
        .topics
        .values_mut()
        .flat_map(|t| t.partitions.iter_mut())
    {
        partition.stable_high_watermark = 2;
    }
    assert_eq!(starts(&state, 1_000, FOREVER), vec![2]);
    for entry in retention_entries(&state, 1_000, FOREVER) {
        state.apply(&entry);
    }
    // At the start already: nothing to do.
    assert!(starts(&state, 1_000, FOREVER).is_empty());
}

#[test]
fn test_retention_skips_compacted_topics_as_kafka_does() {
    let old = [(10, 0), (10, 0)];
    let compacted = state(
        &[("cleanup.policy", "compact"), ("retention.ms", "0")],
        &old,
    );
    assert!(starts(&compacted, 1_000, FOREVER).is_empty());
    let both = state(
        &[("cleanup.policy", "compact,delete"), ("retention.ms", "0")],
        &old,
    );
    assert_eq!(starts(&both, 1_000, FOREVER), vec![4]);
}
