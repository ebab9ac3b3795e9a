//! Request counters and estimated cost, per bucket.
//!
//! Every request that passes the storage layer ([`crate::layer`]) is counted here once per
//! attempt, by request class ([`RequestClass`]) and outcome ([`Outcome`]), with the bytes it moved.
//! Each bucket has a [`PriceTable`] (list prices of its storage class, overridable in config), so
//! the agent knows what its own traffic costs: [`BucketSnapshot::cost`]. The metrics endpoint
//! publishes [`StorageStats::snapshot`]; the agent logs [`StorageStats::summary`] on shutdown.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

/// The billing class of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestClass {
    /// Object writes, including multipart parts, copies and renames.
    Put,
    /// Object reads (whole or ranged).
    Get,
    /// Listings.
    List,
    /// Deletes.
    Delete,
    /// Metadata reads.
    Head,
}

impl RequestClass {
    /// Every class, in a fixed order (the counters' index).
    pub const ALL: [RequestClass; 5] = [
        RequestClass::Put,
        RequestClass::Get,
        RequestClass::List,
        RequestClass::Delete,
        RequestClass::Head,
    ];

    /// The lowercase name used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            RequestClass::Put => "put",
            RequestClass::Get => "get",
            RequestClass::List => "list",
            RequestClass::Delete => "delete",
            RequestClass::Head => "head",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// How one request attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// Success.
    Ok,
    /// The object does not exist (an answer, not a failure).
    NotFound,
    /// A conditional write lost: the object already exists or its version moved (an answer).
    Conflict,
    /// The store asked us to slow down (HTTP 503 SlowDown / 429).
    Throttled,
    /// The attempt did not finish within its deadline.
    Timeout,
    /// Any other failure.
    Error,
}

impl Outcome {
    /// Every outcome, in a fixed order (the counters' index).
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::NotFound,
        Outcome::Conflict,
        Outcome::Throttled,
        Outcome::Timeout,
        Outcome::Error,
    ];

    /// The lowercase name used in logs and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Conflict => "conflict",
            Outcome::Throttled => "throttled",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const CLASSES: usize = RequestClass::ALL.len();
const OUTCOMES: usize = Outcome::ALL.len();

/// Prices of one storage class in US dollars: per 1,000 requests of each class and per GiB
/// moved. Storage-at-rest is not here (it depends on how long objects live, which compaction and
/// retention decide); this table prices the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriceTable {
    /// Dollars per 1,000 PUT-class requests (PUT, COPY, multipart parts).
    pub put_per_1k: f64,
    /// Dollars per 1,000 GET-class requests.
    pub get_per_1k: f64,
    /// Dollars per 1,000 LIST requests (billed as PUT-class by S3 and GCS).
    pub list_per_1k: f64,
    /// Dollars per 1,000 HEAD requests.
    pub head_per_1k: f64,
    /// Dollars per 1,000 DELETE requests (free on the major clouds).
    pub delete_per_1k: f64,
    /// Dollars per GiB uploaded (S3 Express One Zone charges for upload bytes).
    pub upload_per_gib: f64,
    /// Dollars per GiB downloaded within the region (S3 Express retrieval, GCS Rapid reads).
    pub download_per_gib: f64,
}

impl Default for PriceTable {
    fn default() -> Self {
        PriceTable::FREE
    }
}

impl PriceTable {
    /// Local files and memory: no request costs.
    pub const FREE: PriceTable = PriceTable {
        put_per_1k: 0.0,
        get_per_1k: 0.0,
        list_per_1k: 0.0,
        head_per_1k: 0.0,
        delete_per_1k: 0.0,
        upload_per_gib: 0.0,
        download_per_gib: 0.0,
    };

    /// The built-in price classes (us-east-1 / us-central1 list prices, 2025; see
    /// `docs/operations.md`). Override any of them with `[storage.prices.<class>]`.
    pub const NAMES: [&'static str; 7] = [
        "free",
        "s3-standard",
        "s3-express",
        "gcs-standard",
        "gcs-rapid",
        "azure-hot",
        "azure-premium",
    ];

