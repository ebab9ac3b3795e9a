//! The metadata log on object storage (see `docs/rfcs/0001-metadata-log.md`).
//!
//! * Slot `s` is the object `meta/log/{s:020}`, written create-only, holding one group-committed
//!   [`LogRecord`] tagged with the writer's epoch. Create-only slots fence a deposed writer (CTL-1).
//! * A writer claims `meta/epoch/{e:020}` (create-only, one above the highest it sees) before it
//!   writes, and its first record is `Entry::NewEpoch`.
//! * Replay reads slots in order until the first missing one; a record whose epoch is lower than
//!   an epoch already seen is dead (written by a deposed writer after the takeover) and skipped.
//! * Snapshots `meta/snapshot/{s:020}` hold the state after slot `s` ([`snapshot`]): a manifest
//!   of binary chunks `meta/snapshot-chunk/{s:020}/{n:06}`, or (written before) one JSON object.
//! * Log GC deletes what the two newest snapshots make unnecessary, except the fence slots
//!   ([`gc`], RFC 0003 §7). Recovery therefore never lists or reads the log below a snapshot.

mod gc;
mod prewarm;
mod snapshot;
#[cfg(test)]
pub(crate) mod test_store;

pub(crate) use gc::opens_epoch;
pub use gc::{FenceSlots, GcReport, KEPT_EPOCHS};
pub use snapshot::{SnapshotWritten, MAX_CHUNK_GETS, MAX_CHUNK_PUTS, MAX_SNAPSHOT_CHUNK_BYTES};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use weir_common::{Backoff, Clock, SystemClock};
use weir_format::{decode_envelope, encode_envelope, EnvelopeKind, FormatError};
use weir_storage::append::AppendableStore;
use weir_storage::keys;

use crate::entry::Entry;
use crate::state::State;

/// Records larger than this skip the pre-warmed slot and go by create-only PUT (RFC 0004): the
/// log relies on one flush landing whole, which a backend's single write message (GCS Rapid
/// sends data in 2 MiB messages) is trusted to do; a larger record would span several.
pub const PREWARM_MAX_RECORD: usize = 1 << 20;

/// How far past the first gap recovery looks for dead slots of a deposed writer. It must exceed
/// any writer's `max_inflight_writes`.
pub const DEAD_SLOT_PROBE: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("object store error on {key}: {source}")]
    Store {
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("slot {seq} was taken by another writer (epoch {found_epoch}, ours {our_epoch})")]
    SlotLost {
        seq: u64,
        found_epoch: u64,
        our_epoch: u64,
    },
    #[error("epoch {0} was claimed by another control plane")]
    EpochTaken(u64),
    #[error("another live agent ({address}) has node id {node_id}")]
    DuplicateNodeId { node_id: i32, address: String },
    /// An object that cannot be encoded: a log slot too large for its envelope (4 GiB), or a
    /// snapshot of a state the binary format cannot hold (an index that is not dense).
    #[error("cannot encode {key}: {source}")]
    Encode {
        key: String,
        #[source]
        source: FormatError,
    },
    /// A snapshot's encoder stopped before it finished (it panicked, its state did not
    /// serialise, or its upload failed first).
    #[error("snapshot encoder stopped: {0}")]
    SnapshotEncoder(String),
    /// A log slot that does not decode. Replay cannot skip it (the slots after it may depend on
    /// it), so recovery stops and the operator decides.
    #[error(
        "metadata log slot {key} is corrupt ({reason}); refusing to recover past it: restore \
         that object from a backup or an earlier object version of the metadata bucket. Deleting \
         it instead makes the log end before it and loses every later slot"
    )]
    CorruptSlot { key: String, reason: String },
    /// An empty slot object (pre-warmed by a writer on an appendable bucket, RFC 0004) where
    /// this log has no appendable view to write it through.
    #[error(
        "metadata log slot {key} is an empty pre-warmed object, and this agent has no appendable \
         view of the metadata bucket to write it (a takeover is the only safe way): run with the \
         bucket's appendable backend enabled (docs/operations.md, \"Appendable ingest\")"
    )]
    EmptySlot { key: String },
    #[error(
        "metadata log slot {key} was written by a newer Weir (record version {version}, this \
         build reads up to {LOG_RECORD_VERSION}); run that version or newer"
    )]
    NewerFormat { key: String, version: u16 },
}

