//! The deterministic simulation in `make test`: a fixed set of seeds, each a different
//! deployment, client mix and fault schedule (see `weir_sim`). Any failure prints the seed; replay
//! it with `cargo run -p weir-sim -- --start SEED --seeds 1 --events`. More seeds:
//! `make sim SEEDS=1000`.

use weir_sim::{run, Sabotage, SimOptions, SimReport};

fn run_seeds(seeds: std::ops::Range<u64>) {
    let options = SimOptions::default();
    let mut failures = Vec::new();
    for seed in seeds {
        let report = run(seed, &options);
        println!("{report}");
        assert!(
            report.acked_batches > 0,
            "seed {seed} acknowledged nothing: the run proves nothing"
        );
        if !report.passed() {
            failures.push(format!("{report}\n  {}", report.violations.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn test_sim_seeds_0_to_9() {
    run_seeds(0..10);
}

/// Includes seed 17, which found a producer's later batch starting its stream on a partition
/// after the earlier batch's upload failed (fixed in `weir-control` `check_sequence`).
#[test]
fn test_sim_seeds_10_to_19() {
    run_seeds(10..20);
}

#[test]
fn test_sim_seeds_20_to_29() {
    run_seeds(20..30);
}

#[test]
fn test_sim_seeds_30_to_39() {
    run_seeds(30..40);
}

/// A seed replays exactly: same events in the same order, same results.
#[test]
fn test_sim_same_seed_same_run() {
    let options = SimOptions {
        steps: 300,
        ..SimOptions::default()
    };
    for seed in [3, 25] {
        let first: SimReport = run(seed, &options);
        let second = run(seed, &options);
        assert_eq!(first, second, "seed {seed} did not replay");
    }
}

/// The auditor is not vacuous: damage done to durable storage behind the system's back is
/// reported, on a seed that passes untouched.
#[test]
fn test_sim_auditor_reports_sabotage() {
    for sabotage in [Sabotage::DeleteFile, Sabotage::TruncateLog] {
        let options = SimOptions {
            steps: 300,
            sabotage,
            ..SimOptions::default()
        };
        let report = run(0, &options);
        assert!(!report.passed(), "{sabotage:?} went unnoticed: {report}");
        assert!(report.violation_count > 0, "{report}");
    }
    assert!(run(
        0,
        &SimOptions {
            steps: 300,
            ..SimOptions::default()
        }
    )
    .passed());
}
