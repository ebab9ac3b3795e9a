//! Simulated producers: what they sent, what came back, and what they retry.
//!
//! Each batch carries its identity in its first timestamp (client and batch number), so the
//! auditor can tell every batch in the log apart without trusting anything the agent computed.
//! Idempotent clients behave like a Kafka idempotent producer: at most five batches in flight per
//! partition, and a failed or unanswered batch is re-sent with its original sequence number, in
//! sequence order, once nothing else of its partition is in flight. Plain clients never retry, so
//! every batch of theirs must appear at most once in the log too.

use std::collections::BTreeMap;

/// First timestamps are `TS_BASE + client * TS_CLIENT_STRIDE + number`.
const TS_BASE: i64 = 1_700_000_000_000;
const TS_CLIENT_STRIDE: i64 = 10_000_000;

/// Batches of one partition an idempotent producer keeps in flight (Kafka's limit).
pub(crate) const MAX_IN_FLIGHT_PER_PARTITION: usize = 5;

/// Which batch of which client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BatchId {
    pub(crate) client: u32,
    pub(crate) number: u32,
}

impl BatchId {
    pub(crate) fn timestamp(self) -> i64 {
        TS_BASE + i64::from(self.client) * TS_CLIENT_STRIDE + i64::from(self.number)
    }

    pub(crate) fn from_timestamp(timestamp: i64) -> Option<BatchId> {
        let relative = timestamp.checked_sub(TS_BASE)?;
        if relative < 0 {
            return None;
        }
        Some(BatchId {
            client: u32::try_from(relative / TS_CLIENT_STRIDE).ok()?,
            number: u32::try_from(relative % TS_CLIENT_STRIDE).ok()?,
        })
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
    pub(crate) partition: i32,
    pub(crate) count: i32,
    /// Base sequence; -1 for plain clients.
    pub(crate) sequence: i32,
    pub(crate) attempts: u32,
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
        }
    }

    /// A new batch for `partition`, registered as in flight.
    pub(crate) fn new_batch(&mut self, partition: i32, count: i32) -> Batch {
        let id = BatchId {
            client: self.id,
            number: self.next_number,
        };
        self.next_number += 1;
        match self.kind {
            Kind::Idempotent => {
                let stream = self.streams.entry(partition).or_default();
                let batch = Batch {
                    id,
                    partition,
                    count,
                    sequence: stream.next_sequence,
                    attempts: 1,
                };
                stream.next_sequence += count;
                stream.in_flight.insert(id.number, batch);
                batch
            }
            Kind::Plain => {
                let batch = Batch {
                    id,
                    partition,
                    count,
                    sequence: -1,
                    attempts: 1,
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
        lost
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

    pub(crate) fn settled(&self) -> bool {
        self.plain_in_flight.is_empty() && self.streams.values().all(Stream::settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_batch_id_round_trips_through_timestamp() {
        for (client, number) in [(0, 0), (3, 17), (9, 9_999_999)] {
            let id = BatchId { client, number };
            assert_eq!(BatchId::from_timestamp(id.timestamp()), Some(id));
        }
        assert_eq!(BatchId::from_timestamp(5), None);
    }

    #[test]
    fn test_idempotent_stream_resends_in_sequence_order() {
        let mut client = Client::new(1, Kind::Idempotent);
        let a = client.new_batch(0, 3);
        let b = client.new_batch(0, 2);
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
}
