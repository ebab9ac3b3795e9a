//! Idempotent producers (IDM-1): producer ids and epochs, and the per-partition memory of
//! recent sequences that detects duplicates and gaps.

use super::{PartitionState, SequencedBatch, State, PRODUCER_BATCH_MEMORY};
use crate::entry::BatchCommit;
use crate::ControlError;

impl State {
    pub(super) fn init_producer_id(
        &mut self,
        existing: Option<(i64, i16)>,
        at_ms: i64,
        fresh_if_unknown: bool,
    ) -> Result<(i64, i16), ControlError> {
        if let Some((producer_id, epoch)) = existing {
            let Some(&current) = self.producer_epochs.get(&producer_id) else {
                return if fresh_if_unknown {
                    Ok(self.new_producer_id(at_ms))
                } else {
                    Err(ControlError::UnknownProducerId(producer_id))
                };
            };
            if current != epoch {
                return Err(ControlError::InvalidProducerEpoch {
                    current,
                    got: epoch,
                });
            }
            if current < i16::MAX - 1 {
                self.producer_epochs.insert(producer_id, current + 1);
                self.producer_active(producer_id, at_ms);
                return Ok((producer_id, current + 1));
            }
            // Epoch exhausted: fall through to a fresh producer id, as Kafka does.
        }
        Ok(self.new_producer_id(at_ms))
    }

    fn new_producer_id(&mut self, at_ms: i64) -> (i64, i16) {
        let producer_id = self.next_producer_id;
        self.next_producer_id += 1;
        self.producer_epochs.insert(producer_id, 0);
        self.producer_active(producer_id, at_ms);
        (producer_id, 0)
    }

    /// Notes activity of a producer at `at_ms` (its latest activity wins).
    pub(super) fn producer_active(&mut self, producer_id: i64, at_ms: i64) {
        let last = self.producer_last_ms.entry(producer_id).or_insert(at_ms);
        *last = (*last).max(at_ms);
    }
}

pub(super) enum SequenceCheck {
    Accept,
    Duplicate(i64),
    Reject(ControlError),
}

fn last_sequence(batch: &BatchCommit) -> i32 {
    // Sequences wrap at i32::MAX, as in Kafka.
    ((i64::from(batch.base_sequence) + i64::from(batch.offset_span) - 1)
        % (i64::from(i32::MAX) + 1)) as i32
}

/// A batch that opens a producer's stream on a partition (first batch, or a new epoch).
fn starts_at_zero(batch: &BatchCommit) -> SequenceCheck {
    if batch.base_sequence == 0 {
        SequenceCheck::Accept
    } else {
        SequenceCheck::Reject(ControlError::OutOfOrderSequence {
            expected: 0,
            got: batch.base_sequence,
        })
    }
}

pub(super) fn check_sequence(partition: &PartitionState, batch: &BatchCommit) -> SequenceCheck {
    let Some(producer) = partition.producers.get(&batch.producer_id) else {
        // First batch of this producer on this partition: it must start the stream at 0. Kafka
        // accepts any sequence here because retention may have removed the producer's state;
        // Weir keeps that state, and accepting a later batch first would let it overtake an
        // earlier one whose file failed to upload — the earlier one's retry could then never
        // be placed (the simulator found this: seed 17).
        return starts_at_zero(batch);
    };
    if batch.producer_epoch < producer.epoch {
        return SequenceCheck::Reject(ControlError::InvalidProducerEpoch {
            current: producer.epoch,
            got: batch.producer_epoch,
        });
    }
    if batch.producer_epoch > producer.epoch {
        return starts_at_zero(batch);
    }
    let last = last_sequence(batch);
    if let Some(seen) = producer
        .recent
        .iter()
        .find(|seen| seen.first_sequence == batch.base_sequence && seen.last_sequence == last)
    {
        return SequenceCheck::Duplicate(seen.base_offset);
    }
    let expected = producer
        .recent
        .back()
        .map(|seen| {
            if seen.last_sequence == i32::MAX {
                0
            } else {
                seen.last_sequence + 1
            }
        })
        .unwrap_or(batch.base_sequence);
    if batch.base_sequence == expected {
        SequenceCheck::Accept
    } else {
        SequenceCheck::Reject(ControlError::OutOfOrderSequence {
            expected,
            got: batch.base_sequence,
        })
    }
}

pub(super) fn record_sequence(
    partition: &mut PartitionState,
    batch: &BatchCommit,
    base_offset: i64,
) {
    let producer = partition.producers.entry(batch.producer_id).or_default();
    if batch.producer_epoch != producer.epoch {
        producer.epoch = batch.producer_epoch;
        producer.recent.clear();
    }
    producer.recent.push_back(SequencedBatch {
        first_sequence: batch.base_sequence,
        last_sequence: last_sequence(batch),
        base_offset,
    });
    while producer.recent.len() > PRODUCER_BATCH_MEMORY {
        producer.recent.pop_front();
    }
}
