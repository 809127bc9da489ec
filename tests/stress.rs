//! Concurrency: many threads on one key with a frozen clock admit exactly what SPEC allows,
//! never more and never fewer; `set_quota` under traffic keeps the bound; `MultiLimiter` never
//! admits more than any one of its limits and a refusal consumes nothing from the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{
    Algorithm, FixedWindow, Gcra, KeyedLimiter, LeakyQueue, Limiter, MultiLimiter, Quota,
    SlidingLog, SlidingWindow,
};

const THREADS: usize = 6;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

/// Counts a reader out when dropped, even by a panic, so that a thread waiting for the
/// readers to finish never hangs a failing test.
struct CountOut<'a>(&'a AtomicU64);

impl Drop for CountOut<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A limiter the threads can share, by key.
trait Target: Sync {
    fn try_take(&self, cost: u64) -> bool;
}

impl<A: Algorithm> Target for Limiter<A, ManualClock> {
    fn try_take(&self, cost: u64) -> bool {
        self.check_n(cost).unwrap().allowed()
    }
}

impl<A: Algorithm> Target for KeyedLimiter<u64, A, ManualClock> {
    fn try_take(&self, cost: u64) -> bool {
        self.check_n(&42, cost).unwrap().allowed()
    }
}

/// `THREADS` threads start together; each makes `attempts` requests of costs 1..=3, then cost-1
/// requests until one is denied. Returns the units admitted in total. With a frozen clock the
/// limiter is then exactly full, so the total must be exactly what the SPEC allows.
fn hammer(target: &dyn Target, attempts: u64) -> u64 {
    let start = Barrier::new(THREADS);
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for id in 0..THREADS as u64 {
            let (start, admitted) = (&start, &admitted);
            s.spawn(move || {
                start.wait();
                let mut mine = 0;
                for i in 0..attempts {
                    let cost = 1 + (id + i) % 3;
                    if target.try_take(cost) {
                        mine += cost;
                    }
                }
                while target.try_take(1) {
                    mine += 1;
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

/// Phases of (how far the clock moves before the phase, units the SPEC then admits).
type Plan = &'static [(u64, u64)];

/// L = 1000 per second (GCRA: T = 1 ms, B = 1000), starting at t = 5 s.
const GCRA_PLAN: Plan = &[
    (5 * SEC, 1000),
    (0, 0),
    (250 * MS, 250), // 250 intervals drained
    (1, 0),          // 1 ns is not an interval
    (MS - 1, 1),
    (3 * SEC, 1000), // the bucket is never fuller than B
];
const FIXED_PLAN: Plan = &[
    (5 * SEC, 1000),
    (500 * MS, 0),    // the same window
    (500 * MS, 1000), // a new window
    (999 * MS, 0),
];
const SLIDING_WINDOW_PLAN: Plan = &[
    (5 * SEC, 1000), // prev = 0
    (SEC, 0),        // e = 0: prev = 1000 weighs fully
    (500 * MS, 500), // est = 1000·0.5: 500 more (est + 1 − 1 < 1000)
    (750 * MS, 625), // window 7, e = 0.25 s: prev = 500 weighs 375; cur + c ≤ 625
    (2 * SEC, 1000), // two windows later, both slid out
];
const SLIDING_LOG_PLAN: Plan = &[
    (5 * SEC, 1000),
    (999 * MS, 0),
    (MS - 1, 0), // 1 ns before the entries at 5 s expire
    (1, 1000),   // at exactly t − W they have
    (500 * MS, 0),
    (500 * MS, 1000),
];

fn run_plan(target: &dyn Target, clock: &ManualClock, plan: Plan, what: &str) {
    for (i, &(advance, expected)) in plan.iter().enumerate() {
        clock.advance_nanos(advance);
        let attempts = if expected == 0 { 50 } else { 300 };
        assert_eq!(hammer(target, attempts), expected, "{what}: phase {i}");
    }
}

fn run_both<A: Algorithm>(rule: A, plan: Plan) {
    let clock = ManualClock::new();
    let direct = Limiter::with_clock(rule, clock.clone()).unwrap();
    run_plan(&direct, &clock, plan, &format!("{} direct", A::NAME));
    let clock = ManualClock::new();
    let keyed = KeyedLimiter::<u64, A, ManualClock>::with_clock(rule, clock.clone()).unwrap();
    run_plan(&keyed, &clock, plan, &format!("{} keyed", A::NAME));
    assert_eq!(keyed.len(), 1);
}

#[test]
fn frozen_clock_admits_exactly_the_spec_amount() {
    let q = Quota::per_second(1000).unwrap();
    run_both(Gcra::new(q).unwrap(), GCRA_PLAN);
    run_both(LeakyQueue::new(q).unwrap(), GCRA_PLAN);
    run_both(FixedWindow::new(q).unwrap(), FIXED_PLAN);
    run_both(SlidingWindow::new(q).unwrap(), SLIDING_WINDOW_PLAN);
    run_both(SlidingLog::new(q).unwrap(), SLIDING_LOG_PLAN);
}

#[test]
fn leaky_queue_delays_are_distinct_slots_under_contention() {
    // Every admitted unit gets its own slot: the delays of cost-1 reservations made concurrently
    // at one instant are exactly 0, T, 2T, …, (C − 1)·T.
    let rule = LeakyQueue::new(Quota::per_second(500).unwrap()).unwrap();
    let clock = ManualClock::new();
    clock.set(SEC);
    let limiter = Limiter::with_clock(rule, clock).unwrap();
    let mut delays: Vec<u64> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    (0..200)
                        .filter_map(|_| {
                            let d = limiter.reserve(1).unwrap();
                            d.allowed().then(|| d.delay_nanos())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    delays.sort_unstable();
    let expected: Vec<u64> = (0..500).map(|i| i * 2 * MS).collect();
    assert_eq!(delays, expected);
}

/// Threads hammer while another replaces the quota back and forth; the clock is frozen, so the
/// total can never exceed what the more generous quota alone allows.
fn set_quota_keeps_the_bound<A: Algorithm>(a: A, b: A, bound: u64) {
    let clock = ManualClock::new();
    clock.set(3 * SEC);
    let limiter = Limiter::with_clock(a, clock.clone()).unwrap();
    let admitted = AtomicU64::new(0);
    let readers_left = AtomicU64::new(THREADS as u64 - 1);
    thread::scope(|s| {
        s.spawn(|| {
            // At least one change even if the readers finish before this thread is scheduled.
            let mut i = 0u64;
            loop {
                limiter.set_quota(if i % 2 == 0 { b } else { a }).unwrap();
                i += 1;
                if readers_left.load(Ordering::Acquire) == 0 {
                    break;
                }
            }
        });
        for id in 0..THREADS as u64 - 1 {
            let (limiter, admitted, readers_left) = (&limiter, &admitted, &readers_left);
            s.spawn(move || {
                let _count_out = CountOut(readers_left);
                for i in 0..3_000 {
                    let cost = 1 + (id + i) % 2;
                    if limiter.check_n(cost).is_ok_and(|d| d.allowed()) {
                        admitted.fetch_add(cost, Ordering::Relaxed);
                    }
                    let _ = limiter.peek(1);
                }
            });
        }
    });
    let total = admitted.into_inner();
    assert!(total <= bound, "{}: {total} > {bound}", A::NAME);
    assert!(total > 0);
}

#[test]
fn set_quota_during_traffic_keeps_the_bound() {
    let q = |l, ms| Quota::new(l, Duration::from_millis(ms)).unwrap();
    // GCRA: both spans are 1 s and every admission adds at least T = 1 ms of debt: ≤ 1000.
    set_quota_keeps_the_bound(
        Gcra::new(q(1000, 1000)).unwrap(),
        Gcra::new(q(300, 1000)).unwrap(),
        1000,
    );
    set_quota_keeps_the_bound(
        LeakyQueue::new(q(1000, 1000)).unwrap(),
        LeakyQueue::new(q(250, 1000)).unwrap(),
        1000,
    );
    // Window counters, same window: counts carry over, n ≤ the larger limit.
    set_quota_keeps_the_bound(
        FixedWindow::new(q(1000, 1000)).unwrap(),
        FixedWindow::new(q(300, 1000)).unwrap(),
        1000,
    );
    set_quota_keeps_the_bound(
        SlidingWindow::new(q(1000, 1000)).unwrap(),
        SlidingWindow::new(q(300, 1000)).unwrap(),
        1000,
    );
    // Sliding log: entries are absolute times; with the clock frozen all stay live under either
    // window (1 s and 60 s: different ticks, so the ring is re-expressed on every change).
    set_quota_keeps_the_bound(
        SlidingLog::new(q(1000, 1000)).unwrap(),
        SlidingLog::new(q(300, 60_000)).unwrap(),
        1000,
    );
}

/// Replacing quotas (windows too) while the clock moves and readings race: nothing panics, and
/// every decision stays well-formed.
fn set_quota_with_a_moving_clock<A: Algorithm>(rules: [A; 3]) {
    let clock = ManualClock::new();
    let keyed = KeyedLimiter::<u64, A, ManualClock>::with_clock(rules[0], clock.clone()).unwrap();
    let readers_left = AtomicU64::new(THREADS as u64 - 1);
    thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while readers_left.load(Ordering::Acquire) > 0 {
                keyed.set_quota(rules[(i % 3) as usize]).unwrap();
                clock.advance_nanos((i * 7_919) % (3 * MS));
                if i % 100 == 0 {
                    keyed.evict_fresh();
                }
                i += 1;
            }
        });
        for id in 0..THREADS as u64 - 1 {
            let (keyed, readers_left) = (&keyed, &readers_left);
            s.spawn(move || {
                let _count_out = CountOut(readers_left);
                for i in 0..3_000u64 {
                    let key = (id + i) % 5;
                    if let Ok(d) = keyed.check_n(&key, i % 4) {
                        assert!(d.allowed() || d.retry_after_nanos() > 0);
                        assert!(d.remaining() <= 2_000);
                    }
                    let _ = keyed.peek(&key, 1);
                    if i % 7 == 0 {
                        keyed.refund(&key, 1);
                    }
                }
            });
        }
    });
}

#[test]
fn set_quota_with_a_moving_clock_never_panics() {
    let q = |l, ms| Quota::new(l, Duration::from_millis(ms)).unwrap();
    set_quota_with_a_moving_clock([
        Gcra::new(q(10, 100)).unwrap(),
        Gcra::new(q(3, 1_000)).unwrap(),
        Gcra::new(q(1_000, 5)).unwrap(),
    ]);
    set_quota_with_a_moving_clock([
        LeakyQueue::new(q(10, 100)).unwrap(),
        LeakyQueue::new(q(3, 1_000)).unwrap(),
        LeakyQueue::new(q(1_000, 5)).unwrap(),
    ]);
    set_quota_with_a_moving_clock([
        FixedWindow::new(q(10, 100)).unwrap(),
        FixedWindow::new(q(3, 1)).unwrap(),
        FixedWindow::new(q(1_000, 7)).unwrap(),
    ]);
    set_quota_with_a_moving_clock([
        SlidingWindow::new(q(10, 100)).unwrap(),
        SlidingWindow::new(q(3, 1)).unwrap(),
        SlidingWindow::new(q(1_000, 7)).unwrap(),
    ]);
    set_quota_with_a_moving_clock([
        SlidingLog::new(q(10, 100)).unwrap(),
        SlidingLog::new(q(3, 3_000)).unwrap(),
        SlidingLog::new(q(1_000, 7)).unwrap(),
    ]);
}

/// Many keys at once, with sweeps running as keys are inserted: every key gets exactly its
/// quota in every phase, and evicted keys come back fresh.
#[test]
fn many_keys_with_concurrent_sweeps_admit_exactly_per_key() {
    const KEYS: usize = 3_000;
    fn run<A: Algorithm>(rule: A, per_phase: u64, advance: u64) {
        let clock = ManualClock::new();
        let keyed = KeyedLimiter::<u64, A, ManualClock>::with_clock(rule, clock.clone()).unwrap();
        for phase in 0..3 {
            clock.advance_nanos(advance);
            let counts: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
            thread::scope(|s| {
                for id in 0..THREADS {
                    let (keyed, counts) = (&keyed, &counts);
                    s.spawn(move || {
                        for round in 0..3 {
                            for k in 0..KEYS {
                                let key = ((k * 7 + id * 13 + round) % KEYS) as u64;
                                if keyed.check(&key).unwrap().allowed() {
                                    counts[key as usize].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    });
                }
            });
            for (key, n) in counts.iter().enumerate() {
                assert_eq!(
                    n.load(Ordering::Relaxed),
                    per_phase,
                    "{} key {key} phase {phase}",
                    A::NAME
                );
            }
            assert_eq!(keyed.len(), KEYS);
        }
        clock.advance_nanos(advance);
        assert_eq!(keyed.evict_fresh(), KEYS);
        assert!(keyed.is_empty());
    }
    let q = Quota::new(4, Duration::from_millis(10)).unwrap();
    run(Gcra::new(q).unwrap(), 4, 10 * MS);
    run(FixedWindow::new(q).unwrap(), 4, 10 * MS);
    run(SlidingWindow::new(q).unwrap(), 4, 20 * MS);
    run(SlidingLog::new(q).unwrap(), 4, 10 * MS);
}

/// The clock moves while threads hammer one key: over a run of length `D` no algorithm admits
/// more than its quota allows in `D` (GCRA: `B + D / T`; windows: `L` per window touched; log:
/// `L` per `W`, plus `L`).
#[test]
fn moving_clock_never_exceeds_the_rate() {
    fn run<A: Algorithm>(rule: A, bound: impl Fn(u64) -> u64) {
        let clock = ManualClock::new();
        let limiter = Limiter::with_clock(rule, clock.clone()).unwrap();
        let admitted = AtomicU64::new(0);
        let start = SEC;
        clock.set(start);
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for id in 0..THREADS as u64 {
                let (limiter, admitted, clock, barrier) = (&limiter, &admitted, &clock, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    // Every thread moves the shared clock now and then (0.1 ms every 20
                    // requests: 120 ms in all), so readings race with decisions.
                    for i in 0..4_000u64 {
                        if i % 20 == 0 {
                            clock.advance_nanos(MS / 10);
                        }
                        let cost = 1 + (id + i) % 3;
                        if limiter.check_n(cost).unwrap().allowed() {
                            admitted.fetch_add(cost, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let elapsed = clock_now(&clock) - start;
        let total = admitted.into_inner();
        let bound = bound(elapsed);
        assert!(
            total <= bound,
            "{}: {total} admitted in {elapsed} ns, bound {bound}",
            A::NAME
        );
        // Time did move under traffic: more than one quota's worth got through.
        assert!(total > 50, "{}: {total}", A::NAME);
    }
    fn clock_now(clock: &ManualClock) -> u64 {
        use tollgate::clock::Clock;
        clock.now()
    }
    // L = 20 per 10 ms.
    let q = Quota::new(20, Duration::from_millis(10)).unwrap();
    let w = 10 * MS;
    let t = w / 20;
    run(Gcra::new(q).unwrap(), |d| 20 + d / t);
    run(LeakyQueue::new(q).unwrap(), |d| 20 + d / t);
    let burst = Gcra::new(q.with_burst(50).unwrap()).unwrap();
    run(burst, |d| 50 + d / t);
    // Starting at 1 s, a window boundary: windows touched = floor(D / W) + 1.
    run(FixedWindow::new(q).unwrap(), |d| 20 * (d / w + 1));
    run(SlidingWindow::new(q).unwrap(), |d| 20 * (d / w + 1));
    run(SlidingLog::new(q).unwrap(), |d| 20 * (d / w + 1));
}

// ---------------------------------------------------------------------------------------------
// MultiLimiter
// ---------------------------------------------------------------------------------------------

fn remaining<A: Algorithm>(
    multi: &MultiLimiter<String, A, ManualClock>,
    i: usize,
    key: &str,
) -> u64 {
    multi.limits()[i].peek(key, 0).unwrap().remaining()
}

#[test]
fn multi_limiter_a_refusal_consumes_nothing_from_the_others() {
    // 10/s and 15/min (T = 4 s, B = 15).
    let per_second = Gcra::new(Quota::per_second(10).unwrap()).unwrap();
    let per_minute = Gcra::new(Quota::per_minute(15).unwrap()).unwrap();
    for order in [[per_second, per_minute], [per_minute, per_second]] {
        let clock = ManualClock::new();
        clock.set(SEC);
        let multi: MultiLimiter<String, Gcra, ManualClock> =
            MultiLimiter::with_clock(order, clock.clone()).unwrap();
        let (s, m) = if order[0] == per_second {
            (0, 1)
        } else {
            (1, 0)
        };
        for _ in 0..10 {
            assert!(multi.check("k").unwrap().allowed());
        }
        // The per-second limit refuses: the per-minute one is charged nothing.
        for _ in 0..50 {
            let d = multi.check("k").unwrap();
            assert!(!d.allowed());
            assert_eq!(d.limit(), 10, "the refusing limit's decision");
        }
        assert_eq!(remaining(&multi, s, "k"), 0);
        assert_eq!(remaining(&multi, m, "k"), 5);
        // A second later the per-second limit is full again; the per-minute one has 5 left
        // (debt 40 s − 1 s of a 60 s span, T = 4 s).
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            (0..5)
                .filter(|_| multi.check("k").unwrap().allowed())
                .count(),
            5
        );
        // Now the per-minute limit refuses; the per-second one is charged nothing.
        for _ in 0..50 {
            let d = multi.check("k").unwrap();
            assert!(!d.allowed());
            assert_eq!(d.limit(), 15);
        }
        assert_eq!(remaining(&multi, m, "k"), 0);
        assert_eq!(remaining(&multi, s, "k"), 5);
        // Costs no limit can ever admit consume nothing either.
        for cost in [11, 16] {
            assert!(!multi.check_n("k", cost).is_ok_and(|d| d.allowed()));
        }
        assert_eq!(remaining(&multi, s, "k"), 5);
        assert_eq!(remaining(&multi, m, "k"), 0);
    }
}

/// SPEC: a cost that can never be admitted is an error, not a denial. For a `MultiLimiter` that
/// is a cost above *any* limit's capacity, whatever the order of the limits and whatever their
/// state. Today `all_or_nothing` (src/multi/all_or_nothing.rs) returns the first refusing
/// limit's denial when a limit before the too-small one refuses.
#[test]
fn multi_limiter_cost_above_any_capacity_is_an_error() {
    let per_second = Gcra::new(Quota::per_second(10).unwrap()).unwrap();
    let per_minute = Gcra::new(Quota::per_minute(15).unwrap()).unwrap();
    let clock = ManualClock::new();
    clock.set(SEC);
    let multi: MultiLimiter<String, Gcra, ManualClock> =
        MultiLimiter::with_clock([per_minute, per_second], clock).unwrap();
    assert!(multi.check_n("k", 15).is_err());
    assert!(multi.check_n("k", 10).unwrap().allowed());
    // per_minute (first) now refuses 6; per_second can never admit 11.
    assert_eq!(
        multi.check_n("k", 11),
        Err(tollgate::LimitError::CapacityExceeded {
            cost: 11,
            capacity: 10
        })
    );
}

fn multi_under_contention<A: Algorithm>(rules: [A; 2], frozen_bound: u64) {
    let clock = ManualClock::new();
    clock.set(SEC);
    let multi: MultiLimiter<String, A, ManualClock> =
        MultiLimiter::with_clock(rules, clock.clone()).unwrap();
    // Frozen: never more than the tighter limit; afterwards each limit is charged exactly what
    // was admitted (refusals refunded every partial charge).
    let admitted = AtomicU64::new(0);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..200 {
                    if multi.check("k").unwrap().allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let total = admitted.load(Ordering::Relaxed);
    assert!(total <= frozen_bound && total > 0, "{}: {total}", A::NAME);
    for (i, rule) in rules.iter().enumerate() {
        assert_eq!(
            remaining(&multi, i, "k"),
            rule.capacity() - total,
            "{}: limit {i} charged more than was admitted",
            A::NAME
        );
    }
}

#[test]
fn multi_limiter_under_contention_is_all_or_nothing() {
    let q10s = Quota::per_second(10).unwrap();
    let q100m = Quota::per_minute(100).unwrap();
    multi_under_contention([Gcra::new(q10s).unwrap(), Gcra::new(q100m).unwrap()], 10);
    multi_under_contention([Gcra::new(q100m).unwrap(), Gcra::new(q10s).unwrap()], 10);
    multi_under_contention(
        [
            FixedWindow::new(q100m).unwrap(),
            FixedWindow::new(q10s).unwrap(),
        ],
        10,
    );
    multi_under_contention(
        [
            SlidingLog::new(q10s).unwrap(),
            SlidingLog::new(q100m).unwrap(),
        ],
        10,
    );
}

#[test]
fn multi_limiter_over_time_never_beats_any_single_limit() {
    // 10/s and 100/min for 30 s of hammering: the 10/s limit alone would allow 10 + 300, the
    // 100/min one 100 + 50; the pair must stay within the smaller.
    let clock = ManualClock::new();
    let multi: MultiLimiter<String, Gcra, ManualClock> = MultiLimiter::with_clock(
        [
            Gcra::new(Quota::per_second(10).unwrap()).unwrap(),
            Gcra::new(Quota::per_minute(100).unwrap()).unwrap(),
        ],
        clock.clone(),
    )
    .unwrap();
    let admitted = AtomicU64::new(0);
    let start = Barrier::new(THREADS);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                // Each thread moves the shared clock by 1/THREADS of 100 ms every 5 requests:
                // 300 steps of 100 ms, 30 s in all.
                for i in 0..1_500 {
                    if i % 5 == 0 {
                        clock.advance_nanos(100 * MS / THREADS as u64);
                    }
                    if multi.check_n("k", 1).unwrap().allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let total = admitted.into_inner();
    assert!(total <= 150, "{total}");
    // The pair admitted a real amount: all the per-minute quota was reachable.
    assert!(total >= 100, "{total}");
}
