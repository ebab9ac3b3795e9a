//! The queue's rules, its compare-and-set backends and members with brokers that die, on
//! `memory://` (object_store) and on a local directory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use proptest::prelude::*;
use tokio::time::Instant;

use crate::cas::local::LocalCas;
use crate::cas::{CasError, CasObject, ObjectStoreCas, Version};
use crate::state::{Leases, QueueState, Request, Response};
use crate::{LocalNetwork, Member, QueueError, Settings};

fn memory_cas() -> Arc<dyn CasObject> {
    Arc::new(ObjectStoreCas::new(
        Arc::new(InMemory::new()),
        Path::from("queue/compaction.json"),
    ))
}

/// Counts successful writes of the object it wraps; each write takes `delay`.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn CasObject>,
    writes: AtomicUsize,
    delay: Duration,
}

#[async_trait]
impl CasObject for Counting {
    async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError> {
        self.inner.read().await
    }
    async fn write(&self, data: Bytes, expected: Option<&Version>) -> Result<Version, CasError> {
        tokio::time::sleep(self.delay).await;
        let written = self.inner.write(data, expected).await?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(written)
    }
}

fn fast() -> Settings {
    Settings {
        lease: Duration::from_millis(400),
        broker_timeout: Duration::from_millis(150),
        max_jobs: 64,
        write_retry: Duration::from_millis(10),
        inbox: 64,
        recheck: Duration::from_secs(30),
    }
}

fn members(cas: &Arc<dyn CasObject>, n: usize, settings: Settings) -> Vec<Arc<Member>> {
    let network = LocalNetwork::new(&settings);
    (0..n)
        .map(|i| {
            Arc::new(Member::new(
                &format!("m{i}"),
                &format!("local:{i}"),
                cas.clone(),
                network.clone(),
                settings,
            ))
        })
        .collect()
}

fn payloads(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("job-{i}")).collect()
}

// ---------- the rules ----------

#[test]
fn test_state_claims_in_fifo_order_and_hands_out_again_after_the_lease() {
    let lease = Duration::from_secs(60);
    let start = Instant::now();
    let mut state = QueueState::default();
    let mut leases = Leases::new();
    let mut apply = |state: &mut QueueState, request: Request, at: Duration| {
        state.apply(&request, start + at, &mut leases, lease, 3)
    };
    let push = Request::Push {
        payloads: payloads(0..3),
    };
    assert_eq!(
        apply(&mut state, push.clone(), Duration::ZERO),
        (Response::Pushed(vec![1, 2, 3]), true)
    );
    assert_eq!(
        apply(&mut state, push, Duration::ZERO),
        (Response::Full { bound: 3 }, false)
    );
    let claim = |w: &str| Request::Claim {
        worker: w.to_string(),
    };
    let Response::Claimed(Some(first)) = apply(&mut state, claim("a"), Duration::ZERO).0 else {
        panic!("a job is free");
    };
    assert_eq!((first.id, first.attempts), (1, 1));
    let Response::Claimed(Some(second)) = apply(&mut state, claim("b"), Duration::ZERO).0 else {
        panic!("a job is free");
    };
    assert_eq!(second.id, 2, "FIFO: the next unclaimed job");
    // Heartbeats keep job 1 with a; job 2's lease runs out and c gets it, attempt 2.
    let beat = Request::Heartbeat {
        worker: "a".into(),
        job: 1,
    };
    assert_eq!(
        apply(&mut state, beat, Duration::from_secs(50)),
        (Response::Done, false),
        "a heartbeat writes nothing"
    );
    let Response::Claimed(Some(third)) = apply(&mut state, claim("c"), Duration::from_secs(61)).0
    else {
        panic!("job 2's lease ran out");
    };
    assert_eq!((third.id, third.attempts), (2, 2));
    // b's ack of the job it lost is refused; c's is taken and the job leaves.
    let ack = |w: &str, job| Request::Ack {
        worker: w.to_string(),
        job,
    };
    assert_eq!(
        apply(&mut state, ack("b", 2), Duration::from_secs(62)).0,
        Response::NotHeld { job: 2 }
    );
    assert_eq!(
        apply(&mut state, ack("c", 2), Duration::from_secs(62)),
        (Response::Done, true)
    );
    // A nack puts job 1 back in its place, ahead of job 3.
    let nack = Request::Nack {
        worker: "a".into(),
        job: 1,
    };
    assert_eq!(
        apply(&mut state, nack, Duration::from_secs(63)),
        (Response::Done, true)
    );
    let Response::Claimed(Some(again)) = apply(&mut state, claim("d"), Duration::from_secs(63)).0
    else {
        panic!("job 1 is free again");
    };
    assert_eq!((again.id, again.attempts), (1, 2));
    assert_eq!(state.jobs.len(), 2);
    let decoded = QueueState::decode(&state.encode()).unwrap();
    assert_eq!(decoded, state);
}

