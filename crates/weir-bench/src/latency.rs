//! Latency histograms: each client's whole-run and since-last-progress ones, a producer's
//! publish latency split as OpenMessaging Benchmark splits it (the per-message opaque that
//! carries its times), and every client's merged for a report.

use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

use crate::report;

/// Whole-run and since-last-progress histograms of one client.
pub(crate) struct Hists {
    total: Histogram<u64>,
    interval: Histogram<u64>,
}

impl Hists {
    pub(crate) fn new() -> Self {
        Hists {
            total: report::new_histogram(),
            interval: report::new_histogram(),
        }
    }
    pub(crate) fn record(&mut self, us: u64) {
        report::record(&mut self.total, us);
        report::record(&mut self.interval, us);
    }

    /// What was recorded since the last call (a progress line), and a fresh interval.
    pub(crate) fn take_interval(&mut self) -> Histogram<u64> {
        let out = self.interval.clone();
        self.interval.reset();
        out
    }

    /// Forgets everything recorded (the warm-up ends); returns an empty histogram.
    pub(crate) fn reset(&mut self) -> Histogram<u64> {
        self.total.reset();
        self.interval.reset();
        report::new_histogram()
    }

    /// Everything recorded since the last reset.
    pub(crate) fn clone_total(&mut self) -> Histogram<u64> {
        self.total.clone()
    }
}

/// A producer's latencies, as OpenMessaging Benchmark splits them at a fixed rate.
pub(crate) struct ProducerHists {
    /// Acknowledged − intended send time: what the benchmark's latency goals are judged on.
    publish: Hists,
    /// Acknowledged − the time the message was first handed to the client (OMB's publish
    /// latency; a wait on a full client queue counts here, as in OMB).
    from_send: Hists,
    /// Handed to the client − intended send time (OMB's publish delay): how far the load
    /// generator itself lagged its schedule.
    delay: Hists,
}

impl ProducerHists {
    pub(crate) fn new() -> Self {
        ProducerHists {
            publish: Hists::new(),
            from_send: Hists::new(),
            delay: Hists::new(),
        }
    }

    /// One message acknowledged at `now_us` (microseconds since the epoch), sent with `opaque`.
    pub(crate) fn record(&mut self, now_us: u64, opaque: usize) {
        let (intended, sent) = unpack_opaque(opaque);
        let now = now_us as u32;
        self.publish.record(u64::from(now.wrapping_sub(intended)));
        self.from_send.record(u64::from(now.wrapping_sub(sent)));
        self.delay.record(u64::from(sent.wrapping_sub(intended)));
    }
}

// The opaque carries two 32-bit times.
const _: () = assert!(usize::BITS >= 64);

/// The per-message opaque: the intended send time and the time the message was handed to the
/// client, each in microseconds since the epoch modulo 2³² (~71.6 minutes). Differences are
/// taken with wrapping arithmetic, so every latency below ~71.6 minutes (the histograms stop at
/// an hour) is exact however long the run.
pub(crate) fn pack_opaque(intended_us: u64, sent_us: u64) -> usize {
    (u64::from(intended_us as u32) | (u64::from(sent_us as u32) << 32)) as usize
}

fn unpack_opaque(opaque: usize) -> (u32, u32) {
    let opaque = opaque as u64;
    (opaque as u32, (opaque >> 32) as u32)
}

/// Every client's histograms merged.
pub(crate) struct Merged {
    pub(crate) publish: Histogram<u64>,
    pub(crate) from_send: Histogram<u64>,
    pub(crate) delay: Histogram<u64>,
    pub(crate) end_to_end: Histogram<u64>,
}

impl Default for Merged {
    fn default() -> Self {
        Merged {
            publish: report::new_histogram(),
            from_send: report::new_histogram(),
            delay: report::new_histogram(),
            end_to_end: report::new_histogram(),
        }
    }
}

/// Every producer's and consumer's histograms merged, each taken with `which`.
pub(crate) fn merge(
    producers: &[Arc<Mutex<ProducerHists>>],
    consumers: &[Arc<Mutex<Hists>>],
    which: &dyn Fn(&mut Hists) -> Histogram<u64>,
) -> Merged {
    let mut out = Merged::default();
    for s in producers {
        let mut s = s.lock().expect("producer histograms");
        let _ = out.publish.add(which(&mut s.publish));
        let _ = out.from_send.add(which(&mut s.from_send));
        let _ = out.delay.add(which(&mut s.delay));
    }
    for s in consumers {
        let _ = out
            .end_to_end
            .add(which(&mut s.lock().expect("consumer histograms")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Latency;

    #[test]
    fn test_opaque_carries_intended_and_send_times() {
        for (intended, sent) in [(0, 0), (1, 2), (3_600_000_000, 3_600_001_500)] {
            assert_eq!(
                unpack_opaque(pack_opaque(intended, sent)),
                (intended as u32, sent as u32)
            );
        }
    }

    #[test]
    fn test_publish_latency_splits_into_send_delay_and_time_from_send() {
        let mut hists = ProducerHists::new();
        // Due at 1 ms, handed to the client at 1.25 ms, acknowledged at 10 ms.
        hists.record(10_000, pack_opaque(1_000, 1_250));
        // The same message in a run long enough for its times to wrap 32 bits in between.
        let base = (1u64 << 32) - 2_000;
        hists.record(base + 10_000, pack_opaque(base + 1_000, base + 1_250));
        let ms = |h: &Hists| {
            let l = Latency::from_histogram(&h.total);
            assert_eq!(l.count, 2);
            (l.p50_ms, l.max_ms)
        };
        let close =
            |(a, b): (f64, f64), want: f64| (a - want).abs() < 0.01 && (b - want).abs() < 0.01;
        assert!(close(ms(&hists.publish), 9.0));
        assert!(close(ms(&hists.from_send), 8.75));
        assert!(close(ms(&hists.delay), 0.25));
    }
}
