//! Backlog runs (`consumerBacklogSizeGB`): the producers build a backlog before any consumer
//! reads, then the consumers read it from the beginning and the run times their catch-up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::run::{Counters, Options};

/// How often a backlog run checks whether its consumers caught up.
pub(crate) const CATCH_UP_POLL: Duration = Duration::from_millis(20);
/// A backlog that has not grown for this long is not going to be built.
const BACKLOG_STALL: Duration = Duration::from_secs(60);

/// A consumer group's position in one partition: (subscription, topic index, partition).
pub(crate) type Position = (u32, usize, i32);

/// The catch-up of a backlog run in progress.
pub(crate) struct CatchUpRun {
    /// Messages and bytes acknowledged when the consumers started, over all subscriptions.
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    /// Every group's partitions and the end offsets the backlog reaches in them.
    pub(crate) ends: Vec<(Position, i64)>,
    pub(crate) started: Instant,
    /// Time to read the backlog, and the bytes read by then.
    pub(crate) done: Option<(Duration, u64)>,
}

impl CatchUpRun {
    /// Whether every group has read every partition up to its end offset at the start: the
    /// backlog is read even while producers add more (a count of messages would also count
    /// newer messages of partitions read faster).
    pub(crate) fn backlog_read(&self, counters: &Counters) -> bool {
        let positions = counters.positions.lock().expect("positions");
        self.ends
            .iter()
            .all(|(key, end)| *end <= 0 || positions.get(key).is_some_and(|next| next >= end))
    }
}

/// The end offsets of `topics`' partitions now, for each of `subscriptions`.
pub(crate) fn end_offsets(
    opts: &Options,
    topics: &[String],
    partitions: i32,
    subscriptions: u32,
) -> anyhow::Result<Vec<(Position, i64)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &opts.bootstrap)
        .create()
        .context("watermark client")?;
    let mut ends = Vec::new();
    for (index, topic) in topics.iter().enumerate() {
        for partition in 0..partitions {
            let (_, high) = consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(30))
                .with_context(|| format!("end offset of {topic}/{partition}"))?;
            for subscription in 0..subscriptions {
                ends.push(((subscription, index, partition), high));
            }
        }
    }
    Ok(ends)
}

/// Waits until the producers have had `target` bytes acknowledged.
pub(crate) fn build_backlog(
    counters: &Counters,
    target: u64,
    progress: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let (mut last_progress, mut last_growth, mut last_bytes) = (started, started, 0);
    let mib = |b: u64| b as f64 / 1048576.0;
    loop {
        let bytes = counters.acked_bytes.load(Ordering::Relaxed);
        let now = Instant::now();
        if bytes >= target {
            eprintln!(
                "backlog of {:.1} MiB built in {:.1} s: starting the consumers",
                mib(bytes),
                (now - started).as_secs_f64()
            );
            return Ok(());
        }
        if bytes > last_bytes {
            (last_growth, last_bytes) = (now, bytes);
        }
        if now - last_growth > BACKLOG_STALL {
            anyhow::bail!(
                "the backlog stopped growing at {:.1} MiB of {:.1} MiB ({} errors)",
                mib(bytes),
                mib(target),
                counters.errors.load(Ordering::Relaxed)
            );
        }
        if !progress.is_zero() && now >= last_progress + progress {
            eprintln!(
                "[backlog] {:.1} of {:.1} MiB acknowledged ({:.2} MiB/s)",
                mib(bytes),
                mib(target),
                mib(bytes) / (now - started).as_secs_f64()
            );
            last_progress = now;
        }
        std::thread::sleep(CATCH_UP_POLL);
    }
}
