//! Wires one agent: buckets, control plane, produce pipeline, fetch reader, Kafka listener.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use tracing::info;
use weir_common::{Clock, SystemClock};
use weir_control::{ControlPlane, ControlPlaneSettings};
use weir_fetch::FetchReader;
use weir_produce::{IngestWrites, ProducePipeline, ProduceSettings, Resolver, ResolverSettings};
use weir_server::{Broker, BrokerSettings, Server};
use weir_storage::append::ingest::IngestLoader;
use weir_storage::append::AppendableStore;
use weir_storage::pool::WriterPool;
use weir_storage::{QuorumWriter, ReadCache};

use crate::buckets::Buckets;
use crate::config::{Config, IngestWriteMode};
use crate::AgentArgs;

/// Read-ahead windows are capped at this fraction of the read cache, so the windows of several
/// lagging partitions fit in it together.
const READ_AHEAD_CACHE_SHARE: u64 = 16;

/// Config file, then environment, then flags.
pub(crate) fn resolve_config(args: &AgentArgs) -> anyhow::Result<Config> {
    let mut config = Config::load(args.config.as_deref(), std::env::vars())?;
    if let Some(listen) = &args.listen {
        config.agent.listen = listen.clone();
    }
    if let Some(dir) = &args.data_dir {
        config.agent.data_dir = dir.clone();
    }
    if let Some(host) = &args.advertised_host {
        config.agent.advertised_host = host.clone();
    }
    if let Some(auto_create) = args.auto_create_topics {
        config.kafka.auto_create_topics = auto_create;
    }
    if let Some(partitions) = args.num_partitions {
        anyhow::ensure!(partitions >= 1, "--num-partitions must be at least 1");
        config.kafka.num_partitions = partitions;
    }
    if let Some(interval) = args.flush_interval {
        config.produce.flush_interval = crate::config::FlushInterval::Fixed(interval);
    }
    if let Some(profile) = &args.storage_profile {
        anyhow::ensure!(
            weir_storage::LatencyProfile::named(profile).is_some(),
            "unknown storage profile {profile:?}; known: {}",
            weir_storage::PROFILE_NAMES.join(", ")
        );
        config.storage.profile = profile.clone();
    }
    if let Some(failpoints) = &args.failpoints {
        config.agent.failpoints = failpoints.clone();
    }
    if let Some(rate) = args.storage_error_rate {
        anyhow::ensure!(
            (0.0..1.0).contains(&rate),
            "--storage-error-rate must be in [0, 1)"
        );
        config.storage.error_rate = rate;
    }
    if let Some(seed) = args.fault_seed {
        config.storage.fault_seed = seed;
    }
    if !args.ingest_buckets.is_empty() {
        config.storage.ingest_buckets = args.ingest_buckets.clone();
    }
    if let Some(quorum) = args.quorum {
        config.storage.quorum = quorum;
    }
    if !args.down_buckets.is_empty() {
        config.storage.down_buckets = args.down_buckets.clone();
    }
    if !args.slow_buckets.is_empty() {
        config.storage.slow_buckets = args.slow_buckets.clone();
    }
    if let Some(path) = &args.storage_report {
        config.agent.storage_report = path.clone();
    }
    if let Some(url) = &args.metadata_bucket {
        config.storage.metadata_bucket = url.clone();
    }
    if let Some(url) = &args.compacted_bucket {
        config.storage.compacted_bucket = url.clone();
    }
    if let Some(node_id) = args.node_id {
        config.agent.node_id = node_id;
    }
    if let Some(zone) = &args.zone {
        config.agent.rack = zone.clone();
    }
    if let Some(address) = &args.control_listen {
        config.cluster.control_listen = address.clone();
    }
    if let Some(address) = &args.control_advertise {
        config.cluster.control_advertise = address.clone();
    }
    if let Some(address) = &args.http_listen {
        config.http.listen = address.clone();
    }
    if args.no_compaction {
        config.compaction.enabled = false;
    }
    if let Some(mode) = &args.ingest_writes {
        config.storage.ingest_writes = match mode.as_str() {
            "put" => IngestWriteMode::Put,
            "append" => IngestWriteMode::Append,
            _ => IngestWriteMode::Auto,
        };
    }
    config.validate()?;
    if let Some(inflight) = args.max_inflight_per_connection {
        anyhow::ensure!(
            inflight >= 1,
            "--max-inflight-per-connection must be at least 1"
        );
        config.kafka.max_inflight_per_connection = inflight;
    }
    Ok(config)
}

