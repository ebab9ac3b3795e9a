//! Opening the agent's buckets: URL → store → fault model (tests) → storage layer, then the
//! startup checks (capability probes, bucket identity) before anything is served.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use object_store::ObjectStore;
use tracing::{debug, error, info, warn};
use weir_storage::append::memory::MemoryAppendable;
use weir_storage::append::{AppendLimits, AppendableStore, FenceKind};
use weir_storage::hold::{HeldStore, Hold};
use weir_storage::identity::{self, HolderCheck};
use weir_storage::url::{canonical_option, Access, Opened, PRICE_OPTION};
use weir_storage::{
    probe, BucketStats, BucketUrl, LatencyProfile, LayerStore, ModelClock, ModelStore, PriceTable,
    StorageError, StorageStats,
};
use weir_storage_gcs::connect as gcs_connect;
use weir_storage_gcs::{GcsRapid, RapidObjects};
use weir_storage_s3x::{connect as s3x_connect, S3ExpressAppend};

use crate::config::{Config, StorageConfig};

/// A running agent's latency models subtract tokio's timer lag, which would add about a
/// millisecond to every modelled request (`ModelClock`).
const CLOCK: ModelClock = ModelClock::Compensated;

/// One opened bucket: its display name (URL without options), the store Weir uses (the layered
/// store behind its [`Hold`]) and the layered store itself for the identity checks.
#[derive(Clone)]
pub(crate) struct Bucket {
    pub(crate) name: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) direct: Arc<dyn ObjectStore>,
    /// The appendable view (layered and held like `store`) on buckets that have one.
    pub(crate) appendable: Option<Arc<dyn AppendableStore>>,
    pub(crate) hold: Hold,
}

impl Bucket {
    fn new(name: String, layered: impl Into<Stack>) -> Bucket {
        let layered = layered.into();
        let hold = Hold::released();
        let held = HeldStore::new(layered.store.clone(), &name, hold.clone());
        Bucket {
            appendable: layered.appendable.map(|a| held.appendable(a)),
            store: Arc::new(held),
            direct: layered.store,
            name,
            hold,
        }
    }
}

/// A bucket's object view and, where the bucket has appendable objects, its appendable view,
/// wrapped layer by layer together so both see the same model, faults and counters.
#[derive(Debug)]
struct Stack {
    store: Arc<dyn ObjectStore>,
    appendable: Option<Arc<dyn AppendableStore>>,
}

impl From<Arc<dyn ObjectStore>> for Stack {
    fn from(store: Arc<dyn ObjectStore>) -> Stack {
        Stack {
            store,
            appendable: None,
        }
    }
}

impl Stack {
    /// Both views under `model`.
    fn modelled(self, model: ModelStore) -> Stack {
        Stack {
            appendable: self.appendable.map(|a| model.appendable(a)),
            store: Arc::new(model),
        }
    }
}

/// Every bucket of the agent, opened and wrapped (not yet checked: [`Buckets::verify`]).
pub(crate) struct Buckets {
    pub(crate) ingest: Vec<Bucket>,
    /// The metadata log's bucket; the first ingest bucket unless `storage.metadata_bucket`.
    pub(crate) metadata: Bucket,
    /// Whether `metadata` is its own bucket (not `ingest[0]`).
    pub(crate) separate_metadata: bool,
    /// The regional bucket compacted files go to (`storage.compacted_bucket` or its default);
    /// `None` with cloud ingest buckets and no `compacted_bucket` (compaction stays off).
    pub(crate) regional: Option<Bucket>,
    /// Request counters of every bucket (each registered once).
    pub(crate) stats: StorageStats,
}

