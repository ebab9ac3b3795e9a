//! Two control planes on one bucket talking over gRPC on 127.0.0.1, and what a bad peer gets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::uri::PathAndQuery;
use object_store::memory::InMemory;
use tokio::net::TcpListener;
use tonic::client::Grpc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request};
use weir_control::link::ControlLink;
use weir_control::plane::{ClusterSettings, Role};
use weir_control::{ControlError, ControlPlane, ControlPlaneSettings};

use super::*;
use crate::proto::{Empty, StatusReply, SubmitReply, SubmitRequest};

struct Member {
    control: ControlPlane,
    address: String,
    link: GrpcLink,
    queues: Arc<QueueNetwork>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn member(bucket: &Arc<InMemory>, node_id: i32) -> Member {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let link = GrpcLink::default();
    let cluster = ClusterSettings {
        lease_renew: Duration::from_millis(100),
        lease_timeout: Duration::from_secs(1),
        ..ClusterSettings::new(node_id, &format!("test-{node_id}"), Arc::new(link.clone()))
    };
    let settings = ControlPlaneSettings {
        address: address.clone(),
        cluster: Some(cluster),
        ..ControlPlaneSettings::default()
    };
    let control = ControlPlane::open(bucket.clone(), settings, node_id as u64)
        .await
        .unwrap();
    link.set_cluster_id(&control.read(|s| s.cluster_id.clone()));
    let queues = QueueNetwork::new(&address, link.clone(), 16);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        listener,
        control.clone(),
        Some(queues.clone()),
        async {
            let _ = stopped.await;
        },
    ));
    Member {
        control,
        address,
        link,
        queues,
        _stop: stop,
    }
}

fn raw_client(address: &str) -> Grpc<Channel> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_lazy();
    Grpc::new(channel)
}

fn path(method: &str) -> PathAndQuery {
    PathAndQuery::from_maybe_shared(format!("/{SERVICE}/{method}")).unwrap()
}

