//! The per-incarnation store wrapper: a process that can die, and a bucket that can turn slow.
//!
//! Every agent incarnation sees each bucket through its own [`Gate`] over the bucket's shared
//! [`weir_storage::ModelStore`]. Halting the gate models `kill -9`: operations the incarnation
//! starts afterwards never return, while operations already in flight (sleeping in the model)
//! still land — a request on the wire outlives the process that sent it. The slow knob is shared
//! by all incarnations of one bucket and adds a fixed delay before each operation. Some PUTs
//! that landed report a timeout anyway (the ambiguous write every object-store client must
//! handle), at a seeded rate shared by all incarnations of the bucket. Some create-only PUTs
//! answer `AlreadyExists` without writing anything, as S3 answers `409
//! ConditionalRequestConflict` to a create racing another write that has not landed (object_store
//! maps every 409 to `AlreadyExists`): the metadata bucket's gates do this at a seeded rate.
//! Data buckets' gates record every DELETE of a data file in the [`DeleteLedger`] as they pass
//! it on, for the auditor's GC-1 check, and every PUT that lands after one (a late copy).

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use weir_storage::OpLatency;

mod append;

pub(crate) use append::GateAppendable;

use weir_storage::keys;

use crate::archive::LogArchive;
use crate::ledger::DeleteLedger;

/// Faults of one bucket shared by every incarnation's gate.
#[derive(Debug)]
pub(crate) struct BucketFaults {
    /// Extra delay before every operation, in milliseconds (0: none).
    pub(crate) slow_ms: AtomicU64,
    /// Extra delay before every PUT only (0: none): a bucket whose writes lag, so a quorum
    /// writer's background copy can land after a later DELETE of the same file.
    pub(crate) put_lag_ms: AtomicU64,
    /// The next this many PUTs of ingest data files fail without writing (a lost upload:
    /// on parallel-persistence seeds a reserved file then misses its quorum while later files
    /// land, RFC 0006).
    pub(crate) drop_data_puts: AtomicU64,
    /// Probability that a PUT which landed reports a timeout.
    pub(crate) ambiguous_rate: f64,
    pub(crate) rng: Mutex<fastrand::Rng>,
    /// Probability that a create-only PUT answers `AlreadyExists` and writes nothing, after
    /// `conflict_latency` (the answer takes a PUT's round trip).
    conflict_rate: f64,
    conflict_latency: OpLatency,
    conflict_rng: Mutex<fastrand::Rng>,
    /// Create-only PUTs answered so (shared with other views of the same bucket).
    conflicts: Arc<AtomicU64>,
}

impl BucketFaults {
    pub(crate) fn new(ambiguous_rate: f64, seed: u64) -> BucketFaults {
        BucketFaults {
            slow_ms: AtomicU64::new(0),
            put_lag_ms: AtomicU64::new(0),
            drop_data_puts: AtomicU64::new(0),
            ambiguous_rate,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            conflict_rate: 0.0,
            conflict_latency: OpLatency::ZERO,
            // Its own generator: the other faults of a seed stay where they were.
            conflict_rng: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x636f_6e66_6c69_6374)),
            conflicts: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Create-only PUTs answer `AlreadyExists` without writing at `rate`, after `latency`,
    /// counted in `count`.
    pub(crate) fn with_create_conflicts(
        mut self,
        rate: f64,
        latency: OpLatency,
        count: Arc<AtomicU64>,
    ) -> Self {
        self.conflict_rate = rate;
        self.conflict_latency = latency;
        self.conflicts = count;
        self
    }

    fn lie(&self) -> bool {
        self.ambiguous_rate > 0.0
            && self.rng.lock().unwrap_or_else(|e| e.into_inner()).f64() < self.ambiguous_rate
    }

    /// Whether this create-only PUT conflicts, and after how long it answers.
    fn conflict(&self) -> Option<Duration> {
        if self.conflict_rate <= 0.0 {
            return None;
        }
        let mut rng = self.conflict_rng.lock().unwrap_or_else(|e| e.into_inner());
        if rng.f64() >= self.conflict_rate {
            return None;
        }
        self.conflicts.fetch_add(1, Ordering::SeqCst);
        Some(self.conflict_latency.sample(&mut rng))
    }
}

/// One incarnation's view of one bucket.
#[derive(Debug)]
pub(crate) struct Gate {
    inner: Arc<dyn ObjectStore>,
    halted: Arc<AtomicBool>,
    faults: Arc<BucketFaults>,
    /// Where DELETEs are recorded, and which bucket this is (data buckets only).
    ledger: Option<(Arc<DeleteLedger>, usize)>,
    /// Where log slots that land are copied (the metadata bucket only).
    archive: Option<Arc<LogArchive>>,
}