impl Buckets {
    /// Opens every configured bucket. Cloud clients are built here but nothing is sent yet.
    pub(crate) async fn open(config: &Config, seed: u64) -> anyhow::Result<Buckets> {
        let storage = &config.storage;
        let stats = StorageStats::new();
        let urls = if storage.ingest_buckets.is_empty() {
            std::fs::create_dir_all(&config.agent.data_dir).with_context(|| {
                format!("creating data dir {}", config.agent.data_dir.display())
            })?;
            let dir = std::fs::canonicalize(&config.agent.data_dir)?;
            vec![format!("file://{}/bucket", dir.display())]
        } else {
            storage.ingest_buckets.clone()
        };
        check_bucket_list(storage, &urls)?;
        let mut ingest = Vec::with_capacity(urls.len());
        for (index, url) in urls.iter().enumerate() {
            let (name, raw, bucket_stats) = open_raw(storage, url, &stats).await?;
            let bucket_seed = seed.wrapping_add(index as u64);
            let stack = if storage.down_buckets.contains(&index) {
                let profile =
                    LatencyProfile::named(&storage.profile).context("unknown storage profile")?;
                let down = ModelStore::with_clock(raw.store.clone(), profile, bucket_seed, CLOCK)?;
                down.set_outage(true);
                warn!(bucket = index, %name, "fault test: bucket is down for this run");
                raw.modelled(down)
            } else {
                with_fault_model(raw, storage, bucket_seed)?
            };
            let stack = if storage.slow_buckets.contains(&index) {
                let delay = storage.slow_bucket_delay;
                warn!(bucket = index, %name, ?delay, "fault test: bucket is slow for this run");
                let slow = ModelStore::with_clock(
                    stack.store.clone(),
                    LatencyProfile::constant(&format!("slow-bucket-{index}"), delay),
                    bucket_seed,
                    CLOCK,
                )?;
                stack.modelled(slow)
            } else {
                stack
            };
            ingest.push(Bucket::new(name, layered(stack, storage, bucket_stats)));
        }
        let (metadata, separate_metadata) = if storage.metadata_bucket.is_empty() {
            (ingest[0].clone(), false)
        } else {
            let (name, raw, bucket_stats) =
                open_raw(storage, &storage.metadata_bucket, &stats).await?;
            // A seed apart from the ingest buckets' (seed + index) so its faults are not theirs.
            let store = with_fault_model(raw, storage, seed.rotate_left(17) ^ 0x6d65_7461)?;
            info!(bucket = %name, "metadata log in its own bucket");
            (
                Bucket::new(name, layered(store, storage, bucket_stats)),
                true,
            )
        };
        let regional = match compacted_url(config, &urls)? {
            Some(url) => {
                // A local stand-in for the regional bucket is priced like the regional bucket
                // of its profile's cloud.
                let profile = match storage.profile.as_str() {
                    "s3-express" => "s3-standard",
                    "gcs-rapid" => "gcs-regional",
                    other => other,
                };
                let (name, raw, bucket_stats) = open_priced(storage, &url, &stats, profile).await?;
                info!(bucket = %name, "compacted files in this bucket");
                Some(Bucket::new(name, layered(raw, storage, bucket_stats)))
            }
            None => None,
        };
        Ok(Buckets {
            ingest,
            metadata,
            separate_metadata,
            regional,
            stats,
        })
    }

