//! Wires the agent's HTTP endpoint (`[http]`): the metrics registry, the readiness probe and
//! the server, started before recovery (so `/healthz` answers and `/readyz` says "starting"
//! while the control plane recovers) and given the broker once it exists.

use std::sync::Arc;

use anyhow::Context;
use prometheus::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;
use weir_control::metrics::ControlMetrics;
use weir_server::metrics::{Live, LiveSources};
use weir_server::{Broker, Observability, ProbedBucket, Readiness};
use weir_storage::ReadCache;

use crate::buckets::{Bucket, Buckets};
use crate::config::Config;

/// The running endpoint and probe.
pub(crate) struct Observing {
    observed: Arc<Observability>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

fn probed(bucket: &Bucket) -> ProbedBucket {
    ProbedBucket {
        name: bucket.name.clone(),
        store: bucket.store.clone(),
    }
}

/// Binds `http.listen` (unless empty), registers what exists before recovery, and starts the
/// readiness probe and the server.
pub(crate) async fn start(
    config: &Config,
    buckets: &Buckets,
    cache: Arc<ReadCache>,
    control: &ControlMetrics,
) -> anyhow::Result<Observing> {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    control.register(&registry)?;
    let readiness = Readiness::new(
        probed(&buckets.metadata),
        buckets.ingest.iter().map(probed).collect(),
        config.storage.quorum,
    );
    let live = Live::new(LiveSources {
        storage: buckets.stats.clone(),
        cache,
        readiness: readiness.clone(),
        max_group_labels: config.http.max_group_labels,
    });
    let observed = Observability::new(registry, live);
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let listen = config.http.listen.trim();
    // Without the endpoint nothing reads the probe's answers: no probe either.
    if !listen.is_empty() {
        tasks.push(tokio::spawn(readiness.run(
            config.http.probe_interval,
            config.http.probe_timeout,
            stopped.clone(),
        )));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the HTTP endpoint http.listen = {listen}"))?;
        let local = listener.local_addr()?;
        info!(
            http = %local,
            "metrics at http://{local}/metrics, status page at http://{local}/"
        );
        tasks.push(tokio::spawn(weir_server::serve_http(
            listener,
            observed.clone(),
            stopped,
        )));
    }
    Ok(Observing {
        observed,
        stop,
        tasks,
    })
}

impl Observing {
    /// The agent has recovered and built its broker: its metrics join the registry, and
    /// readiness and the status page look at it from now on.
    pub(crate) fn attach(&self, broker: &Arc<Broker>) -> anyhow::Result<()> {
        broker.metrics.register(&self.observed.registry)?;
        broker.produce.metrics().register(&self.observed.registry)?;
        let _ = self.observed.live.broker.set(broker.clone());
        Ok(())
    }

    /// The Kafka listener is bound: `/readyz` may say ready from now on.
    pub(crate) fn listening(&self) {
        self.observed
            .live
            .listening
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Stops the server and the probe.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
