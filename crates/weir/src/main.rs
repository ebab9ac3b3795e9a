//! The `weir` binary: `weir agent` runs a complete single-node Weir.

mod agent;
mod buckets;
mod config;
mod observe;
mod report;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    about = "A Kafka-protocol broker on object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format: text (colour only on a terminal) or json (one object per line). Filter
    /// with WEIR_LOG or RUST_LOG, e.g. "info,weir_control=debug".
    #[arg(
        long,
        global = true,
        env = "WEIR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an agent: Kafka listener, produce and fetch paths, embedded control plane.
    Agent(Box<AgentArgs>),
    /// Run a benchmark workload: executes the `weir-bench` binary next to this one (a separate
    /// binary so the agent never links librdkafka); `weir bench --help` shows its options.
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments passed to `weir-bench` unchanged.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// Config file (defaults: config/weir.toml built in).
    #[arg(long, env = "WEIR_CONFIG")]
    config: Option<PathBuf>,
    /// Kafka listener address, e.g. 127.0.0.1:9092.
    #[arg(long, env = "WEIR_LISTEN")]
    listen: Option<String>,
    /// Directory for the default local bucket.
    #[arg(long, env = "WEIR_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Host advertised to clients.
    #[arg(long)]
    advertised_host: Option<String>,
    /// Create unknown topics on Metadata requests.
    #[arg(long)]
    auto_create_topics: Option<bool>,
    /// Partitions of auto-created topics.
    #[arg(long)]
    num_partitions: Option<i32>,
    /// Longest a batch waits before its file is uploaded, e.g. 5ms.
    #[arg(long, value_parser = humantime::parse_duration)]
    flush_interval: Option<std::time::Duration>,
    /// Storage latency profile: local, s3-standard, s3-express, gcs-regional, gcs-rapid, azure-premium.
    #[arg(long)]
    storage_profile: Option<String>,
    /// Requests one connection may have in flight (1 disables produce pipelining).
    #[arg(long)]
    max_inflight_per_connection: Option<usize>,
    /// Test-only fail points, e.g. after-upload-before-commit=abort@3.
    #[arg(long)]
    failpoints: Option<String>,
    /// Fraction of object-store requests that fail (retriably), for fault tests.
    #[arg(long)]
    storage_error_rate: Option<f64>,
    /// Seed of the storage latency/fault model (0: random).
    #[arg(long)]
    fault_seed: Option<u64>,
    /// Ingest bucket URL; repeat for several (replaces storage.ingest_buckets).
    #[arg(long = "ingest-bucket")]
    ingest_buckets: Vec<String>,
    /// Buckets that must hold a file before it commits (k of n).
    #[arg(long)]
    quorum: Option<usize>,
    /// Fault test: treat ingest bucket N (0-based) as down for the whole run; repeatable.
    #[arg(long = "down-bucket")]
    down_buckets: Vec<usize>,
    /// Fault test: make ingest bucket N (0-based) slow by storage.slow_bucket_delay on every
    /// request for the whole run; repeatable.
    #[arg(long = "slow-bucket")]
    slow_buckets: Vec<usize>,
    /// Bucket URL of the metadata log (default: the first ingest bucket).
    #[arg(long)]
    metadata_bucket: Option<String>,
    /// How sealed files are written: auto (append into pooled objects where every ingest
    /// bucket can), put, or append (storage.ingest_writes).
    #[arg(long, value_parser = ["auto", "put", "append"])]
    ingest_writes: Option<String>,
    /// Bucket URL compacted files go to (storage.compacted_bucket).
    #[arg(long)]
    compacted_bucket: Option<String>,
    /// Run without compaction (compaction.enabled = false).
    #[arg(long)]
    no_compaction: bool,
    /// Node id reported to clients and used in the cluster (agent.node_id).
    #[arg(long)]
    node_id: Option<i32>,
    /// The agent's zone, its rack in Metadata (agent.rack).
    #[arg(long)]
    zone: Option<String>,
    /// Join the cluster on the same buckets, serving the control service here
    /// (cluster.control_listen; experimental).
    #[arg(long)]
    control_listen: Option<String>,
    /// Address other agents reach the control service at, as host:port, when not the
    /// advertised host and the bound port (cluster.control_advertise).
    #[arg(long)]
    control_advertise: Option<String>,
    /// Write the object-storage counters as JSON to this file (every second and at shutdown).
    #[arg(long)]
    storage_report: Option<PathBuf>,
    /// Address of the HTTP endpoint (/metrics, /healthz, /readyz, status page at /), e.g.
    /// 127.0.0.1:9644; "" for none (http.listen).
    #[arg(long)]
    http_listen: Option<String>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines; coloured only when stdout is a terminal.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// `weir bench ARGS`: replaces this process with `weir-bench ARGS`, found next to this binary
/// (cargo builds both into the same directory) or else on the PATH.
fn exec_bench(args: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("weir-bench")))
        .filter(|path| path.is_file());
    let program = sibling.unwrap_or_else(|| PathBuf::from("weir-bench"));
    let error = std::process::Command::new(&program).args(args).exec();
    anyhow::bail!(
        "could not run {} ({error}); build it with `cargo build -p weir-bench`",
        program.display()
    )
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Bench { args } = cli.command {
        return exec_bench(args);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match cli.log_format {
        LogFormat::Text => {
            use std::io::IsTerminal as _;
            logs.with_ansi(std::io::stdout().is_terminal()).init();
        }
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    match cli.command {
        Command::Agent(args) => {
            let config = agent::resolve_config(&args)?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(agent::run(config))
        }
        Command::Bench { .. } => unreachable!("handled before logging is set up"),
    }
}
