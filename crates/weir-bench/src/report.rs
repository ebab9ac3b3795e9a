//! Latency summaries, the final report, its text table and its JSON form.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histograms track, in microseconds (one hour).
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

/// A latency histogram in microseconds, 3 significant figures.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// Records `us` microseconds, clamped into the histogram's range.
pub fn record(histogram: &mut Histogram<u64>, us: u64) {
    let _ = histogram.record(us.clamp(1, MAX_LATENCY_US));
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// What the agent process used during the measured window (only when its pid is known).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct AgentUsage {
    pub pid: u32,
    /// utime + stime over the measured window.
    pub cpu_seconds: f64,
    /// `cpu_seconds` per MiB acknowledged in the window.
    pub cpu_seconds_per_mib: f64,
    /// `cpu_seconds` per MiB read by the consumers in the window (all of the agent's CPU: a
    /// per-MiB cost of reading only in a window without producing, as a backlog run that
    /// stops its producers measures).
    #[serde(default)]
    pub cpu_seconds_per_mib_consumed: f64,
    /// VmHWM at the end of the run.
    pub peak_rss_mib: f64,
}

/// How a backlog run's consumers read their backlog (`consumerBacklogSizeGB`).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct CatchUp {
    /// Messages and bytes acknowledged when the consumers started, over all subscriptions.
    pub backlog_messages: u64,
    pub backlog_bytes: u64,
    /// Whether the producers kept producing while the consumers read the backlog.
    pub producing: bool,
    /// Seconds from the consumers' start until they had read the backlog; `None`: not in the run.
    pub seconds: Option<f64>,
    /// MiB/s read by the consumers over those seconds.
    pub rate_mib: Option<f64>,
    /// Messages acknowledged but not yet read at the end of the window (all subscriptions):
    /// with producers still producing, a consumer that read the backlog may still be behind.
    #[serde(default)]
    pub behind_at_end: u64,
}

/// Objects in the agent's local bucket after the run: each file is one PUT.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct ObjectCounts {
    pub bucket: String,
    /// Data files (`ingest/`).
    pub ingest_files: u64,
    /// Metadata log slots (`meta/log/`).
    pub meta_log_files: u64,
    /// Everything else (snapshots, epochs).
    pub other_files: u64,
    pub total_puts: u64,
    /// Bytes acknowledged over the whole run (warm-up included), which the objects hold.
    pub acked_bytes: u64,
    pub puts_per_gib: f64,
    pub ingest_puts_per_gib: f64,
    /// At the assumed S3 Standard PUT price (see `S3_STANDARD_PUT_USD_PER_1000`).
    pub usd_per_gib_s3_standard: f64,
    /// At the assumed S3 Express One Zone PUT price plus its per-GB upload charge (one bucket;
    /// a k-of-n quorum writes every data file to n buckets).
    pub usd_per_gib_s3_express: f64,
}

/// S3 Standard PUT/COPY/POST/LIST, us-east-1, USD per 1,000 requests (AWS price list, 2025).
pub const S3_STANDARD_PUT_USD_PER_1000: f64 = 0.005;
/// S3 Express One Zone PUT, USD per 1,000 requests (AWS price list after the April 2025 cut).
pub const S3_EXPRESS_PUT_USD_PER_1000: f64 = 0.00113;
/// S3 Express One Zone data upload charge, USD per GB of every request's bytes (same list; AWS's
/// worked examples divide KB by 1,048,576, i.e. the GB is a GiB).
pub const S3_EXPRESS_UPLOAD_USD_PER_GB: f64 = 0.0032;

impl ObjectCounts {
    /// Fills the derived per-GiB fields.
    pub fn finish(mut self) -> Self {
        self.total_puts = self.ingest_files + self.meta_log_files + self.other_files;
        let gib = self.acked_bytes as f64 / (1u64 << 30) as f64;
        if gib > 0.0 {
            self.puts_per_gib = self.total_puts as f64 / gib;
            self.ingest_puts_per_gib = self.ingest_files as f64 / gib;
            self.usd_per_gib_s3_standard =
                self.puts_per_gib * S3_STANDARD_PUT_USD_PER_1000 / 1000.0;
            self.usd_per_gib_s3_express = self.puts_per_gib * S3_EXPRESS_PUT_USD_PER_1000 / 1000.0
                + S3_EXPRESS_UPLOAD_USD_PER_GB;
        }
        self
    }
}

