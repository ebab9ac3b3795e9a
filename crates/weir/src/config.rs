//! Agent configuration: `config/weir.toml` defaults, overridden by `WEIR_<SECTION>_<KEY>`
//! environment variables, overridden by command-line flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

/// The config file shipped in the repository; also the documentation of every key.
pub(crate) const DEFAULT_CONFIG: &str = include_str!("../../../config/weir.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) agent: AgentConfig,
    pub(crate) kafka: KafkaConfig,
    pub(crate) storage: StorageConfig,
    pub(crate) produce: ProduceConfig,
    pub(crate) control: ControlConfig,
    pub(crate) groups: GroupsConfig,
    pub(crate) retention: RetentionConfig,
    pub(crate) gc: GcConfig,
    pub(crate) compaction: CompactionConfig,
    pub(crate) cluster: ClusterConfig,
    pub(crate) http: HttpConfig,
}

/// `[http]`: the metrics, health and status endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpConfig {
    /// "" disables the endpoint.
    pub(crate) listen: String,
    #[serde(with = "humantime_serde")]
    pub(crate) probe_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) probe_timeout: Duration,
    pub(crate) max_topic_labels: usize,
    pub(crate) max_group_labels: usize,
}

/// `[cluster]` (RFC 0002).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterConfig {
    pub(crate) control_listen: String,
    /// `host:port` peers reach the control service at ("": advertised host, bound port).
    pub(crate) control_advertise: String,
    #[serde(with = "humantime_serde")]
    pub(crate) lease_renew: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) lease_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) forward_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) agent_timeout: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentConfig {
    pub(crate) listen: String,
    pub(crate) advertised_host: String,
    pub(crate) node_id: i32,
    pub(crate) rack: String,
    pub(crate) data_dir: PathBuf,
    pub(crate) failpoints: String,
    pub(crate) storage_report: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KafkaConfig {
    pub(crate) auto_create_topics: bool,
    pub(crate) num_partitions: i32,
    pub(crate) max_frame_bytes: usize,
    pub(crate) max_nonproduce_frame_bytes: usize,
    pub(crate) max_connections: usize,
    pub(crate) max_inflight_per_connection: usize,
    pub(crate) max_inflight_request_bytes: usize,
    pub(crate) max_inflight_fetch_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) connections_max_idle: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) request_read_timeout: Duration,
    pub(crate) max_fetch_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) max_fetch_wait: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StorageConfig {
    pub(crate) ingest_buckets: Vec<String>,
    pub(crate) quorum: usize,
    pub(crate) profile: String,
    pub(crate) error_rate: f64,
    pub(crate) fault_seed: u64,
    pub(crate) down_buckets: Vec<usize>,
    pub(crate) slow_buckets: Vec<usize>,
    #[serde(with = "humantime_serde")]
    pub(crate) slow_bucket_delay: Duration,
    pub(crate) metadata_bucket: String,
    /// The regional bucket compacted files go to ("": beside the default local bucket).
    pub(crate) compacted_bucket: String,
    pub(crate) max_lagging_bytes_per_bucket: u64,
    #[serde(with = "humantime_serde")]
    pub(crate) read_hedge_after: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) request_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) attempt_timeout: Duration,
    pub(crate) min_throughput: u64,
    pub(crate) max_attempts: u32,
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_base: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) throttle_backoff_base: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) backoff_max: Duration,
    pub(crate) cache_bytes: usize,
    /// Bytes of a lagging partition read ahead into the cache (0: off); capped at a sixteenth
    /// of `cache_bytes`.
    pub(crate) read_ahead_bytes: u64,
    /// Options for every cloud bucket (object_store config keys).
    pub(crate) options: BTreeMap<String, String>,
    /// Options of one bucket, keyed by its URL without query string.
    pub(crate) bucket_options: BTreeMap<String, BTreeMap<String, String>>,
    /// Price tables by class name: overrides of the built-in ones, or new classes.
    pub(crate) prices: BTreeMap<String, weir_storage::PriceTable>,
    /// How sealed files are written to the ingest buckets.
    pub(crate) ingest_writes: IngestWriteMode,
    /// The WriterPool of the appendable path.
    pub(crate) pool: PoolConfig,
}

/// `storage.ingest_writes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum IngestWriteMode {
    /// Append into pooled objects when every ingest bucket can, else PUT.
    Auto,
    /// One whole-object PUT per file and bucket.
    Put,
    /// Append into pooled objects; refuse to start when a bucket cannot.
    Append,
}

