//! The control plane's writer task: it sequences entries into slots, writes them with several
//! in flight, answers callers in slot order once durable, publishes durable slots to readers and
//! followers, and switches between leading and following (RFC 0001, RFC 0002 §2–4).

#[allow(clippy::wildcard_imports)]
use super::*;

/// A slot written or being written, with what to do once it is durable.
pub(super) struct PendingSlot {
    pub(super) seq: u64,
    /// The slot's entries, applied to the readable state once it is durable.
    pub(super) entries: Vec<Entry>,
    /// The slot's size, counted towards `snapshot_max_log_bytes`.
    pub(super) bytes: u64,
    pub(super) waiters: Vec<(Reply, EntryResult)>,
}

pub(super) struct Writer {
    pub(super) log: LogStore,
    pub(super) settings: ControlPlaneSettings,
    /// The state with every sealed entry applied, durable or not: only the writer sees it.
    pub(super) working: State,
    /// The state with every durable entry applied: what readers see.
    pub(super) state: Arc<RwLock<State>>,
    /// The last durable slot (the readable state's position, less one).
    pub(super) durable_tx: Arc<watch::Sender<u64>>,
    pub(super) available_tx: Arc<watch::Sender<bool>>,
    pub(super) role_tx: watch::Sender<Role>,
    /// Bumped at every change of role: a forwarded write that fails after the follower it was
    /// sent from took over must not make the new leader unavailable.
    pub(super) role_changes: Arc<AtomicU64>,
    pub(super) lease_ok: Arc<AtomicBool>,
    /// Durable slots, published to followers.
    pub(super) records: broadcast::Sender<DurableRecord>,
    /// A follower's connection to the leader, for the registrar's heartbeats.
    pub(super) leader_conn: LeaderConnSlot,
    /// Shared with the registrar: a member that takes over marks the old leader gone.
    pub(super) heartbeats: Arc<Heartbeats>,
    pub(super) cluster_id: String,
    /// The slots log GC must keep: recovery's fence (only recovery writes `NewEpoch`).
    pub(super) fence: FenceSlots,
    pub(super) snapshots: SnapshotTrigger,
    /// Whether reads may be served (a follower's replica confirmed recently enough).
    pub(super) freshness: Arc<Freshness>,
}

pub(super) struct WriterPosition {
    pub(super) epoch: u64,
    pub(super) next_seq: u64,
}

/// How a control plane starts: leading from its recovery, or following from its replica.
pub(super) enum Start {
    Lead(Box<Recovered>),
    Follow(Replica),
}

/// What the writer task does next.
pub(super) enum Next {
    Lead(WriterPosition),
    Follow(Replica),
}

