//! The deterministic simulation in `make test`: a fixed set of seeds, each a different
//! deployment, client mix and fault schedule (see `weir_sim`). Any failure prints the seed; replay
//! it with `cargo run -p weir-sim -- --start SEED --seeds 1 --events`. More seeds:
//! `make sim SEEDS=1000`.

use weir_sim::{run, Sabotage, SimOptions, SimReport};

fn run_seeds(seeds: std::ops::Range<u64>) -> Vec<SimReport> {
    let options = SimOptions::default();
    let mut failures = Vec::new();
    let mut reports = Vec::new();
    let mut idle_cluster_seeds = 0;
    for seed in seeds {
        let report = run(seed, &options);
        println!("{report}");
        // A cluster seed whose leader was cut off its peers for most of the run may ack
        // nothing: the leader keeps its lease (it reaches the bucket), followers cannot forward
        // to it, and clients move off cut-off agents (RFC 0002, "Not built yet"). One such seed
        // per range at most; any other seed that acks nothing proves nothing.
        if report.acked_batches == 0 && report.cluster_cuts > 0 && idle_cluster_seeds == 0 {
            idle_cluster_seeds += 1;
        } else {
            assert!(
                report.acked_batches > 0,
                "seed {seed} acknowledged nothing: the run proves nothing"
            );
        }
        if !report.passed() {
            failures.push(format!("{report}\n  {}", report.violations.join("\n  ")));
        }
        reports.push(report);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    reports
}

/// Seeds 0–39, each a different deployment, client mix and fault schedule. Includes seed 17,
/// which found a producer's later batch starting its stream on a partition after the earlier
/// batch's upload failed (fixed in `weir-control` `check_sequence`).
///
/// The range must also exercise every kind of fault at least once, so a fault injector that
/// silently stops injecting fails here instead of making every seed pass vacuously.
#[test]
fn test_sim_seeds_0_to_39_exercise_every_fault() {
    let reports = run_seeds(0..40);
    let total = |count: fn(&SimReport) -> u64| reports.iter().map(count).sum::<u64>();
    let kinds: [(&str, u64); 29] = [
        ("crashes", total(|r| r.crashes.into())),
        ("takeovers", total(|r| r.takeovers.into())),
        ("dead log slots", total(|r| r.dead_slots)),
        ("bucket outages", total(|r| r.bucket_outages.into())),
        ("slow buckets", total(|r| r.slowdowns.into())),
        ("metadata bucket outages", total(|r| r.log_outages.into())),
        ("failed opens", total(|r| r.failed_opens.into())),
        (
            "overlapping recoveries",
            total(|r| r.overlapping_recoveries.into()),
        ),
        (
            "claims overtaken by a later writer",
            total(|r| r.overtaken_claims.into()),
        ),
        (
            "metadata create conflicts with nothing written",
            total(|r| r.create_conflicts),
        ),
        ("retention passes", total(|r| r.retention_ticks.into())),
        ("DeleteRecords", total(|r| r.delete_records.into())),
        ("log start moves", total(|r| r.log_start_advance)),
        ("deleted files", total(|r| r.files_deleted)),
        (
            "consumer resets to the log start",
            total(|r| r.consumer_resets),
        ),
        ("held fetch plans", total(|r| r.held_plans)),
        ("expired fetch plans", total(|r| r.expired_plans)),
        (
            "second readers joining a read in flight",
            total(|r| r.second_reads),
        ),
        ("slow metadata buckets", total(|r| r.slow_logs.into())),
        ("lagging data buckets", total(|r| r.put_lags.into())),
        (
            "pending files repaired to a quorum",
            total(|r| r.repaired_files),
        ),
        ("pending batches aborted", total(|r| r.aborted_batches)),
        ("collected log slots", total(|r| r.log_slots_collected)),
        (
            "held slot PUTs released after GC",
            total(|r| r.held_puts_collected.into()),
        ),
        (
            "stalled recoveries released after GC",
            total(|r| r.stalled_recoveries_collected.into()),
        ),
        (
            "epoch bumps after a producer id expired",
            total(|r| r.epoch_bumps),
        ),
        (
            "cluster members cut off their peers",
            total(|r| r.cluster_cuts.into()),
        ),
        (
            "cluster members cut off the metadata bucket",
            total(|r| r.agent_log_outages.into()),
        ),
        (
            "cluster members cut off their peers and the metadata bucket at once",
            total(|r| r.agent_isolations.into()),
        ),
    ];
    println!("fault totals over seeds 0-39: {kinds:?}");
    for (kind, count) in kinds {
        assert!(count > 0, "no seed in 0..40 exercised {kind}");
    }
}

/// A seed replays exactly: same events in the same order, same results.
#[test]
fn test_sim_same_seed_same_run() {
    let options = SimOptions {
        steps: 300,
        ..SimOptions::default()
    };
    // 3 and 25 run one agent, 469 a cluster of five (whose members wait on watch channels,
    // where tokio's seeded random numbers order the wake-ups).
    for seed in [3, 25, 469] {
        let first: SimReport = run(seed, &options);
        let second = run(seed, &options);
        assert_eq!(first, second, "seed {seed} did not replay");
    }
}

/// The auditor is not vacuous: damage done to durable storage behind the system's back is
/// reported, on a seed that passes untouched. Seed 15 keeps every batch (no retention, no
/// DeleteRecords), so the file `DeleteFile` removes is never released legitimately afterwards.
#[test]
fn test_sim_auditor_reports_sabotage() {
    const SEED: u64 = 15;
    for sabotage in [
        Sabotage::DeleteFile,
        Sabotage::TruncateLog,
        Sabotage::ForgeCoveredSlot,
    ] {
        let options = SimOptions {
            steps: 300,
            sabotage,
            ..SimOptions::default()
        };
        let report = run(SEED, &options);
        assert!(
            report
                .scenario
                .contains("retention.ms None, retention.bytes None, DeleteRecords 0.0%"),
            "seed {SEED} no longer keeps everything: {report}"
        );
        assert!(!report.passed(), "{sabotage:?} went unnoticed: {report}");
        assert!(report.violation_count > 0, "{report}");
    }
    assert!(run(
        SEED,
        &SimOptions {
            steps: 300,
            ..SimOptions::default()
        }
    )
    .passed());
}