/// Object-store requests and estimated cost over the whole run, from the agent's own counters
/// (its `--storage-report` file, read after it stopped): every attempt the storage layer made,
/// in every bucket (ingest copies, metadata log, probes), priced by each bucket's price table.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct StorageCounts {
    /// Requests by class (put, get, list, delete, head) summed over buckets.
    pub requests: std::collections::BTreeMap<String, u64>,
    pub total_requests: u64,
    /// Attempts after the first (already counted in `requests`).
    pub retries: u64,
    /// Price classes of the buckets, e.g. `s3-express`.
    pub price_classes: Vec<String>,
    pub buckets: usize,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub usd: f64,
    /// Bytes acknowledged over the whole run.
    pub acked_bytes: u64,
    pub requests_per_gib: f64,
    pub puts_per_gib: f64,
    pub usd_per_gib: f64,
}

impl StorageCounts {
    /// Sums the agent's storage report (`weir agent --storage-report`) and relates it to the
    /// bytes acknowledged.
    pub fn from_agent_report(text: &str, acked_bytes: u64) -> anyhow::Result<StorageCounts> {
        let doc: serde_json::Value = serde_json::from_str(text)?;
        let buckets = doc["buckets"]
            .as_array()
            .ok_or_else(|| anyhow::anyhow!("storage report without buckets"))?;
        let mut counts = StorageCounts {
            acked_bytes,
            buckets: buckets.len(),
            ..Default::default()
        };
        for bucket in buckets {
            if let Some(classes) = bucket["requests"].as_object() {
                for (class, outcomes) in classes {
                    let n: u64 = outcomes
                        .as_object()
                        .map(|o| o.values().filter_map(|v| v.as_u64()).sum())
                        .unwrap_or(0);
                    *counts.requests.entry(class.clone()).or_default() += n;
                    counts.total_requests += n;
                }
            }
            if let Some(retries) = bucket["retries"].as_object() {
                counts.retries += retries.values().filter_map(|v| v.as_u64()).sum::<u64>();
            }
            counts.bytes_up += bucket["bytes_up"].as_u64().unwrap_or(0);
            counts.bytes_down += bucket["bytes_down"].as_u64().unwrap_or(0);
            counts.usd += bucket["cost_usd"].as_f64().unwrap_or(0.0);
            if let Some(class) = bucket["price_class"].as_str() {
                if !counts.price_classes.iter().any(|c| c == class) {
                    counts.price_classes.push(class.to_string());
                }
            }
        }
        let gib = acked_bytes as f64 / (1u64 << 30) as f64;
        if gib > 0.0 {
            counts.requests_per_gib = counts.total_requests as f64 / gib;
            counts.puts_per_gib = counts.requests.get("put").copied().unwrap_or(0) as f64 / gib;
            counts.usd_per_gib = counts.usd / gib;
        }
        Ok(counts)
    }
}

