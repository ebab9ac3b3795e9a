//! What the world checks: consumers reading the newest live agent, the per-step audit against
//! the replayed durable log, convergence after healing, and the final audit.

use super::*;

impl World {
    /// Each partition's consumer reads what the newest live incarnation makes visible; some
    /// fetches hold their plan for a while before reading it.
    pub(super) async fn consume(&mut self) {
        let (Some(newest), Some(topic)) = (self.newest_live(), self.topic) else {
            return;
        };
        // What is durable now: the log start a plan made now must respect.
        let mut messages = Vec::new();
        self.auditor.catch_up(&mut messages).await;
        for message in messages {
            self.violation(message);
        }
        let now = tokio::time::Instant::now();
        for partition in 0..self.scenario.partitions {
            if self.consumers[partition as usize]
                .paused_until
                .is_some_and(|until| until > now)
            {
                continue;
            }
            let held = match self.consumers[partition as usize].held.take() {
                Some(held) if held.read_at > now => {
                    self.consumers[partition as usize].held = Some(held);
                    continue;
                }
                Some(held) if !self.incarnations[held.incarnation].alive() => continue,
                Some(held) => held,
                None => match self.plan(newest, topic, partition) {
                    Some(held) if held.read_at > now => {
                        self.report.held_plans += 1;
                        self.consumers[partition as usize].held = Some(held);
                        continue;
                    }
                    Some(held) => held,
                    None => continue,
                },
            };
            self.read_plan(partition, held).await;
        }
    }

    /// Plans a fetch from the consumer's offset; a consumer below the log start resets to it
    /// (`auto.offset.reset=earliest`).
    fn plan(&mut self, incarnation: usize, topic: TopicId, partition: i32) -> Option<Held> {
        let fetch = self.incarnations[incarnation].fetch.clone();
        let offset = self.consumers[partition as usize].next_offset;
        let max_bytes = self.scenario.gc.fetch_max_bytes;
        let plan = match fetch.plan(&topic, partition, offset, max_bytes, true) {
            Ok(plan) if !plan.is_empty() => plan,
            Ok(_) => return None,
            Err(weir_fetch::FetchError::OffsetOutOfRange {
                log_start_offset, ..
            }) if offset < log_start_offset => {
                self.report.consumer_resets += 1;
                self.event(&format!(
                    "p{partition}: consumer at {offset} resets to the log start {log_start_offset}"
                ));
                self.consumers[partition as usize].next_offset = log_start_offset;
                return None;
            }
            Err(weir_fetch::FetchError::OffsetOutOfRange { .. }) => return None,
            // A follower whose replica has not reached the topic's creation yet (Kafka's
            // retriable UNKNOWN_TOPIC_OR_PARTITION from a broker with stale metadata).
            Err(weir_fetch::FetchError::UnknownTopicOrPartition)
                if self.lags_durable_log(incarnation) =>
            {
                return None
            }
            Err(err) => {
                self.violation(format!("p{partition}: fetch plan failed: {err}"));
                return None;
            }
        };
        let planned_at = tokio::time::Instant::now();
        let gc = &self.scenario.gc;
        let wait = if self.gc_rng.f64() < gc.p_hold_plan {
            // Up to 1.5 × the TTL: some plans expire and must be refused.
            Duration::from_millis(self.gc_rng.u64(1..=gc.plan_ttl.as_millis() as u64 * 3 / 2))
        } else {
            Duration::ZERO
        };
        let epoch = self.incarnations[incarnation]
            .control
            .read(|state| state.epoch);
        Some(Held {
            plan,
            incarnation,
            planned_at,
            read_at: planned_at + wait,
            durable_start: self.start_known_to(incarnation, &topic, partition),
            deposed: epoch < self.auditor.durable_epoch(),
        })
    }

    /// Whether `incarnation`'s readable state is behind the durable log.
    fn lags_durable_log(&self, incarnation: usize) -> bool {
        let acknowledged = *self.incarnations[incarnation].control.subscribe().borrow();
        acknowledged + 1 < self.auditor.durable_next_seq()
    }

    /// The log start a plan by `incarnation` must respect: the durable one, unless the slots
    /// that moved it landed in the bucket before their writer heard back (a PUT answered after
    /// the object landed, an ambiguous one retried): until then the retention pass or
    /// DeleteRecords has not completed, and the bound is the writer's own readable start (the
    /// durable log up to its last acknowledged slot, which FET-1 checks).
    fn start_known_to(&self, incarnation: usize, topic: &TopicId, partition: i32) -> i64 {
        let durable = self.auditor.durable_log_start(topic, partition);
        if !self.lags_durable_log(incarnation) {
            return durable;
        }
        self.incarnations[incarnation]
            .control
            .read(|state| {
                state
                    .partition(topic, partition)
                    .map(|p| p.log_start_offset)
            })
            .unwrap_or(0)
            .min(durable)
    }

