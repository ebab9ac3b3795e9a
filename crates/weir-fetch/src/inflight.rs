//! Storage reads in flight, shared: a read whose range another read in flight covers (a fetch
//! arriving while read-ahead is still loading its bytes, or two consumers of one partition)
//! waits for that read instead of sending a second GET.
//!
//! Entries leave the registry when the read that started them finishes or is dropped; a
//! reader that joined keeps its own handle on the shared future and still gets the bytes.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use object_store::path::Path;
use weir_storage::Backing;

use crate::reader::FetchError;

/// A storage read others may wait on.
pub(crate) type SharedRead = Shared<BoxFuture<'static, Result<Bytes, FetchError>>>;

/// The reads in flight, by object.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    next_id: AtomicU64,
    reads: Mutex<HashMap<Path, Vec<Registered>>>,
}

struct Registered {
    id: u64,
    range: Range<u64>,
    read: SharedRead,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("id", &self.id)
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

/// The read in `list` whose range covers `range`.
fn covering<'a>(list: &'a [Registered], range: &Range<u64>) -> Option<&'a Registered> {
    list.iter()
        .find(|r| r.range.start <= range.start && range.end <= r.range.end)
}

/// What [`InFlight::join_or_start`] decided.
pub(crate) enum Joined {
    /// Another read covers the range: its bytes, sliced to the range asked for, and the whole
    /// read they are a slice of.
    Shared(BoxFuture<'static, Result<(Bytes, Backing), FetchError>>),
    /// This read was started and registered; the registration ends when the guard drops.
    Started(SharedRead, Registration),
}

/// Removes a started read from the registry when dropped.
pub(crate) struct Registration {
    inflight: Arc<InFlight>,
    key: Path,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reads = self.inflight.lock();
        if let Some(list) = reads.get_mut(&self.key) {
            list.retain(|r| r.id != self.id);
            if list.is_empty() {
                reads.remove(&self.key);
            }
        }
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Path, Vec<Registered>>> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins a read in flight that covers `range` of `key`, or starts `start()` and registers
    /// it. Deciding and registering happen under one lock, so two readers of one range never
    /// both start a read.
    pub(crate) fn join_or_start(
        self: &Arc<Self>,
        key: &Path,
        range: Range<u64>,
        start: impl FnOnce() -> BoxFuture<'static, Result<Bytes, FetchError>>,
    ) -> Joined {
        let mut reads = self.lock();
        let covering = reads.get(key).and_then(|list| covering(list, &range));
        if let Some(covering) = covering {
            let (read, from) = (covering.read.clone(), covering.range.start);
            let slice = (range.start - from) as usize..(range.end - from) as usize;
            return Joined::Shared(
                async move {
                    let bytes = read.await?;
                    bytes
                        .get(slice.clone())
                        .map(|_| (bytes.slice(slice), Backing::of(&bytes)))
                        .ok_or_else(|| FetchError::Storage("short read".into()))
                }
                .boxed(),
            );
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let read = start().shared();
        reads.entry(key.clone()).or_default().push(Registered {
            id,
            range,
            read: read.clone(),
        });
        Joined::Started(
            read,
            Registration {
                inflight: self.clone(),
                key: key.clone(),
                id,
            },
        )
    }

    /// Whether a read in flight covers `range` of `key`.
    pub(crate) fn covers(&self, key: &Path, range: &Range<u64>) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|list| covering(list, range).is_some())
    }

    /// Reads in flight (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}
