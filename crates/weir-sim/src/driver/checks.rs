//! What the world checks: consumers reading the newest live agent, the per-step audit against
//! the replayed durable log, convergence after healing, and the final audit.

use super::*;

impl World {
    /// Each partition's consumer reads what the newest live incarnation makes visible.
    pub(super) async fn consume(&mut self) {
        let (Some(newest), Some(topic)) = (self.newest_live(), self.topic) else {
            return;
        };
        let fetch = self.incarnations[newest].fetch.clone();
        for partition in 0..self.scenario.partitions {
            let consumer = &self.consumers[partition as usize];
            let plan = match fetch.plan(&topic, partition, consumer.next_offset, 16 * 1024, true) {
                Ok(plan) if !plan.is_empty() => plan,
                Ok(_) => continue,
                Err(weir_fetch::FetchError::OffsetOutOfRange { .. }) => continue,
                Err(err) => {
                    self.violation(format!("p{partition}: fetch plan failed: {err}"));
                    continue;
                }
            };
            // Reads of a plan go one file after another, so a slow holder costs its delay per
            // file; a read that never returns shows up as no convergence after healing.
            let read = tokio::time::timeout(Duration::from_secs(60), fetch.read(plan)).await;
            let data = match read {
                Ok(Ok(data)) => data,
                Ok(Err(err)) => {
                    self.event(&format!("p{partition}: read failed: {err}"));
                    continue;
                }
                Err(_) => {
                    self.event(&format!("p{partition}: read timed out"));
                    continue;
                }
            };
            let mut position = 0;
            let mut records = Vec::new();
            while position < data.records.len() {
                let header = match BatchHeader::parse(&data.records[position..]) {
                    Ok(header) => header,
                    Err(err) => {
                        self.violation(format!("p{partition}: fetched garbage: {err}"));
                        break;
                    }
                };
                position += header.total_len();
                records.push(header);
            }
            for header in records {
                let consumer = &mut self.consumers[partition as usize];
                if header.base_offset != consumer.next_offset {
                    let expected = consumer.next_offset;
                    self.violation(format!(
                        "p{partition}: consumer expected offset {expected}, got {}",
                        header.base_offset
                    ));
                    break;
                }
                let Some(id) = BatchId::from_timestamp(header.first_timestamp) else {
                    self.violation(format!("p{partition}: consumer read a foreign batch"));
                    break;
                };
                consumer.next_offset = header.base_offset + header.offset_span();
                consumer
                    .unchecked
                    .push((header.base_offset, id, header.last_offset_delta + 1));
                self.report.consumed_batches += 1;
            }
        }
    }

    pub(super) async fn audit(&mut self) {
        let Some(topic) = self.topic else {
            return;
        };
        self.report.audits += 1;
        let mut messages = Vec::new();
        let shadow = self
            .auditor
            .shadow(topic, self.scenario.partitions, &mut messages)
            .await;
        if let Some(shadow) = &shadow {
            check_log(shadow, &mut messages);
            self.check_acks(shadow, &mut messages);
            self.check_live_prefixes(topic, shadow, &mut messages);
            self.check_consumed(shadow, &mut messages);
        }
        for message in messages {
            self.violation(message);
        }
    }

    /// DUR-1: every acknowledged batch is in the durable log at the offset it was acked with.
    pub(super) fn check_acks(&self, shadow: &Shadow, messages: &mut Vec<String>) -> u64 {
        let mut lost = 0;
        for ack in &self.acks {
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
    /// watermark) is exactly the durable log.
    pub(super) fn check_live_prefixes(
        &self,
        topic: TopicId,
        shadow: &Shadow,
        messages: &mut Vec<String>,
    ) {
        for (_, incarnation) in self.live() {
            let number = incarnation.number;
            incarnation.control.read(|state| {
                for partition in 0..self.scenario.partitions {
                    let Some(p) = state.partition(&topic, partition) else {
                        continue;
                    };
                    let durable = shadow.high_watermark(partition as usize);
                    if p.stable_high_watermark > durable {
                        messages.push(format!(
                            "incarnation {number} p{partition}: stable {} beyond durable {durable}",
                            p.stable_high_watermark
                        ));
                    }
                    for entry in p
                        .index
                        .iter()
                        .take_while(|e| e.last_offset < p.stable_high_watermark)
                    {
                        let same = shadow
                            .at(partition as usize, entry.base_offset)
                            .is_some_and(|placed| placed.entry == *entry);
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

    /// Consumers only ever read durable batches, at their durable offsets.
    pub(super) fn check_consumed(&mut self, shadow: &Shadow, messages: &mut Vec<String>) {
        for (partition, consumer) in self.consumers.iter_mut().enumerate() {
            for (offset, id, count) in consumer.unchecked.drain(..) {
                let ok = shadow
                    .at(partition, offset)
                    .is_some_and(|placed| placed.seen.id == id && placed.seen.count == count);
                if !ok {
                    messages.push(format!(
                        "p{partition}: consumer read {id} at {offset}, not in the durable log"
                    ));
                }
            }
        }
    }

    /// Every idempotent batch acknowledged, every consumer at the end of the durable log.
    pub(super) fn converged(&self) -> bool {
        if self.topic.is_none() || self.newest_live().is_none() {
            return false;
        }
        let clients_done = self.clients.iter().all(|client| {
            client.settled() && (client.kind == Kind::Plain || client.producer.is_some())
        });
        if !clients_done {
            return false;
        }
        let newest = &self.incarnations[self.newest_live().expect("checked")];
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
        self.auditor.forget_reads();
        let Some(shadow) = self
            .auditor
            .shadow(topic, self.scenario.partitions, &mut messages)
            .await
        else {
            for message in messages {
                self.violation(message);
            }
            return;
        };
        let mut breaches = check_log(&shadow, &mut messages);
        breaches.lost = self.check_acks(&shadow, &mut messages);
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
                let sent = client.next_number;
                let acked = all_acked.iter().filter(|id| id.client == client.id).count();
                if acked as u32 != sent {
                    messages.push(format!(
                        "client {}: {acked} of {sent} idempotent batches acknowledged",
                        client.id
                    ));
                }
            }
        }
        self.report.final_audit = breaches;
        for message in messages {
            self.violation(message);
        }
    }
}
