//! What the writer does after a log write failed: recover and lead again, or, in a cluster,
//! follow the leader that deposed it (RFC 0002 §2: a deposed leader never claims again on its
//! own; CTL-3).

use super::*;

/// How a retried recovery ended.
pub(super) enum Recovery {
    Lead(WriterPosition),
    /// Another control plane leads (a cluster member only).
    Deposed,
    Shutdown,
}

/// Whether `err` says another writer took over: our slot or claim lost to a later epoch.
fn deposed_by(err: &LogError, epoch: u64) -> bool {
    match err {
        LogError::SlotLost { found_epoch, .. } => *found_epoch > epoch,
        LogError::EpochTaken(_) => true,
        _ => false,
    }
}

impl Writer {
    /// After the log write failure `err` as the leader of `position.epoch`: lead again after a
    /// recovery, or follow (`None`: shut down).
    pub(super) async fn after_failure(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        position: &WriterPosition,
        err: &LogError,
    ) -> Option<Next> {
        let known = if self.settings.cluster.is_some() {
            if deposed_by(err, position.epoch) {
                warn!(epoch = position.epoch, error = %err, "deposed by a later leader, following");
                return Some(Next::Follow(self.replica_of_readable(position.epoch)));
            }
            Some(position.epoch)
        } else {
            None
        };
        match self.recover_until_ok(commands, known).await {
            Recovery::Lead(position) => Some(Next::Lead(position)),
            Recovery::Deposed => Some(Next::Follow(self.replica_of_readable(position.epoch))),
            Recovery::Shutdown => None,
        }
    }

    /// The readable state as a replica: everything durable up to the last published slot.
    fn replica_of_readable(&mut self, epoch: u64) -> Replica {
        self.role_tx.send_replace(Role::Follower { epoch });
        let durable = *self.durable_tx.borrow();
        Replica::of_leader(
            self.state.clone(),
            durable + 1,
            epoch,
            self.fence.clone(),
            0,
        )
    }

    /// Retries recovery with backoff until it succeeds, or until shutdown.
    ///
    /// Commands that arrive during an attempt wait for it (a transient failure costs them a
    /// short delay), but once an attempt has failed the log is unavailable for as long as its
    /// store is (a full disk, a bucket outage): between attempts every queued or arriving entry
    /// fails at once with `Unavailable`, a retriable error for its client, instead of waiting
    /// without bound, and a shutdown request ends the writer (nothing can be written anyway).
    ///
    /// A cluster member (`known`: the epoch it led) claims only while no later epoch exists,
    /// and is [`Recovery::Deposed`] otherwise.
    pub(super) async fn recover_until_ok(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        known: Option<u64>,
    ) -> Recovery {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        let mut rng = fastrand::Rng::with_seed(backoff.attempts().into());
        loop {
            let attempt = match known {
                None => {
                    self.log
                        .recover(&self.settings.address, &self.cluster_id)
                        .await
                }
                Some(known) => {
                    self.log
                        .recover_after(known, &self.settings.address, &self.cluster_id, None)
                        .await
                }
            };
            match attempt {
                Ok(recovered) => return Recovery::Lead(self.install(recovered)),
                Err(err) if known.is_some_and(|known| deposed_by(&err, known)) => {
                    warn!(error = %err, "a later leader took over while we recovered, following");
                    return Recovery::Deposed;
                }
                Err(err) => {
                    warn!(error = %err, "control plane recovery failed, retrying");
                    let reason = format!("metadata log unavailable: {err}");
                    let pause = tokio::time::sleep(backoff.next_delay(&mut rng));
                    tokio::pin!(pause);
                    loop {
                        tokio::select! {
                            biased;
                            _ = &mut pause => break,
                            command = commands.recv() => match command {
                                Some(Command::Submit { reply, .. }) => {
                                    let _ = reply.send(Err(ControlError::Unavailable(
                                        reason.clone(),
                                    )));
                                }
                                Some(Command::Shutdown { done }) => {
                                    warn!("shutting down with the metadata log unavailable");
                                    commands.close();
                                    let _ = done.send(());
                                    return Recovery::Shutdown;
                                }
                                None => return Recovery::Shutdown,
                            },
                        }
                    }
                }
            }
        }
    }
}
