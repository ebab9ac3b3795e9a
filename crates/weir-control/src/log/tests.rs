use std::collections::BTreeMap;

use object_store::memory::InMemory;
use weir_common::TopicId;

use super::test_store::HoldStore as RaceStore;
use super::*;

pub(super) fn create(name: &str, id: u8) -> Entry {
    let mut bytes = [0x40u8; 16];
    bytes[15] = id;
    Entry::CreateTopic {
        name: name.into(),
        topic_id: TopicId(bytes),
        partitions: 1,
        configs: BTreeMap::new(),
    }
}

#[tokio::test]
async fn test_log_deposed_writer_loses_its_next_slot() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let first = LogStore::new(store.clone(), 1);
    let a = first.recover("a", "cluster").await.unwrap();
    assert_eq!((a.epoch, a.next_seq), (1, 1));
    let second = LogStore::new(store.clone(), 1);
    let b = second.recover("b", "cluster").await.unwrap();
    assert_eq!((b.epoch, b.next_seq), (2, 2));
    let record = LogRecord::new(vec![create("late", 1)]);
    let err = first
        .write_slot(
            1,
            a.epoch,
            LogStore::encode_record(a.epoch, 1, &record).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        LogError::SlotLost {
            seq: 1,
            found_epoch: 2,
            our_epoch: 1
        }
    ));
}

#[tokio::test]
async fn test_log_write_is_idempotent_for_identical_bytes() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log = LogStore::new(store, 1);
    let bytes = LogStore::encode_record(1, 5, &LogRecord::new(vec![])).unwrap();
    log.write_slot(5, 1, bytes.clone()).await.unwrap();
    log.write_slot(5, 1, bytes).await.unwrap();
}

#[tokio::test]
async fn test_log_replay_skips_dead_slots_of_a_deposed_writer() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let old = LogStore::new(store.clone(), 1);
    let a = old.recover("a", "cluster").await.unwrap();
    // Epoch 1 wrote slots 2 and 4, but slot 1 and 3 never landed: nothing past slot 0 was acked.
    for (seq, name) in [(2u64, "dead2"), (4, "dead4")] {
        let record = LogRecord::new(vec![create(name, seq as u8)]);
        old.write_slot(
            seq,
            a.epoch,
            LogStore::encode_record(a.epoch, seq, &record).unwrap(),
        )
        .await
        .unwrap();
    }
    let new = LogStore::new(store.clone(), 1);
    let b = new.recover("b", "cluster").await.unwrap();
    assert_eq!(b.next_seq, 5, "continues after the last dead slot");
    let record = LogRecord::new(vec![create("live", 9)]);
    new.write_slot(
        5,
        b.epoch,
        LogStore::encode_record(b.epoch, 5, &record).unwrap(),
    )
    .await
    .unwrap();
    let third = LogStore::new(store, 1)
        .recover("c", "cluster")
        .await
        .unwrap();
    assert!(third.state.topic("live").is_some());
    assert!(third.state.topic("dead2").is_none());
    assert!(third.state.topic("dead4").is_none());
    assert_eq!(third.state.cluster_id, "cluster");
}

fn record_bytes(epoch: u64, seq: u64, entries: Vec<Entry>) -> Bytes {
    LogStore::encode_record(epoch, seq, &LogRecord::new(entries)).unwrap()
}

fn new_epoch(epoch: u64) -> Entry {
    Entry::NewEpoch {
        epoch,
        cluster_id: "cluster".into(),
        at_ms: 0,
    }
}

/// Issue 9 §4.1: A claims epoch 1; B claims 2 and writes its NewEpoch (and a topic) first; A's
/// replay then passes B's records. Writing NewEpoch(1) after them would make every slot of A
/// dead to later replays while A serves: A must fail and claim again instead.
#[tokio::test]
async fn test_log_recover_fails_when_a_later_epoch_wrote_first() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = LogStore::new(store.clone(), 1);
    let claimed = a.claim_epoch("a", None).await.unwrap();
    let b = LogStore::new(store.clone(), 1);
    let b_recovered = b.recover("b", "cluster").await.unwrap();
    assert_eq!((claimed, b_recovered.epoch), (1, 2));
    b.write_slot(1, 2, record_bytes(2, 1, vec![create("b-topic", 1)]))
        .await
        .unwrap();
    let err = a.take_over(claimed, "cluster").await.unwrap_err();
    assert!(matches!(err, LogError::EpochTaken(1)), "{err:?}");
    assert!(
        a.read_record(2).await.unwrap().is_none(),
        "the overtaken writer wrote nothing"
    );
    // Claiming again puts A above B, and everything B wrote is kept.
    let again = a.recover("a", "cluster").await.unwrap();
    assert_eq!((again.epoch, again.next_seq), (3, 3));
    assert!(again.state.topic("b-topic").is_some());
}