/// `[storage.pool]`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PoolConfig {
    pub(crate) target_ready: usize,
    pub(crate) load_concurrency: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) max_item_age: Duration,
}

impl PoolConfig {
    pub(crate) fn settings(&self) -> weir_storage::pool::PoolSettings {
        weir_storage::pool::PoolSettings {
            target_ready: self.target_ready,
            load_concurrency: self.load_concurrency,
            max_item_age: self.max_item_age,
        }
    }
}

impl StorageConfig {
    /// The storage layer's deadlines and retries.
    pub(crate) fn policy(&self) -> weir_storage::LayerPolicy {
        weir_storage::LayerPolicy {
            request_timeout: self.request_timeout,
            attempt_timeout: self.attempt_timeout,
            min_throughput: self.min_throughput,
            max_attempts: self.max_attempts,
            backoff_base: self.backoff_base,
            throttle_backoff_base: self.throttle_backoff_base,
            backoff_max: self.backoff_max,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProduceConfig {
    pub(crate) flush_interval: FlushInterval,
    pub(crate) target_file_bytes: TargetFileBytes,
    pub(crate) max_file_bytes: usize,
    pub(crate) max_inflight_uploads: usize,
    pub(crate) eager_uploads: usize,
    pub(crate) upload_attempts: u32,
    pub(crate) parallel_persistence: bool,
    #[serde(with = "humantime_serde")]
    pub(crate) ack_deadline: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) clock_skew_margin: Duration,
    pub(crate) validation: Validation,
    pub(crate) max_decompressed_bytes: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) producer_id_expiration: Duration,
    pub(crate) init_producer_id_rate: f64,
    pub(crate) init_producer_id_burst: u32,
    pub(crate) max_producer_ids: usize,
}

/// `produce.validation`: how much of each produced batch the agent decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Validation {
    Framing,
    Full,
}

impl From<Validation> for weir_server::ProduceValidation {
    fn from(value: Validation) -> Self {
        match value {
            Validation::Framing => Self::Framing,
            Validation::Full => Self::Full,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControlConfig {
    pub(crate) max_inflight_writes: usize,
    /// Also accepted as `snapshot_every_slots` (its name before RFC 0003, see [`KEY_ALIASES`]).
    pub(crate) snapshot_max_slots: u64,
    pub(crate) snapshot_max_log_bytes: u64,
    #[serde(with = "humantime_serde")]
    pub(crate) snapshot_max_interval: Duration,
    pub(crate) log_gc: bool,
    #[serde(with = "humantime_serde")]
    pub(crate) agent_tip_expiry: Duration,
    pub(crate) prewarmed_slots: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionConfig {
    #[serde(with = "humantime_serde")]
    pub(crate) check_interval: Duration,
    pub(crate) default_ms: i64,
    pub(crate) default_bytes: i64,
}

impl RetentionConfig {
    pub(crate) fn settings(&self) -> weir_control::maintenance::RetentionSettings {
        weir_control::maintenance::RetentionSettings {
            check_interval: self.check_interval,
            defaults: weir_control::maintenance::RetentionDefaults {
                ms: self.default_ms,
                bytes: self.default_bytes,
            },
        }
    }
}

impl Config {
    /// Expiry of idle producer ids and commit-chain tips.
    pub(crate) fn expiry(&self) -> weir_control::maintenance::ExpirySettings {
        weir_control::maintenance::ExpirySettings {
            producer_id_expiration: self.produce.producer_id_expiration,
            agent_tip_expiry: self.control.agent_tip_expiry,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GcConfig {
    #[serde(with = "humantime_serde")]
    pub(crate) grace: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) interval: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) fetch_plan_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) sweep_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) orphan_age: Duration,
}

/// `[compaction]` (RFC 0005).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactionConfig {
    pub(crate) enabled: bool,
    pub(crate) workers: usize,
    pub(crate) target_file_bytes: u64,
    pub(crate) max_inputs: usize,
    pub(crate) index_entry_bytes: u32,
    pub(crate) multipart_threshold: u64,
    #[serde(with = "humantime_serde")]
    pub(crate) min_input_age: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) max_input_age: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) plan_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) job_lease: Duration,
    pub(crate) max_queued_jobs: usize,
}

