use super::*;
use crate::types::Protocol;
use weir_common::ManualClock;

const SESSION: i32 = 10_000;
const REBALANCE: i32 = 20_000;

fn core_with(settings: GroupSettings) -> (CoordinatorCore, ManualClock) {
    let clock = ManualClock::new(1_000_000);
    (
        CoordinatorCore::new(settings, Arc::new(clock.clone()), 7),
        clock,
    )
}

/// No initial rebalance delay: most tests look at one rebalance at a time.
fn core() -> (CoordinatorCore, ManualClock) {
    core_with(GroupSettings {
        initial_rebalance_delay_ms: 0,
        ..GroupSettings::default()
    })
}

fn join_request(member_id: &str, instance: Option<&str>, protocols: &[&str]) -> JoinRequest {
    JoinRequest {
        group_id: "g".into(),
        member_id: member_id.into(),
        group_instance_id: instance.map(str::to_string),
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|name| Protocol {
                name: name.to_string(),
                metadata: Bytes::from(format!("meta-{name}")),
            })
            .collect(),
        require_known_member_id: false,
        supports_skip_assignment: false,
    }
}

fn answer(effects: &Effects, token: Token) -> Option<JoinResponse> {
    effects
        .joins
        .iter()
        .find(|(t, _)| *t == token)
        .map(|(_, r)| r.clone())
}

fn sync_answer_of(effects: &Effects, token: Token) -> Option<SyncResponse> {
    effects
        .syncs
        .iter()
        .find(|(t, _)| *t == token)
        .map(|(_, r)| r.clone())
}

fn sync_request(
    member_id: &str,
    generation: i32,
    assignments: Vec<(String, Bytes)>,
) -> SyncRequest {
    SyncRequest {
        group_id: "g".into(),
        generation_id: generation,
        member_id: member_id.into(),
        group_instance_id: None,
        protocol_type: None,
        protocol_name: None,
        assignments,
    }
}

fn heartbeat(
    core: &mut CoordinatorCore,
    member_id: &str,
    generation: i32,
) -> Result<(), GroupError> {
    core.heartbeat(&HeartbeatRequest {
        group_id: "g".into(),
        generation_id: generation,
        member_id: member_id.into(),
        group_instance_id: None,
    })
}

/// One member joins alone and becomes a stable leader: returns its member id.
fn stable_single(core: &mut CoordinatorCore) -> String {
    let joined = answer(&core.join(1, join_request("", None, &["range"])), 1).unwrap();
    assert_eq!(joined.error, None);
    assert_eq!(joined.generation_id, 1);
    let synced = core.sync(
        2,
        sync_request(
            &joined.member_id,
            1,
            vec![(joined.member_id.clone(), Bytes::from_static(b"A"))],
        ),
    );
    assert_eq!(
        sync_answer_of(&synced, 2).unwrap().assignment,
        Bytes::from_static(b"A")
    );
    joined.member_id
}

#[test]
fn test_coordinator_member_id_required_round_trip() {
    let (mut core, _clock) = core();
    let mut request = join_request("", None, &["range"]);
    request.require_known_member_id = true;
    let first = answer(&core.join(1, request.clone()), 1).unwrap();
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    assert!(
        first.member_id.starts_with("client-"),
        "{}",
        first.member_id
    );
    request.member_id = first.member_id.clone();
    let second = answer(&core.join(2, request), 2).unwrap();
    assert_eq!(second.error, None);
    assert_eq!(second.member_id, first.member_id);
    assert_eq!(second.leader, first.member_id);
    assert_eq!(second.protocol_name.as_deref(), Some("range"));
    assert_eq!(second.members.len(), 1, "the leader sees every member");
}

