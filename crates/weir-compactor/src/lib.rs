//! Compaction (RFC 0005): ingest files merged into few large files in the regional tier.
//!
//! - The **planner** ([`Compactor::run_planner`], in the agent that writes the metadata log)
//!   groups live ingest files into jobs ([`plan`]) and pushes them into the `weir-objq` queue.
//! - **Workers** ([`Compactor::run_worker`], `compaction.workers` per agent) claim a job, read
//!   the live batches of its inputs from the index ([`merge::gather`]), read the inputs' bytes
//!   from the ingest buckets, write one output file to the regional bucket (create-only), and
//!   commit `ReplaceFiles`. The entry moves each batch only if the index still holds it where
//!   the worker read it, so a job that runs twice commits once; a refused entry's output is
//!   deleted. Inputs whose batches all moved are released and deleted after the grace period by
//!   the file deleter, like any released file.
//! - A worker heartbeats its job while it runs; a worker that dies loses the job after one
//!   lease and another worker runs it again.

pub mod merge;
pub mod plan;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use weir_common::{Clock, FileId, Tier};
use weir_control::plane::Role;
use weir_control::{ControlError, ControlPlane, Entry, EntryResult, FileReplace, ReplaceOutcome};
use weir_objq::{Member, QueueError};
use weir_storage::{keys, QuorumWriter};

pub use plan::JobSpec;

/// How compaction runs (`[compaction]`; operations.md explains each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Inputs of one job add up to at most about this many bytes (the output's size).
    pub target_file_bytes: u64,
    /// Inputs of one job at most.
    pub max_inputs: usize,
    /// A run of consecutive batches becomes one index entry up to this many bytes (RFC 0005
    /// §3).
    pub max_run_bytes: u32,
    /// Outputs larger than this are written with a multipart upload (one PUT up to it: a part
    /// is a request, and fewer requests per GiB is the point of compaction).
    pub multipart_threshold: u64,
    /// A file is planned only once it is this old (younger files are still being written to
    /// by retries and read by consumers at the tip).
    pub min_input_age: Duration,
    /// A partial job is pushed once its oldest file is this old: the compaction lag bound.
    pub max_input_age: Duration,
    /// How often the planner looks.
    pub plan_interval: Duration,
    /// How often an idle worker asks for a job.
    pub poll_interval: Duration,
    /// A planned file not gone from the ingest tier after this long is planned again (its job
    /// was lost or refused).
    pub replan_after: Duration,
    /// The queue's lease: a worker heartbeats every quarter of it.
    pub job_lease: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            target_file_bytes: 128 << 20,
            max_inputs: 5000,
            max_run_bytes: 1 << 20,
            multipart_threshold: 1 << 30,
            min_input_age: Duration::from_secs(30),
            max_input_age: Duration::from_secs(300),
            plan_interval: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            replan_after: Duration::from_secs(900),
            job_lease: Duration::from_secs(60),
        }
    }
}

/// Part size of a multipart output (S3 wants at least 5 MiB per part but the last).
pub const MULTIPART_PART_BYTES: usize = 64 << 20;
/// Parts of one output in flight at once.
const MULTIPART_CONCURRENCY: usize = 4;

/// What compaction did, since the agent started.
#[derive(Debug, Default)]
struct Counters {
    jobs_pushed: AtomicU64,
    jobs_done: AtomicU64,
    jobs_conflicted: AtomicU64,
    jobs_retried: AtomicU64,
    batches_moved: AtomicU64,
    input_files: AtomicU64,
    bytes_read: AtomicU64,
    outputs: AtomicU64,
    bytes_written: AtomicU64,
    /// Gauges, set by the planner: jobs and files planned and not yet compacted.
    jobs_outstanding: AtomicU64,
    files_outstanding: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub jobs_pushed: u64,
    pub jobs_done: u64,
    pub jobs_conflicted: u64,
    pub jobs_retried: u64,
    pub batches_moved: u64,
    pub input_files: u64,
    pub bytes_read: u64,
    pub outputs: u64,
    pub bytes_written: u64,
    /// Jobs planned whose inputs are still in the ingest tier (queued or running), and their
    /// files, as of the planner's last pass.
    pub jobs_outstanding: u64,
    pub files_outstanding: u64,
}

/// Files and bytes per tier, and how far compaction is behind, from the durable state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    pub ingest_files: u64,
    pub ingest_bytes: u64,
    pub regional_files: u64,
    pub regional_bytes: u64,
    /// Index entries naming files of each tier: one per batch in the ingest tier, one per run
    /// (up to `index_entry_bytes`) in the regional tier (RFC 0005 §3).
    pub ingest_entries: u64,
    pub regional_entries: u64,
    /// Files released (by retention or compaction) and waiting for the deleter.
    pub released_files: u64,
    /// Age of the oldest live ingest file (its id's time against the wall clock): compaction
    /// lag. 0 when there is none.
    pub lag_ms: i64,
}

