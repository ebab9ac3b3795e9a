use std::collections::BTreeMap;

use object_store::memory::InMemory;
use weir_common::FileId;

use super::*;
use crate::entry::{BatchCommit, BatchOutcome, FileCommit};

fn settings(snapshot_every_slots: u64) -> ControlPlaneSettings {
    ControlPlaneSettings {
        snapshot_every_slots,
        // Snapshots of several chunks, encoded on a blocking thread.
        snapshot_chunk_bytes: 64,
        ..ControlPlaneSettings::default()
    }
}

async fn commit_one(plane: &ControlPlane, topic_id: TopicId, file: u128) -> i64 {
    match plane.submit(file_entry(topic_id, file)).await.unwrap() {
        EntryResult::CommitFile(outcomes) => match outcomes[0] {
            BatchOutcome::Appended { base_offset, .. } => base_offset,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// A commit of one 10-record batch to partition 0, by an agent of its own.
fn file_entry(topic_id: TopicId, file: u128) -> Entry {
    Entry::CommitFile(FileCommit {
        agent: format!("test-{file}"),
        previous: None,
        file_id: FileId(file),
        size: 100,
        buckets: vec![0],
        batches: vec![BatchCommit {
            topic_id,
            partition: 0,
            byte_offset: 8,
            len: 90,
            offset_span: 10,
            first_timestamp: 5,
            max_timestamp: 5,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }],
    })
}

#[tokio::test]
async fn test_plane_recovers_state_after_restart_with_snapshots() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let plane = ControlPlane::open(store.clone(), settings(3), 1)
        .await
        .unwrap();
    let topic_id = plane
        .create_topic("orders", 2, BTreeMap::new(), 7)
        .await
        .unwrap();
    let mut bases = Vec::new();
    for file in 0..10 {
        bases.push(commit_one(&plane, topic_id, file).await);
    }
    assert_eq!(bases, (0..10).map(|i| i * 10).collect::<Vec<_>>());
    let stable = plane.read(|s| s.partition(&topic_id, 0).unwrap().stable_high_watermark);
    assert_eq!(stable, 100, "acked commits are published");
    // No clean shutdown: recovery must come from the latest snapshot plus replay.
    let reopened = ControlPlane::open(store.clone(), settings(3), 2)
        .await
        .unwrap();
    let (high_watermark, files) = reopened.read(|s| {
        (
            s.partition(&topic_id, 0).unwrap().stable_high_watermark,
            s.files.len(),
        )
    });
    assert_eq!((high_watermark, files), (100, 10));
    assert_eq!(commit_one(&reopened, topic_id, 99).await, 100);
    reopened.shutdown().await;
    let third = ControlPlane::open(store, settings(1000), 3).await.unwrap();
    assert_eq!(
        third.read(|s| s.partition(&topic_id, 0).unwrap().high_watermark),
        110
    );
}

#[tokio::test]
async fn test_plane_group_commits_concurrent_submissions() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let plane = ControlPlane::open(store, settings(1000), 1).await.unwrap();
    let topic_id = plane
        .create_topic("t", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|file| {
            let plane = plane.clone();
            tokio::spawn(async move { commit_one(&plane, topic_id, file).await })
        })
        .collect();
    let mut bases = Vec::new();
    for task in tasks {
        bases.push(task.await.unwrap());
    }
    bases.sort_unstable();
    assert_eq!(bases, (0..200).map(|i| i * 10).collect::<Vec<_>>());
    let slots = *plane.subscribe().borrow();
    assert!(
        slots < 200,
        "200 commits took {slots} slots: group commit batches them"
    );
}

#[tokio::test]
async fn test_plane_create_topic_errors_are_results() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let plane = ControlPlane::open(store, settings(1000), 1).await.unwrap();
    plane
        .create_topic("a", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    assert_eq!(
        plane.create_topic("a", 1, BTreeMap::new(), 2).await,
        Err(ControlError::TopicAlreadyExists("a".into()))
    );
    assert!(matches!(
        plane.create_topic("bad name", 1, BTreeMap::new(), 3).await,
        Err(ControlError::InvalidTopic(_))
    ));
}

#[tokio::test]
async fn test_plane_committed_offsets_survive_restart() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let plane = ControlPlane::open(store.clone(), settings(2), 1)
        .await
        .unwrap();
    plane
        .create_topic("orders", 3, BTreeMap::new(), 7)
        .await
        .unwrap();
    for round in 0..5i64 {
        let entry = Entry::CommitOffsets {
            coordinator: None,
            group: "g".into(),
            at_ms: 0,
            offsets: (0..3)
                .map(|partition| crate::entry::OffsetCommit {
                    topic: "orders".into(),
                    partition,
                    offset: round * 10 + i64::from(partition),
                    leader_epoch: 0,
                    metadata: Some(format!("round {round}")),
                })
                .collect(),
        };
        let result = plane.submit(entry).await.unwrap();
        assert_eq!(result, EntryResult::CommitOffsets(vec![Ok(()); 3]));
    }
    // Crash (no shutdown): snapshot plus replay must bring the offsets back.
    let reopened = ControlPlane::open(store, settings(2), 2).await.unwrap();
    let committed = reopened.read(|s| s.committed_offset("g", "orders", 2).cloned());
    let committed = committed.unwrap();
    assert_eq!(committed.offset, 42);
    assert_eq!(committed.metadata.as_deref(), Some("round 4"));
}