#[test]
fn test_coordinator_two_members_rebalance_and_assignment_passthrough() {
    let (mut core, _clock) = core();
    let leader = stable_single(&mut core);
    // A second member joins: the group waits for the leader to rejoin.
    let effects = core.join(3, join_request("", None, &["roundrobin", "range"]));
    assert!(
        answer(&effects, 3).is_none(),
        "parked until everyone rejoins"
    );
    assert_eq!(
        heartbeat(&mut core, &leader, 1),
        Err(GroupError::RebalanceInProgress)
    );
    let effects = core.join(4, join_request(&leader, None, &["range"]));
    let leader_join = answer(&effects, 4).unwrap();
    let follower_join = answer(&effects, 3).unwrap();
    assert_eq!(leader_join.generation_id, 2);
    assert_eq!(
        leader_join.protocol_name.as_deref(),
        Some("range"),
        "only common protocol"
    );
    assert_eq!(leader_join.members.len(), 2);
    assert!(follower_join.members.is_empty());
    assert_eq!(
        leader_join.members[1].metadata,
        Bytes::from_static(b"meta-range")
    );
    let follower = follower_join.member_id.clone();
    let parked = core.sync(5, sync_request(&follower, 2, vec![]));
    assert!(sync_answer_of(&parked, 5).is_none());
    let assignments = vec![
        (leader.clone(), Bytes::from_static(b"\x00\x01L")),
        (follower.clone(), Bytes::from_static(b"\xffF")),
    ];
    let effects = core.sync(6, sync_request(&leader, 2, assignments));
    assert_eq!(
        sync_answer_of(&effects, 6).unwrap().assignment,
        Bytes::from_static(b"\x00\x01L")
    );
    assert_eq!(
        sync_answer_of(&effects, 5).unwrap().assignment,
        Bytes::from_static(b"\xffF")
    );
    assert_eq!(heartbeat(&mut core, &follower, 2), Ok(()));
    assert_eq!(core.describe("g").unwrap().state, GroupState::Stable);
}

#[test]
fn test_coordinator_illegal_generation_and_unknown_member() {
    let (mut core, _clock) = core();
    let leader = stable_single(&mut core);
    assert_eq!(
        heartbeat(&mut core, &leader, 0),
        Err(GroupError::IllegalGeneration { current: 1, got: 0 })
    );
    assert_eq!(
        heartbeat(&mut core, "nobody", 1),
        Err(GroupError::UnknownMemberId("nobody".into()))
    );
    let effects = core.sync(9, sync_request(&leader, 5, vec![]));
    assert!(matches!(
        sync_answer_of(&effects, 9).unwrap().error,
        Some(GroupError::IllegalGeneration { .. })
    ));
    let commit = CommitIdentity {
        group_id: "g".into(),
        generation_id: 7,
        member_id: leader.clone(),
        group_instance_id: None,
    };
    assert!(matches!(
        core.validate_commit(&commit),
        Err(GroupError::IllegalGeneration { .. })
    ));
    let simple = CommitIdentity {
        generation_id: -1,
        member_id: String::new(),
        ..commit.clone()
    };
    assert!(
        core.validate_commit(&simple).is_err(),
        "simple commits only while empty"
    );
    let other = CommitIdentity {
        group_id: "other".into(),
        ..simple
    };
    assert_eq!(core.validate_commit(&other), Ok(()));
    let valid = CommitIdentity {
        generation_id: 1,
        ..commit
    };
    assert_eq!(core.validate_commit(&valid), Ok(()));
}

#[test]
fn test_coordinator_session_expiry_removes_member_and_rebalances() {
    let (mut core, clock) = core();
    let leader = stable_single(&mut core);
    let effects = core.join(3, join_request("", None, &["range"]));
    assert!(answer(&effects, 3).is_none());
    core.join(4, join_request(&leader, None, &["range"]));
    // Both in generation 2, then the follower stops heartbeating.
    clock.advance_ms(i64::from(SESSION) / 2);
    assert_eq!(heartbeat(&mut core, &leader, 2), Ok(()));
    clock.advance_ms(i64::from(SESSION) / 2 + 1);
    assert_eq!(heartbeat(&mut core, &leader, 2), Ok(()));
    let effects = core.tick();
    assert!(effects.joins.is_empty());
    let description = core.describe("g").unwrap();
    assert_eq!(description.members.len(), 1, "follower expired");
    assert_eq!(description.state, GroupState::PreparingRebalance);
    assert_eq!(
        heartbeat(&mut core, &leader, 2),
        Err(GroupError::RebalanceInProgress)
    );
    let rejoined = answer(&core.join(5, join_request(&leader, None, &["range"])), 5).unwrap();
    assert_eq!(rejoined.generation_id, 3);
    assert_eq!(rejoined.members.len(), 1);
    assert!(core.next_deadline().is_some());
}

#[test]
fn test_coordinator_rebalance_timeout_kicks_members_that_do_not_rejoin() {
    let (mut core, clock) = core();
    let first = stable_single(&mut core);
    // Second member joins; the first keeps heartbeating but never rejoins.
    core.join(3, join_request("", None, &["range"]));
    for _ in 0..5 {
        clock.advance_ms(i64::from(REBALANCE) / 4);
        let _ = heartbeat(&mut core, &first, 1);
        assert!(core.tick().joins.is_empty() || clock.now_ms() > 0);
    }
    let description = core.describe("g").unwrap();
    assert_eq!(description.state, GroupState::CompletingRebalance);
    assert_eq!(description.members.len(), 1);
    assert_ne!(description.members[0].member_id, first);
    assert_eq!(
        heartbeat(&mut core, &first, 1),
        Err(GroupError::UnknownMemberId(first.clone()))
    );
}

