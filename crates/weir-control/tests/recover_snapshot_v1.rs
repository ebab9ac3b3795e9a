//! The first binary snapshot format still recovers (RFC 0003 §8, build step 9).
//!
//! `fixtures/snapshot-v1-2026-12-01/meta/` was written once, on 2026-12-01, by the build that
//! introduced binary snapshots, through the public API with 1 KiB chunks: a recovery (epoch 1,
//! `NewEpoch` at slot 0), then slot 1 holding topics `events` (2 partitions,
//! `retention.ms=3600000`) and `audit` (1 partition, `retention.bytes=1048576`), an idempotent
//! producer writing 25 batches of 1–7 records to events/0 in each of files 3–11 (one batch to
//! audit/0 each), files 0–2 with one batch to events/1 each, log starts moved to events/0 = 3
//! (two batches go) and events/1 = 12 (releasing files 0–2), a committed offset and a sweep
//! horizon; then the snapshot after slot 1: a manifest and 5 chunks.
//!
//! Every later change to the snapshot format must keep this test passing (a new format version
//! reads the old one). Never regenerate the fixture to make it pass.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::{ObjectStoreExt, PutPayload};
use weir_control::log::LogStore;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshot-v1-2026-12-01")
}

/// The fixture's log slots and epoch, without the snapshot: what replay from slot 0 reads.
async fn log_only() -> Arc<InMemory> {
    let memory = Arc::new(InMemory::new());
    for key in [
        "meta/epoch/00000000000000000001",
        "meta/log/00000000000000000000",
        "meta/log/00000000000000000001",
    ] {
        let bytes = std::fs::read(fixture().join(key)).unwrap();
        memory
            .put(&key.into(), PutPayload::from(bytes))
            .await
            .unwrap();
    }
    memory
}

#[tokio::test]
async fn test_recovery_reads_the_first_binary_snapshot_format() {
    // Replay only reads: the fixture directory is never written.
    let store = Arc::new(LocalFileSystem::new_with_prefix(fixture()).unwrap());
    let replayed = LogStore::new(store, 1).replay().await.unwrap();
    assert_eq!(replayed.snapshot_seq, Some(1));
    assert_eq!(
        (replayed.replayed, replayed.gap, replayed.log_epoch),
        (0, 2, 1)
    );
    assert_eq!(replayed.fence.slots().collect::<Vec<_>>(), [0]);

    let state = &replayed.state;
    assert_eq!(state.cluster_id, "fixture-cluster");
    let partition = |topic: &str, p: usize| &state.topics[topic].partitions[p];
    let facts = |topic: &str, p: usize| {
        let partition = partition(topic, p);
        (
            partition.log_start_offset,
            partition.high_watermark,
            partition.index.len(),
        )
    };
    assert_eq!(facts("events", 0), (3, 846, 9 * 25 - 2));
    assert_eq!(facts("events", 1), (12, 12, 0));
    assert_eq!(facts("audit", 0), (0, 9, 9));
    assert_eq!((state.files.len(), state.released.len()), (9, 3));
    assert_eq!(partition("events", 0).producers.len(), 1);
    assert_eq!(
        state
            .committed_offset("fixture-group", "events", 0)
            .unwrap()
            .offset,
        42
    );
    assert_eq!(state.topics["audit"].configs["retention.bytes"], "1048576");

    // The snapshot holds exactly what replaying the log from slot 0 gives.
    let from_log = LogStore::new(log_only().await, 1).replay().await.unwrap();
    assert_eq!(from_log.snapshot_seq, None);
    assert_eq!(
        serde_json::to_string(&from_log.state).unwrap(),
        serde_json::to_string(state).unwrap()
    );
}