    /// Reads a plan and hands the batches to the consumer.
    async fn read_plan(&mut self, partition: i32, held: Held) {
        let fetch = self.incarnations[held.incarnation].fetch.clone();
        // With cold reads and read-ahead, a second reader of the partition starts at the plan's
        // second entry, reading at the same time: its ranges join this read's GETs in flight
        // part-way in, and what it gets must be what this read gets from there on.
        let second = self.scenario.gc.cold_read_ahead.then(|| {
            let offset = held.plan.base_offsets().nth(1)?;
            let max_bytes = self.scenario.gc.fetch_max_bytes;
            let plan = fetch
                .plan(&self.topic?, partition, offset, max_bytes, true)
                .ok()?;
            Some((offset, plan))
        });
        let second_read = async {
            match second.flatten() {
                Some((offset, plan)) => {
                    let read = tokio::time::timeout(Duration::from_secs(60), fetch.read(plan));
                    read.await.ok().map(|read| (offset, read))
                }
                None => None,
            }
        };
        // Reads of a plan go one file after another, so a slow holder costs its delay per
        // file; a read that never returns shows up as no convergence after healing.
        let main_read = tokio::time::timeout(Duration::from_secs(60), fetch.read(held.plan));
        let (read, second_read) = futures::join!(main_read, second_read);
        if let (Ok(Ok(data)), Some((offset, Ok(second)))) = (&read, second_read) {
            let (main, second) = (data.records.to_bytes(), second.records.to_bytes());
            self.check_second_reader(partition, offset, &main, &second);
        }
        let data = match read {
            Ok(Ok(data)) => data,
            Ok(Err(weir_fetch::FetchError::PlanExpired(age))) => {
                self.report.expired_plans += 1;
                self.event(&format!("p{partition}: plan expired after {age:?}"));
                return;
            }
            Ok(Err(err)) => {
                let message = err.to_string();
                if held.deposed {
                    self.report.deposed_reads += 1;
                } else {
                    self.check_read_error(partition, held.planned_at, &message);
                }
                self.event(&format!("p{partition}: read failed: {message}"));
                return;
            }
            Err(_) => {
                self.event(&format!("p{partition}: read timed out"));
                return;
            }
        };
        let mut position = 0;
        let mut records = Vec::new();
        let fetched = data.records.to_bytes();
        while position < fetched.len() {
            let header = match BatchHeader::parse(&fetched[position..]) {
                Ok(header) => header,
                Err(err) => {
                    self.violation(format!("p{partition}: fetched garbage: {err}"));
                    break;
                }
            };
            position += header.total_len();
            records.push(header);
        }
        for (index, header) in records.into_iter().enumerate() {
            let consumer = &mut self.consumers[partition as usize];
            let expected = consumer.next_offset;
            let end = header.base_offset + header.offset_span();
            // The first batch may start before the offset asked for (the start fell inside it).
            let fits = if index == 0 {
                header.base_offset <= expected && expected < end
            } else {
                header.base_offset == expected
            };
            if !fits {
                self.violation(format!(
                    "p{partition}: consumer expected offset {expected}, got {}",
                    header.base_offset
                ));
                break;
            }
            let id = if crate::audit::is_filler(&header) {
                // An aborted batch's offsets: stepped over, as Kafka consumers do.
                self.report.fillers_read += 1;
                BatchId::FILLER
            } else if let Some(id) = self.stamps.id(header.first_timestamp) {
                id
            } else {
                self.violation(format!("p{partition}: consumer read a foreign batch"));
                break;
            };
            consumer.next_offset = end;
            consumer.unchecked.push(Consumed {
                base_offset: header.base_offset,
                id,
                count: header.last_offset_delta + 1,
                durable_start: held.durable_start,
                deposed: held.deposed,
            });
            self.report.consumed_batches += 1;
        }
    }

