//! JoinGroup paths: a new member (dynamic, MEMBER_ID_REQUIRED, or a static member taking over its
//! instance id), a pending member coming back with its id, and a known member rejoining.

use bytes::Bytes;

use crate::core::{Effects, GroupSettings};
use crate::group::{Group, Member};
use crate::types::{GroupState, JoinRequest, JoinResponse, Token};
use crate::GroupError;

fn new_member(request: &JoinRequest, member_id: String, token: Token, now_ms: i64) -> Member {
    Member {
        member_id,
        group_instance_id: request.group_instance_id.clone(),
        client_id: request.client_id.clone(),
        client_host: request.client_host.clone(),
        session_timeout_ms: i64::from(request.session_timeout_ms),
        rebalance_timeout_ms: i64::from(request.rebalance_timeout_ms.max(0)),
        protocols: request.protocols.clone(),
        assignment: Bytes::new(),
        join_waiter: Some(token),
        sync_waiter: None,
        session_deadline_ms: now_ms.saturating_add(i64::from(request.session_timeout_ms)),
    }
}

pub(crate) fn join_new_member(
    group: &mut Group,
    settings: &GroupSettings,
    token: Token,
    request: &JoinRequest,
    member_id: String,
    now_ms: i64,
    effects: &mut Effects,
) -> Result<(), GroupError> {
    if let Some(instance) = &request.group_instance_id {
        if let Some(old_member_id) = group.instances.get(instance).cloned() {
            return crate::static_member::replace(
                group,
                token,
                request,
                &old_member_id,
                member_id,
                now_ms,
                effects,
            );
        }
    }
    if group.size() >= settings.max_members_per_group {
        return Err(GroupError::GroupMaxSizeReached(
            settings.max_members_per_group,
        ));
    }
    if request.require_known_member_id && request.group_instance_id.is_none() {
        // KIP-394: the member must come back with this id, so a client that retries a join
        // whose response it lost does not leave a ghost member behind.
        let deadline = now_ms.saturating_add(i64::from(request.session_timeout_ms));
        group.pending.insert(member_id.clone(), deadline);
        effects.joins.push((
            token,
            JoinResponse::failed(GroupError::MemberIdRequired, member_id),
        ));
        return Ok(());
    }
    add_and_rebalance(group, request, member_id, token, now_ms, effects);
    Ok(())
}

fn add_and_rebalance(
    group: &mut Group,
    request: &JoinRequest,
    member_id: String,
    token: Token,
    now_ms: i64,
    effects: &mut Effects,
) {
    if group.members.is_empty() {
        group.protocol_type = Some(request.protocol_type.clone());
    }
    group.add_member(new_member(request, member_id, token, now_ms));
    if group.state != GroupState::PreparingRebalance {
        group.prepare_rebalance(now_ms, effects);
    }
    group.maybe_complete_join(now_ms, effects);
}

pub(crate) fn join_known_member(
    group: &mut Group,
    token: Token,
    request: &JoinRequest,
    now_ms: i64,
    effects: &mut Effects,
) -> Result<(), GroupError> {
    let member_id = request.member_id.clone();
    if group.pending.remove(&member_id).is_some() {
        add_and_rebalance(group, request, member_id, token, now_ms, effects);
        return Ok(());
    }
    group.check_member(&member_id, request.group_instance_id.as_deref())?;
    let is_leader = group.is_leader(&member_id);
    let state = group.state;
    let member = group.member_mut(&member_id)?;
    let unchanged = member.protocols == request.protocols;
    match state {
        GroupState::Empty | GroupState::Dead => Err(GroupError::UnknownMemberId(member_id)),
        GroupState::PreparingRebalance => {
            update_member(member, request, token, now_ms, effects);
            group.maybe_complete_join(now_ms, effects);
            Ok(())
        }
        GroupState::CompletingRebalance | GroupState::Stable
            if unchanged && (state == GroupState::CompletingRebalance || !is_leader) =>
        {
            member.renew_session(now_ms);
            effects
                .joins
                .push((token, group.current_join(&member_id, false)));
            Ok(())
        }
        GroupState::CompletingRebalance | GroupState::Stable => {
            update_member(member, request, token, now_ms, effects);
            group.prepare_rebalance(now_ms, effects);
            group.maybe_complete_join(now_ms, effects);
            Ok(())
        }
    }
}

/// A known member rejoins: new protocols and timeouts, and its JoinGroup is parked.
pub(crate) fn update_member(
    member: &mut Member,
    request: &JoinRequest,
    token: Token,
    now_ms: i64,
    effects: &mut Effects,
) {
    member.protocols = request.protocols.clone();
    member.client_id = request.client_id.clone();
    member.client_host = request.client_host.clone();
    member.session_timeout_ms = i64::from(request.session_timeout_ms);
    member.rebalance_timeout_ms = i64::from(request.rebalance_timeout_ms.max(0));
    member.renew_session(now_ms);
    if let Some(previous) = member.join_waiter.replace(token) {
        // A retried JoinGroup replaces the parked one.
        effects.joins.push((
            previous,
            JoinResponse::failed(GroupError::RebalanceInProgress, member.member_id.clone()),
        ));
    }
}
