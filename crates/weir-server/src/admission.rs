//! InitProducerId admission: every new producer id is state the control plane keeps until it
//! expires, so a client looping on InitProducerId must not grow it without bound. Each
//! `client.id` gets a token bucket, and the number of live ids has a cap; over either the
//! answer is THROTTLING_QUOTA_EXCEEDED with a throttle time, as KIP-599 throttles admin requests.

use std::collections::HashMap;
use std::sync::Mutex;

/// Client ids whose buckets are remembered; past it, full buckets are forgotten first.
const MAX_TRACKED_CLIENTS: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionSettings {
    /// Tokens per second per client id.
    pub rate: f64,
    /// Bucket size per client id.
    pub burst: u32,
    /// Live producer ids beyond which new ones are refused.
    pub max_producer_ids: usize,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        Self {
            rate: 10.0,
            burst: 100,
            max_producer_ids: 1_000_000,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: i64,
}

#[derive(Debug)]
pub(crate) struct ProducerAdmission {
    settings: AdmissionSettings,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl ProducerAdmission {
    pub(crate) fn new(settings: AdmissionSettings) -> Self {
        Self {
            settings,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// `Ok(())` to admit a new producer id for `client_id` at `now_ms` with `live_ids` live;
    /// else the milliseconds the client should wait.
    pub(crate) fn admit(&self, client_id: &str, now_ms: i64, live_ids: usize) -> Result<(), i32> {
        if live_ids >= self.settings.max_producer_ids {
            // Ids free up only as producers expire: ask for a long wait.
            return Err(60_000);
        }
        let burst = f64::from(self.settings.burst);
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_TRACKED_CLIENTS && !buckets.contains_key(client_id) {
            let rate = self.settings.rate;
            buckets.retain(|_, b| refill(b, now_ms, rate, burst) < burst);
            if buckets.len() >= MAX_TRACKED_CLIENTS {
                // Every tracked client is throttled: a new one shares their fate.
                return Err(self.wait_ms(1.0));
            }
        }
        let bucket = buckets.entry(client_id.to_string()).or_insert(Bucket {
            tokens: burst,
            at_ms: now_ms,
        });
        let tokens = refill(bucket, now_ms, self.settings.rate, burst);
        if tokens >= 1.0 {
            bucket.tokens = tokens - 1.0;
            bucket.at_ms = now_ms.max(bucket.at_ms);
            Ok(())
        } else {
            Err(self.wait_ms(1.0 - tokens))
        }
    }

    fn wait_ms(&self, missing_tokens: f64) -> i32 {
        ((missing_tokens / self.settings.rate) * 1000.0)
            .ceil()
            .clamp(1.0, 60_000.0) as i32
    }
}

/// The bucket's tokens at `now_ms` (not stored).
fn refill(bucket: &Bucket, now_ms: i64, rate: f64, burst: f64) -> f64 {
    let elapsed = (now_ms - bucket.at_ms).max(0) as f64 / 1000.0;
    (bucket.tokens + elapsed * rate).min(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_admission_bucket_per_client_and_id_cap() {
        let admission = ProducerAdmission::new(AdmissionSettings {
            rate: 2.0,
            burst: 3,
            max_producer_ids: 10,
        });
        for _ in 0..3 {
            assert_eq!(admission.admit("a", 0, 0), Ok(()));
        }
        // Burst spent: 1 token at 2/s is 500 ms away.
        assert_eq!(admission.admit("a", 0, 0), Err(500));
        // Another client has its own bucket.
        assert_eq!(admission.admit("b", 0, 0), Ok(()));
        // Half a second later one token is back.
        assert_eq!(admission.admit("a", 500, 0), Ok(()));
        assert!(admission.admit("a", 500, 0).is_err());
        // The cap on live ids refuses everyone.
        assert!(admission.admit("c", 10_000, 10).is_err());
    }
}
