//! The agent's Prometheus metrics (`/metrics`, docs/operations.md "Metrics").
//!
//! Two kinds: counters and histograms updated as things happen ([`KafkaMetrics`] here, the
//! produce path's and the control plane's in their crates), registered in one [`Registry`];
//! and values read at scrape time from the components that already keep them ([`Live`]: the
//! control plane's state and position, the storage layer's request counters and cost, the
//! read cache, the memory budgets), so nothing is counted twice.

mod errors;
mod live;

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Registry};
use weir_common::metrics::{counter, counter_vec, gauge, latency, latency_vec};

pub(crate) use errors::ResponseError;
pub(crate) use live::cost_per_gib;
pub use live::{Live, LiveSources};

/// The `topic` label of topics beyond `max_topic_labels`.
pub const OTHER_TOPICS: &str = "_other";

/// Topics that have their own label value: the first `max` seen, the rest share
/// [`OTHER_TOPICS`], so a client creating topics without end cannot grow the series without end.
#[derive(Debug)]
struct TopicLabels {
    seen: Mutex<HashSet<String>>,
    max: usize,
}

impl TopicLabels {
    fn label<'a>(&self, topic: &'a str) -> &'a str {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(topic) {
            return topic;
        }
        if seen.len() < self.max {
            seen.insert(topic.to_string());
            return topic;
        }
        OTHER_TOPICS
    }
}

/// The series an API's answers update, looked up once rather than for each of ~11,000
/// requests a second at 50 MiB/s: formatting the API's name and version and hashing the labels
/// each time (docs/benchmarks.md §33 measures what this saves: a few tenths of a percent).
#[derive(Debug)]
struct ApiSeries {
    name: String,
    duration: Histogram,
    /// Its answers without an error (`error="NONE"`), per served version from `min_version`.
    answered: Vec<OnceLock<IntCounter>>,
    min_version: i16,
}

/// What connections and handlers count.
#[derive(Debug)]
pub struct KafkaMetrics {
    requests: IntCounterVec,
    request_duration: HistogramVec,
    /// Indexed by API key; filled as each API is first answered, so an API never asked for
    /// exports no series.
    by_api: Vec<OnceLock<ApiSeries>>,
    produce_duration: Histogram,
    fetch_duration: Histogram,
    pub(crate) connections: IntGauge,
    pub(crate) accepted: IntCounter,
    pub(crate) refused: IntCounter,
    produced_records: IntCounterVec,
    produced_bytes: IntCounterVec,
    fetched_records: IntCounterVec,
    fetched_bytes: IntCounterVec,
    topics: TopicLabels,
}

impl KafkaMetrics {
    /// Fresh, unregistered metrics; `max_topic_labels` bounds the `topic` label's values.
    pub fn new(max_topic_labels: usize) -> Self {
        Self {
            requests: counter_vec(
                "weir_kafka_requests_total",
                "Kafka requests answered, by API, version and the error code of the response \
                 (its top-level code, else its first partition's; NONE for none)",
                &["api", "version", "error"],
            ),
            request_duration: latency_vec(
                "weir_kafka_request_duration_seconds",
                "From a request read to its response ready (fetch long-polls included)",
                &["api"],
            ),
            by_api: (0..=ApiKey::iter().map(|api| api as usize).max().unwrap_or(0))
                .map(|_| OnceLock::new())
                .collect(),
            produce_duration: latency(
                "weir_produce_duration_seconds",
                "From a produce request read to its acknowledgement ready (acks=1/all)",
            ),
            fetch_duration: latency(
                "weir_fetch_duration_seconds",
                "From a fetch request read to its response ready, long-poll wait included",
            ),
            connections: gauge(
                "weir_kafka_connections",
                "Kafka client connections open now",
            ),
            accepted: counter(
                "weir_kafka_connections_accepted_total",
                "Kafka client connections accepted",
            ),
            refused: counter(
                "weir_kafka_connections_refused_total",
                "Kafka client connections refused at accept (kafka.max_connections)",
            ),
            produced_records: counter_vec(
                "weir_produced_records_total",
                "Records acknowledged to producers (an idempotent retry acknowledged again counts \
                 again)",
                &["topic"],
            ),
            produced_bytes: counter_vec(
                "weir_produced_bytes_total",
                "Record batch bytes acknowledged to producers, as sent (compressed)",
                &["topic"],
            ),
            fetched_records: counter_vec(
                "weir_fetched_records_total",
                "Records returned to fetchers (consumers and followers)",
                &["topic"],
            ),
            fetched_bytes: counter_vec(
                "weir_fetched_bytes_total",
                "Record batch bytes returned to fetchers",
                &["topic"],
            ),
            topics: TopicLabels {
                seen: Mutex::default(),
                max: max_topic_labels,
            },
        }
    }

