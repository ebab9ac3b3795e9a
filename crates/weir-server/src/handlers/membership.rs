//! JoinGroup v0–v9, SyncGroup v0–v5, Heartbeat v0–v4 and LeaveGroup v0–v5: translation between
//! the wire and `weir_groups`. JoinGroup and SyncGroup long-poll until the rebalance completes.
//! Fields that do not exist in the negotiated version are left at their defaults (the encoder
//! refuses anything else).

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse,
};
use weir_groups::{
    GroupError, JoinRequest, JoinResponse, LeavingMember, Protocol, SyncRequest, SyncResponse,
};
use weir_protocol::error_code;

use super::{group_error_code, group_result_code, text};
use crate::broker::Broker;
use crate::dispatch::{Caller, RequestContext};

fn not_coordinator(group_id: &str) -> GroupError {
    GroupError::NotCoordinator(group_id.to_string())
}

pub(crate) async fn join_group(
    broker: Arc<Broker>,
    context: RequestContext,
    caller: Caller,
    request: JoinGroupRequest,
) -> Option<Bytes> {
    let version = context.version;
    let group_id = request.group_id.0.to_string();
    let member_id = request.member_id.to_string();
    let response = if broker.coordinates(&group_id) {
        let join = JoinRequest {
            group_id,
            member_id,
            group_instance_id: request.group_instance_id.map(|id| id.to_string()),
            client_id: caller.client_id,
            client_host: caller.host,
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: if version >= 1 {
                request.rebalance_timeout_ms
            } else {
                request.session_timeout_ms
            },
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .into_iter()
                .map(|p| Protocol {
                    name: p.name.to_string(),
                    // Kept while the member lives: a copy, not a slice pinning the whole frame.
                    metadata: Bytes::copy_from_slice(&p.metadata),
                })
                .collect(),
            require_known_member_id: version >= 4,
            supports_skip_assignment: version >= 9,
        };
        broker.groups.join(join).await
    } else {
        JoinResponse::failed(not_coordinator(&group_id), member_id)
    };
    context.encode(&join_response(version, response))
}

fn join_response(version: i16, joined: JoinResponse) -> JoinGroupResponse {
    let mut response = JoinGroupResponse::default()
        .with_error_code(
            joined
                .error
                .as_ref()
                .map_or(error_code::NONE, group_error_code),
        )
        .with_generation_id(joined.generation_id)
        .with_leader(text(joined.leader))
        .with_member_id(text(joined.member_id))
        .with_members(
            joined
                .members
                .into_iter()
                .map(|member| {
                    JoinGroupResponseMember::default()
                        .with_member_id(text(member.member_id))
                        .with_group_instance_id(if version >= 5 {
                            member.group_instance_id.map(text)
                        } else {
                            None
                        })
                        .with_metadata(member.metadata)
                })
                .collect(),
        );
    if version >= 7 {
        response.protocol_type = joined.protocol_type.map(text);
        response.protocol_name = joined.protocol_name.map(text);
    } else {
        response.protocol_name = Some(text(joined.protocol_name.unwrap_or_default()));
    }
    if version >= 9 {
        response.skip_assignment = joined.skip_assignment;
    }
    response
}

pub(crate) async fn sync_group(
    broker: Arc<Broker>,
    context: RequestContext,
    request: SyncGroupRequest,
) -> Option<Bytes> {
    let version = context.version;
    let group_id = request.group_id.0.to_string();
    let synced = if broker.coordinates(&group_id) {
        let sync = SyncRequest {
            group_id,
            generation_id: request.generation_id,
            member_id: request.member_id.to_string(),
            group_instance_id: request.group_instance_id.map(|id| id.to_string()),
            protocol_type: request.protocol_type.map(|p| p.to_string()),
            protocol_name: request.protocol_name.map(|p| p.to_string()),
            assignments: request
                .assignments
                .into_iter()
                .map(|a| {
                    (
                        a.member_id.to_string(),
                        Bytes::copy_from_slice(&a.assignment),
                    )
                })
                .collect(),
        };
        broker.groups.sync(sync).await
    } else {
        SyncResponse::failed(not_coordinator(&group_id))
    };
    let mut response = SyncGroupResponse::default()
        .with_error_code(
            synced
                .error
                .as_ref()
                .map_or(error_code::NONE, group_error_code),
        )
        .with_assignment(synced.assignment);
    if version >= 5 {
        response.protocol_type = synced.protocol_type.map(text);
        response.protocol_name = synced.protocol_name.map(text);
    }
    context.encode(&response)
}

pub(crate) fn heartbeat(
    broker: &Broker,
    context: RequestContext,
    request: HeartbeatRequest,
) -> Option<Bytes> {
    let group_id = request.group_id.0.to_string();
    let result = if broker.coordinates(&group_id) {
        broker.groups.heartbeat(&weir_groups::HeartbeatRequest {
            group_id,
            generation_id: request.generation_id,
            member_id: request.member_id.to_string(),
            group_instance_id: request.group_instance_id.map(|id| id.to_string()),
        })
    } else {
        Err(not_coordinator(&group_id))
    };
    context.encode(&HeartbeatResponse::default().with_error_code(group_result_code(&result)))
}

pub(crate) fn leave_group(
    broker: &Broker,
    context: RequestContext,
    request: LeaveGroupRequest,
) -> Option<Bytes> {
    let version = context.version;
    let group_id = request.group_id.0.to_string();
    let leaving: Vec<LeavingMember> = if version >= 3 {
        request
            .members
            .iter()
            .map(|member| LeavingMember {
                member_id: member.member_id.to_string(),
                group_instance_id: member.group_instance_id.as_ref().map(|id| id.to_string()),
            })
            .collect()
    } else {
        vec![LeavingMember {
            member_id: request.member_id.to_string(),
            group_instance_id: None,
        }]
    };
    if !broker.coordinates(&group_id) {
        let code = group_error_code(&not_coordinator(&group_id));
        return context.encode(&LeaveGroupResponse::default().with_error_code(code));
    }
    let results = broker.groups.leave(&group_id, &leaving);
    let mut response = LeaveGroupResponse::default();
    if version >= 3 {
        response.members = leaving
            .into_iter()
            .zip(&results)
            .map(|(member, result)| {
                MemberResponse::default()
                    .with_member_id(text(member.member_id))
                    .with_group_instance_id(member.group_instance_id.map(text))
                    .with_error_code(group_result_code(result))
            })
            .collect();
    } else {
        response.error_code = results.first().map_or(error_code::NONE, group_result_code);
    }
    context.encode(&response)
}
