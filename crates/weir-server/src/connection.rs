//! One client connection: a reader that decodes and dispatches requests in order, and a writer
//! that sends responses strictly in request order (ORD-3).
//!
//! The reader never waits for a response before reading the next request, so a connection can
//! have up to `max_inflight_per_connection` requests in flight (produce pipelining); each request
//! still takes effect in request order (`order.rs`). The requests' response futures run in the
//! writer's task, all of them polled together in one ordered set, not in a task each. Each
//! request holds a charge on the request memory (`request_memory.rs`) from before its body is
//! read until its response is built, and its place among those in flight until the response is
//! written.
//!
//! Both directions batch system calls: the reader reads the socket through a small per-connection
//! buffer (a pipelining client's small requests arrive several per read), and the writer sends
//! every response that is already built behind the one it waited for in one vectored write (a
//! commit answers many produces at once). At ~11,000 produce requests a second this took the
//! agent's `recvfrom` calls from three per request to about one and its `writev` calls from one
//! per response to a fraction (docs/benchmarks.md §28).

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};
use weir_protocol::frame::{read_frame_len, read_frame_rest, FrameError};
use weir_protocol::response::Frame;

use crate::broker::Broker;
use crate::dispatch::{dispatch, ConnectionFacts, Dispatched, ResponseFuture, RESPONSE_ERROR};
use crate::order::{Order, Sequencer};
use crate::request_memory::MemoryCharge;

/// A request read and dispatched: its response future (run in the request's turn, `None` for
/// acks=0) and what it holds until its response is written.
///
/// The connection's writer polls these futures itself, in one set, rather than spawning a task
/// per request: when a commit answers many produces at once, the writer wakes once and finds all
/// their responses built, with no scheduler round trip between them (docs/benchmarks.md §29).
type ResponseSlot = (ResponseFuture, Held);

/// What a request holds until its response is written: its place among the connection's
/// requests in flight (`max_inflight_per_connection`), and for a fetch the connection's one fetch
/// permit, so a client that never reads its socket holds at most one fetch response per
/// connection. A fetch response's bytes also stay charged to the agent-wide response budget until
/// it is written and dropped (`memory.rs`), which bounds what all such clients together hold.
struct Held {
    _inflight: OwnedSemaphorePermit,
    _fetch: Option<OwnedSemaphorePermit>,
}

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
    let reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let idle = broker.settings.connections_max_idle;
    // The reader takes a permit per request before reading it, so at most this many requests are
    // read and not yet answered; the channel itself needs no bound.
    let inflight = Arc::new(Semaphore::new(
        broker.settings.max_inflight_per_connection.max(1),
    ));
    let (slots_tx, mut slots_rx) = mpsc::unbounded_channel::<ResponseSlot>();
    let reading = tokio::spawn(read_requests(
        broker, reader, peer, slots_tx, inflight, shutdown,
    ));
    let mut in_flight = FuturesOrdered::new();
    let mut reading_open = true;
    let mut ready = Responses::default();
    'connection: loop {
        // Wait for the oldest response while taking in the requests read meanwhile (their
        // futures run in the set from then on, in their turns).
        let oldest = loop {
            tokio::select! {
                biased;
                Some(answered) = in_flight.next(), if !in_flight.is_empty() => break answered,
                slot = slots_rx.recv(), if reading_open => match slot {
                    Some(slot) => in_flight.push_back(answer(slot)),
                    None => reading_open = false,
                },
                else => break 'connection,
            }
        };
        // Then take every later response that is already built, so that responses finished
        // together go out in one write.
        let mut answered = oldest;
        loop {
            match answered {
                (Ok(response), held) => ready.push(response, Some(held)),
                (Err(_), _) => {
                    warn!(%peer, "request handler panicked, closing connection");
                    break 'connection;
                }
            }
            if ready.is_full() {
                break;
            }
            while let Ok(slot) = slots_rx.try_recv() {
                in_flight.push_back(answer(slot));
            }
            match in_flight.next().now_or_never() {
                Some(Some(next)) => answered = next,
                _ => break,
            }
        }
        match ready.write(&mut writer, idle).await {
            Ok(()) => {}
            Err(WriteFailed::Io(err)) => {
                debug!(%peer, error = %err, "write failed, closing connection");
                break;
            }
            Err(WriteFailed::Idle) => {
                // The client has not read for the idle period: free what it pins.
                warn!(%peer, ?idle, "client did not read its response, closing connection");
                break;
            }
        }
    }
    reading.abort();
    let _ = writer.shutdown().await;
    debug!(%peer, "connection closed");
}

