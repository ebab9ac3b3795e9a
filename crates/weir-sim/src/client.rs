//! Simulated producers: what they sent, what came back, and what they retry.
//!
//! Each batch carries its identity in its first timestamp (unique per batch, see [`Stamps`]), so
//! the auditor can tell every batch in the log apart without trusting anything the agent computed.
//! Idempotent clients behave like a Kafka idempotent producer: at most five batches in flight per
//! partition, and a failed or unanswered batch is re-sent with its original sequence number, in
//! sequence order, once nothing else of its partition is in flight. Plain clients never retry, so
//! every batch of theirs must appear at most once in the log too.
//!
//! An idempotent client whose producer id expired (`UNKNOWN_PRODUCER_ID`, 59, or a partition
//! whose state the broker lost) reacts as librdkafka does: it waits until nothing is in flight,
//! bumps its epoch locally and re-sends every batch not yet acknowledged from sequence 0 (which
//! revives the id, RFC 0003 §4). A batch whose fate is unknown (written off with its
//! connection, or failed with an error that does not say whether it was written) cannot be
//! re-sequenced without risking a duplicate: the client gives up on it, as librdkafka fails a
//! message whose delivery timeout passed.
//!
//! An acknowledgement of a batch also acknowledges every earlier batch of its stream (same
//! partition, same epoch) still waiting for a re-send, as librdkafka's implicit acks do: the
//! broker takes sequence n+1 only after n. Without it, a batch whose written attempt was answered
//! "possibly written" would be retried after later batches had pushed it out of the broker's
//! five-batch window, and refused as out of sequence for ever.

use std::collections::BTreeMap;

/// Batches of one partition an idempotent producer keeps in flight (Kafka's limit).
pub(crate) const MAX_IN_FLIGHT_PER_PARTITION: usize = 5;

/// Which batch of which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BatchId {
    pub(crate) client: u32,
    pub(crate) number: u32,
}

impl BatchId {
    /// No client's batch: the empty batch an abort leaves at a pending batch's offsets
    /// (RFC 0006).
    pub(crate) const FILLER: BatchId = BatchId {
        client: u32::MAX,
        number: u32::MAX,
    };
    /// To the auditor, a pending batch in too few buckets to read: not yet known.
    pub(crate) const UNREAD: BatchId = BatchId {
        client: u32::MAX,
        number: u32::MAX - 1,
    };

    /// A filler or an unread pending batch: no client's batch.
    pub(crate) fn is_filler(&self) -> bool {
        *self == BatchId::FILLER || *self == BatchId::UNREAD
    }
}

/// First timestamps: each batch gets its own, near the simulated wall clock (so `retention.ms`
/// drops batches by age as it would in production), and the auditor maps a timestamp read from
/// bucket bytes back to the batch without trusting anything the agent computed.
#[derive(Debug, Default)]
pub(crate) struct Stamps {
    last: i64,
    ids: BTreeMap<i64, BatchId>,
    /// Plain batches whose client gave up on a live agent (cluster seeds: the agent was cut
    /// off its peers): the request may still be served after the client's later batches, as in
    /// Kafka, which orders a non-idempotent producer's batches only on one connection.
    abandoned: std::collections::BTreeSet<BatchId>,
}

impl Stamps {
    /// A timestamp for `id`: the clock's `now_ms`, or one past the last one handed out.
    pub(crate) fn stamp(&mut self, now_ms: i64, id: BatchId) -> i64 {
        let timestamp = now_ms.max(self.last + 1);
        self.last = timestamp;
        self.ids.insert(timestamp, id);
        timestamp
    }

    pub(crate) fn abandon(&mut self, id: BatchId) {
        self.abandoned.insert(id);
    }

    pub(crate) fn is_abandoned(&self, id: &BatchId) -> bool {
        self.abandoned.contains(id)
    }

    /// The batch a first timestamp belongs to (`None`: no simulated client built it).
    pub(crate) fn id(&self, timestamp: i64) -> Option<BatchId> {
        self.ids.get(&timestamp).copied()
    }
}

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}#{}", self.client, self.number)
    }
}

/// One record batch as the client built it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) id: BatchId,
    /// First timestamp, from [`Stamps`]; the same on every send.
    pub(crate) timestamp: i64,
    pub(crate) partition: i32,
    pub(crate) count: i32,
    /// Base sequence; -1 for plain clients.
    pub(crate) sequence: i32,
    pub(crate) attempts: u32,
    /// Some attempt's fate is unknown: it may be in the log under its current sequence.
    pub(crate) ambiguous: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Idempotent,
    Plain,
}

