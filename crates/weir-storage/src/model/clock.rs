//! How the model waits out a sampled latency.
//!
//! Tests and the simulator wait on `tokio::time`, whose paused clock makes them instant and
//! deterministic. A real agent on a modelled profile needs waits that last, on average, what the
//! profile says. tokio's timer wheel ticks once a millisecond and rounds every deadline up to a
//! tick, and the driver wakes up to a tick later still: a 6 ms `tokio::time::sleep` takes
//! 7.1 ms on average on this machine (`cargo bench -p weir-storage --bench model_clock`), so
//! every modelled request would pay about a millisecond its profile does not ask for, and every
//! latency benchmark on a modelled profile would carry that error.
//!
//! [`ModelClock::Compensated`] asks tokio for [`TOKIO_TIMER_LAG`] less. Its mean then matches
//! the profile to about 0.1 ms, with up to a millisecond of uniform jitter, far inside the
//! profiles' own spread; a delay within the lag is not waited at all. It costs the agent no
//! more CPU than before. A timer thread with sub-millisecond wake-ups was tried first: as
//! precise, but it adds a thread hop and a context switch to every modelled request, which a
//! real bucket's answer (read by tokio's I/O driver, as its timers are) does not cost.

use std::time::Duration;

use weir_common::TOKIO_TIMER_LAG;

/// Which clock a [`ModelStore`](super::ModelStore) waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelClock {
    /// `tokio::time`: pausable and deterministic, millisecond granularity (tests, simulator).
    #[default]
    Tokio,
    /// `tokio::time` less its measured lag: real time whose mean matches the profile (a real
    /// agent on a modelled profile).
    Compensated,
}

impl ModelClock {
    /// Waits `delay` on this clock.
    pub(super) async fn sleep(self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        match self {
            ModelClock::Tokio => tokio::time::sleep(delay).await,
            // Even a zero sleep waits for the next tick, so a delay within the lag (a small
            // payload's transfer time) costs nothing rather than a millisecond.
            ModelClock::Compensated => match delay.checked_sub(TOKIO_TIMER_LAG) {
                Some(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
                _ => tokio::task::yield_now().await,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn test_the_tokio_clock_follows_a_paused_runtime() {
        let start = tokio::time::Instant::now();
        ModelClock::Tokio.sleep(Duration::from_secs(3_600)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3_600));
    }

    #[tokio::test(start_paused = true)]
    async fn test_the_compensated_clock_asks_tokio_for_its_lag_less() {
        let start = tokio::time::Instant::now();
        ModelClock::Compensated
            .sleep(Duration::from_millis(6))
            .await;
        assert_eq!(start.elapsed(), Duration::from_millis(5));
        // Never below zero.
        let start = tokio::time::Instant::now();
        ModelClock::Compensated
            .sleep(Duration::from_micros(300))
            .await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
