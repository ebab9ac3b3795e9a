//! The WriterPool: ready appendable objects made in the background, so a file upload on a zonal
//! bucket pays one append + flush instead of a create (DESIGN §4; seed 000's loading queue).
//!
//! The pool is generic over a [`PoolLoader`], which makes one item (for ingest: one open object
//! per quorum bucket under one file key, see [`crate::append::ingest`]) and discards one.
//!
//! - **Never blocks while a spare exists.** [`WriterPool::take`] returns the oldest ready item
//!   at once. With none ready (a *miss*) it loads one inline: the caller pays a create, as it
//!   would without a pool.
//! - **Refills at the drain rate.** Every take starts a replacement load, up to `target_ready`
//!   items ready or loading and `load_concurrency` loads at once.
//! - **Items older than `max_item_age` are never used.** They are discarded (by a timer and on
//!   take) through the loader's discard path. Keep `max_item_age` below the orphan sweep's age,
//!   or the sweep could delete an object that is about to be written (config validation refuses
//!   it).
//! - **No churn when idle.** An expired item is replaced only if the pool was drained within the
//!   last `max_item_age`; after that, it empties and makes nothing until the next take. So an
//!   idle agent creates at most `target_ready` objects after its last write, then none (the
//!   counters in [`PoolStats`] show it).
//! - A load that fails is retried after a backoff (doubling up to [`MAX_LOAD_BACKOFF`]), not in
//!   a loop.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::StorageError;

/// Longest wait between retries of a failing load.
pub const MAX_LOAD_BACKOFF: Duration = Duration::from_secs(30);

/// First wait after a failed load.
const FIRST_LOAD_BACKOFF: Duration = Duration::from_millis(100);

/// Pool sizing (config section `[storage.pool]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Items kept ready (and loading) while the pool is in use.
    pub target_ready: usize,
    /// Loads running at once at most.
    pub load_concurrency: usize,
    /// Items older than this are discarded, never used.
    pub max_item_age: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            // An agent sealing one file per 5 ms flush (200 files/s) drains ~22 items during one
            // GCS Rapid create at its p99 (110 ms); twice that keeps a margin. 24 loads at once
            // keep up with 200 files/s at the create p50 (75 ms needs 15).
            target_ready: 48,
            load_concurrency: 24,
            max_item_age: Duration::from_secs(5 * 60),
        }
    }
}

impl PoolSettings {
    /// Checks the settings, and that an item can never live as long as `orphan_age`, the age at
    /// which the orphan sweep deletes objects no log entry names.
    pub fn validate(&self, orphan_age: Duration) -> Result<(), StorageError> {
        if self.load_concurrency == 0 {
            return Err(StorageError::InvalidConfig(
                "storage.pool.load_concurrency must be at least 1".to_string(),
            ));
        }
        if self.max_item_age.is_zero() {
            return Err(StorageError::InvalidConfig(
                "storage.pool.max_item_age must be above zero".to_string(),
            ));
        }
        if self.max_item_age >= orphan_age {
            return Err(StorageError::InvalidConfig(format!(
                "storage.pool.max_item_age ({:?}) must be below gc.orphan_age ({orphan_age:?}): \
                 the orphan sweep deletes unreferenced objects older than that, and a pooled \
                 object is unreferenced until its file commits",
                self.max_item_age
            )));
        }
        Ok(())
    }
}

/// Makes and discards pool items.
#[async_trait]
pub trait PoolLoader: Send + Sync + 'static {
    /// What the pool hands out.
    type Item: Send + 'static;

    /// Makes one ready item (off the hot path, except on a miss).
    async fn load(&self) -> Result<Self::Item, StorageError>;

    /// Disposes of an item that will never be used (expired, or the pool shut down).
    async fn discard(&self, item: Self::Item);
}

