use std::time::Duration;

/// Exponential backoff with full jitter, driven by a caller-supplied RNG so it stays deterministic
/// under simulation.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            attempt: 0,
        }
    }

    /// The number of delays handed out so far.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// The next delay: uniformly random in `[0, min(max, initial * 2^attempt)]`.
    pub fn next_delay(&mut self, rng: &mut fastrand::Rng) -> Duration {
        let exponent = self.attempt.min(20);
        self.attempt = self.attempt.saturating_add(1);
        let ceiling = self.initial.saturating_mul(1u32 << exponent).min(self.max);
        let ceiling_micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rng.u64(0..=ceiling_micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_backoff_stays_under_cap() {
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..50 {
            assert!(backoff.next_delay(&mut rng) <= Duration::from_millis(100));
        }
        assert_eq!(backoff.attempts(), 50);
    }
}
