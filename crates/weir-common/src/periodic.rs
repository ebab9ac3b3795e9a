//! Background passes that run on an interval until the agent stops.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Interval, MissedTickBehavior};

/// A period in milliseconds for comparing with wall-clock times (saturating).
pub fn millis(period: Duration) -> i64 {
    i64::try_from(period.as_millis()).unwrap_or(i64::MAX)
}

/// An interval for a background pass: a pass that overruns delays the next one instead of
/// bursting to catch up.
pub fn pass_interval(period: Duration) -> Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks
}

/// Waits for the next tick. `false` once `stop` is (or turns) true, or its sender is gone.
pub async fn next_pass(ticks: &mut Interval, stop: &mut watch::Receiver<bool>) -> bool {
    loop {
        if *stop.borrow() {
            return false;
        }
        tokio::select! {
            // Biased: the simulator replays a seed exactly only without tokio's random choice.
            biased;
            _ = ticks.tick() => return !*stop.borrow(),
            changed = stop.changed() => {
                if changed.is_err() {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn test_next_pass_ticks_until_stopped() {
        let (stop_tx, mut stop) = watch::channel(false);
        let mut ticks = pass_interval(Duration::from_secs(5));
        assert!(
            next_pass(&mut ticks, &mut stop).await,
            "the first tick is immediate"
        );
        assert!(next_pass(&mut ticks, &mut stop).await);
        let waiting = tokio::spawn(async move { next_pass(&mut ticks, &mut stop).await });
        tokio::task::yield_now().await;
        stop_tx.send(true).unwrap();
        assert!(!waiting.await.unwrap(), "a stop ends the wait");
    }
}