fn handshake<T>(message: T, cluster_id: &str, protocol: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(CLUSTER_ID_HEADER, cluster_id.parse().unwrap());
    request
        .metadata_mut()
        .insert(PROTOCOL_HEADER, protocol.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_follower_forwards_its_writes_and_replicates_over_grpc() {
    let bucket = Arc::new(InMemory::new());
    let leader = member(&bucket, 1).await;
    let follower = member(&bucket, 2).await;
    assert!(matches!(
        *leader.control.role().borrow(),
        Role::Leader { .. }
    ));
    assert!(matches!(
        *follower.control.role().borrow(),
        Role::Follower { .. }
    ));
    // The follower connects at its first lease read; until then its writes fail retriably.
    let mut created = None;
    for _ in 0..100 {
        match follower
            .control
            .create_topic("over-grpc", 2, BTreeMap::new(), 5)
            .await
        {
            Ok(id) => {
                created = Some(id);
                break;
            }
            Err(ControlError::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(other) => panic!("{other}"),
        }
    }
    let id = created.expect("the follower reached the leader");
    let known = |control: &ControlPlane| control.read(|s| s.topic("over-grpc").map(|t| t.id));
    assert_eq!(known(&follower.control), Some(id), "read your writes");
    assert_eq!(known(&leader.control), Some(id));
    // The state machine's answer comes back through the stream.
    let again = follower
        .control
        .create_topic("over-grpc", 2, BTreeMap::new(), 6)
        .await;
    assert!(
        matches!(again, Err(ControlError::TopicAlreadyExists(_))),
        "{again:?}"
    );
    let conn = follower.link.connect(&leader.address).unwrap();
    let status = conn.status().await.unwrap();
    assert!(status.available);
    assert_eq!(conn.barrier().await.unwrap(), status.durable);
    // The record stream carries the leader's next slot.
    let mut records = conn.records().await.unwrap();
    leader
        .control
        .create_topic("streamed", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    let record = tokio::time::timeout(Duration::from_secs(5), records.next())
        .await
        .unwrap()
        .unwrap();
    assert!(record.seq > status.durable);
    // A follower refuses a forwarded write: only the leader sequences.
    let to_follower = leader.link.connect(&follower.address).unwrap();
    assert!(to_follower.barrier().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_peer_of_another_cluster_or_version_is_refused() {
    let bucket = Arc::new(InMemory::new());
    let leader = member(&bucket, 1).await;
    let cluster_id = leader.control.read(|s| s.cluster_id.clone());
    let mut client = raw_client(&leader.address);
    let codec = || tonic_prost::ProstCodec::<Empty, StatusReply>::default();
    client.ready().await.unwrap();
    let ok = client
        .unary(
            handshake(Empty {}, &cluster_id, PROTOCOL_VERSION),
            path("Status"),
            codec(),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    for (id, protocol) in [
        ("another-cluster", PROTOCOL_VERSION),
        (cluster_id.as_str(), "99"),
    ] {
        client.ready().await.unwrap();
        let refused = client
            .unary(handshake(Empty {}, id, protocol), path("Status"), codec())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    // Through the link: its calls fail retriably, with the reason.
    let stranger = GrpcLink::default();
    stranger.set_cluster_id("another-cluster");
    let status = stranger.connect(&leader.address).unwrap().status().await;
    assert!(
        matches!(&status, Err(ControlError::Unavailable(m)) if m.contains("FailedPrecondition")),
        "{status:?}"
    );
    client.ready().await.unwrap();
    let unknown = client
        .unary(
            handshake(Empty {}, &cluster_id, PROTOCOL_VERSION),
            path("Nope"),
            codec(),
        )
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::Unimplemented);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_malformed_and_oversized_submits_end_their_stream_and_change_nothing() {
    let bucket = Arc::new(InMemory::new());
    let leader = member(&bucket, 1).await;
    let cluster_id = leader.control.read(|s| s.cluster_id.clone());
    let before = leader.control.read(|s| serde_json::to_value(s).unwrap());
    let codec = || tonic_prost::ProstCodec::<SubmitRequest, SubmitReply>::default();
    let bad = [
        b"{not json".to_vec(),
        br#"{"NoSuchEntry":{}}"#.to_vec(),
        vec![0u8; MAX_MESSAGE_BYTES + 1],
    ];
    for (case, entry) in bad.into_iter().enumerate() {
        let mut client = raw_client(&leader.address)
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(usize::MAX);
        client.ready().await.unwrap();
        let requests = futures::stream::iter([SubmitRequest { id: 1, entry }]);
        let outcome = client
            .streaming(
                handshake(requests, &cluster_id, PROTOCOL_VERSION),
                path("Submit"),
                codec(),
            )
            .await;
        let status = match outcome {
            Err(status) => status,
            Ok(response) => {
                let mut replies = response.into_inner();
                match replies.message().await {
                    Err(status) => status,
                    Ok(reply) => panic!("case {case}: {reply:?}"),
                }
            }
        };
        assert!(
            matches!(
                status.code(),
                Code::InvalidArgument | Code::ResourceExhausted | Code::OutOfRange
            ),
            "{status:?}"
        );
    }
    // A well-formed entry no follower may forward: refused, and its stream ends.
    let new_epoch = weir_control::Entry::NewEpoch {
        epoch: 99,
        cluster_id: cluster_id.clone(),
        at_ms: 0,
    };
    let mut client = raw_client(&leader.address);
    client.ready().await.unwrap();
    let requests = futures::stream::iter([SubmitRequest {
        id: 7,
        entry: serde_json::to_vec(&new_epoch).unwrap(),
    }]);
    let mut replies = client
        .streaming(
            handshake(requests, &cluster_id, PROTOCOL_VERSION),
            path("Submit"),
            codec(),
        )
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().unwrap();
    assert_eq!(reply.id, 7);
    assert!(
        !reply.error.is_empty() && reply.result.is_empty(),
        "{reply:?}"
    );
    assert!(
        replies.message().await.unwrap().is_none(),
        "the stream ended"
    );
    let after = leader.control.read(|s| serde_json::to_value(s).unwrap());
    assert_eq!(before, after, "no bad submit changed the state");
    // The server goes on serving.
    let status = leader.link.connect(&leader.address).unwrap().status().await;
    assert!(status.is_ok(), "{status:?}");
}

fn queue_settings() -> weir_objq::Settings {
    weir_objq::Settings {
        broker_timeout: Duration::from_millis(300),
        write_retry: Duration::from_millis(10),
        ..weir_objq::Settings::default()
    }
}

/// A member of the `jobs` queue (its object in `bucket`) on `agent`.
fn queue_member(bucket: &Arc<InMemory>, agent: &Member, id: &str) -> weir_objq::Member {
    let cas = Arc::new(weir_objq::cas::ObjectStoreCas::new(
        bucket.clone(),
        object_store::path::Path::from("queue/jobs"),
    ));
    weir_objq::Member::new(
        id,
        &agent.queues.address("jobs"),
        cas,
        agent.queues.clone(),
        queue_settings(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_one_queue_broker_serves_the_members_of_every_agent() {
    let bucket = Arc::new(InMemory::new());
    let first = member(&bucket, 1).await;
    let second = member(&bucket, 2).await;
    let here = queue_member(&bucket, &first, "a");
    let there = queue_member(&bucket, &second, "b");
    // The first push finds no broker named: its member starts one.
    let pushed = here.push(vec!["j1".into(), "j2".into()]).await.unwrap();
    assert!(here.runs_broker());
    // The other agent's member reaches that broker over the control service: no takeover.
    let more = there.push(vec!["j3".into()]).await.unwrap();
    assert!(more[0] > pushed[1]);
    let claimed = there.claim("b-w0").await.unwrap().expect("a job");
    assert_eq!(claimed.payload, "j1");
    there.ack("b-w0", claimed.id).await.unwrap();
    assert!(
        !there.runs_broker(),
        "the second agent never took the queue over"
    );
    let state = there.snapshot().await.unwrap();
    let left: Vec<_> = state.jobs.iter().map(|job| job.payload.as_str()).collect();
    assert_eq!(left, ["j2", "j3"]);
    assert_eq!(state.broker.unwrap().address, first.queues.address("jobs"));
    // The broker's agent stops serving: the other member takes over after its broker timeout
    // and keeps every unacked job.
    here.stop_broker();
    drop(first);
    let claimed = there.claim("b-w0").await.unwrap().expect("a job");
    assert_eq!(claimed.payload, "j2");
    assert!(there.runs_broker());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_queue_call_with_no_broker_or_bad_json_is_an_error_status() {
    let bucket = Arc::new(InMemory::new());
    let agent = member(&bucket, 1).await;
    let cluster_id = agent.control.read(|s| s.cluster_id.clone());
    let call = |queue: &str, request: &[u8]| {
        handshake(
            crate::proto::QueueCall {
                queue: queue.to_string(),
                request: request.to_vec(),
            },
            &cluster_id,
            PROTOCOL_VERSION,
        )
    };
    let client = raw_client(&agent.address);
    let ask = |request| {
        let mut client = client.clone();
        async move {
            client.ready().await.unwrap();
            client
                .unary::<_, crate::proto::QueueAnswer, _>(
                    request,
                    path("Queue"),
                    tonic_prost::ProstCodec::default(),
                )
                .await
        }
    };
    let claim = br#"{"Claim":{"worker":"w"}}"#;
    let nobody = ask(call("jobs", claim)).await.unwrap_err();
    assert_eq!(nobody.code(), Code::Unavailable, "{nobody:?}");
    let garbage = ask(call("jobs", b"{not json")).await.unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument, "{garbage:?}");
    let stranger = ask(handshake(
        crate::proto::QueueCall {
            queue: "jobs".into(),
            request: claim.to_vec(),
        },
        "another-cluster",
        PROTOCOL_VERSION,
    ))
    .await
    .unwrap_err();
    assert_eq!(stranger.code(), Code::FailedPrecondition);
}
