//! The agent-wide budget for fetch response bytes.
//!
//! A fetch response is built in memory (the records, as copies or as slices of the buffers they
//! were read into, then the encoded frame) and stays there until the client has read it off the
//! socket; a client that never reads pins it, and the buffers its slices point into, for as long
//! as the connection lives. Without a global bound, every connection could pin a
//! `max_fetch_bytes` response. With it, the bytes of all responses in flight stay below the
//! capacity plus one first batch (twice its size) per fetch in flight, and a connection has at
//! most one fetch in flight.
//!
//! A fetch never waits for the budget: it takes what is free, up to what it wants, and reads
//! fewer bytes when little is free. Only its first batch is taken even when nothing is free, so a
//! consumer makes progress (KIP-74) while clients that do not read hold the rest. Those
//! first batches are bounded too, agent-wide: together they may exceed the capacity by at most
//! half of it, or by one first batch when no other is over the capacity; a fetch whose first
//! batch does not fit reads nothing this time (it long-polls and tries again).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct ResponseBudget {
    capacity: usize,
    used: AtomicUsize,
}

impl ResponseBudget {
    pub(crate) fn new(capacity: usize) -> Arc<ResponseBudget> {
        Arc::new(ResponseBudget {
            capacity,
            used: AtomicUsize::new(0),
        })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by grants right now; above the capacity only by first batches.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `wanted` bytes, or what is free if that is less (possibly nothing). Never waits.
    pub(crate) fn take_up_to(self: &Arc<Self>, wanted: usize) -> Grant {
        let mut taken = 0;
        // The closure always returns Some, so the update cannot fail.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                taken = wanted.min(self.capacity.saturating_sub(used));
                Some(used + taken)
            });
        Grant {
            budget: self.clone(),
            bytes: taken,
        }
    }
}

/// Bytes taken from a [`ResponseBudget`], returned when the grant is dropped.
#[derive(Debug)]
pub(crate) struct Grant {
    budget: Arc<ResponseBudget>,
    bytes: usize,
}

impl Grant {
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds exactly `bytes` if the budget allows a fetch's first batch that much: returns what
    /// it held beyond that, or takes the difference past the capacity while the over-capacity
    /// total stays within half the capacity (or while nothing else is over it). `false`, and
    /// nothing changed, when it does not fit.
    pub(crate) fn try_resize_first_batch(&mut self, bytes: usize) -> bool {
        if bytes <= self.bytes {
            self.resize(bytes);
            return true;
        }
        let extra = bytes - self.bytes;
        let capacity = self.budget.capacity;
        let overdraft = capacity / 2;
        let grown = self
            .budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let fits = used + extra <= capacity + overdraft || used <= capacity;
                fits.then_some(used + extra)
            });
        if grown.is_ok() {
            self.bytes = bytes;
        }
        grown.is_ok()
    }

    /// Holds exactly `bytes`: returns what it held beyond that, or takes the difference whether
    /// or not the budget has room for it.
    pub(crate) fn resize(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.budget
                .used
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn test_budget_grants_what_is_free_and_never_more() {
        let budget = ResponseBudget::new(100);
        let a = budget.take_up_to(60);
        assert_eq!(a.bytes(), 60);
        let b = budget.take_up_to(60);
        assert_eq!(b.bytes(), 40, "only what is free");
        let c = budget.take_up_to(10);
        assert_eq!(c.bytes(), 0, "nothing is free");
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        assert_eq!(budget.take_up_to(usize::MAX).bytes(), 60);
        assert_eq!(budget.used(), 40, "the temporary grant was returned");
        drop((b, c));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn test_grant_resize_grows_past_capacity_and_shrinks() {
        let budget = ResponseBudget::new(100);
        let full = budget.take_up_to(100);
        let mut first_batch = budget.take_up_to(30);
        assert_eq!(first_batch.bytes(), 0);
        first_batch.resize(30);
        assert_eq!(budget.used(), 130, "a first batch is taken without room");
        first_batch.resize(10);
        assert_eq!(budget.used(), 110);
        drop(full);
        assert_eq!(budget.take_up_to(200).bytes(), 90);
        drop(first_batch);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn test_first_batches_over_capacity_are_bounded_agent_wide() {
        let budget = ResponseBudget::new(100);
        let full = budget.take_up_to(100);
        // Nothing over the capacity yet: one first batch fits whatever its size.
        let mut big = budget.take_up_to(0);
        assert!(big.try_resize_first_batch(80));
        assert_eq!(budget.used(), 180);
        // Now over the capacity by 80 > 50: another first batch waits its turn.
        let mut second = budget.take_up_to(0);
        assert!(!second.try_resize_first_batch(10));
        assert_eq!((second.bytes(), budget.used()), (0, 180));
        drop(big);
        // Over by nothing: small first batches fit up to half the capacity over it.
        assert!(second.try_resize_first_batch(30));
        let mut third = budget.take_up_to(0);
        assert!(third.try_resize_first_batch(20));
        let mut fourth = budget.take_up_to(0);
        assert!(!fourth.try_resize_first_batch(1), "150 is the limit");
        assert!(third.try_resize_first_batch(5), "shrinking always works");
        assert_eq!(budget.used(), 135);
        drop((full, second, third, fourth));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn test_held_grant_lives_as_long_as_the_frame() {
        let budget = ResponseBudget::new(1000);
        let grant = budget.take_up_to(500);
        let mut frame = weir_protocol::response::Frame::from(Bytes::from(vec![7u8; 500]));
        frame.hold(grant);
        bytes::Buf::advance(&mut frame, 500);
        assert_eq!(
            budget.used(),
            500,
            "a frame written out still holds it until dropped"
        );
        drop(frame);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn test_concurrent_takers_never_exceed_capacity() {
        let budget = ResponseBudget::new(10_000);
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for round in 0..2_000 {
                        held.push(budget.take_up_to(37 + round % 500));
                        assert!(budget.used() <= budget.capacity());
                        if held.len() > 20 {
                            held.remove(0);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(budget.used(), 0);
    }
}
