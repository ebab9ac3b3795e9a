//! Quorum writes across zonal buckets (DESIGN §4, DUR-1/DUR-2).
//!
//! [`QuorumWriter::put`] writes one object to all `n` buckets in parallel and returns as soon as
//! `k` of them acknowledged it, with the indices of those holders; the remaining writes keep
//! running in the background (spawned tasks), so the object usually ends up in all `n` buckets.
//! Reads go to any bucket that holds the object.
//!
//! Background writes are bounded per bucket: each bucket has a budget of payload bytes it may
//! have in writes that are still running after their put returned
//! ([`QuorumWriter::with_max_lagging_bytes`]). When a put returns, a remaining write whose bucket
//! has no budget left is abandoned (its task aborted) instead of piling up behind a slow bucket.
//! That is safe because holder lists only ever name buckets that acknowledged before the put
//! returned, so no read is ever sent to an abandoned copy. Abandoned writes are counted
//! ([`QuorumWriter::lag_stats`]) and reported by a rate-limited warning.
//!
//! Reads hedge: a read that has not answered within `read_hedge_after` also asks the next
//! holder, and the first answer wins.
//!
//! Not yet: hedging slow writes, and reporting background completions to the caller.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutOptions, PutPayload};
use tokio::task::AbortHandle;

use crate::append::AppendWriter;
use crate::StorageError;

/// Default budget of payload bytes in background writes per bucket (64 MiB).
pub const DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET: u64 = 64 << 20;

/// Default wait before a slow read also asks the next holder.
pub const DEFAULT_READ_HEDGE_AFTER: Duration = Duration::from_millis(250);

