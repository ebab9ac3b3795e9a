//! Snapshots `meta/snapshot/{seq:020}`: the state after slot `seq`, with the fence slots log GC
//! must keep (RFC 0003 §7). The newest readable one starts replay; log GC keeps the two newest.

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::warn;
use weir_format::{decode_envelope, encode_envelope, EnvelopeKind};
use weir_storage::keys;

use super::{FenceSlots, LogError, LogStore};
use crate::state::State;

#[derive(Debug, Deserialize)]
struct SnapshotBody {
    state: State,
    /// Absent in snapshots from before log GC: which slots below them start an epoch is then
    /// unknown, and log GC reads those slots before deleting them.
    #[serde(default = "FenceSlots::unknown")]
    fence: FenceSlots,
}

/// The serialising twin of [`SnapshotBody`], borrowing instead of cloning.
#[derive(Debug, Serialize)]
struct SnapshotRef<'a> {
    state: &'a State,
    fence: &'a FenceSlots,
}

impl LogStore {
    /// Encodes the snapshot of `state` (and its fence slots) taken after slot `seq`. Fails with
    /// [`LogError::Encode`] when it does not fit an envelope (4 GiB): the caller goes on without
    /// that snapshot.
    pub fn encode_snapshot(
        epoch: u64,
        seq: u64,
        state: &State,
        fence: &FenceSlots,
    ) -> Result<Bytes, LogError> {
        let body = SnapshotRef { state, fence };
        let payload = serde_json::to_vec(&body).expect("state always serialises");
        encode_envelope(EnvelopeKind::Snapshot, epoch, seq, &payload).map_err(|source| {
            LogError::Encode {
                key: keys::meta_snapshot(seq).to_string(),
                source,
            }
        })
    }

    pub async fn write_snapshot(&self, seq: u64, bytes: Bytes) -> Result<(), LogError> {
        let key = keys::meta_snapshot(seq);
        match self.store.put(&key, PutPayload::from(bytes)).await {
            Ok(_) => Ok(()),
            Err(source) => Err(LogError::Store {
                key: key.to_string(),
                source,
            }),
        }
    }

    /// The newest snapshot that reads back, as replay starts from it.
    pub(super) async fn load_snapshot(&self) -> Result<Option<(u64, State, FenceSlots)>, LogError> {
        for seq in self
            .list_seqs(&keys::meta_snapshot_prefix())
            .await?
            .into_iter()
            .rev()
        {
            match self.read_snapshot(seq).await? {
                Some(Ok((state, fence))) => return Ok(Some((seq, state, fence))),
                Some(Err(reason)) => warn!(
                    key = %keys::meta_snapshot(seq),
                    %reason,
                    "skipping unreadable snapshot, falling back to an older one or the log"
                ),
                None => {}
            }
        }
        Ok(None)
    }

    /// Reads snapshot `seq`: `None` when absent, `Some(Err(reason))` when it does not decode.
    pub(super) async fn read_snapshot(
        &self,
        seq: u64,
    ) -> Result<Option<Result<(State, FenceSlots), String>>, LogError> {
        let Some(bytes) = self.get(&keys::meta_snapshot(seq)).await? else {
            return Ok(None);
        };
        let decoded = decode_envelope(&bytes)
            .map_err(|err| err.to_string())
            .and_then(|env| {
                if env.kind != EnvelopeKind::Snapshot || env.seq != seq {
                    return Err(format!(
                        "envelope says {:?} of slot {}, key says snapshot of slot {seq}",
                        env.kind, env.seq
                    ));
                }
                serde_json::from_slice::<SnapshotBody>(env.payload).map_err(|err| err.to_string())
            });
        Ok(Some(decoded.map(|body| (body.state, body.fence))))
    }
}