impl CompactionConfig {
    pub(crate) fn settings(&self) -> weir_compactor::Settings {
        weir_compactor::Settings {
            target_file_bytes: self.target_file_bytes,
            max_inputs: self.max_inputs,
            max_run_bytes: self.index_entry_bytes,
            multipart_threshold: self.multipart_threshold,
            min_input_age: self.min_input_age,
            max_input_age: self.max_input_age,
            plan_interval: self.plan_interval,
            job_lease: self.job_lease,
            // A planned file still in the ingest tier after a few leases lost its job.
            replan_after: (self.job_lease * 4).max(self.max_input_age),
            ..weir_compactor::Settings::default()
        }
    }

    pub(crate) fn queue_settings(&self) -> weir_objq::Settings {
        weir_objq::Settings {
            lease: self.job_lease,
            max_jobs: self.max_queued_jobs,
            ..weir_objq::Settings::default()
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupsConfig {
    #[serde(with = "humantime_serde")]
    pub(crate) min_session_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) max_session_timeout: Duration,
    pub(crate) max_group_size: usize,
    pub(crate) max_groups: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) initial_rebalance_delay: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) offsets_retention: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) expiry_startup_delay: Duration,
}

impl GroupsConfig {
    /// The coordinator's settings (session timeouts in milliseconds, as Kafka sends them).
    pub(crate) fn settings(&self) -> weir_groups::GroupSettings {
        let millis = |d: Duration| i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
        weir_groups::GroupSettings {
            min_session_timeout_ms: millis(self.min_session_timeout),
            max_session_timeout_ms: millis(self.max_session_timeout),
            max_members_per_group: self.max_group_size,
            max_groups: self.max_groups,
            initial_rebalance_delay_ms: i64::from(millis(self.initial_rebalance_delay)),
            ..weir_groups::GroupSettings::default()
        }
    }
}

/// The longest `produce.flush_interval`: a batch waiting longer would time out most clients'
/// requests (Kafka's default `request.timeout.ms` is 30 s).
const MAX_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// `produce.flush_interval`: a duration, or `auto` for the default of the storage profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub(crate) enum FlushInterval {
    Auto,
    Fixed(Duration),
}

impl TryFrom<String> for FlushInterval {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        if text == "auto" {
            return Ok(FlushInterval::Auto);
        }
        humantime::parse_duration(&text)
            .map(FlushInterval::Fixed)
            .map_err(|err| format!("flush_interval {text:?}: {err} (a duration or \"auto\")"))
    }
}

impl FlushInterval {
    /// The interval for `profile`. `auto` follows the PUTs-per-GiB curves of docs/benchmarks.md
    /// §4 and §16: where a PUT is expensive and slow (s3-standard, gcs-regional) a longer flush
    /// cuts request cost ~10x for ~100 ms of latency; on low-latency zonal storage 50 ms with a
    /// 1 MiB target keeps files at 1 MiB from 20 MiB/s on (≤ 1,024 PUTs per GiB per bucket),
    /// while adaptive sealing keeps lower rates from waiting for it; local files pay no request
    /// cost, so they flush at 5 ms.
    pub(crate) fn resolve(self, profile: &str) -> Duration {
        match self {
            FlushInterval::Fixed(interval) => interval,
            FlushInterval::Auto => match profile {
                "s3-standard" | "gcs-regional" => Duration::from_millis(100),
                "s3-express" | "gcs-rapid" | "azure-premium" => Duration::from_millis(50),
                _ => Duration::from_millis(5),
            },
        }
    }
}

/// `produce.target_file_bytes`: bytes, or `auto` for the default of the storage profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "toml::Value")]
pub(crate) enum TargetFileBytes {
    Auto,
    Fixed(usize),
}

impl TryFrom<toml::Value> for TargetFileBytes {
    type Error = String;

    fn try_from(value: toml::Value) -> Result<Self, Self::Error> {
        // A `WEIR_` variable arrives as a string where the default is one ("auto").
        let bytes = match &value {
            toml::Value::String(text) if text == "auto" => return Ok(TargetFileBytes::Auto),
            toml::Value::String(text) => text.parse::<usize>().ok(),
            toml::Value::Integer(bytes) => usize::try_from(*bytes).ok(),
            _ => None,
        };
        match bytes {
            Some(bytes) if bytes > 0 => Ok(TargetFileBytes::Fixed(bytes)),
            _ => Err(format!(
                "target_file_bytes {value}: a positive number of bytes or \"auto\""
            )),
        }
    }
}

