//! Named fail points at the protocol windows that matter for durability, so crash tests can stop
//! the agent exactly there (e.g. after a file is uploaded but before it is committed).
//!
//! Configured once at start-up from a spec such as
//! `after-upload-before-commit=abort@3,after-commit-before-ack=abort@1`: abort the process on the
//! 3rd hit of the first point, the 1st hit of the second. Deterministic by construction (hit
//! counts, no randomness). Unconfigured, a hit costs one atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// After a file is durable in the bucket quorum, before its commit is sent.
pub const AFTER_UPLOAD_BEFORE_COMMIT: &str = "after-upload-before-commit";
/// After a commit is durable in the control plane, before producers are answered.
pub const AFTER_COMMIT_BEFORE_ACK: &str = "after-commit-before-ack";
/// After a metadata-log slot is durable, before it is published to readers and callers.
pub const AFTER_LOG_WRITE_BEFORE_PUBLISH: &str = "after-log-write-before-publish";
/// Parallel persistence (RFC 0006): after a file's reservation is durable, before its upload is
/// awaited (it may or may not have reached a quorum yet).
pub const AFTER_RESERVE_BEFORE_ACK: &str = "after-reserve-before-ack";

/// Every fail point, for validation of specs.
pub const FAIL_POINTS: &[&str] = &[
    AFTER_UPLOAD_BEFORE_COMMIT,
    AFTER_COMMIT_BEFORE_ACK,
    AFTER_LOG_WRITE_BEFORE_PUBLISH,
    AFTER_RESERVE_BEFORE_ACK,
];

struct Armed {
    name: &'static str,
    abort_on_hit: u64,
    hits: AtomicU64,
}

static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Parses and installs `spec`. Can be called once per process; an empty spec arms nothing.
pub fn configure(spec: &str) -> Result<(), String> {
    let mut armed = Vec::new();
    for item in spec
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (name, action) = item
            .split_once('=')
            .ok_or_else(|| format!("fail point {item:?} is not name=abort@N"))?;
        let name = FAIL_POINTS
            .iter()
            .copied()
            .find(|known| *known == name)
            .ok_or_else(|| {
                format!(
                    "unknown fail point {name:?}; known: {}",
                    FAIL_POINTS.join(", ")
                )
            })?;
        let count = action
            .strip_prefix("abort@")
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("fail point action {action:?} is not abort@N with N >= 1"))?;
        armed.push(Armed {
            name,
            abort_on_hit: count,
            hits: AtomicU64::new(0),
        });
    }
    ARMED
        .set(armed)
        .map_err(|_| "fail points are already configured".to_string())
}

/// Marks that execution passed `name`; aborts the process if this is the armed hit.
pub fn hit(name: &str) {
    let Some(armed) = ARMED.get() else { return };
    for point in armed.iter().filter(|point| point.name == name) {
        let count = point.hits.fetch_add(1, Ordering::SeqCst) + 1;
        if count == point.abort_on_hit {
            eprintln!("fail point {name} hit {count} times: aborting the process");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_failpoint_spec_validation() {
        // Validation only: `configure` installs process-wide state, so parse errors are checked
        // through a spec that never installs (the first bad item fails before `set`).
        assert!(configure("nope=abort@1").is_err());
        assert!(configure("after-commit-before-ack=crash").is_err());
        assert!(configure("after-commit-before-ack=abort@0").is_err());
        assert!(configure("after-commit-before-ack").is_err());
        // Unconfigured hits are no-ops.
        hit(AFTER_COMMIT_BEFORE_ACK);
    }
}