/// One partition's stream of an idempotent client.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    pub(crate) next_sequence: i32,
    /// Sent and not answered, by batch number.
    pub(crate) in_flight: BTreeMap<u32, Batch>,
    /// Failed or unanswered, to re-send in sequence order.
    pub(crate) retry: BTreeMap<i32, Batch>,
    /// Every sequence below this is written (a batch from here on was acknowledged).
    pub(crate) written_below: i32,
}

impl Stream {
    pub(crate) fn can_send_new(&self) -> bool {
        self.retry.is_empty() && self.in_flight.len() < MAX_IN_FLIGHT_PER_PARTITION
    }

    pub(crate) fn settled(&self) -> bool {
        self.retry.is_empty() && self.in_flight.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) id: u32,
    pub(crate) kind: Kind,
    /// (producer id, epoch) once InitProducerId answered (idempotent clients only).
    pub(crate) producer: Option<(i64, i16)>,
    /// Index of the incarnation the client is connected to.
    pub(crate) attached: Option<usize>,
    pub(crate) next_number: u32,
    pub(crate) streams: BTreeMap<i32, Stream>,
    /// Plain clients: sent and not answered.
    pub(crate) plain_in_flight: BTreeMap<u32, Batch>,
    /// The broker lost this producer's state: bump the epoch once nothing is in flight.
    pub(crate) bump_pending: bool,
    /// Batches given up at an epoch bump (their fate unknown), never acknowledged.
    pub(crate) given_up: u32,
    /// Sending nothing new until then (a producer that went quiet).
    pub(crate) idle_until: Option<tokio::time::Instant>,
    /// Sending nothing new, and quiet this long once nothing is in flight.
    pub(crate) going_quiet: Option<std::time::Duration>,
}

impl Client {
    pub(crate) fn new(id: u32, kind: Kind) -> Client {
        Client {
            id,
            kind,
            producer: None,
            attached: None,
            next_number: 0,
            streams: BTreeMap::new(),
            plain_in_flight: BTreeMap::new(),
            bump_pending: false,
            given_up: 0,
            idle_until: None,
            going_quiet: None,
        }
    }

    /// The id the next new batch gets.
    pub(crate) fn next_id(&self) -> BatchId {
        BatchId {
            client: self.id,
            number: self.next_number,
        }
    }

    /// A new batch for `partition` stamped `timestamp`, registered as in flight.
    pub(crate) fn new_batch(&mut self, partition: i32, count: i32, timestamp: i64) -> Batch {
        let id = self.next_id();
        self.next_number += 1;
        match self.kind {
            Kind::Idempotent => {
                let stream = self.streams.entry(partition).or_default();
                let batch = Batch {
                    id,
                    timestamp,
                    partition,
                    count,
                    sequence: stream.next_sequence,
                    attempts: 1,
                    ambiguous: false,
                };
                stream.next_sequence += count;
                stream.in_flight.insert(id.number, batch);
                batch
            }
            Kind::Plain => {
                let batch = Batch {
                    id,
                    timestamp,
                    partition,
                    count,
                    sequence: -1,
                    attempts: 1,
                    ambiguous: false,
                };
                self.plain_in_flight.insert(id.number, batch);
                batch
            }
        }
    }

    /// Takes the batch out of flight; `None` if it was already written off (its answer came
    /// from an incarnation that has since died).
    pub(crate) fn answered(&mut self, partition: i32, number: u32) -> Option<Batch> {
        match self.kind {
            Kind::Idempotent => self
                .streams
                .get_mut(&partition)
                .and_then(|stream| stream.in_flight.remove(&number)),
            Kind::Plain => self.plain_in_flight.remove(&number),
        }
    }

    /// `batch` was acknowledged: every earlier batch of its stream is written too. Returns
    /// those that were waiting for a re-send, now implicitly acknowledged.
    pub(crate) fn acknowledged(&mut self, batch: &Batch) -> Vec<Batch> {
        let Some(stream) = self.streams.get_mut(&batch.partition) else {
            return Vec::new();
        };
        if self.kind == Kind::Plain {
            return Vec::new();
        }
        stream.written_below = stream.written_below.max(batch.sequence + batch.count);
        let later = stream.retry.split_off(&stream.written_below);
        std::mem::replace(&mut stream.retry, later)
            .into_values()
            .collect()
    }

