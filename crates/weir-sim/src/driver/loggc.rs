//! Metadata-log GC in the simulation (RFC 0003 §7): every agent runs it after each snapshot
//! (every 3–40 slots, per seed). After the heal phase the log must be bounded again: at most
//! two snapshot intervals of slots besides the fence slots (live `NewEpoch` records), which GC
//! keeps forever.

use super::*;

/// Slots a writer may complete past a snapshot trigger before the snapshot is taken (its
/// writes in flight), and the few a recovery adds (its `NewEpoch`, hole fillers).
const LOG_BOUND_SLACK: u64 = 8;

impl World {
    /// The liveness of the bound, after healing: once the serving writer writes (new producers
    /// connecting, one per step, at most eight snapshot intervals of them), its next snapshot's
    /// GC brings the live log down to ≤ 2 snapshot intervals of slots besides fence slots. (A
    /// writer killed during its GC leaves what it had not deleted to the next snapshot's GC,
    /// so the bound is checked only once some writer has written.) Also counts, for the
    /// report, the slots GC deleted.
    pub(super) async fn check_log_bound(&mut self) {
        let bound = 2 * self.scenario.snapshot_every + LOG_BOUND_SLACK;
        let mut step = self.step + 1;
        // A snapshot that spans many chunks takes hundreds of steps to write and read back (one
        // at a time), during which triggers are skipped: allow several of them.
        let mut rounds = 8 * self.scenario.snapshot_every + LOG_BOUND_SLACK;
        let (mut others, mut fences) = self.live_log_slots().await;
        while others > bound && rounds > 0 {
            rounds -= 1;
            if let Some(serving) = self.newest_live() {
                let control = self.incarnations[serving].control.clone();
                tokio::spawn(async move {
                    let _ = control.submit(Entry::init_producer_id(None, 0)).await;
                });
            }
            self.step = step;
            step += 1;
            self.tick(false).await;
            (others, fences) = self.live_log_slots().await;
        }
        // Writing ends there: a snapshot job still running (one at a time, each slot
        // meanwhile grows the log) gets to finish and collect.
        let mut idle = 8 * self.scenario.snapshot_every + LOG_BOUND_SLACK;
        while others > bound && idle > 0 {
            idle -= 1;
            self.step = step;
            step += 1;
            self.tick(false).await;
            (others, fences) = self.live_log_slots().await;
        }
        self.report.live_log_slots = others;
        self.report.log_slots_collected =
            (self.archive.len() as u64).saturating_sub(others + fences);
        if others > bound {
            self.violation(format!(
                "the metadata log is not bounded after healing: {others} live slots besides \
                 {fences} fence slots, more than 2 snapshot intervals of {} (+{LOG_BOUND_SLACK})",
                self.scenario.snapshot_every
            ));
        }
    }

    /// Live log slots in the metadata bucket: (others, fence slots).
    async fn live_log_slots(&self) -> (u64, u64) {
        let live = self
            .raw_log_seqs(&weir_storage::keys::meta_log_prefix())
            .await;
        let mut fences = 0u64;
        for seq in &live {
            if self.opens_epoch(*seq).await {
                fences += 1;
            }
        }
        (live.len() as u64 - fences, fences)
    }

    /// The sequence numbers under `prefix` in the metadata bucket (slots, snapshots), ascending.
    pub(super) async fn raw_log_seqs(&self, prefix: &object_store::path::Path) -> Vec<u64> {
        let mut seqs: Vec<u64> = self
            .log_bucket
            .raw
            .list(Some(prefix))
            .filter_map(|meta| async move {
                meta.ok()
                    .and_then(|m| weir_storage::keys::parse_seq_key(&m.location))
            })
            .collect()
            .await;
        seqs.sort_unstable();
        seqs
    }

    /// Whether the bucket's slot `seq` holds a record that opens an epoch (a fence slot).
    async fn opens_epoch(&self, seq: u64) -> bool {
        let key = weir_storage::keys::meta_log(seq);
        let Ok(found) = self.log_bucket.raw.get(&key).await else {
            return false;
        };
        let Ok(bytes) = found.bytes().await else {
            return false;
        };
        weir_format::decode_envelope(&bytes)
            .ok()
            .and_then(|envelope| {
                serde_json::from_slice::<weir_control::log::LogRecord>(envelope.payload).ok()
            })
            .is_some_and(|record| matches!(record.entries.first(), Some(Entry::NewEpoch { .. })))
    }
}

/// How long an armed switch waits for a log write to hold before giving up (an idle writer).
const CATCH_LIMIT: Duration = Duration::from_secs(1);
/// Longest a write is held: released then even if the log has not been collected past it.
const HOLD_LIMIT: Duration = Duration::from_secs(8);
/// `InitProducerId` entries per step submitted to the serving writer while a write is held (new
/// producers connecting to it), so it writes, snapshots and collects past the held slot even
/// when its clients are all attached to the paused one.
const FILLER_PER_STEP: usize = 2;