/// How one job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The swap committed.
    Done(ReplaceOutcome),
    /// Nothing of the inputs is live any more.
    Empty,
    /// The swap was refused (another run moved the batches first); the output was deleted.
    Refused(String),
}

#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("reading input {file}: {why}")]
    Read { file: FileId, why: String },
    #[error("{0}")]
    Merge(#[from] merge::MergeError),
    #[error("writing output {file}: {why}")]
    Write { file: FileId, why: String },
    #[error("committing output {file}: {why}")]
    Commit { file: FileId, why: String },
}

/// The planner and workers of one agent.
#[derive(Debug)]
pub struct Compactor {
    control: ControlPlane,
    ingest: Arc<QuorumWriter>,
    regional: Arc<dyn ObjectStore>,
    queue: Arc<Member>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    counters: Counters,
    rng: Mutex<fastrand::Rng>,
}

impl Compactor {
    pub fn new(
        control: ControlPlane,
        ingest: Arc<QuorumWriter>,
        regional: Arc<dyn ObjectStore>,
        queue: Arc<Member>,
        clock: Arc<dyn Clock>,
        settings: Settings,
        seed: u64,
    ) -> Compactor {
        Compactor {
            control,
            ingest,
            regional,
            queue,
            clock,
            settings,
            counters: Counters::default(),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            jobs_pushed: get(&c.jobs_pushed),
            jobs_done: get(&c.jobs_done),
            jobs_conflicted: get(&c.jobs_conflicted),
            jobs_retried: get(&c.jobs_retried),
            batches_moved: get(&c.batches_moved),
            input_files: get(&c.input_files),
            bytes_read: get(&c.bytes_read),
            outputs: get(&c.outputs),
            bytes_written: get(&c.bytes_written),
            jobs_outstanding: get(&c.jobs_outstanding),
            files_outstanding: get(&c.files_outstanding),
        }
    }

    /// Files and bytes per tier now, and the compaction lag.
    pub fn tiers(&self) -> TierStats {
        let now_ms = self.clock.now_ms();
        self.control.read(|state| {
            let mut stats = TierStats {
                released_files: state.released.len() as u64,
                ..TierStats::default()
            };
            for (id, meta) in state.files.iter() {
                match meta.tier {
                    Tier::Ingest => {
                        stats.ingest_files += 1;
                        stats.ingest_bytes += meta.size;
                        stats.ingest_entries += u64::from(meta.live_batches);
                        stats.lag_ms = stats.lag_ms.max(now_ms - id.unix_ms());
                    }
                    Tier::Regional => {
                        stats.regional_files += 1;
                        stats.regional_bytes += meta.size;
                        stats.regional_entries += u64::from(meta.live_batches);
                    }
                }
            }
            stats
        })
    }

    /// Plans every `plan_interval` until `stop`.
    ///
    /// In a cluster only the control-plane leader plans (every agent's workers run jobs), so
    /// agents do not push the same jobs each; an agent that becomes leader reads the queue
    /// again first, so it does not plan what its predecessor queued.
    pub async fn run_planner(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut outstanding = Outstanding::default();
        let mut seeded = false;
        loop {
            let leads = matches!(*self.control.role().borrow(), Role::Leader { .. });
            if !leads {
                seeded = false;
            } else if !seeded {
                outstanding = Outstanding::default();
                match self.queue.snapshot().await {
                    Ok(queue) => outstanding.seed(queue.jobs.iter().map(|j| j.payload.as_str())),
                    Err(err) => warn!(%err, "reading the compaction queue failed; planning afresh"),
                }
                seeded = true;
            }
            if leads {
                match self.plan_once(&mut outstanding).await {
                    Ok(0) => {}
                    Ok(pushed) => debug!(pushed, "compaction jobs planned"),
                    Err(err) => warn!(%err, "planning compaction failed; trying again next pass"),
                }
            }
            if wait_or_stop(self.settings.plan_interval, &mut stop).await {
                return;
            }
        }
    }