/// Counters of a pool since start, and its current size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Items ready now.
    pub ready: u64,
    /// Loads running now.
    pub loading: u64,
    /// Takes served from a ready item.
    pub hits: u64,
    /// Takes that found none ready and loaded inline.
    pub misses: u64,
    /// Items made (background and inline).
    pub created: u64,
    /// Items discarded unused.
    pub discarded: u64,
    /// Loads that failed.
    pub load_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    created: AtomicU64,
    discarded: AtomicU64,
    load_errors: AtomicU64,
}

struct State<T> {
    /// Oldest first.
    ready: VecDeque<(Instant, T)>,
    loading: usize,
    /// The last take (or the pool's start): the pool refills only within `max_item_age` of it.
    last_take: Instant,
    /// While set, background loads wait until then (after a failure).
    backoff_until: Option<Instant>,
    backoff: Duration,
    closed: bool,
}

struct Inner<L: PoolLoader> {
    loader: L,
    settings: PoolSettings,
    state: Mutex<State<L::Item>>,
    counters: Counters,
}

/// A pool of ready items (see the module docs). Cheap to clone; the background work stops when
/// the last clone is dropped or [`WriterPool::shutdown`] is called.
pub struct WriterPool<L: PoolLoader> {
    inner: Arc<Inner<L>>,
}

