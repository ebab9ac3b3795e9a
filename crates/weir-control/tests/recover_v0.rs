//! Today's on-disk metadata still recovers (issue 11, RFC 0003 build step 1).
//!
//! `fixtures/v0-2026-12-01/meta/` is a metadata log written by `weir agent` as built from `main`
//! on 2026-12-01 at the end of issue 10 (before any bounded-state change), with real clients
//! (confluent-kafka):
//! - first run: topics `orders` (3 partitions, `retention.ms=3600000`) and `stamped`
//!   (`message.timestamp.type=LogAppendTime`); an idempotent producer wrote 30 records to
//!   `orders` (10 per partition) and 5 to `stamped`; group `g1` committed orders/0=7,
//!   orders/1=4, stamped/0=5; a graceful stop wrote the shutdown snapshot at slot 5;
//! - second run: topic `late` (2 partitions); another idempotent producer wrote 10 records to
//!   orders/0 and 4 to late/1; then `kill -9` (no snapshot: slots 6–9 follow the snapshot).
//!
//! Every later change to log entries, snapshots or the state must keep this test passing
//! (versioned entries, serde defaults). Never regenerate the fixture to make it pass.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use weir_control::log::LogStore;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0-2026-12-01")
}

#[tokio::test]
async fn test_recovery_reads_the_v0_format() {
    // Replay only reads: the fixture directory is never written.
    let store = Arc::new(LocalFileSystem::new_with_prefix(fixture()).unwrap());
    let replayed = LogStore::new(store, 1).replay().await.unwrap();
    assert_eq!(replayed.snapshot_seq, Some(5));
    assert_eq!(replayed.replayed, 4, "slots 6-9 after the snapshot");
    assert_eq!(replayed.gap, 10);
    assert_eq!(replayed.dead, 0);
    assert_eq!(replayed.log_epoch, 2);

    let state = &replayed.state;
    let topics: Vec<&str> = state.topics.keys().map(String::as_str).collect();
    assert_eq!(topics, ["late", "orders", "stamped"]);
    let hw = |topic: &str| -> Vec<i64> {
        state.topics[topic]
            .partitions
            .iter()
            .map(|p| p.high_watermark)
            .collect()
    };
    assert_eq!(hw("orders"), [20, 10, 10]);
    assert_eq!(hw("stamped"), [5]);
    assert_eq!(hw("late"), [0, 4]);
    for topic in state.topics.values() {
        for p in &topic.partitions {
            assert_eq!(p.log_start_offset, 0);
            assert_eq!(p.stable_high_watermark, p.high_watermark);
            // Every batch's file is known, and the index covers [0, HW) without gaps.
            let mut next = 0;
            for entry in &p.index {
                assert_eq!(entry.base_offset, next, "{} index gap", topic.name);
                assert!(state.files.contains_key(&entry.file_id));
                next = entry.last_offset + 1;
            }
            assert_eq!(next, p.high_watermark);
        }
    }
    assert_eq!(
        state.topics["orders"]
            .configs
            .get("retention.ms")
            .map(String::as_str),
        Some("3600000")
    );
    assert_eq!(
        state.topics["stamped"]
            .configs
            .get("message.timestamp.type")
            .map(String::as_str),
        Some("LogAppendTime")
    );
    // Two idempotent producers, each known on the partitions it wrote.
    assert_eq!(state.producer_epochs.len(), 2);
    assert!(state.topics["orders"].partitions[0].producers.len() == 2);
    assert!(state.topics["late"].partitions[1].producers.len() == 1);
    let g1 = &state.group_offsets["g1"];
    let committed = |topic: &str, p: i32| g1[topic][&p].offset;
    assert_eq!(committed("orders", 0), 7);
    assert_eq!(committed("orders", 1), 4);
    assert_eq!(committed("stamped", 0), 5);
}
