//! One connection: responses whole, in request order and released once written (with the
//! memory they pin), the bound on requests in flight, and idle connections closed.
//!
//! Tests on Tokio's paused clock (`start_paused`) sleep to mean "once the agent has done all it
//! can" (`crate::tests` says more).

use tokio::net::{TcpListener, TcpSocket};

use super::*;
use crate::tests::*;
use crate::{BrokerSettings, Server};

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

/// `max_inflight_per_connection` bounds the requests a connection has read and not yet
/// answered: behind a long-polling fetch, the requests that wait for it are read up to the
/// bound and no further, and all are answered in order once the fetch is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_connection_reads_no_more_requests_than_it_may_have_in_flight() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use weir_protocol::batch::build_test_batch;

    const LIST_OFFSETS_VERSION: i16 = 7;
    let settings = BrokerSettings {
        max_inflight_per_connection: 3,
        ..BrokerSettings::default()
    };
    let (broker, _) = broker_with(64 * 1024 * 1024, 10, 1, settings).await;
    let server = Server::bind("127.0.0.1:0", broker.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let serving = tokio::spawn(server.run(stop_rx));

    // A fetch at the end (ten records) that long-polls, then five ListOffsets, which wait
    // for it.
    let fetch = request_frame_with(
        ApiKey::Fetch,
        12,
        1,
        &fetch_request(10, 1024 * 1024).with_max_wait_ms(25_000),
    );
    let list = ListOffsetsRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    let lists: Vec<Bytes> = (2..7)
        .map(|id| request_frame_with(ApiKey::ListOffsets, LIST_OFFSETS_VERSION, id, &list))
        .collect();
    let mut sent = Vec::new();
    for frame in std::iter::once(&fetch).chain(&lists) {
        sent.extend_from_slice(&length_prefixed(frame));
    }
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(&sent).await.unwrap();

    // Each frame read holds request memory until answered: the fetch's and two ListOffsets'.
    let charge = |frame: &Bytes| frame.len() * DECODE_AMPLIFICATION;
    let three = charge(&fetch) + 2 * charge(&lists[0]);
    wait_for("three requests read", || {
        request_memory_in_use(&broker) >= three
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        request_memory_in_use(&broker),
        three,
        "the connection read past its requests in flight"
    );

    // New records end the long poll; then every request is answered, in order.
    append(&broker, &build_test_batch(2, 1_000, (-1, -1, -1))).await;
    for expected in 1..7 {
        let mut response = read_response(&mut client).await;
        response.advance(4);
        assert_eq!(
            response.get_i32(),
            expected,
            "responses out of request order"
        );
    }
    wait_for("every request's memory", || {
        request_memory_in_use(&broker) == 0
    })
    .await;
    stop.send(true).unwrap();
    drop(client);
    serving.await.unwrap();
}

/// A request keeps its place among those in flight until its response is written, not
/// just built: with one place, a client that does not read a large fetch response gets no
/// further request read. Paused clock: the sleep returns once the agent has done all it can.
#[tokio::test(start_paused = true)]
async fn test_a_request_holds_its_place_in_flight_until_its_response_is_written() {
    let settings = BrokerSettings {
        max_inflight_per_connection: 1,
        ..BrokerSettings::default()
    };
    // 24 batches of 512 KiB: far more than the socket buffers absorb.
    let (broker, batch) = broker_with(64 * 1024 * 1024, 64 * 1024, 24, settings).await;
    let server = Server::bind("127.0.0.1:0", broker.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let serving = tokio::spawn(server.run(stop_rx));

    let mut slow = slow_client_of_two_fetches(addr).await;
    wait_for("the first response", || broker.fetch_memory.used() > 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        request_memory_in_use(&broker),
        0,
        "the second fetch was read while the first response was unwritten"
    );
    for _ in 0..2 {
        let response = read_response(&mut slow).await;
        assert_eq!(records_in(response), 24 * batch);
    }
    stop.send(true).unwrap();
    drop(slow);
    serving.await.unwrap();
}

/// A client with a tiny receive buffer that sends two fetches of the whole partition and does
/// not read.
async fn slow_client_of_two_fetches(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = socket.connect(addr).await.unwrap();
    let mut frames = encode_fetch(1, &fetch_request(0, i32::MAX)).to_vec();
    frames.extend_from_slice(&encode_fetch(2, &fetch_request(0, i32::MAX)));
    slow.write_all(&frames).await.unwrap();
    slow
}

#[tokio::test(start_paused = true)]
async fn test_connection_holds_response_memory_until_the_client_reads() {
    // Responses larger than what the kernel's socket buffers absorb (up to 4 MiB on loopback):
    // 512 KiB batches, 48 of them (24 MiB), and a 64 MiB budget, so one response holds the whole
    // partition and two would still fit the budget: only one fetch at a time per connection
    // keeps the second one from being built.
    let budget = 64 * 1024 * 1024;
    let batches = 48;
    let (broker, batch) = broker_with_data(budget, 64 * 1024, batches).await;
    let partition = batches * batch;
    let server = Server::bind("127.0.0.1:0", broker.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let serving = tokio::spawn(server.run(stop_rx));

    let mut slow = slow_client_of_two_fetches(addr).await;
    wait_for("the slow reader's response", || {
        broker.fetch_memory.used() > 0
    })
    .await;
    // Its second fetch has been read (its frame holds request memory) and waits for the first
    // response to be written. On the paused clock the sleep returns only once the agent has
    // done all it can: had the second fetch gone ahead, its frame's memory would be released
    // and a second whole-partition response charged by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        request_memory_in_use(&broker) > 0,
        "the second fetch was handled while the first response was unread"
    );
    let pinned = broker.fetch_memory.used();
    assert!(
        pinned >= partition && pinned < 2 * partition,
        "{pinned} bytes charged for one response of a {partition}-byte partition"
    );

    // Another client is served meanwhile, with what is left of the budget (or one batch).
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(&encode_fetch(7, &fetch_request(0, i32::MAX)))
        .await
        .unwrap();
    assert!(records_in(read_response(&mut client).await) >= batch);
    // Its memory is returned right after the write (which the read above may overtake).
    wait_for("the other client's response memory", || {
        broker.fetch_memory.used() == pinned
    })
    .await;

    // Once the slow client reads, both of its responses are written and their memory returned.
    let first = read_response(&mut slow).await;
    let second = read_response(&mut slow).await;
    assert_eq!(records_in(first), partition);
    assert_eq!(records_in(second), partition);
    wait_for("the written responses' memory", || {
        broker.fetch_memory.used() == 0
    })
    .await;

    stop.send(true).unwrap();
    drop((slow, client));
    serving.await.unwrap();
}

/// `connections_max_idle`: a connection that sends nothing is closed, and so is one whose client
/// stops reading a response — which returns the response memory it pinned. A client that sends
/// a request every half idle period is never closed. Paused clock: the idle timeouts and the
/// client's pauses happen in simulated time, in a fixed order.
#[tokio::test(start_paused = true)]
async fn test_idle_and_unread_connections_are_closed() {
    let budget = 16 * 1024 * 1024;
    let idle = Duration::from_millis(300);
    let settings = BrokerSettings {
        connections_max_idle: idle,
        ..BrokerSettings::default()
    };
    let (broker, _) = broker_with(budget, 64 * 1024, 48, settings).await;
    let server = Server::bind("127.0.0.1:0", broker.clone()).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let serving = tokio::spawn(server.run(stop_rx));

    // Sends nothing: the agent closes it (the read sees end of stream) after the idle period,
    // not before.
    let mut quiet = TcpStream::connect(addr).await.unwrap();
    let opened = tokio::time::Instant::now();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(WAIT, quiet.read(&mut byte))
        .await
        .expect("an idle connection was not closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        opened.elapsed() >= idle,
        "closed after {:?}",
        opened.elapsed()
    );

    // Asks for a response larger than the socket buffers and never reads it.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stuck = socket.connect(addr).await.unwrap();
    stuck
        .write_all(&encode_fetch(1, &fetch_request(0, i32::MAX)))
        .await
        .unwrap();
    wait_for("the stuck reader's response", || {
        broker.fetch_memory.used() > 0
    })
    .await;
    wait_for("the stuck connection's memory", || {
        broker.fetch_memory.used() == 0
    })
    .await;

    // A client that keeps talking is not affected: six requests half an idle period apart span
    // three idle periods.
    let mut client = TcpStream::connect(addr).await.unwrap();
    for i in 0..6 {
        client
            .write_all(&encode_fetch(10 + i, &fetch_request(0, 1024)))
            .await
            .unwrap();
        assert!(records_in(read_response(&mut client).await) > 0);
        tokio::time::sleep(idle / 2).await;
    }

    stop.send(true).unwrap();
    drop((quiet, stuck, client));
    serving.await.unwrap();
}