/// The record version this build writes. 1: the format before versions (no `v` field);
/// 2: adds `AdvanceLogStart`, `FilesDeleted` and `State::released` (RFC 0003); 3: adds
/// `RegisterAgent`, `FenceAgent` and `CommitOffsets`' coordinator stamp (RFC 0002); 4: the
/// stamp on `DeleteGroup`, `DeleteGroupOffsets` and `ExpireGroup` too; 5: `ReserveFile`,
/// `ConfirmFiles` and `AbortFiles` (RFC 0006). A reader stops at a record newer than it knows
/// instead of misreading it (an older build would apply a refused delete). A record is written
/// at the oldest version that holds its entries, so a log that never used pending files stays
/// readable by builds of version 4.
pub const LOG_RECORD_VERSION: u16 = 5;

fn version_one() -> u16 {
    1
}

/// One log slot: the entries group-committed together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    #[serde(rename = "v", default = "version_one")]
    pub version: u16,
    pub entries: Vec<Entry>,
}

impl LogRecord {
    /// A record of the oldest version that holds `entries`.
    pub fn new(entries: Vec<Entry>) -> Self {
        let version = entries.iter().map(Entry::record_version).max().unwrap_or(4);
        Self { version, entries }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct EpochBody {
    address: String,
}

/// Access to the metadata objects of one bucket.
#[derive(Debug, Clone)]
pub struct LogStore {
    store: Arc<dyn ObjectStore>,
    /// The bucket's appendable view, when it has one: empty slot objects (pre-warmed, RFC 0004)
    /// are written through it with a takeover.
    appendable: Option<Arc<dyn AppendableStore>>,
    /// Pre-created slot objects ahead of the log's end (`control.prewarmed_slots > 0`).
    window: Option<Arc<prewarm::SlotWindow>>,
    write_attempts: u32,
    /// The wall clock a new epoch records (`NewEpoch::at_ms`).
    clock: Arc<dyn Clock>,
    /// Body bytes per snapshot chunk (tests use tiny chunks to cover many).
    snapshot_chunk_bytes: usize,
    /// The highest epoch this process claimed (shared by clones): a claim of ours whose
    /// take-over failed is no later leader's.
    claimed: Arc<std::sync::atomic::AtomicU64>,
}

/// The durable state as replay finds it.
#[derive(Debug)]
pub struct Replayed {
    /// State after every live slot (all of it stable).
    pub state: State,
    /// The snapshot replay started from, if any.
    pub snapshot_seq: Option<u64>,
    /// Live slots applied after the snapshot.
    pub replayed: u64,
    /// Dead slots skipped: written by a deposed writer after a later epoch's record.
    pub dead: u64,
    /// The first missing slot: where the next writer puts its `NewEpoch`.
    pub gap: u64,
    /// The highest writer epoch among live records (and the snapshot): a recovering writer
    /// whose claimed epoch is lower has been overtaken and must not write.
    pub log_epoch: u64,
    /// The snapshot's fence slots and those of the live `NewEpoch` records replayed after it.
    pub fence: FenceSlots,
}

/// The result of recovery: the durable state and where the new writer continues.
#[derive(Debug)]
pub struct Recovered {
    pub state: State,
    pub epoch: u64,
    /// The first slot the new writer appends to.
    pub next_seq: u64,
    /// Slots recovery wrote (the NewEpoch record and hole fillers).
    pub slots_written: u64,
    /// The slots log GC must keep, this writer's `NewEpoch` included.
    pub fence: FenceSlots,
    /// Slots after the snapshot replay started from, recovery's own included: what the next
    /// recovery would replay, counted towards the next snapshot.
    pub slots_after_snapshot: u64,
}

impl LogStore {
    pub fn new(store: Arc<dyn ObjectStore>, write_attempts: u32) -> Self {
        Self {
            store,
            appendable: None,
            window: None,
            write_attempts: write_attempts.max(1),
            clock: Arc::new(SystemClock),
            snapshot_chunk_bytes: MAX_SNAPSHOT_CHUNK_BYTES,
            claimed: Arc::default(),
        }
    }

    /// Sets the body bytes per snapshot chunk, at most [`MAX_SNAPSHOT_CHUNK_BYTES`].
    pub fn with_snapshot_chunk_bytes(mut self, bytes: usize) -> Self {
        self.snapshot_chunk_bytes = bytes.clamp(1, MAX_SNAPSHOT_CHUNK_BYTES);
        self
    }

    /// Gives the log the bucket's appendable view (RFC 0004): existing empty slot objects are
    /// then written through a takeover, and with `prewarmed_slots > 0` the writer keeps that many
    /// slot objects created ahead of the log's end.
    pub fn with_appendable(
        mut self,
        appendable: Arc<dyn AppendableStore>,
        prewarmed_slots: usize,
    ) -> Self {
        self.window = (prewarmed_slots > 0).then(|| {
            Arc::new(prewarm::SlotWindow::new(
                appendable.clone(),
                prewarmed_slots as u64,
            ))
        });
        self.appendable = Some(appendable);
        self
    }

    /// Starts (or moves) the window of pre-warmed slots at `next_seq`, the writer's next slot.
    pub fn prewarm_from(&self, next_seq: u64) {
        if let Some(window) = &self.window {
            window.start(next_seq);
        }
    }

    /// Releases the pre-warmed slots' writers (a stopping writer; the empty objects stay).
    pub fn close_window(&self) {
        if let Some(window) = &self.window {
            window.close();
        }
    }

    /// Sets the wall clock recorded in `NewEpoch` entries (the simulator's clock).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Encodes slot `seq`. A slot holds at most `max_entries_per_slot` entries, each from one
    /// request of at most `kafka.max_frame_bytes`, so its JSON can in principle pass the
    /// envelope's 4 GiB: that is [`LogError::Encode`], which the writer handles like a failed
    /// slot write (its callers get `Unavailable`, the writer re-recovers), never a panic.
    pub fn encode_record(epoch: u64, seq: u64, record: &LogRecord) -> Result<Bytes, LogError> {
        let payload = serde_json::to_vec(record).expect("log records always serialise");
        encode_envelope(EnvelopeKind::LogEntry, epoch, seq, &payload).map_err(|source| {
            LogError::Encode {
                key: keys::meta_log(seq).to_string(),
                source,
            }
        })
    }

    /// Writes slot `seq` create-only. An `AlreadyExists` holding our exact bytes (an earlier
    /// attempt that succeeded after reporting failure) counts as success; other bytes mean
    /// another writer took the slot ([`LogError::SlotLost`]), or [`LogError::CorruptSlot`] when
    /// this build cannot decode them.
    ///
    /// With a pre-warmed object for `seq` the write is one append + flush into it; if that
    /// fails (fenced, or an answer lost), the create-only path below reads what the slot holds.
    pub async fn write_slot(&self, seq: u64, epoch: u64, bytes: Bytes) -> Result<(), LogError> {
        let key = keys::meta_log(seq);
        let window = self
            .window
            .as_ref()
            .filter(|_| bytes.len() <= PREWARM_MAX_RECORD);
        if let Some(writer) = window.and_then(|w| w.take(seq)) {
            match prewarm::write_into(writer, bytes.clone()).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(err) => {
                    warn!(%key, error = %err, "pre-warmed log slot write failed; reading the slot back")
                }
            }
        }
        match self.create(&key, bytes.clone()).await? {
            None => Ok(()),
            Some(existing) if existing == bytes => Ok(()),
            // An undecodable record is an error, never a lower epoch (see `record_epoch`).
            Some(existing) => Err(LogError::SlotLost {
                seq,
                found_epoch: record_epoch(&key, &existing)?,
                our_epoch: epoch,
            }),
        }
    }

    /// Writes `key` create-only, retrying failed attempts (up to `write_attempts`, with
    /// backoff). Returns `None` once written, or the bytes of the object already at `key`.
    ///
    /// An `AlreadyExists` whose object is absent is a failed attempt, not an answer: S3 reports
    /// `409 ConditionalRequestConflict` for a create racing another write to the key that has
    /// not landed (and may never, e.g. a deposed writer killed mid-PUT), and object_store maps
    /// every 409 to `AlreadyExists`. Reading that as "taken" would leave a hole in the log.
    async fn create(&self, key: &Path, bytes: Bytes) -> Result<Option<Bytes>, LogError> {
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
        let mut rng = fastrand::Rng::with_seed(keys::parse_seq_key(key).unwrap_or(0));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let options = PutOptions::from(PutMode::Create);
            let source = match self
                .store
                .put_opts(key, PutPayload::from(bytes.clone()), options)
                .await
            {
                Ok(_) => return Ok(None),
                Err(source @ object_store::Error::AlreadyExists { .. }) => {
                    match self.get(key).await? {
                        // Rule 2 of RFC 0004: an empty object is a pre-warmed slot nobody
                        // wrote; write it only through a takeover.
                        Some(existing) if existing.is_empty() => {
                            match self.fill_empty(key, &bytes).await {
                                Ok(prewarm::Filled::Written) => return Ok(None),
                                // Another record got there first.
                                Ok(prewarm::Filled::NotEmpty) => match self.get(key).await? {
                                    Some(existing) if !existing.is_empty() => {
                                        return Ok(Some(existing))
                                    }
                                    _ => source,
                                },
                                Err(err) => object_store::Error::Generic {
                                    store: "weir-log",
                                    source: Box::new(err),
                                },
                            }
                        }
                        Some(existing) => return Ok(Some(existing)),
                        None => source,
                    }
                }
                Err(source) => source,
            };
            if attempt >= self.write_attempts {
                return Err(LogError::Store {
                    key: key.to_string(),
                    source,
                });
            }
            warn!(%key, attempt, error = %source, "metadata create-only write failed, retrying");
            tokio::time::sleep(backoff.next_delay(&mut rng)).await;
        }
    }