#[test]
fn test_coordinator_rebalance_timeout_answers_parked_join() {
    let (mut core, clock) = core();
    let first = stable_single(&mut core);
    let effects = core.join(3, join_request("", None, &["range"]));
    assert!(answer(&effects, 3).is_none());
    clock.advance_ms(i64::from(REBALANCE));
    let _ = heartbeat(&mut core, &first, 1);
    let effects = core.tick();
    let joined = answer(&effects, 3).expect("answered at the rebalance deadline");
    assert_eq!(joined.generation_id, 2);
    assert_eq!(
        joined.leader, joined.member_id,
        "the remaining member leads"
    );
}

#[test]
fn test_coordinator_static_member_rejoin_without_rebalance() {
    let (mut core, clock) = core();
    let a = answer(&core.join(1, join_request("", Some("i-a"), &["range"])), 1).unwrap();
    let effects = core.join(2, join_request("", Some("i-b"), &["range"]));
    assert!(answer(&effects, 2).is_none());
    let effects = core.join(3, join_request(&a.member_id, Some("i-a"), &["range"]));
    let a2 = answer(&effects, 3).unwrap();
    let b = answer(&effects, 2).unwrap();
    assert_eq!(a2.generation_id, 2);
    let assignments = vec![
        (a.member_id.clone(), Bytes::from_static(b"A")),
        (b.member_id.clone(), Bytes::from_static(b"B")),
    ];
    let mut sync_b = sync_request(&b.member_id, 2, vec![]);
    sync_b.group_instance_id = Some("i-b".into());
    core.sync(4, sync_b);
    core.sync(5, sync_request(&a.member_id, 2, assignments));
    // b restarts: same instance id, no member id. No rebalance; its assignment comes back.
    clock.advance_ms(1_000);
    let rejoined = answer(&core.join(6, join_request("", Some("i-b"), &["range"])), 6).unwrap();
    assert_eq!(rejoined.error, None);
    assert_ne!(rejoined.member_id, b.member_id);
    assert_eq!(rejoined.generation_id, 2, "no new generation");
    assert_eq!(core.describe("g").unwrap().state, GroupState::Stable);
    assert_eq!(
        heartbeat(&mut core, &a.member_id, 2),
        Ok(()),
        "the others are not disturbed"
    );
    let mut sync_new = sync_request(&rejoined.member_id, 2, vec![]);
    sync_new.group_instance_id = Some("i-b".into());
    let synced = sync_answer_of(&core.sync(7, sync_new), 7).unwrap();
    assert_eq!(synced.assignment, Bytes::from_static(b"B"));
    // The old member id is fenced.
    let fenced = core.heartbeat(&HeartbeatRequest {
        group_id: "g".into(),
        generation_id: 2,
        member_id: b.member_id.clone(),
        group_instance_id: Some("i-b".into()),
    });
    assert_eq!(fenced, Err(GroupError::FencedInstanceId("i-b".into())));
}

#[test]
fn test_coordinator_leave_by_instance_id_batch() {
    let (mut core, _clock) = core();
    let a = answer(&core.join(1, join_request("", Some("i-a"), &["range"])), 1).unwrap();
    core.join(2, join_request("", Some("i-b"), &["range"]));
    core.join(3, join_request(&a.member_id, Some("i-a"), &["range"]));
    let (results, _effects) = core.leave(
        "g",
        &[
            LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("i-a".into()),
            },
            LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("i-b".into()),
            },
            LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("i-c".into()),
            },
        ],
    );
    assert_eq!(results[0], Ok(()));
    assert_eq!(results[1], Ok(()));
    assert!(matches!(results[2], Err(GroupError::UnknownMemberId(_))));
    assert_eq!(core.describe("g").unwrap().state, GroupState::Empty);
    assert_eq!(core.begin_delete("g"), Ok(true));
    core.finish_delete("g");
    assert!(core.describe("g").is_none());
}

