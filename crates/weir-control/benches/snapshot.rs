//! What a snapshot costs the control plane today (RFC 0003 §8): `State::clone` runs under the
//! readable state's write lock (commits and readers wait), then JSON encoding runs on a blocking
//! thread. Both scale with the retained batches; this is the baseline the chunked index must beat.
//!
//!   cargo bench -p weir-control --bench snapshot

use std::collections::BTreeMap;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use weir_common::{FileId, TopicId};
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
        let file_id = FileId((1u128 << 90) | file as u128);
        let commit = FileCommit {
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
        };
        state.apply(&Entry::CommitFile(commit));
        previous = Some(file_id);
    }
    state
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
    }
    group.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
