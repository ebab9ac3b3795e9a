//! KIP-345 static membership: a member that rejoins with a known `group.instance.id` and an
//! empty member id takes over the old member's place under a new member id. The old id is fenced
//! (FENCED_INSTANCE_ID). In a Stable group whose protocol choice does not change, the member gets
//! its previous assignment back without a rebalance of the others.

use crate::core::Effects;
use crate::group::Group;
use crate::types::{GroupState, JoinRequest, JoinResponse, SyncResponse, Token};
use crate::GroupError;

pub(crate) fn replace(
    group: &mut Group,
    token: Token,
    request: &JoinRequest,
    old_member_id: &str,
    new_member_id: String,
    now_ms: i64,
    effects: &mut Effects,
) -> Result<(), GroupError> {
    let instance = request.group_instance_id.clone().unwrap_or_default();
    let Some(mut member) = group.members.remove(old_member_id) else {
        return Err(GroupError::UnknownMemberId(old_member_id.to_string()));
    };
    let fenced = GroupError::FencedInstanceId(instance.clone());
    if let Some(previous) = member.join_waiter.take() {
        effects.joins.push((
            previous,
            JoinResponse::failed(fenced.clone(), old_member_id.to_string()),
        ));
    }
    if let Some(previous) = member.sync_waiter.take() {
        effects.syncs.push((previous, SyncResponse::failed(fenced)));
    }
    member.protocols = request.protocols.clone();
    member.member_id = new_member_id.clone();
    member.client_id = request.client_id.clone();
    member.client_host = request.client_host.clone();
    member.session_timeout_ms = i64::from(request.session_timeout_ms);
    member.rebalance_timeout_ms = i64::from(request.rebalance_timeout_ms.max(0));
    member.renew_session(now_ms);
    for id in &mut group.join_order {
        if id == old_member_id {
            *id = new_member_id.clone();
        }
    }
    if group.is_leader(old_member_id) {
        group.leader = Some(new_member_id.clone());
    }
    group.instances.insert(instance, new_member_id.clone());
    group.members.insert(new_member_id.clone(), member);
    let protocol_kept = group.select_protocol() == group.protocol;
    match group.state {
        GroupState::Stable if protocol_kept => {
            let response = group.current_join(&new_member_id, request.supports_skip_assignment);
            effects.joins.push((token, response));
        }
        GroupState::PreparingRebalance => {
            park_join(group, &new_member_id, token);
            group.maybe_complete_join(now_ms, effects);
        }
        _ => {
            // CompletingRebalance: the old id may already be in the leader's assignment, so a
            // new rebalance is needed; Stable with a changed protocol choice likewise.
            park_join(group, &new_member_id, token);
            group.prepare_rebalance(now_ms, effects);
            group.maybe_complete_join(now_ms, effects);
        }
    }
    Ok(())
}

fn park_join(group: &mut Group, member_id: &str, token: Token) {
    if let Some(member) = group.members.get_mut(member_id) {
        member.join_waiter = Some(token);
    }
}