/// A higher epoch wins the slot our NewEpoch goes to (it replayed before our record landed):
/// recovery fails (the caller claims again) instead of serving behind it.
#[tokio::test]
async fn test_log_recover_fails_when_a_higher_epoch_wins_the_new_epoch_slot() {
    let inner = Arc::new(InMemory::new());
    let race = RaceStore::new(inner.clone(), None);
    // Epoch 2 will have been claimed by the other writer, and its NewEpoch lands first.
    inner
        .put(&keys::meta_epoch(2), PutPayload::from_static(b"other"))
        .await
        .unwrap();
    race.race(keys::meta_log(0), record_bytes(2, 0, vec![new_epoch(2)]));
    let store: Arc<dyn ObjectStore> = Arc::new(race);
    let log = LogStore::new(store.clone(), 1);
    let err = log.take_over(1, "cluster").await.unwrap_err();
    assert!(
        matches!(
            err,
            LogError::SlotLost {
                seq: 0,
                found_epoch: 2,
                our_epoch: 1
            }
        ),
        "{err:?}"
    );
    let again = log.recover("a", "cluster").await.unwrap();
    assert_eq!((again.epoch, again.next_seq), (3, 2));
}

/// A log whose epoch-1 writer was deposed after its `NewEpoch` (slot 0) leaving slot 3 (a
/// topic `dead`); slots 1 and 2 never landed.
async fn deposed_writer_left_slot_3() -> Arc<InMemory> {
    let inner = Arc::new(InMemory::new());
    let setup = LogStore::new(inner.clone(), 1);
    assert_eq!(setup.recover("old", "cluster").await.unwrap().epoch, 1);
    setup
        .write_slot(3, 1, record_bytes(1, 3, vec![create("dead", 3)]))
        .await
        .unwrap();
    inner
}

/// While recovery fills holes among a deposed writer's dead slots, a slot it fills is taken:
/// by the deposed writer (a late write, harmless) it carries on; by a later epoch it has been
/// overtaken and must fail instead of serving.
#[tokio::test]
async fn test_log_slot_lost_while_filling_holes() {
    for (found_epoch, overtaken) in [(1u64, false), (3, true)] {
        let inner = deposed_writer_left_slot_3().await;
        let race = RaceStore::new(
            inner.clone(),
            Some((keys::meta_log(2), record_bytes(found_epoch, 2, vec![]))),
        );
        let log = LogStore::new(Arc::new(race), 1);
        let result = log.recover("new", "cluster").await;
        if overtaken {
            let err = result.unwrap_err();
            assert!(matches!(err, LogError::EpochTaken(2)), "{err:?}");
        } else {
            let recovered = result.unwrap();
            assert_eq!((recovered.epoch, recovered.next_seq), (2, 4));
            assert!(recovered.state.topic("dead").is_none());
        }
    }
}

/// A hole recovery fills is taken meanwhile by bytes this build cannot decode (perhaps a later
/// writer's record in a newer format): recovery fails, instead of reading them as epoch 0, a
/// deposed writer's dead slot, and serving past them.
#[tokio::test]
async fn test_log_an_undecodable_record_in_a_hole_being_filled_fails_recovery() {
    let inner = deposed_writer_left_slot_3().await;
    let race = RaceStore::new(
        inner.clone(),
        Some((keys::meta_log(2), Bytes::from_static(b"a newer format"))),
    );
    let log = LogStore::new(Arc::new(race), 1);
    let err = log.recover("new", "cluster").await.unwrap_err();
    assert!(matches!(err, LogError::CorruptSlot { .. }), "{err:?}");
}

