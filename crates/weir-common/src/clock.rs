use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How much later than asked a `tokio::time` timer fires on average, less the ~0.1 ms a wake-up
/// takes anyway. tokio's timer wheel ticks once a millisecond and rounds every deadline up to a
/// tick, and the driver wakes up to a tick later still: measured 1.1–1.2 ms for 1–7 ms sleeps,
/// 1.3 ms beside a busy loop on the same core (`cargo bench -p weir-storage --bench
/// model_clock`, docs/benchmarks.md §23). Code on real time that needs a deadline met on
/// average arms its timer this much early; under a paused clock (tests, the simulator) timers
/// are exact and nothing is compensated.
pub const TOKIO_TIMER_LAG: Duration = Duration::from_millis(1);

/// Wall-clock time in milliseconds since the Unix epoch.
///
/// Library code never calls `SystemTime::now` directly; it asks an injected clock.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now_ms(&self) -> i64;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)]
    fn now_ms(&self) -> i64 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told to, for tests and simulation.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicI64>,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Self {
        Self {
            now_ms: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    pub fn advance_ms(&self, delta_ms: i64) {
        self.now_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }

    pub fn set_ms(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance_ms(5);
        assert_eq!(clock.now_ms(), 1_005);
        clock.set_ms(7);
        assert_eq!(clock.now_ms(), 7);
    }
}
