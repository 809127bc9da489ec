//! `InFlight`, the library's own: `try_acquire`, a permit's drop (the release, which serves the
//! key's waiters), `acquire_n`'s queueing and its waiter future (polled, or dropped to give up),
//! the heal of a mark no waiter is behind, idle eviction, and the count keys over `max_keys`
//! share (`OverflowPolicy::Shared`).
//!
//! Its keys are [`Key`]s, whose copies are counted: the limit clones a key for each permit, each
//! waiter and the table, and every copy is dropped once the limit is. In every execution at most
//! `N` units are held at once, no release is lost (`in_flight` returns to 0, and a later
//! `try_acquire` is admitted), and a waiter is served once a release frees its unit (the model
//! blocks on the waiter: loom fails an execution where nothing wakes it).
//!
//! A key whose `Hash`, `Clone` or `Drop` panics is not modelled: the waiter queue runs them
//! under its lock, which loom's mutex poisons (see the README's "What the models do not cover").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use tollgate_loom_tests::in_flight::{acquire_n, leave_mark, Acquired, InFlight};
use tollgate_loom_tests::store::OverflowPolicy;
use tollgate_loom_tests::WaitError;

use crate::{explore, explore_reaching, Copies, Counted};

/// A key with drop glue whose copies are counted (made by the model or cloned by the limit,
/// less those dropped).
type Key = Counted<u64>;

/// Holders of one count, asserting it never has more than `N = 1`.
#[derive(Clone)]
struct Holders(Arc<AtomicUsize>);

impl Holders {
    fn new(now: usize) -> Holders {
        Holders(Arc::new(AtomicUsize::new(now)))
    }

    fn hold(&self) {
        // SeqCst: the models' own bookkeeping, ordered with everything else.
        let before = self.0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders of a unit when N = 1");
    }

    fn leave(&self) {
        // SeqCst: as in `hold`.
        self.0.fetch_sub(1, Ordering::SeqCst);
    }

    /// Tries for a unit of `key` once: taken, it is held a moment and given back. Whether it
    /// was taken.
    fn try_once(&self, limit: &InFlight<Key>, key: &Key) -> bool {
        let Some(permit) = limit.try_acquire(key).unwrap() else {
            return false;
        };
        self.hold();
        self.leave();
        drop(permit);
        true
    }
}

/// Polls `future` until it is ready, parking the loom thread while it is pending and woken by
/// the waker it registered: loom fails an execution in which nothing wakes it (a deadlock).
fn block_on<F: Future + Unpin>(mut future: F) -> F::Output {
    struct Unpark(thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = Pin::new(&mut future).poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

/// The unit is free again and nothing is left of the model: a `try_acquire` admits (no unit
/// lost, no mark left), and once the limit is dropped, every key copy is.
fn assert_free_then_drop(limit: std::sync::Arc<InFlight<Key>>, key: Key, keys: &Copies) {
    assert_eq!(limit.in_flight(&key), 0, "a release lost");
    let permit = limit.try_acquire(&key).unwrap();
    assert!(permit.is_some(), "nothing held and no mark left");
    drop(permit);
    assert_eq!(limit.in_flight(&key), 0);
    drop((limit, key));
    keys.assert_all_dropped();
}

/// Two threads `try_acquire` a unit of one key (`N = 1`) and drop the permit; a third evicts
/// idle keys meanwhile. At most one holder at a time (a key evicted while held would let a
/// second in), the first to come is admitted, and no release is lost.
#[test]
fn in_flight_acquire_release_and_evict_race() {
    explore("in_flight_acquire_release_and_evict_race", || {
        let keys = Copies::new();
        let limit = std::sync::Arc::new(InFlight::new(1).unwrap());
        let holders = Holders::new(0);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (limit, holders, key) = (limit.clone(), holders.clone(), keys.key(1));
                thread::spawn(move || holders.try_once(&limit, &key))
            })
            .collect();
        let sweeper = {
            let limit = limit.clone();
            thread::spawn(move || limit.evict_idle())
        };
        let admitted: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        sweeper.join().unwrap();
        assert!(admitted.contains(&true), "the first to come is admitted");
        assert_free_then_drop(limit, keys.key(1), &keys);
    });
}

