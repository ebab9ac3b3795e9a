//! The orphan sweep of RFC 0003 §6 in the simulation: each incarnation runs a
//! [`OrphanSweeper`] with an orphan age of 0.3–2 s of simulated time, so uploads slowed by a
//! slow bucket (0.1–2 s per request) straddle sweep horizons: their commit must then be
//! refused (`FileTooOld`), since the sweep may have deleted the object. Each incarnation's
//! clock (file ids and horizons) is skewed by up to ±150 ms: no clock is trusted for safety.
//! Draws come from the sweep's own generator, so older fault schedules stay where they were.

use weir_control::sweep::{OrphanSweeper, SweepSettings};

use super::*;

/// What one seed chose about the orphan sweep (`None`: no sweep).
#[derive(Debug, Clone, Default)]
pub(super) struct SweepScenario {
    pub(super) settings: Option<SweepSettings>,
    /// Each incarnation's clock skew is drawn from `-max_skew_ms..=max_skew_ms`.
    pub(super) max_skew_ms: i64,
}

impl SweepScenario {
    pub(super) fn pick(rng: &mut fastrand::Rng) -> SweepScenario {
        let settings = (rng.f64() < 0.6).then(|| SweepSettings {
            orphan_age: Duration::from_millis(rng.u64(300..=2_000)),
            interval: Duration::from_millis(rng.u64(100..=600)),
        });
        SweepScenario {
            settings,
            max_skew_ms: [0, 150][rng.usize(..2)],
        }
    }

    pub(super) fn describe(&self) -> String {
        match &self.settings {
            Some(s) => format!(
                "orphan sweep every {:?} (age {:?}, clock skew ≤{} ms)",
                s.interval, s.orphan_age, self.max_skew_ms
            ),
            None => "no orphan sweep".to_string(),
        }
    }
}

/// An agent's wall clock: the world's, off by a fixed skew.
#[derive(Debug)]
pub(super) struct SkewedClock {
    inner: Arc<dyn Clock>,
    skew_ms: i64,
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> i64 {
        self.inner.now_ms() + self.skew_ms
    }
}

impl World {
    /// The clock a new incarnation's pipeline and sweeper use.
    pub(super) fn agent_clock(&mut self) -> Arc<dyn Clock> {
        let max = self.scenario.sweep.max_skew_ms;
        if max == 0 {
            return self.clock.clone();
        }
        Arc::new(SkewedClock {
            inner: self.clock.clone(),
            skew_ms: self.sweep_rng.i64(-max..=max),
        })
    }

    /// Starts the incarnation's orphan sweep (if the seed has one) until `stop` turns or its
    /// sender is dropped with the incarnation.
    pub(super) fn start_sweeper(
        &self,
        control: ControlPlane,
        stores: Vec<Arc<dyn ObjectStore>>,
        regional: Vec<Arc<dyn ObjectStore>>,
        clock: Arc<dyn Clock>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        if let Some(settings) = self.scenario.sweep.settings {
            tokio::spawn(
                OrphanSweeper::new(control, stores, clock, settings)
                    .with_regional(regional)
                    .run(stop),
            );
        }
    }
}