    /// Writes `bytes` into the existing empty slot object `key` through a takeover.
    async fn fill_empty(&self, key: &Path, bytes: &Bytes) -> Result<prewarm::Filled, LogError> {
        let Some(appendable) = &self.appendable else {
            return Err(LogError::EmptySlot {
                key: key.to_string(),
            });
        };
        prewarm::fill_empty(appendable.as_ref(), key, bytes.clone())
            .await
            .map_err(|err| LogError::Store {
                key: key.to_string(),
                source: object_store::Error::Generic {
                    store: "weir-log",
                    source: Box::new(err),
                },
            })
    }

    async fn get(&self, key: &Path) -> Result<Option<Bytes>, LogError> {
        get_optional(self.store.as_ref(), key).await
    }

    async fn list_seqs(&self, prefix: &Path) -> Result<Vec<u64>, LogError> {
        self.list_seqs_after(prefix, None).await
    }

    /// The sequence numbers under `prefix`, ascending; with `after`, only keys past that one
    /// (`list_with_offset`: the store skips the keys before it, S3 without listing them).
    async fn list_seqs_after(
        &self,
        prefix: &Path,
        after: Option<&Path>,
    ) -> Result<Vec<u64>, LogError> {
        let metas = self.list_keys(prefix, after).await?;
        let mut seqs: Vec<u64> = metas
            .iter()
            .filter_map(|meta| keys::parse_seq_key(&meta.location))
            .collect();
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Every object under `prefix` (past `after`, if given).
    async fn list_keys(
        &self,
        prefix: &Path,
        after: Option<&Path>,
    ) -> Result<Vec<object_store::ObjectMeta>, LogError> {
        let listing = match after {
            Some(offset) => self.store.list_with_offset(Some(prefix), offset),
            None => self.store.list(Some(prefix)),
        };
        listing
            .try_collect()
            .await
            .map_err(|source| LogError::Store {
                key: prefix.to_string(),
                source,
            })
    }

    pub(crate) async fn read_record(&self, seq: u64) -> Result<Option<(u64, LogRecord)>, LogError> {
        let key = keys::meta_log(seq);
        let Some(bytes) = self.get(&key).await? else {
            return Ok(None);
        };
        if bytes.is_empty() {
            // Rule 1 of RFC 0004: a pre-warmed slot object nobody wrote is a missing slot.
            return Ok(None);
        }
        let corrupt = |reason: String| LogError::CorruptSlot {
            key: key.to_string(),
            reason,
        };
        let envelope = decode_envelope(&bytes).map_err(|err| corrupt(err.to_string()))?;
        if envelope.kind != EnvelopeKind::LogEntry || envelope.seq != seq {
            return Err(corrupt(format!(
                "kind {:?} seq {}",
                envelope.kind, envelope.seq
            )));
        }
        let record: LogRecord = match serde_json::from_slice(envelope.payload) {
            Ok(record) => record,
            Err(err) => {
                // An entry this build does not know parses as an error: say so when the record
                // names a newer version rather than calling the slot corrupt.
                #[derive(Deserialize)]
                struct Version {
                    #[serde(rename = "v", default = "version_one")]
                    version: u16,
                }
                return Err(match serde_json::from_slice::<Version>(envelope.payload) {
                    Ok(Version { version }) if version > LOG_RECORD_VERSION => {
                        LogError::NewerFormat {
                            key: key.to_string(),
                            version,
                        }
                    }
                    _ => corrupt(err.to_string()),
                });
            }
        };
        if record.version > LOG_RECORD_VERSION {
            return Err(LogError::NewerFormat {
                key: key.to_string(),
                version: record.version,
            });
        }
        Ok(Some((envelope.epoch, record)))
    }

    /// Claims the next epoch create-only; losing the race means another control plane is active.
    /// A conflict while the epoch object stays absent is retried (see [`Self::create`]).
    ///
    /// With `known`, claims only when no epoch above it exists, other than one this process
    /// claimed itself: a cluster member claims the epoch after the one whose leader it saw
    /// stop (RFC 0002 §2), never past a newer leader.
    async fn claim_epoch(&self, address: &str, known: Option<u64>) -> Result<u64, LogError> {
        use std::sync::atomic::Ordering;
        let highest = self.highest_epoch().await?;
        let ours = self.claimed.load(Ordering::SeqCst);
        if known.is_some_and(|known| highest > known.max(ours)) {
            return Err(LogError::EpochTaken(highest));
        }
        let epoch = highest + 1;
        let body = serde_json::to_vec(&EpochBody {
            address: address.to_string(),
        })
        .expect("epoch body serialises");
        let bytes = encode_envelope(EnvelopeKind::Epoch, epoch, epoch, &body)
            .expect("an epoch object fits an envelope");
        match self.create(&keys::meta_epoch(epoch), bytes).await? {
            None => {
                self.claimed.fetch_max(epoch, Ordering::SeqCst);
                Ok(epoch)
            }
            Some(_) => Err(LogError::EpochTaken(epoch)),
        }
    }

    /// The metadata bucket.
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The highest epoch claimed (0 when none): a listing of `meta/epoch/`.
    pub(crate) async fn highest_epoch(&self) -> Result<u64, LogError> {
        Ok(self
            .list_seqs(&keys::meta_epoch_prefix())
            .await?
            .last()
            .copied()
            .unwrap_or(0))
    }

    /// The address recorded in epoch `epoch`'s object, if it exists.
    pub(crate) async fn epoch_address(&self, epoch: u64) -> Result<Option<String>, LogError> {
        let key = keys::meta_epoch(epoch);
        let Some(bytes) = self.get(&key).await? else {
            return Ok(None);
        };
        let envelope = decode_envelope(&bytes).map_err(|err| LogError::CorruptSlot {
            key: key.to_string(),
            reason: err.to_string(),
        })?;
        Ok(serde_json::from_slice::<EpochBody>(envelope.payload)
            .ok()
            .map(|body| body.address))
    }

    /// Reads the durable state without writing anything: the newest readable snapshot, then the
    /// contiguous log after it, skipping dead slots. Recovery uses it after claiming an epoch;
    /// the simulator's auditor uses it to see exactly what a recovering writer would see.
    pub async fn replay(&self) -> Result<Replayed, LogError> {
        self.replay_until(None).await
    }

    /// [`LogStore::replay`], stopping before slot `until` when given (a follower replaying
    /// while its leader writes: the replay ends there, not at a missing slot it may never
    /// reach).
    pub async fn replay_until(&self, until: Option<u64>) -> Result<Replayed, LogError> {
        let (snapshot_seq, mut state, mut fence) = match self.load_snapshot().await? {
            Some((seq, state, fence)) => (Some(seq), state, fence),
            None => (None, State::default(), FenceSlots::default()),
        };
        state.rebuild_indexes();
        // From the snapshot on, by GETs of consecutive slots: nothing lists or reads the log
        // below it (log GC may have collected it).
        let mut seq = snapshot_seq.map_or(0, |s| s + 1);
        fence.replaying_from(seq);
        let mut log_epoch = state.epoch;
        let mut replayed = 0u64;
        let mut dead = 0u64;
        while until.is_none_or(|until| seq < until) {
            let Some((record_epoch, record)) = self.read_record(seq).await? else {
                break;
            };
            if record_epoch >= log_epoch {
                log_epoch = record_epoch;
                if gc::opens_epoch(&record.entries) {
                    fence.record(seq);
                }
                for entry in &record.entries {
                    state.apply(entry);
                }
                replayed += 1;
            } else {
                dead += 1;
            }
            seq += 1;
        }
        state.mark_all_stable();
        Ok(Replayed {
            state,
            snapshot_seq,
            replayed,
            dead,
            gap: seq,
            log_epoch,
            fence,
        })
    }

    /// Recovers the durable state and takes over as writer with a fresh epoch.
    ///
    /// Fails with [`LogError::EpochTaken`] when another writer overtook this one between the
    /// claim and the `NewEpoch` write: its replay passed a record of a higher epoch (a writer
    /// that claimed later but wrote first; a `NewEpoch` of ours after it would be dead to every
    /// later replay), or a slot past its `NewEpoch` holds a higher epoch (a writer that claimed
    /// later, replayed our `NewEpoch` and wrote behind it). The caller claims again.
    pub async fn recover(
        &self,
        address: &str,
        new_cluster_id: &str,
    ) -> Result<Recovered, LogError> {
        if let Some(window) = &self.window {
            window.pause();
        }
        let epoch = self.claim_epoch(address, None).await?;
        self.take_over(epoch, new_cluster_id).await
    }

    /// Recovery of a cluster member (RFC 0002 §2): claims only when no epoch above `known`
    /// exists, and fails with [`LogError::EpochTaken`] otherwise, instead of claiming past a
    /// newer leader. With a replica, replays only the slots after it.
    pub async fn recover_after(
        &self,
        known: u64,
        address: &str,
        new_cluster_id: &str,
        replica: Option<&mut crate::replica::Replica>,
    ) -> Result<Recovered, LogError> {
        if let Some(window) = &self.window {
            window.pause();
        }
        let epoch = self.claim_epoch(address, Some(known)).await?;
        match replica {
            None => self.take_over(epoch, new_cluster_id).await,
            Some(replica) => {
                replica.catch_up(self, None).await?;
                if self.snapshot_at_or_above(replica.next_seq()).await? {
                    // Behind the log's GC (its next slot may be gone): from the snapshot.
                    replica.catch_up(self, Some(u64::MAX)).await?;
                }
                self.take_over_from(epoch, new_cluster_id, replica.as_replayed())
                    .await
            }
        }
    }

    /// The part of recovery after the claim of `epoch`: replay, then the `NewEpoch` record and
    /// hole fillers. Other writers may claim and write meanwhile (tests interleave them here).
    async fn take_over(&self, epoch: u64, new_cluster_id: &str) -> Result<Recovered, LogError> {
        let replayed = self.replay().await?;
        self.take_over_from(epoch, new_cluster_id, replayed).await
    }

    /// Takes over as the writer of `epoch` from what a replay found (or a replica holds).
    async fn take_over_from(
        &self,
        epoch: u64,
        new_cluster_id: &str,
        replayed: Replayed,
    ) -> Result<Recovered, LogError> {
        let Replayed {
            mut state,
            snapshot_seq,
            replayed,
            dead,
            gap,
            log_epoch,
            mut fence,
        } = replayed;
        if log_epoch > epoch {
            warn!(
                epoch,
                log_epoch, "a later writer wrote before our new epoch; claiming again"
            );
            return Err(LogError::EpochTaken(epoch));
        }
        let cluster_id = if state.cluster_id.is_empty() {
            new_cluster_id.to_string()
        } else {
            state.cluster_id.clone()
        };
        let new_epoch = Entry::NewEpoch {
            epoch,
            cluster_id,
            at_ms: self.clock.now_ms(),
        };
        state.apply(&new_epoch);
        let record = LogRecord::new(vec![new_epoch]);
        self.write_slot(gap, epoch, Self::encode_record(epoch, gap, &record)?)
            .await?;
        self.check_not_collected(gap, epoch).await?;
        fence.record(gap);
        let next_seq = self.fill_dead_slots(gap, epoch).await?;
        info!(
            epoch,
            snapshot = ?snapshot_seq,
            replayed,
            next_seq,
            topics = state.topics.len(),
            "control plane recovered"
        );
        Ok(Recovered {
            state,
            epoch,
            next_seq,
            slots_written: next_seq - gap,
            fence,
            slots_after_snapshot: replayed + dead + (next_seq - gap),
        })
    }

    /// Fills holes among dead slots a deposed writer may have left past `gap`, so replay never
    /// stops before the new writer's records. Returns the first free slot. Lists only the keys
    /// past `gap`, not the log before it.
    async fn fill_dead_slots(&self, gap: u64, epoch: u64) -> Result<u64, LogError> {
        let existing = self
            .list_seqs_after(&keys::meta_log_prefix(), Some(&keys::meta_log(gap)))
            .await?;
        self.check_no_later_writer(&existing, epoch).await?;
        let last_dead = existing
            .iter()
            .copied()
            .filter(|seq| *seq > gap && *seq <= gap + DEAD_SLOT_PROBE)
            .max();
        let Some(last_dead) = last_dead else {
            return Ok(gap + 1);
        };
        warn!(
            gap,
            last_dead, "found dead slots of a deposed writer, filling holes"
        );
        for seq in gap + 1..=last_dead {
            // Existing records stay (dead to replay); empty pre-warmed objects are holes. A
            // record is judged by its epoch: a later writer whose replay passed our fillers may
            // have written its `NewEpoch` into an object that was empty at the listing, and
            // skipping that record as dead would let us serve as a deposed writer (weir-sim
            // seeds 583 and 874 with slots read concurrently: an acknowledged slot lost).
            if existing.binary_search(&seq).is_ok() {
                match self.slot_epoch(seq).await? {
                    Some(found_epoch) if found_epoch > epoch => {
                        warn!(
                            seq,
                            epoch, found_epoch, "a later writer wrote a slot we were filling past"
                        );
                        return Err(LogError::EpochTaken(epoch));
                    }
                    Some(_) => continue,
                    None => {}
                }
            }
            let filler = LogRecord::new(vec![]);
            match self
                .write_slot(seq, epoch, Self::encode_record(epoch, seq, &filler)?)
                .await
            {
                // A deposed writer's late slot: dead to replay after our NewEpoch, as a filler.
                Ok(()) => {}
                Err(LogError::SlotLost { found_epoch, .. }) if found_epoch < epoch => {}
                // A later writer took over while we filled: we are deposed before serving.
                Err(LogError::SlotLost { found_epoch, .. }) if found_epoch > epoch => {
                    warn!(
                        seq,
                        epoch, found_epoch, "a later writer took a hole we were filling"
                    );
                    return Err(LogError::EpochTaken(epoch));
                }
                Err(other) => return Err(other),
            }
        }
        Ok(last_dead + 1)
    }

    /// The epoch of the record in slot `seq`; `None` when the slot is missing or an empty
    /// (pre-warmed, unwritten) object. A record this build cannot decode (another envelope
    /// version, a torn write) is an error, not a dead slot: it may be a later writer's.
    async fn slot_epoch(&self, seq: u64) -> Result<Option<u64>, LogError> {
        let key = keys::meta_log(seq);
        let Some(bytes) = self.get(&key).await?.filter(|bytes| !bytes.is_empty()) else {
            return Ok(None);
        };
        record_epoch(&key, &bytes).map(Some)
    }

    /// Fails with [`LogError::EpochTaken`] if a slot past our `NewEpoch` holds a later epoch:
    /// a writer that claimed after us, replayed our `NewEpoch` and wrote its own behind it
    /// while we were still recovering. Those slots are not dead, we are: serving would show a
    /// state without them, and our next slot (after theirs) would be dead to every replay, so
    /// whatever we acknowledged there would be lost. Reads in slot order and stops at the first
    /// later epoch; dead slots of a deposed writer come before a later writer's, so the reads
    /// are the few dead slots at most.
    async fn check_no_later_writer(&self, existing: &[u64], epoch: u64) -> Result<(), LogError> {
        for seq in existing {
            let Some(found_epoch) = self.slot_epoch(*seq).await? else {
                continue;
            };
            if found_epoch > epoch {
                warn!(
                    seq,
                    epoch, found_epoch, "a later writer wrote past our new epoch"
                );
                return Err(LogError::EpochTaken(epoch));
            }
        }
        Ok(())
    }
}

/// The object at `key`, or `None` when there is none.
pub(crate) async fn get_optional(
    store: &dyn ObjectStore,
    key: &Path,
) -> Result<Option<Bytes>, LogError> {
    match store.get(key).await {
        Ok(result) => result
            .bytes()
            .await
            .map(Some)
            .map_err(|source| LogError::Store {
                key: key.to_string(),
                source,
            }),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(source) => Err(LogError::Store {
            key: key.to_string(),
            source,
        }),
    }
}

/// The epoch of the log record `bytes` read from `key`. A record this build cannot decode
/// (another envelope version, a torn write) is [`LogError::CorruptSlot`], never a lower epoch:
/// it may be a later writer's, and hole filling would skip it as dead and serve.
fn record_epoch(key: &Path, bytes: &[u8]) -> Result<u64, LogError> {
    decode_envelope(bytes)
        .map(|envelope| envelope.epoch)
        .map_err(|err| LogError::CorruptSlot {
            key: key.to_string(),
            reason: err.to_string(),
        })
}

#[cfg(test)]
mod tests;