proptest! {
    /// Under any sequence of requests: acked jobs never come back, a free job is always handed
    /// out before any later one, and the queue never holds more than its bound.
    #[test]
    fn prop_state_fifo_bounded_and_acks_final(ops in proptest::collection::vec((0u8..5, 0u8..3, 0u64..8, 0u64..90), 1..80)) {
        let lease = Duration::from_secs(30);
        let start = Instant::now();
        let mut state = QueueState::default();
        let mut leases = Leases::new();
        let mut acked = std::collections::HashSet::new();
        let mut clock = 0u64;
        for (kind, worker, job, advance) in ops {
            clock += advance;
            let now = start + Duration::from_secs(clock);
            let worker = format!("w{worker}");
            let request = match kind {
                0 => Request::Push { payloads: vec!["p".into(); (job % 3) as usize + 1] },
                1 => Request::Claim { worker: worker.clone() },
                2 => Request::Heartbeat { worker: worker.clone(), job },
                3 => Request::Ack { worker: worker.clone(), job },
                _ => Request::Nack { worker: worker.clone(), job },
            };
            let before = state.clone();
            let leases_before = leases.clone();
            let (answer, _) = state.apply(&request, now, &mut leases, lease, 6);
            prop_assert!(state.jobs.len() <= 6);
            match (&request, &answer) {
                (Request::Ack { .. }, Response::Done) => { acked.insert(job); }
                (Request::Claim { .. }, Response::Claimed(Some(got))) => {
                    prop_assert!(!acked.contains(&got.id));
                    // Every job ahead of it was held under a live lease.
                    for ahead in before.jobs.iter().take_while(|j| j.id != got.id) {
                        prop_assert!(ahead.claim.is_some());
                        prop_assert!(leases_before.get(&ahead.id).is_some_and(|t| *t > now));
                    }
                }
                _ => {}
            }
            for id in &acked {
                prop_assert!(state.jobs.iter().all(|j| j.id != *id));
            }
        }
    }
}

// ---------- compare-and-set ----------

async fn cas_conformance(cas: &dyn CasObject) {
    assert!(cas.read().await.unwrap().is_none());
    let v1 = cas.write(Bytes::from_static(b"one"), None).await.unwrap();
    assert!(matches!(
        cas.write(Bytes::from_static(b"again"), None).await,
        Err(CasError::Conflict)
    ));
    let (bytes, read) = cas.read().await.unwrap().unwrap();
    assert_eq!((&bytes[..], &read), (&b"one"[..], &v1));
    let v2 = cas
        .write(Bytes::from_static(b"two"), Some(&v1))
        .await
        .unwrap();
    assert_ne!(v1, v2);
    assert!(matches!(
        cas.write(Bytes::from_static(b"stale"), Some(&v1)).await,
        Err(CasError::Conflict)
    ));
    let (bytes, read) = cas.read().await.unwrap().unwrap();
    assert_eq!((&bytes[..], &read), (&b"two"[..], &v2));
}

#[tokio::test]
async fn test_cas_conformance_memory_and_local() {
    cas_conformance(memory_cas().as_ref()).await;
    let dir = tempfile::tempdir().unwrap();
    cas_conformance(&LocalCas::new(dir.path(), "queue.json").unwrap()).await;
}

#[tokio::test]
async fn test_cas_object_store_without_conditional_update_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let cas = ObjectStoreCas::new(Arc::new(local), Path::from("q.json"));
    let v1 = cas.write(Bytes::from_static(b"one"), None).await.unwrap();
    let err = cas
        .write(Bytes::from_static(b"two"), Some(&v1))
        .await
        .unwrap_err();
    assert!(matches!(err, CasError::Unsupported(_)), "{err}");
}

/// Many writers on many threads increment one counter by read-modify-write: with the lock and
/// the version check no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_local_cas_under_contention_loses_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let writers = 8;
    let each = 25;
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let cas = LocalCas::new(dir.path(), "counter").unwrap();
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < each {
                let (value, version) = match cas.read().await.unwrap() {
                    None => (0u64, None),
                    Some((bytes, v)) => (
                        std::str::from_utf8(&bytes).unwrap().parse().unwrap(),
                        Some(v),
                    ),
                };
                let next = Bytes::from((value + 1).to_string());
                match cas.write(next, version.as_ref()).await {
                    Ok(_) => done += 1,
                    Err(CasError::Conflict) => {}
                    Err(other) => panic!("{other}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let cas = LocalCas::new(dir.path(), "counter").unwrap();
    let (bytes, _) = cas.read().await.unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&bytes).unwrap(),
        (writers * each).to_string()
    );
}

