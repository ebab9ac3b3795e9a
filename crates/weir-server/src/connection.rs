//! One client connection: a reader that decodes and dispatches requests in order, and a writer
//! that sends responses strictly in request order (ORD-3).
//!
//! The reader never waits for a response before reading the next request, so a connection can
//! have up to `max_inflight_per_connection` requests in flight (produce pipelining); each request
//! still takes effect in request order (`order.rs`). Each request holds a charge on the request
//! memory (`request_memory.rs`) from before its body is read until its response is built.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use weir_protocol::frame::{read_frame_len, read_frame_rest, FrameError};
use weir_protocol::response::Frame;

use crate::broker::Broker;
use crate::dispatch::{dispatch, ConnectionFacts, Dispatched, RESPONSE_ERROR};
use crate::order::{Order, Sequencer};
use crate::request_memory::MemoryCharge;

/// A response slot: `None` when the request gets no response (acks=0). The permit, for fetches,
/// is released only once the response is written, so a client that never reads its socket holds
/// at most one fetch response per connection. A fetch response's bytes also stay charged to the
/// agent-wide response budget until it is written and dropped (`memory.rs`), which bounds what
/// all such clients together hold.
type ResponseSlot = (JoinHandle<Option<Frame>>, Option<OwnedSemaphorePermit>);

const PRODUCE_API_KEY: i16 = 0;
const FETCH_API_KEY: i16 = 1;

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
        if let Some(mut frame) = response {
            let idle = broker_idle;
            // Vectored writes: a fetch response's record sets go out from the buffers they were
            // read into.
            match tokio::time::timeout(idle, writer.write_all_buf(&mut frame)).await {
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
            drop(frame);
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
    let mut sequencer = Sequencer::new();
    let facts = ConnectionFacts::default();
    loop {
        let frame = tokio::select! {
            _ = shutdown.changed() => return,
            frame = read_one(&broker, &mut reader, peer) => frame,
        };
        let (frame, charge) = match frame {
            Ok(Some(pair)) => pair,
            Ok(None) => return,
            Err(err) => {
                warn!(%peer, error = %err, "bad frame, closing connection");
                return;
            }
        };
        let api_key = frame
            .get(0..2)
            .map_or(-1, |key| i16::from_be_bytes([key[0], key[1]]));
        let fetch_permit = if api_key == FETCH_API_KEY {
            match fetches.clone().acquire_owned().await {
                Ok(permit) => Some(permit),
                Err(_) => return,
            }
        } else {
            None
        };
        let read_at = std::time::Instant::now();
        let version = frame
            .get(2..4)
            .map_or(-1, |v| i16::from_be_bytes([v[0], v[1]]));
        let order = Order::of(api_key);
        if let Some(gate) = sequencer.before_dispatch(order) {
            // A produce enters the pipeline only after the non-produce requests before it took
            // effect (CreateTopics, AlterConfigs); produces before it may still be in flight.
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = gate.wait() => {}
            }
        }
        match dispatch(&broker, frame, peer, &facts).await {
            Dispatched::Respond(work) => {
                let turn = sequencer.next(order);
                let broker = broker.clone();
                let handle = tokio::spawn(async move {
                    let error = std::cell::Cell::new(None);
                    let (response, error) = RESPONSE_ERROR
                        .scope(error, async {
                            let response = turn.run(work).await;
                            (response, RESPONSE_ERROR.with(std::cell::Cell::get))
                        })
                        .await;
                    if let Ok(api) = kafka_protocol::messages::ApiKey::try_from(api_key) {
                        broker
                            .metrics
                            .request_done(api, version, error, read_at.elapsed());
                    }
                    drop(charge);
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
/// as slices of the frame.
const DECODE_AMPLIFICATION: usize = 40;

/// Reads one frame, charged to the request memory for what it may cost.
///
/// The API key is read first (two bytes), so the whole charge is known and taken at once before
/// the body is read: a request never holds memory while waiting for more memory. The body must
/// then arrive within `request_read_timeout`; a client that declares a large frame and sends
/// nothing loses its connection and returns its charge.
async fn read_one(
    broker: &Broker,
    reader: &mut OwnedReadHalf,
    peer: SocketAddr,
) -> Result<Option<(Bytes, MemoryCharge)>, FrameError> {
    let idle = broker.settings.connections_max_idle;
    let Ok(len) = tokio::time::timeout(
        idle,
        read_frame_len(reader, broker.settings.max_frame_bytes),
    )
    .await
    else {
        debug!(%peer, ?idle, "no request for the idle period, closing connection");
        return Ok(None);
    };
    let Some(len) = len? else {
        return Ok(None);
    };
    let deadline = broker.settings.request_read_timeout;
    let mut api_key = [0u8; 2];
    match tokio::time::timeout(deadline, reader.read_exact(&mut api_key)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return Err(FrameError::Truncated),
        Err(_) => {
            warn!(%peer, ?deadline, len, "request not received in time, closing connection");
            return Ok(None);
        }
    }
    let charge = if i16::from_be_bytes(api_key) == PRODUCE_API_KEY {
        len
    } else {
        let limit = broker.settings.max_nonproduce_frame_bytes;
        if len > limit {
            return Err(FrameError::TooLarge {
                len: len as i64,
                max: limit,
            });
        }
        len.saturating_mul(DECODE_AMPLIFICATION)
    };
    let charge = broker.request_memory.take(charge).await;
    match tokio::time::timeout(deadline, read_frame_rest(reader, &api_key, len)).await {
        Ok(body) => Ok(Some((body?, charge))),
        Err(_) => {
            warn!(%peer, ?deadline, len, "request body not received in time, closing connection");
            Ok(None)
        }
    }
}
