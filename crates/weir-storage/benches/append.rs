//! Write + flush latency of one ingest file through the WriterPool vs create-per-file, under a
//! named latency profile (real time, the latency model over the appendable double).
//!
//! `cargo bench -p weir-storage --bench append [-- PROFILE FILES FILE_BYTES]` (defaults:
//! gcs-rapid, 400 files, 64 KiB). Each file is written to 3 buckets with a 2-of-3 quorum, as an
//! agent on three zonal buckets would, one file at a time (the latency of one upload, not
//! throughput). Prints p50, p99 and their ratios.
//!
//! - **create-per-file**: create an appendable object in each bucket, append + flush, close (what
//!   a file costs without a pool: the create's metadata round trip is on the path).
//! - **pool**: take a ready item (created in the background), append + flush.
//! - **put, 2 of 3**: one whole-object PUT per bucket, done at the second acknowledgement
//!   (today's path on non-appendable buckets; on gcs-rapid a PUT is create + append + finalize);
//!   **put, 1 of 1**: the same to one bucket. Their p99 ratio is what the quorum does to the tail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use weir_common::SystemClock;
use weir_storage::append::ingest::IngestLoader;
use weir_storage::append::memory::MemoryAppendable;
use weir_storage::append::AppendableStore;
use weir_storage::pool::{PoolLoader, PoolSettings, WriterPool};
use weir_storage::{LatencyProfile, ModelStore, QuorumWriter};

const BUCKETS: usize = 3;
const QUORUM: usize = 2;

struct Buckets {
    objects: Vec<Arc<dyn ObjectStore>>,
    appendable: Vec<Arc<dyn AppendableStore>>,
}

impl Buckets {
    /// Pool items (one object per bucket) over these buckets.
    fn loader(&self, seed: u64) -> IngestLoader {
        IngestLoader::new(
            self.appendable.clone(),
            self.objects.clone(),
            QUORUM,
            Arc::new(SystemClock),
            seed,
        )
        .expect("loader")
    }
}

fn buckets(profile: &LatencyProfile) -> Buckets {
    let mut objects = Vec::new();
    let mut appendable = Vec::new();
    for i in 0..BUCKETS {
        let double = match profile.name.as_str() {
            "s3-express" => MemoryAppendable::s3_express(),
            _ => MemoryAppendable::gcs_rapid(),
        };
        let model = ModelStore::new(Arc::new(double.clone()), profile.clone(), 17 + i as u64)
            .expect("valid profile");
        appendable.push(model.appendable(Arc::new(double)));
        objects.push(Arc::new(model) as Arc<dyn ObjectStore>);
    }
    Buckets {
        objects,
        appendable,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn summary(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "| {name} | {} | {:.2} | {:.2} |",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (p50, p99)
}

async fn create_per_file(
    b: &Buckets,
    writer: &QuorumWriter,
    files: usize,
    body: &Bytes,
) -> Vec<Duration> {
    let loader = b.loader(1);
    let mut samples = Vec::with_capacity(files);
    for _ in 0..files {
        let start = Instant::now();
        let item = loader.load().await.expect("create");
        writer
            .append_flush(&item.key, item.writers, std::slice::from_ref(body))
            .await
            .expect("append");
        samples.push(start.elapsed());
    }
    samples
}

async fn pooled(b: &Buckets, writer: &QuorumWriter, files: usize, body: &Bytes) -> Vec<Duration> {
    let loader = b.loader(2);
    let pool = WriterPool::start(loader, PoolSettings::default());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut samples = Vec::with_capacity(files);
    for _ in 0..files {
        let start = Instant::now();
        let item = pool.take().await.expect("take");
        writer
            .append_flush(&item.key, item.writers, std::slice::from_ref(body))
            .await
            .expect("append");
        samples.push(start.elapsed());
        // One file per 5 ms flush interval, as an agent under load.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = pool.stats();
    println!(
        "<!-- pool: {} hits, {} misses, {} created -->",
        stats.hits, stats.misses, stats.created
    );
    pool.shutdown().await;
    samples
}

async fn put(writer: &QuorumWriter, files: usize, body: &Bytes) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(files);
    for i in 0..files {
        let start = Instant::now();
        writer
            .put(
                &Path::from(format!("put/{i}")),
                PutPayload::from(body.clone()),
            )
            .await
            .expect("put");
        samples.push(start.elapsed());
    }
    samples
}

async fn timer_floor(samples: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(2)).await;
        out.push(start.elapsed());
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let profile_name = args.first().map_or("gcs-rapid", String::as_str);
    let files: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(400);
    let file_bytes: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64 << 10);
    let profile = LatencyProfile::named(profile_name).expect("known profile");
    let body = Bytes::from(vec![7u8; file_bytes]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let b = buckets(&profile);
        let writer = QuorumWriter::new(b.objects.clone(), QUORUM).expect("quorum");
        println!(
            "profile {profile_name}, {files} files of {file_bytes} B, {QUORUM} of {BUCKETS} buckets"
        );
        println!("| path | files | p50 ms | p99 ms |");
        println!("|---|---|---|---|");
        // What the harness adds: tokio's timer has a 1 ms tick, so a modelled 2 ms sleep takes
        // up to a tick longer. The pool row carries this on top of the modelled append + flush.
        summary("timer floor: sleep(2 ms)", timer_floor(files).await);
        let (c50, c99) = summary(
            "create-per-file",
            create_per_file(&b, &writer, files, &body).await,
        );
        let (p50, p99) = summary("pool", pooled(&b, &writer, files, &body).await);
        let (_, q99) = summary("put, 2 of 3", put(&writer, files, &body).await);
        let single = QuorumWriter::new(vec![b.objects[0].clone()], 1).expect("single");
        let (_, s99) = summary("put, 1 of 1", put(&single, files, &body).await);
        println!(
            "\ncreate-per-file / pool: p50 {:.1}x, p99 {:.1}x",
            c50.as_secs_f64() / p50.as_secs_f64(),
            c99.as_secs_f64() / p99.as_secs_f64()
        );
        println!(
            "put p99, 2-of-3 quorum / one bucket: {:.2}x",
            q99.as_secs_f64() / s99.as_secs_f64()
        );
    });
}
