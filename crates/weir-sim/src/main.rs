//! `weir-sim`: run many seeds of the deterministic simulation and report any that break an
//! invariant. Exit status 1 if one did.

use clap::Parser;
use weir_sim::{run, SimOptions};

#[derive(Parser, Debug)]
#[command(about = "Deterministic simulation of Weir's produce path, control plane and storage")]
struct Args {
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// How many consecutive seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// Steps of the fault phase per seed.
    #[arg(long, default_value_t = SimOptions::default().steps)]
    steps: u32,
    /// Print every seed's report, not only failures.
    #[arg(long)]
    verbose: bool,
    /// Print every event of every seed as it happens (use with --seeds 1).
    #[arg(long)]
    events: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.events {
        // The system's own logs beside the events, filtered by RUST_LOG (off by default).
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
            )
            .without_time()
            .with_ansi(false)
            .init();
    }
    let options = SimOptions {
        steps: args.steps,
        print_events: args.events,
        ..SimOptions::default()
    };
    let mut failed = Vec::new();
    let mut acked = 0u64;
    let mut crashes = 0u64;
    for seed in args.start..args.start + args.seeds {
        let report = run(seed, &options);
        acked += report.acked_records;
        crashes += u64::from(report.crashes + report.takeovers);
        if args.verbose || !report.passed() {
            println!("{report}");
        }
        if !report.passed() {
            for violation in &report.violations {
                println!("  {violation}");
            }
            failed.push(seed);
        }
    }
    println!(
        "{} seeds, {} failed {:?}; {acked} records acknowledged, {crashes} crashes and takeovers",
        args.seeds,
        failed.len(),
        failed
    );
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