impl Writer {
    pub(super) fn install(&mut self, recovered: Recovered) -> WriterPosition {
        let position = WriterPosition {
            epoch: recovered.epoch,
            next_seq: recovered.next_seq,
        };
        self.working = recovered.state.clone();
        self.fence = recovered.fence;
        self.snapshots.restart(recovered.slots_after_snapshot);
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = recovered.state;
        self.durable_tx.send_replace(recovered.next_seq - 1);
        self.role_changes.fetch_add(1, Ordering::SeqCst);
        self.available_tx.send_replace(true);
        self.freshness.lead();
        self.heartbeats.lead(recovered.epoch);
        self.role_tx.send_replace(Role::Leader {
            epoch: recovered.epoch,
        });
        self.log.prewarm_from(recovered.next_seq);
        position
    }

    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<Command>, mut next: Next) {
        loop {
            next = match next {
                Next::Lead(mut position) => {
                    let mut lease = self.settings.cluster.as_ref().map(|cluster| {
                        LeaseTask::start(
                            &self.log,
                            &self.settings.address,
                            cluster,
                            position.epoch,
                            self.lease_ok.clone(),
                        )
                    });
                    let served = self.serve(&mut commands, &mut position, &mut lease).await;
                    match served {
                        Ok(()) => {
                            if let Some(lease) = lease {
                                lease.release().await;
                            }
                            break;
                        }
                        Err(err) => {
                            drop(lease);
                            error!(error = %err, "metadata log writer failed, recovering");
                            match self.after_failure(&mut commands, &position, &err).await {
                                Some(next) => next,
                                None => break,
                            }
                        }
                    }
                }
                Next::Follow(replica) => match self.follow(&mut commands, replica).await {
                    Some(position) => Next::Lead(position),
                    None => break,
                },
            }
        }
        self.log.close_window();
    }

    /// Serves commands until shutdown (`Ok`) or a log failure that requires recovery (`Err`).
    async fn serve(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        position: &mut WriterPosition,
        lease: &mut Option<LeaseTask>,
    ) -> Result<(), LogError> {
        let mut inflight = FuturesOrdered::new();
        let mut pending: VecDeque<PendingSlot> = VecDeque::new();
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            let can_accept =
                shutdown.is_none() && inflight.len() < self.settings.max_inflight_writes;
            tokio::select! {
                biased;
                epoch = cluster::overtaken(lease) => {
                    // A later epoch was claimed: the log is another leader's, even if we have
                    // written nothing since (an idle leader would serve a stale state for ever).
                    self.available_tx.send_replace(false);
                    let err = LogError::EpochTaken(epoch);
                    if let Some(slot) = pending.pop_front() {
                        fail_all(slot, &mut pending, &err);
                    }
                    return Err(err);
                }
                Some(written) = inflight.next(), if !inflight.is_empty() => {
                    let slot = pending.pop_front().expect("one pending slot per write");
                    if let Err(err) = written {
                        // Unavailable before any caller hears of the failure: a caller that
                        // reacts by reading the state (the committer) must wait for recovery.
                        self.available_tx.send_replace(false);
                        fail_all(slot, &mut pending, &err);
                        return Err(err);
                    }
                    self.complete(slot, position.epoch);
                }
                command = commands.recv(), if can_accept => {
                    let Some(command) = command else {
                        if inflight.is_empty() { return Ok(()); }
                        continue;
                    };
                    let mut batch = Vec::new();
                    let mut command = Some(command);
                    while let Some(next) = command.take() {
                        match next {
                            Command::Submit { entry, reply, .. } => batch.push((entry, reply)),
                            Command::Shutdown { done } => { shutdown = Some(done); break; }
                        }
                        if batch.len() >= self.settings.max_entries_per_slot { break; }
                        command = commands.try_recv().ok();
                    }
                    if !batch.is_empty() {
                        let (slot, bytes) = self.seal(batch, position);
                        let bytes = match bytes {
                            Ok(bytes) => bytes,
                            Err(err) => {
                                // Applied to the working state but unwritable: as for a failed
                                // write, recovery rebuilds the state from the log.
                                self.available_tx.send_replace(false);
                                fail_all(slot, &mut pending, &err);
                                return Err(err);
                            }
                        };
                        pending.push_back(slot);
                        let log = self.log.clone();
                        let (seq, epoch) = (position.next_seq - 1, position.epoch);
                        let metrics = self.settings.metrics.clone();
                        inflight.push_back(async move {
                            let started = tokio::time::Instant::now();
                            let written = log.write_slot(seq, epoch, bytes).await;
                            metrics.slot_duration.observe(started.elapsed().as_secs_f64());
                            written
                        });
                    }
                }
                else => {}
            }
            if inflight.is_empty() {
                if let Some(done) = shutdown.take() {
                    self.final_snapshot(position).await;
                    let _ = done.send(());
                    commands.close();
                    return Ok(());
                }
            }
        }
    }

    /// Applies a batch of entries to the working state as the next slot and encodes the slot
    /// (an error when it does not fit an envelope, see [`LogStore::encode_record`]).
    fn seal(
        &mut self,
        batch: Vec<(Entry, Reply)>,
        position: &mut WriterPosition,
    ) -> (PendingSlot, Result<Bytes, LogError>) {
        let seq = position.next_seq;
        position.next_seq += 1;
        let mut waiters = Vec::with_capacity(batch.len());
        let mut entries = Vec::with_capacity(batch.len());
        for (entry, reply) in batch {
            waiters.push((reply, self.working.apply(&entry)));
            entries.push(entry);
        }
        self.settings
            .metrics
            .entries_per_slot
            .observe(entries.len() as f64);
        let record = LogRecord::new(entries);
        let bytes = LogStore::encode_record(position.epoch, seq, &record);
        let slot = PendingSlot {
            seq,
            entries: record.entries,
            bytes: bytes.as_ref().map_or(0, |bytes| bytes.len() as u64),
            waiters,
        };
        (slot, bytes)
    }

    /// A slot is durable: apply it to the readable state (its high watermarks become stable)
    /// and answer its callers.
    fn complete(&mut self, slot: PendingSlot, epoch: u64) {
        weir_common::failpoint::hit(weir_common::failpoint::AFTER_LOG_WRITE_BEFORE_PUBLISH);
        self.settings.metrics.log_slots.inc();
        let claim = self.snapshots.slot_durable(slot.bytes, &self.settings);
        let snapshot = {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            for (entry, (_, sealed)) in slot.entries.iter().zip(&slot.waiters) {
                let result = state.apply_durable(entry);
                debug_assert_eq!(&result, sealed, "apply is deterministic");
            }
            // The state after this slot, snapshotted once the slot is durable. Cloned under
            // the lock (a memory copy); serialised and written off the writer task.
            claim.map(|claim| (claim, Box::new(state.clone())))
        };
        self.durable_tx.send_replace(slot.seq);
        for (reply, result) in slot.waiters {
            let _ = reply.send(Ok((result, slot.seq)));
        }
        // No follower listening is no error.
        let _ = self.records.send(DurableRecord {
            seq: slot.seq,
            epoch,
            entries: Arc::new(slot.entries),
        });
        if let Some((claim, state)) = snapshot {
            let job = SnapshotJob {
                log: self.log.clone(),
                epoch,
                seq: slot.seq,
                state,
                fence: self.fence.clone(),
                inline: self.settings.encode_snapshots_inline,
                log_gc: self.settings.log_gc,
                claim,
                metrics: self.settings.metrics.clone(),
            };
            tokio::spawn(job.run());
        }
    }

    async fn final_snapshot(&self, position: &WriterPosition) {
        let seq = position.next_seq - 1;
        let state = Box::new(self.state.read().unwrap_or_else(|p| p.into_inner()).clone());
        let written = if self.settings.encode_snapshots_inline {
            self.log
                .write_snapshot(position.epoch, seq, &state, &self.fence)
                .await
        } else {
            self.log
                .write_snapshot_in_background(position.epoch, seq, state, self.fence.clone())
                .await
        };
        match written {
            Ok(written) => info!(seq, chunks = written.chunks, "wrote shutdown snapshot"),
            Err(err) => warn!(seq, error = %err, "shutdown snapshot failed"),
        }
    }
}

fn fail_all(first: PendingSlot, rest: &mut VecDeque<PendingSlot>, err: &LogError) {
    let reason = err.to_string();
    for slot in std::iter::once(first).chain(rest.drain(..)) {
        for (reply, _) in slot.waiters {
            let _ = reply.send(Err(ControlError::Unavailable(reason.clone())));
        }
    }
}
