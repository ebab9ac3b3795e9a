//! The object-storage counters as a JSON file (`agent.storage_report`), rewritten every second
//! and at shutdown, for `weir bench` and anyone without a metrics scraper.
//!
//! ```json
//! {"buckets": [{"name": "s3://weir-a", "price_class": "s3-standard",
//!   "requests": {"put": {"ok": 10, "not_found": 0, "conflict": 1, "throttled": 0, "timeout": 0, "error": 0}, ...},
//!   "retries": {"put": 0, ...}, "bytes_up": 1024, "bytes_down": 0, "cost_usd": 0.000055}]}
//! ```

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};
use weir_produce::IngestPool;
use weir_storage::{BucketSnapshot, Outcome, RequestClass, StorageStats};

/// How often the file is rewritten while the agent runs.
const INTERVAL: Duration = Duration::from_secs(1);

fn bucket_json(bucket: &BucketSnapshot) -> Value {
    let mut requests = Map::new();
    let mut retries = Map::new();
    for class in RequestClass::ALL {
        let outcomes: Map<String, Value> = Outcome::ALL
            .iter()
            .map(|&o| (o.name().to_string(), json!(bucket.requests(class, o))))
            .collect();
        requests.insert(class.name().to_string(), Value::Object(outcomes));
        retries.insert(class.name().to_string(), json!(bucket.retries_of(class)));
    }
    json!({
        "name": bucket.name,
        "price_class": bucket.price_class,
        "requests": requests,
        "retries": retries,
        "bytes_up": bucket.bytes_up,
        "bytes_down": bucket.bytes_down,
        "cost_usd": bucket.cost(),
    })
}

/// What the report is made of.
#[derive(Clone)]
pub(crate) struct Sources {
    pub(crate) storage: StorageStats,
    /// The WriterPool, on the appendable ingest path.
    pub(crate) pool: Option<IngestPool>,
    /// Compaction, when it runs.
    pub(crate) compaction: Option<std::sync::Arc<weir_compactor::Compactor>>,
}

/// The report document now.
pub(crate) fn render(sources: &Sources) -> String {
    let buckets: Vec<Value> = sources.storage.snapshot().iter().map(bucket_json).collect();
    let mut doc = json!({ "buckets": buckets });
    if let Some(pool) = &sources.pool {
        let s = pool.stats();
        doc["pool"] = json!({
            "ready": s.ready,
            "loading": s.loading,
            "hits": s.hits,
            "misses": s.misses,
            "created": s.created,
            "discarded": s.discarded,
            "load_errors": s.load_errors,
        });
    }
    if let Some(compactor) = &sources.compaction {
        doc["compaction"] = json!(compactor.stats());
        doc["tiers"] = json!(compactor.tiers());
    }
    doc.to_string()
}

/// Writes the report to `path` (via a temporary file and rename, so readers never see half a
/// file). Failures are logged, never fatal: the report is for observers.
pub(crate) async fn write(path: &Path, sources: &Sources) {
    write_via(path, sources, "tmp").await
}

/// The final write at shutdown, through its own temporary file: a periodic write whose blocking
/// file operations outlive its aborted task cannot tear it.
pub(crate) async fn write_final(path: &Path, sources: &Sources) {
    write_via(path, sources, "final.tmp").await
}

async fn write_via(path: &Path, sources: &Sources, extension: &str) {
    let tmp = path.with_extension(extension);
    let body = render(sources);
    let result = async {
        tokio::fs::write(&tmp, body).await?;
        tokio::fs::rename(&tmp, path).await
    }
    .await;
    if let Err(error) = result {
        tracing::warn!(path = %path.display(), %error, "could not write the storage report; check the directory exists and is writable");
    }
}

/// Rewrites the report every second when `path` is set.
pub(crate) fn spawn(path: &Path, sources: &Sources) -> Option<tokio::task::JoinHandle<()>> {
    if path.as_os_str().is_empty() {
        return None;
    }
    let (path, sources) = (path.to_path_buf(), sources.clone());
    Some(tokio::spawn(async move {
        loop {
            write(&path, &sources).await;
            tokio::time::sleep(INTERVAL).await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use weir_storage::{BucketStats, PriceTable};

    use super::*;

    #[tokio::test]
    async fn test_report_is_written_and_parses() {
        let stats = StorageStats::new();
        let bucket = Arc::new(BucketStats::new(
            "s3://a",
            "s3-standard",
            PriceTable::named("s3-standard").unwrap(),
        ));
        stats.register(bucket.clone());
        for _ in 0..2000 {
            bucket.record(RequestClass::Put, Outcome::Ok);
        }
        bucket.record(RequestClass::Get, Outcome::NotFound);
        bucket.add_bytes_up(4096);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("storage.json");
        let sources = Sources {
            compaction: None,
            storage: stats,
            pool: None,
        };
        write(&path, &sources).await;
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let b = &doc["buckets"][0];
        assert_eq!(b["name"], "s3://a");
        assert_eq!(b["requests"]["put"]["ok"], 2000);
        assert_eq!(b["requests"]["get"]["not_found"], 1);
        assert_eq!(b["bytes_up"], 4096);
        assert!(doc.get("pool").is_none(), "no pool on the PUT path");
        let cost = b["cost_usd"].as_f64().unwrap();
        assert!(
            (cost - (2.0 * 0.005 + 0.001 * 0.0004)).abs() < 1e-12,
            "{cost}"
        );
    }
}