pub(crate) async fn run(config: Config) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let seed = (clock.now_ms() as u64) ^ u64::from(std::process::id()).rotate_left(32);
    weir_common::failpoint::configure(&config.agent.failpoints).map_err(anyhow::Error::msg)?;
    let fault_seed = if config.storage.fault_seed == 0 {
        seed
    } else {
        config.storage.fault_seed
    };
    if config.produce.producer_id_expiration < std::time::Duration::from_secs(600) {
        tracing::warn!(
            producer_id_expiration = ?config.produce.producer_id_expiration,
            "produce.producer_id_expiration is below 10 minutes: a producer retrying a batch \
             for longer (delivery.timeout.ms) may find its state gone and get \
             UNKNOWN_PRODUCER_ID; keep it above the clients' delivery timeout"
        );
    }
    let buckets = Buckets::open(&config, fault_seed).await?;
    let pending = buckets.verify().await?;
    let verifying = pending.map(|p| p.spawn());
    let storage_stats = buckets.stats.clone();
    let cache = Arc::new(ReadCache::new(config.storage.cache_bytes));
    let control_metrics = weir_control::metrics::ControlMetrics::new();
    let observing =
        crate::observe::start(&config, &buckets, cache.clone(), &control_metrics).await?;
    let metadata = buckets.metadata.store.clone();
    let listener = tokio::net::TcpListener::bind(&config.agent.listen)
        .await
        .with_context(|| format!("binding {}", config.agent.listen))?;
    let local = listener.local_addr()?;
    drop(listener);
    let advertised_host = if !config.agent.advertised_host.is_empty() {
        config.agent.advertised_host.clone()
    } else if local.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        local.ip().to_string()
    };
    let member = Membership::bind(&config, &advertised_host, local.port(), seed).await?;
    let kafka_address = format!("{advertised_host}:{}", local.port());
    let prewarmed = prewarmed_slots(&config, &buckets);
    let control = ControlPlane::open(
        metadata,
        ControlPlaneSettings {
            max_inflight_writes: config.control.max_inflight_writes.max(1),
            snapshot_every_slots: config.control.snapshot_max_slots.max(1),
            snapshot_max_log_bytes: config.control.snapshot_max_log_bytes.max(1),
            snapshot_max_interval: config.control.snapshot_max_interval,
            log_gc: config.control.log_gc,
            address: member.as_ref().map_or(kafka_address, |m| m.address.clone()),
            appendable: buckets.metadata.appendable.clone(),
            prewarmed_slots: prewarmed,
            cluster: member.as_ref().map(|m| m.settings.clone()),
            metrics: control_metrics,
            ..ControlPlaneSettings::default()
        },
        seed,
    )
    .await
    .context("recovering the control plane")?;
    let cluster_incarnation = member.as_ref().map(|m| m.settings.incarnation.clone());
    let queues = member.as_ref().map(|m| m.queues.clone());
    let (control_stop, control_stopped) = tokio::sync::oneshot::channel::<()>();
    let control_serving = member.map(|member| member.serve(&control, control_stopped));
    match prewarmed {
        0 if buckets.metadata.appendable.is_some() && config.control.prewarmed_slots > 0 => info!(
            "metadata log slots are written with create-only PUTs: on this bucket a create costs \
             what an append does, so pre-warmed slots would double the log's requests"
        ),
        0 => {}
        slots => info!(
            prewarmed_slots = slots,
            "metadata log slots are appended into pre-warmed objects (RFC 0004)"
        ),
    }
    let writer = Arc::new(
        QuorumWriter::new(buckets.ingest_stores(), config.storage.quorum)?
            .with_max_lagging_bytes(config.storage.max_lagging_bytes_per_bucket)
            .with_read_hedge_after(config.storage.read_hedge_after)
            .with_contiguous_payloads(buckets.ingest_in_process()),
    );
    let ingest = ingest_writes(&config, &buckets, clock.clone(), seed)?;
    let produce = ProducePipeline::start_with(
        ProduceSettings {
            flush_interval: config
                .produce
                .flush_interval
                .resolve(&config.storage.profile),
            target_file_bytes: config
                .produce
                .target_file_bytes
                .resolve(&config.storage.profile),
            max_file_bytes: config.produce.max_file_bytes,
            max_inflight_uploads: config.produce.max_inflight_uploads.max(1),
            eager_uploads: config.produce.eager_uploads,
            upload_attempts: config.produce.upload_attempts.max(1),
            // A cluster member commits after upload: followers do not reserve (RFC 0006,
            // "Clusters").
            parallel_persistence: config.produce.parallel_persistence
                && cluster_incarnation.is_none(),
            ack_deadline: config.produce.ack_deadline,
            timer_lag: weir_common::TOKIO_TIMER_LAG,
            ..ProduceSettings::default()
        },
        writer.clone(),
        ingest.clone(),
        control.clone(),
        cache.clone(),
        clock.clone(),
        seed,
    );
    let regional_reader = match &buckets.regional {
        Some(bucket) => Some(Arc::new(QuorumWriter::new(vec![bucket.store.clone()], 1)?)),
        None => None,
    };
    let read_ahead = config
        .storage
        .read_ahead_bytes
        .min(config.storage.cache_bytes as u64 / READ_AHEAD_CACHE_SHARE);
    let mut fetch = FetchReader::new(control.clone(), writer.clone(), cache)
        .with_plan_ttl(config.gc.fetch_plan_ttl)
        .with_read_ahead(read_ahead);
    if let Some(regional) = &regional_reader {
        fetch = fetch.with_regional(regional.clone());
    }
    let settings = BrokerSettings {
        node_id: config.agent.node_id,
        advertised_host,
        advertised_port: i32::from(local.port()),
        rack: (!config.agent.rack.is_empty()).then(|| config.agent.rack.clone()),
        cluster_incarnation: cluster_incarnation.clone(),
        registration_grace: registration_grace(&config),
        auto_create_topics: config.kafka.auto_create_topics,
        default_partitions: config.kafka.num_partitions,
        max_frame_bytes: config.kafka.max_frame_bytes,
        max_nonproduce_frame_bytes: config.kafka.max_nonproduce_frame_bytes,
        max_connections: config.kafka.max_connections,
        max_inflight_per_connection: config.kafka.max_inflight_per_connection,
        max_inflight_request_bytes: config.kafka.max_inflight_request_bytes,
        max_inflight_fetch_bytes: config.kafka.max_inflight_fetch_bytes,
        connections_max_idle: config.kafka.connections_max_idle,
        request_read_timeout: config.kafka.request_read_timeout,
        max_fetch_bytes: config.kafka.max_fetch_bytes,
        max_fetch_wait: config.kafka.max_fetch_wait,
        groups: config.groups.settings(),
        produce_validation: config.produce.validation.into(),
        max_decompressed_bytes: config.produce.max_decompressed_bytes,
        producer_admission: weir_server::AdmissionSettings {
            rate: config.produce.init_producer_id_rate,
            burst: config.produce.init_producer_id_burst,
            max_producer_ids: config.produce.max_producer_ids,
        },
        retention: config.retention.settings().defaults,
        max_topic_labels: config.http.max_topic_labels,
    };
    let incarnations = produce.incarnations();
    let broker = Arc::new(Broker::new(
        settings,
        control.clone(),
        produce,
        fetch,
        clock.clone(),
        seed,
    ));
    observing.attach(&broker)?;
    let leave_clock = clock.clone();
    let wall_clock = clock;
    if cluster_incarnation.is_some() {
        await_registration(control.registration(), registration_grace(&config)).await;
    }
    let server = Server::bind(&local.to_string(), broker.clone()).await?;
    // Only now can /readyz say ready.
    observing.listening();
    info!(
        listen = %server.local_addr()?,
        data_dir = %config.agent.data_dir.display(),
        profile = %config.storage.profile,
        "weir agent listening"
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let compactor = start_compaction(
        &config,
        &buckets,
        control.clone(),
        writer.clone(),
        queues,
        wall_clock.clone(),
        seed,
    )
    .await?;
    let compacting: Vec<_> = match &compactor {
        Some(compactor) => {
            let mut tasks = vec![tokio::spawn(compactor.clone().run_planner(stop_rx.clone()))];
            for n in 0..config.compaction.workers {
                let worker = format!("{}-w{n}", compactor_member_id(&config));
                tasks.push(tokio::spawn(
                    compactor.clone().run_worker(worker, stop_rx.clone()),
                ));
            }
            tasks
        }
        None => Vec::new(),
    };
    let report = crate::report::Sources {
        storage: storage_stats.clone(),
        pool: match &ingest {
            IngestWrites::Pool(pool) => Some(pool.clone()),
            IngestWrites::Put => None,
        },
        compaction: compactor.clone(),
    };
    let reporting = crate::report::spawn(&config.agent.storage_report, &report);
    let retention = tokio::spawn(weir_control::maintenance::run_maintenance(
        control.clone(),
        config.retention.settings(),
        config.expiry(),
        wall_clock.clone(),
        stop_rx.clone(),
    ));
    let regional_stores: Vec<_> = buckets.regional.iter().map(|b| b.store.clone()).collect();
    let deleter = weir_control::gc::FileDeleter::new(
        control.clone(),
        buckets.ingest_stores(),
        weir_control::gc::DeleterSettings {
            grace: config.gc.grace,
            interval: config.gc.interval,
        },
    )
    .with_regional(regional_stores.clone());
    let deleting = tokio::spawn(deleter.run(stop_rx.clone()));
    let sweeper = weir_control::sweep::OrphanSweeper::new(
        control.clone(),
        buckets.ingest_stores(),
        wall_clock.clone(),
        weir_control::sweep::SweepSettings {
            orphan_age: config.gc.orphan_age,
            interval: config.gc.sweep_interval,
        },
    )
    .with_regional(regional_stores);
    let sweeping = tokio::spawn(sweeper.run(stop_rx.clone()));
    // Always runs: pending files may come from an earlier run with parallel persistence.
    let mut resolver = Resolver::new(
        control.clone(),
        writer.clone(),
        wall_clock,
        incarnations,
        ResolverSettings {
            ack_deadline: config.produce.ack_deadline,
            clock_skew_margin: config.produce.clock_skew_margin,
            ..ResolverSettings::default()
        },
        seed,
    )
    .with_metrics(broker.produce.metrics().clone());
    // Before the Kafka listener serves: a restart's acknowledged, unconfirmed files readable.
    resolver.pass_before_serving(STARTUP_RESOLVE).await;
    let resolving = tokio::spawn(resolver.run(stop_rx.clone()));
    let group_expiry = tokio::spawn(weir_server::run_group_expiry(
        broker,
        weir_server::GroupExpirySettings {
            offsets_retention: config.groups.offsets_retention,
            startup_delay: config.groups.expiry_startup_delay,
            check_interval: config.retention.check_interval,
        },
        stop_rx.clone(),
    ));
    let serving = tokio::spawn(server.run(stop_rx));
    let refused = tokio::select! {
        _ = wait_for_signal() => None,
        address = refused_registration(control.registration()) => Some(address),
    };
    info!("shutting down: draining connections");
    if let Some(incarnation) = &cluster_incarnation {
        let leave = control.leave(config.agent.node_id, incarnation, leave_clock.now_ms());
        let _ = tokio::time::timeout(config.cluster.forward_timeout, leave).await;
    }
    let _ = stop_tx.send(true);
    let _ = serving.await;
    let _ = retention.await;
    let _ = deleting.await;
    let _ = sweeping.await;
    let _ = resolving.await;
    let _ = group_expiry.await;
    for task in compacting {
        let _ = task.await;
    }
    if let Some(compactor) = &compactor {
        let s = compactor.stats();
        info!(
            jobs_done = s.jobs_done,
            jobs_refused = s.jobs_conflicted,
            jobs_retried = s.jobs_retried,
            input_files = s.input_files,
            outputs = s.outputs,
            bytes_written = s.bytes_written,
            "compaction"
        );
    }
    control.shutdown().await;
    let _ = control_stop.send(());
    if let Some(serving) = control_serving {
        // Followers' record streams stay open until they notice: do not wait for them long.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), serving).await;
    }
    if let IngestWrites::Pool(pool) = &ingest {
        pool.shutdown().await;
        let stats = pool.stats();
        info!(
            hits = stats.hits,
            misses = stats.misses,
            created = stats.created,
            discarded = stats.discarded,
            load_errors = stats.load_errors,
            "writer pool: takes served ready (hits) or with a create on the produce path (misses); \
             many misses: raise storage.pool.target_ready"
        );
    }
    if let Some(verifying) = verifying {
        verifying.abort();
    }
    for (bucket, lag) in writer.lag_stats().iter().enumerate() {
        if lag.abandoned_writes > 0 {
            info!(
                bucket,
                abandoned_writes = lag.abandoned_writes,
                abandoned_bytes = lag.abandoned_bytes,
                "background writes abandoned over storage.max_lagging_bytes_per_bucket"
            );
        }
    }
    for line in storage_stats.summary() {
        info!("object storage: {line}");
    }
    if let Some(reporting) = reporting {
        // Wait for the periodic writer to be gone, so the final report is the last rename.
        reporting.abort();
        let _ = reporting.await;
        crate::report::write_final(&config.agent.storage_report, &report).await;
    }
    observing.stop().await;
    info!("stopped");
    match refused {
        Some(address) => anyhow::bail!(
            "node id {} belongs to the live agent at {address}: give each agent its own --node-id",
            config.agent.node_id
        ),
        None => Ok(()),
    }
}