#[test]
fn test_coordinator_inconsistent_protocol_and_session_bounds() {
    let (mut core, _clock) = core();
    stable_single(&mut core);
    let other = answer(&core.join(5, join_request("", None, &["sticky"])), 5).unwrap();
    assert_eq!(other.error, Some(GroupError::InconsistentGroupProtocol));
    let mut wrong_type = join_request("", None, &["range"]);
    wrong_type.protocol_type = "connect".into();
    let refused = answer(&core.join(6, wrong_type), 6).unwrap();
    assert_eq!(refused.error, Some(GroupError::InconsistentGroupProtocol));
    let mut short = join_request("", None, &["range"]);
    short.session_timeout_ms = 100;
    let refused = answer(&core.join(7, short), 7).unwrap();
    assert!(matches!(
        refused.error,
        Some(GroupError::InvalidSessionTimeout { got: 100, .. })
    ));
}

#[test]
fn test_coordinator_bounded_members_and_pending_ids() {
    let settings = GroupSettings {
        max_members_per_group: 3,
        ..GroupSettings::default()
    };
    let (mut core, clock) = core_with(settings);
    let mut request = join_request("", None, &["range"]);
    request.require_known_member_id = true;
    // A client that never comes back with its id: pending ids count against the bound...
    for token in 0..3 {
        let answer = answer(&core.join(token, request.clone()), token).unwrap();
        assert_eq!(answer.error, Some(GroupError::MemberIdRequired));
    }
    let full = answer(&core.join(10, request.clone()), 10).unwrap();
    assert_eq!(full.error, Some(GroupError::GroupMaxSizeReached(3)));
    // ...and expire after a session timeout, freeing room.
    clock.advance_ms(i64::from(SESSION) + 1);
    core.tick();
    let again = answer(&core.join(11, request), 11).unwrap();
    assert_eq!(again.error, Some(GroupError::MemberIdRequired));
}

#[test]
fn test_coordinator_initial_rebalance_delay_gathers_members_starting_together() {
    let (mut core, clock) = core_with(GroupSettings::default());
    assert!(answer(&core.join(1, join_request("", None, &["range"])), 1).is_none());
    clock.advance_ms(1_000);
    assert!(core.tick().joins.is_empty(), "still inside the delay");
    assert!(answer(&core.join(2, join_request("", None, &["range"])), 2).is_none());
    assert_eq!(core.next_deadline(), Some(1_000_000 + 3_000));
    clock.advance_ms(2_000);
    let effects = core.tick();
    let first = answer(&effects, 1).expect("answered when the delay ends");
    let second = answer(&effects, 2).unwrap();
    assert_eq!(
        (first.generation_id, second.generation_id),
        (1, 1),
        "one rebalance for both"
    );
    assert_eq!(first.members.len() + second.members.len(), 2);
    // A group that is not empty rebalances without the delay.
    let effects = core.join(3, join_request("", None, &["range"]));
    assert!(answer(&effects, 3).is_none());
    let rejoin_first = core.join(4, join_request(&first.member_id, None, &["range"]));
    assert!(answer(&rejoin_first, 4).is_none());
    let rejoin_second = core.join(5, join_request(&second.member_id, None, &["range"]));
    assert_eq!(answer(&rejoin_second, 3).unwrap().generation_id, 2);
}

#[test]
fn test_coordinator_delete_refuses_non_empty_group() {
    let (mut core, _clock) = core();
    let leader = stable_single(&mut core);
    assert_eq!(
        core.begin_delete("g"),
        Err(GroupError::NonEmptyGroup("g".into()))
    );
    assert_eq!(core.begin_delete("unknown"), Ok(false));
    let (results, _) = core.leave(
        "g",
        &[LeavingMember {
            member_id: leader,
            group_instance_id: None,
        }],
    );
    assert_eq!(results, vec![Ok(())]);
    let listed = core.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, GroupState::Empty);
    assert_eq!(listed[0].protocol_type, "consumer");
}

mod properties {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Join as member slot `n` (new if it has no id yet), optionally static, v4+ or not.
        Join {
            slot: u8,
            r#static: bool,
            v4: bool,
        },
        /// Sync as member slot `n`, as leader assigning something to everyone it knows.
        Sync {
            slot: u8,
        },
        Heartbeat {
            slot: u8,
        },
        Leave {
            slot: u8,
        },
        Advance {
            ms: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, any::<bool>(), any::<bool>()).prop_map(|(slot, s, v4)| Op::Join {
                slot,
                r#static: s,
                v4
            }),
            (0u8..4).prop_map(|slot| Op::Sync { slot }),
            (0u8..4).prop_map(|slot| Op::Heartbeat { slot }),
            (0u8..4).prop_map(|slot| Op::Leave { slot }),
            (0u32..15_000).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    #[derive(Default)]
    struct Driver {
        next_token: Token,
        parked: BTreeMap<Token, &'static str>,
        answered: BTreeMap<Token, usize>,
        /// Slot → (member id, generation) as the client last learnt them.
        ids: BTreeMap<u8, (String, i32)>,
    }

