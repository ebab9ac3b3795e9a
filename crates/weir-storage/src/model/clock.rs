//! How the model waits out a sampled latency.
//!
//! Tests and the simulator wait on `tokio::time`, whose paused clock makes them instant and
//! deterministic. A real agent on a modelled profile needs the opposite: waits that last what
//! the profile says. tokio's timer wheel ticks once a millisecond and rounds every deadline up
//! to a tick, so a 6 ms `tokio::time::sleep` takes 7.2 ms on average on this machine
//! (`cargo bench -p weir-storage --bench model_clock`): every modelled request would pay about a
//! millisecond its profile does not ask for, and every latency benchmark on a modelled profile
//! would carry that error. [`ModelClock::Wall`] waits on one timer thread that parks until the
//! earliest deadline (a futex timeout, tens of microseconds of slack) and completes each wait as
//! it falls due.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use futures::channel::oneshot;

/// Which clock a [`ModelStore`](super::ModelStore) waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelClock {
    /// `tokio::time`: pausable and deterministic, millisecond granularity (tests, simulator).
    #[default]
    Tokio,
    /// The wall clock, to well under a millisecond (a real agent on a modelled profile).
    Wall,
}

impl ModelClock {
    /// Waits `delay` on this clock.
    pub(super) async fn sleep(self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        match self {
            ModelClock::Tokio => tokio::time::sleep(delay).await,
            ModelClock::Wall => wall_sleep(delay).await,
        }
    }
}

/// A pending wall-clock wait: completed by the timer thread at `deadline`.
struct Wait {
    deadline: Instant,
    done: oneshot::Sender<()>,
}

// Ordered so that the max-heap's top is the earliest deadline.
impl Ord for Wait {
    fn cmp(&self, other: &Wait) -> Ordering {
        other.deadline.cmp(&self.deadline)
    }
}

impl PartialOrd for Wait {
    fn partial_cmp(&self, other: &Wait) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Wait {
    fn eq(&self, other: &Wait) -> bool {
        self.deadline == other.deadline
    }
}

impl Eq for Wait {}

static WAITS: Mutex<BinaryHeap<Wait>> = Mutex::new(BinaryHeap::new());
static TIMER: OnceLock<Thread> = OnceLock::new();

/// Waits until `delay` from now has passed on the wall clock.
async fn wall_sleep(delay: Duration) {
    let deadline = Instant::now() + delay;
    let (done, finished) = oneshot::channel();
    let earliest = {
        let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = waits.peek().is_none_or(|w| deadline < w.deadline);
        waits.push(Wait { deadline, done });
        earliest
    };
    let timer = TIMER.get_or_init(|| {
        std::thread::Builder::new()
            .name("weir-model-clock".to_string())
            .spawn(run_timer)
            .expect("spawning the model's timer thread")
            .thread()
            .clone()
    });
    if earliest {
        // The timer may be parked until a later deadline; an unpark before it parks is kept.
        timer.unpark();
    }
    // The sender is only dropped after sending, so this cannot fail; either way the wait is over.
    let _ = finished.await;
}

/// The timer thread: completes every due wait, then parks until the next deadline.
fn run_timer() {
    loop {
        let now = Instant::now();
        let next = {
            let mut waits = WAITS.lock().unwrap_or_else(|e| e.into_inner());
            while waits.peek().is_some_and(|w| w.deadline <= now) {
                let due = waits.pop().expect("peeked");
                // The waiting request may have been dropped; nothing to complete then.
                let _ = due.done.send(());
            }
            waits.peek().map(|w| w.deadline)
        };
        match next {
            Some(deadline) => std::thread::park_timeout(deadline.saturating_duration_since(now)),
            None => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn test_wall_waits_never_end_early_and_all_complete() {
        // Many overlapping waits, inserted out of deadline order: each lasts at least its delay
        // (a lower bound only: how much longer depends on the machine), and none is lost.
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let delay = Duration::from_micros((i * 7_919) % 5_000);
            tasks.push(tokio::spawn(async move {
                let start = Instant::now();
                ModelClock::Wall.sleep(delay).await;
                (delay, start.elapsed())
            }));
        }
        for task in tasks {
            let (delay, took) = task.await.unwrap();
            assert!(took >= delay, "waited {took:?} for {delay:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn test_an_earlier_deadline_wakes_a_timer_parked_on_a_later_one() {
        // The timer parks for the 60 s wait; the 1 ms wait behind it must still complete.
        let long = tokio::spawn(ModelClock::Wall.sleep(Duration::from_secs(60)));
        tokio::task::yield_now().await;
        ModelClock::Wall.sleep(Duration::from_millis(1)).await;
        assert!(!long.is_finished());
        long.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn test_the_tokio_clock_follows_a_paused_runtime() {
        let start = tokio::time::Instant::now();
        ModelClock::Tokio.sleep(Duration::from_secs(3_600)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3_600));
    }
}
