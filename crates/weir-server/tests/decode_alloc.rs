//! BAD-1: a small frame must not make the agent allocate without bound. Kept in its own test
//! binary: if the agent aborts on a failed allocation, it takes only this binary down.

mod common;

use bytes::{BufMut, BytesMut};

use common::*;

/// A 14-byte Metadata v0 request declaring i32::MAX topics. The agent must close the connection
/// (or answer) without reserving memory for two billion topics up front.
///
/// kafka-protocol 0.18 pre-allocated from the declared array length (~150 GB here) and the agent
/// aborted; the vendored copy caps pre-allocation at the bytes in the frame (third_party/README.md).
#[tokio::test]
async fn test_connection_huge_declared_array_len_does_not_allocate() {
    let agent = Agent::start_default().await;
    let mut payload = BytesMut::new();
    payload.put_i16(3); // Metadata
    payload.put_i16(0);
    payload.put_i32(1);
    payload.put_i16(-1); // null client id
    payload.put_i32(i32::MAX); // topic count, with no topics behind it
    let mut frame = BytesMut::new();
    frame.put_i32(payload.len() as i32);
    frame.extend_from_slice(&payload);
    let mut client = agent.connect().await;
    client.write_raw(&frame).await;
    client.expect_closed().await;
    assert_agent_answers(&agent).await;
}