    /// The startup checks, before the control plane reads anything:
    ///
    /// 1. every bucket Weir writes to must honour create-only writes (the probe writes one key
    ///    twice) — a bucket that does not refuses the start, naming it;
    /// 2. every reachable ingest bucket's id, in configured order, must match the holder list
    ///    recorded in the metadata bucket.
    ///
    /// An ingest bucket that cannot be reached (a transient error after the layer's retries) is
    /// held out of use and logged, so one failed zone does not keep the agent down; the returned
    /// [`PendingBuckets`] checks it in the background and releases it once its id is where the
    /// log expects it. The metadata bucket must be reachable. Anything else (permission denied,
    /// no such bucket, …) stops the start with the store's error.
    pub(crate) async fn verify(&self) -> anyhow::Result<Option<PendingBuckets>> {
        if self.separate_metadata {
            probe::create_only(
                self.metadata.direct.as_ref(),
                &self.metadata.name,
                "the metadata log (create-only slots and epochs)",
            )
            .await
            .map_err(|e| fatal(&self.metadata.name, e))?;
        }
        let mut ids = Vec::with_capacity(self.ingest.len());
        for (index, bucket) in self.ingest.iter().enumerate() {
            let needed_for = if index == 0 && !self.separate_metadata {
                "the metadata log (create-only slots and epochs) and its bucket id"
            } else {
                "its stable bucket id"
            };
            match identify(bucket, needed_for).await {
                Ok(id) => ids.push(Some(id)),
                Err(e) if e.is_retryable() && (index > 0 || self.separate_metadata) => {
                    warn!(
                        bucket = %bucket.name,
                        holder = index,
                        error = %e,
                        "ingest bucket unreachable at startup: held out of use until its bucket \
                         id is verified in the background; produce needs storage.quorum \
                         reachable buckets. Check the bucket's endpoint and credentials"
                    );
                    bucket.hold.engage();
                    ids.push(None);
                }
                Err(e) => return Err(fatal(&bucket.name, e)),
            }
        }
        let names: Vec<String> = self.ingest.iter().map(|b| b.name.clone()).collect();
        match identity::check_holders(self.metadata.direct.as_ref(), &ids, &names).await? {
            HolderCheck::Recorded => info!(buckets = ?names, "ingest bucket ids recorded"),
            HolderCheck::Matches => info!(buckets = ?names, "ingest bucket ids match the log"),
            HolderCheck::Extended { added } => {
                info!(added, buckets = ?names, "ingest buckets appended to the recorded list")
            }
            HolderCheck::NotRecorded => warn!(
                buckets = ?names,
                "ingest bucket list not recorded yet: a bucket was unreachable; it is recorded \
                 once every bucket's id is known"
            ),
        }
        if let Some(regional) = &self.regional {
            let id = identify(regional, "compacted files and its bucket id")
                .await
                .map_err(|e| fatal(&regional.name, e))?;
            identity::check_regional(self.metadata.direct.as_ref(), &id, &regional.name).await?;
        }
        if ids.iter().all(Option::is_some) {
            return Ok(None);
        }
        Ok(Some(PendingBuckets {
            meta: self.metadata.direct.clone(),
            buckets: self.ingest.clone(),
            ids,
            names,
        }))
    }

    /// The ingest buckets' appendable views, in holder order, if every one has one.
    pub(crate) fn ingest_appendable(&self) -> Option<Vec<Arc<dyn AppendableStore>>> {
        self.ingest.iter().map(|b| b.appendable.clone()).collect()
    }

    /// Whether every ingest bucket lives in this process (`memory://`: not durable).
    pub(crate) fn ingest_in_process(&self) -> bool {
        self.ingest
            .iter()
            .all(|b| BucketUrl::parse(&b.name).is_ok_and(|url| !url.is_durable()))
    }

    /// The ingest buckets' layered stores, in holder order.
    pub(crate) fn ingest_stores(&self) -> Vec<Arc<dyn ObjectStore>> {
        self.ingest.iter().map(|b| b.store.clone()).collect()
    }
}

/// The URL of the regional bucket: `storage.compacted_bucket`, else `compacted` beside the first
/// ingest bucket when that is local (`file://…/compacted`, or `memory://compacted` when every
/// ingest bucket is in memory); `None` for cloud ingest buckets without one (Weir keeps no data
/// on local disk behind a cloud deployment's back).
fn compacted_url(config: &Config, ingest: &[String]) -> anyhow::Result<Option<String>> {
    let configured = &config.storage.compacted_bucket;
    if !configured.is_empty() {
        return Ok(Some(configured.clone()));
    }
    let parsed: Vec<BucketUrl> = ingest
        .iter()
        .map(|url| BucketUrl::parse(url))
        .collect::<Result<_, _>>()?;
    if parsed.iter().all(|p| p.scheme == "memory") {
        return Ok(Some("memory://compacted".to_string()));
    }
    if let Some(first) = parsed.first().filter(|p| p.scheme == "file") {
        let dir = std::path::Path::new(&first.bucket);
        let beside = dir.parent().unwrap_or(dir).join("compacted");
        return Ok(Some(format!("file://{}", beside.display())));
    }
    if config.compaction.enabled {
        warn!(
            "compaction is off: the ingest buckets are in the cloud and storage.compacted_bucket \
             is empty; set it to a regional bucket (s3://…, gs://…) to compact"
        );
    }
    Ok(None)
}

