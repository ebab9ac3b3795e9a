//! Metrics read at scrape time from the components that keep them: the control plane (role,
//! epoch, position, state sizes, group lag), the storage layer (requests, bytes, cost), the
//! read cache and the memory budgets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, Gauge, GaugeVec, Opts};
use weir_common::metrics::{counter_vec, gauge_vec};
use weir_storage::{Outcome, ReadCache, RequestClass, StorageStats};

use crate::broker::Broker;
use crate::health::Readiness;

/// What the scrape reads besides the broker (which exists only once recovery is done).
#[derive(Debug, Clone)]
pub struct LiveSources {
    pub storage: StorageStats,
    pub cache: Arc<ReadCache>,
    pub readiness: Arc<Readiness>,
    /// Groups that get their own `weir_consumer_group_lag` series (the first, by name).
    pub max_group_labels: usize,
}

/// The scrape-time half of `/metrics`.
#[derive(Debug)]
pub struct Live {
    pub sources: LiveSources,
    /// Set once the agent has recovered its control plane and built its broker.
    pub broker: OnceLock<Arc<Broker>>,
    /// Set once the Kafka listener is bound (after registration, in a cluster).
    pub listening: AtomicBool,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Dollars per GiB produced, once something was.
pub(crate) fn cost_per_gib(dollars: f64, produced_bytes: u64) -> Option<f64> {
    (produced_bytes > 0).then(|| dollars / (produced_bytes as f64 / GIB))
}

fn gauge(name: &str, help: &str, value: i64) -> Vec<MetricFamily> {
    let gauge = weir_common::metrics::gauge(name, help);
    gauge.set(value);
    gauge.collect()
}

fn counter(name: &str, help: &str, value: u64) -> Vec<MetricFamily> {
    let counter = weir_common::metrics::counter(name, help);
    counter.inc_by(value);
    counter.collect()
}

fn labelled_gauges(
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, i64)],
) -> Vec<MetricFamily> {
    let family = gauge_vec(name, help, &[label]);
    for (value_label, value) in values {
        family.with_label_values(&[value_label]).set(*value);
    }
    family.collect()
}

impl Live {
    pub fn new(sources: LiveSources) -> Self {
        Self {
            sources,
            broker: OnceLock::new(),
            listening: AtomicBool::new(false),
        }
    }

    /// What `/readyz` answers: `Ok`, or why the agent cannot serve (see [`Readiness::check`];
    /// also not before its Kafka listener is bound).
    pub fn readiness(&self) -> Result<(), String> {
        self.sources
            .readiness
            .check(self.broker.get().map(|b| &**b))?;
        if !self.listening.load(Ordering::Acquire) {
            return Err("starting: the Kafka listener is not open yet".into());
        }
        Ok(())
    }

    /// Every scrape-time family.
    pub fn families(&self) -> Vec<MetricFamily> {
        let mut out = Vec::new();
        let ready = self.readiness().is_ok();
        out.extend(gauge(
            "weir_ready",
            "1 when /readyz answers 200: control plane available and buckets reachable",
            i64::from(ready),
        ));
        out.extend(labelled_gauges(
            "weir_build_info",
            "The agent's version (value 1)",
            "version",
            &[(env!("CARGO_PKG_VERSION"), 1)],
        ));
        self.storage(&mut out);
        self.cache(&mut out);
        if let Some(broker) = self.broker.get() {
            self.control(broker, &mut out);
            self.memory(broker, &mut out);
        }
        out
    }