/// The result of one run.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Report {
    pub workload: String,
    pub bootstrap: String,
    pub topics: Vec<String>,
    pub message_size: usize,
    /// Offered rate (messages/s over all producers); 0: as fast as possible.
    pub target_rate: f64,
    pub warmup_seconds: f64,
    pub duration_seconds: f64,
    /// Messages handed to the client in the measured window.
    pub sent: u64,
    /// Messages acknowledged in the measured window.
    pub published: u64,
    /// Messages read in the measured window (all subscriptions).
    pub consumed: u64,
    pub publish_rate_msgs: f64,
    pub publish_rate_mib: f64,
    pub consume_rate_msgs: f64,
    pub consume_rate_mib: f64,
    /// Delivery failures plus consumer errors over the whole run.
    pub errors: u64,
    /// First few error messages.
    pub error_samples: Vec<String>,
    /// Acknowledged over the whole run, warm-up and drain included.
    pub total_published: u64,
    /// Bytes acknowledged over the whole run (record values, as the clients count them).
    #[serde(default)]
    pub total_published_bytes: u64,
    /// Consumed over the whole run; equals total_published × subscriptions when nothing is lost.
    pub total_consumed: u64,
    /// Acked time − send time (or the intended send time at a fixed rate): the load
    /// generator's own lag counts, so a client that falls behind shows it.
    pub publish_latency: Latency,
    /// Acked time − the time the message was first handed to the client (OpenMessaging
    /// Benchmark's publish latency; a wait on a full client queue counts here, as in OMB).
    #[serde(default)]
    pub publish_from_send_latency: Latency,
    /// Handed to the client − intended send time (OMB's publish delay; ~0 without a fixed rate).
    #[serde(default)]
    pub publish_delay: Latency,
    /// Read time − send timestamp carried in the payload.
    pub end_to_end_latency: Latency,
    /// CPU seconds (utime + stime) of this benchmark process (all its clients) in the window.
    pub client_cpu_seconds: f64,
    pub agent: Option<AgentUsage>,
    pub objects: Option<ObjectCounts>,
    /// From the agent's counters (spawned agents only).
    #[serde(default)]
    pub storage: Option<StorageCounts>,
    /// A backlog run's catch-up.
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
}

