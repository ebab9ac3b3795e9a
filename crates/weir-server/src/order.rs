//! Per-connection request order: every request takes effect, and is answered, in the order the
//! client sent it, as in Kafka (which handles one request per connection at a time).
//!
//! Weir keeps one exception, because it is where the throughput of a producer comes from
//! (Little's law): several Produce requests of a connection may be in flight at once. That is
//! safe because the produce pipeline commits a connection's produces in request order, and
//! because a request may start before earlier ones finish only when it can neither observe nor be
//! observed by them:
//!
//! | class | starts after | examples |
//! |---|---|---|
//! | [`Order::Produce`] | every earlier non-produce request has taken effect | Produce |
//! | [`Order::Independent`] | every earlier non-produce request has taken effect | Metadata, OffsetCommit, OffsetFetch, group membership, CreateTopics, configs |
//! | [`Order::Serial`] | every earlier request has taken effect | Fetch, ListOffsets, DeleteTopics, CreatePartitions, InitProducerId, anything unknown |
//!
//! Independent requests touch no record data or producer state, so produces in flight cannot
//! change what they see, and they cannot change what an in-flight produce does (it was validated
//! when it was read). A produce still waits for the non-produce requests before it: a produce
//! after CreateTopics or an AlterConfigs must see them. Responses always go out in request order
//! (the connection's writer awaits them in order, ORD-3).

use tokio::sync::watch;

/// How a request orders against the requests before it on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    Produce,
    Independent,
    Serial,
}

impl Order {
    /// The class of a request from its API key (unknown keys are serial: the safe default).
    pub(crate) fn of(api_key: i16) -> Order {
        match api_key {
            0 => Order::Produce,
            // Metadata, OffsetCommit, OffsetFetch, FindCoordinator, JoinGroup, Heartbeat,
            // LeaveGroup, SyncGroup, DescribeGroups, ListGroups, ApiVersions, CreateTopics,
            // DescribeConfigs, AlterConfigs, DeleteGroups, IncrementalAlterConfigs,
            // OffsetDelete, DescribeCluster.
            3 | 8..=16 | 18 | 19 | 32 | 33 | 42 | 44 | 47 | 60 => Order::Independent,
            _ => Order::Serial,
        }
    }
}

/// Signals that a request (and whatever it promised to wait for) has taken effect.
#[derive(Debug)]
pub(crate) struct Done(watch::Sender<bool>);

impl Done {
    pub(crate) fn signal(self) {
        let _ = self.0.send(true);
    }
}

/// Waits for a [`Done`]. A `Done` dropped without a signal (its task ended early) also releases
/// the waiters: the connection is closing then, and nothing it waits for will happen.
#[derive(Debug, Clone)]
pub(crate) struct Gate(watch::Receiver<bool>);

impl Gate {
    pub(crate) fn open() -> Gate {
        Gate(watch::channel(true).1)
    }

    pub(crate) fn pair() -> (Done, Gate) {
        let (sender, receiver) = watch::channel(false);
        (Done(sender), Gate(receiver))
    }

    pub(crate) async fn wait(mut self) {
        let _ = self.0.wait_for(|done| *done).await;
    }
}

/// The gates a connection's next request waits on.
#[derive(Debug)]
pub(crate) struct Sequencer {
    /// Opens when every non-produce request read so far has taken effect.
    nonproduce: Gate,
    /// Opens when every request read so far has taken effect.
    all: Gate,
}

/// What one request waits for and signals.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Wait before the request may start (none for Produce: the reader waits for it, so that
    /// produces enter the pipeline in request order).
    pub(crate) start_after: Option<Gate>,
    /// Signal once the request has taken effect (opens the non-produce gate).
    pub(crate) effect: Option<Done>,
    /// Everything before the request; `done` is signalled once this has opened too.
    pub(crate) before: Gate,
    pub(crate) done: Done,
}

impl Turn {
    /// Runs the request's work in its turn and signals what it has taken effect.
    pub(crate) async fn run<T>(self, work: impl std::future::Future<Output = T>) -> T {
        if let Some(gate) = self.start_after {
            gate.wait().await;
        }
        let output = work.await;
        if let Some(effect) = self.effect {
            effect.signal();
        }
        self.before.wait().await;
        self.done.signal();
        output
    }
}

impl Sequencer {
    pub(crate) fn new() -> Sequencer {
        Sequencer {
            nonproduce: Gate::open(),
            all: Gate::open(),
        }
    }

    /// What the reader must wait for before it dispatches a request of class `order`.
    pub(crate) fn before_dispatch(&self, order: Order) -> Option<Gate> {
        (order == Order::Produce).then(|| self.nonproduce.clone())
    }

