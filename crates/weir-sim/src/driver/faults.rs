//! Fault injection: kills, takeovers, overlapping recoveries, bucket outages and slowness,
//! sabotage behind the system's back, and the heal at the end of the fault phase.

use super::*;

/// Per step, on parallel-persistence seeds with several buckets: a lost upload.
const P_LOST_UPLOAD: f64 = 0.02;
/// Per step, on parallel-persistence seeds: every data bucket's PUTs start (or stop) landing
/// late.
const P_SLOW_UPLOADS: f64 = 0.01;

impl World {
    pub(super) fn inject_faults(&mut self) {
        let s = self.scenario.clone();
        if self.rng.f64() < s.p_crash {
            // Writers a held log write needs are spared (see `World::spared`).
            let live: Vec<usize> = self
                .live()
                .filter(|(_, inc)| !self.spared(inc.number))
                .map(|(i, _)| i)
                .collect();
            if !live.is_empty() {
                let victim = live[self.rng.usize(..live.len())];
                self.report.crashes += 1;
                self.halt(victim);
            }
        }
        if self.rng.f64() < s.p_takeover && self.opening == 0 && self.live().count() < 2 {
            // A second writer starts while the first still serves its clients.
            self.report.takeovers += 1;
            self.event("takeover");
            self.start_open();
        }
        if self.rng.f64() < s.p_outage {
            let index = self.rng.usize(..self.buckets.len());
            let model = &self.buckets[index].model;
            let down = !model.is_down();
            model.set_outage(down);
            if down {
                self.report.bucket_outages += 1;
            }
            self.event(&format!("bucket {index} down={down}"));
        }
        if self.rng.f64() < s.p_slow {
            let index = self.rng.usize(..self.buckets.len());
            let slow = if self.buckets[index].faults.slow_ms.load(Ordering::SeqCst) == 0 {
                self.report.slowdowns += 1;
                self.rng.u64(100..=2_000)
            } else {
                0
            };
            self.buckets[index]
                .faults
                .slow_ms
                .store(slow, Ordering::SeqCst);
            self.event(&format!("bucket {index} slow={slow}ms"));
        }
        if self.fault_rng.f64() < s.p_overlap
            && self.opening == 0
            && self.overlap.is_none()
            && self.live().count() < 2
        {
            self.start_overlap();
        }
        if s.produce.parallel_persistence
            && self.buckets.len() > 1
            && self.lost_upload_rng.f64() < P_LOST_UPLOAD
        {
            // Every bucket but one refuses the next few data PUTs: the files they belong to
            // miss their quorum (and are repaired from the one copy) while the files after
            // them land. On a third of them every bucket refuses: those files land nowhere and
            // are aborted, with later files in a quorum behind them.
            let spared = self.lost_upload_rng.usize(..self.buckets.len());
            let everywhere = self.lost_upload_rng.usize(..3) == 0;
            let count = self.lost_upload_rng.u64(1..=4);
            for (index, bucket) in self.buckets.iter().enumerate() {
                if index != spared || everywhere {
                    bucket.faults.drop_data_puts.store(count, Ordering::SeqCst);
                }
            }
            self.report.lost_uploads += 1;
            self.event(&if everywhere {
                format!("lost upload: {count} data PUT(s) refused in every bucket")
            } else {
                format!("lost upload: {count} data PUT(s) refused but in bucket {spared}")
            });
            // Not on seeds that expire producers: the outage can last seconds (in calm seeds
            // until the heal), keeping a batch unanswered for longer than an expiration, so its
            // retry would revive the id at sequence 0 and be appended twice once its original
            // is repaired (the reason `ExpiryScenario::pick` keeps expiry to calm seeds).
            let expiring = self.scenario.expiry.expiration.is_some();
            if !everywhere && !expiring && self.buckets.len() > 2 && self.lost_upload_rng.bool() {
                // ...and one of the refusing buckets goes down until an outage toggle or the
                // heal: a file left in the spared bucket alone can be neither confirmed (one
                // copy) nor aborted (the down bucket may hold a quorum's other copy, so it may
                // have been acknowledged), while its producers' retries wait on it. The
                // resolver must copy it into a bucket that answers (RFC 0006, repair).
                let others = self.buckets.len() - 1;
                let down = (spared + 1 + self.lost_upload_rng.usize(..others)) % self.buckets.len();
                self.buckets[down].model.set_outage(true);
                self.report.bucket_outages += 1;
                self.event(&format!("lost upload: bucket {down} down"));
            }
        }
        if s.produce.parallel_persistence && self.lost_upload_rng.f64() < P_SLOW_UPLOADS {
            // Data PUTs land late on every bucket for a while (or stop lagging): reserved files
            // stay missing for hundreds of milliseconds, so a writer that took over resolves
            // files its predecessor may still get a quorum for and acknowledge.
            let lagging = self.buckets[0].faults.put_lag_ms.load(Ordering::SeqCst) > 0;
            // On half of the spells of seeds with takeovers, a second writer starts as the
            // lag does: its resolver finds the first's reserved files missing, which the first
            // may yet get a quorum for and acknowledge (its reservations are durable), so it
            // must wait out the deadline and the margin before aborting them (RFC 0006;
            // `abort-young-file`). The lag then outlasts the second writer's open and first
            // resolver pass, and still lands within the first's 2 s ack deadline.
            let takeover = !lagging
                && s.p_takeover > 0.0
                && self.opening == 0
                && self.live().count() < 2
                && self.lost_upload_rng.bool();
            let lag = if lagging {
                0
            } else {
                self.report.slow_uploads += 1;
                let floor = if takeover { 1_000 } else { 200 };
                self.lost_upload_rng.u64(floor..=1_500)
            };
            for bucket in &self.buckets {
                bucket.faults.put_lag_ms.store(lag, Ordering::SeqCst);
            }
            self.event(&format!("slow uploads: data PUTs land {lag} ms late"));
            if takeover {
                self.report.takeovers += 1;
                self.event("takeover while uploads lag");
                self.start_open();
            }
        }
        if self.rng.f64() < s.p_log_outage {
            let down = !self.log_bucket.model.is_down();
            self.log_bucket.model.set_outage(down);
            if down {
                self.report.log_outages += 1;
            }
            self.event(&format!("log bucket down={down}"));
        }
    }