    /// The second reader started at `offset`, the main plan's second entry: over what both
    /// read from there, the bytes must be the same. Either may have read further: the second
    /// plan is newer (a held main plan may predate batches or a compaction swap whose runs,
    /// spent partly below `offset`, leave the second less of its byte budget).
    fn check_second_reader(&mut self, partition: i32, offset: i64, main: &[u8], second: &[u8]) {
        let mut position = 0;
        while let Ok(header) = BatchHeader::parse(main.get(position..).unwrap_or_default()) {
            if header.base_offset >= offset {
                break;
            }
            position += header.total_len();
        }
        let rest = main.get(position..).unwrap_or_default();
        self.report.second_reads += 1;
        if !(second.starts_with(rest) || rest.starts_with(second)) {
            self.violation(format!(
                "p{partition}: a second reader from offset {offset} got other bytes than the \
                 first reader ({} bytes against {} from there)",
                second.len(),
                rest.len()
            ));
        }
    }

    /// A fetch never finds an object gone that its plan names while the plan is young enough
    /// to be read (`plan_ttl + read_timeout` after planning): the deleter's grace is longer.
    fn check_read_error(
        &mut self,
        partition: i32,
        planned_at: tokio::time::Instant,
        message: &str,
    ) {
        if !message.to_ascii_lowercase().contains("not found") {
            return;
        }
        let deleted = self.ledger.deleted();
        let Some((key, at)) = deleted
            .iter()
            .find(|(key, _)| message.contains(key.as_ref()))
        else {
            self.violation(format!(
                "p{partition}: a fetch found an object missing that nobody deleted: {message}"
            ));
            return;
        };
        let gc = &self.scenario.gc;
        let bound = gc.plan_ttl + gc.read_timeout;
        let after = at.saturating_duration_since(planned_at);
        if after <= bound {
            self.violation(format!(
                "p{partition}: a fetch planned {:?} before {key} was deleted found it gone \
                 (plan TTL {:?} + read deadline {:?}, grace {:?})",
                after, gc.plan_ttl, gc.read_timeout, gc.grace
            ));
        } else {
            self.report.overtaken_reads += 1;
        }
    }

    pub(super) async fn audit(&mut self) {
        let Some(topic) = self.topic else {
            return;
        };
        self.report.audits += 1;
        let mut messages = Vec::new();
        self.auditor.catch_up(&mut messages).await;
        let shadow = self
            .auditor
            .shadow(topic, self.scenario.partitions, &self.stamps, &mut messages)
            .await;
        if let Some(shadow) = &shadow {
            check_log(shadow, &self.stamps, &mut messages);
            self.check_acks(shadow, &mut messages);
            self.check_live_prefixes(topic, shadow, &mut messages);
            self.check_consumed(shadow, &mut messages);
        }
        for message in messages {
            self.violation(message);
        }
    }

    /// DUR-1 and DUR-2: every acknowledged batch is in the durable log at the offset it was
    /// acked with, unless it lies wholly below the log start (retention or DeleteRecords).
    pub(super) fn check_acks(&self, shadow: &Shadow, messages: &mut Vec<String>) -> u64 {
        let mut lost = 0;
        for ack in &self.acks {
            if ack.implicit {
                let partition = ack.partition as usize;
                let found = shadow.partitions[partition]
                    .iter()
                    .any(|placed| placed.seen.id == ack.id);
                // Without its offset, a batch below the log start cannot be told from a lost one.
                if !found && shadow.log_start(partition) == 0 {
                    lost += 1;
                    messages.push(format!(
                        "LOST: {} implicitly acked (below p{}@{}) but not in the durable log",
                        ack.id, ack.partition, ack.base_offset
                    ));
                }
                continue;
            }
            let last = ack.base_offset + i64::from(ack.count) - 1;
            if last < shadow.log_start(ack.partition as usize) {
                continue;
            }
            let found = shadow.at(ack.partition as usize, ack.base_offset);
            let ok = found.is_some_and(|placed| {
                placed.seen.id == ack.id
                    && placed.entry.last_offset == ack.base_offset + i64::from(ack.count) - 1
            });
            if !ok {
                lost += 1;
                messages.push(format!(
                    "LOST: {} acked at p{}@{} but the durable log has {:?}",
                    ack.id,
                    ack.partition,
                    ack.base_offset,
                    found.map(|p| p.seen.id)
                ));
            }
        }
        lost
    }