/// Resolves when the registry refuses this agent for good (another live agent has its node
/// id); pending for ever otherwise.
/// How long a cluster member waits to be registered before it serves Kafka clients anyway: a
/// restart waits for its predecessor's fence (up to a failover and the agent timeout).
fn registration_grace(config: &Config) -> std::time::Duration {
    config.cluster.lease_timeout + config.cluster.agent_timeout + config.cluster.lease_renew * 3
}

/// Waits until this member is in the registry (or refused, or `grace` passed) before the
/// Kafka listener opens: every agent then lists it by the time clients reach it, so a client
/// bootstrapped at a restarted agent is not told by the others that it does not exist.
async fn await_registration(
    mut registration: watch::Receiver<weir_control::Registration>,
    grace: std::time::Duration,
) {
    let settled = registration.wait_for(|now| {
        matches!(
            now,
            weir_control::Registration::Registered { .. }
                | weir_control::Registration::Refused { .. }
        )
    });
    if tokio::time::timeout(grace, settled).await.is_err() {
        tracing::warn!(
            ?grace,
            "not registered in the cluster yet (no leader reachable?); serving Kafka clients \
             anyway: the other agents do not list this one until it registers"
        );
    }
}

async fn refused_registration(
    mut registration: watch::Receiver<weir_control::Registration>,
) -> String {
    let refused = registration
        .wait_for(|now| matches!(now, weir_control::Registration::Refused { .. }))
        .await
        .map(|now| now.clone());
    match refused {
        Ok(weir_control::Registration::Refused { address }) => address,
        _ => std::future::pending().await,
    }
}