    pub(super) async fn sabotage(&mut self, sabotage: Sabotage) {
        match sabotage {
            Sabotage::None => {}
            Sabotage::DeleteFile => {
                let Some(ack) = self.acks.last() else { return };
                let (partition, offset) = (ack.partition, ack.base_offset);
                let Some(file) = self.incarnations.iter().find_map(|inc| {
                    inc.control.read(|state| {
                        let topic = state.topic(TOPIC)?;
                        let p = topic.partition(partition)?;
                        p.index
                            .iter()
                            .find(|e| e.base_offset == offset)
                            .map(|e| e.file_id)
                    })
                }) else {
                    return;
                };
                let key = weir_storage::keys::data_file(weir_storage::keys::Tier::Ingest, &file);
                for bucket in &self.buckets {
                    let _ = bucket.raw.delete(&key).await;
                }
                self.event(&format!("sabotage: deleted {key}"));
            }
            Sabotage::TruncateLog => {
                let snapshots: Vec<_> = self
                    .log_bucket
                    .raw
                    .list(Some(&weir_storage::keys::meta_snapshot_prefix()))
                    .filter_map(|meta| async move { meta.ok().map(|m| m.location) })
                    .collect()
                    .await;
                for key in snapshots {
                    let _ = self.log_bucket.raw.delete(&key).await;
                }
                let _ = self
                    .log_bucket
                    .raw
                    .delete(&weir_storage::keys::meta_log(2))
                    .await;
                self.event("sabotage: truncated the log");
            }
            Sabotage::ForgeCoveredSlot => self.forge_covered_slot().await,
        }
    }

    /// Stops the serving agent and starts the first of two overlapping recoveries;
    /// [`World::overlap_second`] starts the second once the first has claimed its epoch (a claim
    /// is a LIST and a PUT).
    pub(super) fn start_overlap(&mut self) {
        self.report.overlapping_recoveries += 1;
        // The agent serving so far stops, so the two recoveries race only each other.
        let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
        for index in live {
            self.halt(index);
        }
        let faults = Arc::new(
            BucketFaults::new(self.scenario.ambiguous_rate, self.fault_rng.u64(..))
                .with_create_conflicts(
                    self.scenario.create_conflict_rate,
                    self.scenario.put,
                    self.create_conflicts.clone(),
                ),
        );
        faults.slow_ms.store(OVERLAP_SLOW_MS, Ordering::SeqCst);
        let first = self.start_open_with(faults.clone());
        self.event(&format!("overlapping recoveries: {first} opens slowly"));
        let claimed = Duration::from_millis(2 * OVERLAP_SLOW_MS + 150);
        // The fill variant where a stopped writer leaves empty pre-warmed objects to judge, on
        // every other agent: from the agent's number rather than a draw, so the seeds' schedules
        // stay.
        let prewarmed = self
            .scenario
            .log_append
            .is_some_and(|append| append.prewarmed_slots > 0);
        let at_fill = prewarmed && first % 2 == 1;
        self.overlap = Some(Overlap {
            first,
            first_faults: faults,
            second_at: Some(tokio::time::Instant::now() + claimed),
            at_fill,
            second: None,
        });
    }

