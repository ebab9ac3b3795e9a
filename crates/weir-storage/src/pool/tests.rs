//! Pool behaviour on a paused clock: loads take modelled time, nothing else does.

use std::sync::atomic::AtomicBool;

use super::*;

/// A loader whose loads take `latency`; items remember when they were made.
struct TestLoader {
    latency: Duration,
    next: AtomicU64,
    failing: AtomicBool,
    discarded: Mutex<Vec<u64>>,
}

#[derive(Debug)]
struct Item {
    id: u64,
    made: Instant,
}

impl TestLoader {
    fn new(latency: Duration) -> TestLoader {
        TestLoader {
            latency,
            next: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            discarded: Mutex::default(),
        }
    }
}

#[async_trait]
impl PoolLoader for TestLoader {
    type Item = Item;

    async fn load(&self) -> Result<Item, StorageError> {
        tokio::time::sleep(self.latency).await;
        if self.failing.load(Ordering::SeqCst) {
            return Err(StorageError::InvalidConfig("bucket down".to_string()));
        }
        Ok(Item {
            id: self.next.fetch_add(1, Ordering::SeqCst),
            made: Instant::now(),
        })
    }

    async fn discard(&self, item: Item) {
        self.discarded.lock().unwrap().push(item.id);
    }
}

fn settings(target_ready: usize, max_item_age: Duration) -> PoolSettings {
    PoolSettings {
        target_ready,
        load_concurrency: 2,
        max_item_age,
    }
}

const CREATE: Duration = Duration::from_millis(80);
const AGE: Duration = Duration::from_secs(60);

/// Lets spawned loads run and the paused clock move by `by`.
async fn run_for(by: Duration) {
    tokio::time::sleep(by).await;
}

#[tokio::test(start_paused = true)]
async fn test_pool_fills_to_target_and_takes_never_wait_while_a_spare_exists() {
    let pool = WriterPool::start(TestLoader::new(CREATE), settings(4, AGE));
    run_for(Duration::from_secs(1)).await;
    assert_eq!(pool.stats().ready, 4);
    for _ in 0..4 {
        let before = Instant::now();
        pool.take().await.unwrap();
        assert_eq!(
            Instant::now(),
            before,
            "a take with a spare ready must not wait"
        );
    }
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses), (4, 0));
}

#[tokio::test(start_paused = true)]
async fn test_pool_miss_loads_inline_and_refills_at_the_drain_rate() {
    let pool = WriterPool::start(TestLoader::new(CREATE), settings(2, AGE));
    run_for(Duration::from_secs(1)).await;
    for _ in 0..3 {
        pool.take().await.unwrap();
    }
    let stats = pool.stats();
    assert_eq!(
        (stats.hits, stats.misses),
        (2, 1),
        "the third take had no spare"
    );
    // Each take started a replacement; the pool is back at its target after one load time.
    run_for(Duration::from_secs(1)).await;
    assert_eq!(pool.stats().ready, 2);
    // Drained at one take per second for a minute: every take is a hit, nothing piles up.
    for _ in 0..50 {
        pool.take().await.unwrap();
        run_for(Duration::from_secs(1)).await;
        assert!(pool.stats().ready <= 2);
    }
    let stats = pool.stats();
    assert_eq!(stats.misses, 1);
    assert_eq!(stats.hits, 52);
    assert_eq!(
        stats.created,
        2 + 3 + 50,
        "one replacement per take, no extras"
    );
}

#[tokio::test(start_paused = true)]
async fn test_pool_idle_agent_stops_creating_after_max_item_age() {
    let loader = TestLoader::new(CREATE);
    let pool = WriterPool::start(loader, settings(4, AGE));
    // An hour with no take at all.
    run_for(Duration::from_secs(3600)).await;
    let stats = pool.stats();
    assert_eq!(
        stats.created, 4,
        "the start's fill only: no churn while idle"
    );
    assert_eq!(stats.discarded, 4, "every item expired unused");
    assert_eq!(stats.ready, 0);
    // The next take is a miss and starts the refill.
    pool.take().await.unwrap();
    run_for(Duration::from_secs(1)).await;
    let stats = pool.stats();
    assert_eq!((stats.misses, stats.ready), (1, 4));
    // Idle again: bounded by target_ready objects made after the last take.
    run_for(Duration::from_secs(3600)).await;
    let stats = pool.stats();
    assert_eq!(stats.created, 4 + 1 + 4);
    assert_eq!(stats.ready, 0);
}

#[tokio::test(start_paused = true)]
async fn test_pool_never_hands_out_an_item_older_than_max_item_age() {
    let age = Duration::from_secs(10);
    let pool = WriterPool::start(TestLoader::new(CREATE), settings(3, age));
    // Takes spaced so items sit close to (and past) their age.
    for step in 0..40u64 {
        run_for(Duration::from_millis(3_700 + step % 5 * 1_000)).await;
        let item = pool.take().await.unwrap();
        assert!(
            item.made.elapsed() < age,
            "item {} is {:?} old",
            item.id,
            item.made.elapsed()
        );
    }
    let stats = pool.stats();
    assert!(stats.discarded > 0, "some items expired: {stats:?}");
    let discarded = pool.loader().discarded.lock().unwrap().len() as u64;
    assert_eq!(
        discarded, stats.discarded,
        "every discard went through the loader"
    );
}

#[tokio::test(start_paused = true)]
async fn test_pool_failing_loads_back_off() {
    let loader = TestLoader::new(CREATE);
    loader.failing.store(true, Ordering::SeqCst);
    let pool = WriterPool::start(loader, settings(4, AGE));
    run_for(Duration::from_secs(50)).await;
    let errors = pool.stats().load_errors;
    // 0.1 + 0.2 + … doubling to 30 s: a handful of rounds of at most 2 loads, not a loop.
    assert!((2..=20).contains(&errors), "{errors} failed loads");
    pool.loader().failing.store(false, Ordering::SeqCst);
    // Still in use (a take within max_item_age): the pool refills once the backoff ends.
    pool.take().await.unwrap();
    run_for(Duration::from_secs(40)).await;
    assert_eq!(pool.stats().ready, 4, "recovers once the bucket is back");
}

#[tokio::test(start_paused = true)]
async fn test_pool_shutdown_discards_ready_items_and_stops_refilling() {
    let pool = WriterPool::start(TestLoader::new(CREATE), settings(3, AGE));
    run_for(Duration::from_secs(1)).await;
    pool.shutdown().await;
    run_for(Duration::from_secs(10)).await;
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.discarded, stats.created), (0, 3, 3));
}

#[test]
fn test_pool_settings_refuse_max_item_age_at_or_above_the_orphan_age() {
    let hour = Duration::from_secs(3600);
    let ok = PoolSettings::default();
    ok.validate(hour).unwrap();
    let too_old = PoolSettings {
        max_item_age: hour,
        ..ok
    };
    let err = too_old.validate(hour).unwrap_err().to_string();
    assert!(err.contains("gc.orphan_age"), "{err}");
    let no_loads = PoolSettings {
        load_concurrency: 0,
        ..ok
    };
    assert!(no_loads.validate(hour).is_err());
}