    impl Driver {
        fn token(&mut self, kind: &'static str) -> Token {
            self.next_token += 1;
            self.parked.insert(self.next_token, kind);
            self.next_token
        }

        fn absorb(&mut self, effects: Effects, slots: &BTreeMap<Token, u8>) {
            for (token, response) in effects.joins {
                *self.answered.entry(token).or_default() += 1;
                self.parked.remove(&token);
                if let Some(slot) = slots.get(&token) {
                    if response.error.is_none()
                        || response.error == Some(GroupError::MemberIdRequired)
                    {
                        self.ids
                            .insert(*slot, (response.member_id, response.generation_id));
                    }
                }
            }
            for (token, _) in effects.syncs {
                *self.answered.entry(token).or_default() += 1;
                self.parked.remove(&token);
            }
        }
    }

    proptest! {
        /// Whatever clients do, every parked JoinGroup/SyncGroup is answered exactly once once
        /// time moves past every timeout, and the group then holds nobody (no hang, no leak).
        #[test]
        fn test_coordinator_every_parked_request_answered_once(ops in proptest::collection::vec(op(), 1..80)) {
            // Default settings: the initial rebalance delay is in play too.
            let (mut core, clock) = core_with(GroupSettings::default());
            let mut driver = Driver::default();
            let mut slots: BTreeMap<Token, u8> = BTreeMap::new();
            let mut joins = 0usize;
            for op in ops {
                match op {
                    Op::Join { slot, r#static, v4 } => {
                        joins += 1;
                        let member_id = driver.ids.get(&slot).map(|(id, _)| id.clone()).unwrap_or_default();
                        let instance = format!("instance-{slot}");
                        let mut request = join_request(&member_id, r#static.then_some(instance.as_str()), &["range"]);
                        request.require_known_member_id = v4;
                        let token = driver.token("join");
                        slots.insert(token, slot);
                        let effects = core.join(token, request);
                        driver.absorb(effects, &slots);
                    }
                    Op::Sync { slot } => {
                        let Some((member_id, generation)) = driver.ids.get(&slot).cloned() else { continue };
                        let assignments = driver.ids.values().map(|(id, _)| (id.clone(), Bytes::from_static(b"a"))).collect();
                        let token = driver.token("sync");
                        let effects = core.sync(token, sync_request(&member_id, generation, assignments));
                        driver.absorb(effects, &slots);
                    }
                    Op::Heartbeat { slot } => {
                        if let Some((member_id, generation)) = driver.ids.get(&slot).cloned() {
                            let _ = heartbeat(&mut core, &member_id, generation);
                        }
                    }
                    Op::Leave { slot } => {
                        if let Some((member_id, _)) = driver.ids.remove(&slot) {
                            let leaving = LeavingMember { member_id, group_instance_id: None };
                            let (_, effects) = core.leave("g", &[leaving]);
                            driver.absorb(effects, &slots);
                        }
                    }
                    Op::Advance { ms } => {
                        clock.advance_ms(i64::from(ms));
                        let effects = core.tick();
                        driver.absorb(effects, &slots);
                    }
                }
                if let Some(group) = core.describe("g") {
                    // A JoinGroup without a member id (before v4) admits a new member, as in
                    // Kafka, so a client that re-sends its join while the first is parked adds
                    // members; the bound is the joins, and session timeouts remove the extras.
                    prop_assert!(group.members.len() <= joins, "more members than joins");
                }
            }
            // Nobody heartbeats or syncs any more: every timeout fires.
            for _ in 0..10 {
                clock.advance_ms(i64::from(REBALANCE) + i64::from(SESSION));
                let effects = core.tick();
                driver.absorb(effects, &slots);
            }
            prop_assert!(driver.parked.is_empty(), "never answered: {:?}", driver.parked);
            prop_assert!(driver.answered.values().all(|n| *n == 1), "answered twice: {:?}", driver.answered);
            if let Some(group) = core.describe("g") {
                prop_assert!(group.members.is_empty(), "left behind: {:?}", group.members);
                prop_assert_eq!(group.state, GroupState::Empty);
            }
            prop_assert_eq!(core.next_deadline(), None);
        }
    }
}
