use proptest::prelude::*;
use weir_common::FileId;

use super::*;

fn entry(base_offset: i64, max_timestamp: i64, len: u32) -> IndexEntry {
    IndexEntry {
        base_offset,
        last_offset: base_offset,
        file_id: FileId(base_offset as u128),
        byte_offset: 0,
        len,
        first_timestamp: max_timestamp,
        max_timestamp,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Push {
        max_timestamp: i64,
        len: u32,
    },
    RemoveFront(usize),
    /// Clone, change the clone, and check the original did not move.
    CloneAndPush,
    /// Replaces `count` entries from position `at` by one run entry spanning them.
    Merge {
        at: usize,
        count: usize,
    },
    /// Points every second entry from position `at` at a filler of `len` bytes (an abort).
    Refill {
        at: usize,
        len: u32,
    },
}

/// One entry spanning `entries` (what compaction's swap puts in place of a run of batches).
fn run_of(entries: &[IndexEntry]) -> IndexEntry {
    IndexEntry {
        base_offset: entries[0].base_offset,
        last_offset: entries[entries.len() - 1].last_offset,
        file_id: FileId(u128::MAX),
        byte_offset: 7,
        len: entries.iter().map(|e| e.len).sum(),
        first_timestamp: entries[0].first_timestamp,
        max_timestamp: entries.iter().map(|e| e.max_timestamp).max().unwrap(),
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (-5i64..100, 1u32..500).prop_map(|(max_timestamp, len)| Op::Push { max_timestamp, len }),
        2 => (0usize..12).prop_map(Op::RemoveFront),
        1 => Just(Op::CloneAndPush),
        2 => (0usize..20, 1usize..9).prop_map(|(at, count)| Op::Merge { at, count }),
        2 => (0usize..20, 1u32..100).prop_map(|(at, len)| Op::Refill { at, len }),
    ]
}

/// Every query of the chunked index agrees with the same query on a plain vector.
fn check_against(index: &ChunkedIndex, model: &[IndexEntry], from: usize, target: i64) {
    assert_eq!(index.len(), model.len());
    assert_eq!(index.iter().copied().collect::<Vec<_>>(), model);
    assert_eq!(
        index.iter_from(from).copied().collect::<Vec<_>>(),
        model.get(from..).unwrap_or_default()
    );
    for (i, e) in model.iter().enumerate() {
        assert_eq!(index.get(i), Some(e));
    }
    assert_eq!(index.get(model.len()), None);
    assert_eq!(index.last(), model.last());
    let scan = model
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, e)| e.max_timestamp >= target)
        .map(|(i, _)| i);
    assert_eq!(
        index.first_reaching(from, target),
        scan,
        "first_reaching({from}, {target})"
    );
    let to = (from + 7).min(model.len());
    let bytes: u64 = model
        .get(from..to)
        .unwrap_or_default()
        .iter()
        .map(|e| u64::from(e.len))
        .sum();
    assert_eq!(index.bytes_between(from, to), bytes);
    let max = model
        .get(from..to)
        .unwrap_or_default()
        .iter()
        .map(|e| e.max_timestamp)
        .max();
    let expected = max.map(|max| {
        let position = from
            + model[from..to]
                .iter()
                .position(|e| e.max_timestamp == max)
                .unwrap();
        (position, max)
    });
    assert_eq!(index.max_timestamp_between(from, to), expected);
    let keep = target.unsigned_abs() * 10;
    let first_keeping = (0..=model.len())
        .find(|&p| {
            model
                .iter()
                .skip(p + 1)
                .map(|e| u64::from(e.len))
                .sum::<u64>()
                < keep
        })
        .unwrap_or(model.len());
    assert_eq!(
        index.first_keeping(keep),
        first_keeping,
        "first_keeping({keep})"
    );
    let cut = model.first().map_or(0, |e| e.base_offset) + (from as i64);
    assert_eq!(
        index.partition_point(|e| e.base_offset < cut),
        model.partition_point(|e| e.base_offset < cut)
    );
}

