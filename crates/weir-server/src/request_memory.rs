//! The agent-wide budget for request bytes.
//!
//! Every request holds a charge from before its body is read until its response is built: its
//! frame size, and for requests other than Produce what decoding may cost on top. Three rules keep
//! a few bad connections from stalling everyone (BAD-1):
//!
//! * A request takes its whole charge at once. Nothing holds part of a charge while it waits for
//!   the rest, so two half-admitted requests can never wait for each other.
//! * Admission is not first come, first served: a request waits only until its own charge fits.
//!   A large request that does not fit does not hold up smaller ones queued behind it (a fair
//!   semaphore would let one waiting 100 MiB frame block every heartbeat).
//! * The only wait on a client while holding a charge is the body read, which has a deadline
//!   (`request_read_timeout`); the connection's reader enforces it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

#[derive(Debug)]
pub(crate) struct RequestMemory {
    capacity: usize,
    used: AtomicUsize,
    released: Notify,
}

impl RequestMemory {
    pub(crate) fn new(capacity: usize) -> Arc<RequestMemory> {
        Arc::new(RequestMemory {
            capacity: capacity.max(1),
            used: AtomicUsize::new(0),
            released: Notify::new(),
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes charged to requests right now; never above the capacity.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `bytes` (at most the whole capacity) if they are free now.
    pub(crate) fn try_take(self: &Arc<Self>, bytes: usize) -> Option<MemoryCharge> {
        let wanted = bytes.min(self.capacity);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + wanted <= self.capacity).then_some(used + wanted)
            })
            .ok()
            .map(|_| MemoryCharge {
                memory: self.clone(),
                bytes: wanted,
            })
    }

    /// Takes `bytes` (at most the whole capacity), waiting until they are free.
    pub(crate) async fn take(self: &Arc<Self>, bytes: usize) -> MemoryCharge {
        loop {
            // Registered before the attempt, so a release between the attempt and the wait is
            // not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(charge) = self.try_take(bytes) {
                return charge;
            }
            released.await;
        }
    }
}

/// Bytes taken from the [`RequestMemory`], returned when dropped.
#[derive(Debug)]
pub(crate) struct MemoryCharge {
    memory: Arc<RequestMemory>,
    bytes: usize,
}

impl MemoryCharge {
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        self.memory.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.memory.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn test_request_memory_large_waiter_does_not_block_small_ones() {
        let memory = RequestMemory::new(100);
        let held = memory.try_take(60).expect("fits");
        let large = tokio::spawn({
            let memory = memory.clone();
            async move { memory.take(80).await.bytes() }
        });
        tokio::task::yield_now().await;
        // A fair semaphore would queue this behind the waiting 80-byte request.
        let small = tokio::time::timeout(Duration::from_secs(1), memory.take(30))
            .await
            .expect("a small request is admitted while a large one waits");
        assert_eq!(memory.used(), 90);
        assert!(!large.is_finished());
        drop((held, small));
        assert_eq!(large.await.unwrap(), 80);
        assert_eq!(memory.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn test_request_memory_charge_is_capped_at_capacity() {
        let memory = RequestMemory::new(100);
        let charge = memory.take(10_000).await;
        assert_eq!(charge.bytes(), 100);
        assert!(memory.try_take(1).is_none());
        drop(charge);
        assert_eq!(memory.used(), 0);
        assert_eq!(memory.capacity(), 100);
    }

    #[test]
    fn test_request_memory_concurrent_takers_never_exceed_capacity() {
        let memory = RequestMemory::new(1_000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let memory = memory.clone();
                std::thread::spawn(move || {
                    for round in 0..5_000 {
                        if let Some(charge) = memory.try_take(1 + round % 400) {
                            assert!(memory.used() <= memory.capacity());
                            drop(charge);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(memory.used(), 0);
    }
}
