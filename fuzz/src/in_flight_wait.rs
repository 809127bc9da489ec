//! `in_flight_wait`: `InFlight` with waiters (`acquire`, feature `tokio`) against a model of
//! its queues: checks refused while a key has waiters, waiters served first come, first served
//! and only when their units are taken for them, a waiter that gives up passing its place or
//! its units on, and every count back to 0 and every key admitting again at the end.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use arbitrary::Arbitrary;
use tollgate::wait::WaitError;
use tollgate::{InFlight, InFlightPermit, LimitError};

#[derive(Debug, Arbitrary)]
pub struct WaitScenario {
    max: u8,
    ops: Vec<WaitOp>,
}

#[derive(Debug, Arbitrary)]
enum WaitOp {
    /// `try_acquire_n`.
    Try {
        key: u8,
        cost: u8,
    },
    /// `acquire_n` with a long wait, polled once.
    Wait {
        key: u8,
        cost: u8,
    },
    /// Polls a waiting `acquire` again.
    Poll {
        index: u8,
    },
    /// Drops a waiting `acquire` (a caller that gives up).
    GiveUp {
        index: u8,
    },
    /// Drops a permit.
    Release {
        index: u8,
    },
    EvictIdle,
}

/// What the model says of one key.
#[derive(Default)]
struct Key {
    held: u64,
    /// Waiters not served yet, in arrival order: (id, cost).
    queue: VecDeque<(usize, u64)>,
}

#[derive(Default)]
struct Model {
    max: u64,
    keys: HashMap<u8, Key>,
    /// Waiters the model has served (their units counted in `held`), by id.
    served: HashMap<usize, (u8, u64)>,
}

impl Model {
    /// The key's waiters take what is free, in turn.
    fn serve(&mut self, key: u8) {
        let k = self.keys.entry(key).or_default();
        while let Some(&(id, cost)) = k.queue.front() {
            if k.held + cost > self.max {
                break;
            }
            k.held += cost;
            k.queue.pop_front();
            self.served.insert(id, (key, cost));
        }
    }

    fn release(&mut self, key: u8, cost: u64) {
        self.keys.get_mut(&key).expect("a held key").held -= cost;
        self.serve(key);
    }
}

/// A waker that does nothing: the target polls every waiter itself.
struct Unwoken;

impl Wake for Unwoken {
    fn wake(self: Arc<Self>) {}
}

/// Every key, to lend a waiting `acquire` (it borrows its key until it ends).
static KEYS: [u8; 256] = {
    let mut keys = [0; 256];
    let mut i = 0;
    while i < 256 {
        keys[i] = i as u8;
        i += 1;
    }
    keys
};

type Waiting<'a> = Pin<Box<dyn Future<Output = Result<InFlightPermit<'a, u8>, WaitError>> + 'a>>;

pub fn in_flight_wait(scenario: &WaitScenario) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    // Entered, so that `acquire`'s timer can be made; paused, so that it never fires.
    let _entered = runtime.enter();
    let max = u64::from(scenario.max);
    let Ok(limit) = InFlight::<u8>::new(max) else {
        assert_eq!(max, 0, "only N = 0 is refused");
        return;
    };
    let mut model = Model {
        max,
        ..Model::default()
    };
    let waker = Waker::from(Arc::new(Unwoken));
    let mut cx = Context::from_waker(&waker);
    let mut permits: Vec<InFlightPermit<'_, u8>> = Vec::new();
    let mut waiting: Vec<(usize, u8, Waiting<'_>)> = Vec::new();
    let mut next_id = 0;
    for op in &scenario.ops {
        match *op {
            WaitOp::Try { key, cost } => {
                let cost = u64::from(cost);
                let k = model.keys.entry(key).or_default();
                let free = k.queue.is_empty() && k.held + cost <= max;
                match limit.try_acquire_n(&key, cost) {
                    Err(LimitError::CapacityExceeded { .. }) => assert!(cost > max),
                    Err(e) => panic!("unbounded: {e}"),
                    Ok(Some(permit)) => {
                        assert!(free, "key {key}: admitted past N or ahead of a waiter");
                        k.held += cost;
                        permits.push(permit);
                    }
                    Ok(None) => assert!(!free, "key {key}: refused with {cost} free"),
                }
            }
            WaitOp::Wait { key, cost } => {
                let cost = u64::from(cost);
                let mut future: Waiting<'_> = Box::pin(limit.acquire_n(
                    &KEYS[usize::from(key)],
                    cost,
                    Duration::from_secs(3600),
                ));
                let k = model.keys.entry(key).or_default();
                let free = k.queue.is_empty() && k.held + cost <= max;
                match future.as_mut().poll(&mut cx) {
                    Poll::Ready(Err(WaitError::Limit(LimitError::CapacityExceeded { .. }))) => {
                        assert!(cost > max)
                    }
                    Poll::Ready(Err(WaitError::TooLong { .. })) => {
                        panic!("key {key}: gave up within an hour")
                    }
                    Poll::Ready(Err(e)) => panic!("unbounded: {e}"),
                    Poll::Ready(Ok(permit)) => {
                        assert!(free, "key {key}: a waiter admitted past N or the queue");
                        k.held += cost;
                        permits.push(permit);
                    }
                    Poll::Pending => {
                        assert!(!free && cost <= max, "key {key}: waits with {cost} free");
                        k.queue.push_back((next_id, cost));
                        waiting.push((next_id, key, future));
                        next_id += 1;
                    }
                }
            }
            WaitOp::Poll { index } => {
                if waiting.is_empty() {
                    continue;
                }
                let i = usize::from(index) % waiting.len();
                let (id, key, future) = &mut waiting[i];
                let served = model.served.remove(id);
                match future.as_mut().poll(&mut cx) {
                    Poll::Ready(Ok(permit)) => {
                        let (k, cost) = served.expect("served only when the model serves it");
                        assert_eq!((k, cost), (*key, permit.cost()));
                        permits.push(permit);
                        drop(waiting.swap_remove(i));
                    }
                    Poll::Pending => assert!(served.is_none(), "key {key}: served, not ready"),
                    Poll::Ready(Err(e)) => panic!("key {key}: a waiter ended with {e}"),
                }
            }
            WaitOp::GiveUp { index } => {
                if waiting.is_empty() {
                    continue;
                }
                let (id, key, future) = waiting.swap_remove(usize::from(index) % waiting.len());
                drop(future);
                if let Some((key, cost)) = model.served.remove(&id) {
                    // Served, not yet taken: its units go back, to the next waiter.
                    model.release(key, cost);
                } else {
                    let k = model.keys.get_mut(&key).expect("a waiting key");
                    let was_head = k.queue.front().map(|w| w.0) == Some(id);
                    k.queue.retain(|w| w.0 != id);
                    if was_head {
                        model.serve(key);
                    }
                }
            }
            WaitOp::Release { index } => {
                if !permits.is_empty() {
                    let permit = permits.swap_remove(usize::from(index) % permits.len());
                    let (key, cost) = (*permit.key(), permit.cost());
                    drop(permit);
                    model.release(key, cost);
                }
            }
            WaitOp::EvictIdle => {
                limit.evict_idle();
            }
        }
        for (key, k) in &model.keys {
            assert_eq!(limit.in_flight(key), k.held, "key {key}");
        }
    }
    drop(waiting);
    drop(permits);
    for key in model.keys.keys() {
        assert_eq!(limit.in_flight(key), 0, "key {key}: a unit lost");
        assert!(
            limit.try_acquire_n(key, max).unwrap().is_some(),
            "key {key}: a mark left"
        );
    }
}
