//! A local `weir agent` started for a run, and what can be read about it from `/proc` and its
//! bucket directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::report::ObjectCounts;

/// A `weir agent` child process on a free local port; killed on drop.
pub struct SpawnedAgent {
    child: Child,
    /// `127.0.0.1:port`.
    pub bootstrap: String,
    /// The agent's `--data-dir` (its default bucket is `<data_dir>/bucket`).
    pub data_dir: PathBuf,
    /// The agent's stdout/stderr.
    pub log_file: PathBuf,
    /// Where the agent writes its object-storage counters (`--storage-report`).
    pub storage_report: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl SpawnedAgent {
    /// Starts `weir_bin agent --listen 127.0.0.1:<free port> --data-dir <temp dir> <extra_args>`
    /// and waits until it accepts connections. `--listen` / `--data-dir` in `extra_args` win.
    pub fn spawn(weir_bin: &Path, extra_args: &[String]) -> anyhow::Result<Self> {
        let has = |flag: &str| {
            extra_args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        let dir = tempfile::Builder::new()
            .prefix("weir-bench-")
            .tempdir()
            .context("temp dir")?;
        let mut args: Vec<String> = vec!["agent".into()];
        let bootstrap = if has("--listen") {
            let value = flag_value(extra_args, "--listen").context("--listen needs a value")?;
            value.replace("0.0.0.0", "127.0.0.1")
        } else {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .context("free port")?
                .port();
            args.push("--listen".into());
            args.push(format!("127.0.0.1:{port}"));
            format!("127.0.0.1:{port}")
        };
        if !has("--http-listen") {
            // Any free port: the default 9644 may be taken (another agent, a real deployment).
            args.push("--http-listen".into());
            args.push("127.0.0.1:0".into());
        }
        let data_dir = if has("--data-dir") {
            PathBuf::from(flag_value(extra_args, "--data-dir").context("--data-dir needs a value")?)
        } else {
            let data = dir.path().join("data");
            args.push("--data-dir".into());
            args.push(data.display().to_string());
            data
        };
        let storage_report = if has("--storage-report") {
            PathBuf::from(
                flag_value(extra_args, "--storage-report")
                    .context("--storage-report needs a value")?,
            )
        } else {
            let path = dir.path().join("storage.json");
            args.push("--storage-report".into());
            args.push(path.display().to_string());
            path
        };
        args.extend(extra_args.iter().cloned());
        let log_file = dir.path().join("agent.log");
        let log = std::fs::File::create(&log_file).context("agent log file")?;
        let child = Command::new(weir_bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", weir_bin.display()))?;
        let mut agent = SpawnedAgent {
            child,
            bootstrap,
            data_dir,
            log_file,
            storage_report,
            _dir: Some(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&agent.bootstrap).is_err() {
            if let Some(status) = agent.child.try_wait()? {
                bail!(
                    "weir agent exited with {status}: {}",
                    std::fs::read_to_string(&agent.log_file).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("weir agent did not listen on {} in 30 s", agent.bootstrap);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the agent gracefully (SIGTERM, so it writes its final storage report and shutdown
    /// snapshot), killing it after 30 s. Returns the storage report, if it wrote one.
    pub fn stop(&mut self) -> Option<String> {
        let pid = self.child.id().to_string();
        let asked = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while asked.as_ref().is_ok_and(|s| s.success()) && Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(&self.storage_report).ok()
    }

    /// Keeps the temporary directory (data and log) after the agent stops.
    pub fn keep_dir(&mut self) -> Option<PathBuf> {
        self._dir.take().map(|d| d.keep())
    }
}

impl Drop for SpawnedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == flag {
            return iter.next().cloned();
        }
        if let Some(value) = arg.strip_prefix(&prefix) {
            return Some(value.to_string());
        }
    }
    None
}

/// The `weir` binary for `--spawn-agent`: `WEIR_BIN`, else `weir` next to this executable, else
/// `weir` on the PATH.
pub fn default_weir_bin() -> PathBuf {
    if let Ok(path) = std::env::var("WEIR_BIN") {
        return PathBuf::from(path);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(sibling) = exe.parent().map(|d| d.join("weir")) {
            if sibling.is_file() {
                return sibling;
            }
        }
    }
    PathBuf::from("weir")
}

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux).
const CLOCK_TICKS: f64 = 100.0;

/// utime + stime of a process in seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS)
}

/// Peak resident set size (VmHWM) in MiB, from `/proc/<pid>/status`.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Counts the objects in a `file://` bucket directory: each file is one PUT. Returns `None` when
/// the directory does not exist (e.g. a `memory://` bucket).
pub fn count_objects(bucket: &Path, acked_bytes: u64) -> Option<ObjectCounts> {
    if !bucket.is_dir() {
        return None;
    }
    let mut counts = ObjectCounts {
        bucket: bucket.display().to_string(),
        acked_bytes,
        ..Default::default()
    };
    let mut stack = vec![bucket.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // object_store's local backend stages uploads as `<name>#<n>` files.
            if name.contains('#') {
                continue;
            }
            let rel = path.strip_prefix(bucket).unwrap_or(&path);
            if rel.starts_with("ingest") {
                counts.ingest_files += 1;
            } else if rel.starts_with("meta/log") {
                counts.meta_log_files += 1;
            } else {
                counts.other_files += 1;
            }
        }
    }
    Some(counts.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_count_objects_classifies_keys() {
        let dir = tempfile::tempdir().unwrap();
        let b = dir.path();
        for rel in [
            "ingest/2026-11-30-04/a.weir",
            "ingest/2026-11-30-05/b.weir",
            "meta/log/00000000000000000001",
            "meta/snapshot/00000000000000000001",
            "ingest/2026-11-30-05/c.weir#1",
        ] {
            let path = b.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        }
        let c = count_objects(b, 1 << 30).unwrap();
        assert_eq!((c.ingest_files, c.meta_log_files, c.other_files), (2, 1, 1));
        assert_eq!(c.total_puts, 4);
        assert!(count_objects(&b.join("missing"), 1).is_none());
    }

    #[test]
    fn test_proc_readers_on_self() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        assert!(peak_rss_mib(pid).unwrap() > 0.0);
        assert_eq!(
            flag_value(&["--a".into(), "--data-dir=/x".into()], "--data-dir").as_deref(),
            Some("/x")
        );
    }
}
