use std::collections::BTreeMap;

use object_store::memory::InMemory;
use weir_common::TopicId;

use super::*;

fn create(name: &str, id: u8) -> Entry {
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
    let record = LogRecord {
        entries: vec![create("late", 1)],
    };
    let err = first
        .write_slot(1, a.epoch, LogStore::encode_record(a.epoch, 1, &record))
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
    let bytes = LogStore::encode_record(1, 5, &LogRecord { entries: vec![] });
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
        let record = LogRecord {
            entries: vec![create(name, seq as u8)],
        };
        old.write_slot(seq, a.epoch, LogStore::encode_record(a.epoch, seq, &record))
            .await
            .unwrap();
    }
    let new = LogStore::new(store.clone(), 1);
    let b = new.recover("b", "cluster").await.unwrap();
    assert_eq!(b.next_seq, 5, "continues after the last dead slot");
    let record = LogRecord {
        entries: vec![create("live", 9)],
    };
    new.write_slot(5, b.epoch, LogStore::encode_record(b.epoch, 5, &record))
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