    /// Places the next request and returns its turn.
    pub(crate) fn next(&mut self, order: Order) -> Turn {
        let (done, all_after) = Gate::pair();
        let before = std::mem::replace(&mut self.all, all_after.clone());
        match order {
            Order::Produce => Turn {
                start_after: None,
                effect: None,
                before,
                done,
            },
            Order::Independent => {
                let (effect, nonproduce_after) = Gate::pair();
                let start_after = std::mem::replace(&mut self.nonproduce, nonproduce_after);
                Turn {
                    start_after: Some(start_after),
                    effect: Some(effect),
                    before,
                    done,
                }
            }
            Order::Serial => {
                // Starts after everything, so once it is done everything before it is too.
                self.nonproduce = all_after;
                Turn {
                    start_after: Some(before.clone()),
                    effect: None,
                    before,
                    done,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::oneshot;

    use super::*;

    /// Dispatches `classes` in order; each request's work waits for its release and then
    /// records that it finished. Returns the finish order after releasing `release_order`.
    async fn finish_order(classes: &[Order], release_order: &[usize]) -> Vec<usize> {
        let finished = Arc::new(Mutex::new(Vec::new()));
        let mut sequencer = Sequencer::new();
        let mut releases = Vec::new();
        let mut tasks = Vec::new();
        for (index, order) in classes.iter().copied().enumerate() {
            let turn = sequencer.next(order);
            let (release, released) = oneshot::channel::<()>();
            releases.push(Some(release));
            let finished = finished.clone();
            tasks.push(tokio::spawn(turn.run(async move {
                let _ = released.await;
                finished.lock().unwrap().push(index);
            })));
        }
        for index in release_order {
            if let Some(release) = releases[*index].take() {
                let _ = release.send(());
            }
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let log = finished.lock().unwrap().clone();
        log
    }

    #[tokio::test]
    async fn test_order_independent_requests_take_effect_in_request_order() {
        let classes = [Order::Independent, Order::Independent, Order::Independent];
        // Released last-first: each still waits for the one before it.
        assert_eq!(finish_order(&classes, &[2, 1, 0]).await, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn test_order_independent_request_does_not_wait_for_produce() {
        // An OffsetFetch behind a produce in flight finishes before the produce does.
        let classes = [Order::Produce, Order::Independent];
        assert_eq!(finish_order(&classes, &[1, 0]).await, vec![1, 0]);
    }

    #[tokio::test]
    async fn test_order_serial_request_waits_for_everything_before_it() {
        let classes = [Order::Produce, Order::Independent, Order::Serial];
        assert_eq!(finish_order(&classes, &[2, 1, 0]).await, vec![1, 0, 2]);
    }

    #[tokio::test]
    async fn test_order_serial_request_waits_for_produce_and_earlier_requests() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let mut sequencer = Sequencer::new();
        let produce = sequencer.next(Order::Produce);
        let fetch = sequencer.next(Order::Serial);
        let (release, released) = oneshot::channel::<()>();
        let log = started.clone();
        let produce_task = tokio::spawn(produce.run(async move {
            let _ = released.await;
            log.lock().unwrap().push("produce");
        }));
        let log = started.clone();
        let fetch_task = tokio::spawn(fetch.run(async move {
            log.lock().unwrap().push("fetch");
        }));
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(
            started.lock().unwrap().is_empty(),
            "fetch ran before the produce finished"
        );
        release.send(()).unwrap();
        produce_task.await.unwrap();
        fetch_task.await.unwrap();
        assert_eq!(*started.lock().unwrap(), vec!["produce", "fetch"]);
    }

    #[tokio::test]
    async fn test_order_produce_waits_for_earlier_nonproduce_but_not_earlier_produce() {
        let mut sequencer = Sequencer::new();
        let first_produce = sequencer.next(Order::Produce);
        assert!(sequencer.before_dispatch(Order::Produce).is_some());
        let create = sequencer.next(Order::Independent);
        let gate = sequencer.before_dispatch(Order::Produce).unwrap();
        let waiting = tokio::spawn(gate.wait());
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(
            !waiting.is_finished(),
            "produce dispatched before CreateTopics took effect"
        );
        // CreateTopics takes effect while the first produce is still in flight: the next
        // produce may now be dispatched (produces pipeline).
        let (release, released) = oneshot::channel::<()>();
        let produce_task = tokio::spawn(first_produce.run(async move {
            let _ = released.await;
        }));
        // Its answer still waits for the produce before it (responses go out in order).
        let create_task = tokio::spawn(create.run(async {}));
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("gate opened without waiting for the earlier produce")
            .unwrap();
        assert!(!create_task.is_finished());
        release.send(()).unwrap();
        produce_task.await.unwrap();
        create_task.await.unwrap();
    }

    #[test]
    fn test_order_classes_of_api_keys() {
        assert_eq!(Order::of(0), Order::Produce);
        for key in [3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 32, 47] {
            assert_eq!(Order::of(key), Order::Independent, "api key {key}");
        }
        for key in [1, 2, 20, 21, 22, 23, 37, 999, -1] {
            assert_eq!(Order::of(key), Order::Serial, "api key {key}");
        }
    }
}
