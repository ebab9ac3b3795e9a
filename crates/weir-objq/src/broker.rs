//! The broker: the queue object's sole writer.
//!
//! It takes over the object by compare-and-set (itself as broker, epoch + 1), then loops: wait
//! for a request, take every request already waiting, apply them to a copy of the state, write
//! the copy by compare-and-set on the version it last wrote, and only then answer them (group
//! commit: one write in flight, carrying everything that arrived during the previous one).
//! A write refused by compare-and-set means another broker took over: this one answers
//! `NotBroker` to everything and stops. A write that failed otherwise may have landed; the
//! broker reads the object back and goes on if its bytes are there, retries if the object is
//! unchanged, and stops if it is anything else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cas::{CasError, CasObject, Version};
use crate::state::{BrokerInfo, Leases, QueueState, Request, Response};
use crate::{QueueError, Settings};

/// A request with the channel its answer goes back on.
pub type Envelope = (Request, oneshot::Sender<Response>);

/// What a takeover expects to find in the object.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    /// The object's version when it was read; `None`: it did not exist.
    pub(crate) version: Option<Version>,
    /// The broker it named (the one that stopped answering).
    pub(crate) broker: Option<BrokerInfo>,
}

/// Takes the object over for `me` and returns the running broker's state and version.
pub(crate) async fn take_over(
    cas: &dyn CasObject,
    me: &BrokerInfo,
    expected: &Expected,
) -> Result<(QueueState, Version), QueueError> {
    let (mut state, version) = match cas.read().await? {
        None => (QueueState::default(), None),
        Some((bytes, version)) => (QueueState::decode(&bytes)?, Some(version)),
    };
    if version != expected.version || state.broker != expected.broker {
        return Err(QueueError::LostTakeover);
    }
    let epoch = state.broker.as_ref().map_or(0, |b| b.epoch) + 1;
    state.broker = Some(BrokerInfo {
        epoch,
        ..me.clone()
    });
    state.write_seq += 1;
    match cas.write(state.encode(), version.as_ref()).await {
        Ok(version) => {
            info!(broker = %me.id, epoch, jobs = state.jobs.len(), "queue broker took over");
            Ok((state, version))
        }
        Err(CasError::Conflict) => Err(QueueError::LostTakeover),
        Err(other) => Err(other.into()),
    }
}

/// Runs a broker that took over with `state` at `version` until it is replaced or `requests`
/// closes.
pub(crate) async fn run(
    cas: Arc<dyn CasObject>,
    settings: Settings,
    mut state: QueueState,
    mut version: Version,
    mut requests: mpsc::Receiver<Envelope>,
) {
    let mut leases: Leases = state.restart_leases(Instant::now(), settings.lease);
    let me = state.broker.clone();
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        let now = Instant::now();
        let mut working = state.clone();
        let mut working_leases = leases.clone();
        let mut changed = false;
        let mut answers = Vec::with_capacity(batch.len());
        for (request, reply) in batch {
            let (answer, did) = working.apply(
                &request,
                now,
                &mut working_leases,
                settings.lease,
                settings.max_jobs,
            );
            changed |= did;
            answers.push((reply, answer));
        }
        if changed {
            working.write_seq += 1;
            match write(cas.as_ref(), &working, &version, settings.write_retry).await {
                Ok(written) => version = written,
                Err(why) => {
                    warn!(broker = ?me, %why, "queue broker stepping down");
                    for (reply, _) in answers {
                        let _ = reply.send(Response::NotBroker);
                    }
                    requests.close();
                    while let Some((_, reply)) = requests.recv().await {
                        let _ = reply.send(Response::NotBroker);
                    }
                    return;
                }
            }
        }
        state = working;
        leases = working_leases;
        for (reply, answer) in answers {
            let _ = reply.send(answer);
        }
    }
    debug!(broker = ?me, "queue broker stopped");
}

/// Writes `state` over `version`; on an unclear failure reads back to learn what happened.
async fn write(
    cas: &dyn CasObject,
    state: &QueueState,
    version: &Version,
    retry: Duration,
) -> Result<Version, String> {
    let bytes = state.encode();
    loop {
        match cas.write(bytes.clone(), Some(version)).await {
            Ok(written) => return Ok(written),
            Err(CasError::Conflict) => return Err("another broker wrote the object".into()),
            Err(CasError::Unsupported(why)) => return Err(why),
            Err(CasError::Store(why)) => {
                debug!(%why, "queue write failed; reading the object back");
                tokio::time::sleep(retry).await;
                match cas.read().await {
                    Ok(Some((now, read))) if now == bytes => return Ok(read),
                    Ok(Some((_, read))) if &read == version => continue,
                    Ok(_) => return Err("the object changed under a failed write".into()),
                    // Cannot tell yet: keep the requests waiting and try again.
                    Err(_) => continue,
                }
            }
        }
    }
}