    /// Whether a later batch of `batch`'s stream was acknowledged: it is written, whatever
    /// this answer says.
    pub(crate) fn written_before(&self, batch: &Batch) -> bool {
        self.kind == Kind::Idempotent
            && self
                .streams
                .get(&batch.partition)
                .is_some_and(|stream| batch.sequence < stream.written_below)
    }

    /// A batch that failed or went unanswered: idempotent clients re-send it later.
    pub(crate) fn failed(&mut self, batch: Batch) -> bool {
        match self.kind {
            Kind::Idempotent => {
                self.streams
                    .entry(batch.partition)
                    .or_default()
                    .retry
                    .insert(batch.sequence, batch);
                true
            }
            Kind::Plain => false,
        }
    }

    /// Everything in flight is unanswered (the connection's agent died); returns the batches.
    pub(crate) fn connection_lost(&mut self) -> Vec<Batch> {
        let mut lost: Vec<Batch> = std::mem::take(&mut self.plain_in_flight)
            .into_values()
            .collect();
        for stream in self.streams.values_mut() {
            lost.extend(std::mem::take(&mut stream.in_flight).into_values());
        }
        self.attached = None;
        for batch in &mut lost {
            batch.ambiguous = true;
        }
        lost
    }

    /// Whether a refusal of `batch` means the broker no longer has this producer's state on
    /// its partition: 59, or a first sequence expected although earlier batches of the
    /// partition were acknowledged (the id was revived elsewhere after it expired).
    pub(crate) fn lost_state(&self, batch: &Batch, error: &weir_control::ControlError) -> bool {
        use weir_control::ControlError;
        match error {
            ControlError::UnknownProducerId(_) => true,
            ControlError::OutOfOrderSequence { expected: 0, .. } => {
                let stream = self.streams.get(&batch.partition);
                let lowest = stream
                    .into_iter()
                    .flat_map(|s| s.in_flight.values().chain(s.retry.values()))
                    .map(|b| b.sequence)
                    .chain([batch.sequence])
                    .min();
                lowest.is_some_and(|sequence| sequence > 0)
            }
            _ => false,
        }
    }

    /// The epoch bump after the broker lost this producer's state, once nothing is in flight:
    /// every partition restarts at sequence 0 under the next epoch, batches not yet
    /// acknowledged re-sequenced in order, those of unknown fate given up. Returns the new
    /// epoch, or `None` while batches are still in flight.
    pub(crate) fn bump_epoch(&mut self) -> Option<i16> {
        if self.streams.values().any(|s| !s.in_flight.is_empty()) {
            return None;
        }
        let (id, epoch) = self.producer?;
        let epoch = epoch + 1;
        self.producer = Some((id, epoch));
        self.bump_pending = false;
        for stream in self.streams.values_mut() {
            let pending = std::mem::take(&mut stream.retry);
            stream.next_sequence = 0;
            stream.written_below = 0;
            for (_, mut batch) in pending {
                if batch.ambiguous {
                    self.given_up += 1;
                    continue;
                }
                batch.sequence = stream.next_sequence;
                stream.next_sequence += batch.count;
                stream.retry.insert(batch.sequence, batch);
            }
        }
        Some(epoch)
    }

    /// Batches to re-send now: a stream's whole retry queue once nothing of it is in flight.
    pub(crate) fn take_resends(&mut self) -> Vec<Batch> {
        let mut out = Vec::new();
        for stream in self.streams.values_mut() {
            if stream.in_flight.is_empty() && !stream.retry.is_empty() {
                for (_, mut batch) in std::mem::take(&mut stream.retry) {
                    batch.attempts += 1;
                    stream.in_flight.insert(batch.id.number, batch);
                    out.push(batch);
                }
            }
        }
        out
    }

    /// Whether the client sends no new batches now (quiet, or about to be).
    pub(crate) fn quiet(&self) -> bool {
        self.idle_until.is_some() || self.going_quiet.is_some()
    }