// ---------- members and brokers ----------

async fn queue_survives_a_broker_kill(cas: Arc<dyn CasObject>) {
    let m = members(&cas, 3, fast());
    let ids = m[0].push(payloads(0..10)).await.unwrap();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
    assert!(
        m[0].runs_broker(),
        "the first member found no broker and became it"
    );
    let job = m[1].claim("w1").await.unwrap().unwrap();
    assert_eq!(job.id, 1);
    // The broker dies; a member's next request times out and takes over, and every
    // acknowledged push is still there, in order.
    m[0].stop_broker();
    let more = m[2].push(payloads(10..12)).await.unwrap();
    assert_eq!(more, vec![11, 12]);
    assert!(m[2].runs_broker());
    let state = m[2].snapshot().await.unwrap();
    assert_eq!(state.broker.as_ref().unwrap().epoch, 2);
    let order: Vec<u64> = state.jobs.iter().map(|j| j.id).collect();
    assert_eq!(order, (1..=12).collect::<Vec<_>>());
    // Job 1 is still w1's: the new broker restarted its lease instead of handing it out.
    let next = m[1].claim("w2").await.unwrap().unwrap();
    assert_eq!(next.id, 2);
    m[1].ack("w1", 1).await.unwrap();
    m[1].ack("w2", 2).await.unwrap();
    assert_eq!(m[0].snapshot().await.unwrap().jobs.len(), 10);
}

#[tokio::test]
async fn test_queue_survives_a_broker_kill_on_memory() {
    queue_survives_a_broker_kill(memory_cas()).await;
}

#[tokio::test]
async fn test_queue_survives_a_broker_kill_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cas: Arc<dyn CasObject> = Arc::new(LocalCas::new(dir.path(), "queue.json").unwrap());
    queue_survives_a_broker_kill(cas).await;
}