/// This agent's name in the compaction queue.
fn compactor_member_id(config: &Config) -> String {
    format!("agent-{}-{}", config.agent.node_id, std::process::id())
}

/// The compaction planner and workers (RFC 0005), when compaction is on and a regional bucket
/// is configured. The job queue lives in the metadata bucket: through its compare-and-set
/// (checked first), or for a `file://` metadata bucket through the local compare-and-set on
/// the same directory. In a cluster its broker is reached over the control service
/// (`queues`), so one broker serves every agent; alone, in process.
async fn start_compaction(
    config: &Config,
    buckets: &Buckets,
    control: ControlPlane,
    ingest: Arc<QuorumWriter>,
    queues: Option<Arc<weir_cluster::QueueNetwork>>,
    clock: Arc<dyn Clock>,
    seed: u64,
) -> anyhow::Result<Option<Arc<weir_compactor::Compactor>>> {
    let Some(regional) = buckets
        .regional
        .as_ref()
        .filter(|_| config.compaction.enabled)
    else {
        if !config.compaction.enabled {
            info!("compaction is off (compaction.enabled = false)");
        }
        if queues.is_some() {
            tracing::warn!(
                "compaction does not run on this agent, and in a cluster the leader plans it: \
                 while this agent leads nothing is compacted; give every agent the same \
                 [compaction] settings and storage.compacted_bucket"
            );
        }
        return Ok(None);
    };
    let meta = weir_storage::BucketUrl::parse(&buckets.metadata.name)?;
    let cas: Arc<dyn weir_objq::cas::CasObject> = if meta.scheme == "file" {
        let dir = std::path::Path::new(&meta.bucket).join("queue");
        Arc::new(
            weir_objq::cas::local::LocalCas::new(&dir, "compaction")
                .map_err(|e| anyhow::anyhow!("the compaction queue in {}: {e}", dir.display()))?,
        )
    } else {
        weir_storage::probe::compare_and_set(
            buckets.metadata.direct.as_ref(),
            &buckets.metadata.name,
            "the compaction job queue (or run with compaction.enabled = false)",
        )
        .await?;
        Arc::new(weir_objq::cas::ObjectStoreCas::new(
            buckets.metadata.store.clone(),
            weir_storage::keys::queue("compaction"),
        ))
    };
    let queue_settings = config.compaction.queue_settings();
    let (address, network): (String, Arc<dyn weir_objq::Network>) = match queues {
        Some(queues) => (queues.address("compaction"), queues),
        None => (
            "local".to_string(),
            weir_objq::LocalNetwork::new(&queue_settings),
        ),
    };
    let member = Arc::new(weir_objq::Member::new(
        &compactor_member_id(config),
        &address,
        cas,
        network,
        queue_settings,
    ));
    info!(
        bucket = %regional.name,
        workers = config.compaction.workers,
        target_file_bytes = config.compaction.target_file_bytes,
        max_input_age = ?config.compaction.max_input_age,
        "compaction on"
    );
    Ok(Some(Arc::new(weir_compactor::Compactor::new(
        control,
        ingest,
        regional.store.clone(),
        member,
        clock,
        config.compaction.settings(),
        seed,
    ))))
}

