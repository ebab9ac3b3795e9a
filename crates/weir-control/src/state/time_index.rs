//! A partition's time index: the running maximum of its batches' max timestamps, parallel to
//! the batch index. Derived, never persisted: rebuilt from the index entries on recovery and
//! extended on every append, so it costs 8 bytes per batch and no format change.
//!
//! Kafka's ListOffsets by timestamp wants the first batch whose max timestamp reaches the
//! target. The running maximum is monotonic, so that batch is found by binary search (under
//! the state read lock, without scanning the index): the first position whose running maximum
//! reaches the target is exactly the first batch that does.

use super::IndexEntry;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeIndex {
    /// `running_max[i]` = max of `max_timestamp` over index entries `0..=i`.
    running_max: Vec<i64>,
}

impl TimeIndex {
    pub fn rebuild(entries: &[IndexEntry]) -> Self {
        let mut index = Self::default();
        for entry in entries {
            index.push(entry.max_timestamp);
        }
        index
    }

    /// Extends the index by one appended batch.
    pub fn push(&mut self, max_timestamp: i64) {
        let running = self
            .running_max
            .last()
            .map_or(max_timestamp, |&m| m.max(max_timestamp));
        self.running_max.push(running);
    }

    pub fn len(&self) -> usize {
        self.running_max.len()
    }

    pub fn is_empty(&self) -> bool {
        self.running_max.is_empty()
    }

    /// The largest max timestamp among the first `count` batches, if the index covers them.
    pub fn max_through(&self, count: usize) -> Option<i64> {
        count
            .checked_sub(1)
            .and_then(|last| self.running_max.get(last))
            .copied()
    }

    /// Position in `entries` of the first batch at or after position `from` whose max timestamp
    /// is at least `target`.
    pub fn first_reaching(
        &self,
        entries: &[IndexEntry],
        from: usize,
        target: i64,
    ) -> Option<usize> {
        let scan = |from: usize| {
            entries
                .get(from..)?
                .iter()
                .position(|e| e.max_timestamp >= target)
                .map(|i| from + i)
        };
        if self.running_max.len() != entries.len() {
            // Not maintained for these entries (a state built by hand): answer correctly anyway.
            return scan(from);
        }
        let first = self.running_max.partition_point(|&max| max < target);
        if first >= entries.len() {
            None
        } else if first >= from {
            Some(first)
        } else {
            // A batch before `from` (below the log start) reached the target: the prefix
            // maximum says nothing about the batches from `from` on.
            scan(from)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use weir_common::FileId;

    fn entries(max_timestamps: &[i64]) -> Vec<IndexEntry> {
        max_timestamps
            .iter()
            .enumerate()
            .map(|(i, &ts)| IndexEntry {
                base_offset: i as i64,
                last_offset: i as i64,
                file_id: FileId(1),
                byte_offset: 0,
                len: 1,
                first_timestamp: ts,
                max_timestamp: ts,
            })
            .collect()
    }

    #[test]
    fn test_time_index_first_batch_reaching_target() {
        let entries = entries(&[100, 500, 300, 700]);
        let index = TimeIndex::rebuild(&entries);
        assert_eq!(index.first_reaching(&entries, 0, 50), Some(0));
        assert_eq!(index.first_reaching(&entries, 0, 300), Some(1));
        assert_eq!(index.first_reaching(&entries, 0, 600), Some(3));
        assert_eq!(index.first_reaching(&entries, 0, 701), None);
        // From position 2 on: the 500 before it does not count.
        assert_eq!(index.first_reaching(&entries, 2, 200), Some(2));
        assert_eq!(index.first_reaching(&entries, 2, 400), Some(3));
    }

    proptest! {
        #[test]
        fn test_time_index_matches_a_scan(
            timestamps in proptest::collection::vec(-5i64..100, 0..40),
            from in 0usize..45,
            target in -10i64..110,
        ) {
            let entries = entries(&timestamps);
            let mut index = TimeIndex::default();
            for e in &entries {
                index.push(e.max_timestamp);
            }
            let scan = entries
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, e)| e.max_timestamp >= target)
                .map(|(i, _)| i);
            prop_assert_eq!(index.first_reaching(&entries, from, target), scan);
        }
    }
}
