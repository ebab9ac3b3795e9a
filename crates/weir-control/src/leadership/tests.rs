use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::memory::InMemory;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const ME: Candidate<'static> = Candidate {
    node_id: 2,
    incarnation: "b",
};

fn lease(node_id: i32, incarnation: &str, counter: u64) -> Lease {
    Lease {
        format: LEASE_FORMAT,
        epoch: 5,
        node_id,
        incarnation: incarnation.into(),
        address: format!("10.0.0.{node_id}:9093"),
        counter,
        released: false,
    }
}

#[tokio::test]
async fn test_lease_keeper_renews_and_releases_what_followers_read() {
    let store = Arc::new(InMemory::new());
    assert_eq!(read_lease(store.as_ref(), 5).await.unwrap(), None);
    let mut keeper = LeaseKeeper::new(store.clone(), 5, 1, "a", "10.0.0.1:9093");
    keeper.renew().await.unwrap();
    keeper.renew().await.unwrap();
    let read = read_lease(store.as_ref(), 5).await.unwrap().unwrap();
    assert_eq!((read.counter, read.node_id, read.released), (2, 1, false));
    assert_eq!(
        read_lease(store.as_ref(), 4).await.unwrap(),
        None,
        "another epoch's key"
    );
    keeper.release().await.unwrap();
    assert!(
        read_lease(store.as_ref(), 5)
            .await
            .unwrap()
            .unwrap()
            .released
    );
    // A lease object this build cannot read says nothing.
    store
        .put(&lease_key(6), PutPayload::from_static(b"{\"format\":9}"))
        .await
        .unwrap();
    assert_eq!(read_lease(store.as_ref(), 6).await.unwrap(), None);
}

#[test]
fn test_lease_watch_goes_stale_only_when_the_counter_stops_for_the_timeout() {
    let t0 = Instant::now();
    let mut watch = LeaseWatch::new(5, TIMEOUT, t0);
    let held = |w: &mut LeaseWatch, counter, at| w.observe(Some(&lease(1, "a", counter)), at, at);
    assert!(matches!(
        held(&mut watch, 1, t0),
        LeaseState::Held { node_id: 1, .. }
    ));
    // Moving every few seconds: held, however long.
    for i in 1..20u64 {
        let at = t0 + Duration::from_secs(3 * i);
        assert!(matches!(
            held(&mut watch, 1 + i, at),
            LeaseState::Held { .. }
        ));
    }
    // Stopped at counter 20 (first seen at 57 s): held until 67 s, stale from then.
    let last = t0 + Duration::from_secs(57);
    assert!(matches!(
        held(&mut watch, 20, last + Duration::from_secs(9)),
        LeaseState::Held { .. }
    ));
    assert_eq!(
        held(&mut watch, 20, last + TIMEOUT),
        LeaseState::Stale {
            node_id: 1,
            incarnation: "a".into()
        }
    );
    // It moves again: held again.
    assert!(matches!(
        held(&mut watch, 21, last + TIMEOUT * 2),
        LeaseState::Held { .. }
    ));
    // Another epoch's lease is not this one.
    let mut other = lease(1, "a", 1);
    other.epoch = 6;
    assert!(matches!(
        watch.observe(Some(&other), last, last),
        LeaseState::Absent { .. }
    ));
}

#[test]
fn test_may_take_over_needs_a_stopped_lease_no_higher_epoch_and_a_silent_leader() {
    let t0 = Instant::now();
    let watch = LeaseWatch::new(5, TIMEOUT, t0);
    let stale = LeaseState::Stale {
        node_id: 1,
        incarnation: "a".into(),
    };
    let held = LeaseState::Held {
        node_id: 1,
        address: "x".into(),
    };
    assert!(may_take_over(&stale, &watch, 5, false, ME));
    assert!(
        !may_take_over(&stale, &watch, 5, true, ME),
        "the leader still answers"
    );
    assert!(
        !may_take_over(&stale, &watch, 6, false, ME),
        "someone claimed already"
    );
    assert!(
        !may_take_over(&held, &watch, 5, false, ME),
        "the lease moves"
    );
    assert!(may_take_over(&LeaseState::Released, &watch, 5, true, ME));
    assert!(!may_take_over(&LeaseState::Released, &watch, 6, true, ME));
    let young = LeaseState::Absent {
        since: Duration::from_secs(3),
    };
    let old = LeaseState::Absent { since: TIMEOUT };
    assert!(!may_take_over(&young, &watch, 5, false, ME));
    assert!(may_take_over(&old, &watch, 5, false, ME));
    // A stale lease of this node's previous incarnation: that process is gone.
    let mine = LeaseState::Stale {
        node_id: 2,
        incarnation: "old".into(),
    };
    assert!(may_take_over(&mine, &watch, 5, true, ME));
}

#[test]
fn test_at_start_follows_a_live_leader_and_refuses_a_second_agent_with_this_node_id() {
    let me = ME;
    assert_eq!(at_start(0, None, None, me), AtStart::Lead, "a new cluster");
    assert_eq!(
        at_start(3, None, None, me),
        AtStart::Watch,
        "an epoch whose leader has not written its lease yet (or a log from before clusters)"
    );
    let a1 = lease(1, "a", 1);
    let a2 = lease(1, "a", 2);
    assert_eq!(at_start(1, Some(&a1), Some(&a2), me), AtStart::Follow);
    assert_eq!(
        at_start(1, None, Some(&a2), me),
        AtStart::Follow,
        "it appeared meanwhile"
    );
    assert_eq!(at_start(1, Some(&a1), Some(&a1), me), AtStart::Watch);
    let mut released = a2.clone();
    released.released = true;
    assert_eq!(at_start(1, Some(&a1), Some(&released), me), AtStart::Lead);
    // This node's previous incarnation, killed: lead at once, as a single agent always did.
    let old = lease(2, "old", 7);
    assert_eq!(at_start(1, Some(&old), Some(&old), me), AtStart::Lead);
    // Another live process with this node id.
    let other = lease(2, "other", 8);
    assert_eq!(
        at_start(1, Some(&old), Some(&other), me),
        AtStart::DuplicateNodeId {
            address: "10.0.0.2:9093".into()
        }
    );
}

/// A read may reflect any moment between its sending and its answer: a counter counts from the
/// answer of the read that first saw it, and as unmoved only up to the sending of the latest.
#[test]
fn test_lease_watch_counts_only_the_span_its_reads_prove_quiet() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut watch = LeaseWatch::new(5, TIMEOUT, t0);
    let lease = lease(1, "a", 7);
    // First seen by a read answered 40 ms after it was sent.
    assert!(matches!(
        watch.observe(Some(&lease), t0, t0 + ms(40)),
        LeaseState::Held { .. }
    ));
    // A read sent one timeout after the first was sent (not answered) proves nothing yet.
    assert!(matches!(
        watch.observe(Some(&lease), t0 + TIMEOUT, t0 + TIMEOUT + ms(40)),
        LeaseState::Held { .. }
    ));
    assert!(matches!(
        watch.observe(Some(&lease), t0 + ms(40) + TIMEOUT, t0 + ms(80) + TIMEOUT),
        LeaseState::Stale { .. }
    ));
}
