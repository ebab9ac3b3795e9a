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
use std::sync::Mutex;
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

/// What connections and handlers count.
#[derive(Debug)]
pub struct KafkaMetrics {
    requests: IntCounterVec,
    request_duration: HistogramVec,
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
        let api_name = format!("{api:?}");
        // Only versions Weir serves get their own value: a client sending every i16 must not
        // make 65,536 series.
        let version = if weir_protocol::versions::is_supported(api, version) {
            version.to_string()
        } else {
            "unsupported".to_string()
        };
        let error = error.map_or("NO_RESPONSE", weir_protocol::error_code::name);
        self.requests
            .with_label_values(&[api_name.as_str(), version.as_str(), error])
            .inc();
        let seconds = elapsed.as_secs_f64();
        self.request_duration
            .with_label_values(&[api_name.as_str()])
            .observe(seconds);
        match api {
            ApiKey::Produce => self.produce_duration.observe(seconds),
            ApiKey::Fetch => self.fetch_duration.observe(seconds),
            _ => {}
        }
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
}