/// A request's response future, with a handler's panic caught (the connection closes on it) and
/// what the request holds passed through to the write.
fn answer(
    (response, held): ResponseSlot,
) -> impl Future<Output = (std::thread::Result<Option<Frame>>, Held)> {
    AssertUnwindSafe(response)
        .catch_unwind()
        .map(move |response| (response, held))
}

/// Bytes read from a connection's socket at a time: a client that pipelines small requests
/// (librdkafka sends one Produce per partition) has several read per system call. Allocated
/// once per connection; a frame larger than this is read straight into its own buffer.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Responses at most written in one system call.
const MAX_COALESCED: usize = 64;

/// Response bytes past which no further ready response is added to a write.
const MAX_COALESCED_BYTES: usize = 1024 * 1024;

/// Why writing responses stopped.
enum WriteFailed {
    Io(std::io::Error),
    /// No byte could be written for the idle period.
    Idle,
}

/// Responses ready to go out, in request order, each with what its request holds until it is
/// written.
#[derive(Default)]
struct Responses {
    queue: VecDeque<(Option<Frame>, Option<Held>)>,
    bytes: usize,
}

impl Responses {
    fn push(&mut self, frame: Option<Frame>, held: Option<Held>) {
        self.bytes += frame.as_ref().map_or(0, Frame::len);
        self.queue.push_back((frame, held));
    }

    fn is_full(&self) -> bool {
        self.queue.len() >= MAX_COALESCED || self.bytes >= MAX_COALESCED_BYTES
    }

    /// Writes every queued response with vectored writes (a fetch response's record sets go
    /// out from the buffers they were read into). Each response, and what its request holds, is
    /// dropped as soon as its last byte is written: that returns a fetch response's memory
    /// before the next fetch may be read.
    async fn write(
        &mut self,
        writer: &mut OwnedWriteHalf,
        idle: Duration,
    ) -> Result<(), WriteFailed> {
        loop {
            self.release_written();
            if self.queue.is_empty() {
                self.bytes = 0;
                return Ok(());
            }
            let mut slices = [IoSlice::new(&[]); MAX_COALESCED];
            let mut filled = 0;
            for frame in self.queue.iter().filter_map(|(frame, _)| frame.as_ref()) {
                if filled == slices.len() {
                    break;
                }
                filled += frame.chunks_vectored(&mut slices[filled..]);
            }
            let written =
                match tokio::time::timeout(idle, writer.write_vectored(&slices[..filled])).await {
                    Ok(Ok(0)) => return Err(WriteFailed::Io(std::io::ErrorKind::WriteZero.into())),
                    Ok(Ok(written)) => written,
                    Ok(Err(err)) => return Err(WriteFailed::Io(err)),
                    Err(_) => return Err(WriteFailed::Idle),
                };
            self.advance(written);
        }
    }

    /// Marks `written` bytes, from the front, as sent.
    fn advance(&mut self, mut written: usize) {
        for (frame, _) in self.queue.iter_mut() {
            let Some(frame) = frame else { continue };
            let step = written.min(frame.remaining());
            frame.advance(step);
            written -= step;
            if written == 0 {
                break;
            }
        }
    }

    /// Drops the fully written responses at the front (and those without a response).
    fn release_written(&mut self) {
        while let Some((frame, _)) = self.queue.front() {
            if frame.as_ref().is_some_and(|frame| frame.has_remaining()) {
                break;
            }
            self.queue.pop_front();
        }
    }
}

async fn read_requests(
    broker: Arc<Broker>,
    mut reader: BufReader<OwnedReadHalf>,
    peer: SocketAddr,
    slots: mpsc::UnboundedSender<ResponseSlot>,
    inflight: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Kafka clients keep one fetch in flight per connection; more would only let a reader that
    // never drains its socket pile up fetch responses.
    let fetches = Arc::new(Semaphore::new(1));
    let mut sequencer = Sequencer::new();
    let facts = ConnectionFacts::default();
    loop {
        // With `max_inflight_per_connection` requests unanswered the reader stops reading, and
        // the client's sends back up in its socket.
        let place = tokio::select! {
            _ = shutdown.changed() => return,
            place = inflight.clone().acquire_owned() => match place {
                Ok(place) => place,
                Err(_) => return,
            },
        };
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
        let held = Held {
            _inflight: place,
            _fetch: fetch_permit,
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
                let response: ResponseFuture = Box::pin(async move {
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
                if slots.send((response, held)).is_err() {
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
    reader: &mut BufReader<OwnedReadHalf>,
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

#[cfg(test)]
mod tests;