/// An empty pre-warmed object that recovery listed among a deposed writer's slots may hold a
/// later writer's record by the time recovery gets to it (that writer's replay passed our
/// fillers and took the object over for its `NewEpoch`): recovery is overtaken and must fail,
/// not skip the record as dead and serve as a deposed writer. weir-sim found this with slots
/// read concurrently (seeds 583 and 874: an acknowledged slot lost).
#[tokio::test]
async fn test_log_a_listed_empty_slot_a_later_writer_filled_overtakes_recovery() {
    let inner = Arc::new(InMemory::new());
    let setup = LogStore::new(inner.clone(), 1);
    assert_eq!(setup.recover("old", "cluster").await.unwrap().epoch, 1);
    // The epoch-1 writer pre-warmed slot 3 and never wrote it; slots 1 and 2 never landed.
    inner
        .put(&keys::meta_log(3), PutPayload::default())
        .await
        .unwrap();
    let race = Arc::new(RaceStore::new(inner.clone(), None));
    // Once the epoch-2 writer's filler of hole 2 lands, an epoch-3 writer whose replay passed
    // it (and stopped at the empty slot 3) writes its record into slot 3.
    race.race_elsewhere(
        keys::meta_log(2),
        keys::meta_log(3),
        record_bytes(3, 3, vec![]),
    );
    let log = LogStore::new(race.clone() as Arc<dyn ObjectStore>, 1);
    let err = log.recover("new", "cluster").await.unwrap_err();
    assert!(matches!(err, LogError::EpochTaken(2)), "{err:?}");
}

/// Replay starts from the newest snapshot: the log slots it covers are not read at all (they
/// are deleted here), and the state is still complete.
#[tokio::test]
async fn test_log_replay_starts_from_the_newest_snapshot() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    let recovered = log.recover("a", "cluster").await.unwrap();
    let mut state = recovered.state;
    for seq in 1..=4u64 {
        let entries = vec![create(&format!("t{seq}"), seq as u8)];
        for entry in &entries {
            state.apply(entry);
        }
        log.write_slot(seq, 1, record_bytes(1, seq, entries))
            .await
            .unwrap();
        if seq == 3 {
            log.write_snapshot(1, 3, &state, &FenceSlots::default())
                .await
                .unwrap();
        }
    }
    for seq in 0..=3u64 {
        store.delete(&keys::meta_log(seq)).await.unwrap();
    }
    let replayed = log.replay().await.unwrap();
    assert_eq!(replayed.snapshot_seq, Some(3));
    assert_eq!((replayed.replayed, replayed.gap), (1, 5));
    for seq in 1..=4 {
        assert!(replayed.state.topic(&format!("t{seq}")).is_some(), "t{seq}");
    }
    assert!(
        replayed.state.topic_by_id(&TopicId([0x40; 16])).is_none(),
        "lookup tables were rebuilt from the snapshot"
    );
    assert!(replayed
        .state
        .topic_by_id(&{
            let mut id = [0x40u8; 16];
            id[15] = 2;
            TopicId(id)
        })
        .is_some());
}

/// A newest snapshot that cannot be used (garbage, or an envelope whose kind or slot does not
/// match its key) is skipped: replay falls back to the previous snapshot and the log after it.
#[tokio::test]
async fn test_log_replay_falls_back_past_an_unusable_newest_snapshot() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    let mut state = log.recover("a", "cluster").await.unwrap().state;
    for seq in 1..=3u64 {
        let entries = vec![create(&format!("t{seq}"), seq as u8)];
        for entry in &entries {
            state.apply(entry);
        }
        log.write_slot(seq, 1, record_bytes(1, seq, entries))
            .await
            .unwrap();
        if seq == 1 {
            log.write_snapshot(1, 1, &state, &FenceSlots::default())
                .await
                .unwrap();
        }
    }
    // A valid binary snapshot of slot 2, whose manifest is then copied under key 3.
    log.write_snapshot(1, 2, &state, &FenceSlots::default())
        .await
        .unwrap();
    let manifest_of_2 = log.get(&keys::meta_snapshot(2)).await.unwrap().unwrap();
    store.delete(&keys::meta_snapshot(2)).await.unwrap();
    let newest_versions = [
        Bytes::from_static(b"not a snapshot"),
        // Valid snapshot envelopes of another slot stored under key 3.
        snapshot::encode_json_snapshot(1, 2, &state, &FenceSlots::default()),
        manifest_of_2,
        // A log record stored under a snapshot key.
        record_bytes(1, 3, vec![]),
    ];
    for bytes in newest_versions {
        store
            .put(&keys::meta_snapshot(3), bytes.into())
            .await
            .unwrap();
        let replayed = log.replay().await.unwrap();
        assert_eq!(replayed.snapshot_seq, Some(1), "fell back to snapshot 1");
        assert_eq!(replayed.replayed, 2);
        assert!(replayed.state.topic("t3").is_some());
    }
}

