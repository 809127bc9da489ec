//! `InFlight::acquire` (feature `tokio`): waiters served first come, first served, none woken
//! to find nothing, no newcomer taking a waiter's units, and nothing lost when a waiter gives
//! up, times out or panics on its way into the queue.
//!
//! Run with `cargo test --features tokio --test in_flight_wait`.

#![cfg(feature = "tokio")]

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tollgate::wait::WaitError;
use tollgate::{InFlight, LimitError, OverflowPolicy};

const LONG: Duration = Duration::from_secs(3600);

/// A waker that counts its wakes: a waiter must be woken once, when served, and not before.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Wakes {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn counting() -> (Arc<Wakes>, Waker) {
    let wakes = Arc::new(Wakes::default());
    (Arc::clone(&wakes), Waker::from(wakes))
}

/// Polls a future once with `waker`.
fn poll_once<F: Future>(future: std::pin::Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order_and_woken_only_when_served() {
    let limit = InFlight::<String>::new(1).unwrap();
    let first = limit.try_acquire("k").unwrap().unwrap();
    let (wakes_a, waker_a) = counting();
    let (wakes_b, waker_b) = counting();
    let mut a = pin!(limit.acquire("k", LONG));
    let mut b = pin!(limit.acquire("k", LONG));
    assert!(poll_once(a.as_mut(), &waker_a).is_pending());
    assert!(poll_once(b.as_mut(), &waker_b).is_pending());

    // A newcomer does not take the place the waiters are owed, with or without waiting.
    assert!(limit.try_acquire("k").unwrap().is_none());
    drop(first);
    assert!(limit.try_acquire("k").unwrap().is_none(), "the unit is a's");
    assert_eq!(limit.in_flight("k"), 1, "held for a, not free");
    assert_eq!((wakes_a.count(), wakes_b.count()), (1, 0));
    let Poll::Ready(Ok(permit_a)) = poll_once(a.as_mut(), &waker_a) else {
        panic!("a was woken with its unit")
    };
    assert!(poll_once(b.as_mut(), &waker_b).is_pending());

    drop(permit_a);
    assert_eq!(wakes_b.count(), 1);
    let Poll::Ready(Ok(permit_b)) = poll_once(b.as_mut(), &waker_b) else {
        panic!("b was woken with its unit")
    };
    drop(permit_b);
    assert_eq!(limit.in_flight("k"), 0);
    assert!(
        limit.try_acquire("k").unwrap().is_some(),
        "no mark left once the queue is empty"
    );
    assert_eq!(
        limit.evict_idle(),
        1,
        "a key with nothing held and no waiter is idle"
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_waiter_at_the_head_holds_back_the_small_ones_behind_it() {
    let limit = InFlight::<u64>::new(4).unwrap();
    let held = limit.try_acquire_n(&1, 3).unwrap().unwrap();
    let (wakes_big, waker_big) = counting();
    let (wakes_small, waker_small) = counting();
    let mut big = pin!(limit.acquire_n(&1, 3, LONG));
    let mut small = pin!(limit.acquire_n(&1, 1, LONG));
    assert!(poll_once(big.as_mut(), &waker_big).is_pending());
    // One unit is free, but the waiter ahead needs three: first come, first served.
    assert!(poll_once(small.as_mut(), &waker_small).is_pending());
    assert!(limit.try_acquire(&1).unwrap().is_none());
    drop(held);
    assert_eq!(wakes_big.count(), 1);
    assert_eq!(wakes_small.count(), 1, "3 + 1 fit in 4 once released");
    let Poll::Ready(Ok(big_permit)) = poll_once(big.as_mut(), &waker_big) else {
        panic!("big served")
    };
    let Poll::Ready(Ok(small_permit)) = poll_once(small.as_mut(), &waker_small) else {
        panic!("small served")
    };
    assert_eq!(
        (big_permit.cost(), small_permit.cost(), limit.in_flight(&1)),
        (3, 1, 4)
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_times_out_gives_its_place_to_the_next() {
    let limit = InFlight::<u64>::new(1).unwrap();
    let held = limit.try_acquire(&5).unwrap().unwrap();
    let (gave_up, served, ()) = tokio::join!(
        limit.acquire(&5, Duration::from_millis(10)),
        limit.acquire(&5, Duration::from_millis(100)),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(held);
        }
    );
    assert_eq!(
        gave_up.unwrap_err(),
        WaitError::TooLong {
            wait: Duration::from_millis(10),
            max_wait: Duration::from_millis(10)
        },
        "nothing ended within 10 ms"
    );
    let permit = served.expect("served at 50 ms, within its 100 ms");
    drop(permit);
    assert_eq!(limit.in_flight(&5), 0);
    assert!(limit.try_acquire(&5).unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_served_then_dropped_unpolled_hands_its_units_on() {
    let limit = InFlight::<u64>::new(1).unwrap();
    let held = limit.try_acquire(&2).unwrap().unwrap();
    let (_, waker_a) = counting();
    let (wakes_b, waker_b) = counting();
    let mut a = Box::pin(limit.acquire(&2, LONG));
    let mut b = pin!(limit.acquire(&2, LONG));
    assert!(poll_once(a.as_mut(), &waker_a).is_pending());
    assert!(poll_once(b.as_mut(), &waker_b).is_pending());
    drop(held); // a is served ...
    assert_eq!(limit.in_flight(&2), 1);
    drop(a); // ... and gives up before it looks: its unit goes to b.
    assert_eq!(wakes_b.count(), 1);
    let Poll::Ready(Ok(permit)) = poll_once(b.as_mut(), &waker_b) else {
        panic!("b served with a's unit")
    };
    assert_eq!(limit.in_flight(&2), 1);
    drop(permit);
    assert_eq!(limit.in_flight(&2), 0);

    // A head that gives up unserved lets the one behind it try at once.
    let held = limit.try_acquire(&3).unwrap().unwrap();
    let mut head = Box::pin(limit.acquire(&3, LONG));
    let mut next = pin!(limit.acquire(&3, LONG));
    assert!(poll_once(head.as_mut(), &waker_a).is_pending());
    assert!(poll_once(next.as_mut(), &waker_b).is_pending());
    drop(head);
    assert!(
        poll_once(next.as_mut(), &waker_b).is_pending(),
        "the unit is still held"
    );
    drop(held);
    assert!(matches!(
        poll_once(next.as_mut(), &waker_b),
        Poll::Ready(Ok(_))
    ));
}

/// An owned permit waits as a borrowed one does, and moves into a spawned task, which gives
/// its units back when it ends.
#[tokio::test(start_paused = true)]
async fn an_owned_waiter_is_served_and_its_task_gives_the_units_back() {
    let limit = Arc::new(InFlight::<u64>::new(3).unwrap());
    let held = limit.try_acquire_n(&4, 3).unwrap().unwrap();
    let one = tokio::spawn({
        let limit = Arc::clone(&limit);
        async move {
            let permit = limit.acquire_owned(&4, LONG).await.unwrap();
            assert_eq!(permit.cost(), 1);
        }
    });
    let two = tokio::spawn({
        let limit = Arc::clone(&limit);
        async move { limit.acquire_n_owned(&4, 2, LONG).await.unwrap() }
    });
    tokio::task::yield_now().await;
    drop(held);
    one.await.unwrap();
    let permit = two.await.unwrap();
    assert_eq!((permit.cost(), limit.in_flight(&4)), (2, 2));
    drop(permit);
    assert_eq!(limit.in_flight(&4), 0);
}

/// A waiter polled again with another waker is woken through the latest one; a head that
/// gives up with units free lets the waiters behind it take them at once.
#[tokio::test(start_paused = true)]
async fn the_latest_waker_is_woken_and_a_head_giving_up_serves_the_rest() {
    let limit = InFlight::<u64>::new(4).unwrap();
    let held = limit.try_acquire_n(&1, 3).unwrap().unwrap();
    let (wakes_old, waker_old) = counting();
    let (wakes_new, waker_new) = counting();
    let mut head = Box::pin(limit.acquire_n(&1, 3, LONG));
    let mut next = pin!(limit.acquire_n(&1, 1, LONG));
    assert!(poll_once(head.as_mut(), &waker_old).is_pending());
    assert!(poll_once(next.as_mut(), &waker_old).is_pending());
    assert!(poll_once(next.as_mut(), &waker_new).is_pending(), "moved");

    // The unit free is the head's turn; it gives up: the next takes it.
    drop(head);
    assert_eq!((wakes_old.count(), wakes_new.count()), (0, 1));
    let Poll::Ready(Ok(permit)) = poll_once(next.as_mut(), &waker_new) else {
        panic!("next served when the head gave up")
    };
    assert_eq!(limit.in_flight(&1), 4);
    drop((permit, held));
    assert_eq!(limit.in_flight(&1), 0);
}

#[tokio::test(start_paused = true)]
async fn errors_and_keys_without_a_place_of_their_own_answer_at_once() {
    let limit = InFlight::<u64>::new(2).unwrap();
    assert!(matches!(
        limit.acquire_n(&1, 3, LONG).await,
        Err(WaitError::Limit(LimitError::CapacityExceeded {
            cost: 3,
            capacity: 2
        }))
    ));
    let _held = limit.try_acquire_n(&1, 2).unwrap().unwrap();
    assert!(
        matches!(
            limit.acquire(&1, Duration::ZERO).await,
            Err(WaitError::TooLong { .. })
        ),
        "no wait asked"
    );

    let deny = InFlight::<u64>::with_max_keys(1, 1, OverflowPolicy::Deny).unwrap();
    let _one = deny.try_acquire(&1).unwrap().unwrap();
    assert!(matches!(
        deny.acquire(&2, LONG).await,
        Err(WaitError::Limit(LimitError::KeyTableFull { .. }))
    ));

    // Keys over `max_keys` share one count, which no release of theirs serves: they do not
    // wait, and the shared count is left unmarked (checks of it go on).
    let shared = InFlight::<u64>::with_max_keys(1, 1, OverflowPolicy::Shared).unwrap();
    let _own = shared.try_acquire(&1).unwrap().unwrap();
    let overflowed = shared.try_acquire(&2).unwrap().expect("the shared count");
    let start = tokio::time::Instant::now();
    assert_eq!(
        shared.acquire(&3, LONG).await.unwrap_err(),
        WaitError::TooLong {
            wait: LONG,
            max_wait: LONG
        }
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop(overflowed);
    assert!(shared.try_acquire(&3).unwrap().is_some());
}

/// A key whose `Clone` or `Hash` panics on a chosen call (counted over the key and its
/// copies).
#[derive(Debug)]
struct Fragile {
    id: u64,
    calls: Arc<[AtomicU64; 2]>,
    panic_at: [u64; 2],
}

const CLONE: usize = 0;
const HASH: usize = 1;

impl Fragile {
    fn count(&self, call: usize) {
        let n = self.calls[call].fetch_add(1, Ordering::SeqCst) + 1;
        assert!(n != self.panic_at[call], "a planted panic");
    }
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        self.count(CLONE);
        Fragile {
            id: self.id,
            calls: Arc::clone(&self.calls),
            panic_at: self.panic_at,
        }
    }
}

impl PartialEq for Fragile {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Fragile {}

impl Hash for Fragile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.count(HASH);
        self.id.hash(state);
    }
}

/// Whatever clone or hash of the key panics, on the way into the queue or out of it (a waiter
/// timing out), no waiter is left behind, no unit is lost, and the key admits again once its
/// units are free (a mark left by a panic is cleared by the next check that meets it).
#[test]
fn a_key_that_panics_in_the_queue_leaves_nothing_behind() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let (mut panicked, mut marks_left) = (0, 0);
    for call in [CLONE, HASH] {
        for nth in 1..=10 {
            let calls = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            let key = Fragile {
                id: 7,
                calls: Arc::clone(&calls),
                panic_at: [u64::MAX; 2],
            };
            let limit = InFlight::<Fragile>::new(1).unwrap();
            let held = limit.try_acquire(&key).unwrap().unwrap();
            let mut panic_at = [u64::MAX; 2];
            panic_at[call] = calls[call].load(Ordering::SeqCst) + nth;
            let fragile = Fragile {
                id: 7,
                calls: Arc::clone(&calls),
                panic_at,
            };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.block_on(async {
                    tokio::time::timeout(Duration::from_millis(1), limit.acquire(&fragile, LONG))
                        .await
                        .map(|r| r.is_ok())
                })
            }));
            let case = format!("call {call}, panic at {nth}");
            panicked += usize::from(outcome.is_err());
            assert!(matches!(outcome, Err(_) | Ok(Err(_))), "{case}: served?");
            assert_eq!(limit.in_flight(&key), 1, "{case}");
            drop(held);
            assert_eq!(limit.in_flight(&key), 0, "{case}");
            marks_left += usize::from(limit.evict_idle() == 0);
            assert!(
                limit.try_acquire(&key).unwrap().is_some(),
                "{case}: admits again"
            );
        }
    }
    // The sweep reaches the panics it is about: in the queue's own calls, and a mark left.
    assert!(
        panicked >= 8 && marks_left >= 1,
        "{panicked} panics, {marks_left} marks left"
    );
}

/// A queue that a panic in its key's `Hash` left empty as its last waiter gave up is no
/// queue: the next waiter still reserves first, which marks the key, so that a newcomer does
/// not take the units that waiter is owed.
#[test]
fn a_queue_a_panic_left_empty_still_marks_the_key_for_its_next_waiter() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    for nth in 1..=20 {
        let calls = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let fragile = |panic_at| Fragile {
            id: 7,
            calls: Arc::clone(&calls),
            panic_at,
        };
        let key = fragile([u64::MAX; 2]);
        let limit = InFlight::<Fragile>::new(3).unwrap();
        let held = limit.try_acquire_n(&key, 2).unwrap().unwrap();
        let mut panic_at = [u64::MAX; 2];
        panic_at[HASH] = calls[HASH].load(Ordering::SeqCst) + nth;
        let doomed = fragile(panic_at);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                tokio::time::timeout(Duration::from_millis(1), limit.acquire_n(&doomed, 2, LONG))
                    .await
            })
        }));
        // One unit is free; a waiter for two queues, and a newcomer for one is refused.
        let _runtime = runtime.enter();
        let (_, waker) = counting();
        let mut waiter = Box::pin(limit.acquire_n(&key, 2, LONG));
        assert!(poll_once(waiter.as_mut(), &waker).is_pending(), "nth {nth}");
        assert!(
            limit.try_acquire(&key).unwrap().is_none(),
            "nth {nth}: the free unit is the waiter's"
        );
        drop(held);
        assert!(
            matches!(poll_once(waiter.as_mut(), &waker), Poll::Ready(Ok(_))),
            "nth {nth}: served"
        );
    }
}

