//! Settings and shared components of one agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_common::Clock;
use weir_control::coordination::Coordinations;
use weir_control::maintenance::RetentionDefaults;
use weir_control::ControlPlane;
use weir_fetch::FetchReader;
use weir_groups::{GroupCoordinator, GroupSettings};
use weir_produce::ProducePipeline;

use crate::admission::{AdmissionSettings, ProducerAdmission};
use crate::handlers::record_checks::ProduceValidation;
use crate::memory::ResponseBudget;
use crate::metrics::KafkaMetrics;
use crate::request_memory::RequestMemory;

/// Kafka-facing settings of an agent.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    pub node_id: i32,
    /// Host and port clients are told to connect to (Metadata, DescribeCluster).
    pub advertised_host: String,
    pub advertised_port: i32,
    /// This agent's zone (`agent.rack`, `--zone`), the rack clients see.
    pub rack: Option<String>,
    /// In a cluster, this agent's incarnation in the registry (RFC 0002 §5): brokers, leaders
    /// and coordinators then come from the registry. `None` for a single agent.
    pub cluster_incarnation: Option<String>,
    /// In a cluster, how long after its start an agent that has not registered yet lists
    /// itself in Metadata (a restart waits up to a failover and the agent timeout for its
    /// predecessor's fence); after that only the registry's agents are listed.
    pub registration_grace: Duration,
    pub auto_create_topics: bool,
    pub default_partitions: i32,
    /// Largest request frame accepted; checked before any allocation.
    pub max_frame_bytes: usize,
    /// Largest frame of any request other than Produce (those decode into many objects).
    pub max_nonproduce_frame_bytes: usize,
    pub max_connections: usize,
    /// Requests one connection may have in flight before the agent stops reading from it.
    pub max_inflight_per_connection: usize,
    /// Request bytes held across all connections; readers wait when it is exhausted.
    pub max_inflight_request_bytes: usize,
    /// Fetch response bytes held across all connections; fetches read fewer bytes (at least one
    /// batch) when it is used up.
    pub max_inflight_fetch_bytes: usize,
    /// A connection that sends no request for this long is closed, and so is one whose client
    /// has not read a response for this long (Kafka's `connections.max.idle.ms`).
    pub connections_max_idle: Duration,
    /// A request's body must arrive within this long of its length (and its memory charge is
    /// held meanwhile); a client that stalls mid-request is disconnected.
    pub request_read_timeout: Duration,
    /// Upper bound on one fetch response, whatever the client asks for.
    pub max_fetch_bytes: usize,
    /// Upper bound on fetch long-poll time.
    pub max_fetch_wait: Duration,
    /// Consumer group coordinator limits (session timeout bounds, group size).
    pub groups: GroupSettings,
    /// How much of each produced batch is decoded (`produce.validation`).
    pub produce_validation: ProduceValidation,
    /// Largest decompressed records section of one batch (decompression-bomb bound).
    pub max_decompressed_bytes: usize,
    pub producer_admission: AdmissionSettings,
    /// `retention.default_ms` / `retention.default_bytes`: what retention enforces on topics that
    /// set neither, so DescribeConfigs and CreateTopics report them as those topics' values.
    pub retention: RetentionDefaults,
    /// Topics with their own `topic` label in the produced/fetched metrics; the rest are
    /// counted under `_other` (`http.max_topic_labels`).
    pub max_topic_labels: usize,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            node_id: 1,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
            rack: None,
            cluster_incarnation: None,
            registration_grace: Duration::from_secs(30),
            auto_create_topics: true,
            default_partitions: 1,
            max_frame_bytes: 100 * 1024 * 1024,
            max_nonproduce_frame_bytes: 8 * 1024 * 1024,
            max_connections: 10_000,
            max_inflight_per_connection: 512,
            max_inflight_request_bytes: 512 * 1024 * 1024,
            max_inflight_fetch_bytes: 512 * 1024 * 1024,
            connections_max_idle: Duration::from_secs(600),
            request_read_timeout: Duration::from_secs(30),
            max_fetch_bytes: 64 * 1024 * 1024,
            max_fetch_wait: Duration::from_secs(30),
            groups: GroupSettings::default(),
            produce_validation: ProduceValidation::default(),
            max_decompressed_bytes: 32 * 1024 * 1024,
            producer_admission: AdmissionSettings::default(),
            retention: RetentionDefaults::default(),
            max_topic_labels: 100,
        }
    }
}