/// A release of the one unit (`N = 1`) races a waiter that tries, then queues through
/// `acquire_n`, and a newcomer that tries meanwhile. Whatever the interleaving, the waiter ends
/// with the unit (taken after the release, reserved on queueing, or served by the release: the
/// release's write of the word and the waiter's count are never both missed). At most one
/// holder at a time; afterwards the key holds exactly the waiter's unit, then nothing and no
/// mark.
#[test]
fn a_release_and_a_waiter_never_miss_each_other() {
    explore_reaching(
        "in_flight: release vs waiter vs newcomer",
        &[
            "taken after the release",
            "reserved on queueing",
            "served by a release",
        ],
        |seen| {
            let keys = Copies::new();
            let limit = std::sync::Arc::new(InFlight::new(1).unwrap());
            let held = limit.try_acquire_owned(&keys.key(1)).unwrap();
            let held = held.expect("the unit the release gives back");
            let holders = Holders::new(1);
            let releaser = {
                let holders = holders.clone();
                thread::spawn(move || {
                    holders.leave();
                    drop(held);
                })
            };
            let newcomer = {
                let (limit, holders, key) = (limit.clone(), holders.clone(), keys.key(1));
                thread::spawn(move || {
                    holders.try_once(&limit, &key);
                })
            };
            let key = keys.key(1);
            let (how, permit) = match limit.try_acquire(&key).unwrap() {
                Some(permit) => ("taken after the release", permit),
                None => match acquire_n(&limit, &key, 1).unwrap() {
                    Acquired::Now(permit) => ("reserved on queueing", permit),
                    Acquired::Queued(waiter) => (
                        "served by a release",
                        block_on(waiter).expect("served with the unit"),
                    ),
                },
            };
            holders.hold();
            releaser.join().unwrap();
            newcomer.join().unwrap();
            seen.saw(how);
            assert_eq!(limit.in_flight(&key), 1, "the waiter's unit, and only it");
            holders.leave();
            drop(permit);
            assert_free_then_drop(limit, key, &keys);
        },
    );
}

/// The same race on a key whose mark a panic left behind (a reservation marked the key, then
/// its waiter's key panicked before it was queued): the waiter's `acquire_n` is refused by the
/// mark, heals it (no waiter behind it) or finds the unit still held and queues (its refused
/// reservation finds the mark already set, and must still write the word for the release to
/// see its count). It ends with the unit either way, and no mark is left.
#[test]
fn a_release_and_a_waiter_on_a_left_mark_never_miss_each_other() {
    explore_reaching(
        "in_flight: release vs waiter, mark left",
        &["taken at once", "served by a release"],
        |seen| {
            let keys = Copies::new();
            let limit = std::sync::Arc::new(InFlight::new(1).unwrap());
            let key = keys.key(1);
            let held = limit.try_acquire_owned(&key).unwrap().expect("free");
            leave_mark(&limit, &key);
            let releaser = thread::spawn(move || drop(held));
            let (how, permit) = match acquire_n(&limit, &key, 1).unwrap() {
                Acquired::Now(permit) => ("taken at once", permit),
                Acquired::Queued(waiter) => (
                    "served by a release",
                    block_on(waiter).expect("served with the unit"),
                ),
            };
            releaser.join().unwrap();
            seen.saw(how);
            assert_eq!(limit.in_flight(&key), 1, "the waiter's unit, and only it");
            drop(permit);
            assert_free_then_drop(limit, key, &keys);
        },
    );
}

