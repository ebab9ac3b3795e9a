//! Workload files in OpenMessaging Benchmark's YAML vocabulary.
//!
//! Keys OMB defines keep their names and meaning (`topics`, `partitionsPerTopic`, `messageSize`,
//! `payloadFile`, `randomBytesRatio`, `producersPerTopic`, `subscriptionsPerTopic`,
//! `consumerPerSubscription`, `producerRate`, `testDurationMinutes`, `warmupDurationMinutes`), so
//! one file runs under both OMB and `weir bench`. Weir adds `testDurationSeconds` and
//! `warmupDurationSeconds`, which win over the minute keys, and `stopProducersAtBacklog`. OMB keys
//! `weir bench` does not act on (e.g. `keyDistributor`) are accepted and ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// One benchmark workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Name shown in reports.
    pub name: String,
    /// Number of topics; each run creates fresh topics.
    #[serde(default = "one")]
    pub topics: u32,
    /// Partitions of each topic.
    #[serde(default = "one")]
    pub partitions_per_topic: u32,
    /// Bytes per message (ignored when `payloadFile` is set: the file's size is used).
    #[serde(default = "default_message_size")]
    pub message_size: usize,
    /// File whose bytes are the payload (relative paths: to the workload file).
    #[serde(default)]
    pub payload_file: Option<PathBuf>,
    /// Fraction of each payload that is random (the rest is zeros): 1.0 incompressible.
    #[serde(default = "default_random_ratio")]
    pub random_bytes_ratio: f64,
    /// Producers (each its own client and connection) per topic.
    #[serde(default = "one")]
    pub producers_per_topic: u32,
    /// Independent readers of every topic (consumers use assign(): no groups are needed).
    #[serde(default = "one")]
    pub subscriptions_per_topic: u32,
    /// Consumers per subscription; the topic's partitions are split between them.
    #[serde(default = "one")]
    pub consumer_per_subscription: u32,
    /// Messages per second over all producers; 0 or less: as fast as possible.
    #[serde(default)]
    pub producer_rate: f64,
    /// Backlog to build before any consumer reads, in GiB (OMB's key; 0: consumers read from
    /// the start). The consumers then read it from the beginning while the report times the
    /// catch-up; the backlog replaces the warm-up.
    #[serde(default, rename = "consumerBacklogSizeGB")]
    pub consumer_backlog_size_gb: f64,
    /// Weir extension: producers stop once the backlog is built, so the window measures reading
    /// alone (OMB keeps producing, the default).
    #[serde(default)]
    pub stop_producers_at_backlog: bool,
    /// Measured duration in minutes.
    #[serde(default = "one_f")]
    pub test_duration_minutes: f64,
    /// Weir extension: measured duration in seconds (wins over `testDurationMinutes`).
    #[serde(default)]
    pub test_duration_seconds: Option<f64>,
    /// Warm-up before measuring, in minutes.
    #[serde(default)]
    pub warmup_duration_minutes: f64,
    /// Weir extension: warm-up in seconds (wins over `warmupDurationMinutes`).
    #[serde(default)]
    pub warmup_duration_seconds: Option<f64>,
    /// OMB keys that `weir bench` accepts but does not act on.
    #[serde(flatten, skip_serializing)]
    pub ignored: std::collections::BTreeMap<String, serde_yaml::Value>,
}

fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn default_message_size() -> usize {
    1024
}
fn default_random_ratio() -> f64 {
    1.0
}

impl Workload {
    /// Parses YAML text; `base` resolves a relative `payloadFile`.
    pub fn from_yaml(text: &str, base: Option<&Path>) -> anyhow::Result<Self> {
        let mut workload: Workload = serde_yaml::from_str(text).context("workload YAML")?;
        if let (Some(file), Some(base)) = (&workload.payload_file, base) {
            if file.is_relative() {
                workload.payload_file = Some(base.join(file));
            }
        }
        workload.validate()?;
        Ok(workload)
    }

    /// Reads and parses a workload file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading workload {}", path.display()))?;
        Self::from_yaml(&text, path.parent())
            .with_context(|| format!("workload {}", path.display()))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.topics == 0 || self.partitions_per_topic == 0 || self.producers_per_topic == 0 {
            bail!("topics, partitionsPerTopic and producersPerTopic must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.random_bytes_ratio) {
            bail!("randomBytesRatio must be within 0..=1");
        }
        if self.payload_file.is_none() && self.message_size == 0 {
            bail!("messageSize must be at least 1");
        }
        if !self.consumer_backlog_size_gb.is_finite() || self.consumer_backlog_size_gb < 0.0 {
            bail!("consumerBacklogSizeGB must be a size in GiB, 0 or more");
        }
        if self.test_duration().is_zero() {
            bail!("the test duration must be positive");
        }
        Ok(())
    }

