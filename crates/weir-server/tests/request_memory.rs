//! A few connections cannot hang the agent through the request memory budget (BAD-1): a frame
//! whose body never arrives loses its connection after `request_read_timeout`, large requests
//! waiting for memory do not hold up small ones, and non-Produce frames never wait for more
//! memory while holding some.

mod common;

use std::time::Duration;

use weir_produce::ProduceSettings;
use weir_server::BrokerSettings;

use common::*;

const MIB: usize = 1024 * 1024;

/// A frame length and the first bytes of a request header, then nothing.
fn stalled_prefix(len: i32, api_key: i16) -> Vec<u8> {
    let mut bytes = len.to_be_bytes().to_vec();
    bytes.extend_from_slice(&api_key.to_be_bytes());
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_stalled_large_produce_frames_do_not_starve_other_connections() {
    let settings = BrokerSettings {
        max_frame_bytes: 10 * MIB,
        max_inflight_request_bytes: 32 * MIB,
        // Long enough that the other client's answer below cannot come from the stalled
        // connections timing out.
        request_read_timeout: Duration::from_secs(600),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    // Four stalled 10 MiB produces: three are admitted (30 MiB), the fourth waits for memory.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut client = agent.connect().await;
        client.write_raw(&stalled_prefix(10 * MIB as i32, 0)).await;
        stalled.push(client);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A small request needs 40x its size: it fits in the 2 MiB left and must not queue behind
    // the waiting 10 MiB frame.
    tokio::time::timeout(Duration::from_secs(30), assert_agent_answers(&agent))
        .await
        .expect("a small request waited behind stalled large frames");
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_stalled_frame_is_closed_after_the_read_timeout_and_frees_its_memory() {
    let settings = BrokerSettings {
        max_frame_bytes: 10 * MIB,
        max_inflight_request_bytes: 10 * MIB,
        request_read_timeout: Duration::from_millis(300),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    // Takes the whole budget and never sends its body.
    let mut stalled = agent.connect().await;
    stalled.write_raw(&stalled_prefix(10 * MIB as i32, 0)).await;
    stalled.expect_closed().await;
    tokio::time::timeout(Duration::from_secs(30), assert_agent_answers(&agent))
        .await
        .expect("the stalled frame's memory was not returned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_many_large_nonproduce_frames_never_deadlock_the_agent() {
    // Each 256 KiB Metadata body is charged 40x (10 MiB): two dozen of them want far more than
    // the 12 MiB budget. Before the fix each held its frame size (6 MiB in all) while waiting
    // for the rest, which could then never fit: the agent stopped answering anyone, even after
    // those clients left.
    let settings = BrokerSettings {
        max_frame_bytes: 10 * MIB,
        max_nonproduce_frame_bytes: 256 * 1024,
        max_inflight_request_bytes: 12 * MIB,
        request_read_timeout: Duration::from_secs(600),
        ..BrokerSettings::default()
    };
    let agent = Agent::start(settings, ProduceSettings::default()).await;
    let len = 256 * 1024;
    let mut frame = stalled_prefix(len, 3);
    // Metadata v0 with garbage after the api key: it is read in full, then refused.
    frame.resize(4 + len as usize, 0xff);
    // Every client sends the first half of its frame before any sends the rest, so that all of
    // them are being read at once.
    let half = frame.len() / 2;
    let mut senders = Vec::new();
    for _ in 0..24 {
        let mut client = agent.connect().await;
        client.write_raw(&frame[..half]).await;
        senders.push(client);
    }
    for client in &mut senders {
        client.write_raw(&frame[half..]).await;
    }
    for mut client in senders {
        client.expect_closed().await;
    }
    tokio::time::timeout(Duration::from_secs(30), assert_agent_answers(&agent))
        .await
        .expect("the agent stopped answering after large non-produce frames");
}