/// At most one "abandoned background writes" warning per bucket per this interval.
const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Background-write figures of one bucket (see [`QuorumWriter::lag_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LagStats {
    /// Writes still running after their put returned.
    pub lagging_writes: u64,
    /// Their payload bytes (never above the budget).
    pub lagging_bytes: u64,
    /// Writes abandoned since start because the budget was used up.
    pub abandoned_writes: u64,
    /// Their payload bytes.
    pub abandoned_bytes: u64,
}

/// Writes objects to a quorum of buckets.
#[derive(Debug, Clone)]
pub struct QuorumWriter {
    buckets: Vec<Arc<dyn ObjectStore>>,
    quorum: usize,
    max_lagging_bytes: u64,
    /// One per bucket, shared by clones of this writer.
    lag: Vec<Arc<BucketLag>>,
    read_hedge_after: Duration,
    hedged_reads: Arc<AtomicU64>,
    /// Join a payload's parts once before it fans out (see [`Self::with_contiguous_payloads`]).
    contiguous_payloads: bool,
}

impl QuorumWriter {
    /// A writer over `buckets` that needs `quorum` acknowledgements (1 ≤ quorum ≤ buckets), with
    /// the default background-write budget ([`DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET`]).
    pub fn new(buckets: Vec<Arc<dyn ObjectStore>>, quorum: usize) -> Result<Self, StorageError> {
        if quorum == 0 || quorum > buckets.len() {
            return Err(StorageError::InvalidConfig(format!(
                "quorum {quorum} must be between 1 and the number of buckets ({})",
                buckets.len()
            )));
        }
        let lag = buckets.iter().map(|_| Arc::default()).collect();
        Ok(QuorumWriter {
            buckets,
            quorum,
            max_lagging_bytes: DEFAULT_MAX_LAGGING_BYTES_PER_BUCKET,
            lag,
            read_hedge_after: DEFAULT_READ_HEDGE_AFTER,
            hedged_reads: Arc::default(),
            contiguous_payloads: false,
        })
    }

    /// Joins a payload of several parts into one buffer once, before it goes to every bucket.
    /// For in-process buckets (`memory://`): their store copies a payload of several parts into
    /// a buffer of its own, one copy per bucket, into freshly faulted memory, while a payload
    /// of one part it keeps as it is (shared by every bucket). Remote buckets stream the parts
    /// and need no copy, so this stays off for them.
    pub fn with_contiguous_payloads(mut self, contiguous: bool) -> Self {
        self.contiguous_payloads = contiguous;
        self
    }

    /// Whether payloads of several parts are joined before they fan out (in-process buckets).
    pub fn contiguous_payloads(&self) -> bool {
        self.contiguous_payloads
    }

    /// Sets the budget of payload bytes each bucket may have in writes still running after their
    /// put returned. Larger keeps more extra copies through a slow patch of one bucket, at the
    /// cost of up to `bytes` of memory per bucket; 0 abandons every write still running when
    /// its put returns (objects then land in the quorum and whichever buckets were as fast).
    pub fn with_max_lagging_bytes(mut self, bytes: u64) -> Self {
        self.max_lagging_bytes = bytes;
        self
    }

    /// The budget set by [`Self::with_max_lagging_bytes`].
    pub fn max_lagging_bytes(&self) -> u64 {
        self.max_lagging_bytes
    }

    /// The buckets, indexed as in holder lists.
    pub fn buckets(&self) -> &[Arc<dyn ObjectStore>] {
        &self.buckets
    }

    /// The number of acknowledgements a put needs.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Background-write figures per bucket, indexed as [`Self::buckets`].
    pub fn lag_stats(&self) -> Vec<LagStats> {
        self.lag.iter().map(|lag| lag.stats()).collect()
    }

    /// Writes `payload` to `path` in every bucket (overwrite mode); see [`Self::put_opts`].
    pub async fn put(&self, path: &Path, payload: PutPayload) -> Result<Vec<usize>, StorageError> {
        self.put_opts(path, payload, PutOptions::default()).await
    }

    /// Writes `payload` to `path` in every bucket with `opts`. Returns the sorted indices of the
    /// buckets that acknowledged once `quorum` did; fails with [`StorageError::QuorumFailed`]
    /// as soon as so many buckets failed that a quorum is impossible. Either way (and if this
    /// future is dropped early), writes still in flight continue in the background while their
    /// bucket's budget allows and are abandoned otherwise; they never appear in a holder list.
    pub async fn put_opts(
        &self,
        path: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<Vec<usize>, StorageError> {
        let payload = if self.contiguous_payloads && payload.as_ref().len() > 1 {
            PutPayload::from(Bytes::from(payload))
        } else {
            payload
        };
        let writes = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, bucket)| {
                let bucket = Arc::clone(bucket);
                let path = path.clone();
                let payload = payload.clone();
                let opts = opts.clone();
                Ok(async move {
                    let result = bucket.put_opts(&path, payload, opts).await;
                    if let Err(e) = &result {
                        tracing::debug!(bucket = i, %path, error = %e, "quorum put to bucket failed");
                    }
                    result.map(|_| ()).map_err(StorageError::from)
                })
            })
            .collect();
        self.run_quorum(payload.content_length() as u64, writes)
            .await
    }

    /// Writes `parts` into the open appendable objects `writers` (one per bucket, `None` where
    /// the object could not be created) and flushes them; returns the holders once `quorum`
    /// flushes succeeded, exactly like [`Self::put_opts`] (the same background budget). Each
    /// writer is closed in the background after its flush, without finalizing: an unfinalized
    /// object reads like any other, and finalizing is a metadata operation nobody waits for.
    pub async fn append_flush(
        &self,
        path: &Path,
        writers: Vec<Option<Box<dyn AppendWriter>>>,
        parts: &[Bytes],
    ) -> Result<Vec<usize>, StorageError> {
        if writers.len() != self.buckets.len() {
            return Err(StorageError::InvalidConfig(format!(
                "{} open objects for {} buckets",
                writers.len(),
                self.buckets.len()
            )));
        }
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        let writes = writers
            .into_iter()
            .enumerate()
            .map(|(i, writer)| {
                let Some(mut writer) = writer else {
                    return Err(StorageError::from(object_store::Error::NotFound {
                        path: path.to_string(),
                        source: format!("bucket {i} has no open object for this file").into(),
                    }));
                };
                let parts = parts.to_vec();
                let path = path.clone();
                Ok(async move {
                    let result = append_all(writer.as_mut(), parts).await;
                    match &result {
                        Ok(_) => {
                            tokio::spawn(async move {
                                if let Err(e) = writer.close().await {
                                    tracing::debug!(bucket = i, %path, error = %e, "closing a written object failed");
                                }
                            });
                        }
                        Err(e) => {
                            tracing::debug!(bucket = i, %path, error = %e, "quorum append to bucket failed");
                        }
                    }
                    result.map(|_| ())
                })
            })
            .collect();
        self.run_quorum(bytes, writes).await
    }

    /// Runs one write per bucket (an `Err` is a write that failed before it started) as tasks,
    /// returns the sorted holders once `quorum` succeeded or [`StorageError::QuorumFailed`] once
    /// a quorum is impossible; writes still running are then charged to their bucket's budget
    /// of `bytes` or abandoned.
    async fn run_quorum<F>(
        &self,
        bytes: u64,
        writes: Vec<Result<F, StorageError>>,
    ) -> Result<Vec<usize>, StorageError>
    where
        F: Future<Output = Result<(), StorageError>> + Send + 'static,
    {
        let mut in_flight = InFlight {
            writer: self,
            bytes,
            writes: Vec::with_capacity(self.buckets.len()),
        };
        let mut pending = FuturesUnordered::new();
        let mut early = Vec::new();
        for (i, write) in writes.into_iter().enumerate() {
            let write = match write {
                Ok(write) => write,
                Err(e) => {
                    early.push(e);
                    continue;
                }
            };
            let slot = Arc::new(Mutex::new(Slot::Running));
            let guard = SlotGuard {
                slot: Arc::clone(&slot),
                lag: Arc::clone(&self.lag[i]),
            };
            let task = tokio::spawn(async move {
                // Dropped when the write ends or its task is aborted: releases the budget.
                let _guard = guard;
                write.await
            });
            in_flight.writes.push((i, slot, task.abort_handle()));
            pending.push(async move { (i, task.await) });
        }

        let n = self.buckets.len();
        let mut succeeded = Vec::with_capacity(self.quorum);
        let mut failed = 0;
        for error in early {
            failed += 1;
            if n - failed < self.quorum {
                return Err(self.quorum_failed(succeeded.len(), error));
            }
        }
        while let Some((i, joined)) = pending.next().await {
            let error = match joined {
                Ok(Ok(())) => {
                    succeeded.push(i);
                    if succeeded.len() == self.quorum {
                        // Dropping `pending` detaches the remaining tasks; dropping `in_flight`
                        // then charges them to their buckets' budgets or aborts them.
                        succeeded.sort_unstable();
                        return Ok(succeeded);
                    }
                    continue;
                }
                Ok(Err(e)) => e,
                Err(join) => StorageError::from(object_store::Error::from(join)),
            };
            failed += 1;
            if n - failed < self.quorum {
                return Err(self.quorum_failed(succeeded.len(), error));
            }
        }
        unreachable!("every bucket reports success or failure and one of both thresholds is hit")
    }

    fn quorum_failed(&self, succeeded: usize, last_error: StorageError) -> StorageError {
        StorageError::QuorumFailed {
            needed: self.quorum,
            succeeded,
            last_error: Box::new(last_error),
        }
    }

    /// Reads `range` of `path` from the holders in order: the next holder is asked as soon as
    /// one fails, or — hedging a slow bucket — once the reads in flight have taken longer than
    /// [`Self::with_read_hedge_after`]; the first answer wins and the others are dropped.
    pub async fn get_range(
        &self,
        holders: &[usize],
        path: &Path,
        range: Range<u64>,
    ) -> Result<Bytes, StorageError> {
        let mut last_error = None;
        let mut next = holders.iter();
        let mut in_flight = FuturesUnordered::new();
        loop {
            if in_flight.is_empty() {
                // Start the next readable holder (nothing else is running).
                let Some(&i) = next.next() else {
                    return Err(last_error.unwrap_or_else(|| {
                        StorageError::InvalidConfig(format!("no holders given for {path}"))
                    }));
                };
                match self.buckets.get(i) {
                    Some(bucket) => in_flight.push(read_one(i, bucket, path, range.clone())),
                    None => {
                        last_error = Some(StorageError::InvalidConfig(format!(
                            "holder index {i} out of range (have {} buckets)",
                            self.buckets.len()
                        )))
                    }
                }
                continue;
            }
            let hedge = self.read_hedge_after;
            let can_hedge = !hedge.is_zero() && next.len() > 0;
            tokio::select! {
                biased;
                Some((i, result)) = in_flight.next() => match result {
                    Ok(bytes) => return Ok(bytes),
                    Err(e) => {
                        tracing::debug!(bucket = i, %path, error = %e, "read from holder failed");
                        last_error = Some(e.into());
                    }
                },
                _ = tokio::time::sleep(hedge), if can_hedge => {
                    if let Some(bucket) = next.next().and_then(|&i| self.buckets.get(i).map(|b| (i, b))) {
                        self.hedged_reads.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(bucket = bucket.0, %path, ?hedge, "slow read: asking the next holder too");
                        in_flight.push(read_one(bucket.0, bucket.1, path, range.clone()));
                    }
                }
            }
        }
    }

    /// Sets how long reads may run before the next holder is asked as well (zero: only after a
    /// failure). Lower cuts the read latency a slow bucket adds, at the cost of duplicate GETs.
    pub fn with_read_hedge_after(mut self, after: Duration) -> Self {
        self.read_hedge_after = after;
        self
    }

    /// Reads that asked a second holder because the first was slow, since start.
    pub fn hedged_reads(&self) -> u64 {
        self.hedged_reads.load(Ordering::Relaxed)
    }
}

