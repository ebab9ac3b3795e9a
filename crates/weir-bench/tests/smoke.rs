//! Smoke test: `weir-bench` runs the 5-second workload against a spawned `weir agent` and reports
//! nonzero publish and consume counts with no errors. Never asserts timing.

use std::path::PathBuf;
use std::process::Command;

use weir_bench::Report;

fn weir_bin() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").to_string());
    PathBuf::from(target).join("debug").join("weir")
}

/// Runs `weir-bench` on `workload` against a spawned agent with a 5 ms flush and returns its JSON
/// report and stderr.
fn run_bench(workload: &std::path::Path, extra: &[&str]) -> (Report, String) {
    let weir = weir_bin();
    assert!(
        weir.exists(),
        "weir binary not found at {} (build it: cargo build -p weir)",
        weir.display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .arg(workload)
        .arg("--spawn-agent")
        .arg("--weir-bin")
        .arg(&weir)
        .args(["--agent-arg=--flush-interval", "--agent-arg=5ms"])
        .args(["--json", "--progress-interval", "1"])
        .args(extra)
        .output()
        .expect("run weir-bench");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "weir-bench failed: {stderr}");
    let report: Report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON report: {e}; stderr: {stderr}"));
    (report, stderr)
}

#[test]
fn test_bench_smoke_workload_against_spawned_agent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let svg = dir.path().join("latency.svg");
    let workload = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/omb/workloads/smoke-5s.yaml"
    );
    let svg_arg = svg.to_str().expect("utf-8 temp path");
    let (report, stderr) = run_bench(workload.as_ref(), &["--svg", svg_arg]);
    assert!(report.published > 0, "{report:?}");
    assert!(report.consumed > 0, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(report.publish_latency.count > 0 && report.end_to_end_latency.count > 0);
    // Every acknowledged message is also counted from its send, with its send delay.
    assert_eq!(
        report.publish_from_send_latency.count,
        report.publish_latency.count
    );
    assert_eq!(report.publish_delay.count, report.publish_latency.count);
    // Each message's publish latency is its send delay plus its time from send, so the means
    // add up (within the histograms' precision and their 1 µs floor).
    let (publish, from_send, delay) = (
        &report.publish_latency,
        &report.publish_from_send_latency,
        &report.publish_delay,
    );
    assert!(
        (from_send.mean_ms + delay.mean_ms - publish.mean_ms).abs() < 0.01 * publish.mean_ms + 0.01,
        "{publish:?} {from_send:?} {delay:?}"
    );
    assert!(report.agent.is_some(), "spawned agent usage is reported");
    assert!(report.catch_up.is_none(), "no backlog was asked for");
    let objects = report.objects.expect("file:// bucket objects counted");
    assert!(objects.ingest_files > 0 && objects.meta_log_files > 0);
    assert!(
        stderr.contains("publish"),
        "the table goes to stderr with --json"
    );
    let plot = std::fs::read_to_string(&svg).expect("svg written");
    assert!(plot.starts_with("<svg") && plot.contains("<polyline"));
}

#[test]
fn test_bench_backlog_run_times_the_consumers_catch_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let workload = dir.path().join("backlog.yaml");
    // 4 MiB of backlog, then reading alone: no consumer may start before it is acknowledged.
    std::fs::write(
        &workload,
        "name: backlog smoke\npartitionsPerTopic: 4\nmessageSize: 1024\nproducerRate: 0\n\
         consumerBacklogSizeGB: 0.00390625\nstopProducersAtBacklog: true\n\
         testDurationSeconds: 60\n",
    )
    .expect("write workload");
    let (report, stderr) = run_bench(&workload, &[]);
    let catch_up = report
        .catch_up
        .clone()
        .expect("a backlog run reports its catch-up");
    assert!(catch_up.backlog_bytes >= 4 << 20, "{catch_up:?}");
    assert!(!catch_up.producing);
    assert!(
        catch_up.seconds.is_some(),
        "backlog read within 60 s: {stderr}"
    );
    assert_eq!(catch_up.behind_at_end, 0, "{catch_up:?}");
    assert!(catch_up.rate_mib.is_some_and(|rate| rate > 0.0));
    assert_eq!(report.errors, 0, "{report:?}");
    // Producers stopped at the backlog, so the consumers read exactly what was acknowledged.
    assert_eq!(report.total_consumed, report.total_published, "{report:?}");
    assert!(report.consumed >= catch_up.backlog_messages, "{report:?}");
    assert_eq!(
        report.published, 0,
        "the window starts after the backlog: {report:?}"
    );
    let agent = report.agent.expect("spawned agent usage is reported");
    // Reading 4 MiB takes the agent about a millisecond of CPU, which /proc counts in 10 ms
    // ticks: the window's CPU may be zero ticks, but the figure follows from it.
    assert!(agent.pid > 0 && agent.peak_rss_mib > 0.0, "{agent:?}");
    assert!(agent.cpu_seconds >= 0.0, "{agent:?}");
    assert_eq!(
        agent.cpu_seconds_per_mib_consumed > 0.0,
        agent.cpu_seconds > 0.0,
        "{agent:?}"
    );
    assert!(
        stderr.contains("catch-up"),
        "the table names the catch-up: {stderr}"
    );
}

/// Puts `from` at `to`: a hard link where the file system allows it, a copy otherwise.
fn place(from: &std::path::Path, to: &std::path::Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
    }
}

#[test]
fn test_weir_bench_subcommand_execs_weir_bench() {
    let weir = weir_bin();
    assert!(weir.exists(), "weir binary not found at {}", weir.display());
    // `weir bench` runs the `weir-bench` next to `weir`. Cargo has just built this package's
    // `weir-bench`; lay both binaries out side by side, so the test never depends on what else
    // happens to be in the target dir.
    let dir = tempfile::tempdir().expect("temp dir");
    let local_weir = dir.path().join("weir");
    place(&weir, &local_weir);
    place(
        std::path::Path::new(env!("CARGO_BIN_EXE_weir-bench")),
        &dir.path().join("weir-bench"),
    );
    let output = Command::new(&local_weir)
        .args(["bench", "--version"])
        .output()
        .expect("run weir bench");
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("weir-bench "));
}