/// Tasks on two worker threads oversubscribe one key, each waiting with a short bound, many
/// giving up: never more than `N` held, every waiter served or timed out, nothing lost.
#[test]
fn waiters_giving_up_under_contention_lose_no_unit() {
    const N: u64 = 3;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let limit = Arc::new(InFlight::<u64>::new(N).unwrap());
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let gave_up = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    runtime.block_on(async {
        let tasks: Vec<_> = (0..16u64)
            .map(|task| {
                let (limit, holding, most) = (limit.clone(), holding.clone(), most.clone());
                let (served, gave_up, stop) = (served.clone(), gave_up.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut round = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        round += 1;
                        let wait = Duration::from_micros(50 * ((task + round) % 7));
                        let cost = 1 + (task + round) % 2;
                        match limit.acquire_n(&1, cost, wait).await {
                            Ok(permit) => {
                                let now = holding.fetch_add(cost, Ordering::SeqCst) + cost;
                                most.fetch_max(now, Ordering::SeqCst);
                                served.fetch_add(1, Ordering::Relaxed);
                                tokio::task::yield_now().await;
                                holding.fetch_sub(cost, Ordering::SeqCst);
                                drop(permit);
                            }
                            Err(WaitError::TooLong { .. }) => {
                                gave_up.fetch_add(1, Ordering::Relaxed);
                                // Back to the scheduler, as a waiter that gave up does: a
                                // loop that never yields would keep the timer from firing.
                                tokio::task::yield_now().await;
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert!(most.load(Ordering::SeqCst) <= N, "{most:?} held at once");
    assert!(served.load(Ordering::Relaxed) > 0);
    assert_eq!(limit.in_flight(&1), 0, "every unit given back");
    assert!(
        limit.try_acquire_n(&1, N).unwrap().is_some(),
        "no mark left"
    );
    println!(
        "served {}, gave up {}",
        served.load(Ordering::Relaxed),
        gave_up.load(Ordering::Relaxed)
    );
}

/// A key whose `Clone`, `Hash` or `Eq` panics once its family's count of that call reaches a
/// mark set at any time (a family: a key and its copies; `Eq` counts for both sides).
#[derive(Debug)]
struct Armed {
    id: u64,
    calls: Arc<[AtomicU64; 3]>,
    panic_at: Arc<[AtomicU64; 3]>,
}

const EQ: usize = 2;

impl Armed {
    fn family(id: u64) -> Armed {
        Armed {
            id,
            calls: Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]),
            panic_at: Arc::new([
                AtomicU64::new(u64::MAX),
                AtomicU64::new(u64::MAX),
                AtomicU64::new(u64::MAX),
            ]),
        }
    }

    /// Makes the family's `nth` next call of `call` panic.
    fn arm(&self, call: usize, nth: u64) {
        let at = self.calls[call].load(Ordering::SeqCst) + nth;
        self.panic_at[call].store(at, Ordering::SeqCst);
    }

    /// No more panics in the family.
    fn disarm(&self) {
        for at in self.panic_at.iter() {
            at.store(u64::MAX, Ordering::SeqCst);
        }
    }

    fn count(&self, call: usize) {
        if std::thread::panicking() {
            return; // a panic while unwinding aborts, whatever the library does
        }
        let n = self.calls[call].fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            n != self.panic_at[call].load(Ordering::SeqCst),
            "a planted panic"
        );
    }
}

impl Clone for Armed {
    fn clone(&self) -> Self {
        self.count(CLONE);
        Armed {
            id: self.id,
            calls: Arc::clone(&self.calls),
            panic_at: Arc::clone(&self.panic_at),
        }
    }
}

impl PartialEq for Armed {
    fn eq(&self, other: &Self) -> bool {
        self.count(EQ);
        other.count(EQ);
        self.id == other.id
    }
}

impl Eq for Armed {}

impl Hash for Armed {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.count(HASH);
        self.id.hash(state);
    }
}

/// Whichever clone, hash or comparison of a waiter's key panics as a release serves the
/// waiter (reserving its units, among others), the waiter is woken and ends with the units:
/// served by that release, or by its own next poll, which serves the queue a panic left
/// unserved (the release may have freed the last units: no other release comes). Its own poll
/// may panic too (a later call of its key): then it is gone, and nothing is lost.
#[test]
fn a_waiter_whose_key_panics_as_a_release_serves_it_is_still_woken_and_served() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _runtime = runtime.enter();
    let mut served_after_a_panic = [0; 3];
    for call in [CLONE, HASH, EQ] {
        for nth in 1..=8 {
            let case = format!("call {call}, panic at {nth}");
            // The permit's key and the waiter's are equal, of two families: only the waiter's
            // panics, so the release's own refund always runs.
            let (held_key, waiting_key) = (Armed::family(7), Armed::family(7));
            let limit = InFlight::<Armed>::new(1).unwrap();
            let held = limit.try_acquire(&held_key).unwrap().unwrap();
            let (wakes, waker) = counting();
            let mut waiter = Box::pin(limit.acquire(&waiting_key, LONG));
            assert!(poll_once(waiter.as_mut(), &waker).is_pending(), "{case}");
            waiting_key.arm(call, nth);
            let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(held)));
            if released.is_err() {
                assert!(
                    wakes.count() >= 1,
                    "{case}: the waiter woken after the panic"
                );
            }
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                poll_once(waiter.as_mut(), &waker)
            }));
            // (The sweep is about the release and the waiter's poll: a later call of the key,
            // such as the release of the waiter's permit, is not.)
            waiting_key.disarm();
            match polled {
                Ok(Poll::Ready(Ok(permit))) => {
                    assert_eq!(limit.in_flight(&held_key), 1, "{case}: the waiter's unit");
                    drop(permit);
                    served_after_a_panic[call] += usize::from(released.is_err());
                }
                Ok(Poll::Pending) => panic!("{case}: left waiting with every unit free"),
                Ok(Poll::Ready(Err(e))) => panic!("{case}: {e}"),
                Err(_) => drop(waiter), // its own poll panicked: it leaves the queue
            }
            assert_eq!(limit.in_flight(&held_key), 0, "{case}: nothing held");
            assert!(
                limit.try_acquire(&held_key).unwrap().is_some(),
                "{case}: admits again"
            );
        }
    }
    // The sweep reaches what it is about: a release's service interrupted by each call.
    assert!(
        served_after_a_panic.iter().all(|&n| n >= 1),
        "served after a panic in the release, by call: {served_after_a_panic:?}"
    );
}