/// Appends `parts` at the writer's offset and flushes them.
async fn append_all(writer: &mut dyn AppendWriter, parts: Vec<Bytes>) -> Result<u64, StorageError> {
    for part in parts {
        writer.append(writer.offset(), part).await?;
    }
    writer.flush().await
}

async fn read_one(
    index: usize,
    bucket: &Arc<dyn ObjectStore>,
    path: &Path,
    range: Range<u64>,
) -> (usize, object_store::Result<Bytes>) {
    (index, bucket.get_range(path, range).await)
}

/// Where one bucket's write of one put stands, as far as the budget is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Running, and its put has not returned yet: not charged to the budget.
    Running,
    /// Still running after its put returned: charged this many bytes.
    Charged(u64),
    /// Finished (or aborted).
    Done,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lives inside a write's task; marks the slot done and releases its charge when dropped.
struct SlotGuard {
    slot: Arc<Mutex<Slot>>,
    lag: Arc<BucketLag>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let previous = std::mem::replace(&mut *lock(&self.slot), Slot::Done);
        if let Slot::Charged(bytes) = previous {
            self.lag.release(bytes);
        }
    }
}

/// The writes of one put; when dropped (the put returned or was cancelled), every write still
/// running is charged to its bucket's budget or, if that is used up, aborted.
struct InFlight<'a> {
    writer: &'a QuorumWriter,
    bytes: u64,
    /// Per started write: its bucket, budget slot and task.
    writes: Vec<(usize, Arc<Mutex<Slot>>, AbortHandle)>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let max = self.writer.max_lagging_bytes;
        for (i, slot, task) in &self.writes {
            let i = *i;
            let lag = &self.writer.lag[i];
            // Holding the slot lock, the task cannot finish (and release) in between.
            let mut state = lock(slot);
            if *state != Slot::Running {
                continue;
            }
            if lag.try_charge(self.bytes, max) {
                *state = Slot::Charged(self.bytes);
            } else {
                drop(state);
                task.abort();
                lag.abandoned(i, self.bytes, max);
            }
        }
    }
}

