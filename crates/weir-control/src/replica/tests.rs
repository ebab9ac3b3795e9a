use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::ObjectStore;

use super::*;
use crate::entry::Entry;
use crate::log::LogRecord;
use crate::plane::{ControlPlane, ControlPlaneSettings};

fn create(name: &str, id: u8) -> Entry {
    Entry::CreateTopic {
        name: name.into(),
        topic_id: weir_common::TopicId([id; 16]),
        partitions: 1,
        configs: BTreeMap::new(),
    }
}

fn json(state: &State) -> serde_json::Value {
    serde_json::to_value(state).unwrap()
}

/// A leader over an in-memory bucket, its log, and a replica replayed from it.
async fn leader_and_replica() -> (ControlPlane, LogStore, Replica) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let control = ControlPlane::open(store.clone(), ControlPlaneSettings::default(), 1)
        .await
        .unwrap();
    let log = LogStore::new(store, 1);
    let replica = Replica::new(log.replay().await.unwrap());
    (control, log, replica)
}

/// A leader that wrote `behind` slots (no snapshot), its log, and a replica of none of them.
async fn replica_behind_by(behind: usize) -> (ControlPlane, LogStore, Replica) {
    let (control, log, replica) = leader_and_replica().await;
    for i in 0..behind {
        control
            .create_topic(&format!("t{i}"), 1, BTreeMap::new(), i as u64 + 1)
            .await
            .unwrap();
    }
    (control, log, replica)
}

/// A leader that snapshots every `every` slots with log GC on, its log, and a replica.
async fn collecting_leader_and_replica(
    every: u64,
) -> (Arc<dyn ObjectStore>, ControlPlane, LogStore, Replica) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let settings = ControlPlaneSettings {
        snapshot_every_slots: every,
        log_gc: true,
        encode_snapshots_inline: true,
        ..ControlPlaneSettings::default()
    };
    let control = ControlPlane::open(store.clone(), settings, 1)
        .await
        .unwrap();
    let log = LogStore::new(store.clone(), 1);
    let replica = Replica::new(log.replay().await.unwrap());
    (store, control, log, replica)
}

/// A replica that catches up from the bucket holds what the leader's readers see, slot by slot.
#[tokio::test]
async fn test_replica_catches_up_to_what_the_leader_shows() {
    let (control, log, mut replica) = leader_and_replica().await;
    assert_eq!(json(&replica.state()), control.read(json));
    let topic = control
        .create_topic("t", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    for i in 0..5u128 {
        let previous = (i > 0).then_some(weir_common::FileId(i));
        let commit = crate::test_support::one_batch_commit(
            "agent".into(),
            previous,
            topic,
            weir_common::FileId(i + 1),
            vec![0],
            3,
        );
        control.submit(commit).await.unwrap();
    }
    let took = replica.catch_up(&log, None).await.unwrap();
    assert_eq!(took, 6, "the topic and five commits");
    assert_eq!(json(&replica.state()), control.read(json));
    let p = replica.state().topic("t").unwrap().partitions[0].clone();
    assert_eq!(
        (p.high_watermark, p.stable_high_watermark),
        (15, 15),
        "durable: visible"
    );
    assert_eq!(
        replica.catch_up(&log, None).await.unwrap(),
        0,
        "nothing new"
    );
}

/// Records from the stream apply in slot order only; dead records (a deposed writer's) count
/// as slots but change nothing; a resent record changes nothing.
#[test]
fn test_replica_offer_applies_in_order_and_skips_dead_records() {
    let mut replica = Replica::of_leader(Arc::default(), 3, 2, Default::default(), 0);
    let record = |name: &str, id| vec![create(name, id)];
    assert_eq!(
        replica.offer(4, 2, &record("early", 1)),
        Offered::Gap { next: 3 }
    );
    assert_eq!(replica.offer(2, 2, &record("old", 2)), Offered::Behind);
    assert_eq!(replica.offer(3, 1, &record("dead", 3)), Offered::Dead);
    assert_eq!(replica.offer(4, 2, &record("live", 4)), Offered::Applied);
    assert_eq!(replica.offer(5, 3, &record("next", 5)), Offered::Applied);
    assert_eq!(replica.offer(6, 2, &record("deposed", 6)), Offered::Dead);
    assert_eq!(replica.next_seq(), 7);
    assert_eq!(replica.log_epoch(), 3);
    let names: Vec<_> = replica.state().topics.keys().cloned().collect();
    assert_eq!(names, vec!["live".to_string(), "next".to_string()]);
}

/// A deposed writer's slots past a hole: a replica stops at the hole, and once the new writer
/// recovered it reads on exactly as a fresh replay does (CTL-2).
#[tokio::test]
async fn test_replica_never_passes_a_hole_and_agrees_with_replay_after_a_takeover() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let old = LogStore::new(store.clone(), 1);
    let a = old.recover("a", "cluster").await.unwrap();
    let mut replica = Replica::new(old.replay().await.unwrap());
    assert_eq!(replica.next_seq(), 1);
    // Epoch 1 wrote slots 2 and 4; 1 and 3 never landed (nothing past slot 0 was acked).
    for (seq, name) in [(2u64, "dead2"), (4, "dead4")] {
        let record = LogRecord::new(vec![create(name, seq as u8)]);
        let bytes = LogStore::encode_record(a.epoch, seq, &record).unwrap();
        old.write_slot(seq, a.epoch, bytes).await.unwrap();
    }
    assert_eq!(
        replica.catch_up(&old, None).await.unwrap(),
        0,
        "slot 1 is a hole"
    );
    assert!(replica.state().topic("dead2").is_none());
    let new = LogStore::new(store.clone(), 1);
    let b = new.recover("b", "cluster").await.unwrap();
    let record = LogRecord::new(vec![create("live", 9)]);
    let bytes = LogStore::encode_record(b.epoch, b.next_seq, &record).unwrap();
    new.write_slot(b.next_seq, b.epoch, bytes).await.unwrap();
    replica.catch_up(&new, None).await.unwrap();
    let fresh = LogStore::new(store, 1).replay().await.unwrap();
    assert_eq!(replica.next_seq(), fresh.gap);
    assert_eq!(json(&replica.state()), json(&fresh.state));
    assert!(replica.state().topic("live").is_some());
    assert!(replica.state().topic("dead2").is_none() && replica.state().topic("dead4").is_none());
}

