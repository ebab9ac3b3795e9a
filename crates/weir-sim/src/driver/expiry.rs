//! Producer expiry (RFC 0003 §4) in the simulation: a seed may give producer ids an expiration
//! of seconds of simulated time, run the maintenance pass that submits `ExpireProducers`, and
//! let idempotent clients go quiet for longer than that. A client that comes back finds its id
//! expired (59) and bumps its epoch locally, re-sending from sequence 0 (see [`crate::client`]).
//! The auditor's replay checks that apply never appends a batch of an unknown producer at a
//! sequence other than 0, and never expires a producer active within the window.

use weir_control::maintenance::{apply_expiry, ExpirySettings};

use super::*;

/// Producer expiry of one seed (its own generator).
#[derive(Debug, Clone, Default)]
pub(super) struct ExpiryScenario {
    /// `producer.id_expiration`; `None`: the maintenance pass never runs.
    pub(super) expiration: Option<Duration>,
    /// Per-step probability of a maintenance pass (a `retention.check_interval` tick).
    pub(super) p_check: f64,
    /// Per-step probability that an idempotent client stops sending new batches and, once
    /// nothing of it is in flight, stays quiet for 1.2–1.6 times the expiration.
    pub(super) p_idle: f64,
}

impl ExpiryScenario {
    /// Expiry only in seeds without process faults (`calm`): with kill -9 and takeovers a batch
    /// can stay unacknowledged longer than an expiration of seconds, and its retry at sequence
    /// 0 would then revive the id and be appended twice. Production keeps that from happening
    /// by a minimum expiration (10 min) far above the clients' delivery timeout (2 min), a
    /// ratio the simulation's compressed time cannot keep with crashes that take seconds.
    pub(super) fn pick(rng: &mut fastrand::Rng, calm: bool) -> ExpiryScenario {
        if rng.f64() < 0.3 || !calm {
            return ExpiryScenario::default();
        }
        ExpiryScenario {
            expiration: Some(Duration::from_millis(rng.u64(800..=3_000))),
            p_check: [0.02, 0.05, 0.1][rng.usize(..3)],
            p_idle: [0.01, 0.02, 0.04][rng.usize(..3)],
        }
    }

    pub(super) fn describe(&self) -> String {
        match self.expiration {
            Some(expiration) => format!(
                "producer ids expire after {expiration:?} (checks {:.0}%, quiet producers {:.1}%)",
                self.p_check * 100.0,
                self.p_idle * 100.0
            ),
            None => "no producer expiry".to_string(),
        }
    }
}

impl World {
    /// Per step of the fault phase: maybe a maintenance pass on the newest live agent, maybe
    /// an idempotent client going quiet.
    pub(super) fn inject_expiry(&mut self) {
        let scenario = self.scenario.expiry.clone();
        let Some(expiration) = scenario.expiration else {
            return;
        };
        if self.expiry_rng.f64() < scenario.p_idle {
            let c = self.expiry_rng.usize(..self.clients.len());
            let client = &mut self.clients[c];
            if client.kind == Kind::Idempotent && !client.quiet() {
                let quiet = expiration.mul_f64(1.2 + self.expiry_rng.f64() * 0.4);
                client.going_quiet = Some(quiet);
                self.report.quiet_producers += 1;
                self.event(&format!("client {c} goes quiet for {quiet:?} once settled"));
            }
        }
        if self.expiry_rng.f64() >= scenario.p_check {
            return;
        }
        let Some(newest) = self.newest_live() else {
            return;
        };
        let control = self.incarnations[newest].control.clone();
        let now_ms = self.clock.now_ms();
        let settings = ExpirySettings {
            producer_id_expiration: expiration,
            ..ExpirySettings::default()
        };
        tokio::spawn(async move { apply_expiry(&control, now_ms, settings).await });
    }

    /// Before a client sends: it wakes from a quiet period, and bumps its epoch once the broker
    /// lost its state and nothing is in flight. `false`: it sends nothing this step.
    pub(super) fn ready_to_send(&mut self, c: usize) -> bool {
        let now = tokio::time::Instant::now();
        let client = &mut self.clients[c];
        if client.idle_until.is_some_and(|until| until <= now) {
            client.idle_until = None;
        }
        if client.settled() {
            if let Some(quiet) = client.going_quiet.take() {
                client.idle_until = Some(now + quiet);
            }
        }
        if !client.bump_pending {
            return true;
        }
        let Some(epoch) = client.bump_epoch() else {
            return false;
        };
        self.report.epoch_bumps += 1;
        self.event(&format!("client {c} bumps its epoch to {epoch}"));
        true
    }
}
