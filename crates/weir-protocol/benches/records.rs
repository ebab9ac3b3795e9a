//! CPU cost of Produce's record checks per MiB of records: the framing check every batch gets
//! (`produce.validation = "framing"`) against the full decode (decompress and walk every
//! record: `"full"`, compacted topics, timestamp bounds), for each codec.
//!
//! Run: `cargo bench -p weir-protocol --bench records`. Throughput is per byte of
//! *uncompressed* records, so the numbers compare across codecs; results in
//! docs/benchmarks.md.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use weir_protocol::batch::{split_and_validate, Compression};
use weir_protocol::records::{self, RecordSpec};

const LIMIT: usize = 32 << 20;

/// ~1 MiB of records shaped like JSON events (1 KiB values, compressible about 3-5x).
fn records() -> Vec<RecordSpec> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..1024)
        .map(|i| {
            let mut value = String::with_capacity(1024);
            while value.len() < 1000 {
                value.push_str(&format!(
                    "{{\"user\":{},\"event\":\"click\",\"amount\":{}.{:02},\"ok\":true}}",
                    next() % 100_000,
                    next() % 10_000,
                    next() % 100
                ));
            }
            RecordSpec {
                key: Some(format!("user-{}", i % 97).into_bytes()),
                value: Some(value.into_bytes()),
                timestamp: 1_700_000_000_000 + i as i64,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let specs = records();
    let mut group = c.benchmark_group("records");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let uncompressed = records::build_batch(Compression::None, &specs).len();
    group.throughput(Throughput::Bytes(uncompressed as u64));
    for codec in Compression::ALL {
        let batch = records::build_batch(codec, &specs);
        let parsed = split_and_validate(&batch).expect("valid batch").remove(0);
        let name = format!("{codec:?}").to_lowercase();
        eprintln!(
            "{name}: {} bytes on the wire for {uncompressed} bytes of records",
            batch.len()
        );
        group.bench_with_input(BenchmarkId::new("framing", &name), &parsed, |b, batch| {
            b.iter(|| records::check_framing(&batch.header, black_box(&batch.bytes), LIMIT))
        });
        group.bench_with_input(BenchmarkId::new("full", &name), &parsed, |b, batch| {
            b.iter(|| {
                let section = records::decode(&batch.header, black_box(&batch.bytes), LIMIT)
                    .expect("decodes");
                let mut keys = 0usize;
                records::walk(&batch.header, &section, |record| {
                    keys += usize::from(record.key.is_some())
                })
                .expect("walks");
                keys
            })
        });
        // The header + CRC32C check every batch already had, for scale.
        group.bench_with_input(BenchmarkId::new("crc", &name), &batch, |b, batch| {
            b.iter(|| split_and_validate(black_box(batch)).expect("valid"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
