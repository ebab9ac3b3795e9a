//! Which agent a key belongs to: rendezvous hashing of the key over the live agents. Group
//! coordinators (the group id) and the partition leaders Metadata names use it.
//!
//! Every agent computes the same answer from the same agent list, and when an agent joins or
//! leaves only the keys it gains or loses move. With one agent it is always that agent.

/// The coordinator of `group_id` among `live_agents` (node ids), or `None` with no live agent.
pub fn coordinator_for(group_id: &str, live_agents: &[i32]) -> Option<i32> {
    place(group_id.as_bytes(), live_agents)
}

/// The agent of `key` among `agents`: the one of highest weight.
pub fn place(key: &[u8], agents: &[i32]) -> Option<i32> {
    agents
        .iter()
        .copied()
        .max_by_key(|agent| (weight(key, *agent), *agent))
}

/// Whether `agent` would take `key` from `from` (it weighs more for the key): an agent that
/// joins takes exactly the keys it outranks their current agent for.
pub fn outranks(key: &[u8], agent: i32, from: i32) -> bool {
    (weight(key, agent), agent) > (weight(key, from), from)
}

/// FNV-1a over the group id and the agent id: stable across processes and releases (unlike
/// `std`'s hasher, which is only stable within one build).
fn weight(key: &[u8], agent: i32) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for byte in key.iter().copied().chain(agent.to_be_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    // Final avalanche so that nearby agent ids do not produce correlated weights.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_placement_single_agent_is_always_chosen() {
        assert_eq!(coordinator_for("g", &[7]), Some(7));
        assert_eq!(coordinator_for("", &[7]), Some(7));
        assert_eq!(coordinator_for("g", &[]), None);
    }

    #[test]
    fn test_placement_is_order_independent_and_moves_little() {
        let agents = [1, 2, 3, 4];
        let reversed = [4, 3, 2, 1];
        let mut moved = 0;
        for n in 0..1000 {
            let group = format!("group-{n}");
            let before = coordinator_for(&group, &agents).unwrap();
            assert_eq!(before, coordinator_for(&group, &reversed).unwrap());
            let after = coordinator_for(&group, &[1, 2, 3]).unwrap();
            if before != 4 {
                assert_eq!(before, after, "only groups of the removed agent move");
            } else {
                moved += 1;
            }
        }
        assert!(
            moved > 100 && moved < 400,
            "roughly a quarter on agent 4: {moved}"
        );
    }
}
