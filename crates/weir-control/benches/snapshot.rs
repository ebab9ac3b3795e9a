//! What a snapshot costs the control plane (RFC 0003 §8): `State::clone` runs under the
//! readable state's write lock (commits and readers wait), then encoding runs on a blocking
//! thread. With the chunked index and persistent maps the clone no longer scales with the
//! retained batches. `encode_json` is the legacy format; `write_binary` encodes the binary chunked
//! format and PUTs it to an in-memory store, `replay_binary` GETs, verifies and decodes it
//! (recovery from it). The binary body's bytes per batch are printed once per size. What the
//! persistent structures cost in return is `apply_commit` (one file of 10 batches applied to a
//! state that was just cloned, as after every snapshot, and in steady state).
//!
//!   cargo bench -p weir-control --bench snapshot

use std::collections::BTreeMap;

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use object_store::memory::InMemory;
use weir_common::{FileId, TopicId};
use weir_control::log::{FenceSlots, LogStore};
use weir_control::{BatchCommit, Entry, FileCommit, State};

/// A state with `batches` retained batches over 100 partitions, 10 batches per file.
fn state(batches: usize) -> State {
    let mut state = State::default();
    let topic_id = TopicId([7; 16]);
    state.apply(&Entry::CreateTopic {
        name: "bench".into(),
        topic_id,
        partitions: 100,
        configs: BTreeMap::new(),
    });
    let mut previous = None;
    for file in 0..batches / 10 {
        let commit = file_commit(topic_id, file, previous);
        previous = Some(commit.file_id);
        state.apply(&Entry::CommitFile(commit));
    }
    state
}

fn file_id(file: usize) -> FileId {
    FileId((1u128 << 90) | file as u128)
}

/// File number `file`: 10 batches of 1 KiB, 10 records each, over partitions round robin.
fn file_commit(topic_id: TopicId, file: usize, previous: Option<FileId>) -> FileCommit {
    let file_id = file_id(file);
    FileCommit {
        agent: "bench".into(),
        previous,
        file_id,
        size: 10 * 1024,
        buckets: vec![0, 1],
        batches: (0..10)
            .map(|i| BatchCommit {
                topic_id,
                partition: ((file * 10 + i) % 100) as i32,
                byte_offset: i as u64 * 1024,
                len: 1024,
                offset_span: 10,
                first_timestamp: file as i64,
                max_timestamp: file as i64,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
            })
            .collect(),
    }
}

fn snapshot(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    for batches in [100_000usize, 1_000_000] {
        let state = state(batches);
        group.throughput(Throughput::Elements(batches as u64));
        group.bench_with_input(
            BenchmarkId::new("clone_under_lock", batches),
            &state,
            |b, s| b.iter(|| s.clone()),
        );
        group.bench_with_input(BenchmarkId::new("encode_json", batches), &state, |b, s| {
            b.iter(|| serde_json::to_vec(s).expect("state serialises").len())
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let fence = FenceSlots::default();
        let log = LogStore::new(Arc::new(InMemory::new()), 1);
        let written = runtime
            .block_on(log.write_snapshot(1, 1, &state, &fence))
            .expect("a snapshot");
        eprintln!(
            "binary snapshot of {batches} batches: {} bytes in {} chunks, {:.1} B per batch, \
             of which index sections {:.1} B per batch (JSON: {:.1} B per batch)",
            written.bytes,
            written.chunks,
            written.bytes as f64 / batches as f64,
            written.index_bytes as f64 / batches as f64,
            serde_json::to_vec(&state).expect("state serialises").len() as f64 / batches as f64,
        );
        group.bench_with_input(BenchmarkId::new("write_binary", batches), &state, |b, s| {
            b.iter(|| {
                runtime
                    .block_on(log.write_snapshot(1, 1, s, &fence))
                    .expect("written")
            })
        });
        group.bench_function(BenchmarkId::new("replay_binary", batches), |b| {
            b.iter(|| runtime.block_on(log.replay()).expect("replayed").state)
        });
    }
    group.finish();

    let mut group = c.benchmark_group("apply_commit");
    group.sample_size(20);
    let topic_id = TopicId([7; 16]);
    let base = state(1_000_000);
    let mut check = base.clone();
    check.apply(&Entry::CommitFile(file_commit(
        topic_id,
        100_000,
        Some(file_id(99_999)),
    )));
    assert!(
        check.files.contains_key(&file_id(100_000)),
        "the measured commit applies"
    );
    group.bench_function("after_clone/1000000", |b| {
        b.iter_batched(
            || {
                let state = base.clone();
                let snapshot = state.clone();
                (state, snapshot)
            },
            |(mut state, snapshot)| {
                let tip = Some(file_id(99_999));
                let result = state.apply(&Entry::CommitFile(file_commit(topic_id, 100_000, tip)));
                (state, snapshot, result)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    let mut state = base.clone();
    let mut file = 100_000;
    group.bench_function("steady/1000000", |b| {
        b.iter(|| {
            let commit = file_commit(topic_id, file, Some(file_id(file - 1)));
            file += 1;
            state.apply(&Entry::CommitFile(commit))
        })
    });
    assert!(
        state.files.contains_key(&file_id(file - 1)),
        "the measured commits were applied"
    );
    group.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