/// The metadata log's pre-warmed slots: `control.prewarmed_slots` where the metadata bucket has
/// appendable objects whose creates ahead of need pay off, else none (each slot is then one
/// create-only PUT; empty slot objects left by an earlier writer are still filled through the
/// appendable view).
fn prewarmed_slots(config: &Config, buckets: &Buckets) -> usize {
    match &buckets.metadata.appendable {
        Some(appendable) if appendable.creates_ahead_pay_off() => config.control.prewarmed_slots,
        _ => 0,
    }
}

/// How sealed files reach the ingest buckets (`storage.ingest_writes`): appends into pooled
/// objects when the mode says so, or when it is `auto` and every ingest bucket has appendable
/// objects whose creates ahead of need pay off; else PUTs.
fn ingest_writes(
    config: &Config,
    buckets: &Buckets,
    clock: Arc<dyn Clock>,
    seed: u64,
) -> anyhow::Result<IngestWrites> {
    let mode = config.storage.ingest_writes;
    let appendable = buckets.ingest_appendable();
    let pays_off = |stores: &[Arc<dyn AppendableStore>]| {
        stores.iter().all(|store| store.creates_ahead_pay_off())
    };
    let appendable = match (mode, appendable) {
        (IngestWriteMode::Put, _) | (IngestWriteMode::Auto, None) => {
            info!(mode = ?mode, "ingest files are written with one PUT per file and bucket");
            return Ok(IngestWrites::Put);
        }
        (IngestWriteMode::Auto, Some(appendable)) if !pays_off(&appendable) => {
            info!(
                "ingest files are written with one PUT per file and bucket: on these buckets a \
                 create costs what an append does, so pooled objects would double the requests"
            );
            return Ok(IngestWrites::Put);
        }
        (IngestWriteMode::Append, None) => anyhow::bail!(
            "storage.ingest_writes = \"append\", but not every ingest bucket has appendable \
             objects (here: memory:// and file:// buckets under the gcs-rapid or s3-express profile); use \
             \"auto\" or \"put\""
        ),
        (_, Some(appendable)) => appendable,
    };
    config.validate_pool()?;
    let settings = config.storage.pool.settings();
    let loader = IngestLoader::new(
        appendable,
        buckets.ingest_stores(),
        config.storage.quorum,
        clock,
        seed.rotate_left(29) ^ 0x706f_6f6c,
    )?;
    info!(
        target_ready = settings.target_ready,
        load_concurrency = settings.load_concurrency,
        max_item_age = ?settings.max_item_age,
        "ingest files are appended into pooled objects (storage.pool)"
    );
    Ok(IngestWrites::Pool(WriterPool::start(loader, settings)))
}

