//! Constructors of the Prometheus metrics Weir's crates export (docs/operations.md, "Metrics").
//!
//! Each component creates its metrics unregistered and the agent registers them in its own
//! registry, so several agents in one process (tests, the simulator) never share counters. A name,
//! help text or label set the Prometheus client refuses is a programming error: these panic.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

/// Bucket bounds, in seconds, of every latency histogram Weir exports (`weir_*_seconds`): from
/// 0.5 ms (an append + flush on GCS Rapid) to 30 s (a request past every storage deadline), so
/// dashboards can compare stages on one scale.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0,
];

pub fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(Opts::new(name, help)).expect("valid metric")
}

pub fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

pub fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::with_opts(Opts::new(name, help)).expect("valid metric")
}

pub fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

pub fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric")
}

/// A histogram of seconds on [`LATENCY_BUCKETS`].
pub fn latency(name: &str, help: &str) -> Histogram {
    histogram(name, help, LATENCY_BUCKETS.to_vec())
}

/// A labelled histogram of seconds on [`LATENCY_BUCKETS`].
pub fn latency_vec(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        labels,
    )
    .expect("valid metric")
}