impl Gate {
    pub(crate) fn new(
        inner: Arc<dyn ObjectStore>,
        halted: Arc<AtomicBool>,
        faults: Arc<BucketFaults>,
    ) -> Gate {
        Gate {
            inner,
            halted,
            faults,
            ledger: None,
            archive: None,
        }
    }

    /// Copies every log slot that lands through this gate of the metadata bucket to `archive`.
    pub(crate) fn with_archive(mut self, archive: Arc<LogArchive>) -> Gate {
        self.archive = Some(archive);
        self
    }

    /// Records the DELETEs that pass this gate of data bucket `bucket` in `ledger`.
    pub(crate) fn with_ledger(mut self, ledger: Arc<DeleteLedger>, bucket: usize) -> Gate {
        self.ledger = Some((ledger, bucket));
        self
    }

    /// Waits out the bucket's slowness, or forever if the incarnation is dead.
    async fn pass(&self) {
        pass(&self.halted, &self.faults).await;
    }
}

async fn pass(halted: &AtomicBool, faults: &BucketFaults) {
    if halted.load(Ordering::SeqCst) {
        futures::future::pending::<()>().await;
    }
    let slow = faults.slow_ms.load(Ordering::SeqCst);
    if slow > 0 {
        tokio::time::sleep(Duration::from_millis(slow)).await;
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gate({})", self.inner)
    }
}

fn gated_stream<T: Send + 'static>(
    halted: Arc<AtomicBool>,
    faults: Arc<BucketFaults>,
    inner: BoxStream<'static, object_store::Result<T>>,
) -> BoxStream<'static, object_store::Result<T>> {
    stream::once(async move {
        pass(&halted, &faults).await;
        inner
    })
    .flatten()
    .boxed()
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for Gate {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.pass().await;
        let lag = self.faults.put_lag_ms.load(Ordering::SeqCst);
        if lag > 0 {
            tokio::time::sleep(Duration::from_millis(lag)).await;
        }
        let is_data = location
            .as_ref()
            .starts_with(keys::ingest_prefix().as_ref());
        let dropped = is_data
            && self
                .faults
                .drop_data_puts
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if dropped {
            return Err(object_store::Error::Generic {
                store: "sim",
                source: "lost upload: refused without writing".into(),
            });
        }
        let conflict = matches!(opts.mode, PutMode::Create)
            .then(|| self.faults.conflict())
            .flatten();
        if let Some(latency) = conflict {
            tokio::time::sleep(latency).await;
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                // Not S3's `ConditionalRequestConflict` wording, which the storage layer may
                // retry itself: this is the conflict that reaches the metadata log anyway (the
                // layer's attempts spent, or a store whose wording it does not recognise).
                source: "sim: a conflicting write is in progress (nothing written)".into(),
            });
        }
        let copy = self.archive.as_ref().map(|_| payload.clone());
        let create_only = matches!(opts.mode, PutMode::Create);
        let result = self.inner.put_opts(location, payload, opts).await?;
        if let Some((ledger, _)) = &self.ledger {
            ledger.landed(location);
        }
        if let (Some(archive), Some(copy)) = (&self.archive, copy) {
            archive.landed(location, copy.into(), create_only);
        }
        if self.faults.lie() {
            return Err(object_store::Error::Generic {
                store: "sim",
                source: "timed out (the write landed)".into(),
            });
        }
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.pass().await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.pass().await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.pass().await;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let locations = match &self.ledger {
            Some((ledger, bucket)) => {
                let (ledger, bucket) = (ledger.clone(), *bucket);
                locations
                    .then(move |location| {
                        let ledger = ledger.clone();
                        async move {
                            if let Ok(path) = &location {
                                ledger.record(path, bucket).await;
                            }
                            location
                        }
                    })
                    .boxed()
            }
            None => locations,
        };
        gated_stream(
            self.halted.clone(),
            self.faults.clone(),
            self.inner.delete_stream(locations),
        )
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        gated_stream(
            self.halted.clone(),
            self.faults.clone(),
            self.inner.list(prefix),
        )
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        gated_stream(
            self.halted.clone(),
            self.faults.clone(),
            self.inner.list_with_offset(prefix, offset),
        )
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.pass().await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.pass().await;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.pass().await;
        self.inner.rename_opts(from, to, options).await
    }
}
