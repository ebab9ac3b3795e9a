//! Backlog runs (`consumerBacklogSizeGB`): the producers build a backlog before any consumer
//! reads, then the consumers read it from the beginning and the run times their catch-up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::run::Counters;

/// How often a backlog run checks whether its consumers caught up.
pub(crate) const CATCH_UP_POLL: Duration = Duration::from_millis(20);
/// A backlog that has not grown for this long is not going to be built.
const BACKLOG_STALL: Duration = Duration::from_secs(60);

/// The catch-up of a backlog run in progress.
pub(crate) struct CatchUpRun {
    /// Messages and bytes to read (the backlog, over all subscriptions).
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) started: Instant,
    /// Time to read the backlog, and the bytes read by then.
    pub(crate) done: Option<(Duration, u64)>,
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