impl Report {
    /// The human-readable final table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {:?} against {} ({} topic(s), {} B messages, {:.1} s measured after {:.1} s warm-up)",
            self.workload,
            self.bootstrap,
            self.topics.len(),
            self.message_size,
            self.duration_seconds,
            self.warmup_seconds
        );
        let _ = writeln!(
            out,
            "publish  {:>12.1} msg/s {:>10.2} MiB/s   ({} acked, {} sent)",
            self.publish_rate_msgs, self.publish_rate_mib, self.published, self.sent
        );
        let _ = writeln!(
            out,
            "consume  {:>12.1} msg/s {:>10.2} MiB/s   ({} read)",
            self.consume_rate_msgs, self.consume_rate_mib, self.consumed
        );
        let _ = writeln!(
            out,
            "{:<16}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "latency (ms)", "mean", "p50", "p95", "p99", "p99.9", "max", "count"
        );
        for (name, l) in [
            ("publish", &self.publish_latency),
            ("  from send", &self.publish_from_send_latency),
            ("  send delay", &self.publish_delay),
            ("end-to-end", &self.end_to_end_latency),
        ] {
            let _ = writeln!(
                out,
                "{:<16}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10.2}{:>10}",
                name, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.p999_ms, l.max_ms, l.count
            );
        }
        let _ = writeln!(
            out,
            "errors   {}   (whole run: {} published, {} consumed)",
            self.errors, self.total_published, self.total_consumed
        );
        for sample in &self.error_samples {
            let _ = writeln!(out, "  error: {sample}");
        }
        let _ = writeln!(
            out,
            "client   {:.2} CPU s in window ({:.2} cores)",
            self.client_cpu_seconds,
            self.client_cpu_seconds / self.duration_seconds.max(1e-9)
        );
        if let Some(c) = &self.catch_up {
            let backlog = c.backlog_bytes as f64 / 1048576.0;
            let producers = if c.producing {
                "producers kept producing"
            } else {
                "producers stopped"
            };
            match (c.seconds, c.rate_mib) {
                (Some(seconds), Some(rate)) => {
                    let _ = writeln!(
                        out,
                        "catch-up {backlog:.1} MiB backlog read in {seconds:.1} s: {rate:.2} MiB/s ({producers}; {} messages behind at the end)",
                        c.behind_at_end
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "catch-up {backlog:.1} MiB backlog not read within the run ({producers})"
                    );
                }
            }
        }
        if let Some(a) = &self.agent {
            let _ = writeln!(
                out,
                "agent pid {}: {:.2} CPU s in window, {:.4} CPU s/MiB produced, {:.4} CPU s/MiB consumed, peak RSS {:.1} MiB",
                a.pid,
                a.cpu_seconds,
                a.cpu_seconds_per_mib,
                a.cpu_seconds_per_mib_consumed,
                a.peak_rss_mib
            );
        }
        if let Some(o) = &self.objects {
            let _ = writeln!(
                out,
                "objects in {}: {} ingest + {} meta/log + {} other = {} PUTs for {:.3} GiB: {:.0} PUTs/GiB ({:.0} ingest); ${:.4}/GiB S3 Standard, ${:.4}/GiB S3 Express",
                o.bucket,
                o.ingest_files,
                o.meta_log_files,
                o.other_files,
                o.total_puts,
                o.acked_bytes as f64 / (1u64 << 30) as f64,
                o.puts_per_gib,
                o.ingest_puts_per_gib,
                o.usd_per_gib_s3_standard,
                o.usd_per_gib_s3_express
            );
        }
        if let Some(st) = &self.storage {
            let classes: Vec<String> = st
                .requests
                .iter()
                .map(|(class, n)| format!("{n} {}", class.to_uppercase()))
                .collect();
            let _ = writeln!(
                out,
                "storage  {} requests in {} bucket(s) ({}; {} retries) for {:.3} GiB acked: {:.0} requests/GiB, {:.0} PUTs/GiB; ${:.4}/GiB ({})",
                st.total_requests,
                st.buckets,
                classes.join(", "),
                st.retries,
                st.acked_bytes as f64 / (1u64 << 30) as f64,
                st.requests_per_gib,
                st.puts_per_gib,
                st.usd_per_gib,
                st.price_classes.join(", ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_latency_percentiles_in_ms() {
        let mut h = new_histogram();
        for us in 1..=1000u64 {
            record(&mut h, us * 1000);
        }
        let l = Latency::from_histogram(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50_ms - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99_ms - 990.0).abs() < 1.0, "{l:?}");
        assert!((l.max_ms - 1000.0).abs() < 1.0, "{l:?}");
        assert_eq!(
            Latency::from_histogram(&new_histogram()),
            Latency::default()
        );
    }

    #[test]
    fn test_storage_counts_from_agent_report() {
        let report = r#"{"buckets":[
            {"name":"memory://a","price_class":"s3-express","requests":{"put":{"ok":1000,"timeout":24},"get":{"ok":10}},
             "retries":{"put":24},"bytes_up":1073741824,"bytes_down":0,"cost_usd":0.0045},
            {"name":"memory://m","price_class":"s3-express","requests":{"put":{"ok":1000},"list":{"ok":2}},
             "retries":{},"bytes_up":1,"bytes_down":5,"cost_usd":0.0011}]}"#;
        let st = StorageCounts::from_agent_report(report, 1 << 31).unwrap();
        assert_eq!(st.total_requests, 2036);
        assert_eq!(st.requests["put"], 2024);
        assert_eq!(st.retries, 24);
        assert_eq!(st.buckets, 2);
        assert_eq!(st.price_classes, ["s3-express"]);
        assert!((st.puts_per_gib - 1012.0).abs() < 1e-9);
        assert!((st.usd_per_gib - 0.0028).abs() < 1e-12);
        assert!(StorageCounts::from_agent_report("{}", 1).is_err());
    }

    #[test]
    fn test_object_costs_per_gib() {
        let o = ObjectCounts {
            ingest_files: 1000,
            meta_log_files: 1000,
            acked_bytes: 1 << 30,
            ..Default::default()
        }
        .finish();
        assert_eq!(o.total_puts, 2000);
        assert!((o.puts_per_gib - 2000.0).abs() < 1e-9);
        assert!((o.usd_per_gib_s3_standard - 0.01).abs() < 1e-9);
        let json = serde_json::to_string(&Report {
            objects: Some(o),
            ..Default::default()
        })
        .unwrap();
        assert!(json.contains("\"puts_per_gib\":2000.0"));
    }
}