impl TargetFileBytes {
    /// The target for `profile`: 1 MiB where a PUT is cheap and fast (zonal buckets, local
    /// files), so a high rate seals a file as soon as it is worth its PUT; 8 MiB on s3-standard
    /// and gcs-regional, where a PUT costs ~5x more and a bigger file is worth its wait.
    pub(crate) fn resolve(self, profile: &str) -> usize {
        match self {
            TargetFileBytes::Fixed(bytes) => bytes,
            TargetFileBytes::Auto => match profile {
                "s3-standard" | "gcs-regional" => 8 << 20,
                _ => 1 << 20,
            },
        }
    }
}

impl Config {
    /// Loads the defaults, then `path` (if given) over them, then `WEIR_*` variables from `env`.
    pub(crate) fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> anyhow::Result<Self> {
        let mut merged: toml::Table = DEFAULT_CONFIG.parse().context("built-in config")?;
        if let Some(path) = path {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            let file: toml::Table = text
                .parse()
                .with_context(|| format!("parsing config {}", path.display()))?;
            merge(&mut merged, file)?;
        }
        apply_env(&mut merged, env)?;
        let config: Config = toml::Value::Table(merged)
            .try_into()
            .context("invalid configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// The WriterPool's settings against the rest, checked when an agent starts a pool (the
    /// PUT path has none, so a short `gc.orphan_age` in a test does not trip it).
    pub(crate) fn validate_pool(&self) -> anyhow::Result<()> {
        self.storage
            .pool
            .settings()
            .validate(self.gc.orphan_age)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if self.control.agent_tip_expiry <= self.storage.pool.max_item_age * 2 {
            bail!(
                "control.agent_tip_expiry ({:?}) must exceed twice storage.pool.max_item_age \
                 ({:?}): a pooled file's id is up to that old when it commits, and the commit \
                 chain of a busy agent must not expire under it",
                self.control.agent_tip_expiry,
                self.storage.pool.max_item_age
            );
        }
        Ok(())
    }

    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.storage.quorum == 0 {
            bail!("storage.quorum must be at least 1");
        }
        if !self.storage.ingest_buckets.is_empty()
            && self.storage.quorum > self.storage.ingest_buckets.len()
        {
            bail!(
                "storage.quorum {} exceeds the {} ingest buckets",
                self.storage.quorum,
                self.storage.ingest_buckets.len()
            );
        }
        let buckets = self.storage.ingest_buckets.len().max(1);
        for (key, indices) in [
            ("down_buckets", &self.storage.down_buckets),
            ("slow_buckets", &self.storage.slow_buckets),
        ] {
            if let Some(bad) = indices.iter().find(|b| **b >= buckets) {
                bail!(
                    "storage.{key} names bucket {bad}, but there {} {buckets} ingest bucket{} \
                     (indices 0 to {})",
                    if buckets == 1 { "is" } else { "are" },
                    if buckets == 1 { "" } else { "s" },
                    buckets - 1
                );
            }
        }
        if self.storage.metadata_bucket.is_empty() && self.storage.down_buckets.contains(&0) {
            bail!(
                "storage.down_buckets names bucket 0, which holds the metadata log; \
                 set storage.metadata_bucket to keep the log elsewhere"
            );
        }
        self.storage
            .policy()
            .validate()
            .map_err(anyhow::Error::msg)?;
        if self.kafka.request_read_timeout.is_zero() {
            bail!("kafka.request_read_timeout must be positive");
        }
        if self.kafka.connections_max_idle <= self.kafka.max_fetch_wait {
            bail!(
                "kafka.connections_max_idle ({:?}) must exceed kafka.max_fetch_wait ({:?}): a \
                 consumer waiting on a fetch long-poll sends nothing meanwhile",
                self.kafka.connections_max_idle,
                self.kafka.max_fetch_wait
            );
        }
        let uploads = self.produce.max_inflight_uploads.max(1);
        if !(1..=uploads).contains(&self.produce.eager_uploads) {
            bail!(
                "produce.eager_uploads is {}, but must be between 1 and \
                 produce.max_inflight_uploads ({uploads})",
                self.produce.eager_uploads
            );
        }
        let probe = weir_control::log::DEAD_SLOT_PROBE;
        if self.control.max_inflight_writes == 0 || self.control.max_inflight_writes as u64 > probe
        {
            bail!(
                "control.max_inflight_writes is {}, but must be between 1 and {probe}: recovery \
                 looks for a deposed writer's in-flight log slots only that far past the end of \
                 the log, and a slot beyond it would hide every later write from replay",
                self.control.max_inflight_writes
            );
        }
        if self.kafka.num_partitions < 1 {
            bail!("kafka.num_partitions must be at least 1");
        }
        if self.produce.max_decompressed_bytes < 1024 * 1024 {
            bail!(
                "produce.max_decompressed_bytes must be at least 1 MiB: below that, ordinary \
                 compressed batches are refused"
            );
        }
        if self.kafka.max_frame_bytes < 1024 || self.kafka.max_frame_bytes > i32::MAX as usize {
            bail!("kafka.max_frame_bytes must be between 1 KiB and 2 GiB");
        }
        if self.groups.min_session_timeout > self.groups.max_session_timeout {
            bail!("groups.min_session_timeout exceeds groups.max_session_timeout");
        }
        if self.groups.max_group_size == 0 || self.groups.max_groups == 0 {
            bail!("groups.max_group_size and groups.max_groups must be at least 1");
        }
        if !(0.0..1.0).contains(&self.storage.error_rate) {
            bail!("storage.error_rate must be in [0, 1)");
        }
        if self.produce.producer_id_expiration.is_zero()
            || self.control.agent_tip_expiry < Duration::from_secs(60)
            || self.groups.offsets_retention.is_zero()
        {
            bail!(
                "produce.producer_id_expiration and groups.offsets_retention must be positive, \
                 control.agent_tip_expiry at least 1m"
            );
        }
        let rate = self.produce.init_producer_id_rate;
        if !rate.is_finite() || rate <= 0.0 || self.produce.init_producer_id_burst == 0 {
            bail!("produce.init_producer_id_rate and init_producer_id_burst must be positive");
        }
        if self.retention.check_interval.is_zero()
            || self.gc.interval.is_zero()
            || self.gc.sweep_interval.is_zero()
            || self.gc.orphan_age.is_zero()
        {
            bail!(
                "retention.check_interval, gc.interval, gc.sweep_interval and gc.orphan_age must \
                 be positive"
            );
        }
        let probe = weir_control::log::DEAD_SLOT_PROBE as usize;
        if self.control.prewarmed_slots > probe / 2 {
            bail!(
                "control.prewarmed_slots ({}) must be at most {}: a new leader looks for a \
                 deposed writer's pre-warmed slots {probe} slots past the end of the log",
                self.control.prewarmed_slots,
                probe / 2
            );
        }
        if self.retention.default_ms < -1 || self.retention.default_bytes < -1 {
            bail!("retention.default_ms and retention.default_bytes must be -1 (forever) or more");
        }
        let cluster = &self.cluster;
        if !cluster.control_listen.is_empty()
            && (cluster.lease_renew.is_zero()
                || cluster.lease_timeout < cluster.lease_renew * 3
                || cluster.forward_timeout.is_zero()
                || cluster.agent_timeout < cluster.lease_renew * 3)
        {
            anyhow::bail!(
                "cluster.lease_timeout and cluster.agent_timeout must be at least \
                 3 × cluster.lease_renew (> 0), and cluster.forward_timeout above 0"
            );
        }
        if !cluster.control_advertise.is_empty() && cluster.control_listen.is_empty() {
            bail!("cluster.control_advertise is set, but cluster.control_listen is not: a single agent has no control service");
        }
        if !cluster.control_advertise.is_empty()
            && cluster
                .control_advertise
                .rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            bail!(
                "cluster.control_advertise is {:?}, not host:port",
                cluster.control_advertise
            );
        }
        let compaction = &self.compaction;
        if compaction.enabled
            && (compaction.workers > 64
                || compaction.target_file_bytes < 1 << 20
                || compaction.max_inputs == 0
                || !(64 << 10..=64 << 20).contains(&compaction.index_entry_bytes)
                || !(64 << 20..=4 << 30).contains(&compaction.multipart_threshold)
                || compaction.max_queued_jobs == 0
                || compaction.plan_interval.is_zero()
                || compaction.job_lease < Duration::from_secs(1)
                || compaction.max_input_age < compaction.min_input_age)
        {
            bail!(
                "invalid [compaction]: workers at most 64, target_file_bytes at least 1 MiB, \
                 max_inputs, max_queued_jobs and plan_interval above 0, index_entry_bytes from \
                 64 KiB to 64 MiB, multipart_threshold from 64 MiB to 4 GiB, job_lease at least 1s, max_input_age at least min_input_age"
            );
        }
        if self.gc.fetch_plan_ttl.is_zero() || self.gc.grace <= self.gc.fetch_plan_ttl * 2 {
            bail!(
                "gc.grace ({:?}) must exceed twice gc.fetch_plan_ttl ({:?}): a fetch that planned \
                 its reads just before a file was released may still read it for that long",
                self.gc.grace,
                self.gc.fetch_plan_ttl
            );
        }
        if !self.cluster.control_listen.is_empty()
            && self.gc.grace <= self.gc.fetch_plan_ttl * 2 + self.cluster.lease_timeout
        {
            bail!(
                "gc.grace ({:?}) must exceed twice gc.fetch_plan_ttl ({:?}) plus \
                 cluster.lease_timeout ({:?}): a follower serves reads from a replica up to the \
                 lease timeout old, whose plans may name files released that long ago",
                self.gc.grace,
                self.gc.fetch_plan_ttl,
                self.cluster.lease_timeout
            );
        }
        if let FlushInterval::Fixed(interval) = self.produce.flush_interval {
            if interval > MAX_FLUSH_INTERVAL {
                bail!(
                    "produce.flush_interval ({interval:?}) must be at most {:?}",
                    MAX_FLUSH_INTERVAL
                );
            }
        }
        if weir_storage::LatencyProfile::named(&self.storage.profile).is_none() {
            bail!(
                "unknown storage.profile {:?}; known: {}",
                self.storage.profile,
                weir_storage::PROFILE_NAMES.join(", ")
            );
        }
        Ok(())
    }
}