/// Members racing to take over a fresh queue: one broker, every push lands once, FIFO per
/// pusher, and group commit makes fewer writes than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_queue_takeover_under_contention_and_group_commit() {
    let counting = Arc::new(Counting {
        inner: memory_cas(),
        writes: AtomicUsize::new(0),
        delay: Duration::from_millis(5),
    });
    let cas: Arc<dyn CasObject> = counting.clone();
    let m = members(&cas, 4, fast());
    let mut tasks = Vec::new();
    for (i, member) in m.iter().enumerate() {
        let member = member.clone();
        tasks.push(tokio::spawn(async move {
            for j in 0..10 {
                member.push(vec![format!("{i}-{j}")]).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        m.iter().filter(|m| m.runs_broker()).count(),
        1,
        "one broker"
    );
    let state = m[0].snapshot().await.unwrap();
    assert_eq!(state.jobs.len(), 40, "every push once");
    for i in 0..4 {
        let mine: Vec<String> = state
            .jobs
            .iter()
            .map(|j| j.payload.clone())
            .filter(|p| p.starts_with(&format!("{i}-")))
            .collect();
        let want: Vec<String> = (0..10).map(|j| format!("{i}-{j}")).collect();
        assert_eq!(mine, want, "each pusher's jobs in its order");
    }
    // Four pushers wait on each 5 ms write, so each write carries the pushes of several: one
    // write per push (41 with the takeover) would mean no group commit.
    let writes = counting.writes.load(Ordering::SeqCst);
    assert!(
        writes <= 25,
        "{writes} writes for 40 pushes and the takeover"
    );
}

/// A replaced broker cannot write: its next change fails its compare-and-set, it answers
/// `NotBroker`, and the member's retry reaches the new broker.
#[tokio::test]
async fn test_queue_replaced_broker_steps_down() {
    let cas = memory_cas();
    let m = members(&cas, 2, fast());
    m[0].push(payloads(0..1)).await.unwrap();
    assert!(m[0].runs_broker());
    // m1 takes over although m0 still runs (as after a partition).
    let current = cas.read().await.unwrap().unwrap();
    let named = QueueState::decode(&current.0).unwrap().broker;
    let expected = crate::broker::Expected {
        version: Some(current.1),
        broker: named,
    };
    m[1].start_broker(&expected).await.unwrap();
    // Straight to the old broker: its write conflicts and it steps down.
    let answer = m[0]
        .network
        .call(
            "local:0",
            Request::Push {
                payloads: payloads(1..2),
            },
        )
        .await
        .unwrap();
    assert_eq!(answer, Response::NotBroker);
    // Through the member: lands at the new broker.
    assert_eq!(m[0].push(payloads(2..3)).await.unwrap(), vec![2]);
    let state = m[0].snapshot().await.unwrap();
    assert_eq!(state.broker.unwrap().id, "m1");
    assert_eq!(state.jobs.len(), 2, "the refused push did not land");
}

/// A worker that stops heartbeating loses its job after one lease, and not before.
#[tokio::test]
async fn test_queue_duplicates_only_after_the_lease() {
    let cas = memory_cas();
    let m = members(&cas, 2, fast());
    m[0].push(payloads(0..1)).await.unwrap();
    let job = m[0].claim("w1").await.unwrap().unwrap();
    for _ in 0..4 {
        tokio::time::sleep(fast().lease / 3).await;
        m[0].heartbeat("w1", job.id).await.unwrap();
        assert_eq!(
            m[1].claim("w2").await.unwrap(),
            None,
            "held while heartbeating"
        );
    }
    tokio::time::sleep(fast().lease + Duration::from_millis(50)).await;
    let again = m[1].claim("w2").await.unwrap().expect("the lease ran out");
    assert_eq!((again.id, again.attempts), (job.id, 2));
    assert!(matches!(
        m[0].ack("w1", job.id).await,
        Err(QueueError::NotHeld { .. })
    ));
    assert!(matches!(
        m[0].heartbeat("w1", job.id).await,
        Err(QueueError::NotHeld { .. })
    ));
    m[1].ack("w2", job.id).await.unwrap();
    assert!(m[0].snapshot().await.unwrap().jobs.is_empty());
}

/// A member asks the broker it knows without reading the object again (until `recheck`).
#[tokio::test]
async fn test_member_reads_the_object_once_for_many_requests() {
    #[derive(Debug)]
    struct CountingReads {
        inner: Arc<dyn CasObject>,
        reads: AtomicUsize,
    }
    #[async_trait]
    impl CasObject for CountingReads {
        async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.read().await
        }
        async fn write(
            &self,
            data: Bytes,
            expected: Option<&Version>,
        ) -> Result<Version, CasError> {
            self.inner.write(data, expected).await
        }
    }
    let counting = Arc::new(CountingReads {
        inner: memory_cas(),
        reads: AtomicUsize::new(0),
    });
    let cas: Arc<dyn CasObject> = counting.clone();
    let m = members(&cas, 2, fast());
    m[0].push(payloads(0..1)).await.unwrap();
    m[1].claim("w").await.unwrap();
    let after_first = counting.reads.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(m[1].claim("w").await.unwrap(), None);
    }
    assert_eq!(
        counting.reads.load(Ordering::SeqCst),
        after_first,
        "no reads while the broker answers"
    );
}

/// A broker whose process hangs (its writes never return) answers nothing: another member
/// takes over after `broker_timeout` and the queue goes on without it.
#[tokio::test]
async fn test_queue_takes_over_from_a_hung_broker() {
    #[derive(Debug)]
    struct Hangable {
        inner: Arc<dyn CasObject>,
        hung: std::sync::atomic::AtomicBool,
    }
    #[async_trait]
    impl CasObject for Hangable {
        async fn read(&self) -> Result<Option<(Bytes, Version)>, CasError> {
            self.inner.read().await
        }
        async fn write(
            &self,
            data: Bytes,
            expected: Option<&Version>,
        ) -> Result<Version, CasError> {
            if self.hung.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            self.inner.write(data, expected).await
        }
    }
    let shared = memory_cas();
    let settings = fast();
    let network = LocalNetwork::new(&settings);
    let hangable = Arc::new(Hangable {
        inner: shared.clone(),
        hung: std::sync::atomic::AtomicBool::new(false),
    });
    let a = Member::new("a", "local:a", hangable.clone(), network.clone(), settings);
    let b = Member::new("b", "local:b", shared.clone(), network.clone(), settings);
    a.push(payloads(0..1)).await.unwrap();
    assert!(a.runs_broker());
    hangable.hung.store(true, Ordering::SeqCst);
    assert_eq!(b.push(payloads(1..2)).await.unwrap(), vec![2]);
    assert!(b.runs_broker());
    let state = b.snapshot().await.unwrap();
    assert_eq!(state.broker.unwrap().id, "b");
    assert_eq!(state.jobs.len(), 2);
}