/// Refuses configurations that would silently not do what they say: the same bucket twice in the
/// ingest list (a quorum of one physical copy), `bucket_options` for a bucket that is not
/// configured, global options that apply to no configured bucket. Warns when two ingest buckets
/// are prefixes of one bucket (one zone, one failure domain).
fn check_bucket_list(storage: &StorageConfig, urls: &[String]) -> anyhow::Result<()> {
    let mut parsed = Vec::with_capacity(urls.len());
    for url in urls {
        parsed.push(BucketUrl::parse(url)?);
    }
    let scheme = |u: &BucketUrl| {
        if u.scheme == "s3a" {
            "s3".to_string()
        } else {
            u.scheme.clone()
        }
    };
    for (i, a) in parsed.iter().enumerate() {
        for b in &parsed[..i] {
            // Every memory:// bucket is its own store, whatever its name.
            if scheme(a) != scheme(b) || a.bucket != b.bucket || a.scheme == "memory" {
                continue;
            }
            if a.prefix == b.prefix {
                anyhow::bail!(
                    "storage.ingest_buckets lists one bucket twice ({} and {}): a quorum would count one copy as several",
                    b.display_name(),
                    a.display_name()
                );
            }
            warn!(
                first = %b.display_name(),
                second = %a.display_name(),
                "two ingest buckets are prefixes of one bucket: they share its zone and failures"
            );
        }
    }
    let mut names: Vec<String> = parsed.iter().map(BucketUrl::display_name).collect();
    if !storage.metadata_bucket.is_empty() {
        names.push(BucketUrl::parse(&storage.metadata_bucket)?.display_name());
    }
    if let Some(unknown) = storage.bucket_options.keys().find(|k| !names.contains(k)) {
        anyhow::bail!(
            "storage.bucket_options names {unknown:?}, which is not a configured bucket (keys are bucket URLs without the query string: {})",
            names.join(", ")
        );
    }
    let mut schemes: Vec<String> = parsed.iter().map(|u| u.scheme.clone()).collect();
    if !storage.metadata_bucket.is_empty() {
        schemes.push(BucketUrl::parse(&storage.metadata_bucket)?.scheme);
    }
    for key in storage.options.keys() {
        if !schemes.iter().any(|s| canonical_option(s, key).is_some()) {
            anyhow::bail!(
                "storage.options key {key:?} applies to none of the configured buckets ({})",
                schemes.join(", ")
            );
        }
    }
    Ok(())
}

/// The create-only probe and the bucket's id.
async fn identify(bucket: &Bucket, needed_for: &'static str) -> Result<String, StorageError> {
    probe::create_only(bucket.direct.as_ref(), &bucket.name, needed_for).await?;
    identity::ensure_bucket_id(bucket.direct.as_ref(), &bucket.name).await
}

/// Ingest buckets held out of use at startup, checked in the background.
pub(crate) struct PendingBuckets {
    meta: Arc<dyn ObjectStore>,
    buckets: Vec<Bucket>,
    ids: Vec<Option<String>>,
    names: Vec<String>,
}

