//! ListGroups v0–v5, DescribeGroups v0–v5 and DeleteGroups v0–v2.
//!
//! A group exists if the coordinator knows it (it has or had members since the agent started) or
//! if it has committed offsets in the control plane; the latter alone show as `Empty` with no
//! protocol type (Kafka's "simple" groups look the same).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, ListGroupsRequest, ListGroupsResponse,
};
use weir_control::{ControlError, Entry, EntryResult};
use weir_groups::{GroupError, GroupListing, GroupState};
use weir_protocol::error_code;

use super::{control_error_code, group_error_code, text};
use crate::broker::Broker;
use crate::dispatch::RequestContext;

/// Sentinel for "authorized operations not requested".
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;
/// KIP-848's name for the group type of every group this coordinator runs.
const CLASSIC: &str = "classic";

/// Every group this agent coordinates, with offset-only groups as Empty.
fn all_groups(broker: &Broker) -> Vec<GroupListing> {
    let mut groups: BTreeMap<String, GroupListing> = broker
        .groups
        .list()
        .into_iter()
        .map(|listing| (listing.group_id.clone(), listing))
        .collect();
    let with_offsets: Vec<String> = broker
        .control
        .read(|s| s.group_offsets.keys().cloned().collect());
    for group_id in with_offsets {
        groups.entry(group_id.clone()).or_insert(GroupListing {
            group_id,
            protocol_type: String::new(),
            state: GroupState::Empty,
        });
    }
    groups
        .into_values()
        .filter(|listing| broker.coordinates(&listing.group_id))
        .collect()
}

pub(crate) fn list_groups(
    broker: &Broker,
    context: RequestContext,
    request: ListGroupsRequest,
) -> Option<Bytes> {
    let version = context.version;
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let types: Vec<String> = request
        .types_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let groups = all_groups(broker)
        .into_iter()
        .filter(|g| {
            version < 4
                || states.is_empty()
                || states.contains(&g.state.as_str().to_ascii_lowercase())
        })
        .filter(|_| version < 5 || types.is_empty() || types.iter().any(|t| t == CLASSIC))
        .map(|g| {
            let mut listed = ListedGroup::default()
                .with_group_id(GroupId(text(g.group_id)))
                .with_protocol_type(text(g.protocol_type));
            if version >= 4 {
                listed.group_state = text(g.state.as_str());
            }
            if version >= 5 {
                listed.group_type = text(CLASSIC);
            }
            listed
        })
        .collect();
    context.encode(&ListGroupsResponse::default().with_groups(groups))
}

pub(crate) fn describe_groups(
    broker: &Broker,
    context: RequestContext,
    request: DescribeGroupsRequest,
) -> Option<Bytes> {
    let version = context.version;
    let groups = request
        .groups
        .into_iter()
        .map(|group_id| describe_one(broker, version, group_id))
        .collect();
    context.encode(&DescribeGroupsResponse::default().with_groups(groups))
}

fn describe_one(broker: &Broker, version: i16, group_id: GroupId) -> DescribedGroup {
    let id = group_id.0.to_string();
    let mut described = DescribedGroup::default().with_group_id(group_id);
    if version >= 3 {
        described.authorized_operations = OPERATIONS_NOT_REQUESTED;
    }
    if !broker.coordinates(&id) {
        described.error_code = error_code::NOT_COORDINATOR;
        return described;
    }
    let Some(group) = broker.groups.describe(&id) else {
        let has_offsets = broker.control.read(|s| s.group_offsets.contains_key(&id));
        let state = if has_offsets {
            GroupState::Empty
        } else {
            GroupState::Dead
        };
        described.group_state = text(state.as_str());
        return described;
    };
    described.group_state = text(group.state.as_str());
    described.protocol_type = text(group.protocol_type);
    described.protocol_data = text(group.protocol);
    described.members = group
        .members
        .into_iter()
        .map(|member| {
            DescribedGroupMember::default()
                .with_member_id(text(member.member_id))
                .with_group_instance_id(if version >= 4 {
                    member.group_instance_id.map(text)
                } else {
                    None
                })
                .with_client_id(text(member.client_id))
                .with_client_host(text(member.client_host))
                .with_member_metadata(member.metadata)
                .with_member_assignment(member.assignment)
        })
        .collect();
    described
}

pub(crate) async fn delete_groups(
    broker: Arc<Broker>,
    context: RequestContext,
    request: DeleteGroupsRequest,
) -> Option<Bytes> {
    let mut results = Vec::with_capacity(request.groups_names.len());
    for group_id in request.groups_names {
        let code = delete_one(&broker, &group_id.0).await;
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group_id)
                .with_error_code(code),
        );
    }
    context.encode(&DeleteGroupsResponse::default().with_results(results))
}

async fn delete_one(broker: &Broker, group_id: &str) -> i16 {
    let Some(coordinator) = broker.coordination(group_id) else {
        return error_code::NOT_COORDINATOR;
    };
    // Marks an empty group Dead so nobody joins while its offsets are deleted.
    let known = match broker.groups.begin_delete(group_id) {
        Ok(known) => known,
        Err(error) => return group_error_code(&error),
    };
    let entry = Entry::DeleteGroup {
        group: group_id.to_string(),
        coordinator,
    };
    let outcome = broker.control.submit(entry).await;
    broker.groups.finish_delete(group_id);
    match outcome {
        Ok(EntryResult::DeleteGroup(Ok(had_offsets))) if known || had_offsets => error_code::NONE,
        Ok(EntryResult::DeleteGroup(Ok(_))) => {
            group_error_code(&GroupError::GroupIdNotFound(group_id.to_string()))
        }
        Ok(EntryResult::DeleteGroup(Err(error))) => {
            if let ControlError::NotCoordinator(why) = &error {
                // The coordinator fence: another agent coordinated the group meanwhile.
                broker.lost_group(group_id, why);
            }
            control_error_code(&error)
        }
        Ok(_) => error_code::UNKNOWN_SERVER_ERROR,
        Err(error) => control_error_code(&error),
    }
}
