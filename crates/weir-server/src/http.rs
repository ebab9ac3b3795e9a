//! The agent's HTTP endpoint (`http.listen`, default 127.0.0.1:9644): `/metrics` (Prometheus
//! text format), `/healthz` (the process runs), `/readyz` (it can serve, see
//! [`crate::health`]) and the status page at `/` ([`crate::status`]).
//!
//! HTTP/1.1 GET and HEAD only, a bounded number of connections (in all and per peer address),
//! request heads of at most 16 KiB that must arrive within 10 s, and every connection closed
//! after 60 s: a misbehaving scraper or browser cannot hold the agent's memory or tasks (BAD-1),
//! nor every slot.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder as _, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, warn};

use crate::metrics::Live;
use crate::status::Throughput;

/// Connections the endpoint serves at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 64;
/// Connections one peer address may hold, so one client cannot take every slot and starve the
/// liveness probe (the kubelet probes from the node's address).
const MAX_CONNECTIONS_PER_PEER: usize = 8;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Largest request head (hyper's minimum is 8 KiB).
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Everything the endpoint shows.
#[derive(Debug)]
pub struct Observability {
    /// Counters and histograms updated as things happen.
    pub registry: Registry,
    /// Values read at scrape time.
    pub live: Live,
    /// For the status page's rates.
    pub throughput: Throughput,
    pub started: Instant,
}

impl Observability {
    pub fn new(registry: Registry, live: Live) -> Arc<Self> {
        Arc::new(Self {
            registry,
            live,
            throughput: Throughput::default(),
            started: Instant::now(),
        })
    }

    /// `/metrics` as Prometheus text.
    pub fn metrics_text(&self) -> String {
        let mut families = self.registry.gather();
        families.extend(self.live.families());
        // A labelled family with no series yet (no groups) is not valid in the text format.
        families.retain(|family| !family.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&families, &mut out) {
            warn!(error = %err, "encoding metrics failed");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Serves `listener` until `stop`; samples the status page's rates meanwhile.
pub async fn serve(
    listener: TcpListener,
    observed: Arc<Observability>,
    mut stop: watch::Receiver<bool>,
) {
    let sampling = tokio::spawn(crate::status::sample(observed.clone(), stop.clone()));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_peer: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    warn!(error = %err, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(peer_slot) = PeerSlot::take(&per_peer, peer.ip()) else {
            debug!(%peer, "HTTP connection refused: {MAX_CONNECTIONS_PER_PEER} open from this peer");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "HTTP connection refused: {MAX_CONNECTIONS} open");
            continue;
        };
        let observed = observed.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let observed = observed.clone();
                async move { Ok::<_, Infallible>(route(&observed, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop((slot, peer_slot));
        });
    }
    sampling.abort();
}

/// One of a peer's connection slots, given back on drop.
struct PeerSlot {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = peers.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: peers.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

const TEXT: &str = "text/plain; charset=utf-8";

fn route(observed: &Observability, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
        response
            .headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            observed.metrics_text(),
        ),
        "/healthz" => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => match observed.live.readiness() {
            Ok(()) => respond(StatusCode::OK, TEXT, "ready\n".into()),
            Err(reason) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("not ready: {reason}\n"),
            ),
        },
        "/" => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            crate::status::render(observed),
        ),
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /, /metrics, /healthz or /readyz\n".into(),
        ),
    }
}
