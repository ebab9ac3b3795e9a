//! One client connection: a reader that decodes and dispatches requests in order, and a writer
//! that sends responses strictly in request order (ORD-3).
//!
//! The reader never waits for a response before reading the next request, so a connection can
//! have up to `max_inflight_per_connection` requests in flight (produce pipelining). Each request
//! holds memory permits for its frame size until its response is built.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use weir_protocol::frame::{read_frame_body, read_frame_len, FrameError};

use crate::broker::Broker;
use crate::dispatch::{dispatch, Dispatched};

/// A response slot: `None` when the request gets no response (acks=0). The permit, for fetches,
/// is released only once the response is written, so a client that never reads its socket holds
/// at most one fetch response per connection. A fetch response's bytes also stay charged to the
/// agent-wide response budget until it is written and dropped (`memory.rs`), which bounds what
/// all such clients together hold.
type ResponseSlot = (JoinHandle<Option<Bytes>>, Option<OwnedSemaphorePermit>);

const FETCH_API_KEY: [u8; 2] = [0, 1];

pub(crate) async fn serve(
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    debug!(%peer, "connection opened");
    let (reader, mut writer) = stream.into_split();
    let broker_idle = broker.settings.connections_max_idle;
    let (slots_tx, mut slots_rx) =
        mpsc::channel::<ResponseSlot>(broker.settings.max_inflight_per_connection.max(1));
    let reading = tokio::spawn(read_requests(broker, reader, peer, slots_tx, shutdown));
    while let Some((slot, fetch_permit)) = slots_rx.recv().await {
        let response = match slot.await {
            Ok(response) => response,
            Err(err) => {
                warn!(%peer, error = %err, "request handler failed, closing connection");
                break;
            }
        };
        if let Some(bytes) = response {
            let idle = broker_idle;
            match tokio::time::timeout(idle, writer.write_all(&bytes)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    debug!(%peer, error = %err, "write failed, closing connection");
                    break;
                }
                Err(_) => {
                    // The client has not read for the idle period: free what it pins.
                    warn!(%peer, ?idle, "client did not read its response, closing connection");
                    break;
                }
            }
            // Returns a fetch response's memory before the next fetch may be read.
            drop(bytes);
        }
        drop(fetch_permit);
    }
    reading.abort();
    let _ = writer.shutdown().await;
    debug!(%peer, "connection closed");
}

async fn read_requests(
    broker: Arc<Broker>,
    mut reader: OwnedReadHalf,
    peer: SocketAddr,
    slots: mpsc::Sender<ResponseSlot>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Kafka clients keep one fetch in flight per connection; more would only let a reader that
    // never drains its socket pile up fetch responses.
    let fetches = Arc::new(tokio::sync::Semaphore::new(1));
    loop {
        let frame = tokio::select! {
            _ = shutdown.changed() => return,
            frame = read_one(&broker, &mut reader) => frame,
        };
        let (frame, permit) = match frame {
            Ok(Some(pair)) => pair,
            Ok(None) => return,
            Err(err) => {
                warn!(%peer, error = %err, "bad frame, closing connection");
                return;
            }
        };
        let fetch_permit = if frame.get(0..2) == Some(&FETCH_API_KEY[..]) {
            match fetches.clone().acquire_owned().await {
                Ok(permit) => Some(permit),
                Err(_) => return,
            }
        } else {
            None
        };
        match dispatch(&broker, frame, peer).await {
            Dispatched::Respond(work) => {
                let handle = tokio::spawn(async move {
                    let response = work.await;
                    drop(permit);
                    response
                });
                if slots.send((handle, fetch_permit)).await.is_err() {
                    return;
                }
            }
            Dispatched::Close(reason) => {
                warn!(%peer, %reason, "closing connection");
                return;
            }
        }
    }
}

/// Decoding a request can take this many times its wire size in memory: a 4-byte array element
/// (an empty topic name) becomes a ~72-byte struct. Produce is exempt: its record bytes are kept
/// as zero-copy slices of the frame.
const DECODE_AMPLIFICATION: usize = 40;

/// Reads one frame once memory permits for its declared size are available. Requests other than
/// Produce must fit `max_nonproduce_frame_bytes` and are charged for their decoded size.
async fn read_one(
    broker: &Broker,
    reader: &mut OwnedReadHalf,
) -> Result<Option<(Bytes, OwnedSemaphorePermit)>, FrameError> {
    let idle = broker.settings.connections_max_idle;
    let Ok(len) = tokio::time::timeout(
        idle,
        read_frame_len(reader, broker.settings.max_frame_bytes),
    )
    .await
    else {
        debug!(?idle, "no request for the idle period, closing connection");
        return Ok(None);
    };
    let Some(len) = len? else {
        return Ok(None);
    };
    let mut permit = acquire(broker, len).await?;
    let body = read_frame_body(reader, len).await?;
    let is_produce = body.get(0..2) == Some(&[0, 0][..]);
    if !is_produce {
        let limit = broker.settings.max_nonproduce_frame_bytes;
        if len > limit {
            return Err(FrameError::TooLarge {
                len: len as i64,
                max: limit,
            });
        }
        permit.merge(acquire(broker, len.saturating_mul(DECODE_AMPLIFICATION - 1)).await?);
    }
    Ok(Some((body, permit)))
}

/// Takes `bytes` from the agent-wide memory budget, never more than the whole budget.
async fn acquire(broker: &Broker, bytes: usize) -> Result<OwnedSemaphorePermit, FrameError> {
    let wanted = bytes.min(broker.memory_capacity);
    let permits = u32::try_from(wanted).unwrap_or(u32::MAX);
    broker
        .memory
        .clone()
        .acquire_many_owned(permits)
        .await
        .map_err(|_| FrameError::Truncated)
}
