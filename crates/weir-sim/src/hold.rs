//! A paused log write: one incarnation's metadata store, wrapped so that one create-only PUT of
//! a log slot waits before it is sent until the driver releases it. It also tells the driver
//! when a recovery, filling a deposed writer's holes, reaches a slot it listed (the moment the
//! second of two overlapping recoveries starts in one of their variants).
//!
//! It sits above the storage layer (its deadlines and retries), so it models a process paused
//! between sealing a slot and sending its PUT (a GC pause, a frozen VM), or a request that
//! stalls on the wire while its sender keeps waiting: when released, the PUT goes out and the
//! writer sees whatever the bucket answers then. RFC 0003 §7 argues that log GC cannot let such
//! a write acknowledge anything replay does not hold (the stalled writer, the stalled recovery).

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use tokio::sync::watch;
use weir_storage::keys;

/// The driver's side of one incarnation's paused write.
#[derive(Debug)]
pub(crate) struct HoldSwitch {
    armed: AtomicBool,
    /// The slot whose PUT is held, once one was.
    caught: Mutex<Option<u64>>,
    released: watch::Sender<bool>,
    /// Log slots read since the incarnation listed the log past a slot (a recovery filling a
    /// deposed writer's holes lists, reads each listed slot, then reads each again as it gets
    /// to it), and whether one was read a second time: the recovery is filling.
    filling: Mutex<Option<std::collections::HashSet<u64>>>,
    probing: AtomicBool,
}

impl Default for HoldSwitch {
    fn default() -> Self {
        HoldSwitch {
            armed: AtomicBool::new(false),
            caught: Mutex::new(None),
            released: watch::channel(false).0,
            filling: Mutex::new(None),
            probing: AtomicBool::new(false),
        }
    }
}

impl HoldSwitch {
    /// Holds the next create-only PUT of a log slot.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Stops waiting for a PUT to hold (none came).
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// The slot whose PUT is held (or was, once released).
    pub(crate) fn caught(&self) -> Option<u64> {
        *self.caught.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets the held PUT go out.
    pub(crate) fn release(&self) {
        self.released.send_replace(true);
    }

    /// Whether the incarnation read a log slot a second time since it listed the log past a
    /// slot: a recovery reaching a listed slot as it fills holes.
    pub(crate) fn probing(&self) -> bool {
        self.probing.load(Ordering::SeqCst)
    }

    fn listed_log(&self) {
        *self.filling.lock().unwrap_or_else(|e| e.into_inner()) = Some(Default::default());
    }

    fn read_slot(&self, location: &Path) {
        let Some(seq) = keys::parse_meta_log(location) else {
            return;
        };
        let mut filling = self.filling.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(read) = filling.as_mut() {
            if !read.insert(seq) {
                self.probing.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Takes the PUT of `location` if armed and it is a create-only log slot write.
    fn take(&self, location: &Path, mode: &PutMode) -> bool {
        if !matches!(mode, PutMode::Create) {
            return false;
        }
        let Some(seq) = keys::parse_meta_log(location) else {
            return false;
        };
        if !self.armed.swap(false, Ordering::SeqCst) {
            return false;
        }
        *self.caught.lock().unwrap_or_else(|e| e.into_inner()) = Some(seq);
        true
    }
}

/// An incarnation's metadata store with a [`HoldSwitch`].
#[derive(Debug)]
pub(crate) struct SlotHold {
    inner: Arc<dyn ObjectStore>,
    switch: Arc<HoldSwitch>,
}

impl SlotHold {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, switch: Arc<HoldSwitch>) -> SlotHold {
        SlotHold { inner, switch }
    }
}

impl fmt::Display for SlotHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotHold({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for SlotHold {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.switch.take(location, &opts.mode) {
            let mut released = self.switch.released.subscribe();
            let _ = released.wait_for(|released| *released).await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.switch.read_slot(location);
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if prefix == Some(&keys::meta_log_prefix()) {
            self.switch.listed_log();
        }
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
