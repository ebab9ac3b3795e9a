//! Adaptive sealing (issue 16): when the batcher seals a file, in virtual time. A lone batch
//! seals at once when nothing uploads; batches arriving during an upload share the next file;
//! `flush_interval` bounds every wait; at a high rate files fill to `target_file_bytes`.

use tokio::time::{sleep, Instant};

use super::*;
use crate::batcher::SealReason;

/// A pipeline over one bucket whose PUTs take `put_ms`, and a one-partition topic.
async fn one_partition(settings: ProduceSettings, put_ms: u64, name: &str) -> (Harness, TopicId) {
    let h = harness(vec![fixed_put(put_ms)], 1, settings).await;
    let topic = h.one_partition_topic(name).await;
    (h, topic)
}

fn seals(h: &Harness, reason: SealReason) -> u64 {
    h.pipeline.metrics().seals(reason).get()
}

fn files_of(h: &Harness, topic: TopicId) -> Vec<FileId> {
    let (_, _, index) = partition_view(&h.control, topic, 0);
    let mut files: Vec<FileId> = index.iter().map(|entry| entry.file_id).collect();
    files.dedup();
    files
}

#[tokio::test(start_paused = true)]
async fn test_a_lone_batch_seals_at_once_when_nothing_uploads() {
    let settings = ProduceSettings {
        flush_interval: Duration::from_secs(1),
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 10, "lone").await;
    for round in 0..2 {
        let started = Instant::now();
        let outcome = h.pipeline.submit(single(topic, 0, 3)).await.await;
        assert_eq!(outcome, vec![committed(round * 3)]);
        // One 10 ms upload and a commit on an in-memory log: nowhere near the 1 s bound.
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "{:?}",
            started.elapsed()
        );
        sleep(Duration::from_secs(5)).await;
    }
    assert_eq!(seals(&h, SealReason::Eager), 2);
    assert_eq!(seals(&h, SealReason::Interval), 0);
}

#[tokio::test(start_paused = true)]
async fn test_batches_arriving_during_an_upload_share_the_next_file() {
    // Eager seals at most every 50 ms (a quarter interval); the bound is 200 ms.
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(200),
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 100, "room").await;
    let started = Instant::now();
    let first = h.pipeline.submit(single(topic, 0, 1)).await;
    let mut later = Vec::new();
    for _ in 0..4 {
        sleep(Duration::from_millis(10)).await;
        later.push(h.pipeline.submit(single(topic, 0, 1)).await);
    }
    assert_eq!(first.await, vec![committed(0)]);
    for (i, outcome) in later.into_iter().enumerate() {
        assert_eq!(outcome.await, vec![committed(1 + i as i64)]);
    }
    // The first file uploads alone; the other four waited for it (no room), not for their
    // bound (210 ms), and then went out together at 100 ms: two uploads of 100 ms.
    assert_eq!(files_of(&h, topic).len(), 2);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seals(&h, SealReason::Eager), 2);
}

/// Batches at 0, 10 and 60 ms with 100 ms uploads and a 50 ms eager spacing: the number of
/// files and when the second batch was acknowledged.
async fn three_batches_during_uploads(eager_uploads: usize) -> (usize, Duration) {
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(200),
        eager_uploads,
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 100, "overlap").await;
    let started = Instant::now();
    let first = h.pipeline.submit(single(topic, 0, 1)).await;
    sleep(Duration::from_millis(10)).await;
    let second = h.pipeline.submit(single(topic, 0, 1)).await;
    sleep(Duration::from_millis(50)).await;
    let third = h.pipeline.submit(single(topic, 0, 1)).await;
    assert_eq!(first.await, vec![committed(0)]);
    assert_eq!(second.await, vec![committed(1)]);
    let second_acked = started.elapsed();
    assert_eq!(third.await, vec![committed(2)]);
    assert_eq!(seals(&h, SealReason::Interval), 0);
    (files_of(&h, topic).len(), second_acked)
}

