//! One group's membership and the rebalance transitions shared by every request: prepare a
//! rebalance, complete the join phase (new generation, protocol vote, leader), remove a member.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::core::Effects;
use crate::types::{GroupState, JoinResponse, JoinedMember, Protocol, SyncResponse, Token};
use crate::GroupError;

#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) session_timeout_ms: i64,
    pub(crate) rebalance_timeout_ms: i64,
    pub(crate) protocols: Vec<Protocol>,
    pub(crate) assignment: Bytes,
    /// A parked JoinGroup; while set, the member is kept alive (it is waiting on us).
    pub(crate) join_waiter: Option<Token>,
    /// A parked SyncGroup; while set, the member is kept alive.
    pub(crate) sync_waiter: Option<Token>,
    pub(crate) session_deadline_ms: i64,
}

impl Member {
    pub(crate) fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|candidate| candidate.name == protocol)
            .map(|candidate| candidate.metadata.clone())
            .unwrap_or_default()
    }

    pub(crate) fn is_waiting(&self) -> bool {
        self.join_waiter.is_some() || self.sync_waiter.is_some()
    }

    pub(crate) fn renew_session(&mut self, now_ms: i64) {
        self.session_deadline_ms = now_ms.saturating_add(self.session_timeout_ms);
    }
}

#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) group_id: String,
    pub(crate) state: GroupState,
    pub(crate) generation: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol: Option<String>,
    pub(crate) leader: Option<String>,
    /// Members in join order (the first member to join becomes leader when one is needed).
    pub(crate) members: BTreeMap<String, Member>,
    pub(crate) join_order: Vec<String>,
    /// group.instance.id → member id of the static member currently holding it.
    pub(crate) instances: BTreeMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with the deadline to rejoin.
    pub(crate) pending: BTreeMap<String, i64>,
    pub(crate) rebalance_deadline_ms: Option<i64>,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group waits
    /// for more members, so consumers starting together do not rebalance once per member.
    pub(crate) initial_delay_ms: i64,
    /// While set, the join phase does not complete before this instant.
    pub(crate) initial_delay_until_ms: Option<i64>,
}

impl Group {
    pub(crate) fn new(group_id: &str, initial_delay_ms: i64) -> Self {
        Self {
            group_id: group_id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            join_order: Vec::new(),
            instances: BTreeMap::new(),
            pending: BTreeMap::new(),
            rebalance_deadline_ms: None,
            initial_delay_ms,
            initial_delay_until_ms: None,
        }
    }

    /// A member that `check_member` accepted; an unknown id is an error, never a panic.
    pub(crate) fn member_mut(&mut self, member_id: &str) -> Result<&mut Member, GroupError> {
        self.members
            .get_mut(member_id)
            .ok_or_else(|| GroupError::UnknownMemberId(member_id.to_string()))
    }

    pub(crate) fn size(&self) -> usize {
        self.members.len() + self.pending.len()
    }

    pub(crate) fn is_leader(&self, member_id: &str) -> bool {
        self.leader.as_deref() == Some(member_id)
    }

