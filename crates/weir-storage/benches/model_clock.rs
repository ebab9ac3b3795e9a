//! How long a modelled request really takes against what the profile charges, per clock.
//!
//! `cargo bench -p weir-storage --bench model_clock [-- MILLIS REQUESTS CONCURRENCY]` (defaults:
//! 6 ms, 400 requests, 8 at a time). Every request is a PUT on a constant-latency profile over an
//! in-memory store, on a two-worker tokio runtime (real time), so the time above `MILLIS` is the
//! clock's error (plus scheduling). Prints mean, p50 and p99 of the excess, for
//! `ModelClock::Tokio` (millisecond timer wheel) and `ModelClock::Compensated` (the agent's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use weir_storage::{LatencyProfile, ModelClock, ModelStore};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let millis = args.first().copied().unwrap_or(6);
    let requests = args.get(1).copied().unwrap_or(400) as usize;
    let concurrency = args.get(2).copied().unwrap_or(8) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("constant {millis} ms PUT, {requests} requests, {concurrency} at a time");
    for clock in [ModelClock::Tokio, ModelClock::Compensated] {
        let profile = LatencyProfile::constant("bench", Duration::from_millis(millis));
        let store = Arc::new(
            ModelStore::with_clock(Arc::new(InMemory::new()), profile, 1, clock).expect("model"),
        );
        let mut excess: Vec<f64> = runtime.block_on(async {
            stream::iter(0..requests)
                .map(|i| {
                    let store = Arc::clone(&store);
                    async move {
                        let start = Instant::now();
                        let path = Path::from(format!("o/{i}"));
                        store
                            .put(&path, Bytes::from_static(b"x").into())
                            .await
                            .expect("put");
                        start.elapsed().as_secs_f64() * 1e3 - millis as f64
                    }
                })
                .buffer_unordered(concurrency)
                .collect()
                .await
        });
        excess.sort_by(f64::total_cmp);
        let mean = excess.iter().sum::<f64>() / excess.len() as f64;
        let at = |q: f64| excess[((excess.len() - 1) as f64 * q) as usize];
        println!(
            "{clock:?}: excess mean {mean:.3} ms, p50 {:.3} ms, p99 {:.3} ms",
            at(0.5),
            at(0.99)
        );
    }
}