impl<L: PoolLoader> Clone for WriterPool<L> {
    fn clone(&self) -> Self {
        WriterPool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<L: PoolLoader> WriterPool<L> {
    /// Starts a pool and its first loads (an agent that starts is about to be used). Must be
    /// called inside a tokio runtime.
    pub fn start(loader: L, settings: PoolSettings) -> WriterPool<L> {
        let inner = Arc::new(Inner {
            loader,
            settings,
            state: Mutex::new(State {
                ready: VecDeque::new(),
                loading: 0,
                last_take: Instant::now(),
                backoff_until: None,
                backoff: FIRST_LOAD_BACKOFF,
                closed: false,
            }),
            counters: Counters::default(),
        });
        tokio::spawn(expiry_loop(Arc::downgrade(&inner)));
        refill(&inner);
        WriterPool { inner }
    }

    /// The settings the pool runs with.
    pub fn settings(&self) -> PoolSettings {
        self.inner.settings
    }

    /// The loader.
    pub fn loader(&self) -> &L {
        &self.inner.loader
    }

    /// The oldest ready item younger than `max_item_age`, or — a miss — one loaded now.
    pub async fn take(&self) -> Result<L::Item, StorageError> {
        let inner = &self.inner;
        let (item, expired) = {
            let mut state = inner.lock();
            state.last_take = Instant::now();
            let expired = take_expired(&mut state, inner.settings.max_item_age);
            (state.ready.pop_front().map(|(_, item)| item), expired)
        };
        discard_all(inner, expired);
        refill(inner);
        if let Some(item) = item {
            inner.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(item);
        }
        inner.counters.misses.fetch_add(1, Ordering::Relaxed);
        let item = inner.loader.load().await;
        match &item {
            Ok(_) => inner.counters.created.fetch_add(1, Ordering::Relaxed),
            Err(_) => inner.counters.load_errors.fetch_add(1, Ordering::Relaxed),
        };
        item
    }

    /// Current size and counters.
    pub fn stats(&self) -> PoolStats {
        let (ready, loading) = {
            let state = self.inner.lock();
            (state.ready.len() as u64, state.loading as u64)
        };
        let c = &self.inner.counters;
        PoolStats {
            ready,
            loading,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            created: c.created.load(Ordering::Relaxed),
            discarded: c.discarded.load(Ordering::Relaxed),
            load_errors: c.load_errors.load(Ordering::Relaxed),
        }
    }

    /// Stops refilling and discards every ready item (loads still running discard theirs when
    /// they finish).
    pub async fn shutdown(&self) {
        let items: Vec<_> = {
            let mut state = self.inner.lock();
            state.closed = true;
            state.ready.drain(..).map(|(_, item)| item).collect()
        };
        for item in items {
            self.inner
                .counters
                .discarded
                .fetch_add(1, Ordering::Relaxed);
            self.inner.loader.discard(item).await;
        }
    }
}

impl<L: PoolLoader> Inner<L> {
    fn lock(&self) -> MutexGuard<'_, State<L::Item>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many items the pool should hold (ready + loading) now.
    fn wanted(&self, state: &State<L::Item>, now: Instant) -> usize {
        let in_use = now.saturating_duration_since(state.last_take) < self.settings.max_item_age;
        if state.closed || !in_use {
            0
        } else {
            self.settings.target_ready
        }
    }
}

/// Removes the expired items from the front (the oldest).
fn take_expired<T>(state: &mut State<T>, max_age: Duration) -> Vec<T> {
    let now = Instant::now();
    let mut expired = Vec::new();
    while let Some((made, _)) = state.ready.front() {
        if now.saturating_duration_since(*made) < max_age {
            break;
        }
        if let Some((_, item)) = state.ready.pop_front() {
            expired.push(item);
        }
    }
    expired
}

fn discard_all<L: PoolLoader>(inner: &Arc<Inner<L>>, items: Vec<L::Item>) {
    for item in items {
        inner.counters.discarded.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::clone(inner);
        tokio::spawn(async move { inner.loader.discard(item).await });
    }
}

/// Starts loads until ready + loading reaches what the pool wants, within `load_concurrency`
/// and outside a backoff.
fn refill<L: PoolLoader>(inner: &Arc<Inner<L>>) {
    let mut state = inner.lock();
    let now = Instant::now();
    if state.backoff_until.is_some_and(|until| now < until) {
        return;
    }
    let wanted = inner.wanted(&state, now);
    while state.ready.len() + state.loading < wanted
        && state.loading < inner.settings.load_concurrency
    {
        state.loading += 1;
        tokio::spawn(load_one(Arc::clone(inner)));
    }
}

async fn load_one<L: PoolLoader>(inner: Arc<Inner<L>>) {
    // An item's age counts from when its load started: its objects (and its file id) may be that
    // old when the load ends after a slow bucket's create.
    let started = Instant::now();
    let result = inner.loader.load().await;
    let surplus = {
        let mut state = inner.lock();
        state.loading -= 1;
        match result {
            Ok(item) => {
                inner.counters.created.fetch_add(1, Ordering::Relaxed);
                state.backoff = FIRST_LOAD_BACKOFF;
                state.backoff_until = None;
                let now = Instant::now();
                if state.ready.len() < inner.wanted(&state, now) {
                    state.ready.push_back((started, item));
                    None
                } else {
                    Some(item)
                }
            }
            Err(err) => {
                inner.counters.load_errors.fetch_add(1, Ordering::Relaxed);
                let wait = state.backoff;
                state.backoff = (wait * 2).min(MAX_LOAD_BACKOFF);
                state.backoff_until = Some(Instant::now() + wait);
                tracing::warn!(error = %err, retry_in = ?wait, "writer pool: making a ready object failed; retrying after a backoff (check the bucket named in the error)");
                None
            }
        }
    };
    discard_all(&inner, surplus.into_iter().collect());
    refill(&inner);
}

/// Discards expired items and retries after backoffs; ends when the pool is dropped.
async fn expiry_loop<L: PoolLoader>(pool: Weak<Inner<L>>) {
    loop {
        let wait = {
            let Some(inner) = pool.upgrade() else { return };
            let (expired, next) = {
                let mut state = inner.lock();
                let expired = take_expired(&mut state, inner.settings.max_item_age);
                let next_expiry = state
                    .ready
                    .front()
                    .map(|(made, _)| *made + inner.settings.max_item_age);
                let next = [next_expiry, state.backoff_until]
                    .into_iter()
                    .flatten()
                    .min();
                (expired, next)
            };
            discard_all(&inner, expired);
            refill(&inner);
            // Wake at the next expiry or backoff end; otherwise check again after a while (a
            // take may have made items since).
            next.map_or(inner.settings.max_item_age, |at| {
                at.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            })
        };
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests;
