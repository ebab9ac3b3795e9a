use super::*;

fn agent(node_id: i32, incarnation: &str, port: i32) -> AgentRegistration {
    AgentRegistration {
        node_id,
        incarnation: incarnation.into(),
        zone: "z1".into(),
        host: "127.0.0.1".into(),
        port,
        control_address: format!("127.0.0.1:{}", port + 1000),
        at_ms: 1,
    }
}

fn stamp(node_id: i32, incarnation: &str, since: u64) -> CoordinatorStamp {
    CoordinatorStamp {
        node_id,
        incarnation: incarnation.into(),
        since,
    }
}

#[test]
fn test_registry_one_live_agent_per_node_id() {
    let mut registry = Registry::default();
    assert_eq!(registry.register(&agent(1, "a", 9001)), Ok(1));
    // The same incarnation again changes nothing; a new address is a change.
    assert_eq!(registry.register(&agent(1, "a", 9001)), Ok(1));
    assert_eq!(registry.register(&agent(1, "a", 9005)), Ok(2));
    assert_eq!(
        registry.register(&agent(1, "b", 9002)),
        Err(ControlError::NodeIdTaken {
            node_id: 1,
            address: "127.0.0.1:9005".into()
        })
    );
    // Fencing another incarnation does nothing; fencing the live one frees the node id.
    assert!(!registry.fence(1, "b"));
    assert!(registry.fence(1, "a"));
    assert!(!registry.fence(1, "a"));
    assert_eq!(registry.register(&agent(1, "b", 9002)), Ok(4));
    assert_eq!(registry.agents[&1].incarnation, "b");
    assert_eq!(registry.agents[&1].since, 4);
}

#[test]
fn test_registry_coordinator_fence_refuses_a_coordinator_that_lost_the_group() {
    let mut registry = Registry::default();
    registry.register(&agent(1, "a", 9001)).unwrap();
    let since = registry.version;
    let group = (0..)
        .map(|n| format!("group-{n}"))
        .find(|group| outranks(group.as_bytes(), 2, 1))
        .unwrap();
    assert_eq!(
        registry.check_coordinator(&group, &stamp(1, "a", since)),
        Ok(())
    );
    // Not the incarnation, not the coordinator, a version from the future: refused.
    assert!(registry
        .check_coordinator(&group, &stamp(1, "x", since))
        .is_err());
    assert!(registry
        .check_coordinator(&group, &stamp(2, "a", since))
        .is_err());
    assert!(registry
        .check_coordinator(&group, &stamp(1, "a", since + 1))
        .is_err());

    // Agent 2 joins and takes the group; when it is fenced the group comes back to 1, but a
    // commit stamped before that is refused: its coordinator missed 2's generations.
    registry.register(&agent(2, "b", 9002)).unwrap();
    assert!(registry
        .check_coordinator(&group, &stamp(1, "a", since))
        .is_err());
    assert_eq!(
        registry.check_coordinator(&group, &stamp(2, "b", since + 1)),
        Ok(())
    );
    registry.fence(2, "b");
    assert!(registry
        .check_coordinator(&group, &stamp(1, "a", since))
        .is_err());
    assert_eq!(
        registry.check_coordinator(&group, &stamp(1, "a", registry.version)),
        Ok(())
    );

    // An agent that does not outrank 1 for the group does not move it.
    let since = registry.version;
    let other = (3..)
        .find(|node| !outranks(group.as_bytes(), *node, 1))
        .unwrap();
    registry.register(&agent(other, "c", 9003)).unwrap();
    assert_eq!(
        registry.check_coordinator(&group, &stamp(1, "a", since)),
        Ok(())
    );
}

#[test]
fn test_registry_history_bounds_how_old_a_stamp_may_be() {
    let mut registry = Registry::default();
    registry.register(&agent(1, "a", 9001)).unwrap();
    let since = registry.version;
    // Changes that concern only agent 1's neighbours: a low node never outranks for every
    // group, so pick one that does not outrank 1 for "g".
    let other = (2..).find(|node| !outranks(b"g", *node, 1)).unwrap();
    for n in 0..CHANGES_KEPT as u64 {
        let incarnation = format!("i{n}");
        registry
            .register(&agent(other, &incarnation, 9002))
            .unwrap();
        registry.fence(other, &incarnation);
        if registry.version - since <= CHANGES_KEPT as u64 {
            assert_eq!(
                registry.check_coordinator("g", &stamp(1, "a", since)),
                Ok(())
            );
        }
    }
    assert_eq!(registry.changes.len(), CHANGES_KEPT);
    assert!(
        registry.moved_since("g", 1, since),
        "older than the history"
    );
}
