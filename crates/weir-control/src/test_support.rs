//! Test fixtures shared by the modules' unit tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::memory::InMemory;
use weir_common::{FileId, TopicId};

use crate::entry::{BatchCommit, Entry, FileCommit};
use crate::plane::{ControlPlane, ControlPlaneSettings};

/// A control plane over an in-memory bucket with topic `t` of one partition.
pub(crate) async fn plane_with_topic(seed: u64) -> (ControlPlane, TopicId) {
    let control = ControlPlane::open(
        Arc::new(InMemory::new()),
        ControlPlaneSettings::default(),
        seed,
    )
    .await
    .unwrap();
    let topic = control
        .create_topic("t", 1, BTreeMap::new(), seed + 1)
        .await
        .unwrap();
    (control, topic)
}

/// A commit of one non-idempotent 4-byte batch of `span` offsets to partition 0.
pub(crate) fn one_batch_commit(
    agent: String,
    previous: Option<FileId>,
    topic: TopicId,
    file_id: FileId,
    holders: Vec<u8>,
    span: i32,
) -> Entry {
    Entry::CommitFile(FileCommit {
        agent,
        previous,
        file_id,
        size: 4,
        buckets: holders,
        batches: vec![BatchCommit {
            topic_id: topic,
            partition: 0,
            byte_offset: 0,
            len: 4,
            offset_span: span,
            first_timestamp: 0,
            max_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }],
    })
}
