//! RFC 0004 on the appendable double: empty slots are missing (rule 1), existing empty slots are
//! written only through a takeover (rule 2), and the window of pre-warmed slots.

use weir_storage::append::memory::MemoryAppendable;
use weir_storage::append::AppendableStore;
use weir_storage::StorageError;

use super::super::tests::create;
use super::super::*;

fn stores(double: &MemoryAppendable) -> (Arc<dyn ObjectStore>, Arc<dyn AppendableStore>) {
    (Arc::new(double.clone()), Arc::new(double.clone()))
}

fn log(double: &MemoryAppendable, prewarmed: usize) -> LogStore {
    let (objects, appendable) = stores(double);
    LogStore::new(objects, 2).with_appendable(appendable, prewarmed)
}

fn record(epoch: u64, seq: u64, name: &str) -> Bytes {
    LogStore::encode_record(epoch, seq, &LogRecord::new(vec![create(name, seq as u8)])).unwrap()
}

#[tokio::test]
async fn test_prewarm_empty_slot_is_missing_and_a_new_epoch_takes_it_over() {
    for double in [
        MemoryAppendable::gcs_rapid(),
        MemoryAppendable::s3_express(),
    ] {
        let a = log(&double, 0);
        let first = a.recover("a", "cluster").await.unwrap();
        assert_eq!(first.next_seq, 1);
        // A's pre-warmed slot 1: created, still empty, its writer kept.
        let mut held = double.create(&keys::meta_log(1)).await.unwrap();
        let replayed = a.replay().await.unwrap();
        assert_eq!(replayed.gap, 1, "an empty slot object is a missing slot");
        // B recovers: its NewEpoch lands in slot 1 through a takeover.
        let b = log(&double, 0);
        let second = b.recover("b", "cluster").await.unwrap();
        assert_eq!((second.epoch, second.next_seq), (2, 2));
        // A's held writer is fenced: its record never lands.
        held.append(0, record(1, 1, "late")).await.unwrap();
        let err = held.flush().await.unwrap_err();
        assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
        let replayed = b.replay().await.unwrap();
        assert_eq!((replayed.gap, replayed.log_epoch), (2, 2));
        assert!(
            replayed.state.topics.is_empty(),
            "A's late record is not in the log"
        );
    }
}

#[tokio::test]
async fn test_prewarm_a_record_that_landed_first_wins_the_slot() {
    let double = MemoryAppendable::s3_express();
    let a = log(&double, 0);
    a.recover("a", "cluster").await.unwrap();
    let mut held = double.create(&keys::meta_log(1)).await.unwrap();
    held.append(0, record(1, 1, "landed")).await.unwrap();
    held.flush().await.unwrap();
    // B replays past A's record: it is a live slot.
    let b = log(&double, 0);
    let second = b.recover("b", "cluster").await.unwrap();
    assert_eq!(second.next_seq, 3);
    assert_eq!(second.state.topics.len(), 1);
}

#[tokio::test]
async fn test_prewarm_writing_a_slot_another_writer_filled_is_slot_lost() {
    let double = MemoryAppendable::gcs_rapid();
    let a = log(&double, 0);
    a.recover("a", "cluster").await.unwrap();
    let mut other = double.create(&keys::meta_log(1)).await.unwrap();
    other.append(0, record(7, 1, "theirs")).await.unwrap();
    other.flush().await.unwrap();
    let err = a.write_slot(1, 1, record(1, 1, "ours")).await.unwrap_err();
    assert!(
        matches!(
            err,
            LogError::SlotLost {
                seq: 1,
                found_epoch: 7,
                our_epoch: 1
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn test_prewarm_empty_slot_without_an_appendable_view_is_refused() {
    let double = MemoryAppendable::gcs_rapid();
    let plain = LogStore::new(Arc::new(double.clone()), 1);
    double.create(&keys::meta_log(0)).await.unwrap();
    let err = plain.write_slot(0, 1, record(1, 0, "x")).await.unwrap_err();
    assert!(err.to_string().contains("empty pre-warmed object"), "{err}");
}

#[tokio::test]
async fn test_prewarm_hole_filling_fills_empty_objects_of_a_deposed_writer() {
    let double = MemoryAppendable::gcs_rapid();
    let a = log(&double, 0);
    let first = a.recover("a", "cluster").await.unwrap();
    // A pre-warmed slots 1..=4 and wrote only slot 3 (dead once B's NewEpoch is at 1).
    let mut held = Vec::new();
    for seq in 1..=4 {
        held.push(double.create(&keys::meta_log(seq)).await.unwrap());
    }
    let mut third = held.remove(2);
    third
        .append(0, record(first.epoch, 3, "dead"))
        .await
        .unwrap();
    third.flush().await.unwrap();
    let b = log(&double, 0);
    let second = b.recover("b", "cluster").await.unwrap();
    assert_eq!(second.next_seq, 5, "holes 2 and 4 filled, dead slot 3 kept");
    for seq in 1..=4 {
        let bytes = double
            .get(&keys::meta_log(seq))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(!bytes.is_empty(), "slot {seq} still empty");
    }
    let replayed = b.replay().await.unwrap();
    assert_eq!((replayed.gap, replayed.dead), (5, 1));
    assert!(replayed.state.topics.is_empty());
}

#[tokio::test]
async fn test_prewarm_window_writes_slots_into_precreated_objects() {
    let double = MemoryAppendable::gcs_rapid();
    let log = log(&double, 4);
    let recovered = log.recover("a", "cluster").await.unwrap();
    log.prewarm_from(recovered.next_seq);
    let window = log.window.clone().unwrap();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(window.ready(), vec![1, 2, 3, 4]);
    for seq in 1..=6 {
        log.write_slot(seq, recovered.epoch, record(recovered.epoch, seq, "t"))
            .await
            .unwrap();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(
        window.ready(),
        vec![7, 8, 9, 10],
        "the window moved with the writes"
    );
    let replayed = log.replay().await.unwrap();
    assert_eq!(replayed.gap, 7);
    assert_eq!(replayed.replayed, 7);
    log.close_window();
    assert!(window.ready().is_empty());
}