/// A log slot that does not decode stops recovery with an error naming the object and what the
/// operator can do; it is never skipped silently.
#[tokio::test]
async fn test_log_recover_refuses_a_corrupt_slot_with_an_operator_message() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    log.recover("a", "cluster").await.unwrap();
    log.write_slot(1, 1, record_bytes(1, 1, vec![create("kept", 1)]))
        .await
        .unwrap();
    let corrupt = [
        Bytes::from_static(b"garbage"),
        // A valid record envelope of another slot.
        record_bytes(1, 7, vec![]),
    ];
    for bytes in corrupt {
        let seq = 2;
        store
            .put(&keys::meta_log(seq), PutPayload::from(bytes))
            .await
            .unwrap();
        let err = LogStore::new(store.clone(), 1)
            .recover("b", "cluster")
            .await
            .unwrap_err();
        assert!(matches!(err, LogError::CorruptSlot { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(&keys::meta_log(seq).to_string()),
            "{message}"
        );
        assert!(message.contains("restore"), "{message}");
        store.delete(&keys::meta_log(seq)).await.unwrap();
    }
}

/// A record from a newer Weir stops recovery with a message naming the version, whether its
/// entries parse here or not; a record without a version (today's format before versions) and
/// one of this build's version replay.
#[tokio::test]
async fn test_log_record_versions_old_current_and_newer() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    log.recover("a", "cluster").await.unwrap();
    let unversioned = br#"{"entries":[{"DeleteGroup":{"group":"g"}}]}"#;
    // Version 2 (before the registry, RFC 0002): its CommitOffsets carry no coordinator.
    let v2 = br#"{"v":2,"entries":[{"CommitOffsets":{"group":"g","offsets":[],"at_ms":0}}]}"#;
    // Version 3 (before the fenced deletes): DeleteGroup carries no coordinator.
    let v3 = br#"{"v":3,"entries":[{"DeleteGroup":{"group":"g"}}]}"#;
    let current = serde_json::to_vec(&LogRecord::new(vec![create("kept", 1)])).unwrap();
    assert!(String::from_utf8_lossy(&current).contains(r#""v":4"#));
    for (seq, payload) in [
        (1, &unversioned[..]),
        (2, &v2[..]),
        (3, &v3[..]),
        (4, &current[..]),
    ] {
        let bytes = encode_envelope(EnvelopeKind::LogEntry, 1, seq, payload).unwrap();
        log.write_slot(seq, 1, bytes).await.unwrap();
    }
    let replayed = LogStore::new(store.clone(), 1).replay().await.unwrap();
    assert!(replayed.state.topic("kept").is_some());
    let newer = [
        br#"{"v":6,"entries":[{"DeleteGroup":{"group":"g"}}]}"#.to_vec(),
        br#"{"v":6,"entries":[{"FutureEntry":{"x":1}}]}"#.to_vec(),
    ];
    for payload in newer {
        let bytes = encode_envelope(EnvelopeKind::LogEntry, 1, 5, &payload).unwrap();
        store
            .put(&keys::meta_log(5), PutPayload::from(bytes))
            .await
            .unwrap();
        let err = LogStore::new(store.clone(), 1).replay().await.unwrap_err();
        assert!(
            matches!(err, LogError::NewerFormat { version: 6, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("newer Weir"), "{err}");
    }
}

/// Losing the epoch claim itself (another writer claimed the same number first).
#[tokio::test]
async fn test_log_claim_epoch_fails_when_the_epoch_is_taken() {
    let inner = Arc::new(InMemory::new());
    let race = RaceStore::new(
        inner.clone(),
        Some((keys::meta_epoch(1), Bytes::from_static(b"other"))),
    );
    let log = LogStore::new(Arc::new(race), 1);
    let err = log.recover("a", "cluster").await.unwrap_err();
    assert!(matches!(err, LogError::EpochTaken(1)), "{err:?}");
    let again = log.recover("a", "cluster").await.unwrap();
    assert_eq!(again.epoch, 2);
}

/// Issue 10 review H1: a create-only PUT that conflicts (S3 `409 ConditionalRequestConflict`,
/// which object_store reports as `AlreadyExists`) while the slot stays absent did not lose the
/// slot to anyone: the write is retried and lands.
#[tokio::test]
async fn test_log_write_slot_retries_a_conflict_on_an_absent_slot() {
    let inner = Arc::new(InMemory::new());
    let race = RaceStore::new(inner.clone(), None).phantom_conflicts(keys::meta_log(1), 1);
    let log = LogStore::new(Arc::new(race), 2);
    let bytes = record_bytes(1, 1, vec![create("t", 1)]);
    log.write_slot(1, 1, bytes.clone()).await.unwrap();
    let stored = inner.get(&keys::meta_log(1)).await.unwrap().bytes().await;
    assert_eq!(stored.unwrap(), bytes);
}

/// With no attempt left, a conflict on an absent slot is a failed write (the writer steps down
/// and recovery continues the log), never a slot lost to another epoch.
#[tokio::test]
async fn test_log_write_slot_conflict_on_an_absent_slot_is_not_slot_lost() {
    let inner = Arc::new(InMemory::new());
    let race = RaceStore::new(inner.clone(), None).phantom_conflicts(keys::meta_log(1), 1);
    let log = LogStore::new(Arc::new(race), 1);
    let err = log
        .write_slot(1, 1, record_bytes(1, 1, vec![]))
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Store { .. }), "{err:?}");
}

/// Recovery filling a hole among a deposed writer's dead slots: a conflict on the absent hole
/// used to count as "taken by the deposed writer", leaving the hole, so replay stopped there and
/// every later record of the new writer (acknowledged commits) was invisible to the next
/// recovery.
#[tokio::test]
async fn test_log_fill_retries_a_conflict_on_an_absent_hole() {
    let inner = deposed_writer_left_slot_3().await;
    let race = RaceStore::new(inner.clone(), None).phantom_conflicts(keys::meta_log(2), 1);
    let log = LogStore::new(Arc::new(race), 2);
    let recovered = log.recover("new", "cluster").await.unwrap();
    assert_eq!((recovered.epoch, recovered.next_seq), (2, 4));
    log.write_slot(4, 2, record_bytes(2, 4, vec![create("acked", 4)]))
        .await
        .unwrap();
    let replayed = LogStore::new(inner, 1).replay().await.unwrap();
    assert_eq!(replayed.gap, 5, "no hole before the new writer's records");
    assert!(replayed.state.topic("acked").is_some());
}

/// A conflict on an absent epoch object is not a claim by another control plane: the claim is
/// retried and gets that epoch.
#[tokio::test]
async fn test_log_claim_epoch_retries_a_conflict_on_an_absent_epoch() {
    let inner = Arc::new(InMemory::new());
    let race = RaceStore::new(inner.clone(), None).phantom_conflicts(keys::meta_epoch(1), 1);
    let log = LogStore::new(Arc::new(race), 2);
    assert_eq!(log.claim_epoch("a", None).await.unwrap(), 1);
    assert!(inner.head(&keys::meta_epoch(1)).await.is_ok());
}

/// A writer that claimed after us, replayed our `NewEpoch` and wrote its own behind it before
/// we looked past our gap has deposed us: recovery must claim again, not take its slots for a
/// deposed writer's dead ones (we would serve a state without them, and our next slot would be
/// dead to every replay).
#[tokio::test]
async fn test_log_recovery_overtaken_after_its_new_epoch_claims_again() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let slow = LogStore::new(store.clone(), 1);
    let a = slow.recover("a", "cluster").await.unwrap();
    assert_eq!((a.epoch, a.next_seq), (1, 1));
    let fast = LogStore::new(store.clone(), 1);
    let b = fast.recover("b", "cluster").await.unwrap();
    assert_eq!((b.epoch, b.next_seq), (2, 2));
    fast.write_slot(2, 2, record_bytes(2, 2, vec![create("later", 2)]))
        .await
        .unwrap();
    // The slow writer, its NewEpoch at slot 0, now looks for dead slots past it.
    let err = slow.fill_dead_slots(0, a.epoch).await.unwrap_err();
    assert!(matches!(err, LogError::EpochTaken(1)), "{err:?}");
}