/// One paused log write in progress.
pub(super) struct SlotHoldFault {
    kind: HoldKind,
    /// The incarnation whose write is held.
    number: u32,
    since: tokio::time::Instant,
    released: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldKind {
    /// A serving writer's slot PUT is held; a second writer takes over once it is.
    HeldPut { takeover: bool },
    /// A recovery's `NewEpoch` PUT is held (after its claim and replay) while the serving
    /// writer goes on; when it is released the others stop (a rolling restart).
    StalledRecovery,
}

impl World {
    /// Maybe starts a paused log write: only with one writer serving and nothing opening.
    pub(super) fn inject_slot_holds(&mut self) {
        let draw = self.loggc_rng.f64();
        let quiet = self.slot_hold.is_none()
            && self.opening == 0
            && self.overlap.is_none()
            && self.topic.is_some()
            && self.live().count() == 1;
        let (p_held, p_stalled) = (self.scenario.p_held_put, self.scenario.p_stalled_recovery);
        if !quiet || draw >= p_held + p_stalled {
            return;
        }
        let kind = if draw < p_held {
            let serving = self.newest_live().expect("one live");
            let number = self.incarnations[serving].number;
            self.log_holds[number as usize].arm();
            self.event(&format!("held slot PUT: incarnation {number} armed"));
            (HoldKind::HeldPut { takeover: false }, number)
        } else {
            let number = self.start_open();
            self.log_holds[number as usize].arm();
            self.report.stalled_recoveries += 1;
            self.event(&format!(
                "stalled recovery: {number} opens, its NewEpoch held"
            ));
            (HoldKind::StalledRecovery, number)
        };
        self.slot_hold = Some(SlotHoldFault {
            kind: kind.0,
            number: kind.1,
            since: tokio::time::Instant::now(),
            released: false,
        });
    }

    /// Whether incarnation `number` is spared by crashes while a write is held: the paused
    /// writer, and during a stalled recovery the serving writer, which must go on writing.
    pub(super) fn spared(&self, number: u32) -> bool {
        self.slot_hold.as_ref().is_some_and(|hold| {
            !hold.released && (hold.number == number || hold.kind == HoldKind::StalledRecovery)
        })
    }

    /// Moves a paused write along: the takeover once a PUT is held, filler entries for the
    /// serving writer, the release once the log was collected past the held slot (GC after the
    /// second snapshot covering it deletes up to the first) or after [`HOLD_LIMIT`].
    pub(super) async fn progress_slot_hold(&mut self) {
        let Some(hold) = &self.slot_hold else {
            return;
        };
        let (kind, number, since, released) = (hold.kind, hold.number, hold.since, hold.released);
        let switch = self.log_holds[number as usize].clone();
        let Some(seq) = switch.caught() else {
            // An idle writer wrote nothing to hold; a recovery still claiming or replaying
            // (a metadata outage) opens without a pause.
            let limit = match kind {
                HoldKind::HeldPut { .. } => CATCH_LIMIT,
                HoldKind::StalledRecovery => HOLD_LIMIT,
            };
            if since.elapsed() > limit {
                switch.disarm();
                self.slot_hold = None;
            }
            return;
        };
        if kind == (HoldKind::HeldPut { takeover: false }) {
            self.report.held_slot_puts += 1;
            self.event(&format!(
                "held slot PUT: incarnation {number} holds slot {seq}; takeover"
            ));
            self.start_open();
            self.set_hold_kind(HoldKind::HeldPut { takeover: true });
        }
        if released {
            return;
        }
        self.submit_filler(number);
        let covering = self
            .raw_log_seqs(&weir_storage::keys::meta_snapshot_prefix())
            .await
            .into_iter()
            .filter(|snapshot| *snapshot >= seq)
            .count();
        // GC after the second snapshot covering the slot may delete it; a writer starts its
        // third snapshot only once that GC finished. A slot already gone (it was no fence)
        // is released at once.
        let collected = covering >= 3
            || (covering >= 2
                && !self
                    .raw_log_seqs(&weir_storage::keys::meta_log_prefix())
                    .await
                    .contains(&seq));
        if collected || since.elapsed() > HOLD_LIMIT {
            if collected {
                match kind {
                    HoldKind::HeldPut { .. } => self.report.held_puts_collected += 1,
                    HoldKind::StalledRecovery => self.report.stalled_recoveries_collected += 1,
                }
            }
            self.release_slot_hold();
        }
    }

    fn set_hold_kind(&mut self, kind: HoldKind) {
        if let Some(hold) = &mut self.slot_hold {
            hold.kind = kind;
        }
    }

    /// Lets the held write go; a held PUT's fault ends there, a stalled recovery's when it
    /// opened.
    pub(super) fn release_slot_hold(&mut self) {
        let Some(hold) = &mut self.slot_hold else {
            return;
        };
        if hold.released {
            return;
        }
        hold.released = true;
        let (number, kind) = (hold.number, hold.kind);
        self.log_holds[number as usize].release();
        self.event(&format!(
            "paused log write of incarnation {number} released"
        ));
        if kind != HoldKind::StalledRecovery {
            self.slot_hold = None;
            return;
        }
        // A rolling restart: the old agents stop while the new one is paused, so nothing
        // writes past the log's end when it resumes (a stale state would go unnoticed there).
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        for index in live {
            self.halt(index);
        }
    }

    /// New producers connect to the newest live writer other than the paused one.
    fn submit_filler(&mut self, paused: u32) {
        let Some(serving) = self.newest_live() else {
            return;
        };
        if self.incarnations[serving].number == paused {
            return;
        }
        for _ in 0..FILLER_PER_STEP {
            let control = self.incarnations[serving].control.clone();
            tokio::spawn(async move {
                let _ = control.submit(Entry::init_producer_id(None, 0)).await;
            });
        }
    }

    /// An agent finished opening: a stalled recovery that opened replaces every other agent.
    pub(super) fn slot_hold_opened(&mut self, number: u32, opened: bool) {
        let stalled = self
            .slot_hold
            .as_ref()
            .is_some_and(|hold| hold.number == number && hold.kind == HoldKind::StalledRecovery);
        if !stalled {
            return;
        }
        // A failed open released nothing still held; the switch stays armed for no one.
        self.log_holds[number as usize].disarm();
        self.slot_hold = None;
        if opened {
            self.event("stalled recovery opened: the others stop");
            let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
            for index in live {
                self.halt(index);
            }
        }
    }
}
