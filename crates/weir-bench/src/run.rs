//! Running a workload: topics, consumers, paced producers, live progress, the final report.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};

use crate::agent;
use crate::backlog::{build_backlog, end_offsets, CatchUpRun, Position, CATCH_UP_POLL};
use crate::consume::{self, unix_micros};
use crate::latency::{self, pack_opaque, Hists, ProducerHists};
use crate::report::{AgentUsage, CatchUp, Latency, Report};
use crate::workload::Workload;

/// How to run a workload.
#[derive(Debug, Clone)]
pub struct Options {
    pub bootstrap: String,
    /// Extra librdkafka producer properties (after the defaults: acks=all, linger.ms=5).
    pub producer_config: Vec<(String, String)>,
    /// Extra librdkafka consumer properties.
    pub consumer_config: Vec<(String, String)>,
    /// Overrides `producerRate` (messages/s over all producers; 0: as fast as possible).
    pub rate: Option<f64>,
    /// Overrides the measured duration.
    pub duration: Option<Duration>,
    /// Overrides the warm-up.
    pub warmup: Option<Duration>,
    /// Live progress line period on stderr; zero: none.
    pub progress_interval: Duration,
    /// Topic name prefix; a random suffix keeps runs apart.
    pub topic_prefix: String,
    /// Agent process to read CPU time and peak RSS from.
    pub agent_pid: Option<u32>,
    /// A `file://` bucket directory whose objects are counted after the run.
    pub bucket_dir: Option<PathBuf>,
    /// Longest wait after producing stops for consumers to catch up.
    pub drain_timeout: Duration,
}

impl Options {
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Options {
            bootstrap: bootstrap.into(),
            producer_config: Vec::new(),
            consumer_config: Vec::new(),
            rate: None,
            duration: None,
            warmup: None,
            progress_interval: Duration::from_secs(5),
            topic_prefix: "weir-bench".into(),
            agent_pid: None,
            bucket_dir: None,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// A report and the histograms behind it (for plots).
pub struct Outcome {
    pub report: Report,
    pub publish_histogram: Histogram<u64>,
    pub end_to_end_histogram: Histogram<u64>,
}

#[derive(Default)]
pub(crate) struct Counters {
    sent: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) acked_bytes: AtomicU64,
    pub(crate) consumed: AtomicU64,
    /// Each consumer group's next offset per partition read.
    pub(crate) positions: Mutex<HashMap<Position, i64>>,
    pub(crate) consumed_bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    error_samples: Mutex<Vec<String>>,
}

impl Counters {
    pub(crate) fn error(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.error_samples.lock().expect("error samples");
        if samples.len() < 5 {
            samples.push(message);
        }
    }
}

struct ProducerStats {
    counters: Arc<Counters>,
    hists: Arc<Mutex<ProducerHists>>,
    /// Base of the per-message opaque (microseconds since this instant).
    epoch: Instant,
}

impl ClientContext for ProducerStats {}

impl ProducerContext for ProducerStats {
    /// The intended and the actual send time ([`pack_opaque`]).
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        match result {
            Ok(message) => {
                let now = self.epoch.elapsed().as_micros() as u64;
                self.counters.acked.fetch_add(1, Ordering::Relaxed);
                let len = message.payload_len() as u64;
                self.counters.acked_bytes.fetch_add(len, Ordering::Relaxed);
                self.hists
                    .lock()
                    .expect("producer histograms")
                    .record(now, opaque);
            }
            Err((error, _)) => self.counters.error(format!("delivery: {error}")),
        }
    }
}

fn create_topics(
    bootstrap: &str,
    names: &[String],
    partitions: i32,
    extra: &[(String, String)],
) -> anyhow::Result<()> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in extra {
        if k.starts_with("security.") || k.starts_with("sasl.") || k.starts_with("ssl.") {
            config.set(k, v);
        }
    }
    let admin: AdminClient<DefaultClientContext> = config.create().context("admin client")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = runtime
        .block_on(admin.create_topics(
            &topics,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .context("CreateTopics")?;
    for result in results {
        result.map_err(|(topic, code)| anyhow::anyhow!("creating topic {topic}: {code}"))?;
    }
    Ok(())
}

fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.chars().take(100).collect()
}