/// How often a held bucket is checked again.
const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl PendingBuckets {
    /// Tries once to identify every held bucket; releases each that passes. Returns whether
    /// none is held any more. A bucket whose id contradicts the recorded list stays held (and is
    /// reported): only a corrected configuration and a restart can use it.
    pub(crate) async fn check_once(&mut self) -> bool {
        for (index, bucket) in self.buckets.iter().enumerate() {
            if self.ids[index].is_some() {
                continue;
            }
            match identify(bucket, "its stable bucket id").await {
                Ok(id) => self.ids[index] = Some(id),
                Err(e) => {
                    debug!(bucket = %bucket.name, error = %e, "held bucket still unreachable")
                }
            }
        }
        match identity::check_holders(self.meta.as_ref(), &self.ids, &self.names).await {
            Ok(_) => {
                for (index, bucket) in self.buckets.iter().enumerate() {
                    if self.ids[index].is_some() && bucket.hold.is_held() {
                        bucket.hold.release();
                        info!(bucket = %bucket.name, holder = index, "bucket id verified: bucket back in use");
                    }
                }
            }
            Err(StorageError::BucketMismatch(message)) => {
                error!(
                    "{message}\n  the bucket stays out of use: fix storage.ingest_buckets and \
                     restart"
                );
                // Forget what was learnt so the next round reports it again.
                for (index, bucket) in self.buckets.iter().enumerate() {
                    if bucket.hold.is_held() {
                        self.ids[index] = None;
                    }
                }
            }
            Err(e) => debug!(error = %e, "could not check the ingest bucket list"),
        }
        self.buckets.iter().all(|b| !b.hold.is_held())
    }

    /// Checks every [`RECHECK_EVERY`] until no bucket is held.
    pub(crate) fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while !self.check_once().await {
                tokio::time::sleep(RECHECK_EVERY).await;
            }
        })
    }
}

fn fatal(bucket: &str, error: StorageError) -> anyhow::Error {
    match error {
        StorageError::MissingCapability { .. } | StorageError::BucketMismatch(_) => error.into(),
        other => anyhow::Error::new(other).context(format!(
            "bucket {bucket} failed its startup check (is the bucket there, and are the \
             endpoint and credentials right?)"
        )),
    }
}

/// Parses and opens one URL, and registers its counters with the price table that applies.
async fn open_raw(
    storage: &StorageConfig,
    url: &str,
    stats: &StorageStats,
) -> anyhow::Result<(String, Stack, Arc<BucketStats>)> {
    open_priced(storage, url, stats, &storage.profile).await
}

/// [`open_raw`], pricing a local bucket without its own price class as a bucket of `profile`.
async fn open_priced(
    storage: &StorageConfig,
    url: &str,
    stats: &StorageStats,
    profile: &str,
) -> anyhow::Result<(String, Stack, Arc<BucketStats>)> {
    let parsed = BucketUrl::parse(url)?;
    let name = parsed.display_name();
    // Keys are merged by meaning (`endpoint` = `aws_endpoint`), the bucket's own over the
    // global ones. Global options are for cloud buckets and apply where the scheme has them
    // (`region` to s3://, not gs://); a bucket's own unknown keys reach the client, which refuses.
    let mut options: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in &storage.options {
        if let Some(key) = canonical_option(&parsed.scheme, key) {
            options.insert(key, value.clone());
        }
    }
    if let Some(own) = storage.bucket_options.get(&name) {
        for (key, value) in own {
            let key =
                canonical_option(&parsed.scheme, key).unwrap_or_else(|| key.to_ascii_lowercase());
            options.insert(key, value.clone());
        }
    }
    let price_class = parsed.option(&options, PRICE_OPTION).unwrap_or_else(|| {
        PriceTable::default_class(&parsed.scheme, &parsed.bucket, profile).to_string()
    });
    let prices = match storage.prices.get(&price_class) {
        Some(table) => *table,
        None => PriceTable::named(&price_class).with_context(|| {
            format!(
                "bucket {name}: unknown price class {price_class:?} (built in: {}; or define \
                 [storage.prices.{price_class}])",
                PriceTable::NAMES.join(", ")
            )
        })?,
    };
    let opened = parsed
        .open_parts(&options)
        .with_context(|| format!("opening bucket {name}"))?;
    let stack = stack_of(&parsed, opened, storage)
        .await
        .with_context(|| format!("opening bucket {name}"))?;
    let bucket_stats = Arc::new(BucketStats::new(&name, &price_class, prices));
    stats.register(bucket_stats.clone());
    Ok((name, stack, bucket_stats))
}