    fn storage(&self, out: &mut Vec<MetricFamily>) {
        let requests = counter_vec(
            "weir_object_store_requests_total",
            "Object-store request attempts, by bucket, billing class and outcome",
            &["bucket", "class", "outcome"],
        );
        let retries = counter_vec(
            "weir_object_store_retries_total",
            "Object-store attempts after a request's first",
            &["bucket", "class"],
        );
        let bytes = counter_vec(
            "weir_object_store_bytes_total",
            "Bytes sent to (up) and received from (down) object stores",
            &["bucket", "direction"],
        );
        let cost = CounterVec::new(
            Opts::new(
                "weir_object_store_cost_dollars_total",
                "Estimated cost of the requests and bytes above, in US dollars, from the \
                 bucket's price table (storage.prices)",
            ),
            &["bucket", "price_class"],
        )
        .expect("valid metric");
        let prices = GaugeVec::new(
            Opts::new(
                "weir_object_store_price_dollars",
                "The price table the cost is estimated with: dollars per 1,000 requests of a \
                 class, or per GiB up or down",
            ),
            &["bucket", "item"],
        )
        .expect("valid metric");
        let mut total_cost = 0.0;
        for bucket in self.sources.storage.snapshot() {
            let name = bucket.name.as_str();
            for class in RequestClass::ALL {
                for outcome in Outcome::ALL {
                    let n = bucket.requests(class, outcome);
                    if n > 0 || outcome == Outcome::Ok {
                        requests
                            .with_label_values(&[name, class.name(), outcome.name()])
                            .inc_by(n);
                    }
                }
                retries
                    .with_label_values(&[name, class.name()])
                    .inc_by(bucket.retries_of(class));
                prices
                    .with_label_values(&[name, &format!("{}_per_1k", class.name())])
                    .set(bucket.prices.per_1k(class));
            }
            prices
                .with_label_values(&[name, "upload_per_gib"])
                .set(bucket.prices.upload_per_gib);
            prices
                .with_label_values(&[name, "download_per_gib"])
                .set(bucket.prices.download_per_gib);
            bytes
                .with_label_values(&[name, "up"])
                .inc_by(bucket.bytes_up);
            bytes
                .with_label_values(&[name, "down"])
                .inc_by(bucket.bytes_down);
            let dollars = bucket.cost();
            total_cost += dollars;
            cost.with_label_values(&[name, &bucket.price_class])
                .inc_by(dollars);
        }
        out.extend(requests.collect());
        out.extend(retries.collect());
        out.extend(bytes.collect());
        out.extend(cost.collect());
        out.extend(prices.collect());
        let produced = self
            .broker
            .get()
            .map_or(0, |b| b.metrics.produced_bytes_total());
        if let Some(dollars) = cost_per_gib(total_cost, produced) {
            let per_gib = Gauge::with_opts(Opts::new(
                "weir_object_store_cost_per_gib_dollars",
                "Estimated object-store cost of every bucket since start, per GiB produced \
                 through this agent",
            ))
            .expect("valid metric");
            per_gib.set(dollars);
            out.extend(per_gib.collect());
        }
    }

    fn cache(&self, out: &mut Vec<MetricFamily>) {
        let stats = self.sources.cache.stats();
        out.extend(counter(
            "weir_read_cache_hits_total",
            "Fetch reads served from the read cache",
            stats.hits,
        ));
        out.extend(counter(
            "weir_read_cache_misses_total",
            "Fetch reads that went to object storage",
            stats.misses,
        ));
    }

    fn control(&self, broker: &Broker, out: &mut Vec<MetricFamily>) {
        let status = broker.control.leader_status();
        let leads = matches!(
            *broker.control.role().borrow(),
            weir_control::plane::Role::Leader { .. }
        );
        out.extend(gauge(
            "weir_control_leader",
            "1 while this agent leads the metadata log",
            i64::from(leads),
        ));
        out.extend(gauge(
            "weir_control_epoch",
            "The metadata log epoch this agent leads or follows",
            status.epoch as i64,
        ));
        out.extend(gauge(
            "weir_control_log_position",
            "The last durable metadata log slot this agent has applied",
            status.durable as i64,
        ));
        let (counts, mut lags) = broker.control.read(|s| (s.counts(), s.group_lags()));
        let sizes = [
            ("weir_state_topics", "Topics", counts.topics),
            ("weir_state_partitions", "Partitions", counts.partitions),
            (
                "weir_state_index_entries",
                "Batch index entries over every partition",
                counts.index_entries,
            ),
            (
                "weir_state_producers",
                "Idempotent producer ids with state",
                counts.producers,
            ),
            (
                "weir_state_groups",
                "Consumer groups with committed offsets",
                counts.groups,
            ),
            (
                "weir_state_files",
                "Data files the metadata log names",
                counts.files,
            ),
        ];
        for (name, help, value) in sizes {
            out.extend(gauge(name, help, value as i64));
        }
        lags.truncate(self.sources.max_group_labels);
        let values: Vec<(&str, i64)> = lags.iter().map(|l| (l.group.as_str(), l.lag)).collect();
        out.extend(labelled_gauges(
            "weir_consumer_group_lag",
            "Records a group has not committed: over its partitions, high watermark minus \
             committed offset",
            "group",
            &values,
        ));
    }

    fn memory(&self, broker: &Broker, out: &mut Vec<MetricFamily>) {
        let cache = self.sources.cache.stats();
        let budgets = [
            (
                "requests",
                broker.request_memory.capacity(),
                broker.request_memory.used(),
            ),
            (
                "fetch",
                broker.fetch_memory.capacity(),
                broker.fetch_memory.used(),
            ),
            ("read_cache", cache.capacity_bytes, cache.bytes),
        ];
        let capacity: Vec<(&str, i64)> = budgets.iter().map(|(n, c, _)| (*n, *c as i64)).collect();
        let used: Vec<(&str, i64)> = budgets.iter().map(|(n, _, u)| (*n, *u as i64)).collect();
        out.extend(labelled_gauges(
            "weir_memory_budget_bytes",
            "Memory budgets: requests in flight, fetch responses, the read cache",
            "budget",
            &capacity,
        ));
        out.extend(labelled_gauges(
            "weir_memory_in_use_bytes",
            "Bytes charged to each memory budget now",
            "budget",
            &used,
        ));
    }
}