    /// The built-in table named `name`.
    pub fn named(name: &str) -> Option<PriceTable> {
        let table = match name {
            "free" | "local" => PriceTable::FREE,
            "s3-standard" => PriceTable {
                put_per_1k: 0.005,
                get_per_1k: 0.0004,
                list_per_1k: 0.005,
                head_per_1k: 0.0004,
                ..PriceTable::FREE
            },
            "s3-express" => PriceTable {
                put_per_1k: 0.00113,
                get_per_1k: 0.00003,
                list_per_1k: 0.00113,
                head_per_1k: 0.00003,
                upload_per_gib: 0.0032,
                download_per_gib: 0.0006,
                ..PriceTable::FREE
            },
            "gcs-standard" => PriceTable {
                put_per_1k: 0.005,
                get_per_1k: 0.0004,
                list_per_1k: 0.005,
                head_per_1k: 0.0004,
                ..PriceTable::FREE
            },
            "gcs-rapid" => PriceTable {
                put_per_1k: 0.005,
                get_per_1k: 0.0004,
                list_per_1k: 0.005,
                head_per_1k: 0.0004,
                ..PriceTable::FREE
            },
            "azure-hot" => PriceTable {
                put_per_1k: 0.0065,
                get_per_1k: 0.0005,
                list_per_1k: 0.0065,
                head_per_1k: 0.0005,
                ..PriceTable::FREE
            },
            "azure-premium" => PriceTable {
                put_per_1k: 0.00228,
                get_per_1k: 0.000182,
                list_per_1k: 0.00228,
                head_per_1k: 0.000182,
                ..PriceTable::FREE
            },
            _ => return None,
        };
        Some(table)
    }

    /// The default price class of a bucket: from its latency profile when it is a simulated
    /// local bucket (so `--storage-profile s3-express` benchmarks price like S3 Express), else
    /// from its URL scheme (an `s3://` bucket named `*--x-s3` is an S3 Express directory bucket).
    pub fn default_class(scheme: &str, bucket: &str, profile: &str) -> &'static str {
        match scheme {
            "s3" | "s3a" if bucket.ends_with("--x-s3") => "s3-express",
            "s3" | "s3a" => "s3-standard",
            "gs" => "gcs-standard",
            "az" | "azure" | "abfs" | "abfss" => "azure-hot",
            _ => match profile {
                "s3-express" => "s3-express",
                "s3-standard" => "s3-standard",
                "gcs-rapid" => "gcs-rapid",
                "gcs-regional" => "gcs-standard",
                "azure-premium" => "azure-premium",
                _ => "free",
            },
        }
    }

    pub fn per_1k(&self, class: RequestClass) -> f64 {
        match class {
            RequestClass::Put => self.put_per_1k,
            RequestClass::Get => self.get_per_1k,
            RequestClass::List => self.list_per_1k,
            RequestClass::Delete => self.delete_per_1k,
            RequestClass::Head => self.head_per_1k,
        }
    }
}

/// Live counters of one bucket. Cheap to update from any task (relaxed atomics).
pub struct BucketStats {
    name: String,
    price_class: String,
    prices: PriceTable,
    requests: [[AtomicU64; OUTCOMES]; CLASSES],
    retries: [AtomicU64; CLASSES],
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl fmt::Debug for BucketStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketStats")
            .field("name", &self.name)
            .field("price_class", &self.price_class)
            .finish_non_exhaustive()
    }
}

impl BucketStats {
    /// Counters for the bucket called `name` (its URL without options), priced by `prices`.
    pub fn new(name: &str, price_class: &str, prices: PriceTable) -> BucketStats {
        BucketStats {
            name: name.to_string(),
            price_class: price_class.to_string(),
            prices,
            requests: Default::default(),
            retries: Default::default(),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        }
    }

