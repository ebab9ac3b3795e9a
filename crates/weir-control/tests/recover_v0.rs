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

/// Copies the fixture into memory: GC must never touch the fixture directory.
async fn fixture_in_memory() -> Arc<object_store::memory::InMemory> {
    use object_store::{ObjectStoreExt, PutPayload};
    let memory = Arc::new(object_store::memory::InMemory::new());
    let root = fixture();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let key = path
                .strip_prefix(&root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let bytes = std::fs::read(&path).unwrap();
            memory
                .put(
                    &object_store::path::Path::from(key),
                    PutPayload::from(bytes),
                )
                .await
                .unwrap();
        }
    }
    memory
}

async fn keys_under(store: &Arc<object_store::memory::InMemory>, prefix: &str) -> Vec<u64> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let prefix = object_store::path::Path::from(prefix);
    let metas: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
    let mut seqs: Vec<u64> = metas
        .iter()
        .filter_map(|meta| weir_storage::keys::parse_seq_key(&meta.location))
        .collect();
    seqs.sort_unstable();
    seqs
}

/// What recovery must preserve: topics with their partitions (high watermarks, indexes,
/// producers), committed offsets, producer ids.
fn durable_facts(state: &weir_control::State) -> String {
    serde_json::to_string(&(
        &state.topics,
        &state.group_offsets,
        &state.producer_epochs,
        state.next_producer_id,
    ))
    .unwrap()
}

/// RFC 0003 §7 on a log from before log GC: its snapshot carries no fence list, so the first
/// GC reads the legacy slots below it and keeps the one opening an epoch (slot 0).
#[tokio::test]
async fn test_recovery_v0_then_gc_then_recover() {
    use weir_control::log::LogRecord;
    let store = fixture_in_memory().await;
    let objects_before = keys_under(&store, "meta").await.len();
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(512);
    let before = log.replay().await.unwrap().state;
    let recovered = log.recover("upgraded", "unused").await.unwrap();
    assert_eq!((recovered.epoch, recovered.next_seq), (3, 11));
    // The first NewEpoch with a clock starts the offsets' expiry clocks: compare topics here,
    // and everything against the state as this recovery left it.
    assert_eq!(
        serde_json::to_string(&recovered.state.topics).unwrap(),
        serde_json::to_string(&before.topics).unwrap()
    );

    // Slots 11-14 (empty: the state stays as the fixture left it), snapshots at 12 and 14.
    for seq in 11..=14u64 {
        let bytes = LogStore::encode_record(3, seq, &LogRecord::new(vec![])).unwrap();
        log.write_slot(seq, 3, bytes).await.unwrap();
        if seq == 12 || seq == 14 {
            let replayed = log.replay().await.unwrap();
            let written = log
                .write_snapshot(3, seq, &replayed.state, &replayed.fence)
                .await
                .unwrap();
            assert!(written.chunks > 1, "binary, in several chunks");
        }
    }
    let fence = log.replay().await.unwrap().fence;
    let report = log.collect_garbage(14, &fence).await.unwrap();
    assert_eq!(report.kept_snapshot, Some(12));
    assert_eq!(keys_under(&store, "meta/snapshot").await, [12, 14]);
    assert_eq!(report.snapshots, 1, "the fixture's JSON snapshot at 5");
    assert_eq!(
        keys_under(&store, "meta/log").await,
        [0, 6, 10, 13, 14],
        "the NewEpoch slots of epochs 1 (legacy, read back), 2 and 3 stay"
    );
    assert!(keys_under(&store, "meta").await.len() < objects_before);

    let again = LogStore::new(store.clone(), 1)
        .recover("again", "unused")
        .await
        .unwrap();
    assert_eq!(again.epoch, 4);
    assert_eq!(durable_facts(&again.state), durable_facts(&recovered.state));
    assert_eq!(again.state.cluster_id, before.cluster_id);
}
