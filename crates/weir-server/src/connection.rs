//! One client connection: a reader that decodes and dispatches requests in order, and a writer
//! that sends responses strictly in request order (ORD-3).
//!
//! The reader never waits for a response before reading the next request, so a connection can
//! have up to `max_inflight_per_connection` requests in flight (produce pipelining); each request
//! still takes effect in request order (`order.rs`). Each request holds a charge on the request
//! memory (`request_memory.rs`) from before its body is read until its response is built.
//!
//! Both directions batch system calls: the reader reads the socket through a small per-connection
//! buffer (a pipelining client's small requests arrive several per read), and the writer sends
//! every response that is already built behind the one it waited for in one vectored write (a
//! commit answers many produces at once). At ~11,000 produce requests a second this took the
//! agent's `recvfrom` calls from three per request to about one and its `writev` calls from one
//! per response to a fraction (docs/benchmarks.md §28).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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
    let reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let idle = broker.settings.connections_max_idle;
    let (slots_tx, mut slots_rx) =
        mpsc::channel::<ResponseSlot>(broker.settings.max_inflight_per_connection.max(1));
    let reading = tokio::spawn(read_requests(broker, reader, peer, slots_tx, shutdown));
    let mut ready = Responses::default();
    let mut next: Option<ResponseSlot> = None;
    'connection: loop {
        // Wait for the oldest response, then take every later one that is already built, so
        // that responses finished together (a commit answers many produces at once) go out in
        // one write.
        let first = match next.take() {
            Some(slot) => Some(slot),
            None => slots_rx.recv().await,
        };
        let Some(mut slot) = first else {
            break;
        };
        let mut yields = 0;
        loop {
            let (handle, fetch_permit) = slot;
            match handle.await {
                Ok(response) => ready.push(response, fetch_permit),
                Err(err) => {
                    warn!(%peer, error = %err, "request handler failed, closing connection");
                    break 'connection;
                }
            }
            if ready.is_full() {
                break;
            }
            let Ok(later) = slots_rx.try_recv() else {
                break;
            };
            if !later.0.is_finished() && yields < MAX_YIELDS {
                // Responses finished together complete one after another (each request's turn
                // ends after the one before it), and this task's wake-up tends to run first: let
                // the others run before deciding what the write takes.
                yields += 1;
                tokio::task::yield_now().await;
            }
            if !later.0.is_finished() {
                next = Some(later);
                break;
            }
            slot = later;
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

/// Bytes read from a connection's socket at a time: a client that pipelines small requests
/// (librdkafka sends one Produce per partition) has several read per system call. Allocated
/// once per connection; a frame larger than this is read straight into its own buffer.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Responses at most written in one system call.
const MAX_COALESCED: usize = 64;

/// Times a write waits for the scheduler to finish the next response before going without it.
/// Each wait costs the responses already taken the time the scheduler needs to come back (0.3
/// to 0.7 ms at 48.8 MiB/s on one busy core) and saves a system call per response
/// (docs/benchmarks.md §28).
const MAX_YIELDS: usize = 2;

/// Response bytes past which no further ready response is added to a write.
const MAX_COALESCED_BYTES: usize = 1024 * 1024;

/// Why writing responses stopped.
enum WriteFailed {
    Io(std::io::Error),
    /// No byte could be written for the idle period.
    Idle,
}

/// Responses ready to go out, in request order, each with the fetch permit it releases once
/// written.
#[derive(Default)]
struct Responses {
    queue: VecDeque<(Option<Frame>, Option<OwnedSemaphorePermit>)>,
    bytes: usize,
}

impl Responses {
    fn push(&mut self, frame: Option<Frame>, permit: Option<OwnedSemaphorePermit>) {
        self.bytes += frame.as_ref().map_or(0, Frame::len);
        self.queue.push_back((frame, permit));
    }

    fn is_full(&self) -> bool {
        self.queue.len() >= MAX_COALESCED || self.bytes >= MAX_COALESCED_BYTES
    }

    /// Writes every queued response with vectored writes (a fetch response's record sets go
    /// out from the buffers they were read into). Each response, and its fetch permit, is
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
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    /// A response of `pieces` chunks, each `piece` bytes of `fill`.
    fn frame(fill: u8, pieces: usize, piece: usize) -> Frame {
        let mut frame = Frame::default();
        for _ in 0..pieces {
            frame.push(Bytes::from(vec![fill; piece]));
        }
        frame
    }

    #[tokio::test]
    async fn test_coalesced_responses_arrive_whole_and_in_order_through_partial_writes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let (mut client, (server, _)) = (client.unwrap(), accepted.unwrap());
        let (_, mut writer) = server.into_split();
        // More chunks than one write takes and more bytes than the socket buffers hold, so
        // writes are partial and a response's chunks are split between writes.
        let mut expected = Vec::new();
        let mut responses = Responses::default();
        for i in 0..40u8 {
            if i % 7 == 3 {
                responses.push(None, None); // acks=0: nothing to send
                continue;
            }
            let response = frame(i, 1 + usize::from(i % 5), 9_000 + usize::from(i) * 131);
            expected.extend_from_slice(&response.to_bytes());
            responses.push(Some(response), None);
        }
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buffer = [0u8; 1000];
            loop {
                let read = client.read(&mut buffer).await.unwrap();
                if read == 0 {
                    return got;
                }
                got.extend_from_slice(&buffer[..read]);
                tokio::task::yield_now().await;
            }
        });
        assert!(responses
            .write(&mut writer, Duration::from_secs(30))
            .await
            .is_ok());
        assert!(responses.queue.is_empty());
        writer.shutdown().await.unwrap();
        let got = reading.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes differ or are out of order");
    }

    #[test]
    fn test_a_response_is_released_once_its_last_byte_is_written() {
        let mut responses = Responses::default();
        responses.push(Some(frame(1, 2, 10)), None);
        responses.push(None, None);
        responses.push(Some(frame(2, 1, 10)), None);
        responses.advance(15);
        responses.release_written();
        assert_eq!(responses.queue.len(), 3);
        responses.advance(5);
        responses.release_written();
        // The first is written; the acks=0 slot behind it goes with it.
        assert_eq!(responses.queue.len(), 1);
        responses.advance(10);
        responses.release_written();
        assert!(responses.queue.is_empty());
    }
}