/// Overlays `over` onto `base`, key by key; unknown sections or keys are errors.
/// Keys renamed whose old name is still accepted, in files and `WEIR_` variables:
/// `(section, old, new)`.
const KEY_ALIASES: &[(&str, &str, &str)] =
    &[("control", "snapshot_every_slots", "snapshot_max_slots")];

/// The current name of `section.key`.
fn canonical_key(section: &str, key: &str) -> String {
    KEY_ALIASES
        .iter()
        .find(|(s, old, _)| *s == section && *old == key)
        .map_or(key, |(_, _, new)| new)
        .to_string()
}

fn merge(base: &mut toml::Table, over: toml::Table) -> anyhow::Result<()> {
    for (section, value) in over {
        let Some(toml::Value::Table(target)) = base.get_mut(&section) else {
            bail!("unknown config section [{section}]");
        };
        let toml::Value::Table(values) = value else {
            bail!("config section [{section}] must be a table");
        };
        for (key, value) in values {
            let key = canonical_key(&section, &key);
            if !target.contains_key(&key) {
                bail!("unknown config key {section}.{key}");
            }
            target.insert(key, value);
        }
    }
    Ok(())
}

/// `WEIR_PRODUCE_FLUSH_INTERVAL=10ms` sets `produce.flush_interval`. Values are parsed as TOML
/// when they can be (numbers, booleans, arrays) and taken as strings otherwise.
fn apply_env(
    base: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("WEIR_") else {
            continue;
        };
        let lowered = rest.to_ascii_lowercase();
        let mut matched = false;
        for (section, table) in base.iter_mut() {
            let toml::Value::Table(table) = table else {
                continue;
            };
            let Some(key) = lowered.strip_prefix(&format!("{section}_")) else {
                continue;
            };
            if let Some(slot) = table.get_mut(&canonical_key(section, key)) {
                *slot = parse_env_value(&raw, slot)
                    .with_context(|| format!("environment variable {name}"))?;
                matched = true;
            }
        }
        let names_a_section = base
            .keys()
            .any(|section| lowered.starts_with(&format!("{section}_")));
        if !matched && names_a_section && !SHORT_ENV.contains(&name.as_str()) {
            tracing::warn!(variable = %name, "ignoring unknown WEIR_ environment variable");
        }
    }
    Ok(())
}

/// Variables read by command-line flags directly (see `main.rs`).
const SHORT_ENV: &[&str] = &[
    "WEIR_LISTEN",
    "WEIR_DATA_DIR",
    "WEIR_CONFIG",
    "WEIR_LOG",
    "WEIR_LOG_FORMAT",
];

fn parse_env_value(raw: &str, current: &toml::Value) -> anyhow::Result<toml::Value> {
    // `auto` is a string in every key that takes it, whatever the value it overrides.
    if current.is_str() || raw == "auto" {
        return Ok(toml::Value::String(raw.to_string()));
    }
    let wrapped = format!("value = {raw}");
    let table: toml::Table = wrapped
        .parse()
        .with_context(|| format!("cannot parse {raw:?} as {}", current.type_str()))?;
    let value = table.get("value").cloned().context("missing value")?;
    if value.type_str() != current.type_str() {
        bail!("expected a {}, got {raw:?}", current.type_str());
    }
    Ok(value)
}

#[cfg(test)]
mod tests;