    /// The bucket's display name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts one attempt.
    pub fn record(&self, class: RequestClass, outcome: Outcome) {
        self.requests[class.index()][outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one retry (an attempt after the first) of a request of `class`.
    pub fn record_retry(&self, class: RequestClass) {
        self.retries[class.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes sent to the store.
    pub fn add_bytes_up(&self, bytes: u64) {
        self.bytes_up.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts bytes received from the store.
    pub fn add_bytes_down(&self, bytes: u64) {
        self.bytes_down.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A consistent-enough copy of the counters.
    pub fn snapshot(&self) -> BucketSnapshot {
        let mut requests = [[0u64; OUTCOMES]; CLASSES];
        for (c, row) in self.requests.iter().enumerate() {
            for (o, cell) in row.iter().enumerate() {
                requests[c][o] = cell.load(Ordering::Relaxed);
            }
        }
        BucketSnapshot {
            name: self.name.clone(),
            price_class: self.price_class.clone(),
            prices: self.prices,
            requests,
            retries: std::array::from_fn(|c| self.retries[c].load(Ordering::Relaxed)),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }
}

/// A copy of one bucket's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSnapshot {
    /// The bucket's display name (URL without options).
    pub name: String,
    /// The name of its price table.
    pub price_class: String,
    /// Its price table.
    pub prices: PriceTable,
    requests: [[u64; OUTCOMES]; CLASSES],
    retries: [u64; CLASSES],
    /// Bytes sent to the store.
    pub bytes_up: u64,
    /// Bytes received from the store.
    pub bytes_down: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

impl BucketSnapshot {
    /// Attempts of `class` that ended in `outcome`.
    pub fn requests(&self, class: RequestClass, outcome: Outcome) -> u64 {
        self.requests[class.index()][outcome.index()]
    }

    /// All attempts of `class`, whatever their outcome (what the cloud bills).
    pub fn requests_of(&self, class: RequestClass) -> u64 {
        self.requests[class.index()].iter().sum()
    }

    /// Retries (attempts after the first) of `class`.
    pub fn retries_of(&self, class: RequestClass) -> u64 {
        self.retries[class.index()]
    }

    /// Every attempt of every class.
    pub fn total_requests(&self) -> u64 {
        self.requests.iter().flatten().sum()
    }

    /// Estimated dollars for the requests and bytes counted so far. Failed attempts are billed
    /// too (the clouds bill them, except 5xx on some; this errs on the side of cost).
    pub fn cost(&self) -> f64 {
        let requests: f64 = RequestClass::ALL
            .iter()
            .map(|&c| self.requests_of(c) as f64 / 1000.0 * self.prices.per_1k(c))
            .sum();
        requests
            + self.bytes_up as f64 / GIB * self.prices.upload_per_gib
            + self.bytes_down as f64 / GIB * self.prices.download_per_gib
    }

    /// The change from `earlier` to `self` (counters are monotonic).
    pub fn since(&self, earlier: &BucketSnapshot) -> BucketSnapshot {
        let mut out = self.clone();
        for c in 0..CLASSES {
            for o in 0..OUTCOMES {
                out.requests[c][o] = self.requests[c][o].saturating_sub(earlier.requests[c][o]);
            }
            out.retries[c] = self.retries[c].saturating_sub(earlier.retries[c]);
        }
        out.bytes_up = self.bytes_up.saturating_sub(earlier.bytes_up);
        out.bytes_down = self.bytes_down.saturating_sub(earlier.bytes_down);
        out
    }
}

/// The counters of every bucket an agent opened, in the order they were registered.
#[derive(Debug, Default, Clone)]
pub struct StorageStats {
    buckets: Arc<Mutex<Vec<Arc<BucketStats>>>>,
}

impl StorageStats {
    /// An empty registry.
    pub fn new() -> StorageStats {
        StorageStats::default()
    }

    /// Adds a bucket's counters. A bucket opened twice (the metadata bucket is also an ingest
    /// bucket) is registered once by its caller.
    pub fn register(&self, bucket: Arc<BucketStats>) {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(bucket);
    }

    /// A copy of every bucket's counters.
    pub fn snapshot(&self) -> Vec<BucketSnapshot> {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|b| b.snapshot())
            .collect()
    }

    /// One line per bucket: requests by class, retries, bytes and estimated cost.
    pub fn summary(&self) -> Vec<String> {
        self.snapshot().iter().map(summary_line).collect()
    }
}

/// `s3://a: put=10 get=3 list=1 delete=0 head=0 retries=1 up=1.0MiB down=0.2MiB cost=$0.000052 (s3-standard)`
pub fn summary_line(bucket: &BucketSnapshot) -> String {
    let classes: Vec<String> = RequestClass::ALL
        .iter()
        .map(|&c| format!("{}={}", c.name(), bucket.requests_of(c)))
        .collect();
    let retries: u64 = RequestClass::ALL
        .iter()
        .map(|&c| bucket.retries_of(c))
        .sum();
    format!(
        "{}: {} retries={} up={:.1}MiB down={:.1}MiB cost=${:.6} ({})",
        bucket.name,
        classes.join(" "),
        retries,
        bucket.bytes_up as f64 / (1u64 << 20) as f64,
        bucket.bytes_down as f64 / (1u64 << 20) as f64,
        bucket.cost(),
        bucket.price_class
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_stats_cost_counts_every_attempt_and_byte() {
        let prices = PriceTable::named("s3-express").unwrap();
        let stats = BucketStats::new("s3://b--use1-az4--x-s3", "s3-express", prices);
        for _ in 0..1000 {
            stats.record(RequestClass::Put, Outcome::Ok);
        }
        stats.record(RequestClass::Put, Outcome::Throttled);
        stats.record_retry(RequestClass::Put);
        stats.record(RequestClass::Get, Outcome::NotFound);
        stats.add_bytes_up(1 << 30);
        stats.add_bytes_down(1 << 29);
        let snap = stats.snapshot();
        assert_eq!(snap.requests_of(RequestClass::Put), 1001);
        assert_eq!(snap.requests(RequestClass::Put, Outcome::Throttled), 1);
        assert_eq!(snap.retries_of(RequestClass::Put), 1);
        assert_eq!(snap.total_requests(), 1002);
        let want = 1.001 * 0.00113 + 0.001 * 0.00003 + 0.0032 + 0.5 * 0.0006;
        assert!((snap.cost() - want).abs() < 1e-12, "{}", snap.cost());
        let line = summary_line(&snap);
        assert!(
            line.contains("put=1001") && line.contains("retries=1"),
            "{line}"
        );
        let later = stats.snapshot();
        assert_eq!(later.since(&snap).total_requests(), 0);
    }

    #[test]
    fn test_stats_price_class_defaults() {
        assert_eq!(
            PriceTable::default_class("s3", "b--use1-az4--x-s3", "local"),
            "s3-express"
        );
        assert_eq!(PriceTable::default_class("s3", "b", "local"), "s3-standard");
        assert_eq!(
            PriceTable::default_class("gs", "b", "local"),
            "gcs-standard"
        );
        assert_eq!(PriceTable::default_class("az", "b", "local"), "azure-hot");
        assert_eq!(
            PriceTable::default_class("memory", "", "s3-express"),
            "s3-express"
        );
        assert_eq!(PriceTable::default_class("file", "", "local"), "free");
        // Every latency profile prices like the storage it models.
        for profile in crate::PROFILE_NAMES {
            let class = PriceTable::default_class("memory", "", profile);
            assert_eq!(class == "free", *profile == "local", "{profile} → {class}");
        }
        for name in PriceTable::NAMES {
            assert!(PriceTable::named(name).is_some(), "{name}");
        }
        assert_eq!(PriceTable::named("free").unwrap().put_per_1k, 0.0);
    }
}