/// The outermost wrapper of every bucket: the storage layer (deadlines, retries, counters).
fn layered(stack: Stack, storage: &StorageConfig, stats: Arc<BucketStats>) -> Stack {
    let layer = LayerStore::new(stack.store, storage.policy(), stats);
    Stack {
        appendable: stack.appendable.map(|a| layer.appendable(a)),
        store: Arc::new(layer),
    }
}

/// Wraps both views in the configured latency profile and error rate (unchanged for `local`
/// without errors).
fn with_fault_model(stack: Stack, storage: &StorageConfig, seed: u64) -> anyhow::Result<Stack> {
    let profile = LatencyProfile::named(&storage.profile)
        .context("unknown storage profile")?
        .with_error_rate(storage.error_rate);
    if profile.is_zero() {
        return Ok(stack);
    }
    let model = ModelStore::with_clock(stack.store.clone(), profile, seed, CLOCK)?;
    Ok(stack.modelled(model))
}

/// What a local bucket gets under a zonal profile: the appendable double with GCS Rapid's
/// generation fence or S3 Express's write-offset fence, and that backend's limits. Whether the
/// data path uses it is `storage.ingest_writes`; the log, `control.prewarmed_slots`.
fn memory_double(storage: &StorageConfig) -> Option<(FenceKind, AppendLimits)> {
    match storage.profile.as_str() {
        "gcs-rapid" => Some((FenceKind::Generation, AppendLimits::GCS_RAPID)),
        "s3-express" => Some((FenceKind::WriteOffset, AppendLimits::S3_EXPRESS)),
        _ => None,
    }
}

/// The bucket's views:
/// - an S3 directory bucket (`*--x-s3`) appends through `aws-sdk-s3` (S3 Express
///   `PutObject` with a write offset), with `object_store`'s region, endpoint and credentials;
/// - a `gs://` bucket with `rapid=true` reads, writes and appends through the GCS gRPC client
///   ([`RapidObjects`], [`GcsRapid`]); it lists and deletes through `object_store`'s client;
/// - under a zonal profile, `memory://` buckets get the in-memory double and `file://` buckets
///   the write-through double (durable across restarts, for kill -9 tests);
/// - anything else has no appendable view.
async fn stack_of(
    parsed: &BucketUrl,
    opened: Opened,
    storage: &StorageConfig,
) -> anyhow::Result<Stack> {
    match opened.access {
        Some(Access::S3Express {
            bucket,
            region,
            endpoint,
            credentials,
        }) => {
            let client = s3x_connect::client(&s3x_connect::Settings {
                region,
                endpoint,
                credentials,
            });
            let appendable = S3ExpressAppend::new(client, &bucket, Some(&parsed.prefix));
            return Ok(Stack {
                store: parsed.prefixed(opened.store),
                appendable: Some(Arc::new(appendable)),
            });
        }
        Some(Access::GcsRapid {
            bucket,
            grpc_endpoint,
            credentials,
        }) => {
            let mut settings = gcs_connect::Settings::new(credentials);
            settings.endpoint = grpc_endpoint;
            let rapid = GcsRapid::new(&bucket, gcs_connect::client(&settings).await?)?;
            let objects = RapidObjects::new(rapid.clone(), opened.store);
            return Ok(Stack {
                store: parsed.prefixed(Arc::new(objects)),
                appendable: Some(Arc::new(rapid.with_prefix(&parsed.prefix))),
            });
        }
        None => {}
    }
    let raw = parsed.prefixed(opened.store);
    let double = match (memory_double(storage), parsed.scheme.as_str()) {
        (Some((fence, limits)), "memory") => MemoryAppendable::over(raw, fence, limits, false),
        (Some((fence, limits)), "file") => MemoryAppendable::write_through(raw, fence, limits),
        _ => return Ok(Stack::from(raw)),
    };
    Ok(Stack {
        appendable: Some(Arc::new(double.clone())),
        store: Arc::new(double),
    })
}

#[cfg(test)]
mod tests;
