//! Three control planes on one bucket, linked in process (RFC 0002 build step 1), on a paused
//! clock: one leads, the others follow, forward their writes and take over when the leader
//! stops; a deposed leader follows and never claims again on its own.

use std::collections::BTreeMap;
use std::time::Duration;

use object_store::memory::InMemory;
use weir_storage::model::{LatencyProfile, ModelStore};

use super::*;
use crate::link::LocalLinks;

struct Member {
    plane: ControlPlane,
    /// The member's view of the bucket: an outage here cuts it off storage.
    store: Arc<ModelStore>,
    address: String,
}

async fn try_member(
    bucket: &Arc<InMemory>,
    links: &LocalLinks,
    node_id: i32,
    incarnation: &str,
) -> Result<Member, LogError> {
    open_member(bucket, links, node_id, incarnation, None).await
}

async fn open_member(
    bucket: &Arc<InMemory>,
    links: &LocalLinks,
    node_id: i32,
    incarnation: &str,
    agent: Option<AgentInfo>,
) -> Result<Member, LogError> {
    let store =
        Arc::new(ModelStore::new(bucket.clone(), LatencyProfile::local(), node_id as u64).unwrap());
    let address = format!("agent-{node_id}-{incarnation}");
    let settings = ControlPlaneSettings {
        address: address.clone(),
        cluster: Some(ClusterSettings {
            agent,
            ..ClusterSettings::new(node_id, incarnation, links.link_for(&address))
        }),
        ..ControlPlaneSettings::default()
    };
    let plane = ControlPlane::open(store.clone(), settings, node_id as u64).await?;
    links.register(&address, plane.clone());
    Ok(Member {
        plane,
        store,
        address,
    })
}

async fn member(bucket: &Arc<InMemory>, links: &LocalLinks, node_id: i32) -> Member {
    try_member(bucket, links, node_id, "first").await.unwrap()
}

fn role(member: &Member) -> Role {
    *member.plane.role().borrow()
}

fn leaders(members: &[&Member]) -> Vec<i32> {
    members
        .iter()
        .filter(|m| matches!(role(m), Role::Leader { .. }))
        .map(|m| m.address.split('-').nth(1).unwrap().parse().unwrap())
        .collect()
}

async fn highest_epoch(bucket: &Arc<InMemory>) -> u64 {
    LogStore::new(bucket.clone(), 1)
        .highest_epoch()
        .await
        .unwrap()
}

/// Waits (virtual time) until `done`, at most `limit`; returns how long it took.
async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Some(start.elapsed())
}

fn topics(member: &Member) -> Vec<String> {
    member.plane.read(|s| s.topics.keys().cloned().collect())
}

/// Kill -9 as the others see it: no storage, no network.
fn kill(links: &LocalLinks, member: &Member) {
    member.store.set_outage(true);
    links.deregister(&member.address);
}

/// Three members on one bucket: node 1 leads, 2 and 3 follow.
async fn three() -> (Arc<InMemory>, LocalLinks, [Member; 3]) {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let b = member(&bucket, &links, 2).await;
    let c = member(&bucket, &links, 3).await;
    (bucket, links, [a, b, c])
}