/// Runs one workload and returns its report. Blocking; prints progress to stderr.
pub fn run(workload: &Workload, opts: &Options) -> anyhow::Result<Outcome> {
    let payload_template = workload.payload()?;
    let message_size = payload_template.len();
    let rate = opts.rate.unwrap_or(workload.producer_rate);
    let duration = opts.duration.unwrap_or_else(|| workload.test_duration());
    let warmup = opts.warmup.unwrap_or_else(|| workload.warmup_duration());
    let partitions = workload.partitions_per_topic as i32;

    let run_id = format!("{:08x}", fastrand::u32(..));
    let topics: Vec<String> = (0..workload.topics)
        .map(|i| {
            format!(
                "{}-{}-{run_id}-{i}",
                opts.topic_prefix,
                sanitize(&workload.name)
            )
        })
        .collect();
    create_topics(&opts.bootstrap, &topics, partitions, &opts.producer_config)?;

    let counters = Arc::new(Counters::default());
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();

    // Consumers read every partition of every topic from the beginning. In a backlog run they
    // start only once the producers have built the backlog.
    let planned = consume::plan(workload, &topics, &run_id)?;
    let consumer_stats: Vec<_> = planned.iter().map(|c| c.hists.clone()).collect();
    let backlog_target = workload.backlog_bytes();
    let mut consumer_threads = if backlog_target == 0 {
        consume::start(&planned, &topics, opts, &counters, &stop_consumers)?
    } else {
        Vec::new()
    };

    // Producers: one client (one connection per broker) each, paced to its share of the rate.
    let producer_count = (workload.topics * workload.producers_per_topic) as usize;
    let per_producer_rate = if rate > 0.0 {
        rate / producer_count as f64
    } else {
        0.0
    };
    let mut producer_stats = Vec::new();
    let mut producer_threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    for (t, topic) in topics.iter().enumerate() {
        for index in 0..workload.producers_per_topic {
            let hists = Arc::new(Mutex::new(ProducerHists::new()));
            producer_stats.push(hists.clone());
            let stats = ProducerStats {
                counters: counters.clone(),
                hists,
                epoch,
            };
            let mut config = ClientConfig::new();
            config
                .set("bootstrap.servers", &opts.bootstrap)
                .set("acks", "all")
                .set("linger.ms", "5")
                .set("batch.size", "1048576")
                .set("message.timeout.ms", "120000");
            for (k, v) in &opts.producer_config {
                config.set(k, v);
            }
            let producer: ThreadedProducer<ProducerStats> =
                config.create_with_context(stats).context("producer")?;
            let topic = topic.clone();
            let counters = counters.clone();
            let stop = stop_producers.clone();
            let mut payload = payload_template.clone();
            let offset = (t as u32 * workload.producers_per_topic + index) as usize;
            producer_threads.push(std::thread::spawn(move || {
                let interval = if per_producer_rate > 0.0 {
                    Some(Duration::from_secs_f64(1.0 / per_producer_rate))
                } else {
                    None
                };
                let start = Instant::now();
                let mut n: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    // At a fixed rate, latency counts from the intended send time, so a client
                    // that falls behind shows it (no coordinated omission).
                    // The send time is the one the lag behind the schedule is measured at.
                    let (intended, intended_unix, sent) = match interval {
                        Some(interval) => {
                            let due = start + interval.mul_f64(n as f64);
                            let now = Instant::now();
                            if due > now {
                                std::thread::sleep(due - now);
                            }
                            let sent = Instant::now();
                            let behind = sent.saturating_duration_since(due);
                            (due, unix_micros() - behind.as_micros() as u64, sent)
                        }
                        None => {
                            let now = Instant::now();
                            (now, unix_micros(), now)
                        }
                    };
                    if payload.len() >= 8 {
                        payload[..8].copy_from_slice(&intended_unix.to_le_bytes());
                    }
                    let since_epoch = |at: Instant| at.saturating_duration_since(epoch).as_micros();
                    let opaque =
                        pack_opaque(since_epoch(intended) as u64, since_epoch(sent) as u64);
                    let partition = ((n as usize + offset) % partitions as usize) as i32;
                    let mut record = BaseRecord::<(), [u8], usize>::with_opaque_to(&topic, opaque)
                        .payload(&payload[..])
                        .partition(partition);
                    loop {
                        match producer.send(record) {
                            Ok(()) => {
                                counters.sent.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err((
                                KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                                r,
                            )) => {
                                if stop.load(Ordering::Relaxed) {
                                    break;
                                }
                                record = r;
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Err((error, _)) => {
                                counters.error(format!("send: {error}"));
                                break;
                            }
                        }
                    }
                    n += 1;
                }
                if let Err(error) = producer.flush(Duration::from_secs(120)) {
                    counters.error(format!("flush: {error}"));
                }
            }));
        }
    }

    // Warm-up, then the measured window, with a progress line every interval.
    let merged = |which: &dyn Fn(&mut Hists) -> Histogram<u64>| {
        latency::merge(&producer_stats, &consumer_stats, which)
    };

    // A backlog run builds its backlog with no consumer reading, then starts the consumers
    // from the beginning (reading from the bucket once the backlog outgrows the agent's cache)
    // and times how long they take to read what was acknowledged by then. The backlog stands in
    // for the warm-up: the window starts with the consumers.
    let mut catch_up = None;
    let mut warmup = warmup;
    if backlog_target > 0 {
        build_backlog(&counters, backlog_target, opts.progress_interval)?;
        if workload.stop_producers_at_backlog {
            stop_producers.store(true, Ordering::Relaxed);
            for thread in producer_threads.drain(..) {
                let _ = thread.join();
            }
        }
        let subscriptions = u64::from(workload.subscriptions_per_topic);
        let ends = end_offsets(opts, &topics, partitions, workload.subscriptions_per_topic)?;
        catch_up = Some(CatchUpRun {
            messages: counters.acked.load(Ordering::Relaxed) * subscriptions,
            bytes: counters.acked_bytes.load(Ordering::Relaxed) * subscriptions,
            ends,
            started: Instant::now(),
            done: None,
        });
        // The histograms measure the window: publish latencies of the backlog build go.
        merged(&Hists::reset);
        consumer_threads = consume::start(&planned, &topics, opts, &counters, &stop_consumers)?;
        warmup = Duration::ZERO;
    }

    let started = Instant::now();
    let warmup_end = started + warmup;
    let end = warmup_end + duration;
    let mut measuring = warmup.is_zero();
    let snapshot = |c: &Counters| {
        (
            c.sent.load(Ordering::Relaxed),
            c.acked.load(Ordering::Relaxed),
            c.acked_bytes.load(Ordering::Relaxed),
            c.consumed.load(Ordering::Relaxed),
            c.consumed_bytes.load(Ordering::Relaxed),
        )
    };
    // Counted from here: a backlog run acknowledged its backlog before the window.
    let mut window_start = snapshot(&counters);
    let mut cpu_start = opts.agent_pid.and_then(agent::cpu_seconds);
    let mut client_cpu_start = agent::cpu_seconds(std::process::id()).unwrap_or(0.0);
    let mut window_started_at = started;
    let mut last = (started, window_start.1, window_start.2, window_start.3);
    loop {
        let now = Instant::now();
        if let Some(run) = catch_up.as_mut().filter(|run| run.done.is_none()) {
            if run.backlog_read(&counters) {
                let read = counters.consumed_bytes.load(Ordering::Relaxed);
                run.done = Some((now - run.started, read));
                eprintln!(
                    "backlog read: {:.1} MiB in {:.1} s",
                    read as f64 / 1048576.0,
                    (now - run.started).as_secs_f64()
                );
                if workload.stop_producers_at_backlog {
                    // Nothing more to read: the window is the catch-up.
                    break;
                }
            }
        }
        if !measuring && now >= warmup_end {
            merged(&Hists::reset);
            window_start = snapshot(&counters);
            cpu_start = opts.agent_pid.and_then(agent::cpu_seconds);
            client_cpu_start = agent::cpu_seconds(std::process::id()).unwrap_or(0.0);
            window_started_at = now;
            measuring = true;
        }
        if now >= end {
            break;
        }
        let mut next = end;
        if !measuring {
            next = next.min(warmup_end);
        }
        if !opts.progress_interval.is_zero() {
            next = next.min(last.0 + opts.progress_interval);
        }
        if catch_up.as_ref().is_some_and(|run| run.done.is_none()) {
            next = next.min(now + CATCH_UP_POLL);
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        if !opts.progress_interval.is_zero() && now >= last.0 + opts.progress_interval {
            let (_, acked, acked_bytes, consumed, _) = snapshot(&counters);
            let secs = (now - last.0).as_secs_f64();
            let interval = merged(&Hists::take_interval);
            let p = Latency::from_histogram(&interval.publish);
            let e = Latency::from_histogram(&interval.end_to_end);
            eprintln!(
                "[{:>6.1}s {}] pub {:>9.0} msg/s {:>7.2} MiB/s | cons {:>9.0} msg/s | backlog {:>8} | pub p50 {:.1} p99 {:.1} ms | e2e p50 {:.1} p99 {:.1} ms | err {}",
                (now - started).as_secs_f64(),
                if measuring { "run" } else { "warm-up" },
                (acked - last.1) as f64 / secs,
                (acked_bytes - last.2) as f64 / secs / 1048576.0,
                (consumed - last.3) as f64 / secs,
                (acked * workload.subscriptions_per_topic as u64).saturating_sub(consumed),
                p.p50_ms,
                p.p99_ms,
                e.p50_ms,
                e.p99_ms,
                counters.errors.load(Ordering::Relaxed)
            );
            last = (now, acked, acked_bytes, consumed);
        }
    }

    // End of the window: take the numbers, then stop producing and let consumers catch up.
    let window_end = snapshot(&counters);
    let window_secs = (Instant::now() - window_started_at).as_secs_f64();
    let cpu_end = opts.agent_pid.and_then(agent::cpu_seconds);
    let client_cpu_seconds =
        agent::cpu_seconds(std::process::id()).unwrap_or(0.0) - client_cpu_start;
    let window = merged(&Hists::clone_total);
    stop_producers.store(true, Ordering::Relaxed);
    for thread in producer_threads {
        let _ = thread.join();
    }
    let expected = counters.acked.load(Ordering::Relaxed) * workload.subscriptions_per_topic as u64;
    let drain_deadline = Instant::now() + opts.drain_timeout;
    while counters.consumed.load(Ordering::Relaxed) < expected
        && Instant::now() < drain_deadline
        && !consumer_threads.is_empty()
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_consumers.store(true, Ordering::Relaxed);
    for thread in consumer_threads {
        let _ = thread.join();
    }

    let published = window_end.1 - window_start.1;
    let published_bytes = window_end.2 - window_start.2;
    let consumed = window_end.3 - window_start.3;
    let consumed_bytes = window_end.4 - window_start.4;
    let mib = |b: u64| b as f64 / 1048576.0;
    let agent = match (opts.agent_pid, cpu_start, cpu_end) {
        (Some(pid), Some(a), Some(b)) => Some(AgentUsage {
            pid,
            cpu_seconds: b - a,
            cpu_seconds_per_mib: if published_bytes > 0 {
                (b - a) / mib(published_bytes)
            } else {
                0.0
            },
            cpu_seconds_per_mib_consumed: if consumed_bytes > 0 {
                (b - a) / mib(consumed_bytes)
            } else {
                0.0
            },
            peak_rss_mib: agent::peak_rss_mib(pid).unwrap_or(0.0),
        }),
        _ => None,
    };
    let total_published = counters.acked.load(Ordering::Relaxed);
    let total_acked_bytes = counters.acked_bytes.load(Ordering::Relaxed);
    let objects = opts
        .bucket_dir
        .as_deref()
        .and_then(|dir| agent::count_objects(dir, total_acked_bytes));
    let report = Report {
        workload: workload.name.clone(),
        bootstrap: opts.bootstrap.clone(),
        topics,
        message_size,
        target_rate: rate.max(0.0),
        warmup_seconds: warmup.as_secs_f64(),
        duration_seconds: window_secs,
        sent: window_end.0 - window_start.0,
        published,
        consumed,
        publish_rate_msgs: published as f64 / window_secs,
        publish_rate_mib: mib(published_bytes) / window_secs,
        consume_rate_msgs: consumed as f64 / window_secs,
        consume_rate_mib: mib(consumed_bytes) / window_secs,
        errors: counters.errors.load(Ordering::Relaxed),
        error_samples: counters.error_samples.lock().expect("samples").clone(),
        total_published,
        total_published_bytes: total_acked_bytes,
        total_consumed: counters.consumed.load(Ordering::Relaxed),
        publish_latency: Latency::from_histogram(&window.publish),
        publish_from_send_latency: Latency::from_histogram(&window.from_send),
        publish_delay: Latency::from_histogram(&window.delay),
        end_to_end_latency: Latency::from_histogram(&window.end_to_end),
        client_cpu_seconds,
        agent,
        objects,
        storage: None,
        catch_up: catch_up.map(|run| CatchUp {
            backlog_messages: run.messages,
            backlog_bytes: run.bytes,
            producing: !workload.stop_producers_at_backlog,
            seconds: run.done.map(|(took, _)| took.as_secs_f64()),
            rate_mib: run
                .done
                .map(|(took, read)| mib(read) / took.as_secs_f64().max(1e-9)),
            behind_at_end: (window_end.1 * u64::from(workload.subscriptions_per_topic))
                .saturating_sub(window_end.3),
        }),
    };
    Ok(Outcome {
        report,
        publish_histogram: window.publish,
        end_to_end_histogram: window.end_to_end,
    })
}