    pub(super) fn overlap_second(&mut self) {
        let due = self.overlap.as_ref().is_some_and(|overlap| {
            overlap.second_at.is_some_and(|at| {
                if overlap.at_fill {
                    self.log_holds[overlap.first as usize].probing()
                } else {
                    tokio::time::Instant::now() >= at
                }
            })
        });
        if due {
            let second = self.start_open();
            let when = match self.overlap.as_ref().is_some_and(|overlap| overlap.at_fill) {
                true => " while the first fills holes",
                false => "",
            };
            self.event(&format!("overlapping recoveries: {second} opens{when}"));
            if let Some(overlap) = &mut self.overlap {
                overlap.second_at = None;
                overlap.second = Some(second);
            }
        }
    }

    /// An agent finished opening: the second of two overlapping recoveries lets the first run
    /// at normal speed; the first (if it opened) stops every other agent.
    pub(super) fn overlap_opened(&mut self, number: u32, opened: bool) {
        let Some(overlap) = &self.overlap else {
            return;
        };
        if overlap.second == Some(number) {
            overlap.first_faults.slow_ms.store(0, Ordering::SeqCst);
        }
        if overlap.first != number {
            return;
        }
        overlap.first_faults.slow_ms.store(0, Ordering::SeqCst);
        // Opened before the second even started: just a slow open, nothing overlapped.
        let overlapped = overlap.second_at.is_none();
        self.overlap = None;
        if opened && overlapped {
            self.event("overlapping recoveries: the others stop");
            let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
            for index in live {
                self.halt(index);
            }
        }
    }

    pub(super) async fn forge_covered_slot(&mut self) {
        let snapshots = self
            .raw_log_seqs(&weir_storage::keys::meta_snapshot_prefix())
            .await;
        let Some(seq) = snapshots.into_iter().max() else {
            return;
        };
        let key = weir_storage::keys::meta_log(seq);
        let Some(bytes) = self.archive.slot(seq) else {
            return;
        };
        let Ok(envelope) = weir_format::decode_envelope(&bytes) else {
            return;
        };
        let Ok(mut record) =
            serde_json::from_slice::<weir_control::log::LogRecord>(envelope.payload)
        else {
            return;
        };
        record.entries.push(Entry::CreateTopic {
            name: "forged".into(),
            topic_id: TopicId([0x5a; 16]),
            partitions: 1,
            configs: BTreeMap::new(),
        });
        let Ok(forged) = weir_control::log::LogStore::encode_record(envelope.epoch, seq, &record)
        else {
            return;
        };
        // An overwrite behind the writers' backs: the bucket and the archive both change.
        self.archive.landed(&key, forged.clone(), false);
        let _ = self.log_bucket.raw.put(&key, forged.into()).await;
        self.event(&format!("sabotage: forged {key}"));
    }

    /// Ends every fault: buckets up and fast, and one fresh agent instead of whatever survived.
    /// (A writer deposed while idle keeps serving its last view until it next writes — there is
    /// no lease yet — so a survivor of a takeover may be stale; a restart is what an operator
    /// does, and what the convergence check then measures.)
    pub(super) fn heal(&mut self) {
        self.release_slot_hold();
        for bucket in self.buckets.iter().chain(std::iter::once(&self.log_bucket)) {
            bucket.model.set_outage(false);
            bucket.faults.slow_ms.store(0, Ordering::SeqCst);
            bucket.faults.put_lag_ms.store(0, Ordering::SeqCst);
            bucket.faults.drop_data_puts.store(0, Ordering::SeqCst);
        }
        if self.scenario.cluster.is_some() {
            // Members stay up: the cluster must settle by itself.
            self.heal_cluster();
        } else {
            let live: Vec<usize> = self.live().map(|(i, _)| i).collect();
            for index in live {
                self.halt(index);
            }
        }
        self.event("healed");
    }

    /// kill -9: the incarnation's storage calls stop returning; its clients lose their
    /// connection and write off everything in flight.
    pub(super) fn halt(&mut self, index: usize) {
        self.incarnations[index]
            .halted
            .store(true, Ordering::SeqCst);
        let number = self.incarnations[index].number;
        if let Some(member) = &self.incarnations[index].member {
            self.links.deregister(&member.address);
        }
        self.event(&format!("halt incarnation {number}"));
        self.requests
            .retain(|_, request| request.incarnation != index);
        let cluster = self.scenario.cluster.is_some();
        for client in &mut self.clients {
            if client.attached == Some(index) {
                for batch in client.connection_lost() {
                    let id = batch.id;
                    if !client.failed(batch) {
                        self.report.plain_unacked += 1;
                        if cluster {
                            // Its commit may have been forwarded before the kill and be
                            // sequenced after the client's later batches.
                            self.stamps.abandon(id);
                        }
                    }
                }
            }
        }
        self.producer_pending.retain(|_, asked| *asked != index);
    }
}