/// Background-write accounting of one bucket.
#[derive(Debug, Default)]
struct BucketLag {
    lagging_writes: AtomicU64,
    lagging_bytes: AtomicU64,
    abandoned_writes: AtomicU64,
    abandoned_bytes: AtomicU64,
    warn: Mutex<WarnLimiter>,
}

impl BucketLag {
    /// Charges `bytes` if that keeps the total within `max`.
    fn try_charge(&self, bytes: u64, max: u64) -> bool {
        let charged = self
            .lagging_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                current.checked_add(bytes).filter(|total| *total <= max)
            })
            .is_ok();
        if charged {
            self.lagging_writes.fetch_add(1, Ordering::AcqRel);
        }
        charged
    }

    fn release(&self, bytes: u64) {
        self.lagging_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.lagging_writes.fetch_sub(1, Ordering::AcqRel);
    }

    fn abandoned(&self, bucket: usize, bytes: u64, max: u64) {
        let total = self.abandoned_writes.fetch_add(1, Ordering::AcqRel) + 1;
        self.abandoned_bytes.fetch_add(bytes, Ordering::AcqRel);
        if let Some(since_last) = lock(&self.warn).record(Instant::now()) {
            tracing::warn!(
                bucket,
                abandoned = since_last,
                abandoned_total = total,
                lagging_bytes = self.lagging_bytes.load(Ordering::Acquire),
                max_lagging_bytes_per_bucket = max,
                "bucket is lagging: abandoned background writes beyond the quorum (those files \
                 stay readable from their quorum holders)"
            );
        }
    }

    fn stats(&self) -> LagStats {
        LagStats {
            lagging_writes: self.lagging_writes.load(Ordering::Acquire),
            lagging_bytes: self.lagging_bytes.load(Ordering::Acquire),
            abandoned_writes: self.abandoned_writes.load(Ordering::Acquire),
            abandoned_bytes: self.abandoned_bytes.load(Ordering::Acquire),
        }
    }
}