#[tokio::test(start_paused = true)]
async fn test_eager_uploads_lets_a_second_file_seal_while_one_uploads() {
    // One eager upload: the second and third batches wait for the first upload (100 ms) and
    // share a file acknowledged at 200 ms.
    let (files, second_acked) = three_batches_during_uploads(1).await;
    assert_eq!(files, 2);
    assert!(
        second_acked >= Duration::from_millis(200),
        "{second_acked:?}"
    );
    // Two: the second batch seals at the spacing (50 ms) beside the first upload and is
    // acknowledged at 150 ms; the third finds two uploads and waits for room (100 ms).
    let (files, second_acked) = three_batches_during_uploads(2).await;
    assert_eq!(files, 3);
    assert!(
        second_acked < Duration::from_millis(160),
        "{second_acked:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn test_a_steady_stream_seals_at_most_four_files_per_interval() {
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(40),
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 1, "steady").await;
    // A small batch every 2 ms for 400 ms: far below the target rate, so the spacing is at its
    // floor of 10 ms, and each upload (1 ms) is done long before the next seal.
    let mut pending = Vec::new();
    for _ in 0..200 {
        pending.push(h.pipeline.submit(single(topic, 0, 1)).await);
        sleep(Duration::from_millis(2)).await;
    }
    for outcome in pending {
        assert!(matches!(
            outcome.await[0],
            PartitionOutcome::Committed { .. }
        ));
    }
    let files = files_of(&h, topic).len();
    assert!((38..=42).contains(&files), "{files} files in 400 ms");
    assert_eq!(seals(&h, SealReason::Interval), 0);
}

/// Two batches with `flush_interval` 50 ms and 500 ms uploads: the first seals at once, the
/// second, at 10 ms, cannot wait for the first upload. Returns when the second was
/// acknowledged.
async fn bound_sealed(timer_lag: Duration) -> (Harness, TopicId, Duration) {
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(50),
        timer_lag,
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 500, "bound").await;
    let started = Instant::now();
    let first = h.pipeline.submit(single(topic, 0, 1)).await;
    sleep(Duration::from_millis(10)).await;
    let second = h.pipeline.submit(single(topic, 0, 1)).await;
    assert_eq!(first.await, vec![committed(0)]);
    assert_eq!(second.await, vec![committed(1)]);
    let acknowledged = started.elapsed();
    (h, topic, acknowledged)
}

#[tokio::test(start_paused = true)]
async fn test_flush_interval_bounds_the_wait_for_room() {
    let (h, topic, _) = bound_sealed(Duration::ZERO).await;
    // The second batch could not wait for the first upload (500 ms): it sealed at its bound.
    assert_eq!(seals(&h, SealReason::Eager), 1);
    assert_eq!(seals(&h, SealReason::Interval), 1);
    assert_eq!(files_of(&h, topic).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn test_at_a_high_rate_files_fill_to_the_target() {
    let target = 4096;
    let settings = ProduceSettings {
        flush_interval: Duration::from_millis(50),
        target_file_bytes: target,
        max_file_bytes: 1 << 20,
        ..ProduceSettings::default()
    };
    let (h, topic) = one_partition(settings, 5, "fast").await;
    // One ticket per millisecond: far above target / flush_interval (~80 KB/s).
    let mut pending = Vec::new();
    let mut bytes = 0;
    for _ in 0..300 {
        let ticket = single(topic, 0, 40);
        bytes += ticket.byte_len();
        pending.push(h.pipeline.submit(ticket).await);
        sleep(Duration::from_millis(1)).await;
    }
    assert!(
        bytes as f64 / 0.3 > 2.0 * target as f64 / 0.05,
        "the rate is high"
    );
    for outcome in pending {
        assert!(matches!(
            outcome.await[0],
            PartitionOutcome::Committed { .. }
        ));
    }
    let files = files_of(&h, topic);
    // Once the rate is known, every file but the last fills to the target: about bytes /
    // target files, not one per ticket or per millisecond.
    assert!(
        files.len() <= bytes / target + 3,
        "{} files for {bytes} bytes",
        files.len()
    );
    assert!(seals(&h, SealReason::Size) >= (bytes / target) as u64 - 3);
    let sizes: Vec<usize> = {
        let (_, _, index) = partition_view(&h.control, topic, 0);
        files
            .iter()
            .map(|file| {
                index
                    .iter()
                    .filter(|entry| entry.file_id == *file)
                    .map(|entry| entry.len as usize)
                    .sum()
            })
            .collect()
    };
    let small = sizes[1..sizes.len() - 1]
        .iter()
        .filter(|size| **size < target)
        .count();
    assert!(small <= 2, "files below the target: {sizes:?}");
}

#[tokio::test(start_paused = true)]
async fn test_a_bound_seal_is_armed_the_timer_lag_early() {
    // The paused clock's timers are exact, so the lag shows whole: the agent's real timer fires
    // about that late, and the seal lands on the bound on average.
    let (h, _, exact) = bound_sealed(Duration::ZERO).await;
    assert_eq!(seals(&h, SealReason::Interval), 1);
    let (h, _, early) = bound_sealed(Duration::from_millis(1)).await;
    assert_eq!(seals(&h, SealReason::Interval), 1);
    assert_eq!(
        exact - early,
        Duration::from_millis(1),
        "{exact:?} {early:?}"
    );
    assert!(exact >= Duration::from_millis(560), "{exact:?}");
}