proptest! {
    #[test]
    fn test_chunked_index_matches_a_vector(
        chunk_entries in 1usize..6,
        ops in proptest::collection::vec(op(), 0..60),
        from in 0usize..20,
        target in -10i64..110,
    ) {
        let mut index = ChunkedIndex::with_chunk_entries(chunk_entries);
        let mut model: Vec<IndexEntry> = Vec::new();
        let mut next = 0i64;
        for op in ops {
            match op {
                Op::Push { max_timestamp, len } => {
                    index.push(entry(next, max_timestamp, len));
                    model.push(entry(next, max_timestamp, len));
                    next += 1;
                }
                Op::RemoveFront(count) => {
                    let mut removed = Vec::new();
                    index.remove_front(count, |e| removed.push(*e));
                    let expected: Vec<_> = model.drain(..count.min(model.len())).collect();
                    prop_assert_eq!(removed, expected);
                }
                Op::CloneAndPush => {
                    let mut copy = index.clone();
                    copy.push(entry(next, 0, 1));
                    copy.remove_front(1, |_| {});
                    prop_assert_eq!(index.iter().copied().collect::<Vec<_>>(), model.clone());
                }
                Op::Merge { at, count } => {
                    let copy = index.clone();
                    let end = at + count;
                    if end <= model.len() {
                        let run = run_of(&model[at..end]);
                        prop_assert!(index.replace_range(at, end, run));
                        model.splice(at..end, [run]);
                        let mut wrong = run;
                        wrong.len += 1;
                        prop_assert!(!index.replace_range(at, at + 1, wrong), "a run must span its bytes");
                    } else {
                        prop_assert!(!index.replace_range(at, end, entry(0, 0, 1)));
                    }
                    prop_assert_eq!(copy.len(), copy.iter().count(), "the clone is untouched");
                }
                Op::Refill { at, len } => {
                    let copy = index.clone();
                    let before: Vec<IndexEntry> = copy.iter().copied().collect();
                    let refill = |e: &mut IndexEntry| {
                        if e.base_offset % 2 == 0 {
                            e.file_id = FileId(u128::MAX - 1);
                            e.len = len;
                        }
                    };
                    index.rewrite_from(at, refill);
                    for e in model.iter_mut().skip(at) {
                        refill(e);
                    }
                    prop_assert_eq!(copy.iter().copied().collect::<Vec<_>>(), before, "the clone is untouched");
                }
            }
            check_against(&index, &model, from, target);
        }
        let json = serde_json::to_string(&index).unwrap();
        prop_assert_eq!(&json, &serde_json::to_string(&model).unwrap());
        let restored: ChunkedIndex = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&restored, &index);
    }
}

#[test]
fn test_chunked_index_clone_shares_full_chunks() {
    let mut index = ChunkedIndex::with_chunk_entries(4);
    for i in 0..10 {
        index.push(entry(i, i, 1));
    }
    let copy = index.clone();
    assert!(Arc::ptr_eq(&index.full[0], &copy.full[0]));
    assert!(Arc::ptr_eq(&index.tail, &copy.tail));
    index.push(entry(10, 10, 1));
    assert!(
        !Arc::ptr_eq(&index.tail, &copy.tail),
        "the tail is copied on write"
    );
    assert_eq!(copy.len(), 10);
    assert_eq!(index.len(), 11);
}

#[test]
fn test_chunked_index_front_trim_drops_whole_chunks_and_forgets_their_maxima() {
    let mut index = ChunkedIndex::with_chunk_entries(3);
    for (i, ts) in [900, 10, 20, 30, 40, 50, 60].into_iter().enumerate() {
        index.push(entry(i as i64, ts, 100));
    }
    assert_eq!(index.first_reaching(0, 500), Some(0));
    index.remove_front(4, |_| {});
    assert_eq!(index.full.len(), 1, "the first chunk is gone");
    assert_eq!(index.skip, 1);
    assert_eq!(
        index.first_reaching(0, 500),
        None,
        "the trimmed 900 no longer counts"
    );
    assert_eq!(index.first_reaching(0, 45), Some(1));
    assert_eq!(index.bytes_between(0, index.len()), 300);
    index.clear();
    assert!(index.is_empty());
    index.push(entry(7, 5, 100));
    assert_eq!(index.bytes_between(0, 1), 100);
}

#[test]
fn test_chunked_index_replace_range_rebuilds_only_the_chunks_it_touches() {
    let mut index = ChunkedIndex::with_chunk_entries(4);
    for i in 0..14 {
        index.push(entry(i, i, 10));
    }
    let copy = index.clone();
    let run = run_of(&index.iter().skip(5).take(2).copied().collect::<Vec<_>>());
    assert!(index.replace_range(5, 7, run));
    assert_eq!(index.len(), 13);
    assert!(
        Arc::ptr_eq(&index.full[0], &copy.full[0]),
        "chunk 0 is shared still"
    );
    assert!(
        Arc::ptr_eq(&index.full[2], &copy.full[2]),
        "chunk 2 is shared still"
    );
    assert_eq!(index.starts, vec![0, 4, 7]);
    assert_eq!(index.get(5), Some(&run));
    assert_eq!(index[6].base_offset, 7);
    assert_eq!(index.bytes_between(0, 13), 140, "byte totals are unchanged");
    // A run reaching into the tail, from a trimmed front.
    index.remove_front(2, |_| {});
    let rest: Vec<_> = index.iter().copied().collect();
    let run = run_of(&rest[1..]);
    assert!(index.replace_range(1, rest.len(), run));
    assert_eq!(
        index.iter().copied().collect::<Vec<_>>(),
        vec![rest[0], run]
    );
    assert_eq!(index.bytes_between(0, 2), 120);
    index.push(entry(14, 99, 10));
    assert_eq!(index.first_reaching(0, 50), Some(2));
    assert_eq!(copy.len(), 14);
}
