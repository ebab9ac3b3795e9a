//! `weir-bench` (also `weir bench`): run an OpenMessaging-Benchmark-style workload file against a
//! Kafka bootstrap or a freshly spawned local `weir agent`.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use weir_bench::{agent, run, svg, Options, SpawnedAgent, StorageCounts, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "weir-bench",
    version,
    about = "OpenMessaging-Benchmark-style workloads against any Kafka bootstrap (also run as `weir bench`)"
)]
struct Cli {
    /// Workload file (OMB YAML vocabulary; see deploy/omb/workloads/).
    workload: PathBuf,
    /// Kafka bootstrap servers (ignored with --spawn-agent).
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// Start a local `weir agent` on a free port with a temporary data dir for this run.
    #[arg(long)]
    spawn_agent: bool,
    /// The `weir` binary for --spawn-agent (default: $WEIR_BIN, else `weir` next to this binary, else PATH).
    #[arg(long)]
    weir_bin: Option<PathBuf>,
    /// Extra argument for the spawned agent, repeatable: --agent-arg=--storage-profile --agent-arg=s3-standard.
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    agent_args: Vec<String>,
    /// Keep the spawned agent's temporary directory (data and agent.log).
    #[arg(long)]
    keep_agent_dir: bool,
    /// Read CPU time and peak RSS of this (already running) agent process.
    #[arg(long)]
    agent_pid: Option<u32>,
    /// Count objects (PUTs) in this file:// bucket directory after the run (default with
    /// --spawn-agent: <data dir>/bucket).
    #[arg(long)]
    bucket_dir: Option<PathBuf>,
    /// Override producerRate (messages/s over all producers; 0: as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Override the measured duration, seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Override the warm-up, seconds.
    #[arg(long)]
    warmup: Option<f64>,
    /// Producer property, repeatable: -P linger.ms=10.
    #[arg(short = 'P', long = "producer-config", value_parser = parse_kv)]
    producer_config: Vec<(String, String)>,
    /// Consumer property, repeatable: -C fetch.wait.max.ms=50.
    #[arg(short = 'C', long = "consumer-config", value_parser = parse_kv)]
    consumer_config: Vec<(String, String)>,
    /// Seconds between progress lines on stderr (0: none).
    #[arg(long, default_value_t = 5.0)]
    progress_interval: f64,
    /// Print the report as JSON on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Write an SVG latency-by-percentile plot (publish and end-to-end) to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let workload = Workload::load(&cli.workload)?;
    let mut spawned = None;
    let mut opts = Options::new(cli.bootstrap.clone());
    if cli.spawn_agent {
        let bin = cli.weir_bin.clone().unwrap_or_else(agent::default_weir_bin);
        let agent = SpawnedAgent::spawn(&bin, &cli.agent_args)?;
        eprintln!(
            "spawned {} agent pid {} on {} (data {}, log {})",
            bin.display(),
            agent.pid(),
            agent.bootstrap,
            agent.data_dir.display(),
            agent.log_file.display()
        );
        opts.bootstrap = agent.bootstrap.clone();
        opts.agent_pid = Some(agent.pid());
        opts.bucket_dir = Some(agent.data_dir.join("bucket"));
        spawned = Some(agent);
    }
    if cli.agent_pid.is_some() {
        opts.agent_pid = cli.agent_pid;
    }
    if cli.bucket_dir.is_some() {
        opts.bucket_dir = cli.bucket_dir.clone();
    }
    opts.rate = cli.rate;
    opts.duration = cli.duration.map(Duration::from_secs_f64);
    opts.warmup = cli.warmup.map(Duration::from_secs_f64);
    opts.producer_config = cli.producer_config.clone();
    opts.consumer_config = cli.consumer_config.clone();
    opts.progress_interval = Duration::from_secs_f64(cli.progress_interval.max(0.0));

    let mut outcome = run(&workload, &opts);
    if let Some(agent) = spawned.as_mut() {
        let report = agent.stop();
        if let (Ok(outcome), Some(text)) = (outcome.as_mut(), report) {
            let acked = outcome.report.total_published_bytes;
            match StorageCounts::from_agent_report(&text, acked) {
                Ok(counts) => outcome.report.storage = Some(counts),
                Err(e) => eprintln!("could not read the agent's storage report: {e}"),
            }
        }
        if cli.keep_agent_dir || outcome.is_err() {
            if let Some(dir) = agent.keep_dir() {
                eprintln!("agent directory kept: {}", dir.display());
            }
        }
    }
    drop(spawned);
    let outcome = outcome?;
    let json = serde_json::to_string_pretty(&outcome.report)?;
    if let Some(path) = &cli.json_out {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &cli.svg {
        let title = format!(
            "{} — {:.0} msg/s, {} B",
            outcome.report.workload, outcome.report.publish_rate_msgs, outcome.report.message_size
        );
        let plot = svg::percentile_plot(
            &title,
            &[
                ("publish", &outcome.publish_histogram),
                ("end-to-end", &outcome.end_to_end_histogram),
            ],
        );
        std::fs::write(path, plot).with_context(|| format!("writing {}", path.display()))?;
    }
    if cli.json {
        eprint!("{}", outcome.report.table());
        let mut out = std::io::stdout().lock();
        writeln!(out, "{json}")?;
    } else {
        print!("{}", outcome.report.table());
    }
    Ok(())
}