    /// FET-1 and CTL-1: what each live writer shows consumers (below its stable high
    /// watermark) is exactly the durable log, and what it serves past that (pending files it
    /// acknowledged) is in a quorum.
    pub(super) fn check_live_prefixes(
        &self,
        topic: TopicId,
        shadow: &Shadow,
        messages: &mut Vec<String>,
    ) {
        for (_, incarnation) in self.live() {
            let number = incarnation.number;
            incarnation.control.read_served(|served| {
                let state = served.state();
                for partition in 0..self.scenario.partitions {
                    let Some(p) = state.partition(&topic, partition) else {
                        continue;
                    };
                    // FET-1 past the stable bound: what an agent serves of the pending files
                    // it acknowledged must be in a quorum (identified by the auditor).
                    let index = partition as usize;
                    let served_to = served.high_watermark(&topic, partition, p);
                    let unlanded = shadow
                        .from(index, shadow.stable(index))
                        .iter()
                        .take_while(|placed| placed.entry.base_offset < served_to)
                        .find(|placed| placed.seen.id == BatchId::UNREAD);
                    if let Some(placed) = unlanded {
                        messages.push(format!(
                            "incarnation {number} p{partition}: serves {} up to {served_to}, \
                             but the pending batch at {} is in no quorum",
                            p.stable_high_watermark, placed.entry.base_offset
                        ));
                    }
                    // FET-1: never past what is durable, nor onto a pending batch (RFC 0006).
                    let durable = shadow.stable(partition as usize);
                    if p.stable_high_watermark > durable {
                        messages.push(format!(
                            "incarnation {number} p{partition}: stable {} beyond durable and \
                             confirmed {durable}",
                            p.stable_high_watermark
                        ));
                    }
                    for entry in p
                        .index
                        .iter()
                        .take_while(|e| e.last_offset < p.stable_high_watermark)
                    {
                        let index = partition as usize;
                        // Below the durable start (a view not yet caught up): what was there.
                        let same = match shadow.at(index, entry.base_offset) {
                            Some(_) => covers(shadow.from(index, entry.base_offset), entry),
                            None if entry.last_offset < shadow.log_start(index) => {
                                let mut history =
                                    self.auditor.ever_placed_from(index, entry.base_offset);
                                history.peek().is_none_or(|placed| {
                                    placed.entry.base_offset != entry.base_offset
                                }) || covers(history, entry)
                            }
                            None => false,
                        };
                        if !same {
                            messages.push(format!(
                                "incarnation {number} p{partition}: visible batch at {} differs \
                                 from the durable log",
                                entry.base_offset
                            ));
                            break;
                        }
                    }
                }
            });
        }
    }

    /// Consumers only ever read durable batches, at their durable offsets, and never one wholly
    /// below a log start that was durable when their fetch was planned (unless a deposed writer
    /// planned it: counted, see [`Held::deposed`]). A batch below today's
    /// start is compared with what the auditor saw there (unverifiable if it came and went
    /// between two audits).
    pub(super) fn check_consumed(&mut self, shadow: &Shadow, messages: &mut Vec<String>) {
        for (partition, consumer) in self.consumers.iter_mut().enumerate() {
            for read in consumer.unchecked.drain(..) {
                let Consumed {
                    base_offset,
                    id,
                    count,
                    durable_start,
                    deposed,
                } = read;
                let last = base_offset + i64::from(count) - 1;
                if last < durable_start && deposed {
                    self.report.deposed_reads += 1;
                } else if last < durable_start {
                    messages.push(format!(
                        "p{partition}: consumer read {id} at {base_offset}, wholly below the log \
                         start {durable_start} durable when its fetch was planned"
                    ));
                }
                let matches = |placed: &crate::audit::Placed| {
                    placed.seen.id == id && placed.seen.count == count
                };
                let ok = match shadow.at(partition, base_offset) {
                    Some(placed) => matches(placed),
                    None if last < shadow.log_start(partition) => self
                        .auditor
                        .ever_placed(partition, base_offset)
                        .is_none_or(matches),
                    None => false,
                };
                if !ok {
                    messages.push(format!(
                        "p{partition}: consumer read {id} at {base_offset}, not in the durable log"
                    ));
                }
            }
        }
    }

    /// After healing, the newest live agent may be a writer deposed while idle (no lease yet,
    /// see [`Held::deposed`]): two overlapping recoveries where the second claimed later but
    /// wrote behind the first one's `NewEpoch` after the first had looked, and then the first
    /// stopped the second. With every producer settled nothing writes, so it would serve its
    /// stale view for ever and consumers stop short of the durable end. A new producer
    /// connecting (an `InitProducerId`, a log write) makes it notice, as in production: its
    /// slot is lost and it recovers under a new epoch with the whole durable log.
    pub(super) fn wake_deposed(&mut self) {
        let Some(newest) = self.newest_live() else {
            return;
        };
        let epoch = self.incarnations[newest].control.read(|state| state.epoch);
        if epoch >= self.auditor.durable_epoch() || self.woken == Some((newest, epoch)) {
            return;
        }
        self.woken = Some((newest, epoch));
        let number = self.incarnations[newest].number;
        self.event(&format!(
            "incarnation {number} (epoch {epoch}) deposed while idle: a new producer connects"
        ));
        let control = self.incarnations[newest].control.clone();
        tokio::spawn(async move {
            let _ = control.submit(Entry::init_producer_id(None, 0)).await;
        });
    }