/// Turns a stream of events into at most one report per [`WARN_INTERVAL`].
#[derive(Debug, Default)]
struct WarnLimiter {
    last: Option<Instant>,
    unreported: u64,
}

impl WarnLimiter {
    /// Records one event at `now`; returns the number of events to report (this one and those
    /// suppressed since the last report) when a report is due.
    fn record(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        let due = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_INTERVAL);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use object_store::memory::InMemory;

    use super::*;
    use crate::model::{LatencyProfile, ModelStore, OpLatency};

    fn fixed(put_ms: u64) -> LatencyProfile {
        let mut p = LatencyProfile::local();
        p.name = format!("fixed-{put_ms}");
        p.put = OpLatency::millis(put_ms, put_ms);
        p.get = OpLatency::millis(1, 1);
        p
    }

    fn model(profile: LatencyProfile, seed: u64) -> Arc<ModelStore> {
        Arc::new(ModelStore::new(Arc::new(InMemory::new()), profile, seed).unwrap())
    }

    fn as_dyn(stores: &[Arc<ModelStore>]) -> Vec<Arc<dyn ObjectStore>> {
        stores
            .iter()
            .map(|s| Arc::clone(s) as Arc<dyn ObjectStore>)
            .collect()
    }

    #[test]
    fn test_quorum_new_validates() {
        let b: Vec<Arc<dyn ObjectStore>> = vec![Arc::new(InMemory::new())];
        assert!(QuorumWriter::new(b.clone(), 0).is_err());
        assert!(QuorumWriter::new(b.clone(), 2).is_err());
        assert!(QuorumWriter::new(b, 1).is_ok());
    }