fn assert_same_position(members: &[&Member]) {
    let positions: Vec<u64> = members
        .iter()
        .map(|m| *m.plane.subscribe().borrow())
        .collect();
    assert!(
        positions.iter().all(|p| *p == positions[0]),
        "{positions:?}"
    );
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn test_one_leader_and_followers_that_forward_and_replicate_and_stay_put_while_idle() {
    let (bucket, _links, [a, b, c]) = three().await;
    assert_eq!(leaders(&[&a, &b, &c]), vec![1]);
    assert_eq!(role(&b), Role::Follower { epoch: 1 });
    // Followers need their first tick to connect to the leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.plane
        .create_topic("from-b", 1, BTreeMap::new(), 7)
        .await
        .unwrap();
    assert_eq!(
        topics(&b),
        vec!["from-b"],
        "read your writes on the follower"
    );
    assert_eq!(topics(&a), vec!["from-b"]);
    c.plane
        .create_topic("from-c", 1, BTreeMap::new(), 8)
        .await
        .unwrap();
    let same = || {
        [&a, &b, &c]
            .iter()
            .all(|m| topics(m) == vec!["from-b", "from-c"])
    };
    assert!(wait_until(Duration::from_secs(5), same).await.is_some());
    assert_same_position(&[&a, &b, &c]);
    // Idle for a minute: the lease keeps followers following; nobody claims.
    tokio::time::sleep(MINUTE).await;
    assert_eq!(highest_epoch(&bucket).await, 1);
    assert_eq!(leaders(&[&a, &b, &c]), vec![1]);
    // A second write of the same name through another agent gets the state machine's answer.
    let again = c.plane.create_topic("from-b", 1, BTreeMap::new(), 9).await;
    assert!(
        matches!(again, Err(ControlError::TopicAlreadyExists(_))),
        "{again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn test_a_follower_takes_over_from_a_killed_leader_with_everything_durable() {
    let (bucket, links, [a, b, c]) = three().await;
    for i in 0..5 {
        a.plane
            .create_topic(&format!("t{i}"), 1, BTreeMap::new(), i)
            .await
            .unwrap();
    }
    kill(&links, &a);
    let took = wait_until(MINUTE, || leaders(&[&b, &c]).len() == 1).await;
    let took = took.expect("a follower takes over");
    assert!(
        took >= Duration::from_secs(8),
        "not before the lease timed out: {took:?}"
    );
    assert_eq!(highest_epoch(&bucket).await, 2);
    let (new, other) = if leaders(&[&b, &c]) == vec![2] {
        (&b, &c)
    } else {
        (&c, &b)
    };
    assert_eq!(
        topics(new).len(),
        5,
        "the new leader started from its replica"
    );
    // The other follower follows the new leader and forwards to it.
    let created = wait_until(MINUTE, || {
        *other.plane.role().borrow() == Role::Follower { epoch: 2 }
    });
    assert!(created.await.is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    other
        .plane
        .create_topic("after", 1, BTreeMap::new(), 50)
        .await
        .unwrap();
    assert!(topics(new).contains(&"after".to_string()));
    let replay = LogStore::new(bucket.clone(), 1).replay().await.unwrap();
    assert_eq!(replay.state.topics.len(), 6);
}

#[tokio::test(start_paused = true)]
async fn test_a_leader_cut_off_storage_is_replaced_then_follows_and_never_claims_again() {
    let (bucket, _links, [a, b, c]) = three().await;
    a.store.set_outage(true);
    // A write during the outage fails retriably; the leader is unavailable.
    let during = a.plane.create_topic("lost", 1, BTreeMap::new(), 1).await;
    assert!(
        matches!(during, Err(ControlError::Unavailable(_))),
        "{during:?}"
    );
    let replaced = wait_until(MINUTE, || leaders(&[&b, &c]).len() == 1).await;
    assert!(
        replaced.is_some(),
        "a follower takes over from a leader without storage"
    );
    a.store.set_outage(false);
    let follows = wait_until(MINUTE, || role(&a) == Role::Follower { epoch: 2 }).await;
    assert!(follows.is_some(), "the old leader follows: {:?}", role(&a));
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.plane
        .create_topic("through-a", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    tokio::time::sleep(MINUTE).await;
    assert_eq!(
        highest_epoch(&bucket).await,
        2,
        "the deposed leader never claimed again"
    );
    assert_eq!(leaders(&[&a, &b, &c]).len(), 1);
    assert_same_position(&[&a, &b, &c]);
}

#[tokio::test(start_paused = true)]
async fn test_a_clean_shutdown_hands_over_without_waiting_for_the_lease() {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let b = member(&bucket, &links, 2).await;
    a.plane
        .create_topic("t", 1, BTreeMap::new(), 1)
        .await
        .unwrap();
    a.plane.shutdown().await;
    links.deregister(&a.address);
    let took = wait_until(MINUTE, || leaders(&[&b]) == vec![2]).await;
    let took = took.expect("the follower takes over");
    assert!(
        took < Duration::from_secs(5),
        "at the next lease read: {took:?}"
    );
    assert_eq!(topics(&b), vec!["t"]);
}

#[tokio::test(start_paused = true)]
async fn test_a_second_agent_with_a_live_node_id_is_refused_and_a_restart_leads_at_once() {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let _b = member(&bucket, &links, 2).await;
    let twin = try_member(&bucket, &links, 1, "twin").await;
    match twin {
        Err(LogError::DuplicateNodeId {
            node_id: 1,
            address,
        }) => {
            assert_eq!(address, a.address)
        }
        other => panic!("{:?}", other.map(|m| m.address)),
    }
    // Node 1 is killed and restarts: its new incarnation leads without waiting out the lease.
    kill(&links, &a);
    let restarted = try_member(&bucket, &links, 1, "second").await.unwrap();
    assert!(
        matches!(role(&restarted), Role::Leader { epoch: 2 }),
        "{:?}",
        role(&restarted)
    );
}

#[tokio::test(start_paused = true)]
async fn test_a_follower_cut_off_its_peers_claims_nothing_and_recovers_when_healed() {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let c = member(&bucket, &links, 3).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    links.set_cut(&c.address, true);
    let cut = c.plane.create_topic("cut", 1, BTreeMap::new(), 1).await;
    assert!(matches!(cut, Err(ControlError::Unavailable(_))), "{cut:?}");
    a.plane
        .create_topic("t", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    tokio::time::sleep(MINUTE).await;
    assert_eq!(
        highest_epoch(&bucket).await,
        1,
        "the lease moved: no takeover"
    );
    assert_eq!(
        topics(&c),
        vec!["t"],
        "the cut-off follower reads the bucket"
    );
    assert!(!*c.plane.availability().borrow());
    links.set_cut(&c.address, false);
    let back = wait_until(MINUTE, || *c.plane.availability().borrow()).await;
    assert!(back.is_some());
    c.plane
        .create_topic("healed", 1, BTreeMap::new(), 3)
        .await
        .unwrap();
    assert_eq!(topics(&a), vec!["healed", "t"]);
}

/// A follower serves reads only while it knows its replica is recent (`plane/freshness.rs`):
/// cut off its leader it confirms that from the bucket; cut off the bucket too, its replica
/// stops while the leader's deleter goes on, so after `max_read_staleness` it plans no batches;
/// healed, it serves again. The leader always serves.
#[tokio::test(start_paused = true)]
async fn test_a_follower_cut_off_stops_serving_reads_after_the_staleness_bound() {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let c = member(&bucket, &links, 3).await;
    let fresh = |m: &Member| m.plane.serves_fresh_reads();
    assert!(!fresh(&c), "a starting follower has confirmed nothing");
    assert!(wait_until(MINUTE, || fresh(&c)).await.is_some());
    let bound = ClusterSettings::new(0, "", links.link_for("x")).max_read_staleness;
    links.set_cut(&c.address, true);
    a.plane
        .create_topic("t", 1, BTreeMap::new(), 2)
        .await
        .unwrap();
    tokio::time::sleep(bound * 2).await;
    assert!(
        fresh(&c),
        "the bucket confirms a follower cut off its peers"
    );
    assert_eq!(topics(&c), vec!["t"]);
    c.store.set_outage(true);
    tokio::time::sleep(bound / 2).await;
    assert!(fresh(&c), "within the bound");
    let stale = wait_until(MINUTE, || !fresh(&c)).await;
    assert!(stale.is_some_and(|after| after <= bound), "{stale:?}");
    assert!(fresh(&a), "the leader");
    links.set_cut(&c.address, false);
    c.store.set_outage(false);
    assert!(wait_until(MINUTE, || fresh(&c)).await.is_some());
}

/// A member that registers itself (RFC 0002 §5).
async fn registered(
    bucket: &Arc<InMemory>,
    links: &LocalLinks,
    node_id: i32,
    incarnation: &str,
) -> Member {
    let info = AgentInfo {
        zone: format!("zone-{}", node_id % 2),
        host: "127.0.0.1".into(),
        port: 9000 + node_id,
    };
    open_member(bucket, links, node_id, incarnation, Some(info))
        .await
        .unwrap()
}

fn registry(member: &Member) -> BTreeMap<i32, String> {
    member.plane.read(|state| state.registry.incarnations())
}

fn expect(pairs: &[(i32, &str)]) -> BTreeMap<i32, String> {
    pairs.iter().map(|(n, i)| (*n, i.to_string())).collect()
}

/// Three members that register, once every one of them lists all three.
async fn three_registered() -> (Arc<InMemory>, LocalLinks, [Member; 3]) {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = registered(&bucket, &links, 1, "first").await;
    let b = registered(&bucket, &links, 2, "first").await;
    let c = registered(&bucket, &links, 3, "first").await;
    let all = expect(&[(1, "first"), (2, "first"), (3, "first")]);
    wait_until(MINUTE, || [&a, &b, &c].iter().all(|m| registry(m) == all))
        .await
        .expect("every member lists the three");
    (bucket, links, [a, b, c])
}

#[tokio::test(start_paused = true)]
async fn test_members_register_a_dead_one_is_fenced_and_a_live_duplicate_is_refused() {
    let (bucket, links, [a, b, c]) = three_registered().await;
    assert!(matches!(
        *b.plane.registration().borrow(),
        Registration::Registered { .. }
    ));
    // Idle and healthy: heartbeats keep everyone registered.
    tokio::time::sleep(MINUTE).await;
    let all = expect(&[(1, "first"), (2, "first"), (3, "first")]);
    assert_eq!(registry(&a), all);

    // A follower dies: the leader fences it after the agent timeout; its restart registers.
    kill(&links, &c);
    let fenced = wait_until(MINUTE, || {
        [&a, &b]
            .iter()
            .all(|m| registry(m) == expect(&[(1, "first"), (2, "first")]))
    })
    .await
    .expect("the dead member is fenced");
    assert!(
        fenced >= Duration::from_secs(10),
        "not before the agent timeout: {fenced:?}"
    );
    let c2 = registered(&bucket, &links, 3, "second").await;
    let back = expect(&[(1, "first"), (2, "first"), (3, "second")]);
    wait_until(MINUTE, || [&a, &b, &c2].iter().all(|m| registry(m) == back))
        .await
        .expect("the restarted member registers");

    // A second live agent with node id 2: refused for good, node 2 stays registered.
    let duplicate = registered(&bucket, &links, 2, "duplicate").await;
    wait_until(MINUTE, || {
        matches!(
            *duplicate.plane.registration().borrow(),
            Registration::Refused { .. }
        )
    })
    .await
    .expect("the duplicate is refused");
    assert_eq!(registry(&a), back);

    // A clean shutdown leaves the registry at once, and the member does not register again.
    c2.plane.leave(3, "second", 0).await;
    let left = expect(&[(1, "first"), (2, "first")]);
    wait_until(Duration::from_secs(1), || registry(&a) == left)
        .await
        .expect("the member left");
    tokio::time::sleep(MINUTE).await;
    assert_eq!(registry(&a), left);
}

#[tokio::test(start_paused = true)]
async fn test_a_member_that_takes_over_fences_the_old_leader_at_once() {
    let (_bucket, links, [a, b, c]) = three_registered().await;
    kill(&links, &a);
    wait_until(MINUTE, || leaders(&[&b, &c]).len() == 1)
        .await
        .expect("a follower takes over");
    // Fenced within a few renewals of the take-over, not an agent timeout (10 s) later.
    let rest = expect(&[(2, "first"), (3, "first")]);
    wait_until(Duration::from_secs(5), || {
        [&b, &c].iter().all(|m| registry(m) == rest)
    })
    .await
    .expect("the old leader is fenced at once");
}

#[tokio::test(start_paused = true)]
async fn test_a_barrier_shows_a_follower_what_the_leader_acknowledged_and_fails_when_cut() {
    let bucket = Arc::new(InMemory::new());
    let links = LocalLinks::default();
    let a = member(&bucket, &links, 1).await;
    let c = member(&bucket, &links, 3).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.plane
        .barrier(Duration::ZERO)
        .await
        .expect("a leader is its own barrier");
    // The follower's replica trails the leader by a second.
    links.delay_records(&c.address, Duration::from_secs(1));
    for n in 0..5 {
        let name = format!("t{n}");
        a.plane
            .create_topic(&name, 1, BTreeMap::new(), n)
            .await
            .unwrap();
        c.plane.barrier(Duration::from_secs(5)).await.unwrap();
        assert!(
            topics(&c).contains(&name),
            "{name} acknowledged, then not on the follower"
        );
    }
    links.set_cut(&c.address, true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut = c.plane.barrier(Duration::from_secs(5)).await;
    assert!(matches!(cut, Err(ControlError::Unavailable(_))), "{cut:?}");
}

#[tokio::test(start_paused = true)]
async fn test_a_member_cut_off_and_fenced_knows_it_and_registers_again_when_healed() {
    let (_bucket, links, [a, b, c]) = three_registered().await;
    links.set_cut(&c.address, true);
    let fenced = expect(&[(1, "first"), (2, "first")]);
    wait_until(MINUTE, || {
        registry(&c) == fenced && *c.plane.registration().borrow() == Registration::Fenced
    })
    .await
    .expect("the cut-off member sees itself fenced (from the bucket)");
    assert_eq!(registry(&a), fenced);
    links.set_cut(&c.address, false);
    let all = expect(&[(1, "first"), (2, "first"), (3, "first")]);
    wait_until(MINUTE, || {
        [&a, &b, &c].iter().all(|m| registry(m) == all)
            && matches!(
                *c.plane.registration().borrow(),
                Registration::Registered { .. }
            )
    })
    .await
    .expect("healed, it registers again");
}
