//! The writer's snapshot triggers and log GC, and the stalled-writer fence (RFC 0003 §7, §8).

use std::collections::{BTreeMap, BTreeSet};

use object_store::memory::InMemory;
use weir_storage::keys;

use super::*;
use crate::log::test_store::{chunk_keys, snapshot_at, write_entries, HoldStore};

async fn seqs(store: &Arc<InMemory>, prefix: object_store::path::Path) -> Vec<u64> {
    use futures::TryStreamExt;
    let metas: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
    let mut seqs: Vec<u64> = metas
        .iter()
        .filter_map(|meta| keys::parse_seq_key(&meta.location))
        .collect();
    seqs.sort_unstable();
    seqs
}

/// Lets spawned snapshot jobs run until `done` holds (paused time advances while idle).
async fn until<F: std::future::Future<Output = bool>>(mut done: impl FnMut() -> F) {
    for _ in 0..1000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never held");
}

/// Triggers only by time (or by bytes when `max_log_bytes` is small).
fn quiet_settings(max_log_bytes: u64) -> ControlPlaneSettings {
    ControlPlaneSettings {
        snapshot_every_slots: 1_000_000,
        snapshot_max_log_bytes: max_log_bytes,
        snapshot_max_interval: Duration::from_secs(600),
        encode_snapshots_inline: true,
        ..ControlPlaneSettings::default()
    }
}

#[tokio::test(start_paused = true)]
async fn test_plane_snapshots_after_the_interval_with_a_slot_since() {
    let memory = Arc::new(InMemory::new());
    let plane = ControlPlane::open(memory.clone(), quiet_settings(u64::MAX), 1)
        .await
        .unwrap();
    plane
        .create_topic("a", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(seqs(&memory, keys::meta_snapshot_prefix()).await.is_empty());
    // Ten quiet minutes alone write nothing; the first slot after them snapshots.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(seqs(&memory, keys::meta_snapshot_prefix()).await.is_empty());
    plane
        .create_topic("b", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    until(|| async { seqs(&memory, keys::meta_snapshot_prefix()).await == [2] }).await;
}

#[tokio::test(start_paused = true)]
async fn test_plane_snapshots_after_max_log_bytes() {
    let memory = Arc::new(InMemory::new());
    let slot = Entry::CreateTopic {
        name: "a".into(),
        topic_id: TopicId([1; 16]),
        partitions: 1,
        configs: BTreeMap::new(),
    };
    let slot_bytes = LogStore::encode_record(1, 1, &LogRecord::new(vec![slot]))
        .unwrap()
        .len() as u64;
    // Two one-topic slots stay below the limit; the third reaches it.
    let plane = ControlPlane::open(memory.clone(), quiet_settings(3 * slot_bytes), 1)
        .await
        .unwrap();
    for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
        assert!(seqs(&memory, keys::meta_snapshot_prefix()).await.is_empty());
        plane
            .create_topic(name, 1, BTreeMap::new(), n as u64)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until(|| async { seqs(&memory, keys::meta_snapshot_prefix()).await == [3] }).await;
}

#[tokio::test(start_paused = true)]
async fn test_plane_collects_the_log_behind_its_snapshots_and_recovers_the_same_state() {
    let memory = Arc::new(InMemory::new());
    let settings = ControlPlaneSettings {
        snapshot_every_slots: 2,
        log_gc: true,
        encode_snapshots_inline: true,
        snapshot_chunk_bytes: 64,
        ..ControlPlaneSettings::default()
    };
    let plane = ControlPlane::open(memory.clone(), settings.clone(), 1)
        .await
        .unwrap();
    for n in 0..12u64 {
        let name = format!("t{n}");
        plane
            .create_topic(&name, 1, BTreeMap::new(), n)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Slots 0..=12; below the older kept snapshot only the NewEpoch slot 0 stays.
    until(|| async {
        let snapshots = seqs(&memory, keys::meta_snapshot_prefix()).await;
        let slots = seqs(&memory, keys::meta_log_prefix()).await;
        let chunks: BTreeSet<u64> = chunk_keys(&memory).await.iter().map(|k| k.0).collect();
        snapshots.len() == 2
            && slots.first() == Some(&0)
            && slots.get(1) == Some(&(snapshots[0] + 1))
            && chunks.into_iter().collect::<Vec<_>>() == snapshots
    })
    .await;
    let before = plane.read(|state| state.topics.keys().cloned().collect::<Vec<_>>());
    plane.shutdown().await;
    let reopened = ControlPlane::open(memory.clone(), settings, 2)
        .await
        .unwrap();
    let after = reopened.read(|state| state.topics.keys().cloned().collect::<Vec<_>>());
    assert_eq!(after, before);
    assert_eq!(after.len(), 12);
}

/// RFC 0003 §7, the stalled writer: writer `A`'s PUT of slot 1 is held on the wire while `B`
/// takes over (its `NewEpoch` lands at slot 1), writes, snapshots twice and runs log GC, which
/// deletes slots up to the older snapshot. Released, `A`'s create of slot 1 must find `B`'s
/// fence slot there and fail: `A` must not acknowledge the entry, which no replay reads.
#[tokio::test]
async fn test_plane_stalled_writer_never_acknowledges_after_a_takeover_and_gc() {
    let memory = Arc::new(InMemory::new());
    let store = Arc::new(HoldStore::new(memory.clone(), None));
    let held = store.hold(keys::meta_log(1));
    let a = ControlPlane::open(store.clone(), ControlPlaneSettings::default(), 1)
        .await
        .unwrap();
    let stalled = a.clone();
    let acked =
        tokio::spawn(async move { stalled.create_topic("lost", 1, BTreeMap::new(), 9).await });
    held.arrived.await.unwrap();

    let b = LogStore::new(memory.clone(), 1);
    let taken = b.recover("b", "cluster").await.unwrap();
    assert_eq!(
        (taken.epoch, taken.next_seq),
        (2, 2),
        "B's NewEpoch is slot 1"
    );
    let mut fence = taken.fence;
    for seq in 2..=5u64 {
        let topic = Entry::CreateTopic {
            name: format!("b{seq}"),
            topic_id: TopicId([seq as u8; 16]),
            partitions: 1,
            configs: BTreeMap::new(),
        };
        write_entries(&b, 2, seq, vec![topic]).await;
        if seq == 3 || seq == 5 {
            fence = snapshot_at(&b, seq).await;
        }
    }
    let report = b.collect_garbage(5, &fence).await.unwrap();
    assert_eq!(report.kept_snapshot, Some(3));

    held.release.send(()).unwrap();
    let answer = acked.await.unwrap();
    assert!(
        answer.is_err(),
        "A acknowledged a slot B's log does not hold: {answer:?}"
    );
    assert_eq!(
        seqs(&memory, keys::meta_log_prefix()).await[..4],
        [0, 1, 4, 5],
        "slots 2 and 3 collected; the NewEpoch slots 0 and 1 are fences"
    );
    let replayed = LogStore::new(memory.clone(), 1).replay().await.unwrap();
    assert!(replayed.state.topic("lost").is_none());
    assert!(replayed.state.topic("b5").is_some());
}