async fn wait_for_signal() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match terminate.as_mut() {
                Some(signal) => { signal.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

/// The agent's configuration from command-line flags (tests).
#[cfg(test)]
pub(crate) fn config_from_flags(flags: &[&str]) -> anyhow::Result<Config> {
    use clap::Parser;
    let argv = ["weir", "agent"].iter().chain(flags);
    let crate::Command::Agent(args) = crate::Cli::try_parse_from(argv)?.command else {
        panic!("not the agent command");
    };
    resolve_config(&args)
}

/// This agent as a cluster member (`cluster.control_listen` set; RFC 0002): its control
/// service's listener and address, and its membership settings.
struct Membership {
    listener: tokio::net::TcpListener,
    address: String,
    link: weir_cluster::GrpcLink,
    /// The job queues' network: the compaction queue's broker serves every agent's members.
    queues: Arc<weir_cluster::QueueNetwork>,
    settings: weir_control::plane::ClusterSettings,
}

impl Membership {
    async fn bind(
        config: &Config,
        advertised_host: &str,
        kafka_port: u16,
        seed: u64,
    ) -> anyhow::Result<Option<Membership>> {
        let cluster = &config.cluster;
        if cluster.control_listen.is_empty() {
            return Ok(None);
        }
        let listener = tokio::net::TcpListener::bind(&cluster.control_listen)
            .await
            .with_context(|| {
                format!("binding the control service to {}", cluster.control_listen)
            })?;
        let address = if cluster.control_advertise.is_empty() {
            let port = listener.local_addr()?.port();
            if advertised_host.contains(':') && !advertised_host.starts_with('[') {
                // An IPv6 address: host:port needs it bracketed (URIs of the control service).
                format!("[{advertised_host}]:{port}")
            } else {
                format!("{advertised_host}:{port}")
            }
        } else {
            cluster.control_advertise.clone()
        };
        let link = weir_cluster::GrpcLink::new(cluster.forward_timeout);
        let queue_settings = config.compaction.queue_settings();
        let queues = weir_cluster::QueueNetwork::new(
            &address,
            link.with_timeout(queue_settings.broker_timeout),
            queue_settings.inbox,
        );
        let settings = weir_control::plane::ClusterSettings {
            lease_renew: cluster.lease_renew,
            lease_timeout: cluster.lease_timeout,
            forward_timeout: cluster.forward_timeout,
            agent_timeout: cluster.agent_timeout,
            // Config validation keeps it below gc.grace less twice gc.fetch_plan_ttl.
            max_read_staleness: cluster.lease_timeout,
            agent: Some(weir_control::AgentInfo {
                zone: config.agent.rack.clone(),
                host: advertised_host.to_string(),
                port: i32::from(kafka_port),
            }),
            ..weir_control::plane::ClusterSettings::new(
                config.agent.node_id,
                &format!("{seed:016x}"),
                Arc::new(link.clone()),
            )
        };
        Ok(Some(Membership {
            listener,
            address,
            link,
            queues,
            settings,
        }))
    }

    /// Serves the control service until `stop`; other agents reach this one at its address.
    fn serve(
        self,
        control: &ControlPlane,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> tokio::task::JoinHandle<()> {
        self.link
            .set_cluster_id(&control.read(|state| state.cluster_id.clone()));
        let role = *control.role().borrow();
        info!(
            node_id = self.settings.node_id,
            control = %self.address,
            ?role,
            "joined the cluster on these buckets"
        );
        let control = control.clone();
        tokio::spawn(async move {
            let stopped = async {
                let _ = stop.await;
            };
            let served = weir_cluster::serve(self.listener, control, Some(self.queues), stopped);
            if let Err(err) = served.await {
                tracing::error!(error = %err, "the control service stopped");
            }
        })
    }
}

/// Longest a starting agent waits for its predecessor's pending files to be resolved before it
/// serves.
const STARTUP_RESOLVE: std::time::Duration = std::time::Duration::from_secs(10);