/// The bounded wait of an `InFlight` gives up as the rate limiters' does, with
/// `WaitError::TooLong`: at once for `max_wait = 0`, else once `max_wait` passed in vain (an
/// in-flight limit cannot know sooner), holding nothing and leaving no mark.
#[tokio::test(start_paused = true)]
async fn a_bounded_wait_gives_up_with_too_long_after_max_wait() {
    let limit = Arc::new(InFlight::<u64>::new(2).unwrap());
    let held = limit.try_acquire_n(&1, 2).unwrap().unwrap();
    let start = tokio::time::Instant::now();
    let at_once = limit.acquire(&1, Duration::ZERO).await.unwrap_err();
    assert_eq!(
        at_once,
        WaitError::TooLong {
            wait: Duration::ZERO,
            max_wait: Duration::ZERO
        }
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    let bound = Duration::from_millis(30);
    let too_long = WaitError::TooLong {
        wait: bound,
        max_wait: bound,
    };
    assert_eq!(limit.acquire(&1, bound).await.unwrap_err(), too_long);
    assert_eq!(limit.acquire_n(&1, 2, bound).await.unwrap_err(), too_long);
    assert_eq!(limit.acquire_owned(&1, bound).await.unwrap_err(), too_long);
    assert_eq!(
        limit.acquire_n_owned(&1, 2, bound).await.unwrap_err(),
        too_long
    );
    assert_eq!(start.elapsed(), bound * 4, "each waited its bound");
    assert!(too_long.to_string().contains("30ms"), "{too_long}");
    assert_eq!(limit.in_flight(&1), 2, "nothing taken by the waits");
    drop(held);
    // No mark left: a check admits at once.
    assert!(limit.try_acquire_n(&1, 2).unwrap().is_some());
    // A cost above `N` is the check's error, at once, from every form.
    let never = WaitError::Limit(LimitError::CapacityExceeded {
        cost: 3,
        capacity: 2,
    });
    assert_eq!(limit.acquire_n(&1, 3, bound).await.unwrap_err(), never);
    assert_eq!(
        limit.acquire_n_owned(&1, 3, bound).await.unwrap_err(),
        never
    );
    assert_eq!(start.elapsed(), bound * 4);
}

/// A bound an `InFlight` cannot hold is its own error, not a quota's.
#[test]
fn an_invalid_bound_is_an_in_flight_bound_error() {
    use tollgate::InFlightBoundError;
    assert_eq!(
        InFlight::<u64>::new(0).unwrap_err(),
        InFlightBoundError::Zero
    );
    let largest = (1 << 62) - 3;
    assert!(InFlight::<u64>::new(largest).is_ok());
    assert_eq!(
        InFlight::<u64>::new(largest + 1).unwrap_err(),
        InFlightBoundError::TooLarge {
            max: largest + 1,
            largest
        }
    );
    assert_eq!(
        InFlight::<u64>::with_max_keys(0, 8, OverflowPolicy::Deny).unwrap_err(),
        InFlightBoundError::Zero
    );
}