    /// Backlog to build before the consumers start, in bytes (0: none).
    pub fn backlog_bytes(&self) -> u64 {
        (self.consumer_backlog_size_gb.max(0.0) * (1u64 << 30) as f64) as u64
    }

    /// Measured duration.
    pub fn test_duration(&self) -> Duration {
        let secs = self
            .test_duration_seconds
            .unwrap_or(self.test_duration_minutes * 60.0);
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// Warm-up duration.
    pub fn warmup_duration(&self) -> Duration {
        let secs = self
            .warmup_duration_seconds
            .unwrap_or(self.warmup_duration_minutes * 60.0);
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// The payload template: the file's bytes, or `messageSize` bytes of which the first
    /// `randomBytesRatio` are random and the rest zeros. The first 8 bytes of each message are
    /// overwritten with its send timestamp (for end-to-end latency) when the payload has room.
    pub fn payload(&self) -> anyhow::Result<Vec<u8>> {
        if let Some(file) = &self.payload_file {
            let bytes = std::fs::read(file)
                .with_context(|| format!("reading payloadFile {}", file.display()))?;
            if bytes.is_empty() {
                bail!("payloadFile {} is empty", file.display());
            }
            return Ok(bytes);
        }
        let mut payload = vec![0u8; self.message_size];
        let random = (self.message_size as f64 * self.random_bytes_ratio).round() as usize;
        let mut rng = fastrand::Rng::with_seed(0x5eed_be4c);
        for byte in &mut payload[..random.min(self.message_size)] {
            *byte = rng.u8(..);
        }
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_workload_parses_omb_keys_and_ignores_unknown() {
        let text = r#"
name: 1 topic / 8 partitions / 1kb
topics: 1
partitionsPerTopic: 8
messageSize: 1024
randomBytesRatio: 0.5
subscriptionsPerTopic: 1
consumerPerSubscription: 2
producersPerTopic: 1
producerRate: 50000
consumerBacklogSizeGB: 0.5
keyDistributor: "NO_KEY"
testDurationMinutes: 15
warmupDurationMinutes: 1
"#;
        let w = Workload::from_yaml(text, None).unwrap();
        assert_eq!(w.partitions_per_topic, 8);
        assert_eq!(w.consumer_per_subscription, 2);
        assert_eq!(w.test_duration(), Duration::from_secs(900));
        assert_eq!(w.warmup_duration(), Duration::from_secs(60));
        assert_eq!(w.backlog_bytes(), 512 << 20);
        assert!(!w.stop_producers_at_backlog);
        assert!(w.ignored.contains_key("keyDistributor"));
        let payload = w.payload().unwrap();
        assert_eq!(payload.len(), 1024);
        assert!(payload[512..].iter().all(|b| *b == 0));
        assert!(payload[..512].iter().any(|b| *b != 0));
    }

    #[test]
    fn test_workload_seconds_override_and_validation() {
        let w = Workload::from_yaml(
            "name: x\ntestDurationMinutes: 5\ntestDurationSeconds: 7\n",
            None,
        )
        .unwrap();
        assert_eq!(w.test_duration(), Duration::from_secs(7));
        assert_eq!(w.warmup_duration(), Duration::ZERO);
        assert!(Workload::from_yaml("name: x\nrandomBytesRatio: 2\n", None).is_err());
        assert!(Workload::from_yaml("name: x\ntopics: 0\n", None).is_err());
        assert!(Workload::from_yaml("name: x\nconsumerBacklogSizeGB: -1\n", None).is_err());
        assert!(
            Workload::from_yaml("topics: 1\n", None).is_err(),
            "name is required"
        );
    }

    #[test]
    fn test_workload_payload_file_relative_to_workload() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("payload")).unwrap();
        std::fs::write(dir.path().join("payload/p.data"), b"0123456789abcdef").unwrap();
        let file = dir.path().join("w.yaml");
        std::fs::write(&file, "name: p\npayloadFile: payload/p.data\n").unwrap();
        let w = Workload::load(&file).unwrap();
        assert_eq!(w.payload().unwrap(), b"0123456789abcdef");
        std::fs::write(&file, "name: p\npayloadFile: payload/missing.data\n").unwrap();
        assert!(Workload::load(&file).unwrap().payload().is_err());
    }
}
