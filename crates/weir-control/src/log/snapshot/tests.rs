use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{ObjectStoreExt, PutPayload};
use weir_common::{FileId, TopicId};

use super::super::test_store::{chunk_keys, write_entries, HoldStore};
use super::*;
use crate::entry::{
    BatchCommit, Entry, EntryResult, FileCommit, LogStartCause, LogStartMove, OffsetCommit,
};
use crate::state::IndexEntry;

const T0: i64 = 1_764_547_200_000;

/// A state with every kind of content: two topics with configs, `files` files of one batch per
/// partition (an idempotent producer on partition 0), a mid-batch log start that released
/// files, committed offsets, a tip and a horizon.
fn rich_state(files: u32) -> State {
    let mut state = State::default();
    state.apply(&Entry::NewEpoch {
        epoch: 3,
        cluster_id: "cluster".into(),
        at_ms: T0,
    });
    let a = TopicId([1; 16]);
    let configs = BTreeMap::from([("retention.ms".to_string(), "60000".to_string())]);
    for (name, id, partitions, configs) in [
        ("a", a, 3, configs),
        ("b", TopicId([2; 16]), 2, BTreeMap::new()),
    ] {
        state.apply(&Entry::CreateTopic {
            name: name.into(),
            topic_id: id,
            partitions,
            configs,
        });
    }
    let EntryResult::InitProducerId(Ok((pid, epoch))) = state.apply(&Entry::InitProducerId {
        existing: None,
        at_ms: T0,
        fresh_if_unknown: true,
    }) else {
        panic!("a producer id")
    };
    let mut previous = None;
    let mut sequence = 0;
    for n in 0..files {
        let span = 1 + (n as i32 % 50);
        let file_id = FileId(((T0 as u128 + u128::from(n)) << 80) | 7);
        let batches = (0..3)
            .map(|p| BatchCommit {
                topic_id: a,
                partition: p,
                byte_offset: u64::from(p as u32) * 1000,
                len: 1000 + n,
                offset_span: span,
                first_timestamp: T0 + i64::from(n) * 10,
                max_timestamp: T0 + i64::from(n) * 10 + i64::from(p),
                producer_id: if p == 0 { pid } else { -1 },
                producer_epoch: if p == 0 { epoch } else { -1 },
                base_sequence: if p == 0 { sequence } else { -1 },
            })
            .collect();
        state.apply(&Entry::CommitFile(FileCommit {
            agent: "agent-1".into(),
            previous,
            file_id,
            size: 4000,
            buckets: vec![0, 1],
            batches,
        }));
        previous = Some(file_id);
        sequence += span;
    }
    // Half of each partition goes (mid-batch where spans allow): the first files are released.
    let partitions = state.topics["a"]
        .partitions
        .iter()
        .enumerate()
        .map(|(p, partition)| LogStartMove {
            partition: p as i32,
            offset: partition.high_watermark / 2 + 1,
        })
        .collect();
    state.apply(&Entry::AdvanceLogStart {
        topic_id: a,
        partitions,
        cause: LogStartCause::DeleteRecords,
    });
    // The newest file's batches were compacted into a regional file.
    if let Some(newest) = previous {
        let batches = state.topics["a"]
            .partitions
            .iter()
            .enumerate()
            .flat_map(|(p, partition)| {
                partition
                    .index
                    .iter()
                    .filter(|e| e.file_id == newest)
                    .map(move |e| crate::entry::ReplacedRun {
                        topic_id: a,
                        partition: p as i32,
                        base_offset: e.base_offset,
                        last_offset: e.last_offset,
                        byte_offset: 8 + e.byte_offset,
                        len: e.len,
                        entries: 1,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let output = FileId(((T0 as u128 + u128::from(files)) << 80) | 9);
        let result = state.apply(&Entry::ReplaceFiles(crate::entry::FileReplace {
            job: 1,
            output,
            tier: weir_common::Tier::Regional,
            holders: vec![0],
            size: 9000,
            batches: Vec::new(),
            inputs: vec![newest],
            runs: batches,
        }));
        assert!(
            matches!(result, EntryResult::ReplaceFiles(Ok(ref o)) if o.replaced == 3),
            "{result:?}"
        );
    }
    state.apply(&Entry::CommitOffsets {
        coordinator: None,
        group: "g".into(),
        offsets: vec![OffsetCommit {
            topic: "a".into(),
            partition: 2,
            offset: 5,
            leader_epoch: 0,
            metadata: Some("m".into()),
        }],
        at_ms: T0,
    });
    state.apply(&Entry::SweepHorizon { horizon_ms: T0 - 1 });
    state.apply(&Entry::RegisterAgent(crate::entry::AgentRegistration {
        node_id: 4,
        incarnation: "i".into(),
        zone: "z".into(),
        host: "h".into(),
        port: 9092,
        control_address: "h:9093".into(),
        at_ms: T0,
    }));
    assert_eq!(state.registry.agents.len(), 1);
    // A reserved file not yet confirmed (RFC 0006): `pending` must survive the snapshot.
    let reserved = state.apply(&Entry::ReserveFile(crate::entry::FileCommit {
        agent: "reserving".into(),
        previous: None,
        file_id: FileId(((T0 as u128 + u128::from(files) + 1) << 80) | 9),
        size: 100,
        buckets: vec![0, 1, 2],
        batches: vec![BatchCommit {
            topic_id: TopicId([2; 16]),
            partition: 1,
            byte_offset: 0,
            len: 100,
            offset_span: 3,
            first_timestamp: T0,
            max_timestamp: T0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: 0,
        }],
    }));
    assert!(
        matches!(&reserved, EntryResult::ReserveFile(outcomes) if matches!(outcomes[..], [crate::BatchOutcome::Appended { .. }])),
        "{reserved:?}"
    );
    state.mark_all_stable();
    let b1 = &state.topics["b"].partitions[1];
    assert_eq!((b1.stable_high_watermark, b1.high_watermark), (0, 3));
    state
}

fn fence() -> FenceSlots {
    let mut fence = FenceSlots::default();
    fence.record(0);
    fence.record(9);
    fence
}

/// Everything serialised: what a legacy JSON snapshot would hold.
fn json(state: &State) -> String {
    serde_json::to_string(state).unwrap()
}

#[tokio::test]
async fn test_snapshot_binary_round_trips_in_many_chunks() {
    let state = rich_state(200);
    assert!(!state.released.is_empty() && !state.group_offsets.is_empty());
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(100);
    let inline = log.write_snapshot(3, 10, &state, &fence()).await.unwrap();
    let background = log
        .write_snapshot_in_background(3, 11, Box::new(state.clone()), fence())
        .await
        .unwrap();
    assert_eq!(inline, background, "one encoding whatever the thread");
    assert!(inline.chunks > 20, "{inline:?}");
    assert_eq!(
        chunk_keys(&store).await.len(),
        2 * inline.chunks,
        "chunks 0..n of each"
    );
    for seq in [10, 11] {
        let (decoded, decoded_fence) = log.read_snapshot(seq).await.unwrap().unwrap().unwrap();
        assert_eq!(json(&decoded), json(&state));
        assert_eq!(decoded_fence, fence());
    }
}

/// A field added to `State`, `Topic` or `PartitionState` must be added to the views that
/// write the `small` section, or binary snapshots would silently drop it.
#[test]
fn test_snapshot_small_section_has_every_state_field() {
    let state = rich_state(2);
    // Through text: `Value` cannot hold the u128 file ids that `to_value` would give it.
    let value = |text: String| serde_json::from_str::<serde_json::Value>(&text).unwrap();
    let full = value(json(&state));
    let small = value(serde_json::to_string(&encode::StateRef::new(&state)).unwrap());
    let keys = |value: &serde_json::Value| -> BTreeSet<String> {
        value.as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(keys(&small), keys(&full));
    let topic = |value: &serde_json::Value| value["topics"]["a"].clone();
    assert_eq!(keys(&topic(&small)), keys(&topic(&full)));
    let partition = |value: &serde_json::Value| topic(value)["partitions"][0].clone();
    assert_eq!(keys(&partition(&small)), keys(&partition(&full)));
    assert_eq!(partition(&small)["index"], serde_json::json!([]));
    assert_ne!(partition(&full)["index"], serde_json::json!([]));
}

/// The manifest of snapshot `seq`.
async fn manifest(log: &LogStore, seq: u64) -> Manifest {
    let bytes = log.get(&keys::meta_snapshot(seq)).await.unwrap().unwrap();
    serde_json::from_slice(decode_envelope(&bytes).unwrap().payload).unwrap()
}

/// RFC 0003 §8 aims at ~14 B per batch in the index sections (JSON: ~190 B).
#[tokio::test]
async fn test_snapshot_index_costs_few_bytes_per_batch() {
    let state = rich_state(10_000);
    let log = LogStore::new(Arc::new(InMemory::new()), 1);
    let written = log.write_snapshot(3, 2, &state, &fence()).await.unwrap();
    let batches: usize = state
        .topics
        .values()
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.index.len())
        .sum();
    assert_eq!(written.batches, batches as u64);
    assert!(written.index_bytes < 14 * written.batches, "{written:?}");
    // Partitions of more than one index block read back.
    assert!(batches / 3 > weir_format::INDEX_BLOCK_ROWS);
    let (decoded, _) = log.read_snapshot(2).await.unwrap().unwrap().unwrap();
    assert_eq!(json(&decoded), json(&state));
}

#[tokio::test]
async fn test_snapshot_with_a_missing_or_bad_chunk_is_skipped_for_the_previous() {
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(64);
    let old = rich_state(3);
    let new = rich_state(20);
    log.write_snapshot(3, 4, &old, &fence()).await.unwrap();
    let written = log.write_snapshot(3, 8, &new, &fence()).await.unwrap();
    let chunk = keys::meta_snapshot_chunk(8, written.chunks as u32 / 2);
    let original = log.get(&chunk).await.unwrap().unwrap();
    let damaged = [
        None,
        // A valid chunk envelope with other bytes: only the manifest's CRC tells.
        Some(encode_envelope(EnvelopeKind::SnapshotChunk, 3, 8, &[b'x'; 64]).unwrap()),
        // Another snapshot's chunk.
        Some(
            encode_envelope(
                EnvelopeKind::SnapshotChunk,
                3,
                4,
                &original[27..original.len() - 4],
            )
            .unwrap(),
        ),
        Some(Bytes::from_static(b"garbage")),
    ];
    for bytes in damaged {
        match &bytes {
            None => store.delete(&chunk).await.unwrap(),
            Some(bytes) => {
                store.put(&chunk, bytes.clone().into()).await.unwrap();
            }
        }
        let reason = log.read_snapshot(8).await.unwrap().unwrap().unwrap_err();
        assert!(reason.contains("000008/"), "{reason}");
        let (seq, state, _) = log.load_snapshot().await.unwrap().unwrap();
        assert_eq!((seq, json(&state)), (4, json(&old)), "{bytes:?}");
    }
    store.put(&chunk, original.into()).await.unwrap();
    let (seq, state, _) = log.load_snapshot().await.unwrap().unwrap();
    assert_eq!((seq, json(&state)), (8, json(&new)));
}

#[tokio::test]
async fn test_snapshot_manifests_that_do_not_tile_the_body_are_refused() {
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(64);
    log.write_snapshot(3, 8, &rich_state(5), &fence())
        .await
        .unwrap();
    let manifest = manifest(&log, 8).await;
    assert!(decode::check_manifest(&manifest).is_ok());
    let mut broken = Vec::new();
    assert_eq!(manifest.format, 2, "rich_state holds a pending file");
    let mut m = manifest.clone();
    m.format = 3;
    broken.push(m);
    let mut m = manifest.clone();
    m.sections.swap(0, 1);
    broken.push(m);
    let mut m = manifest.clone();
    m.sections.pop();
    broken.push(m);
    let mut m = manifest.clone();
    m.chunks.pop();
    broken.push(m);
    let mut m = manifest.clone();
    m.sections.truncate(1);
    m.chunks.clear();
    broken.push(m);
    let mut m = manifest.clone();
    if let Section::Index { entries, .. } = m.sections.last_mut().unwrap() {
        *entries += 1;
    }
    broken.push(m);
    let mut m = manifest.clone();
    if let Section::Files { count, .. } = &mut m.sections[1] {
        *count += 1;
    }
    broken.push(m);
    let mut m = manifest.clone();
    let last = m.sections.last().unwrap().clone();
    m.sections.push(last);
    broken.push(m);
    for manifest in broken {
        let json = serde_json::to_vec(&manifest).unwrap();
        let bytes = encode_envelope(EnvelopeKind::SnapshotManifest, 3, 8, &json).unwrap();
        store
            .put(&keys::meta_snapshot(8), bytes.into())
            .await
            .unwrap();
        assert!(
            log.read_snapshot(8).await.unwrap().unwrap().is_err(),
            "{manifest:?}"
        );
    }
}

/// An index with a gap cannot be written with implied base offsets: the snapshot fails with
/// an error and leaves no manifest (the writer goes on without it).
#[tokio::test]
async fn test_snapshot_of_an_index_with_a_gap_is_an_error_not_a_snapshot() {
    let mut state = rich_state(20);
    let index = &mut state.topics.get_mut("a").unwrap().partitions[0].index;
    assert!(index.len() > 2);
    *index = index
        .iter()
        .enumerate()
        .map(|(i, entry)| IndexEntry {
            base_offset: entry.base_offset + i64::from(i == 1),
            ..*entry
        })
        .collect();
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    for background in [false, true] {
        let result = if background {
            log.write_snapshot_in_background(3, 5, Box::new(state.clone()), fence())
                .await
        } else {
            log.write_snapshot(3, 5, &state, &fence()).await
        };
        assert!(matches!(result, Err(LogError::Encode { .. })), "{result:?}");
        assert!(log.get(&keys::meta_snapshot(5)).await.unwrap().is_none());
    }
}

/// A failed chunk PUT stops the background encoder and the snapshot: no manifest.
#[tokio::test]
async fn test_snapshot_upload_failure_stops_the_encoder_and_writes_no_manifest() {
    let memory = Arc::new(InMemory::new());
    let store = Arc::new(HoldStore::new(memory.clone(), None));
    store.fail_puts_under(keys::meta_snapshot_chunk(5, 3));
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(32);
    let result = log
        .write_snapshot_in_background(3, 5, Box::new(rich_state(500)), fence())
        .await;
    assert!(matches!(result, Err(LogError::Store { .. })), "{result:?}");
    assert!(log.get(&keys::meta_snapshot(5)).await.unwrap().is_none());
    let written = chunk_keys(&memory).await.len();
    assert!(written < 100, "the encoder stopped early: {written} chunks");
}

/// Recovery reads a JSON snapshot written by the code path of before binary snapshots; the
/// next snapshot is binary, log GC collects the JSON one, and recovery finds the same state.
#[tokio::test]
async fn test_snapshot_json_of_before_recovers_then_binary_replaces_it() {
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(256);
    let recovered = log.recover("a", "cluster").await.unwrap();
    assert_eq!(recovered.next_seq, 1);
    let mut state = rich_state(30);
    state.apply(&Entry::NewEpoch {
        epoch: 1,
        cluster_id: "cluster".into(),
        at_ms: T0,
    });
    let json_snapshot = encode_json_snapshot(1, 1, &state, &recovered.fence);
    write_entries(&log, 1, 1, vec![]).await;
    store
        .put(&keys::meta_snapshot(1), PutPayload::from(json_snapshot))
        .await
        .unwrap();
    let replayed = log.replay().await.unwrap();
    assert_eq!(replayed.snapshot_seq, Some(1));
    assert_eq!(json(&replayed.state), json(&state));

    for seq in 2..=3 {
        write_entries(&log, 1, seq, vec![]).await;
        let replayed = log.replay().await.unwrap();
        log.write_snapshot(1, seq, &replayed.state, &replayed.fence)
            .await
            .unwrap();
    }
    let report = log.collect_garbage(3, &replayed.fence).await.unwrap();
    assert_eq!((report.kept_snapshot, report.snapshots), (Some(2), 1));
    let again = log.replay().await.unwrap();
    assert_eq!(again.snapshot_seq, Some(3));
    assert_eq!(json(&again.state), json(&state));
}

/// Log GC deletes the chunks of the snapshots it collects and chunks no manifest names below
/// the new snapshot; it keeps the two snapshots' chunks and anything above the new one (a
/// snapshot in progress).
#[tokio::test]
async fn test_gc_deletes_chunks_without_a_manifest_and_of_collected_snapshots() {
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1).with_snapshot_chunk_bytes(512);
    let recovered = log.recover("a", "cluster").await.unwrap();
    for seq in 1..=9 {
        write_entries(&log, 1, seq, vec![]).await;
    }
    let state = rich_state(10);
    for seq in [2, 4, 6] {
        log.write_snapshot(1, seq, &state, &recovered.fence)
            .await
            .unwrap();
    }
    // Crashed snapshots: below S1, between S1 and S2, and one above S2 still being written.
    for (seq, n) in [(1, 0), (5, 0), (5, 1), (7, 0)] {
        store
            .put(&keys::meta_snapshot_chunk(seq, n), PutPayload::from("x"))
            .await
            .unwrap();
    }
    let chunks_of = |seqs: &[u64], all: &BTreeSet<(u64, u32)>| -> BTreeSet<u64> {
        all.iter()
            .map(|(seq, _)| *seq)
            .filter(|seq| seqs.contains(seq))
            .collect()
    };
    let before = chunk_keys(&store).await;
    let report = log.collect_garbage(6, &recovered.fence).await.unwrap();
    let after = chunk_keys(&store).await;
    assert_eq!(report.kept_snapshot, Some(4));
    assert_eq!(report.chunks, before.len() - after.len());
    assert_eq!(
        after.iter().map(|(seq, _)| *seq).collect::<BTreeSet<_>>(),
        BTreeSet::from([4, 6, 7])
    );
    assert_eq!(chunks_of(&[1, 2, 5], &before), BTreeSet::from([1, 2, 5]));
    let replayed = log.replay().await.unwrap();
    assert_eq!(replayed.snapshot_seq, Some(6));
    assert_eq!(json(&replayed.state), json(&state));
}

/// A state without pending files is written in format 1, which builds from before RFC 0006
/// read; one with pending files in format 2, which they refuse rather than drop the files.
#[tokio::test]
async fn test_snapshot_format_is_the_oldest_that_holds_the_state() {
    let store = Arc::new(InMemory::new());
    let log = LogStore::new(store.clone(), 1);
    let mut state = rich_state(3);
    log.write_snapshot(3, 8, &state, &fence()).await.unwrap();
    assert_eq!(manifest(&log, 8).await.format, 2);
    state.pending.clear();
    state.rebuild_indexes();
    log.write_snapshot(3, 9, &state, &fence()).await.unwrap();
    assert_eq!(manifest(&log, 9).await.format, 1);
}