    /// Registers every metric with `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.requests.clone()))?;
        registry.register(Box::new(self.request_duration.clone()))?;
        registry.register(Box::new(self.produce_duration.clone()))?;
        registry.register(Box::new(self.fetch_duration.clone()))?;
        registry.register(Box::new(self.connections.clone()))?;
        registry.register(Box::new(self.accepted.clone()))?;
        registry.register(Box::new(self.refused.clone()))?;
        for family in [
            &self.produced_records,
            &self.produced_bytes,
            &self.fetched_records,
            &self.fetched_bytes,
        ] {
            registry.register(Box::new(family.clone()))?;
        }
        Ok(())
    }

    /// One request answered: `error` is its response's error code, `None` for no response
    /// (acks=0).
    pub(crate) fn request_done(
        &self,
        api: ApiKey,
        version: i16,
        error: Option<i16>,
        elapsed: Duration,
    ) {
        let series = self.series(api);
        let seconds = elapsed.as_secs_f64();
        series.duration.observe(seconds);
        match api {
            ApiKey::Produce => self.produce_duration.observe(seconds),
            ApiKey::Fetch => self.fetch_duration.observe(seconds),
            _ => {}
        }
        // Only versions Weir serves get their own value: a client sending every i16 must not
        // make 65,536 series.
        let supported = weir_protocol::versions::is_supported(api, version);
        let answered = usize::try_from(i32::from(version) - i32::from(series.min_version))
            .ok()
            .and_then(|at| series.answered.get(at));
        if let (Some(0), true, Some(answered)) = (error, supported, answered) {
            let counter = answered.get_or_init(|| {
                let version = version.to_string();
                self.requests
                    .with_label_values(&[series.name.as_str(), version.as_str(), "NONE"])
            });
            counter.inc();
            return;
        }
        let version = if supported {
            version.to_string()
        } else {
            "unsupported".to_string()
        };
        let error = error.map_or("NO_RESPONSE", weir_protocol::error_code::name);
        self.requests
            .with_label_values(&[series.name.as_str(), version.as_str(), error])
            .inc();
    }

    fn series(&self, api: ApiKey) -> &ApiSeries {
        self.by_api[api as usize].get_or_init(|| {
            let name = format!("{api:?}");
            let (min_version, versions) = weir_protocol::versions::supported_range(api)
                .map_or((0, 0), |range| (range.min, range.max - range.min + 1));
            ApiSeries {
                duration: self.request_duration.with_label_values(&[name.as_str()]),
                answered: (0..versions).map(|_| OnceLock::new()).collect(),
                min_version,
                name,
            }
        })
    }

    /// Records and bytes of `topic` acknowledged to a producer.
    pub(crate) fn produced(&self, topic: &str, records: u64, bytes: u64) {
        self.count(
            topic,
            [&self.produced_records, &self.produced_bytes],
            [records, bytes],
        );
    }

    /// Records and bytes of `topic` returned to a fetcher.
    pub(crate) fn fetched(&self, topic: &str, records: u64, bytes: u64) {
        self.count(
            topic,
            [&self.fetched_records, &self.fetched_bytes],
            [records, bytes],
        );
    }

    fn count(&self, topic: &str, families: [&IntCounterVec; 2], amounts: [u64; 2]) {
        let label = [self.topics.label(topic)];
        for (family, amount) in families.into_iter().zip(amounts) {
            family.with_label_values(&label).inc_by(amount);
        }
    }

    /// Bytes produced so far, every topic: the denominator of `$ per GiB`.
    pub fn produced_bytes_total(&self) -> u64 {
        self.sum_by_topic(&self.produced_bytes)
    }

    /// Per topic label: (records produced, bytes produced, records fetched, bytes fetched).
    pub fn topic_totals(&self) -> Vec<(String, [u64; 4])> {
        let topics: Vec<String> = {
            let seen = self.topics.seen.lock().unwrap_or_else(|p| p.into_inner());
            let mut topics: Vec<String> = seen.iter().cloned().collect();
            topics.sort();
            topics
        };
        topics
            .into_iter()
            .map(|topic| {
                let t = [topic.as_str()];
                let totals = [
                    self.produced_records.with_label_values(&t).get(),
                    self.produced_bytes.with_label_values(&t).get(),
                    self.fetched_records.with_label_values(&t).get(),
                    self.fetched_bytes.with_label_values(&t).get(),
                ];
                (topic, totals)
            })
            .collect()
    }

    fn sum_by_topic(&self, family: &IntCounterVec) -> u64 {
        use prometheus::core::Collector as _;
        family
            .collect()
            .iter()
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_topic_labels_are_bounded() {
        let metrics = KafkaMetrics::new(2);
        metrics.produced("a", 1, 10);
        metrics.produced("b", 2, 20);
        metrics.produced("c", 3, 30);
        metrics.produced("d", 4, 40);
        metrics.produced("a", 1, 10);
        let totals = metrics.topic_totals();
        let names: Vec<&str> = totals.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(totals[0].1, [2, 20, 0, 0]);
        let other = metrics
            .produced_bytes
            .with_label_values(&[OTHER_TOPICS])
            .get();
        assert_eq!(other, 70);
        assert_eq!(metrics.produced_bytes_total(), 110);
    }

    #[test]
    fn test_answers_count_by_api_version_and_error() {
        let metrics = KafkaMetrics::new(1);
        let ms = Duration::from_millis(1);
        for _ in 0..3 {
            metrics.request_done(ApiKey::Produce, 9, Some(0), ms);
        }
        metrics.request_done(ApiKey::Produce, 12, Some(0), ms);
        metrics.request_done(ApiKey::Produce, 9, Some(3), ms);
        metrics.request_done(ApiKey::Produce, 9, None, ms);
        // Versions Weir does not serve share one value, whatever the error; so do i16's ends.
        for version in [2, 13, i16::MIN, i16::MAX] {
            metrics.request_done(ApiKey::Produce, version, Some(0), ms);
        }
        metrics.request_done(ApiKey::Metadata, 12, Some(0), ms);
        let count = |api: &str, version: &str, error: &str| {
            metrics
                .requests
                .with_label_values(&[api, version, error])
                .get()
        };
        assert_eq!(count("Produce", "9", "NONE"), 3);
        assert_eq!(count("Produce", "12", "NONE"), 1);
        assert_eq!(count("Produce", "9", "UNKNOWN_TOPIC_OR_PARTITION"), 1);
        assert_eq!(count("Produce", "9", "NO_RESPONSE"), 1);
        assert_eq!(count("Produce", "unsupported", "NONE"), 4);
        assert_eq!(count("Metadata", "12", "NONE"), 1);
        let answered = |api: &str| {
            metrics
                .request_duration
                .with_label_values(&[api])
                .get_sample_count()
        };
        assert_eq!((answered("Produce"), answered("Metadata")), (10, 1));
        assert_eq!(metrics.produce_duration.get_sample_count(), 10);
        // An API never answered exports nothing.
        let families = {
            let registry = Registry::new();
            metrics.register(&registry).expect("register");
            registry.gather()
        };
        let apis: HashSet<String> = families
            .iter()
            .filter(|f| f.name() == "weir_kafka_request_duration_seconds")
            .flat_map(|f| f.get_metric().iter())
            .flat_map(|m| m.get_label().iter())
            .map(|l| l.value().to_string())
            .collect();
        assert_eq!(apis, HashSet::from(["Produce".into(), "Metadata".into()]));
    }
}
