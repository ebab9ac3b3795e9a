//! Readiness (`/readyz`): the control plane serves and the buckets answer.
//!
//! A background probe asks every bucket for an object that need not exist (a HEAD of
//! `weir/probe/ready`) every `probe_interval`; "not found" is an answer, so only an unreachable
//! or failing store fails it. An idle agent therefore notices a lost metadata bucket before a
//! client's write does. The probe goes through the storage layer, so its requests appear in
//! `weir_object_store_requests_total{class="head"}` and cost what a HEAD costs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tokio::sync::watch;
use tracing::{info, warn};
use weir_control::Registration;

use crate::broker::Broker;

/// A bucket the probe asks.
#[derive(Debug, Clone)]
pub struct ProbedBucket {
    /// Its display name (URL without options).
    pub name: String,
    pub store: Arc<dyn ObjectStore>,
}

/// The probe's last answer per bucket (`None` before the first).
type Answers = Vec<Option<Result<(), String>>>;

/// What `/readyz` checks.
#[derive(Debug)]
pub struct Readiness {
    metadata: ProbedBucket,
    ingest: Vec<ProbedBucket>,
    /// Ingest buckets that must answer (the write quorum).
    quorum: usize,
    /// Index 0: the metadata bucket; then the ingest buckets in order.
    answers: Mutex<Answers>,
}

impl Readiness {
    pub fn new(metadata: ProbedBucket, ingest: Vec<ProbedBucket>, quorum: usize) -> Arc<Self> {
        let answers = vec![None; ingest.len() + 1];
        Arc::new(Self {
            metadata,
            ingest,
            quorum,
            answers: Mutex::new(answers),
        })
    }

    fn buckets(&self) -> impl Iterator<Item = &ProbedBucket> {
        std::iter::once(&self.metadata).chain(&self.ingest)
    }

    /// Probes every bucket now and then every `interval` until `stop`; each probe gives up
    /// after `timeout`. Logs when a bucket stops or starts answering.
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        timeout: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let probe_key = Path::from("weir/probe/ready");
        // The metadata bucket is often ingest bucket 0 (the default): one HEAD per bucket, its
        // answer used for both roles.
        let mut distinct: Vec<&ProbedBucket> = Vec::new();
        for bucket in self.buckets() {
            if !distinct.iter().any(|d| d.name == bucket.name) {
                distinct.push(bucket);
            }
        }
        loop {
            let probes = distinct.iter().map(|bucket| {
                let store = bucket.store.clone();
                let key = probe_key.clone();
                async move {
                    match tokio::time::timeout(timeout, store.head(&key)).await {
                        Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Ok(()),
                        Ok(Err(err)) => Err(err.to_string()),
                        Err(_) => Err(format!("no answer within {timeout:?}")),
                    }
                }
            });
            let answers = futures::future::join_all(probes).await;
            let results = self
                .buckets()
                .map(|bucket| {
                    let at = distinct.iter().position(|d| d.name == bucket.name);
                    answers[at.expect("every bucket has a distinct entry")].clone()
                })
                .collect();
            self.record(results);
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    fn record(&self, results: Vec<Result<(), String>>) {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        for ((answer, result), bucket) in answers.iter_mut().zip(results).zip(self.buckets()) {
            let was_ok = answer.as_ref().is_none_or(|a| a.is_ok());
            match (&result, was_ok) {
                (Err(err), true) => warn!(
                    bucket = %bucket.name,
                    error = %err,
                    "bucket does not answer the readiness probe: /readyz fails while it lasts; \
                     check the bucket's endpoint, credentials and network"
                ),
                (Ok(()), false) => info!(bucket = %bucket.name, "bucket answers again"),
                _ => {}
            }
            *answer = Some(result);
        }
    }

    /// `Ok` when the agent can serve: recovered, its control plane available (and, in a
    /// cluster, registered), the metadata bucket and a quorum of ingest buckets answering.
    /// Otherwise why not.
    pub fn check(&self, broker: Option<&Broker>) -> Result<(), String> {
        let Some(broker) = broker else {
            return Err("starting: recovering the control plane".into());
        };
        if !*broker.control.availability().borrow() {
            return Err("the control plane is recovering its metadata log".into());
        }
        if broker.settings.cluster_incarnation.is_some() {
            match &*broker.control.registration().borrow() {
                Registration::Registered { .. } => {}
                Registration::Pending => return Err("not registered in the cluster yet".into()),
                Registration::Fenced => {
                    return Err("fenced: cut off from the control-plane leader".into())
                }
                Registration::Refused { address } => {
                    return Err(format!("node id taken by the live agent at {address}"))
                }
            }
        }
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Some(Err(err))) = answers.first() {
            return Err(format!(
                "metadata bucket {} unreachable: {err}",
                self.metadata.name
            ));
        }
        let failing: Vec<String> = answers[1..]
            .iter()
            .zip(&self.ingest)
            .filter_map(|(answer, bucket)| match answer {
                Some(Err(err)) => Some(format!("{}: {err}", bucket.name)),
                _ => None,
            })
            .collect();
        if self.ingest.len() - failing.len() < self.quorum {
            return Err(format!(
                "fewer than {} ingest buckets answer ({})",
                self.quorum,
                failing.join("; ")
            ));
        }
        Ok(())
    }

    /// Each probed bucket's name and last answer (`None`: not probed yet), metadata first.
    pub fn answers(&self) -> Vec<(String, Option<Result<(), String>>)> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        self.buckets()
            .map(|b| b.name.clone())
            .zip(answers.iter().cloned())
            .collect()
    }
}