    pub(crate) fn settled(&self) -> bool {
        self.plain_in_flight.is_empty() && self.streams.values().all(Stream::settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_stamps_are_unique_and_map_back() {
        let mut stamps = Stamps::default();
        let a = BatchId {
            client: 0,
            number: 0,
        };
        let b = BatchId {
            client: 3,
            number: 17,
        };
        assert_eq!(stamps.stamp(1_000, a), 1_000);
        // Two batches in the same millisecond get different timestamps.
        assert_eq!(stamps.stamp(1_000, b), 1_001);
        assert_eq!(stamps.id(1_000), Some(a));
        assert_eq!(stamps.id(1_001), Some(b));
        assert_eq!(stamps.id(5), None);
    }

    #[test]
    fn test_idempotent_stream_resends_in_sequence_order() {
        let mut client = Client::new(1, Kind::Idempotent);
        let a = client.new_batch(0, 3, 10);
        let b = client.new_batch(0, 2, 11);
        assert_eq!((a.sequence, b.sequence), (0, 3));
        assert!(client.streams[&0].can_send_new());
        // b fails first, a goes unanswered: nothing is re-sent while a is in flight.
        let b = client.answered(0, b.id.number).unwrap();
        client.failed(b);
        assert!(client.take_resends().is_empty());
        let lost = client.connection_lost();
        assert_eq!(lost.len(), 1);
        client.failed(lost[0]);
        let resends = client.take_resends();
        assert_eq!(
            resends.iter().map(|b| b.sequence).collect::<Vec<_>>(),
            vec![0, 3]
        );
        assert!(resends.iter().all(|b| b.attempts == 2));
        assert!(!client.settled());
    }

    #[test]
    fn test_a_later_acknowledgement_acknowledges_earlier_batches_waiting_to_resend() {
        let mut client = Client::new(1, Kind::Idempotent);
        let a = client.new_batch(0, 2, 10);
        let b = client.new_batch(0, 3, 11);
        let c = client.new_batch(1, 1, 12);
        // a was answered "possibly written"; b, behind it, was acknowledged.
        let a = client.answered(0, a.id.number).unwrap();
        client.failed(Batch {
            ambiguous: true,
            ..a
        });
        let b = client.answered(0, b.id.number).unwrap();
        let implicit = client.acknowledged(&b);
        assert_eq!(implicit.iter().map(|x| x.id).collect::<Vec<_>>(), [a.id]);
        assert!(client.streams[&0].settled());
        assert!(client.written_before(&a));
        // A batch after b is not known written.
        let d = client.new_batch(0, 1, 13);
        assert!(!client.written_before(&d));
        client.answered(0, d.id.number).unwrap();
        // Another partition's stream is its own.
        assert!(!client.written_before(&c));
        // An epoch bump restarts the sequences: nothing is known written under the new one.
        client.producer = Some((7, 0));
        client.answered(1, c.id.number).unwrap();
        assert_eq!(client.bump_epoch(), Some(1));
        assert!(!client.written_before(&Batch { sequence: 0, ..a }));
    }

    #[test]
    fn test_epoch_bump_resequences_from_zero_and_gives_up_unknown_fates() {
        let mut client = Client::new(2, Kind::Idempotent);
        client.producer = Some((7, 0));
        let a = client.new_batch(0, 2, 10);
        let b = client.new_batch(0, 3, 11);
        let c = client.new_batch(1, 1, 12);
        let refused = weir_control::ControlError::UnknownProducerId(7);
        // a's connection was lost (fate unknown); b and c were refused with 59.
        let a = client.answered(0, a.id.number).unwrap();
        client.failed(Batch {
            ambiguous: true,
            ..a
        });
        let b = client.answered(0, b.id.number).unwrap();
        assert!(client.lost_state(&b, &refused));
        client.failed(b);
        assert_eq!(client.bump_epoch(), None, "c is still in flight");
        let c = client.answered(1, c.id.number).unwrap();
        client.failed(c);
        assert_eq!(client.bump_epoch(), Some(1));
        assert_eq!(client.producer, Some((7, 1)));
        assert_eq!(client.given_up, 1);
        let resends = client.take_resends();
        let sent: Vec<(u32, i32, i32)> = resends
            .iter()
            .map(|batch| (batch.id.number, batch.partition, batch.sequence))
            .collect();
        assert_eq!(sent, vec![(1, 0, 0), (2, 1, 0)]);
        assert_eq!(client.streams[&0].next_sequence, 3);
        // A first sequence expected although earlier batches were acknowledged: state lost.
        let d = client.new_batch(0, 1, 13);
        let expected_zero = weir_control::ControlError::OutOfOrderSequence {
            expected: 0,
            got: d.sequence,
        };
        client.answered(0, 1);
        assert!(client.lost_state(&d, &expected_zero));
    }
}