/// Everything a connection needs; shared by all connections of the agent.
#[derive(Debug)]
pub struct Broker {
    pub settings: BrokerSettings,
    pub control: ControlPlane,
    pub produce: ProducePipeline,
    pub fetch: FetchReader,
    /// The consumer group coordinator for the groups placed on this agent.
    pub groups: GroupCoordinator,
    pub clock: Arc<dyn Clock>,
    /// What connections and handlers count (`/metrics`); the agent registers it.
    pub metrics: KafkaMetrics,
    /// Request bytes held across all connections (frames read, decoded, not yet answered).
    pub(crate) request_memory: Arc<RequestMemory>,
    /// Fetch response bytes held across all connections (built, or waiting for the socket);
    /// a budget of its own so that clients that never read cannot starve produce requests.
    pub(crate) fetch_memory: Arc<ResponseBudget>,
    pub(crate) producer_admission: ProducerAdmission,
    /// Groups this agent coordinates in a cluster, with the registry version since when.
    pub(crate) coordinations: Mutex<Coordinations>,
    /// When this broker started (for `registration_grace`).
    pub(crate) started: std::time::Instant,
    /// Since when `live_agents` has seen this agent's control plane unavailable without a break
    /// (see `Outage`).
    pub(crate) outage: Mutex<Outage>,
    seeds: AtomicU64,
}

/// How long this agent's control plane has been unavailable, as the calls that list the agents
/// see it. A change of availability between two looks restarts the clock, so an outage that
/// ended unseen does not count toward a later one.
#[derive(Debug)]
pub(crate) struct Outage {
    availability: tokio::sync::watch::Receiver<bool>,
    since: Option<std::time::Instant>,
}

impl Outage {
    fn new(availability: tokio::sync::watch::Receiver<bool>) -> Self {
        Self {
            availability,
            since: None,
        }
    }

    /// How long the plane has been unavailable without a break, `None` if it is available.
    pub(crate) fn lasted(&mut self) -> Option<std::time::Duration> {
        let changed = self.availability.has_changed().unwrap_or(false);
        if *self.availability.borrow_and_update() {
            self.since = None;
            return None;
        }
        if changed {
            self.since = None;
        }
        Some(
            self.since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed(),
        )
    }
}

impl Broker {
    pub fn new(
        settings: BrokerSettings,
        control: ControlPlane,
        produce: ProducePipeline,
        fetch: FetchReader,
        clock: Arc<dyn Clock>,
        seed: u64,
    ) -> Self {
        // At least one largest frame fits, or such a frame could never be admitted.
        let request_bytes = settings
            .max_inflight_request_bytes
            .max(settings.max_frame_bytes);
        let groups = GroupCoordinator::start(settings.groups.clone(), clock.clone(), seed);
        let outage = Mutex::new(Outage::new(control.availability()));
        Self {
            request_memory: RequestMemory::new(request_bytes),
            fetch_memory: ResponseBudget::new(settings.max_inflight_fetch_bytes),
            producer_admission: ProducerAdmission::new(settings.producer_admission),
            metrics: KafkaMetrics::new(settings.max_topic_labels),
            settings,
            control,
            produce,
            fetch,
            groups,
            clock,
            coordinations: Mutex::default(),
            started: std::time::Instant::now(),
            outage,
            seeds: AtomicU64::new(seed),
        }
    }

    /// A fresh seed for ids chosen by this agent (topic ids).
    pub(crate) fn next_seed(&self) -> u64 {
        self.seeds
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(self.clock.now_ms() as u64)
    }
}
