//! The sans-I/O coordinator: every request is a method call that returns at once, and answers to
//! parked JoinGroup/SyncGroup requests come back as [`Effects`] keyed by the caller's [`Token`].
//! Time comes from the injected clock; [`CoordinatorCore::tick`] applies session, pending-member
//! and rebalance timeouts, and [`CoordinatorCore::next_deadline`] says when to call it next.
//!
//! Memory is bounded: groups (`max_groups`, empty groups are evicted first), members per group
//! (`max_members_per_group`, counting members that were told MEMBER_ID_REQUIRED), protocols per
//! member and metadata/assignment bytes per member.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use weir_common::Clock;

use crate::group::Group;
use crate::types::{
    CommitIdentity, GroupDescription, GroupListing, GroupState, HeartbeatRequest, JoinRequest,
    JoinResponse, LeavingMember, MemberDescription, SyncRequest, SyncResponse, Token,
};
use crate::GroupError;

/// Limits of the coordinator. Kafka's defaults where Kafka has one.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// `group.min.session.timeout.ms`: shorter sessions detect failures faster but cost more
    /// heartbeats; below this a JoinGroup gets INVALID_SESSION_TIMEOUT.
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`: the longest a dead member can hold its partitions.
    pub max_session_timeout_ms: i32,
    /// `group.max.size`; Kafka's default is unbounded, ours bounds memory per group.
    pub max_members_per_group: usize,
    /// Groups held in memory; empty groups are evicted first when a new group needs room.
    pub max_groups: usize,
    /// Protocols one member may offer.
    pub max_protocols_per_member: usize,
    /// Bytes of protocol metadata (all protocols) or of one assignment per member.
    pub max_member_bytes: usize,
    /// `group.initial.rebalance.delay.ms`: the first rebalance of an empty group waits this long
    /// (at most the rebalance timeout) for more members. Longer means fewer rebalances when many
    /// consumers start together, but a later start for a lone consumer.
    pub initial_rebalance_delay_ms: i64,
}

impl Default for GroupSettings {
    fn default() -> Self {
        Self {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            max_members_per_group: 1_000,
            max_groups: 100_000,
            max_protocols_per_member: 64,
            max_member_bytes: 1024 * 1024,
            initial_rebalance_delay_ms: 3_000,
        }
    }
}

/// Answers to parked requests produced by one call.
#[derive(Debug, Default)]
pub struct Effects {
    pub joins: Vec<(Token, JoinResponse)>,
    pub syncs: Vec<(Token, SyncResponse)>,
}

#[derive(Debug)]
pub struct CoordinatorCore {
    settings: GroupSettings,
    clock: Arc<dyn Clock>,
    rng: fastrand::Rng,
    groups: BTreeMap<String, Group>,
}

impl CoordinatorCore {
    pub fn new(settings: GroupSettings, clock: Arc<dyn Clock>, seed: u64) -> Self {
        Self {
            settings,
            clock,
            rng: fastrand::Rng::with_seed(seed),
            groups: BTreeMap::new(),
        }
    }

    /// JoinGroup. The answer for `token` is in the returned effects now or in a later call's.
    pub fn join(&mut self, token: Token, request: JoinRequest) -> Effects {
        let mut effects = Effects::default();
        if let Err(error) = self.try_join(token, &request, &mut effects) {
            let member_id = request.member_id.clone();
            effects
                .joins
                .push((token, JoinResponse::failed(error, member_id)));
        }
        effects
    }

    fn try_join(
        &mut self,
        token: Token,
        request: &JoinRequest,
        effects: &mut Effects,
    ) -> Result<(), GroupError> {
        self.validate_join(request)?;
        let now_ms = self.clock.now_ms();
        self.make_room_for(&request.group_id)?;
        let new_member_id = self.new_member_id(&request.client_id);
        let settings = self.settings.clone();
        let initial_delay_ms = settings.initial_rebalance_delay_ms.max(0);
        let group = self
            .groups
            .entry(request.group_id.clone())
            .or_insert_with(|| Group::new(&request.group_id, initial_delay_ms));
        if group.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable(
                "the group is being deleted".into(),
            ));
        }
        if !group.accepts(
            &request.protocol_type,
            &request.protocols,
            &request.member_id,
        ) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if request.member_id.is_empty() {
            crate::join::join_new_member(
                group,
                &settings,
                token,
                request,
                new_member_id,
                now_ms,
                effects,
            )
        } else {
            crate::join::join_known_member(group, token, request, now_ms, effects)
        }
    }

    fn validate_join(&self, request: &JoinRequest) -> Result<(), GroupError> {
        if request.group_id.is_empty() {
            return Err(GroupError::InvalidGroupId(request.group_id.clone()));
        }
        let (min, max) = (
            self.settings.min_session_timeout_ms,
            self.settings.max_session_timeout_ms,
        );
        if !(min..=max).contains(&request.session_timeout_ms) {
            return Err(GroupError::InvalidSessionTimeout {
                got: request.session_timeout_ms,
                min,
                max,
            });
        }
        if request.protocols.len() > self.settings.max_protocols_per_member {
            return Err(GroupError::InvalidRequest(format!(
                "{} protocols offered, at most {} allowed",
                request.protocols.len(),
                self.settings.max_protocols_per_member
            )));
        }
        let metadata_bytes: usize = request
            .protocols
            .iter()
            .map(|p| p.metadata.len() + p.name.len())
            .sum();
        if metadata_bytes > self.settings.max_member_bytes {
            return Err(GroupError::InvalidRequest(format!(
                "{metadata_bytes} bytes of protocol metadata, at most {} allowed",
                self.settings.max_member_bytes
            )));
        }
        Ok(())
    }

    /// Ensures a new group fits under `max_groups`, evicting an empty group if needed.
    fn make_room_for(&mut self, group_id: &str) -> Result<(), GroupError> {
        if self.groups.contains_key(group_id) || self.groups.len() < self.settings.max_groups {
            return Ok(());
        }
        let evictable = self
            .groups
            .iter()
            .find(|(_, group)| group.state == GroupState::Empty && group.pending.is_empty())
            .map(|(id, _)| id.clone());
        match evictable {
            Some(id) => {
                self.groups.remove(&id);
                Ok(())
            }
            None => Err(GroupError::CoordinatorNotAvailable(format!(
                "coordinator holds its maximum of {} groups",
                self.settings.max_groups
            ))),
        }
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        let bytes: [u8; 16] = std::array::from_fn(|_| self.rng.u8(..));
        let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
        format!("{client_id}-{uuid}")
    }

    /// SyncGroup. The leader's assignments are stored unchanged and handed to each member.
    pub fn sync(&mut self, token: Token, request: SyncRequest) -> Effects {
        let mut effects = Effects::default();
        if let Err(error) = self.try_sync(token, request, &mut effects) {
            effects.syncs.push((token, SyncResponse::failed(error)));
        }
        effects
    }

    fn try_sync(
        &mut self,
        token: Token,
        request: SyncRequest,
        effects: &mut Effects,
    ) -> Result<(), GroupError> {
        let now_ms = self.clock.now_ms();
        let max_bytes = self.settings.max_member_bytes;
        let group = self.live_group_mut(&request.group_id, &request.member_id)?;
        group.check_member(&request.member_id, request.group_instance_id.as_deref())?;
        if request.generation_id != group.generation {
            return Err(GroupError::IllegalGeneration {
                current: group.generation,
                got: request.generation_id,
            });
        }
        let type_matches =
            request.protocol_type.is_none() || request.protocol_type == group.protocol_type;
        let name_matches =
            request.protocol_name.is_none() || request.protocol_name == group.protocol;
        if !type_matches || !name_matches {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        if let Some((member_id, _)) = request
            .assignments
            .iter()
            .find(|(_, a)| a.len() > max_bytes)
        {
            return Err(GroupError::InvalidRequest(format!(
                "assignment of {member_id} is larger than {max_bytes} bytes"
            )));
        }
        match group.state {
            GroupState::Empty | GroupState::Dead => {
                Err(GroupError::UnknownMemberId(request.member_id.clone()))
            }
            GroupState::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            GroupState::Stable => {
                let member = group.member_mut(&request.member_id)?;
                member.renew_session(now_ms);
                effects
                    .syncs
                    .push((token, sync_answer(group, &request.member_id)));
                Ok(())
            }
            GroupState::CompletingRebalance => {
                let member = group.member_mut(&request.member_id)?;
                member.renew_session(now_ms);
                if let Some(previous) = member.sync_waiter.replace(token) {
                    effects.syncs.push((
                        previous,
                        SyncResponse::failed(GroupError::RebalanceInProgress),
                    ));
                }
                if group.is_leader(&request.member_id) {
                    install_assignment(group, request.assignments, effects);
                }
                Ok(())
            }
        }
    }

    /// Heartbeat: renews the session; tells members of a rebalance.
    pub fn heartbeat(&mut self, request: &HeartbeatRequest) -> Result<(), GroupError> {
        let now_ms = self.clock.now_ms();
        let group = self.live_group_mut(&request.group_id, &request.member_id)?;
        group.check_member(&request.member_id, request.group_instance_id.as_deref())?;
        if group.state == GroupState::Empty {
            return Err(GroupError::UnknownMemberId(request.member_id.clone()));
        }
        if request.generation_id != group.generation {
            return Err(GroupError::IllegalGeneration {
                current: group.generation,
                got: request.generation_id,
            });
        }
        let member = group.member_mut(&request.member_id)?;
        member.renew_session(now_ms);
        if group.state == GroupState::PreparingRebalance {
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(())
    }

    /// LeaveGroup: one result per leaving member (by member id, or by instance id alone).
    pub fn leave(
        &mut self,
        group_id: &str,
        leaving: &[LeavingMember],
    ) -> (Vec<Result<(), GroupError>>, Effects) {
        let mut effects = Effects::default();
        let now_ms = self.clock.now_ms();
        let Some(group) = self.groups.get_mut(group_id) else {
            let results = leaving
                .iter()
                .map(|m| Err(GroupError::UnknownMemberId(m.member_id.clone())))
                .collect();
            return (results, effects);
        };
        if group.state == GroupState::Dead {
            let error = GroupError::CoordinatorNotAvailable("the group is being deleted".into());
            return (vec![Err(error); leaving.len()], effects);
        }
        let mut removed_any = false;
        let results = leaving
            .iter()
            .map(|member| {
                let member_id = resolve_leaving(group, member)?;
                if group.pending.remove(&member_id).is_some() {
                    removed_any = true;
                    return Ok(());
                }
                let error = GroupError::UnknownMemberId(member_id.clone());
                group.remove_member(&member_id, &error, &mut effects);
                removed_any = true;
                Ok(())
            })
            .collect();
        if removed_any {
            group.on_members_removed(now_ms, &mut effects);
        }
        (results, effects)
    }

    /// Applies every timeout that is due: pending members that never rejoined, members whose
    /// session expired, and rebalances whose deadline passed (members that did not rejoin are
    /// removed and the rest continue).
    pub fn tick(&mut self) -> Effects {
        let mut effects = Effects::default();
        let now_ms = self.clock.now_ms();
        for group in self.groups.values_mut() {
            let pending_before = group.pending.len();
            group.pending.retain(|_, deadline| *deadline > now_ms);
            let expired: Vec<String> = group
                .members
                .values()
                .filter(|member| !member.is_waiting() && member.session_deadline_ms <= now_ms)
                .map(|member| member.member_id.clone())
                .collect();
            for member_id in &expired {
                tracing::info!(group = %group.group_id, member = %member_id, "session expired");
                let error = GroupError::UnknownMemberId(member_id.clone());
                group.remove_member(member_id, &error, &mut effects);
            }
            if !expired.is_empty() || group.pending.len() != pending_before {
                group.on_members_removed(now_ms, &mut effects);
            }
            if group
                .initial_delay_until_ms
                .is_some_and(|until| until <= now_ms)
            {
                group.initial_delay_until_ms = None;
                group.maybe_complete_join(now_ms, &mut effects);
            }
            let rebalance_due = group.rebalance_deadline_ms.is_some_and(|at| at <= now_ms);
            if group.state == GroupState::PreparingRebalance && rebalance_due {
                group.complete_join(now_ms, &mut effects);
            }
        }
        effects
    }

    /// When `tick` next has work, if ever.
    pub fn next_deadline(&self) -> Option<i64> {
        self.groups.values().filter_map(Group::next_deadline).min()
    }

    /// Validates an OffsetCommit's identity against the group (Kafka's rules: a commit with a
    /// negative generation is a "simple" commit, allowed while the group has no members).
    /// A valid member's session is renewed.
    pub fn validate_commit(&mut self, identity: &CommitIdentity) -> Result<(), GroupError> {
        let now_ms = self.clock.now_ms();
        let Some(group) = self.groups.get_mut(&identity.group_id) else {
            return if identity.generation_id < 0 {
                Ok(())
            } else {
                Err(GroupError::IllegalGeneration {
                    current: -1,
                    got: identity.generation_id,
                })
            };
        };
        match group.state {
            GroupState::Dead => Err(GroupError::CoordinatorNotAvailable(
                "the group is being deleted".into(),
            )),
            GroupState::Empty if identity.generation_id < 0 => Ok(()),
            _ => {
                group.check_member(&identity.member_id, identity.group_instance_id.as_deref())?;
                if identity.generation_id != group.generation {
                    return Err(GroupError::IllegalGeneration {
                        current: group.generation,
                        got: identity.generation_id,
                    });
                }
                if group.state == GroupState::CompletingRebalance {
                    return Err(GroupError::RebalanceInProgress);
                }
                if let Some(member) = group.members.get_mut(&identity.member_id) {
                    member.renew_session(now_ms);
                }
                Ok(())
            }
        }
    }

    pub fn list(&self) -> Vec<GroupListing> {
        self.groups
            .values()
            .filter(|group| group.state != GroupState::Dead)
            .map(|group| GroupListing {
                group_id: group.group_id.clone(),
                protocol_type: group.protocol_type.clone().unwrap_or_default(),
                state: group.state,
            })
            .collect()
    }

    /// The group as DescribeGroups shows it; `None` if the coordinator does not know it.
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let group = self.groups.get(group_id)?;
        let protocol = group.protocol.clone().unwrap_or_default();
        let members = group
            .join_order
            .iter()
            .filter_map(|id| group.members.get(id))
            .map(|member| MemberDescription {
                member_id: member.member_id.clone(),
                group_instance_id: member.group_instance_id.clone(),
                client_id: member.client_id.clone(),
                client_host: member.client_host.clone(),
                metadata: member.metadata_for(&protocol),
                assignment: if group.state == GroupState::Stable {
                    member.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect();
        Some(GroupDescription {
            group_id: group.group_id.clone(),
            state: group.state,
            protocol_type: group.protocol_type.clone().unwrap_or_default(),
            protocol: if group.state == GroupState::Stable
                || group.state == GroupState::CompletingRebalance
            {
                protocol
            } else {
                String::new()
            },
            members,
        })
    }

    /// First step of DeleteGroups: an empty (or unknown) group is marked Dead so no member can
    /// join while its offsets are deleted; returns whether the coordinator knew the group.
    pub fn begin_delete(&mut self, group_id: &str) -> Result<bool, GroupError> {
        let Some(group) = self.groups.get_mut(group_id) else {
            return Ok(false);
        };
        match group.state {
            GroupState::Empty if group.pending.is_empty() => {
                group.state = GroupState::Dead;
                Ok(true)
            }
            GroupState::Dead => Err(GroupError::CoordinatorNotAvailable(
                "the group is being deleted".into(),
            )),
            _ => Err(GroupError::NonEmptyGroup(group_id.to_string())),
        }
    }

    /// Forgets a group this agent no longer coordinates (another agent took it, RFC 0002 §7):
    /// its parked requests are answered NOT_COORDINATOR, so its members look for the new
    /// coordinator, and a later return of the group starts from an empty group.
    pub fn unload(&mut self, group_id: &str) -> Effects {
        let mut effects = Effects::default();
        if let Some(mut group) = self.groups.remove(group_id) {
            let error =
                GroupError::NotCoordinator(format!("group {group_id} moved to another agent"));
            let members: Vec<String> = group.members.keys().cloned().collect();
            for member in members {
                group.remove_member(&member, &error, &mut effects);
            }
        }
        effects
    }

    /// Last step of DeleteGroups: forgets the group.
    pub fn finish_delete(&mut self, group_id: &str) {
        if self
            .groups
            .get(group_id)
            .is_some_and(|group| group.state == GroupState::Dead)
        {
            self.groups.remove(group_id);
        }
    }

    /// For OffsetDelete: `Ok(None)` if the group has no members (every offset may go),
    /// `Ok(Some(topics))` for the topics its members subscribe to (those offsets must stay).
    /// A subscription that cannot be read protects every topic (`Err(NonEmptyGroup)`).
    pub fn offset_delete_guard(
        &self,
        group_id: &str,
    ) -> Result<Option<std::collections::BTreeSet<String>>, GroupError> {
        let Some(group) = self.groups.get(group_id) else {
            return Ok(None);
        };
        match group.state {
            GroupState::Empty => Ok(None),
            GroupState::Dead => Err(GroupError::CoordinatorNotAvailable(
                "the group is being deleted".into(),
            )),
            _ if group.protocol_type.as_deref() == Some("consumer") => group
                .subscribed_topics()
                .map(Some)
                .ok_or_else(|| GroupError::NonEmptyGroup(group_id.to_string())),
            _ => Err(GroupError::NonEmptyGroup(group_id.to_string())),
        }
    }

    /// The group for a request from `member_id`: unknown groups mean an unknown member.
    fn live_group_mut(
        &mut self,
        group_id: &str,
        member_id: &str,
    ) -> Result<&mut Group, GroupError> {
        let group = self
            .groups
            .get_mut(group_id)
            .ok_or_else(|| GroupError::UnknownMemberId(member_id.to_string()))?;
        if group.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable(
                "the group is being deleted".into(),
            ));
        }
        Ok(group)
    }
}

fn resolve_leaving(group: &Group, member: &LeavingMember) -> Result<String, GroupError> {
    match (&member.group_instance_id, member.member_id.is_empty()) {
        (Some(instance), true) => group
            .instances
            .get(instance)
            .cloned()
            .ok_or_else(|| GroupError::UnknownMemberId(String::new())),
        (Some(instance), false) => {
            if group.pending.contains_key(&member.member_id) {
                return Ok(member.member_id.clone());
            }
            group.check_member(&member.member_id, Some(instance))?;
            Ok(member.member_id.clone())
        }
        (None, _) => {
            if group.pending.contains_key(&member.member_id)
                || group.members.contains_key(&member.member_id)
            {
                Ok(member.member_id.clone())
            } else {
                Err(GroupError::UnknownMemberId(member.member_id.clone()))
            }
        }
    }
}

fn sync_answer(group: &Group, member_id: &str) -> SyncResponse {
    SyncResponse {
        error: None,
        protocol_type: group.protocol_type.clone(),
        protocol_name: group.protocol.clone(),
        assignment: group
            .members
            .get(member_id)
            .map(|member| member.assignment.clone())
            .unwrap_or_default(),
    }
}

/// The leader's SyncGroup: store every member's assignment (members it left out get an empty
/// one), become Stable and answer every parked SyncGroup.
fn install_assignment(group: &mut Group, assignments: Vec<(String, Bytes)>, effects: &mut Effects) {
    let mut by_member: BTreeMap<String, Bytes> = assignments.into_iter().collect();
    for member in group.members.values_mut() {
        member.assignment = by_member.remove(&member.member_id).unwrap_or_default();
    }
    group.state = GroupState::Stable;
    let waiting: Vec<(String, Token)> = group
        .members
        .values_mut()
        .filter_map(|member| Some((member.member_id.clone(), member.sync_waiter.take()?)))
        .collect();
    for (member_id, token) in waiting {
        effects.syncs.push((token, sync_answer(group, &member_id)));
    }
}

#[cfg(test)]
mod tests;