/// A metadata store that can be taken down (a full disk, a bucket outage) and brought back.
fn outage_store() -> (Arc<weir_storage::ModelStore>, Arc<dyn ObjectStore>) {
    let store = Arc::new(
        weir_storage::ModelStore::new(
            Arc::new(InMemory::new()),
            weir_storage::LatencyProfile::local(),
            1,
        )
        .unwrap(),
    );
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    (store, dyn_store)
}

#[tokio::test(start_paused = true)]
async fn test_plane_fails_fast_while_its_log_is_unavailable_then_recovers() {
    let (model, store) = outage_store();
    let settings = ControlPlaneSettings {
        write_attempts: 2,
        ..ControlPlaneSettings::default()
    };
    let plane = ControlPlane::open(store, settings, 1).await.unwrap();
    let topic_id = plane
        .create_topic("orders", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    model.set_outage(true);
    // The slot write fails: its caller gets a retriable error, and recovery starts failing.
    let first = plane.create_topic("a", 1, BTreeMap::new(), 8).await;
    assert!(
        matches!(first, Err(ControlError::Unavailable(_))),
        "{first:?}"
    );
    // While recovery keeps failing, callers are answered at once instead of waiting for the
    // store to come back (the outage lasts much longer than this bound).
    for attempt in 0..5u64 {
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            plane.create_topic("b", 1, BTreeMap::new(), 9 + attempt),
        )
        .await
        .expect("no answer while the metadata log is unavailable");
        assert!(
            matches!(answer, Err(ControlError::Unavailable(_))),
            "{answer:?}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    model.set_outage(false);
    // Once the store is back, recovery succeeds and entries are accepted again.
    let created = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match plane.create_topic("c", 1, BTreeMap::new(), 20).await {
                Ok(id) => return id,
                Err(ControlError::Unavailable(_)) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(other) => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("the plane did not recover");
    assert_ne!(created, topic_id);
    assert!(plane.read(|s| s.topic("orders").is_some() && s.topic("c").is_some()));
    assert!(
        plane.read(|s| s.topic("b").is_none()),
        "failed entries left no trace"
    );
    plane.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn test_plane_shuts_down_while_its_log_is_unavailable() {
    let (model, store) = outage_store();
    let settings = ControlPlaneSettings {
        write_attempts: 2,
        ..ControlPlaneSettings::default()
    };
    let plane = ControlPlane::open(store, settings, 1).await.unwrap();
    model.set_outage(true);
    assert!(plane
        .create_topic("a", 1, BTreeMap::new(), 8)
        .await
        .is_err());
    tokio::time::timeout(Duration::from_secs(30), plane.shutdown())
        .await
        .expect("shutdown hung while the metadata log was unavailable");
    let after = plane.create_topic("b", 1, BTreeMap::new(), 9).await;
    assert!(
        matches!(after, Err(ControlError::ShuttingDown)),
        "{after:?}"
    );
}

fn commit_offset(group: &str, topic: &str, offset: i64) -> Entry {
    Entry::CommitOffsets {
        coordinator: None,
        group: group.into(),
        at_ms: 0,
        offsets: vec![crate::entry::OffsetCommit {
            topic: topic.into(),
            partition: 0,
            offset,
            leader_epoch: 0,
            metadata: None,
        }],
    }
}

/// What readers see of the entries the failed-slot test submits.
fn visible(plane: &ControlPlane, topic_id: TopicId) -> (bool, Option<i64>, i64, i64, usize) {
    plane.read(|s| {
        let partition = s.partition(&topic_id, 0).unwrap();
        (
            s.topic("doomed").is_some(),
            s.committed_offset("g", "orders", 0).map(|c| c.offset),
            partition.high_watermark,
            partition.stable_high_watermark,
            partition.index.len(),
        )
    })
}

/// Issue 9 §4.5: a topic, a committed offset and a file commit whose slot write fails are never
/// visible to readers: not while the write fails, not while recovery cannot run, not after.
#[tokio::test(start_paused = true)]
async fn test_plane_readers_never_see_entries_of_a_failed_slot() {
    let (model, store) = outage_store();
    let settings = ControlPlaneSettings {
        write_attempts: 2,
        ..ControlPlaneSettings::default()
    };
    let plane = ControlPlane::open(store, settings, 1).await.unwrap();
    let topic_id = plane
        .create_topic("orders", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    plane.submit(commit_offset("g", "orders", 5)).await.unwrap();
    assert_eq!(commit_one(&plane, topic_id, 1).await, 0);
    let durable = (false, Some(5), 10, 10, 1);
    assert_eq!(visible(&plane, topic_id), durable);

    model.set_outage(true);
    let doomed = [
        Entry::CreateTopic {
            name: "doomed".into(),
            topic_id: TopicId([0x33; 16]),
            partitions: 1,
            configs: BTreeMap::new(),
        },
        commit_offset("g", "orders", 99),
        file_entry(topic_id, 2),
    ];
    let mut pending = Vec::new();
    for entry in doomed {
        pending.push(plane.enqueue(entry).await.unwrap());
    }
    for result in pending {
        let result = result.await;
        assert!(
            matches!(result, Err(ControlError::Unavailable(_))),
            "{result:?}"
        );
        assert!(
            !*plane.availability().borrow(),
            "unavailable before the caller hears of the failure"
        );
        assert_eq!(visible(&plane, topic_id), durable, "during the outage");
    }

    model.set_outage(false);
    let mut available = plane.availability();
    tokio::time::timeout(Duration::from_secs(60), available.wait_for(|up| *up))
        .await
        .expect("the plane did not recover")
        .unwrap();
    assert_eq!(visible(&plane, topic_id), durable, "after recovery");
    assert_eq!(commit_one(&plane, topic_id, 3).await, 10);
    assert_eq!(visible(&plane, topic_id), (false, Some(5), 20, 20, 2));
    plane.shutdown().await;
}

/// An acknowledged entry is visible to readers by the time its caller is answered.
#[tokio::test]
async fn test_plane_entry_is_readable_when_its_caller_is_answered() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let plane = ControlPlane::open(store, settings(2), 1).await.unwrap();
    let topic_id = plane
        .create_topic("orders", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    for round in 0..5 {
        plane
            .submit(commit_offset("g", "orders", round))
            .await
            .unwrap();
        assert_eq!(
            commit_one(&plane, topic_id, round as u128).await,
            round * 10
        );
        let (_, offset, high, stable, batches) = visible(&plane, topic_id);
        assert_eq!(
            (offset, high, stable, batches),
            (
                Some(round),
                (round + 1) * 10,
                (round + 1) * 10,
                round as usize + 1
            )
        );
    }
}