    /// One planning pass: pushes the jobs [`plan::plan`] finds; returns how many.
    pub async fn plan_once(&self, outstanding: &mut Outstanding) -> Result<usize, QueueError> {
        let now_ms = self.clock.now_ms();
        let jobs = self.control.read(|state| {
            outstanding.forget_gone(
                |id| state.files.contains_key(id),
                self.settings.replan_after,
            );
            plan::plan(state, now_ms, &outstanding.files(), &self.settings)
        });
        self.note_outstanding(outstanding);
        if jobs.is_empty() {
            return Ok(0);
        }
        let payloads: Vec<String> = jobs.iter().map(|j| JobSpec::new(j).encode()).collect();
        let pushed = jobs.len();
        match self.queue.push(payloads).await {
            Ok(_) => {}
            Err(QueueError::Full { bound }) => {
                debug!(bound, "compaction queue full; planning again later");
                return Ok(0);
            }
            Err(err) => return Err(err),
        }
        for job in &jobs {
            outstanding.add(job);
        }
        self.note_outstanding(outstanding);
        self.counters
            .jobs_pushed
            .fetch_add(pushed as u64, Ordering::Relaxed);
        Ok(pushed)
    }

    fn note_outstanding(&self, outstanding: &Outstanding) {
        let c = &self.counters;
        c.jobs_outstanding
            .store(outstanding.jobs() as u64, Ordering::Relaxed);
        c.files_outstanding
            .store(outstanding.len() as u64, Ordering::Relaxed);
    }

    /// Writes an output above `multipart_threshold` in parts of [`MULTIPART_PART_BYTES`], up to
    /// [`MULTIPART_CONCURRENCY`] at once. A multipart upload cannot be create-only; the output's
    /// id is new (a ULID with 80 random bits), so nothing else writes that key.
    async fn put_multipart(
        &self,
        key: &object_store::path::Path,
        parts: &[bytes::Bytes],
    ) -> object_store::Result<()> {
        let upload = self.regional.put_multipart(key).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_PART_BYTES);
        for part in parts {
            if let Err(err) = writer.wait_for_capacity(MULTIPART_CONCURRENCY).await {
                // Aborting frees the parts written; if that fails too the bucket's lifecycle
                // rule for incomplete uploads does (docs/operations.md).
                let _ = writer.abort().await;
                return Err(err);
            }
            writer.put(part.clone());
        }
        writer.finish().await.map(drop)
    }

    /// Works jobs as `worker` until `stop`.
    pub async fn run_worker(self: Arc<Self>, worker: String, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            match self.work_once(&worker).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(err) => warn!(%worker, %err, "compaction queue unavailable"),
            }
            if wait_or_stop(self.settings.poll_interval, &mut stop).await {
                return;
            }
        }
    }

    /// Claims and runs one job; `Ok(false)` when there was none.
    pub async fn work_once(self: &Arc<Self>, worker: &str) -> Result<bool, QueueError> {
        let Some(job) = self.queue.claim(worker).await? else {
            return Ok(false);
        };
        let Some(files) = JobSpec::decode(&job.payload).and_then(|spec| spec.files()) else {
            warn!(
                job = job.id,
                "dropping a compaction job this build cannot read"
            );
            self.queue.ack(worker, job.id).await?;
            return Ok(true);
        };
        let heartbeat = {
            let this = self.clone();
            let worker = worker.to_string();
            let every = (self.settings.job_lease / 4).max(Duration::from_millis(10));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if let Err(err) = this.queue.heartbeat(&worker, job.id).await {
                        debug!(job = job.id, %err, "compaction heartbeat failed");
                    }
                }
            })
        };
        let outcome = self.compact(job.id, &files).await;
        heartbeat.abort();
        match outcome {
            Ok(outcome) => {
                match &outcome {
                    JobOutcome::Done(done) => {
                        self.counters.jobs_done.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .batches_moved
                            .fetch_add(done.replaced as u64, Ordering::Relaxed);
                    }
                    JobOutcome::Refused(why) => {
                        info!(job = job.id, %why, "compaction job refused; its output is deleted");
                        self.counters
                            .jobs_conflicted
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    JobOutcome::Empty => {}
                }
                self.queue.ack(worker, job.id).await?;
            }
            Err(err) => {
                warn!(job = job.id, %err, "compaction job failed; it goes back to the queue");
                self.counters.jobs_retried.fetch_add(1, Ordering::Relaxed);
                self.queue.nack(worker, job.id).await?;
                // Not straight back at a bucket that just failed.
                tokio::time::sleep(self.settings.poll_interval).await;
            }
        }
        Ok(true)
    }

    /// Merges the live batches of `inputs` into one regional file and swaps it in.
    pub async fn compact(&self, job: u64, inputs: &[FileId]) -> Result<JobOutcome, CompactError> {
        let gathered = self.control.read(|state| merge::gather(state, inputs));
        if gathered.is_empty() {
            return Ok(JobOutcome::Empty);
        }
        let mut bytes = HashMap::with_capacity(gathered.inputs.len());
        for (id, (size, holders)) in &gathered.inputs {
            let holders: Vec<usize> = holders.iter().map(|h| *h as usize).collect();
            let key = keys::data_file(Tier::Ingest, id);
            let read = self
                .ingest
                .get_range(&holders, &key, 0..*size)
                .await
                .map_err(|err| CompactError::Read {
                    file: *id,
                    why: err.to_string(),
                })?;
            self.counters
                .bytes_read
                .fetch_add(read.len() as u64, Ordering::Relaxed);
            bytes.insert(*id, read);
        }
        self.counters
            .input_files
            .fetch_add(gathered.inputs.len() as u64, Ordering::Relaxed);
        let output = merge::build(&gathered, &bytes, self.settings.max_run_bytes)?;
        drop(bytes);
        let file = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            FileId::new(self.clock.now_ms(), &mut rng)
        };
        let key = keys::data_file(Tier::Regional, &file);
        let size = output.file.total_len;
        let written = if size > self.settings.multipart_threshold {
            self.put_multipart(&key, &output.file.parts).await
        } else {
            let payload: PutPayload = output.file.parts.iter().cloned().collect();
            let create = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            self.regional
                .put_opts(&key, payload, create)
                .await
                .map(drop)
        };
        written.map_err(|err| CompactError::Write {
            file,
            why: err.to_string(),
        })?;
        self.counters.outputs.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(size, Ordering::Relaxed);
        let entry = Entry::ReplaceFiles(FileReplace {
            job,
            output: file,
            tier: Tier::Regional,
            holders: vec![0],
            size,
            batches: Vec::new(),
            inputs: gathered.inputs.keys().copied().collect(),
            runs: output.runs,
        });
        match self.control.submit(entry).await {
            Ok(EntryResult::ReplaceFiles(Ok(outcome))) => {
                info!(
                    job,
                    output = %file,
                    inputs = gathered.inputs.len(),
                    moved = outcome.replaced,
                    skipped = outcome.skipped,
                    bytes = size,
                    "compacted"
                );
                Ok(JobOutcome::Done(outcome))
            }
            Ok(EntryResult::ReplaceFiles(Err(
                refused @ (ControlError::ReplaceConflict(_) | ControlError::FileTooOld { .. }),
            ))) => {
                // Never committed and never will be: nobody reads it.
                if let Err(err) = self.regional.delete(&key).await {
                    debug!(%key, %err, "deleting a refused output failed; the orphan sweep will");
                }
                Ok(JobOutcome::Refused(refused.to_string()))
            }
            // The entry's fate is unknown (or it failed for a reason a retry may not share):
            // the output stays for the orphan sweep, and the job is run again.
            Ok(other) => Err(CompactError::Commit {
                file,
                why: format!("unexpected result {other:?}"),
            }),
            Err(err) => Err(CompactError::Commit {
                file,
                why: err.to_string(),
            }),
        }
    }
}

