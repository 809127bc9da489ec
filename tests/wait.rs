//! Async waiting (feature `tokio`) on tokio's paused time: limiters read a `TokioClock`, so
//! every wait is exact (virtual) time; nothing here depends on the machine's speed. (The
//! overflow tests at the end read a `ManualClock` instead, moved by hand.)
//!
//! Run with `cargo test --features tokio --test wait`.

#![cfg(feature = "tokio")]

use std::time::Duration;

use tokio::time::{timeout, Instant};
use tollgate::clock::ManualClock;
use tollgate::wait::{TokioClock, WaitError};
use tollgate::{
    FixedWindow, Gcra, KeyedLimiter, LeakyQueue, LimitError, Limiter, MultiLimiter, OverflowPolicy,
    Quota, SlidingLog, SlidingWindow,
};

fn keyed<A: tollgate::Algorithm>(rule: A) -> KeyedLimiter<String, A, TokioClock> {
    KeyedLimiter::with_clock(rule, TokioClock::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn until_ready_waits_each_units_retry_after() {
    let limiter = keyed(Gcra::new(Quota::per_second(10).unwrap()).unwrap());
    let start = Instant::now();
    for _ in 0..10 {
        limiter.until_ready("k").await.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    for i in 1..=5u64 {
        let decision = limiter.until_ready("k").await.unwrap();
        assert!(decision.allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(100 * i));
    }
    // A cost that can never be admitted is an error at once.
    assert_eq!(
        limiter.until_ready_n("k", 11).await,
        Err(LimitError::CapacityExceeded {
            cost: 11,
            capacity: 10
        })
    );
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_charged_once_each() {
    // One unit a second: five waiters are admitted one a second, each charged once.
    let limiter = keyed(Gcra::new(Quota::per_second(1).unwrap().with_burst(1).unwrap()).unwrap());
    let start = Instant::now();
    let admitted = std::sync::Mutex::new(Vec::new());
    let waiter = || async {
        limiter.until_ready("k").await.unwrap();
        admitted.lock().unwrap().push(start.elapsed());
    };
    tokio::join!(waiter(), waiter(), waiter(), waiter(), waiter());
    let admitted = admitted.into_inner().unwrap();
    let secs: Vec<u64> = admitted.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [0, 1, 2, 3, 4]);
    // Exactly five units were charged: the next one is a whole second after the fifth.
    let next = limiter.peek("k", 1).unwrap();
    assert_eq!(next.retry_after(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn acquire_refuses_a_long_wait_at_once_and_charges_nothing() {
    let limiter = keyed(Gcra::new(Quota::per_second(2).unwrap()).unwrap());
    limiter.acquire_n("k", 2, Duration::ZERO).await.unwrap();
    let before = limiter.peek("k", 1).unwrap();
    let start = Instant::now();
    // Two units need a second; 400 ms is not enough.
    let e = limiter
        .acquire_n("k", 2, Duration::from_millis(400))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        WaitError::TooLong {
            wait: Duration::from_secs(1),
            max_wait: Duration::from_millis(400)
        }
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(limiter.peek("k", 1).unwrap(), before);
    // Within the bound it waits and passes.
    limiter
        .acquire("k", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert!(matches!(
        limiter.acquire_n("k", 3, Duration::from_secs(9)).await,
        Err(WaitError::Limit(LimitError::CapacityExceeded { .. }))
    ));
}

#[tokio::test(start_paused = true)]
async fn the_leaky_queue_serves_in_order_and_a_dropped_waiter_gives_its_slot_back() {
    // One unit every 100 ms, up to 5 queued.
    let queue =
        keyed(LeakyQueue::new(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap());
    let start = Instant::now();
    let done = std::sync::Mutex::new(Vec::new());
    let waiter = |name: &'static str| {
        let queue = &queue;
        let done = &done;
        async move {
            queue.until_ready("k").await.unwrap();
            done.lock()
                .unwrap()
                .push((name, start.elapsed().as_millis()));
        }
    };
    tokio::join!(waiter("a"), waiter("b"), waiter("c"));
    assert_eq!(
        done.lock().unwrap().clone(),
        [("a", 0), ("b", 100), ("c", 200)]
    );
    // Now the queue's next slot is at 300 ms. A waiter reserves it, and leaves after 50 ms:
    // its slot goes back, and the next caller gets it.
    let start = Instant::now();
    assert!(timeout(Duration::from_millis(50), queue.until_ready("k"))
        .await
        .is_err());
    let decision = queue.until_ready("k").await.unwrap();
    assert_eq!(decision.delay(), Duration::from_millis(50));
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    // A reservation further away than max_wait is refused at once, and not made: fill the
    // queue (4 units reserved now, the next slot 500 ms away, the queue full for 100 ms).
    assert!(queue.reserve("k", 4).unwrap().allowed());
    let before = queue.peek("k", 1).unwrap();
    let start = Instant::now();
    let e = queue
        .acquire("k", Duration::from_millis(450))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(
        matches!(e, WaitError::TooLong { wait, .. } if wait == Duration::from_millis(500)),
        "{e}"
    );
    assert_eq!(queue.peek("k", 1).unwrap(), before);
    // With 500 ms it waits its turn: 100 ms for room in the queue, then 400 ms for its slot.
    queue
        .acquire("k", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn gcra_waiters_are_served_in_the_order_they_reserved() {
    // T = 100 ms, bursts of 3, spent at 0.
    let limiter = keyed(Gcra::new(Quota::per_second(10).unwrap().with_burst(3).unwrap()).unwrap());
    assert!(limiter.check_n("k", 3).unwrap().allowed());
    let start = Instant::now();
    let done = std::sync::Mutex::new(Vec::new());
    let waiter = |name: &'static str, cost: u64| {
        let limiter = &limiter;
        let done = &done;
        async move {
            limiter.until_ready_n("k", cost).await.unwrap();
            done.lock()
                .unwrap()
                .push((name, start.elapsed().as_millis()));
        }
    };
    // `big` reserves first and is due at 300 ms; `small`, behind it, at 400 ms. (A re-check
    // loop would let `small` in at 100 ms, and `big` wait again.) Each is charged once.
    tokio::join!(waiter("big", 3), waiter("small", 1));
    assert_eq!(done.lock().unwrap().clone(), [("big", 300), ("small", 400)]);
    assert_eq!(
        limiter.peek("k", 1).unwrap().retry_after(),
        Duration::from_millis(100)
    );
    // The next slot is at 500 ms. A waiter reserves it and leaves after 50 ms: its slot goes
    // back, and the next caller gets it.
    assert!(timeout(Duration::from_millis(50), limiter.until_ready("k"))
        .await
        .is_err());
    let decision = limiter.until_ready("k").await.unwrap();
    assert_eq!(decision.delay(), Duration::from_millis(50));
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    // A reservation further away than max_wait is refused at once, and not made.
    let before = limiter.peek("k", 1).unwrap();
    let e = limiter
        .acquire_n("k", 2, Duration::from_millis(150))
        .await
        .unwrap_err();
    assert!(
        matches!(e, WaitError::TooLong { wait, .. } if wait == Duration::from_millis(200)),
        "{e}"
    );
    assert_eq!(limiter.peek("k", 1).unwrap(), before);
    assert_eq!(start.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn multi_limits_wait_for_the_slowest_and_direct_limiters_wait_too() {
    let multi = MultiLimiter::<String, _, _>::with_clock(
        [
            Gcra::new(Quota::per_second(10).unwrap()).unwrap(),
            Gcra::new(Quota::per_minute(12).unwrap()).unwrap(),
        ],
        TokioClock::new(),
    )
    .unwrap();
    let start = Instant::now();
    multi.until_ready_n("k", 10).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The per-second limit would admit 2 more in 200 ms; the per-minute one has 2 left.
    multi.until_ready_n("k", 2).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    // One more unit: the per-minute limit refills one every 5 s.
    assert!(matches!(
        multi.acquire("k", Duration::from_secs(4)).await,
        Err(WaitError::TooLong { .. })
    ));
    multi.acquire("k", Duration::from_secs(5)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    let direct = Limiter::with_clock(
        Gcra::new(Quota::per_second(4).unwrap()).unwrap(),
        TokioClock::new(),
    )
    .unwrap();
    let start = Instant::now();
    direct.until_ready_n(4).await.unwrap();
    assert!(direct.until_ready().await.allowed());
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    assert!(direct
        .acquire_n(2, Duration::from_millis(400))
        .await
        .is_err());
    direct
        .acquire_n(2, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(750));
}

/// Every limiter's form without `_n` is its `_n` form at cost 1: the same waits, the same
/// charges, the same errors, on a direct, a keyed and a multi limiter alike.
#[tokio::test(start_paused = true)]
async fn the_forms_of_cost_one_wait_as_their_n_forms_at_cost_one() {
    let rule = || Gcra::new(Quota::per_second(4).unwrap()).unwrap();
    let direct = Limiter::with_clock(rule(), TokioClock::new()).unwrap();
    let keyed = keyed(rule());
    let multi = MultiLimiter::<String, _, _>::with_clock([rule()], TokioClock::new()).unwrap();
    let start = Instant::now();
    // The burst, then one unit every 250 ms, alternating the two forms.
    for i in 0..8u64 {
        let at = Duration::from_millis(250 * i.saturating_sub(3));
        let (d, k, m) = if i % 2 == 0 {
            (
                direct.until_ready().await,
                keyed.until_ready("k").await.unwrap(),
                multi.until_ready("k").await.unwrap(),
            )
        } else {
            (
                direct.until_ready_n(1).await.unwrap(),
                keyed.until_ready_n("k", 1).await.unwrap(),
                multi.until_ready_n("k", 1).await.unwrap(),
            )
        };
        assert!(d.allowed() && k.allowed() && m.allowed());
        assert_eq!(
            (d.remaining(), k.remaining()),
            (m.remaining(), m.remaining())
        );
        // The three wait in turn, each for its own unit: all three due at the same instant.
        assert_eq!(start.elapsed(), at, "unit {i}");
    }
    let now = start.elapsed();
    // Bounded: the next unit is 250 ms away, for each of them, by either form.
    let too_long = WaitError::TooLong {
        wait: Duration::from_millis(250),
        max_wait: Duration::from_millis(100),
    };
    let bound = Duration::from_millis(100);
    assert_eq!(direct.acquire(bound).await.unwrap_err(), too_long);
    assert_eq!(direct.acquire_n(1, bound).await.unwrap_err(), too_long);
    assert_eq!(keyed.acquire("k", bound).await.unwrap_err(), too_long);
    assert_eq!(keyed.acquire_n("k", 1, bound).await.unwrap_err(), too_long);
    assert_eq!(multi.acquire("k", bound).await.unwrap_err(), too_long);
    assert_eq!(multi.acquire_n("k", 1, bound).await.unwrap_err(), too_long);
    assert_eq!(start.elapsed(), now, "refused at once");
    // A cost above the burst: the check's error, from every form that takes a cost.
    let never = LimitError::CapacityExceeded {
        cost: 5,
        capacity: 4,
    };
    assert_eq!(direct.until_ready_n(5).await, Err(never));
    assert_eq!(keyed.until_ready_n("k", 5).await, Err(never));
    assert_eq!(multi.until_ready_n("k", 5).await, Err(never));
    assert_eq!(
        direct.acquire_n(5, bound).await,
        Err(WaitError::Limit(never))
    );
    assert_eq!(
        keyed.acquire_n("k", 5, bound).await,
        Err(WaitError::Limit(never))
    );
    assert_eq!(
        multi.acquire_n("k", 5, bound).await,
        Err(WaitError::Limit(never))
    );
    // Within the bound, each waits its 250 ms.
    let bound = Duration::from_millis(250);
    direct.acquire(bound).await.unwrap();
    keyed.acquire("k", bound).await.unwrap();
    multi.acquire("k", bound).await.unwrap();
    assert_eq!(start.elapsed(), now + bound);
}

/// A cost of 0 is always admitted at once, by every waiting form that takes a cost.
#[tokio::test(start_paused = true)]
async fn a_cost_of_zero_never_waits() {
    let limiter = keyed(FixedWindow::new(Quota::per_minute(1).unwrap()).unwrap());
    limiter.until_ready("k").await.unwrap();
    let start = Instant::now();
    assert!(limiter.until_ready_n("k", 0).await.unwrap().allowed());
    assert!(limiter
        .acquire_n("k", 0, Duration::ZERO)
        .await
        .unwrap()
        .allowed());
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A keyed GCRA limiter on a manual clock holding one key, whose overflow keys share one state:
/// one unit a second, bursts of 10. `"a"` holds the one place, its bucket spent (state for
/// 10 s); `"c"` spends the overflow state's bucket. Time stays at 0 until a test moves it.
fn one_key_and_a_spent_overflow() -> KeyedLimiter<String, Gcra, ManualClock> {
    let rule = Gcra::new(Quota::per_second(1).unwrap().with_burst(10).unwrap()).unwrap();
    let limiter = KeyedLimiter::<String, _, _>::builder(rule)
        .clock(ManualClock::new())
        .max_keys(1, OverflowPolicy::Shared)
        .build()
        .unwrap();
    assert!(limiter.check_n("a", 10).unwrap().allowed());
    assert!(limiter.check_n("c", 10).unwrap().allowed());
    assert_eq!(limiter.len(), 1, "\"c\" went to the overflow state");
    limiter
}

// The tests below run on a `ManualClock`: the limiter's time stands still while tokio's
// paused time lets a timeout drop a waiter (which sleeps on tokio's timer) mid-wait.

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_charged_to_the_overflow_state_gives_it_back_there() {
    let limiter = one_key_and_a_spent_overflow();
    // "b" does not fit: its reservation takes the overflow state's next unit, due in 1 s.
    // The waiter leaves before, with "b" still not held.
    assert!(timeout(Duration::from_millis(1), limiter.until_ready("b"))
        .await
        .is_err());
    assert_eq!(limiter.len(), 1, "\"b\" is not held");
    // The overflow state has its unit back: 1 s later, an overflow key gets it.
    limiter.clock().advance(Duration::from_secs(1));
    let decision = limiter.check("d").unwrap();
    assert!(decision.allowed(), "{decision:?}");
    assert_eq!(limiter.len(), 1, "\"d\" went to the overflow state");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_overflow_waiter_refunds_the_overflow_state_not_its_key_inserted_meanwhile() {
    let limiter = one_key_and_a_spent_overflow();
    let mut waiter = Box::pin(limiter.until_ready("b"));
    assert!(timeout(Duration::from_millis(1), &mut waiter)
        .await
        .is_err());
    // While "b" waits on the overflow state, room is made ("a" handed back and evicted) and
    // "b" gets a state of its own, which spends its bucket.
    limiter.refund("a", 10);
    assert_eq!(limiter.evict_fresh(), 1);
    assert!(limiter.check_n("b", 10).unwrap().allowed());
    assert_eq!(limiter.len(), 1, "\"b\" is held");
    drop(waiter);
    // "b"'s own state never held the waiter's unit: nothing comes back to it.
    let own = limiter.peek("b", 1).unwrap();
    assert!(!own.allowed(), "{own:?}");
    assert_eq!(own.retry_after(), Duration::from_secs(1));
    // The overflow state has it back: 1 s later, an overflow key gets it.
    limiter.clock().advance(Duration::from_secs(1));
    let decision = limiter.check("d").unwrap();
    assert!(decision.allowed(), "{decision:?}");
}

#[tokio::test(start_paused = true)]
async fn acquire_refused_as_too_long_on_the_overflow_state_leaves_it_as_it_was() {
    let limiter = one_key_and_a_spent_overflow();
    // "b" is not held, so the look before charging sees a fresh key's wait, none; its
    // reservation on the overflow state is due in 1 s, past the bound: given back, refused.
    let e = limiter
        .acquire("b", Duration::from_millis(500))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        WaitError::TooLong {
            wait: Duration::from_secs(1),
            max_wait: Duration::from_millis(500)
        }
    );
    limiter.clock().advance(Duration::from_secs(1));
    let decision = limiter.check("d").unwrap();
    assert!(decision.allowed(), "{decision:?}");
}

/// At the `max_keys` bound, a waiter for a held key is decided on the key's own state, whatever
/// the rule: the look for a held key must not read it as gone (it would be refused as a new
/// key, `KeyTableFull`, or charged to the overflow state).
#[tokio::test(start_paused = true)]
async fn a_held_keys_waiter_at_the_bound_decides_on_its_own_state_for_every_rule() {
    async fn held_key_waits<A: tollgate::Algorithm>(rule: A) {
        let name = std::any::type_name::<A>();
        let limiter = KeyedLimiter::<String, _, _>::builder(rule)
            .clock(ManualClock::new())
            .max_keys(1, OverflowPolicy::Deny)
            .build()
            .unwrap();
        assert!(limiter.check("a").unwrap().allowed(), "{name}");
        assert_eq!(
            limiter.check("b"),
            Err(LimitError::KeyTableFull { max_keys: 1 }),
            "{name}"
        );
        // Ten units in all: the waiter's are admitted at once, from "a"'s own state.
        let decision = limiter.until_ready_n("a", 9).await;
        assert!(
            decision.as_ref().is_ok_and(|d| d.allowed()),
            "{name}: {decision:?}"
        );
        assert!(
            !limiter.check("a").unwrap().allowed(),
            "{name}: \"a\" is spent"
        );
        assert_eq!(limiter.len(), 1, "{name}");
    }
    let quota = Quota::per_second(10).unwrap();
    held_key_waits(Gcra::new(quota).unwrap()).await;
    held_key_waits(LeakyQueue::new(quota).unwrap()).await;
    held_key_waits(FixedWindow::new(quota).unwrap()).await;
    held_key_waits(SlidingWindow::new(quota).unwrap()).await;
    held_key_waits(SlidingLog::new(quota).unwrap()).await;
}
