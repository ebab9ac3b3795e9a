//! What one seed did and found.

use std::fmt;

use crate::audit::Breaches;

/// What one seed did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    /// The deployment and fault mix the seed chose.
    pub scenario: String,
    pub steps: u32,
    pub sim_millis: u64,
    pub requests: u64,
    pub acked_batches: u64,
    pub acked_records: u64,
    /// Sends of an idempotent batch after its first.
    pub resends: u64,
    /// Plain batches that failed or went unanswered (not retried; may or may not be in the log).
    pub plain_unacked: u64,
    /// Idempotent sends the control plane refused as out of sequence (retried in order).
    pub out_of_sequence: u64,
    pub crashes: u32,
    pub takeovers: u32,
    pub bucket_outages: u32,
    pub slowdowns: u32,
    pub log_outages: u32,
    pub failed_opens: u32,
    /// Two agents recovering at once, the first one's claim overtaken by the second (slow
    /// first recovery): the interleaving of a rolling restart that starts the new agent early.
    pub overlapping_recoveries: u32,
    /// Claims lost to a later writer and made again while opening (`EpochTaken`).
    pub overtaken_claims: u32,
    /// Most dead log slots (written by a deposed writer) one replay skipped.
    pub dead_slots: u64,
    /// Create-only PUTs of the metadata bucket answered `AlreadyExists` with nothing written.
    pub create_conflicts: u64,
    /// Times the metadata bucket turned slow.
    pub slow_logs: u32,
    /// Times a data bucket's PUTs started lagging.
    pub put_lags: u32,
    /// Retention passes (`apply_retention` with the simulated clock).
    pub retention_ticks: u32,
    /// DeleteRecords entries submitted (at random offsets, some invalid).
    pub delete_records: u32,
    /// Offsets the durable log starts moved forward by, over all partitions.
    pub log_start_advance: u64,
    /// Metadata-log slots log GC deleted (written, no longer in the bucket at the end).
    pub log_slots_collected: u64,
    /// Live metadata-log slots at the end, fence slots not counted.
    pub live_log_slots: u64,
    /// Slot PUTs of a serving writer held while a second one took over; of those, released
    /// only once two snapshots covered the held slot (GC collected up to it).
    pub held_slot_puts: u32,
    pub held_puts_collected: u32,
    /// Recoveries whose `NewEpoch` PUT was held; of those, released once collected past.
    pub stalled_recoveries: u32,
    pub stalled_recoveries_collected: u32,
    /// Idempotent clients that went quiet longer than the producer id expiration.
    pub quiet_producers: u32,
    /// Refusals telling a client its producer state was gone (59, or a lost partition state).
    pub lost_producer_state: u64,
    /// Local epoch bumps after those, and batches of unknown fate given up at one.
    pub epoch_bumps: u64,
    pub given_up: u64,
    /// Data files a gate saw deleted (distinct keys).
    pub files_deleted: u64,
    /// Times a consumer stopped reading for a while.
    pub consumer_pauses: u32,
    /// Batches read below the durable log start, or reads failed, on plans of a writer deposed
    /// while idle (it serves its last view until it next writes: no lease yet).
    pub deposed_reads: u64,
    /// Consumer resets to the log start after `OffsetOutOfRange`.
    pub consumer_resets: u64,
    /// Fetch plans held before reading; of those, refused as older than the plan TTL.
    pub held_plans: u64,
    pub expired_plans: u64,
    /// Reads by a second reader of a partition, from the main read's second batch, at the same
    /// time (cold read-ahead seeds), checked against the main read.
    pub second_reads: u64,
    /// Parallel-persistence seeds (RFC 0006): batches the final durable log holds as an
    /// abort's empty fillers, and fillers consumers stepped over.
    pub aborted_batches: u64,
    pub fillers_read: u64,
    /// Lost-upload faults: several buckets refused the next data PUTs.
    pub lost_uploads: u64,
    /// Slow-upload faults: every data bucket's PUTs landed late for a while.
    pub slow_uploads: u64,
    /// Pending files the resolvers found in too few buckets and copied to a quorum.
    pub repaired_files: u64,
    /// Reads that found an object deleted longer than plan TTL + read deadline after planning
    /// (the read itself outlived its bound; not a breach).
    pub overtaken_reads: u64,
    /// PUTs of a data file that landed after a DELETE of it (background copies that lagged).
    pub late_copies: u64,
    /// Appendable seeds: files written into ready pooled objects, files that found none ready
    /// (and created one inline), and unused pooled objects discarded.
    pub pool_hits: u64,
    pub pool_misses: u64,
    pub pool_discards: u64,
    /// Compaction seeds: swaps committed, swaps refused (their outputs deleted), batches moved
    /// to the regional bucket, and its outages.
    pub compactions: u64,
    pub compaction_jobs: u64,
    pub compactions_refused: u64,
    pub batches_compacted: u64,
    pub regional_outages: u32,
    /// Cluster seeds: agents cut off their peers, agents cut off the metadata bucket, and the
    /// highest epoch claimed by the end.
    pub cluster_cuts: u32,
    pub agent_log_outages: u32,
    /// Agents cut off their peers and the metadata bucket at once (still running).
    pub agent_isolations: u32,
    pub cluster_epochs: u64,
    /// Cluster seeds: offset commits coordinators queued, and those the fence refused.
    pub group_commits: u64,
    pub group_commits_refused: u64,
    pub consumed_batches: u64,
    pub audits: u32,
    /// Breaches found by the final audit.
    pub final_audit: Breaches,
    /// Every invariant violation seen at any step (the first few verbatim).
    pub violation_count: u64,
    pub violations: Vec<String>,
    /// Hash of every event in order: equal for two runs of one seed.
    pub trace_hash: u64,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.violation_count == 0 && self.final_audit.total() == 0
    }
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} [{}]: {} — {} steps, {:.1} s simulated, {} requests, {} batches / {} records \
             acked, {} resends, {} crashes, {} takeovers ({} dead log slots), {} overlapping \
             recoveries ({} claims overtaken), {} bucket outages, {} slowdowns, {} log \
             outages, {} metadata create conflicts, {} consumed ({} pauses, {} resets to the log start, {} \
             held plans, {} expired, {} on a deposed writer's plans, {} second reads, {} fillers read); {} lost uploads, {} slow-upload spells, {} files repaired, {} aborted batches; {} retention passes, {} DeleteRecords, log starts moved \
             {}, {} files deleted, {} log slots collected ({} live besides fences), {} held slot PUTs ({} past GC), {} stalled recoveries ({} past GC), {} quiet producers ({} refusals for lost producer state, {} epoch bumps, {} batches given up), {} slow metadata buckets, {} lagging buckets, {} overtaken reads, {} late copies, pool {}/{}/{} hits/misses/discards, {} compactions of {} jobs ({} refused, {} batches moved, {} regional outages), {} agents cut off peers, {} cut off the metadata bucket, {} isolated from both, {} epochs, {} group commits ({} refused); lost {}, duplicated {}, \
             reordered {}, gaps {}, violations {}; trace {:016x}",
            self.seed,
            self.scenario,
            if self.passed() { "ok" } else { "FAILED" },
            self.steps,
            self.sim_millis as f64 / 1000.0,
            self.requests,
            self.acked_batches,
            self.acked_records,
            self.resends,
            self.crashes,
            self.takeovers,
            self.dead_slots,
            self.overlapping_recoveries,
            self.overtaken_claims,
            self.bucket_outages,
            self.slowdowns,
            self.log_outages,
            self.create_conflicts,
            self.consumed_batches,
            self.consumer_pauses,
            self.consumer_resets,
            self.held_plans,
            self.expired_plans,
            self.deposed_reads,
            self.second_reads,
            self.fillers_read,
            self.lost_uploads,
            self.slow_uploads,
            self.repaired_files,
            self.aborted_batches,
            self.retention_ticks,
            self.delete_records,
            self.log_start_advance,
            self.files_deleted,
            self.log_slots_collected,
            self.live_log_slots,
            self.held_slot_puts,
            self.held_puts_collected,
            self.stalled_recoveries,
            self.stalled_recoveries_collected,
            self.quiet_producers,
            self.lost_producer_state,
            self.epoch_bumps,
            self.given_up,
            self.slow_logs,
            self.put_lags,
            self.overtaken_reads,
            self.late_copies,
            self.pool_hits,
            self.pool_misses,
            self.pool_discards,
            self.compactions,
            self.compaction_jobs,
            self.compactions_refused,
            self.batches_compacted,
            self.regional_outages,
            self.cluster_cuts,
            self.agent_log_outages,
            self.agent_isolations,
            self.cluster_epochs,
            self.group_commits,
            self.group_commits_refused,
            self.final_audit.lost,
            self.final_audit.duplicated,
            self.final_audit.reordered,
            self.final_audit.gaps,
            self.violation_count,
            self.trace_hash,
        )
    }
}