/// A replica so far behind that log GC collected its next slot starts again from the snapshot.
#[tokio::test(start_paused = true)]
async fn test_replica_behind_collected_slots_restarts_from_the_snapshot() {
    let (store, control, log, mut replica) = collecting_leader_and_replica(2).await;
    let behind = replica.next_seq();
    for i in 0..12u8 {
        control
            .submit(create(&format!("t{i}"), i + 1))
            .await
            .unwrap();
    }
    // Snapshots are written in the background: wait until slot `behind` is gone.
    let gone = || async {
        object_store::ObjectStoreExt::head(store.as_ref(), &weir_storage::keys::meta_log(behind))
            .await
            .is_err()
    };
    for _ in 0..1000 {
        if gone().await {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(gone().await, "log GC collected slot {behind}");
    let durable = control.subscribe().borrow().to_owned();
    replica.catch_up(&log, Some(durable)).await.unwrap();
    assert!(
        replica.next_seq() > durable,
        "{} after {durable}",
        replica.next_seq()
    );
    assert_eq!(json(&replica.state()), control.read(json));
}

/// A replica far behind takes at most `MAX_CATCH_UP_SLOTS` slots per catch-up (a follower's
/// tick must end while its leader keeps writing), and the next catch-up goes on from there; a
/// bounded replay stops where it was asked to.
#[tokio::test]
async fn test_catch_up_reads_a_bounded_number_of_slots_per_call() {
    let behind = MAX_CATCH_UP_SLOTS + 40;
    let (control, log, mut replica) = replica_behind_by(behind).await;
    let first = replica.catch_up(&log, None).await.unwrap();
    assert_eq!(first, MAX_CATCH_UP_SLOTS as u64);
    let second = replica.catch_up(&log, None).await.unwrap();
    assert_eq!(first + second, behind as u64);
    assert_eq!(json(&replica.state()), control.read(json));
    let bounded = log.replay_until(Some(10)).await.unwrap();
    assert_eq!(bounded.gap, 10);
    assert_eq!(log.replay().await.unwrap().gap, replica.next_seq());
}

/// A replica whose restart begins at a snapshot past what it was asked to reach reads on past
/// the snapshot before anyone sees the snapshot's state: seed 724 planned a fetch from such a
/// state, 37 slots and more than the deleter's grace behind the log, naming a deleted file.
#[tokio::test(start_paused = true)]
async fn test_a_restart_reads_on_past_the_snapshot_it_begins_at() {
    let (store, control, log, mut replica) = collecting_leader_and_replica(4).await;
    let behind = replica.next_seq();
    let snapshots = || async {
        let listed = store
            .list_with_delimiter(Some(&"meta/snapshot".into()))
            .await;
        listed.map(|l| l.objects.len()).unwrap_or(0)
    };
    let mut i = 0u8;
    // Two snapshots (so log GC ran behind the newer), then slots past the newest one.
    while snapshots().await < 2 {
        i += 1;
        control.submit(create(&format!("t{i}"), i)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for _ in 0..2 {
        i += 1;
        control.submit(create(&format!("t{i}"), i)).await.unwrap();
    }
    let newest_snapshot = log.replay().await.unwrap().snapshot_seq.unwrap();
    let durable = control.subscribe().borrow().to_owned();
    assert!(durable > newest_snapshot, "slots past the newest snapshot");
    assert!(
        object_store::ObjectStoreExt::head(store.as_ref(), &weir_storage::keys::meta_log(behind))
            .await
            .is_err(),
        "log GC collected slot {behind}"
    );
    // Asked to reach only the slot it misses (as when the next slot it reads is a fence, or a
    // stream's record is older than the snapshot).
    replica.catch_up(&log, Some(behind)).await.unwrap();
    assert_eq!(replica.next_seq(), durable + 1);
    assert_eq!(json(&replica.state()), control.read(json));
}

/// A replica far behind a leader that wrote no snapshot past it reads on from where it is,
/// a bounded number of slots per call, even when told how far the leader is: a replay would
/// begin at slot 0 (or an older snapshot) and read again every slot the replica holds. CI
/// once saw a deposed leader, 4,000 slots behind on its S3 server, still replaying 76 s after
/// its buckets returned, its registration and heartbeats stalled behind it.
#[tokio::test]
async fn test_a_replica_behind_with_no_snapshot_past_it_reads_on_from_where_it_is() {
    let behind = MAX_CATCH_UP_SLOTS + 40;
    let (control, log, mut replica) = replica_behind_by(behind).await;
    let durable = control.subscribe().borrow().to_owned();
    let first = replica.catch_up(&log, Some(durable)).await.unwrap();
    assert_eq!(first, MAX_CATCH_UP_SLOTS as u64);
    let second = replica.catch_up(&log, Some(durable)).await.unwrap();
    assert_eq!(first + second, behind as u64);
    assert_eq!(replica.next_seq(), durable + 1);
    assert_eq!(json(&replica.state()), control.read(json));
}