/// The files of jobs this planner pushed and that are still in the ingest tier.
#[derive(Debug, Default)]
pub struct Outstanding {
    /// Each file: when it was planned, and its job (a number of this planner's own).
    files: HashMap<FileId, (Instant, u64)>,
    next_job: u64,
}

impl Outstanding {
    /// Notes the inputs of jobs already in the queue (a restarted planner).
    pub fn seed<'a>(&mut self, payloads: impl Iterator<Item = &'a str>) {
        for files in payloads.filter_map(|p| JobSpec::decode(p).and_then(|s| s.files())) {
            self.add(&files);
        }
    }

    fn add(&mut self, files: &[FileId]) {
        let now = Instant::now();
        self.next_job += 1;
        for id in files {
            self.files.insert(*id, (now, self.next_job));
        }
    }

    /// Forgets files no longer live, and files planned longer than `replan_after` ago.
    fn forget_gone(&mut self, live: impl Fn(&FileId) -> bool, replan_after: Duration) {
        self.files
            .retain(|id, (since, _)| live(id) && since.elapsed() < replan_after);
    }

    /// Jobs with an input still in the ingest tier: queued or running (the queue depth as this
    /// planner sees it, without reading the queue object).
    pub fn jobs(&self) -> usize {
        self.files
            .values()
            .map(|(_, job)| *job)
            .collect::<HashSet<_>>()
            .len()
    }

    fn files(&self) -> HashSet<FileId> {
        self.files.keys().copied().collect()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Sleeps `interval`; true when `stop` turned true (or its sender is gone) first.
async fn wait_or_stop(interval: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        // Biased: the simulator replays a seed exactly only without tokio's random choice.
        biased;
        _ = tokio::time::sleep(interval) => *stop.borrow(),
        changed = stop.changed() => changed.is_err() || *stop.borrow(),
    }
}

#[cfg(test)]
mod tests;