/// Two waiters queued on a held unit; a release races the first giving up (its waiter future
/// dropped: it leaves the queue, or hands back the unit it was served). The unit goes to the
/// waiter behind it; none is lost or doubled.
#[test]
fn a_waiter_giving_up_races_the_release_that_serves_it() {
    explore_reaching(
        "in_flight: cancel vs serve",
        &["gave up while pending", "served before giving up"],
        |seen| {
            let keys = Copies::new();
            let limit = std::sync::Arc::new(InFlight::new(1).unwrap());
            let key = keys.key(1);
            let held = limit.try_acquire_owned(&key).unwrap().expect("free");
            let Acquired::Queued(mut first) = acquire_n(&limit, &key, 1).unwrap() else {
                panic!("the unit is held")
            };
            let Acquired::Queued(second) = acquire_n(&limit, &key, 1).unwrap() else {
                panic!("behind the first")
            };
            let releaser = thread::spawn(move || drop(held));
            // One look, then the first gives up: a release may serve it before the look,
            // between the look and the drop (the drop hands the unit back), or not at all.
            let mut cx = Context::from_waker(Waker::noop());
            let how = match Pin::new(&mut first).poll(&mut cx) {
                Poll::Ready(permit) => {
                    drop(permit.expect("served with the unit"));
                    "served before giving up"
                }
                Poll::Pending => "gave up while pending",
            };
            drop(first);
            let permit = block_on(second).expect("the waiter behind is served");
            releaser.join().unwrap();
            seen.saw(how);
            assert_eq!(
                limit.in_flight(&key),
                1,
                "the second waiter's unit, and only it"
            );
            drop(permit);
            assert_free_then_drop(limit, key, &keys);
        },
    );
}

/// Keys over `max_keys` share one count (`OverflowPolicy::Shared`, `max_keys = 1`, `N = 1`):
/// with key 1 holding the table's place, key 2's `try_acquire` races key 3's `acquire_n`,
/// which answers at once (nobody waits on the shared count). At most one of them holds the
/// shared unit; both give it back to the shared count. Afterwards the shared count is free,
/// and a permit taken on it goes back to it even once its key has a place of its own.
#[test]
fn keys_over_max_keys_share_one_count_and_never_wait() {
    explore_reaching(
        "in_flight: keys over max_keys",
        &["key 2 held the shared unit", "key 3 held the shared unit"],
        |seen| {
            let keys = Copies::new();
            let limit =
                std::sync::Arc::new(InFlight::with_max_keys(1, 1, OverflowPolicy::Shared).unwrap());
            let first = limit.try_acquire(&keys.key(1)).unwrap().expect("a place");
            let shared = Holders::new(0);
            let two = {
                let (limit, shared, key) = (limit.clone(), shared.clone(), keys.key(2));
                thread::spawn(move || shared.try_once(&limit, &key))
            };
            let key = keys.key(3);
            let three = match acquire_n(&limit, &key, 1) {
                Ok(Acquired::Now(permit)) => {
                    shared.hold();
                    shared.leave();
                    drop(permit);
                    true
                }
                Ok(Acquired::Queued(_)) => panic!("a key over max_keys never waits"),
                Err(WaitError::TooLong { .. }) => false,
                Err(e) => panic!("{e}"),
            };
            let two = two.join().unwrap();
            assert!(two || three, "the first to come is admitted");
            if two {
                seen.saw("key 2 held the shared unit");
            }
            if three {
                seen.saw("key 3 held the shared unit");
            }
            // The shared unit is free: key 3 takes it; then key 1's place is freed and key 2
            // takes it. Key 3's permit goes back to the shared count, not to key 2's place.
            let on_shared = limit.try_acquire(&key).unwrap().expect("the shared unit");
            assert_eq!(limit.in_flight(&key), 0, "key 3 has no place of its own");
            drop(first);
            let two = keys.key(2);
            let own = limit
                .try_acquire(&two)
                .unwrap()
                .expect("key 1's place, freed");
            assert_eq!(limit.in_flight(&two), 1);
            drop(on_shared);
            assert_eq!(
                limit.in_flight(&two),
                1,
                "key 3's release went to key 2's place"
            );
            assert!(
                limit.try_acquire(&key).unwrap().is_some(),
                "the shared unit"
            );
            drop(own);
            drop(key);
            assert_free_then_drop(limit, two, &keys);
        },
    );
}
