//! The consumers of a run: one rdkafka `BaseConsumer` per (subscription, consumer index), each
//! assigned its share of every topic's partitions from the beginning, on its own thread.
//!
//! Consumers are planned (assignment, histograms) before they start, so a backlog run can build
//! its backlog first and start them later while the report already holds their histograms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::latency::Hists;
use crate::run::{Counters, Options};
use crate::workload::Workload;

/// One consumer to start: its assignment, group and latency histograms.
pub(crate) struct Planned {
    assignment: TopicPartitionList,
    /// The subscription (consumer group) it reads for.
    subscription: u32,
    group: String,
    pub(crate) hists: Arc<Mutex<Hists>>,
}

/// Splits every topic's partitions between the consumers of each subscription, round-robin.
pub(crate) fn plan(
    workload: &Workload,
    topics: &[String],
    run_id: &str,
) -> anyhow::Result<Vec<Planned>> {
    let mut planned = Vec::new();
    for subscription in 0..workload.subscriptions_per_topic {
        for index in 0..workload.consumer_per_subscription {
            let mut assignment = TopicPartitionList::new();
            for topic in topics {
                for p in 0..workload.partitions_per_topic {
                    if p % workload.consumer_per_subscription == index {
                        assignment.add_partition_offset(topic, p as i32, Offset::Beginning)?;
                    }
                }
            }
            if assignment.count() == 0 {
                continue;
            }
            planned.push(Planned {
                assignment,
                subscription,
                group: format!("weir-bench-{run_id}-{subscription}"),
                hists: Arc::new(Mutex::new(Hists::new())),
            });
        }
    }
    Ok(planned)
}

/// Microseconds since the UNIX epoch: the timestamp written into each payload.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Starts the planned consumers; each polls until `stop`.
pub(crate) fn start(
    planned: &[Planned],
    topics: &[String],
    opts: &Options,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    let topics: Arc<[String]> = topics.into();
    for consumer in planned {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &opts.bootstrap)
            .set("group.id", &consumer.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("fetch.wait.max.ms", "100");
        for (k, v) in &opts.consumer_config {
            config.set(k, v);
        }
        let client: BaseConsumer = config.create().context("consumer")?;
        client.assign(&consumer.assignment).context("assign")?;
        let hists = consumer.hists.clone();
        let (subscription, topics) = (consumer.subscription, topics.clone());
        let counters = counters.clone();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match client.poll(Duration::from_millis(100)) {
                    None => {}
                    Some(Ok(message)) => {
                        let now = unix_micros();
                        // Keyed by indexes, not names: nothing allocated per message.
                        if let Some(topic) = topics.iter().position(|t| t == message.topic()) {
                            counters.positions.lock().expect("positions").insert(
                                (subscription, topic, message.partition()),
                                message.offset() + 1,
                            );
                        }
                        let payload = message.payload().unwrap_or_default();
                        counters.consumed.fetch_add(1, Ordering::Relaxed);
                        counters
                            .consumed_bytes
                            .fetch_add(payload.len() as u64, Ordering::Relaxed);
                        if payload.len() >= 8 {
                            let sent =
                                u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                            hists
                                .lock()
                                .expect("consumer histograms")
                                .record(now.saturating_sub(sent));
                        }
                    }
                    Some(Err(error)) => counters.error(format!("consume: {error}")),
                }
            }
        }));
    }
    Ok(threads)
}
