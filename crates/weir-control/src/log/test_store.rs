//! A store wrapper for deterministic tests of the log. It can hold one create-only PUT on the
//! wire until the test releases it (a stalled writer); let another writer's bytes land just
//! before our PUT of a key (a race), or at another key just after our PUT of one lands; answer
//! create-only PUTs with a phantom `AlreadyExists` (S3's `409 ConditionalRequestConflict`); fail
//! the deletes of chosen keys and the next few listings; and it records GETs and listings (what
//! recovery reads). Also helpers that write slots and snapshots directly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::oneshot;

use super::{FenceSlots, LogRecord, LogStore};
use crate::entry::Entry;

/// Writes `entries` as slot `seq` of `epoch`.
pub(crate) async fn write_entries(log: &LogStore, epoch: u64, seq: u64, entries: Vec<Entry>) {
    let bytes = LogStore::encode_record(epoch, seq, &LogRecord::new(entries)).unwrap();
    log.write_slot(seq, epoch, bytes).await.unwrap();
}

/// Snapshots the durable state, which must end at slot `seq`, and returns its fence.
pub(crate) async fn snapshot_at(log: &LogStore, seq: u64) -> FenceSlots {
    let replayed = log.replay().await.unwrap();
    assert_eq!(replayed.gap, seq + 1);
    log.write_snapshot(replayed.log_epoch, seq, &replayed.state, &replayed.fence)
        .await
        .unwrap();
    replayed.fence
}

/// The `(seq, n)` of every snapshot chunk in `store`.
pub(crate) async fn chunk_keys(store: &InMemory) -> std::collections::BTreeSet<(u64, u32)> {
    use futures::TryStreamExt;
    let metas: Vec<_> = store
        .list(Some(&weir_storage::keys::meta_snapshot_chunk_prefix()))
        .try_collect()
        .await
        .unwrap();
    metas
        .iter()
        .filter_map(|meta| weir_storage::keys::parse_snapshot_chunk(&meta.location))
        .collect()
}

/// One held PUT: signals its arrival, waits for its release.
type Hold = (Path, oneshot::Sender<()>, oneshot::Receiver<()>);

#[derive(Debug)]
pub(crate) struct HoldStore {
    inner: Arc<InMemory>,
    hold: Mutex<Option<Hold>>,
    /// Another writer's bytes that land just before our PUT of that key.
    race: Mutex<Option<(Path, Bytes)>>,
    /// `(trigger, key, bytes)`: another writer's bytes that land at `key` just after our PUT
    /// of `trigger` lands (a later writer acting on what it read of ours).
    race_elsewhere: Mutex<Option<(Path, Path, Bytes)>>,
    /// Create-only PUTs of a key answered `AlreadyExists` without writing, this many times.
    phantom: Mutex<BTreeMap<Path, u32>>,
    /// PUTs under this prefix fail (a store that refuses snapshot chunks).
    fail_puts: Mutex<Option<Path>>,
    /// Keys whose deletes fail (a bulk delete's per-key error); the others are deleted.
    failing_deletes: Mutex<Vec<Path>>,
    /// This many of the next listings fail (a transient error).
    failing_lists: Mutex<u32>,
    gets: Mutex<Vec<Path>>,
    /// `(prefix, offset)` of every listing.
    lists: Mutex<Vec<(Option<Path>, Option<Path>)>>,
}

/// The test's side of a held PUT.
pub(crate) struct HeldPut {
    /// Resolves once the PUT reached the store (and is held there).
    pub(crate) arrived: oneshot::Receiver<()>,
    /// Lets the PUT through to the store.
    pub(crate) release: oneshot::Sender<()>,
}

impl HoldStore {
    pub(crate) fn new(inner: Arc<InMemory>, race: Option<(Path, Bytes)>) -> Self {
        Self {
            inner,
            hold: Mutex::new(None),
            race: Mutex::new(race),
            race_elsewhere: Mutex::new(None),
            phantom: Mutex::new(BTreeMap::new()),
            fail_puts: Mutex::new(None),
            failing_deletes: Mutex::new(Vec::new()),
            failing_lists: Mutex::new(0),
            gets: Mutex::new(Vec::new()),
            lists: Mutex::new(Vec::new()),
        }
    }

    /// `bytes` land at `key` just after our next PUT of `trigger` lands.
    pub(crate) fn race_elsewhere(&self, trigger: Path, key: Path, bytes: Bytes) {
        *self.race_elsewhere.lock().unwrap() = Some((trigger, key, bytes));
    }

    /// Lets another writer's `bytes` land at `key` just before our next PUT of it.
    pub(crate) fn race(&self, key: Path, bytes: Bytes) {
        *self.race.lock().unwrap() = Some((key, bytes));
    }

