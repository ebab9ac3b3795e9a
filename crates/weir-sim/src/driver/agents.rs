//! Agent processes and their clients: opening incarnations (recovery), the topic, producer ids,
//! sending produce requests and taking in what spawned tasks report back.

use std::time::Duration;

use weir_produce::{IngestWrites, Resolver, ResolverSettings};
use weir_storage::append::ingest::IngestLoader;
use weir_storage::pool::WriterPool;

use super::*;
use crate::gate::GateAppendable;

/// Read-ahead window of a simulated agent: four of the larger uncached fetches, so a consumer
/// fetches from, and joins, loads started several fetches before.
const SIM_READ_AHEAD_BYTES: u64 = 8 * 1024;

impl World {
    pub(super) fn ensure_incarnation(&mut self) {
        if let Some(cluster) = self.scenario.cluster {
            self.ensure_members(cluster);
            return;
        }
        if self.newest_live().is_none()
            && self.opening == 0
            && tokio::time::Instant::now() >= self.open_after
        {
            self.start_open();
        }
    }

    /// Starts a new agent process: recover the control plane (claiming a new epoch).
    pub(super) fn start_open(&mut self) -> u32 {
        let faults = self.log_bucket.faults.clone();
        self.start_open_with(faults)
    }

    /// Starts an agent process that sees the metadata bucket with `log_faults`.
    pub(super) fn start_open_with(&mut self, log_faults: Arc<BucketFaults>) -> u32 {
        self.opening += 1;
        self.opened_count += 1;
        let number = self.opened_count - 1;
        let halted = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(
            Gate::new(self.log_bucket.model.clone(), halted.clone(), log_faults)
                .with_archive(self.archive.clone()),
        );
        let switch = Arc::new(HoldSwitch::default());
        self.log_holds.push(switch.clone());
        let (gate, member) = self.membership(number, gate);
        let layer = layered("log", gate, LayerPolicy::default(), u64::from(number) << 8);
        let store: Arc<dyn ObjectStore> = Arc::new(SlotHold::new(layer.clone(), switch));
        let log_view = member.as_ref().map(|(m, _)| m.log_view.clone());
        let appendable = self.log_appendable(&halted, &layer, log_view);
        let prewarmed_slots = self.scenario.log_append.map_or(0, |a| a.prewarmed_slots);
        let settings = ControlPlaneSettings {
            max_inflight_writes: self.scenario.log_inflight,
            snapshot_every_slots: self.scenario.snapshot_every,
            // Snapshots every 3–40 slots, each followed by log GC: the auditor's replay reads
            // the archive of written slots, not the bucket GC deletes from.
            log_gc: true,
            write_attempts: 2,
            address: format!("sim-agent-{number}"),
            cluster: member.as_ref().map(|(_, settings)| settings.clone()),
            encode_snapshots_inline: true,
            // Snapshots of tens of KiB in chunks of 1–16 KiB, so they span several chunks and log
            // GC collects chunks too. Derived, not drawn, to keep each seed's schedule.
            snapshot_chunk_bytes: 1024 << (self.scenario.snapshot_every % 5),
            appendable,
            prewarmed_slots,
            ..ControlPlaneSettings::default()
        };
        if let Some((membership, _)) = member {
            self.pending_members.insert(number, membership);
        }
        let seed = self.rng.u64(..);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = ControlPlane::open(store, settings, seed)
                .await
                .map_err(|err| err.to_string());
            let _ = tx.send(Msg::Opened {
                number,
                halted,
                result,
            });
        });
        number
    }

    pub(super) fn opened(&mut self, number: u32, halted: Arc<AtomicBool>, control: ControlPlane) {
        let gates: Vec<Arc<dyn ObjectStore>> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Arc::new(
                    Gate::new(b.model.clone(), halted.clone(), b.faults.clone())
                        .with_ledger(self.ledger.clone(), i),
                ) as Arc<dyn ObjectStore>
            })
            .collect();
        let layer = |policy: LayerPolicy| -> Vec<Arc<dyn ObjectStore>> {
            gates
                .iter()
                .enumerate()
                .map(|(i, gate)| {
                    layered(
                        &format!("bucket-{i}"),
                        gate.clone(),
                        policy,
                        u64::from(number) << 8 | (i as u64 + 1),
                    )
                })
                .collect()
        };
        let stores = layer(LayerPolicy::default());
        // Fetches read through their own layer with the scenario's read deadline, so a read
        // never outlives `plan_ttl + read_timeout` per holder (the deleter's grace covers both).
        let read_stores =
            layer(LayerPolicy::default().with_request_timeout(self.scenario.gc.read_timeout));
        let writer = Arc::new(
            QuorumWriter::new(stores.clone(), self.scenario.quorum)
                .expect("valid quorum")
                .with_contiguous_payloads(self.scenario.contiguous_payloads),
        );
        let reader =
            Arc::new(QuorumWriter::new(read_stores, self.scenario.quorum).expect("valid quorum"));
        let cache = Arc::new(ReadCache::new(1 << 20));
        let clock = self.agent_clock();
        let ingest = self.ingest_writes(number, &halted, &stores, clock.clone());
        let pipeline = ProducePipeline::start_with(
            self.scenario.produce.clone(),
            writer.clone(),
            ingest,
            control.clone(),
            cache.clone(),
            clock.clone(),
            self.rng.u64(..),
        );
        let fetch_cache = if self.scenario.gc.cold_read_ahead {
            Arc::new(ReadCache::new(1 << 20))
        } else if self.scenario.gc.uncached_reads {
            Arc::new(ReadCache::new(0))
        } else {
            cache
        };
        // Read-ahead as the agent runs it (off with no cache room): a consumer behind the tip
        // reads through read-ahead loads and GETs shared while in flight.
        let mut fetch = FetchReader::new(control.clone(), reader.clone(), fetch_cache)
            .with_plan_ttl(self.scenario.gc.plan_ttl)
            .with_read_ahead(SIM_READ_AHEAD_BYTES);
        let regional: Vec<Arc<dyn ObjectStore>> =
            self.regional_store(number, &halted).into_iter().collect();
        if let Some(store) = regional.first() {
            let read = layered(
                "regional-read",
                store.clone(),
                LayerPolicy::default().with_request_timeout(self.scenario.gc.read_timeout),
                u64::from(number) << 8 | 0xfd,
            );
            fetch = fetch.with_regional(Arc::new(QuorumWriter::new(vec![read], 1).expect("one")));
        }
        let deleter = self.start_deleter(control.clone(), stores.clone(), regional.clone());
        // As the agent runs it: always, for pending files of earlier incarnations too.
        tokio::spawn(
            Resolver::new(
                control.clone(),
                writer,
                clock.clone(),
                pipeline.incarnations(),
                ResolverSettings {
                    ack_deadline: self.scenario.produce.ack_deadline,
                    clock_skew_margin: super::scenario::SIM_SKEW_MARGIN,
                    interval: Duration::from_millis(100),
                },
                // Not a draw: a new draw would shift every later one, and every seed's run.
                u64::from(number) ^ 0x7265_736f_6c76_6572,
            )
            .with_metrics(self.resolved.clone())
            .run(deleter.subscribe()),
        );
        self.start_sweeper(
            control.clone(),
            stores,
            regional,
            clock.clone(),
            deleter.subscribe(),
        );
        let compaction = self.start_compaction(number, &halted, &control, reader, clock);
        let member = self.pending_members.remove(&number);
        if let Some(member) = &member {
            self.links.register(&member.address, control.clone());
        }
        self.incarnations.push(Incarnation {
            number,
            halted,
            control,
            pipeline,
            fetch,
            _deleter: deleter,
            _compaction: compaction,
            member,
        });
    }

    /// The metadata bucket's appendable view for an incarnation (RFC 0004 seeds): gated like its
    /// object view, under the same layer policy (the bucket's double archives what lands).
    fn log_appendable(
        &self,
        halted: &Arc<AtomicBool>,
        layer: &Arc<dyn ObjectStore>,
        log_view: Option<Arc<ModelStore>>,
    ) -> Option<Arc<dyn AppendableStore>> {
        let model = self.log_bucket.appendable.clone()?;
        let gate: Arc<dyn AppendableStore> = Arc::new(GateAppendable::new(
            model,
            halted.clone(),
            self.log_bucket.faults.clone(),
        ));
        // A member's outage of the metadata bucket covers its appends too.
        let gate = match log_view {
            Some(view) => view.appendable(gate),
            None => gate,
        };
        let stats = Arc::new(BucketStats::new("log", "free", PriceTable::FREE));
        Some(LayerStore::new(layer.clone(), LayerPolicy::default(), stats).appendable(gate))
    }

    /// On the appendable path, a WriterPool over this incarnation's gated, layered appendable
    /// views of the buckets; else PUTs.
    fn ingest_writes(
        &mut self,
        number: u32,
        halted: &Arc<AtomicBool>,
        stores: &[Arc<dyn ObjectStore>],
        clock: Arc<dyn Clock>,
    ) -> IngestWrites {
        let Some(append) = self.scenario.append else {
            return IngestWrites::Put;
        };
        let appendable = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let model = b.appendable.clone().expect("appendable bucket");
                let gate = Arc::new(GateAppendable::new(model, halted.clone(), b.faults.clone()));
                let stats = Arc::new(BucketStats::new(
                    &format!("bucket-{i}"),
                    "free",
                    PriceTable::FREE,
                ));
                LayerStore::new(stores[i].clone(), LayerPolicy::default(), stats).appendable(gate)
            })
            .collect();
        let loader = IngestLoader::new(
            appendable,
            stores.to_vec(),
            self.scenario.quorum,
            clock,
            // Not drawn from the seed's generator, which would move every later fault.
            u64::from(number) << 16 ^ 0x706f_6f6c,
        )
        .expect("valid pool quorum");
        let pool = WriterPool::start(loader, append.pool);
        self.pools.push(pool.clone());
        IngestWrites::Pool(pool)
    }

    /// Clients (re)connect, get producer ids, create the topic, and send.
    pub(super) async fn send(&mut self, load: bool) {
        let Some(newest) = self.newest_live() else {
            return;
        };
        let topic = match self.topic {
            Some(topic) => topic,
            None => {
                let creator = self.attach_to(newest);
                match self.ensure_topic(creator) {
                    Some(topic) => topic,
                    None => return,
                }
            }
        };
        for c in 0..self.clients.len() {
            if self.clients[c]
                .attached
                .is_some_and(|index| self.is_cut(index))
            {
                self.leave_cut_agent(c);
            }
            let attached = match self.clients[c].attached {
                Some(index) if self.incarnations[index].alive() => index,
                _ => {
                    let index = self.attach_to(newest);
                    self.clients[c].attached = Some(index);
                    index
                }
            };
            if !self.ready_to_send(c) {
                continue;
            }
            let client = &self.clients[c];
            if client.kind == Kind::Idempotent && client.producer.is_none() {
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    self.producer_pending.entry(c)
                {
                    slot.insert(attached);
                    self.init_producer(c, attached);
                }
                continue;
            }
            let mut requests: Vec<Vec<Batch>> = self.clients[c]
                .take_resends()
                .into_iter()
                .map(|batch| vec![batch])
                .collect();
            let quiet = self.clients[c].quiet();
            if load && self.rng.f64() < self.scenario.p_send && !quiet {
                let mut partitions: Vec<i32> = (0..self.scenario.partitions).collect();
                self.rng.shuffle(&mut partitions);
                partitions.truncate(self.rng.usize(1..=partitions.len().min(3)));
                let now_ms = self.clock.now_ms();
                let client = &mut self.clients[c];
                let mut batches = Vec::new();
                for partition in partitions {
                    let ready = match client.kind {
                        Kind::Idempotent => client
                            .streams
                            .get(&partition)
                            .is_none_or(|stream| stream.can_send_new()),
                        Kind::Plain => client.plain_in_flight.len() < 16,
                    };
                    if ready {
                        let count = self.rng.i32(1..=5);
                        let timestamp = self.stamps.stamp(now_ms, client.next_id());
                        batches.push(client.new_batch(partition, count, timestamp));
                    }
                }
                if !batches.is_empty() {
                    requests.push(batches);
                }
            }
            for batches in requests {
                self.submit(c, attached, topic, batches).await;
            }
        }
    }

    /// Creates the topic through the newest incarnation (retried every step until a creation
    /// is acknowledged: only then is the topic durable).
    pub(super) fn ensure_topic(&mut self, newest: usize) -> Option<TopicId> {
        if let std::collections::btree_map::Entry::Vacant(slot) =
            self.producer_pending.entry(usize::MAX)
        {
            slot.insert(newest);
            let control = self.incarnations[newest].control.clone();
            let partitions = self.scenario.partitions;
            let configs = self.scenario.gc.topic_configs();
            let seed = self.seed;
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let result = match control.create_topic(TOPIC, partitions, configs, seed).await {
                    Ok(id) => Ok(id),
                    // An earlier attempt landed; its slot precedes ours, so it is durable too.
                    Err(ControlError::TopicAlreadyExists(_)) => control
                        .read(|state| state.topic(TOPIC).map(|t| t.id))
                        .ok_or_else(|| "topic exists but is not in the state".to_string()),
                    Err(err) => Err(err.to_string()),
                };
                let _ = tx.send(Msg::Topic {
                    incarnation: newest,
                    result,
                });
            });
        }
        None
    }

    pub(super) fn init_producer(&mut self, client: usize, incarnation: usize) {
        let control = self.incarnations[incarnation].control.clone();
        let now_ms = self.clock.now_ms();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = match control.submit(Entry::init_producer_id(None, now_ms)).await {
                Ok(EntryResult::InitProducerId(Ok(pair))) => Ok(pair),
                Ok(other) => Err(format!("{other:?}")),
                Err(err) => Err(err.to_string()),
            };
            let _ = tx.send(Msg::Producer {
                client,
                incarnation,
                result,
            });
        });
    }

    pub(super) async fn submit(
        &mut self,
        c: usize,
        incarnation: usize,
        topic: TopicId,
        batches: Vec<Batch>,
    ) {
        let producer = match self.clients[c].kind {
            Kind::Idempotent => self.clients[c].producer.expect("idempotent clients wait"),
            Kind::Plain => (-1, -1),
        };
        let mut partitions = Vec::with_capacity(batches.len());
        for batch in &batches {
            if batch.attempts > 1 {
                self.report.resends += 1;
            }
            let bytes: Bytes = build_test_batch(
                batch.count,
                batch.timestamp,
                (producer.0, producer.1, batch.sequence),
            );
            partitions.push(PartitionBatches {
                topic_id: topic,
                partition: batch.partition,
                batches: split_and_validate(&bytes).expect("test batches are valid"),
            });
        }
        let request = self.next_request;
        self.next_request += 1;
        self.report.requests += 1;
        let pipeline = self.incarnations[incarnation].pipeline.clone();
        let queued = tokio::time::timeout(
            Duration::from_secs(1),
            pipeline.submit(ProduceTicket { partitions }),
        )
        .await;
        let Ok(outcome) = queued else {
            // The pipeline did not take the request: as if the connection timed out.
            for batch in batches {
                if let Some(batch) = self.clients[c].answered(batch.partition, batch.id.number) {
                    if !self.clients[c].failed(batch) {
                        self.report.plain_unacked += 1;
                    }
                }
            }
            return;
        };
        self.requests.insert(
            request,
            Request {
                client: c,
                incarnation,
                batches: batches
                    .iter()
                    .map(|batch| (batch.partition, batch.id.number))
                    .collect(),
            },
        );
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let outcome = outcome.await;
            let _ = tx.send(Msg::Outcome { request, outcome });
        });
    }

    /// Takes in everything spawned tasks reported since the last step.
    pub(super) fn drain(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Outcome { request, outcome } => self.outcome(request, outcome),
                Msg::Opened {
                    number,
                    halted,
                    result,
                } => {
                    self.opening -= 1;
                    self.opening_nodes.remove(&number);
                    if result.is_err() {
                        self.pending_members.remove(&number);
                    }
                    self.overlap_opened(number, result.is_ok());
                    self.slot_hold_opened(number, result.is_ok());
                    match result {
                        Ok(control) => {
                            self.report.overtaken_claims += control.open_claims() - 1;
                            self.event(&format!(
                                "opened incarnation {number} ({} claims)",
                                control.open_claims()
                            ));
                            self.opened(number, halted, control);
                        }
                        Err(err) => {
                            self.report.failed_opens += 1;
                            self.event(&format!("open failed: {err}"));
                            self.open_after =
                                tokio::time::Instant::now() + Duration::from_millis(50);
                        }
                    }
                }
                Msg::Topic {
                    incarnation,
                    result,
                } => {
                    self.producer_pending.remove(&usize::MAX);
                    match result {
                        Ok(id) if self.incarnations[incarnation].alive() => {
                            self.event("topic created");
                            self.topic.get_or_insert(id);
                        }
                        Ok(_) => {}
                        Err(err) => self.event(&format!("create topic: {err}")),
                    }
                }
                Msg::Producer {
                    client,
                    incarnation,
                    result,
                } => {
                    if self.producer_pending.get(&client) == Some(&incarnation) {
                        self.producer_pending.remove(&client);
                    }
                    if !self.incarnations[incarnation].alive() {
                        continue;
                    }
                    match (client, result) {
                        (client, Ok(pair)) => {
                            self.event(&format!("client {client} is producer {pair:?}"));
                            // A second id (from a retry after a crash) is simply not used.
                            self.clients[client].producer.get_or_insert(pair);
                        }
                        (client, Err(err)) => {
                            self.event(&format!("client {client} init failed: {err}"))
                        }
                    }
                }
                Msg::Note(note) => self.event(&note),
                Msg::CommitRefused(note) => {
                    self.report.group_commits_refused += 1;
                    self.event(&note);
                }
            }
        }
    }

    pub(super) fn outcome(&mut self, request: u64, outcome: TicketOutcome) {
        let Some(request) = self.requests.remove(&request) else {
            return; // written off when its incarnation died
        };
        if outcome.len() != request.batches.len() {
            self.violation(format!(
                "request answered with {} outcomes for {} partitions",
                outcome.len(),
                request.batches.len()
            ));
        }
        let client_id = self.clients[request.client].id;
        for ((partition, number), result) in request.batches.iter().zip(outcome) {
            let Some(batch) = self.clients[request.client].answered(*partition, *number) else {
                continue;
            };
            match result {
                PartitionOutcome::Committed { base_offset, .. } => {
                    self.event(&format!(
                        "ack c{client_id}#{number} p{partition}@{base_offset}"
                    ));
                    self.report.acked_batches += 1;
                    self.report.acked_records += batch.count as u64;
                    self.acks.push(Ack {
                        id: batch.id,
                        partition: *partition,
                        base_offset,
                        count: batch.count,
                        implicit: false,
                    });
                    for earlier in self.clients[request.client].acknowledged(&batch) {
                        self.implicit_ack(earlier, base_offset);
                    }
                }
                PartitionOutcome::Failed(err) => {
                    if matches!(
                        err,
                        ProduceError::Control(ControlError::OutOfOrderSequence { .. })
                    ) {
                        self.report.out_of_sequence += 1;
                    }
                    let client = &mut self.clients[request.client];
                    let mut batch = batch;
                    match &err {
                        ProduceError::Control(control) if client.lost_state(&batch, control) => {
                            client.bump_pending = true;
                            self.report.lost_producer_state += 1;
                        }
                        // An answer that does not say whether the batch was written: a
                        // reserved file the resolver may still confirm (REQUEST_TIMED_OUT).
                        ProduceError::Control(
                            ControlError::Unavailable(_) | ControlError::ShuttingDown,
                        )
                        | ProduceError::Unresolved(_)
                        | ProduceError::ShuttingDown => batch.ambiguous = true,
                        _ => {}
                    }
                    let expected = self.scenario.expiry.expiration.is_some();
                    if matches!(
                        err,
                        ProduceError::Control(
                            ControlError::InvalidProducerEpoch { .. }
                                | ControlError::UnknownTopicOrPartition(_)
                        )
                    ) || (!expected
                        && matches!(
                            err,
                            ProduceError::Control(ControlError::UnknownProducerId(_))
                        ))
                    {
                        self.violation(format!("c{client_id}#{number} refused: {err}"));
                    }
                    self.event(&format!("fail c{client_id}#{number} p{partition}: {err}"));
                    if self.clients[request.client].written_before(&batch) {
                        // A later batch of its stream was acknowledged meanwhile.
                        let below =
                            self.acks.iter().rev().find(|ack| {
                                ack.id.client == client_id && ack.partition == *partition
                            });
                        let below = below.map_or(0, |ack| ack.base_offset);
                        self.implicit_ack(batch, below);
                        continue;
                    }
                    if !self.clients[request.client].failed(batch) {
                        self.report.plain_unacked += 1;
                    }
                }
            }
        }
    }

    /// `batch` is written, below `below` in its partition: a later batch of its stream was
    /// acknowledged at `below` (librdkafka's implicit ack). The auditor checks it is there.
    fn implicit_ack(&mut self, batch: Batch, below: i64) {
        self.event(&format!(
            "implicit ack {} p{} below {below}",
            batch.id, batch.partition
        ));
        self.report.acked_batches += 1;
        self.report.acked_records += batch.count as u64;
        self.acks.push(Ack {
            id: batch.id,
            partition: batch.partition,
            base_offset: below,
            count: batch.count,
            implicit: true,
        });
    }
}

/// The production storage layer (deadlines, retries) over a simulated bucket. Its backoff jitter
/// is seeded from the incarnation and bucket, not drawn from the world's generator, so adding
/// the layer left every seed's fault schedule as it was.
pub(super) fn layered(
    name: &str,
    store: Arc<dyn ObjectStore>,
    policy: LayerPolicy,
    jitter_seed: u64,
) -> Arc<dyn ObjectStore> {
    let stats = Arc::new(BucketStats::new(name, "free", PriceTable::FREE));
    let layer = LayerStore::new(store, policy, stats);
    Arc::new(layer.with_jitter_seed(jitter_seed))
}