    /// Every idempotent batch acknowledged, every consumer at the end of the durable log (as
    /// the newest live agent shows it, once that agent is not a deposed writer's stale view).
    pub(super) fn converged(&self) -> bool {
        if self.topic.is_none() || self.newest_live().is_none() || !self.cluster_settled() {
            return false;
        }
        let clients_done = self.clients.iter().all(|client| {
            client.settled() && (client.kind == Kind::Plain || client.producer.is_some())
        });
        if !clients_done {
            return false;
        }
        let newest = &self.incarnations[self.newest_live().expect("checked")];
        if newest.control.read(|state| state.epoch) < self.auditor.durable_epoch() {
            return false;
        }
        let topic = self.topic.expect("checked");
        newest.control.read(|state| {
            (0..self.scenario.partitions).all(|partition| {
                state.partition(&topic, partition).is_some_and(|p| {
                    self.consumers[partition as usize].next_offset == p.stable_high_watermark
                        && p.stable_high_watermark == p.high_watermark
                })
            })
        })
    }

    /// The last audit also counts: lost, duplicated, reordered, gaps, and whether consumers
    /// read the whole log.
    pub(super) async fn final_audit(&mut self) {
        let Some(topic) = self.topic else {
            self.violation("the topic was never created".to_string());
            return;
        };
        let mut messages = Vec::new();
        self.auditor.cross_check_replay(&mut messages).await;
        self.auditor.catch_up(&mut messages).await;
        self.auditor.forget_reads();
        let Some(shadow) = self
            .auditor
            .shadow(topic, self.scenario.partitions, &self.stamps, &mut messages)
            .await
        else {
            for message in messages {
                self.violation(message);
            }
            return;
        };
        let mut breaches = check_log(&shadow, &self.stamps, &mut messages);
        breaches.lost = self.check_acks(&shadow, &mut messages);
        self.report.aborted_batches = shadow
            .partitions
            .iter()
            .flatten()
            .filter(|placed| placed.seen.id == BatchId::FILLER)
            .count() as u64;
        for (partition, consumer) in self.consumers.iter().enumerate() {
            let end = shadow.high_watermark(partition);
            if consumer.next_offset != end {
                messages.push(format!(
                    "p{partition}: consumer stopped at {} of {end}",
                    consumer.next_offset
                ));
            }
        }
        let all_acked: BTreeSet<BatchId> = self.acks.iter().map(|ack| ack.id).collect();
        for client in &self.clients {
            if client.kind == Kind::Idempotent {
                // Batches given up at an epoch bump (fate unknown) are the application's to
                // handle, as a librdkafka delivery timeout.
                let sent = client.next_number - client.given_up;
                let acked = all_acked.iter().filter(|id| id.client == client.id).count();
                if acked as u32 != sent {
                    messages.push(format!(
                        "client {}: {acked} of {sent} idempotent batches acknowledged",
                        client.id
                    ));
                }
                self.report.given_up += u64::from(client.given_up);
            }
        }
        self.report.final_audit = breaches;
        for message in messages {
            self.violation(message);
        }
    }
}

/// Whether `entry` (one batch, or a compacted run of consecutive batches) is exactly the
/// batches `placed` starts with, wherever they are stored: compaction moves batches to another
/// file and joins consecutive ones into one entry (RFC 0005 §3), never changes their offsets,
/// lengths or timestamps. Where each entry points is checked by reading it (the auditor reads
/// every durable entry's bytes; consumers read theirs).
fn covers<'a>(
    placed: impl IntoIterator<Item = &'a crate::audit::Placed>,
    entry: &weir_control::IndexEntry,
) -> bool {
    let mut placed = placed.into_iter();
    let Some(first) = placed.next().map(|p| p.entry) else {
        return false;
    };
    if (first.base_offset, first.first_timestamp) != (entry.base_offset, entry.first_timestamp) {
        return false;
    }
    let (mut last, mut len, mut max) =
        (first.last_offset, u64::from(first.len), first.max_timestamp);
    while last < entry.last_offset {
        let Some(next) = placed.next().map(|p| p.entry) else {
            return false;
        };
        if next.base_offset != last + 1 {
            return false;
        }
        last = next.last_offset;
        len += u64::from(next.len);
        max = max.max(next.max_timestamp);
    }
    (last, len, max) == (entry.last_offset, u64::from(entry.len), entry.max_timestamp)
}