    /// Create-only PUTs of `key` conflict `times` times without writing.
    pub(crate) fn phantom_conflicts(self, key: Path, times: u32) -> Self {
        self.phantom.lock().unwrap().insert(key, times);
        self
    }

    /// Every delete of `key` fails.
    pub(crate) fn failing_delete(self, key: Path) -> Self {
        self.failing_deletes.lock().unwrap().push(key);
        self
    }

    /// The next `times` listings fail with a transient error.
    pub(crate) fn failing_lists(self, times: u32) -> Self {
        *self.failing_lists.lock().unwrap() = times;
        self
    }

    /// Whether this listing is one of the failing ones.
    fn list_fails(&self) -> bool {
        let mut left = self.failing_lists.lock().unwrap();
        let fails = *left > 0;
        *left = left.saturating_sub(1);
        fails
    }

    /// Holds the next create-only PUT of `key` until the test releases it.
    pub(crate) fn hold(&self, key: Path) -> HeldPut {
        let (arrived_tx, arrived) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        *self.hold.lock().unwrap() = Some((key, arrived_tx, release_rx));
        HeldPut { arrived, release }
    }

    /// Every later PUT of a key under `prefix` fails.
    pub(crate) fn fail_puts_under(&self, prefix: Path) {
        *self.fail_puts.lock().unwrap() = Some(prefix);
    }

    pub(crate) fn gets(&self) -> Vec<Path> {
        self.gets.lock().unwrap().clone()
    }

    pub(crate) fn lists(&self) -> Vec<(Option<Path>, Option<Path>)> {
        self.lists.lock().unwrap().clone()
    }
}

/// A listing that fails at once, as a transient store error.
fn failed_listing(
) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
    use futures::StreamExt;
    futures::stream::once(async {
        Err(object_store::Error::Generic {
            store: "HoldStore",
            source: "injected listing failure".into(),
        })
    })
    .boxed()
}

impl std::fmt::Display for HoldStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HoldStore")
    }
}

#[async_trait::async_trait]
impl ObjectStore for HoldStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        let refused = self.fail_puts.lock().unwrap().clone();
        if refused.is_some_and(|prefix| location.prefix_matches(&prefix)) {
            return Err(object_store::Error::Generic {
                store: "HoldStore",
                source: "PUT refused by the test".into(),
            });
        }
        let held = {
            let mut hold = self.hold.lock().unwrap();
            match hold.as_ref() {
                Some((key, _, _)) if key == location && matches!(opts.mode, PutMode::Create) => {
                    hold.take()
                }
                _ => None,
            }
        };
        if let Some((_, arrived, release)) = held {
            let _ = arrived.send(());
            let _ = release.await;
        }
        if matches!(opts.mode, PutMode::Create) {
            if let Some(left) = self.phantom.lock().unwrap().get_mut(location) {
                if *left > 0 {
                    *left -= 1;
                    return Err(object_store::Error::AlreadyExists {
                        path: location.to_string(),
                        source: "409 ConditionalRequestConflict".into(),
                    });
                }
            }
        }
        let raced = {
            let mut race = self.race.lock().unwrap();
            match race.as_ref() {
                Some((key, _)) if key == location => race.take(),
                _ => None,
            }
        };
        if let Some((key, bytes)) = raced {
            self.inner.put(&key, PutPayload::from(bytes)).await?;
        }
        let written = self.inner.put_opts(location, payload, opts).await?;
        let elsewhere = {
            let mut race = self.race_elsewhere.lock().unwrap();
            match race.as_ref() {
                Some((trigger, _, _)) if trigger == location => race.take(),
                _ => None,
            }
        };
        if let Some((_, key, bytes)) = elsewhere {
            self.inner.put(&key, PutPayload::from(bytes)).await?;
        }
        Ok(written)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.gets.lock().unwrap().push(location.clone());
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
        use futures::StreamExt;
        let failing = self.failing_deletes.lock().unwrap().clone();
        let inner = self.inner.clone();
        locations
            .then(move |location| {
                let (inner, failing) = (inner.clone(), failing.clone());
                async move {
                    let path = location?;
                    if failing.contains(&path) {
                        return Err(object_store::Error::Generic {
                            store: "HoldStore",
                            source: format!("delete of {path} failed").into(),
                        });
                    }
                    inner.delete(&path).await.map(|()| path)
                }
            })
            .boxed()
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.lists.lock().unwrap().push((prefix.cloned(), None));
        if self.list_fails() {
            return failed_listing();
        }
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.lists
            .lock()
            .unwrap()
            .push((prefix.cloned(), Some(offset.clone())));
        if self.list_fails() {
            return failed_listing();
        }
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