    /// In-process buckets keep a one-part payload as it is: with contiguous payloads the parts
    /// are joined once and every bucket holds that same buffer; without, each bucket's store
    /// joins them into a buffer of its own.
    #[tokio::test]
    async fn test_contiguous_payloads_share_one_buffer_across_in_process_buckets() {
        for contiguous in [true, false] {
            let buckets: Vec<Arc<dyn ObjectStore>> =
                (0..3).map(|_| Arc::new(InMemory::new()) as _).collect();
            let qw = QuorumWriter::new(buckets.clone(), 3)
                .unwrap()
                .with_contiguous_payloads(contiguous);
            let parts = [&b"head"[..], b"batch-1", b"batch-2", b"footer"];
            let payload: PutPayload = parts.iter().map(|p| Bytes::from_static(p)).collect();
            let key = Path::from("file");
            qw.put(&key, payload).await.unwrap();
            let mut stored = Vec::new();
            for bucket in &buckets {
                stored.push(bucket.get(&key).await.unwrap().bytes().await.unwrap());
            }
            assert!(stored.iter().all(|b| &b[..] == b"headbatch-1batch-2footer"));
            let shared = stored.iter().all(|b| b.as_ptr() == stored[0].as_ptr());
            assert_eq!(shared, contiguous, "contiguous {contiguous}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_succeeds_with_one_failing_bucket_of_three() {
        let stores: Vec<_> = (0..3)
            .map(|i| model(LatencyProfile::named("s3-express").unwrap(), i))
            .collect();
        stores[1].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let key = crate::keys::ingest_file("f1", 0);
        let holders = qw
            .put(&key, PutPayload::from_static(b"payload"))
            .await
            .unwrap();
        assert_eq!(holders, vec![0, 2]);
        let got = qw.get_range(&[1, 0, 2], &key, 0..3).await.unwrap();
        assert_eq!(&got[..], b"pay");
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_returns_early_and_finishes_in_background() {
        let stores = vec![
            model(fixed(5), 0),
            model(fixed(10), 1),
            model(fixed(500), 2),
        ];
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let key = Path::from("k");
        let start = tokio::time::Instant::now();
        let holders = qw.put(&key, PutPayload::from_static(b"v")).await.unwrap();
        assert_eq!(holders, vec![0, 1]);
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        assert!(
            stores[2].head(&key).await.is_err(),
            "slow bucket not done yet"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(stores[2].head(&key).await.is_ok(), "slow write completed");
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_failure_when_quorum_impossible() {
        let stores = vec![
            model(fixed(5), 0),
            model(fixed(5), 1),
            model(fixed(1000), 2),
        ];
        stores[0].set_outage(true);
        stores[1].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2).unwrap();
        let start = tokio::time::Instant::now();
        let err = qw
            .put(&Path::from("k"), PutPayload::from_static(b"v"))
            .await
            .unwrap_err();
        // fails as soon as two of three failed, without waiting for the slow third
        assert!(
            start.elapsed() < Duration::from_millis(100),
            "{:?}",
            start.elapsed()
        );
        match &err {
            StorageError::QuorumFailed {
                needed, succeeded, ..
            } => assert_eq!((*needed, *succeeded), (2, 0)),
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.is_retryable());
    }

    fn get_latency(millis: u64) -> LatencyProfile {
        let mut p = LatencyProfile::local();
        p.name = format!("get-{millis}");
        p.get = OpLatency::millis(millis, millis);
        p
    }

    /// Two holders with the object; the first answers after 2 s, the second after 10 ms.
    async fn slow_first_holder(hedge: Duration) -> (QuorumWriter, Path) {
        let stores = vec![model(get_latency(2_000), 0), model(get_latency(10), 1)];
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_read_hedge_after(hedge);
        let key = Path::from("k");
        qw.put(&key, PutPayload::from_static(b"payload"))
            .await
            .unwrap();
        (qw, key)
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_get_range_hedges_a_slow_holder() {
        let (qw, key) = slow_first_holder(Duration::from_millis(100)).await;
        let start = tokio::time::Instant::now();
        let got = qw.get_range(&[0, 1], &key, 0..3).await.unwrap();
        assert_eq!(&got[..], b"pay");
        // 100 ms hedge + 10 ms from the second holder, not the first holder's 2 s.
        assert_eq!(start.elapsed(), Duration::from_millis(110));
        assert_eq!(qw.hedged_reads(), 1);
        // A fast first holder is never hedged.
        let start = tokio::time::Instant::now();
        qw.get_range(&[1, 0], &key, 0..3).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(10));
        assert_eq!(qw.hedged_reads(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_get_range_without_hedging_waits_for_the_slow_holder() {
        let (qw, key) = slow_first_holder(Duration::ZERO).await;
        let start = tokio::time::Instant::now();
        qw.get_range(&[0, 1], &key, 0..3).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(2_000));
        assert_eq!(qw.hedged_reads(), 0);
    }

    /// A failing holder hands over at once, without waiting for the hedge delay; a hedged read
    /// whose second holder fails still gets the first holder's answer.
    #[tokio::test(start_paused = true)]
    async fn test_quorum_get_range_failure_moves_on_and_hedge_failure_is_survived() {
        let stores = vec![model(get_latency(30), 0), model(get_latency(5), 1)];
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_read_hedge_after(Duration::from_millis(10));
        let key = Path::from("k");
        qw.put(&key, PutPayload::from_static(b"payload"))
            .await
            .unwrap();
        stores[0].set_outage(true);
        let start = tokio::time::Instant::now();
        qw.get_range(&[0, 1], &key, 0..3).await.unwrap();
        // The outage answers after its 30 ms latency, the hedge already asked holder 1 at 10 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(15));
        stores[0].set_outage(false);
        stores[1].set_outage(true);
        let start = tokio::time::Instant::now();
        let got = qw.get_range(&[0, 1], &key, 0..7).await.unwrap();
        assert_eq!(&got[..], b"payload");
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        stores[0].set_outage(true);
        assert!(qw.get_range(&[0, 1], &key, 0..3).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_get_range_errors() {
        let stores = vec![model(fixed(1), 0)];
        let qw = QuorumWriter::new(as_dyn(&stores), 1).unwrap();
        let key = Path::from("missing");
        assert!(matches!(
            qw.get_range(&[], &key, 0..1).await,
            Err(StorageError::InvalidConfig(_))
        ));
        assert!(matches!(
            qw.get_range(&[5], &key, 0..1).await,
            Err(StorageError::InvalidConfig(_))
        ));
        let err = qw.get_range(&[0], &key, 0..1).await.unwrap_err();
        assert!(matches!(
            err,
            StorageError::ObjectStore(object_store::Error::NotFound { .. })
        ));
    }

    /// Three buckets, quorum 2, bucket 2 takes `slow_ms` per PUT; buckets 0 and 1 take 1 ms.
    fn slow_third(slow_ms: u64) -> Vec<Arc<ModelStore>> {
        vec![
            model(fixed(1), 0),
            model(fixed(1), 1),
            model(fixed(slow_ms), 2),
        ]
    }

    fn payload(len: usize) -> PutPayload {
        PutPayload::from(vec![7u8; len])
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_lagging_budget_abandons_writes_beyond_it() {
        let stores = slow_third(1_000);
        // Room for two 100-byte background writes, not three.
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(250);
        let keys: Vec<Path> = (0..5).map(|i| Path::from(format!("k{i}"))).collect();
        for key in &keys {
            assert_eq!(qw.put(key, payload(100)).await.unwrap(), vec![0, 1]);
        }
        let stats = qw.lag_stats();
        assert_eq!(stats[0], LagStats::default());
        assert_eq!(stats[1], LagStats::default());
        assert_eq!(
            stats[2],
            LagStats {
                lagging_writes: 2,
                lagging_bytes: 200,
                abandoned_writes: 3,
                abandoned_bytes: 300,
            }
        );

        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let stats = qw.lag_stats();
        assert_eq!((stats[2].lagging_writes, stats[2].lagging_bytes), (0, 0));
        assert_eq!(stats[2].abandoned_writes, 3);
        // The two charged writes finished; the abandoned ones never reached the bucket.
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(stores[2].head(key).await.is_ok(), i < 2, "key {i}");
            assert!(stores[0].head(key).await.is_ok() && stores[1].head(key).await.is_ok());
            // Reads only ever name the quorum, so every object stays readable.
            assert_eq!(qw.get_range(&[0, 1], key, 0..2).await.unwrap().len(), 2);
        }

        // The budget is free again: the next background write is kept.
        let late = Path::from("late");
        qw.put(&late, payload(100)).await.unwrap();
        assert_eq!(qw.lag_stats()[2].lagging_bytes, 100);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(stores[2].head(&late).await.is_ok());
        assert_eq!(qw.lag_stats()[2].abandoned_writes, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_lagging_writes_under_budget_all_complete() {
        let stores = slow_third(500);
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(10 * 1_000);
        let keys: Vec<Path> = (0..10).map(|i| Path::from(format!("k{i}"))).collect();
        for key in &keys {
            qw.put(key, payload(1_000)).await.unwrap();
        }
        // Exactly at the budget: all ten are kept.
        assert_eq!(
            qw.lag_stats()[2],
            LagStats {
                lagging_writes: 10,
                lagging_bytes: 10_000,
                abandoned_writes: 0,
                abandoned_bytes: 0,
            }
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        for key in &keys {
            assert!(stores[2].head(key).await.is_ok(), "{key}");
        }
        assert_eq!(qw.lag_stats()[2], LagStats::default());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_lagging_budget_released_by_failed_background_write() {
        let stores = slow_third(1_000);
        stores[2].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(100);
        qw.put(&Path::from("a"), payload(100)).await.unwrap();
        assert_eq!(qw.lag_stats()[2].lagging_bytes, 100);
        // Full: the next one is abandoned.
        qw.put(&Path::from("b"), payload(100)).await.unwrap();
        assert_eq!(qw.lag_stats()[2].abandoned_writes, 1);
        // The background write fails after its latency and gives its bytes back.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(
            (
                qw.lag_stats()[2].lagging_writes,
                qw.lag_stats()[2].lagging_bytes
            ),
            (0, 0)
        );
        qw.put(&Path::from("c"), payload(100)).await.unwrap();
        assert_eq!(qw.lag_stats()[2].lagging_bytes, 100);
        assert_eq!(qw.lag_stats()[2].abandoned_writes, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_zero_budget_and_clones_share_accounting() {
        let stores = slow_third(200);
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(0);
        let clone = qw.clone();
        let key = Path::from("k");
        clone.put(&key, payload(10)).await.unwrap();
        assert_eq!(qw.lag_stats()[2].abandoned_writes, 1);
        assert_eq!(qw.lag_stats()[2].abandoned_bytes, 10);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(stores[2].head(&key).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_failed_put_budgets_its_remaining_writes() {
        // Buckets 0 and 1 fail fast, so the quorum fails while bucket 2 is still writing.
        let stores = slow_third(1_000);
        stores[0].set_outage(true);
        stores[1].set_outage(true);
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(0);
        let key = Path::from("k");
        assert!(qw.put(&key, payload(10)).await.is_err());
        assert_eq!(qw.lag_stats()[2].abandoned_writes, 1);
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(stores[2].head(&key).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn test_quorum_cancelled_put_budgets_its_writes() {
        let stores = slow_third(1_000);
        let qw = QuorumWriter::new(as_dyn(&stores), 2)
            .unwrap()
            .with_max_lagging_bytes(10);
        let key = Path::from("k");
        // Dropped before any bucket answered (they take 1 ms and 1 s).
        let put = tokio::time::timeout(Duration::from_micros(100), qw.put(&key, payload(10)));
        assert!(put.await.is_err());
        let stats = qw.lag_stats();
        // Each bucket had room for its one write: all three are kept and finish.
        assert!(stats
            .iter()
            .all(|s| s.lagging_bytes == 10 && s.abandoned_writes == 0));
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for store in &stores {
            assert!(store.head(&key).await.is_ok());
        }
        assert!(qw.lag_stats().iter().all(|s| *s == LagStats::default()));

        // With no budget, a cancelled put's writes are all abandoned.
        let qw = qw.with_max_lagging_bytes(0);
        let other = Path::from("other");
        let put = tokio::time::timeout(Duration::from_micros(100), qw.put(&other, payload(10)));
        assert!(put.await.is_err());
        assert!(qw.lag_stats().iter().all(|s| s.abandoned_writes == 1));
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for store in &stores {
            assert!(store.head(&other).await.is_err());
        }
    }

    #[test]
    fn test_quorum_warn_limiter_reports_once_per_interval() {
        let mut limiter = WarnLimiter::default();
        let t0 = Instant::now();
        assert_eq!(limiter.record(t0), Some(1));
        assert_eq!(limiter.record(t0 + Duration::from_secs(1)), None);
        assert_eq!(limiter.record(t0 + Duration::from_secs(9)), None);
        // The report due after the interval carries the suppressed events too.
        assert_eq!(limiter.record(t0 + WARN_INTERVAL), Some(3));
        assert_eq!(limiter.record(t0 + WARN_INTERVAL), None);
        assert_eq!(limiter.record(t0 + 2 * WARN_INTERVAL), Some(2));
    }
}
