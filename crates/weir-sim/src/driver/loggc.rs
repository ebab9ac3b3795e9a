//! Metadata-log GC in the simulation (RFC 0003 §7): every agent runs it after each snapshot
//! (every 3–40 slots, per seed). After the heal phase the log must be bounded again: at most
//! two snapshot intervals of slots besides the fence slots (live `NewEpoch` records), which GC
//! keeps forever.

use super::*;

/// Slots a writer may complete past a snapshot trigger before the snapshot is taken (its
/// writes in flight), and the few a recovery adds (its `NewEpoch`, hole fillers).
const LOG_BOUND_SLACK: u64 = 8;

impl World {
    /// The liveness of the bound: the live log holds ≤ 2 snapshot intervals of slots besides
    /// fence slots. Also counts, for the report, the slots GC deleted.
    pub(super) async fn check_log_bound(&mut self) {
        let live = self
            .raw_log_seqs(&weir_storage::keys::meta_log_prefix())
            .await;
        let mut fences = 0u64;
        for seq in &live {
            if self.opens_epoch(*seq).await {
                fences += 1;
            }
        }
        let others = live.len() as u64 - fences;
        self.report.log_slots_collected = (self.archive.len() - live.len()) as u64;
        self.report.live_log_slots = others;
        let bound = 2 * self.scenario.snapshot_every + LOG_BOUND_SLACK;
        if others > bound {
            self.violation(format!(
                "the metadata log is not bounded after healing: {others} live slots besides \
                 {fences} fence slots, more than 2 snapshot intervals of {} (+{LOG_BOUND_SLACK})",
                self.scenario.snapshot_every
            ));
        }
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