    /// Whether a member with these protocols may be in the group, leaving out `except` (the
    /// member's own previous protocols when it rejoins).
    pub(crate) fn accepts(
        &self,
        protocol_type: &str,
        protocols: &[Protocol],
        except: &str,
    ) -> bool {
        if protocol_type.is_empty() || protocols.is_empty() {
            return false;
        }
        let others: Vec<&Member> = self
            .members
            .values()
            .filter(|member| member.member_id != except)
            .collect();
        if others.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|candidate| {
            others
                .iter()
                .all(|member| member.protocols.iter().any(|p| p.name == candidate.name))
        })
    }

    /// Kafka's vote: among protocols every member supports, each member votes for the first of
    /// them in its own preference order; most votes wins (ties: the first in the first member's
    /// order).
    pub(crate) fn select_protocol(&self) -> Option<String> {
        let first = self
            .join_order
            .first()
            .and_then(|id| self.members.get(id))?;
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| {
                self.members
                    .values()
                    .all(|member| member.protocols.iter().any(|p| p.name == *name))
            })
            .collect();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for member in self.members.values() {
            if let Some(choice) = member
                .protocols
                .iter()
                .map(|p| p.name.as_str())
                .find(|name| candidates.contains(name))
            {
                *votes.entry(choice).or_default() += 1;
            }
        }
        let best = votes.values().copied().max()?;
        candidates
            .into_iter()
            .find(|name| votes.get(name) == Some(&best))
            .map(str::to_string)
    }

    pub(crate) fn add_member(&mut self, member: Member) {
        if let Some(instance) = &member.group_instance_id {
            self.instances
                .insert(instance.clone(), member.member_id.clone());
        }
        self.join_order.push(member.member_id.clone());
        self.members.insert(member.member_id.clone(), member);
    }

    /// Removes a member; its parked requests fail with `error`.
    pub(crate) fn remove_member(
        &mut self,
        member_id: &str,
        error: &GroupError,
        effects: &mut Effects,
    ) {
        let Some(member) = self.members.remove(member_id) else {
            return;
        };
        self.join_order.retain(|id| id != member_id);
        if let Some(instance) = &member.group_instance_id {
            if self.instances.get(instance).map(String::as_str) == Some(member_id) {
                self.instances.remove(instance);
            }
        }
        if let Some(token) = member.join_waiter {
            effects.joins.push((
                token,
                JoinResponse::failed(error.clone(), member.member_id.clone()),
            ));
        }
        if let Some(token) = member.sync_waiter {
            effects
                .syncs
                .push((token, SyncResponse::failed(error.clone())));
        }
        if self.is_leader(member_id) {
            self.leader = None;
        }
    }

    /// Moves to PreparingRebalance: members must rejoin within the largest rebalance timeout.
    pub(crate) fn prepare_rebalance(&mut self, now_ms: i64, effects: &mut Effects) {
        for member in self.members.values_mut() {
            if let Some(token) = member.sync_waiter.take() {
                effects
                    .syncs
                    .push((token, SyncResponse::failed(GroupError::RebalanceInProgress)));
            }
        }
        let timeout = self
            .members
            .values()
            .map(|member| member.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        if self.state == GroupState::Empty && self.initial_delay_ms > 0 {
            let delay = self.initial_delay_ms.min(timeout);
            self.initial_delay_until_ms = Some(now_ms.saturating_add(delay));
        }
        self.state = GroupState::PreparingRebalance;
        self.rebalance_deadline_ms = Some(now_ms.saturating_add(timeout));
    }

    /// Completes the join phase once every member has rejoined and no new member is pending.
    pub(crate) fn maybe_complete_join(&mut self, now_ms: i64, effects: &mut Effects) {
        let all_joined = self
            .members
            .values()
            .all(|member| member.join_waiter.is_some());
        let delay_over = self
            .initial_delay_until_ms
            .is_none_or(|until| now_ms >= until);
        if self.state == GroupState::PreparingRebalance
            && all_joined
            && self.pending.is_empty()
            && delay_over
        {
            self.complete_join(now_ms, effects);
        }
    }

    /// Ends the join phase: members that did not rejoin are removed, the generation advances,
    /// a protocol and a leader are chosen and every parked JoinGroup is answered.
    pub(crate) fn complete_join(&mut self, now_ms: i64, effects: &mut Effects) {
        let laggards: Vec<String> = self
            .members
            .values()
            .filter(|member| member.join_waiter.is_none())
            .map(|member| member.member_id.clone())
            .collect();
        for member_id in &laggards {
            let error = GroupError::UnknownMemberId(member_id.clone());
            self.remove_member(member_id, &error, effects);
        }
        self.rebalance_deadline_ms = None;
        self.initial_delay_until_ms = None;
        self.generation = self.generation.wrapping_add(1).max(1);
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            return;
        }
        self.protocol = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|id| !self.members.contains_key(id))
        {
            self.leader = self.join_order.first().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        let leader_view = self.member_metadata();
        for member in self.members.values_mut() {
            member.renew_session(now_ms);
            let Some(token) = member.join_waiter.take() else {
                continue;
            };
            let is_leader = self.leader.as_deref() == Some(member.member_id.as_str());
            effects.joins.push((
                token,
                JoinResponse {
                    error: None,
                    generation_id: self.generation,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol.clone(),
                    leader: self.leader.clone().unwrap_or_default(),
                    member_id: member.member_id.clone(),
                    members: if is_leader {
                        leader_view.clone()
                    } else {
                        Vec::new()
                    },
                    skip_assignment: false,
                },
            ));
        }
    }

    /// Every member with its metadata for the selected protocol, in join order.
    pub(crate) fn member_metadata(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol.clone().unwrap_or_default();
        self.join_order
            .iter()
            .filter_map(|id| self.members.get(id))
            .map(|member| JoinedMember {
                member_id: member.member_id.clone(),
                group_instance_id: member.group_instance_id.clone(),
                metadata: member.metadata_for(&protocol),
            })
            .collect()
    }

    /// The JoinGroup answer for a member of the current generation (a retried or unchanged join).
    pub(crate) fn current_join(&self, member_id: &str, skip_assignment: bool) -> JoinResponse {
        let is_leader = self.is_leader(member_id);
        JoinResponse {
            error: None,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if is_leader && (skip_assignment || self.state != GroupState::Stable) {
                self.member_metadata()
            } else {
                Vec::new()
            },
            skip_assignment: is_leader && skip_assignment,
        }
    }

    /// After members left or expired: rebalance the rest, or finish a rebalance in progress.
    pub(crate) fn on_members_removed(&mut self, now_ms: i64, effects: &mut Effects) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now_ms, effects);
                self.maybe_complete_join(now_ms, effects);
            }
            GroupState::PreparingRebalance => self.maybe_complete_join(now_ms, effects),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Checks that `member_id` (with `instance`) is the current holder of its identity.
    pub(crate) fn check_member(
        &self,
        member_id: &str,
        instance: Option<&str>,
    ) -> Result<(), GroupError> {
        if let Some(instance) = instance {
            match self.instances.get(instance) {
                Some(holder) if holder == member_id => return Ok(()),
                Some(_) => return Err(GroupError::FencedInstanceId(instance.to_string())),
                None => {}
            }
        }
        if self.members.contains_key(member_id) {
            Ok(())
        } else {
            Err(GroupError::UnknownMemberId(member_id.to_string()))
        }
    }

    /// Topics the live members subscribe to (`None`: some subscription could not be read).
    pub(crate) fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        let protocol = self.protocol.clone()?;
        let mut topics = BTreeSet::new();
        for member in self.members.values() {
            topics.extend(crate::subscription::subscribed_topics(
                &member.metadata_for(&protocol),
            )?);
        }
        Some(topics)
    }

    /// The earliest instant at which `tick` has something to do for this group.
    pub(crate) fn next_deadline(&self) -> Option<i64> {
        let sessions = self
            .members
            .values()
            .filter(|member| !member.is_waiting())
            .map(|member| member.session_deadline_ms);
        let pending = self.pending.values().copied();
        sessions
            .chain(pending)
            .chain(self.rebalance_deadline_ms)
            .chain(self.initial_delay_until_ms)
            .min()
    }
}
