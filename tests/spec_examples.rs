//! Every worked example and every general rule of SPEC.md, as a test through the public API
//! (`Limiter` / `KeyedLimiter` on a `ManualClock`).

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{
    Algorithm, Decision, FixedWindow, Gcra, KeyedLimiter, LeakyBucket, LeakyQueue, LimitError,
    Limiter, Quota, SlidingLog, SlidingWindow, TokenBucket,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn limiter<A: Algorithm>(rule: A) -> (Limiter<A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (Limiter::with_clock(rule, clock.clone()).unwrap(), clock)
}

fn keyed<A: Algorithm>(rule: A) -> (KeyedLimiter<String, A, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (
        KeyedLimiter::with_clock(rule, clock.clone()).unwrap(),
        clock,
    )
}

/// Runs `$test` on every algorithm for `limit` per `window` (GCRA and leaky with `B = C = L`).
macro_rules! for_every_algorithm {
    ($limit:expr, $window:expr, $test:ident) => {{
        let q = Quota::new($limit, $window).unwrap();
        $test(Gcra::new(q).unwrap());
        $test(LeakyQueue::new(q).unwrap());
        $test(FixedWindow::new(q).unwrap());
        $test(SlidingWindow::new(q).unwrap());
        $test(SlidingLog::new(q).unwrap());
    }};
}

/// A fixed probe of a limiter's future: peeks of every cost, then checks as time passes. Two
/// limiters in the same state give the same probe.
fn probe<A: Algorithm>(limiter: &Limiter<A, ManualClock>, clock: &ManualClock) -> Vec<Decision> {
    let capacity = limiter.rule().capacity();
    let mut out = Vec::new();
    for step in [0, 1, 7 * MS, 50 * MS, 100 * MS, 333 * MS, SEC, 10 * SEC] {
        clock.advance_nanos(step);
        for cost in 0..=capacity {
            out.push(limiter.peek(cost).unwrap());
        }
        for _ in 0..3 {
            out.push(limiter.check());
        }
    }
    out
}

/// Asserts that `op` changes nothing: a limiter it ran on and a twin it did not run on, both
/// prepared by `setup` at the same instant, face the same future.
fn changes_nothing<A: Algorithm>(
    rule: A,
    setup: impl Fn(&Limiter<A, ManualClock>, &ManualClock),
    op: impl Fn(&Limiter<A, ManualClock>),
) {
    let (with_op, clock_a) = limiter(rule);
    let (twin, clock_b) = limiter(rule);
    setup(&with_op, &clock_a);
    setup(&twin, &clock_b);
    op(&with_op);
    assert_eq!(
        probe(&with_op, &clock_a),
        probe(&twin, &clock_b),
        "{}: the operation changed the state",
        A::NAME
    );
}

// ---------------------------------------------------------------------------------------------
// §1 GCRA / token bucket
// ---------------------------------------------------------------------------------------------

#[test]
fn gcra_capacity_100_refill_10_per_second() {
    let rule = Gcra::new(Quota::per_second(10).unwrap().with_burst(100).unwrap()).unwrap();
    assert_eq!(rule.interval_nanos(), 100 * MS);
    let (lim, clock) = limiter(rule);
    clock.set(5 * SEC);
    // 100 at once.
    for i in 0..100u64 {
        let d = lim.check();
        assert!(d.allowed(), "request {i} of the burst");
        assert_eq!(d.remaining(), 99 - i);
        assert_eq!(d.reset_after(), Duration::from_millis(100 * (i + 1)));
        assert_eq!(d.retry_after(), Duration::ZERO);
        assert_eq!(d.limit(), 10);
    }
    let d = lim.check();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), Duration::from_secs(10));
    // Then 10 per second: one every 100 ms, to the nanosecond.
    clock.advance_nanos(100 * MS - 1);
    let d = lim.check();
    assert!(!d.allowed());
    assert_eq!(d.retry_after_nanos(), 1);
    clock.advance_nanos(1);
    assert!(lim.check().allowed());
    assert!(!lim.check().allowed());
    for second in 0..5 {
        clock.advance(Duration::from_secs(1));
        let admitted = (0..50).filter(|_| lim.check().allowed()).count();
        assert_eq!(admitted, 10, "second {second}");
    }
    // Idle for the whole span: full again, 100 at once.
    clock.advance(Duration::from_secs(10));
    let d = lim.peek(100).unwrap();
    assert!(d.allowed());
    assert_eq!(lim.peek(0).unwrap().remaining(), 100);
    assert_eq!(lim.peek(0).unwrap().reset_after(), Duration::ZERO);
    assert_eq!((0..200).filter(|_| lim.check().allowed()).count(), 100);
}

#[test]
fn gcra_figures_follow_the_formulas() {
    // T = 1 s, B = 4.
    let rule = Gcra::new(Quota::new(4, Duration::from_secs(4)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(10 * SEC);
    let d = lim.check_n(3).unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1); // floor((4 s − 3 s) / 1 s)
    assert_eq!(d.reset_after(), Duration::from_secs(3)); // TAT' − t
    clock.advance(Duration::from_millis(500));
    let d = lim.check_n(2).unwrap();
    assert!(!d.allowed());
    // tat + c·T − B·T − t = 13 + 2 − 4 − 10.5
    assert_eq!(d.retry_after(), Duration::from_millis(500));
    assert_eq!(d.remaining(), 1); // floor((4 − 2.5) / 1)
    assert_eq!(d.reset_after(), Duration::from_millis(2_500));
}

#[test]
fn gcra_emission_interval_is_rounded_to_the_nearest_nanosecond() {
    let t = |limit, window_ns| {
        Gcra::new(Quota::new(limit, Duration::from_nanos(window_ns)).unwrap())
            .unwrap()
            .interval_nanos()
    };
    assert_eq!(t(3, 1_000), 333); // 333.33
    assert_eq!(t(3, 2_000), 667); // 666.67
    assert_eq!(t(4, 10), 3); // 2.5: halves round up
    assert_eq!(t(7, 7), 1); // at least 1 ns
}

#[test]
fn token_bucket_and_leaky_meter_are_gcra() {
    let q = Quota::per_second(5).unwrap().with_burst(3).unwrap();
    let a: TokenBucket = Gcra::new(q).unwrap();
    let b: LeakyBucket = Gcra::new(q).unwrap();
    assert_eq!(a, b);
}

/// SPEC §2: `level = max(0, level − elapsed·L/W)`; allow iff `level + c ≤ C`, then `level += c`
/// — decided exactly as GCRA with `B = C`. The level is kept exactly as `level·W` in integers.
#[test]
fn leaky_meter_level_formula_decides_as_gcra() {
    for (limit, window, capacity) in [(10u64, SEC, 10u64), (3, 900 * MS, 7), (7, 7 * MS, 1)] {
        let rule = Gcra::new(
            Quota::new(limit, Duration::from_nanos(window))
                .unwrap()
                .with_burst(capacity)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(window % limit, 0, "T must be exact for this comparison");
        let (lim, clock) = limiter(rule);
        let (l, w, cap) = (limit as i128, window as i128, capacity as i128);
        let mut level_w: i128 = 0; // level · W
        let mut t: u64 = 0;
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..3_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let elapsed = match seed % 4 {
                0 => 0,
                1 => seed % (window / limit + 1),
                2 => seed % (window / 3 + 1),
                _ => seed % (2 * window),
            };
            t += elapsed;
            clock.set(t);
            level_w = (level_w - elapsed as i128 * l).max(0);
            let cost = (seed >> 20) % (capacity + 1);
            let allowed = level_w + cost as i128 * w <= cap * w;
            if allowed {
                level_w += cost as i128 * w;
            }
            assert_eq!(lim.check_n(cost).unwrap().allowed(), allowed, "request {i}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// §3 Leaky bucket as a queue
// ---------------------------------------------------------------------------------------------

#[test]
fn leaky_queue_200_at_once_on_an_empty_queue() {
    let rule = LeakyQueue::new(Quota::per_second(10).unwrap().with_burst(100).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(3 * SEC);
    let decisions: Vec<Decision> = (0..200).map(|_| lim.reserve(1).unwrap()).collect();
    let admitted: Vec<Duration> = decisions
        .iter()
        .filter(|d| d.allowed())
        .map(|d| d.delay())
        .collect();
    let expected: Vec<Duration> = (0..100).map(|i| Duration::from_millis(100 * i)).collect();
    assert_eq!(admitted, expected, "delays 0, 0.1 s, …, 9.9 s");
    assert!(decisions[..100].iter().all(|d| d.allowed()));
    for d in &decisions[100..] {
        assert!(!d.allowed(), "the queue is full");
        assert_eq!(d.delay(), Duration::ZERO);
        assert_eq!(d.retry_after(), Duration::from_millis(100));
    }
    // One slot drains every 100 ms; the next admission waits behind the queue.
    clock.advance(Duration::from_millis(100));
    let d = lim.reserve(1).unwrap();
    assert!(d.allowed());
    assert_eq!(d.delay(), Duration::from_millis(9_900));
    assert!(!lim.reserve(1).unwrap().allowed());
}

#[test]
fn leaky_queue_output_is_one_unit_per_interval() {
    let rule = LeakyQueue::new(Quota::new(4, Duration::from_millis(100)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(SEC);
    // Costs 1, 2, 1: they proceed at t, t + 25 ms, t + 75 ms.
    let delays: Vec<u64> = [1, 2, 1]
        .iter()
        .map(|&c| lim.reserve(c).unwrap().delay_nanos())
        .collect();
    assert_eq!(delays, [0, 25 * MS, 75 * MS]);
    // The fourth unit fills the queue (C = 4); a fifth is rejected.
    assert!(!lim.reserve(1).unwrap().allowed());
    clock.advance(Duration::from_millis(30));
    let d = lim.reserve(1).unwrap();
    assert!(d.allowed());
    assert_eq!(d.delay_nanos(), 100 * MS - 30 * MS);
}

/// SPEC §3 literally: `delay = tat − t` for every admitted request, the free one (`c = 0`)
/// included; it changes nothing.
#[test]
fn leaky_queue_cost_zero_reports_the_current_wait() {
    let rule = LeakyQueue::new(Quota::per_second(10).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(SEC);
    assert_eq!(lim.reserve(0).unwrap().delay(), Duration::ZERO);
    for _ in 0..4 {
        lim.reserve(1).unwrap();
    }
    let d = lim.reserve(0).unwrap();
    assert!(d.allowed());
    assert_eq!(d.delay(), Duration::from_millis(400));
    assert_eq!(lim.peek(0).unwrap().delay(), Duration::from_millis(400));
    assert_eq!(lim.reserve(1).unwrap().delay(), Duration::from_millis(400));
}

// ---------------------------------------------------------------------------------------------
// §4 Fixed window
// ---------------------------------------------------------------------------------------------

#[test]
fn fixed_windows_are_aligned_to_the_origin() {
    let rule = FixedWindow::new(Quota::new(3, Duration::from_secs(1)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    let mut out = Vec::new();
    for t in [
        0, 10, 999, 999, 1000, 1500, 1999, 1999, 2000, 2999, 2999, 2999, 2999,
    ] {
        clock.set(t * MS);
        out.push(lim.check().allowed());
    }
    assert_eq!(
        out,
        [true, true, true, false, true, true, true, false, true, true, true, false, false]
    );
}

#[test]
fn fixed_window_figures() {
    let rule = FixedWindow::new(Quota::new(3, Duration::from_secs(1)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(5_200 * MS);
    assert_eq!(lim.peek(0).unwrap().reset_after(), Duration::ZERO);
    let d = lim.check_n(2).unwrap();
    assert_eq!(d.remaining(), 1); // L − n
    assert_eq!(d.reset_after(), Duration::from_millis(800)); // end of the window
    clock.set(5_300 * MS);
    let d = lim.check_n(2).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(700)); // end of the window
    assert_eq!(d.remaining(), 1);
    clock.set(6_000 * MS);
    assert!(lim.check_n(3).unwrap().allowed());
}

// ---------------------------------------------------------------------------------------------
// §5 Sliding window counter
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_window_weighs_the_previous_window_by_its_overlap() {
    let rule = SlidingWindow::new(Quota::new(10, Duration::from_secs(1)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(500 * MS);
    for _ in 0..10 {
        assert!(lim.check().allowed());
    }
    let d = lim.check();
    assert!(!d.allowed());
    // At 1.25 s: est = 0 + 10·0.75 = 7.5 → remaining ceil(10 − 7.5) = 3.
    clock.set(1_250 * MS);
    assert_eq!(lim.peek(0).unwrap().remaining(), 3);
    // 7.5 < 10, 8.5 < 10, 9.5 < 10: three admitted, then 10.5 is not.
    let out: Vec<bool> = (0..5).map(|_| lim.check().allowed()).collect();
    assert_eq!(out, [true, true, true, false, false]);
    // reset_after: cur > 0 → the end of the next window.
    assert_eq!(
        lim.peek(0).unwrap().reset_after(),
        Duration::from_millis(1_750)
    );
}

#[test]
fn sliding_window_retry_after_is_the_first_instant_allowed() {
    let rule = SlidingWindow::new(Quota::new(10, Duration::from_secs(1)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(500 * MS);
    for _ in 0..10 {
        lim.check();
    }
    clock.set(1_000 * MS);
    let d = lim.check();
    assert!(!d.allowed());
    // Allowed when (0 + 1 − 1)·W + 10·(W − e) < 10·W, i.e. at e = 1 ns.
    assert_eq!(d.retry_after_nanos(), 1);
    // A cost of 10 needs (10 − 1)·W + 10·(W − e) < 10·W, i.e. e > 0.9·W: 0.9 s + 1 ns.
    let d = lim.peek(10).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after_nanos(), 900 * MS + 1);
    clock.set(1_900 * MS);
    assert!(!lim.peek(10).unwrap().allowed());
    clock.set(1_900 * MS + 1);
    assert!(lim.peek(10).unwrap().allowed());
    // With cur > 0 the first admitting instant can lie in a later window.
    let rule = SlidingWindow::new(Quota::new(4, Duration::from_secs(1)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(100 * MS);
    assert!(lim.check_n(4).unwrap().allowed());
    clock.set(1_100 * MS); // window 1: prev = 4, cur = 0, e = 0.1 s, est = 3.6
    assert!(lim.check().allowed()); // 3.6 < 4 → cur = 1, est = 4.6
    let d = lim.check();
    assert!(!d.allowed());
    // In window 1: (1 + 1 − 1)·W + 4·(W − e) < 4·W needs e > 0.25 s; at 1.25 s + 1 ns.
    assert_eq!(d.retry_after_nanos(), 150 * MS + 1);
    // Cost 4 in window 1 needs 4·W + 4·(W − e) < 4·W: never. In window 2 (prev = 1, cur = 0):
    // 3·W + 1·(W − e) < 4·W needs e > 0: at 2 s + 1 ns.
    let d = lim.peek(4).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after_nanos(), 900 * MS + 1);
}

/// The decision is exact at the boundary, where floating point would round: `est + c − 1 < L`
/// with `est` a hair under the limit.
#[test]
fn sliding_window_is_exact_in_integers() {
    // W = 3 ms, prev = 3: at e = 1 ns, prev·(W − e)/W = 3 − 1e-6 (just under 3).
    let rule = SlidingWindow::new(Quota::new(3, Duration::from_millis(3)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(0);
    assert!(lim.check_n(3).unwrap().allowed());
    clock.set(3 * MS);
    assert!(!lim.check().allowed()); // est = 3
    clock.set(3 * MS + 1);
    assert!(lim.check().allowed()); // est = 3 − 1e-6: 2.999999 + 1 − 1 < 3
    assert!(!lim.check().allowed());
}

// ---------------------------------------------------------------------------------------------
// §6 Sliding window log
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_log_at_121_with_window_60_the_entry_at_60_is_gone_70_stays() {
    let rule = SlidingLog::new(Quota::new(2, Duration::from_secs(60)).unwrap()).unwrap();
    let (lim, clock) = keyed(rule);
    clock.set(60 * SEC);
    assert!(lim.check("k").unwrap().allowed());
    clock.set(70 * SEC);
    assert!(lim.check("k").unwrap().allowed());
    clock.set(119 * SEC);
    let d = lim.check("k").unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(1)); // 60 + 60 − 119
                                                         // At exactly t − W = 60 the entry has expired.
    clock.set(120 * SEC);
    assert_eq!(lim.peek("k", 1).unwrap().remaining(), 0); // would leave 70 and 120
    clock.set(121 * SEC);
    let d = lim.check("k").unwrap();
    assert!(d.allowed(), "the entry at 60 is gone");
    assert_eq!(d.remaining(), 0, "the entry at 70 stays");
    assert_eq!(d.reset_after(), Duration::from_secs(60)); // newest (121) + 60 − 121
    let d = lim.check("k").unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(9)); // 70 + 60 − 121
}

#[test]
fn sliding_log_never_holds_more_than_l_in_any_window() {
    let rule = SlidingLog::new(Quota::new(5, Duration::from_millis(100)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    let mut admitted: Vec<u64> = Vec::new();
    for step in 0..2_000u64 {
        let t = step * 7 * MS / 3;
        clock.set(t);
        let cost = step % 3;
        if lim.check_n(cost).unwrap().allowed() {
            admitted.extend(std::iter::repeat_n(t, cost as usize));
        }
    }
    for &start in &admitted {
        let in_window = admitted
            .iter()
            .filter(|&&a| a >= start && a < start + 100 * MS)
            .count();
        assert!(in_window <= 5);
    }
    assert!(admitted.len() > 100);
}

#[test]
fn sliding_log_figures() {
    let rule = SlidingLog::new(Quota::new(4, Duration::from_secs(10)).unwrap()).unwrap();
    let (lim, clock) = limiter(rule);
    clock.set(100 * SEC);
    assert!(lim.check_n(2).unwrap().allowed());
    clock.set(103 * SEC);
    let d = lim.check_n(1).unwrap();
    assert_eq!(d.remaining(), 1); // L − count
    assert_eq!(d.reset_after(), Duration::from_secs(10)); // newest + W − t
    clock.set(105 * SEC);
    // A free peek: the newest entry is at 103.
    assert_eq!(lim.peek(0).unwrap().reset_after(), Duration::from_secs(8));
    // A peek of cost 1 that would append at 105.
    assert_eq!(lim.peek(1).unwrap().reset_after(), Duration::from_secs(10));
    // Cost 3 needs (count + c − L) = 2 entries gone: the 2nd oldest, at 100.
    let d = lim.check_n(3).unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(5));
    // Cost 4 needs all three gone: the newest, at 103.
    assert_eq!(lim.peek(4).unwrap().retry_after(), Duration::from_secs(8));
}

// ---------------------------------------------------------------------------------------------
// General rules, for every algorithm
// ---------------------------------------------------------------------------------------------

/// Uses up the whole capacity at the current instant.
fn fill<A: Algorithm>(lim: &Limiter<A, ManualClock>, clock: &ManualClock) {
    clock.set(7 * SEC + 3 * MS);
    let capacity = lim.rule().capacity();
    assert!(lim.check_n(capacity).unwrap().allowed());
    assert!(!lim.check().allowed());
}

/// Leaves a part of the capacity used.
fn half<A: Algorithm>(lim: &Limiter<A, ManualClock>, clock: &ManualClock) {
    clock.set(7 * SEC + 3 * MS);
    let capacity = lim.rule().capacity();
    assert!(lim.check_n(capacity / 2).unwrap().allowed());
}

#[test]
fn cost_zero_is_always_allowed_and_changes_nothing() {
    fn test<A: Algorithm>(rule: A) {
        for setup in [
            (|_: &Limiter<A, ManualClock>, c: &ManualClock| c.set(SEC)) as fn(&_, &_),
            half,
            fill,
        ] {
            let (lim, clock) = limiter(rule);
            setup(&lim, &clock);
            let d = lim.check_n(0).unwrap();
            assert!(d.allowed(), "{}", A::NAME);
            assert_eq!(d.retry_after(), Duration::ZERO);
            assert!(lim.peek(0).unwrap().allowed());
            changes_nothing(rule, setup, |lim| {
                for _ in 0..5 {
                    assert!(lim.check_n(0).unwrap().allowed());
                }
            });
        }
    }
    for_every_algorithm!(4, Duration::from_millis(40), test);
    for_every_algorithm!(1, Duration::from_secs(1), test);
}

#[test]
fn a_cost_above_capacity_is_an_error_that_changes_nothing() {
    fn test<A: Algorithm>(rule: A) {
        let capacity = rule.capacity();
        for setup in [half, fill] {
            let (lim, clock) = limiter(rule);
            setup(&lim, &clock);
            for cost in [capacity + 1, capacity + 1_000, u64::MAX] {
                let expected = Err(LimitError::CapacityExceeded { cost, capacity });
                assert_eq!(lim.check_n(cost), expected, "{}", A::NAME);
                assert_eq!(lim.peek(cost), expected);
            }
            changes_nothing(rule, setup, |lim| {
                for _ in 0..3 {
                    assert!(lim.check_n(capacity + 1).is_err());
                }
            });
        }
        // Keyed: the same error, and the key is not inserted.
        let (lim, clock) = keyed(rule);
        clock.set(SEC);
        assert_eq!(
            lim.check_n("k", capacity + 1),
            Err(LimitError::CapacityExceeded {
                cost: capacity + 1,
                capacity
            })
        );
        assert!(lim.is_empty());
        // The capacity itself is admitted on a fresh key.
        assert!(lim.check_n("k", capacity).unwrap().allowed());
    }
    for_every_algorithm!(5, Duration::from_millis(50), test);
    // GCRA and leaky: the capacity is the burst, not the limit.
    let q = Quota::per_second(5).unwrap().with_burst(12).unwrap();
    test(Gcra::new(q).unwrap());
    test(LeakyQueue::new(q).unwrap());
    assert_eq!(Gcra::new(q).unwrap().capacity(), 12);
    let q = Quota::per_second(5).unwrap().with_burst(2).unwrap();
    test(Gcra::new(q).unwrap());
}

#[test]
fn a_denied_request_changes_nothing() {
    fn test<A: Algorithm>(rule: A) {
        let capacity = rule.capacity();
        changes_nothing(rule, fill, |lim| {
            for cost in 1..=capacity {
                assert!(!lim.check_n(cost).unwrap().allowed(), "{}", A::NAME);
            }
        });
        changes_nothing(rule, half, |lim| {
            for cost in (capacity - capacity / 2 + 1)..=capacity {
                assert!(!lim.check_n(cost).unwrap().allowed(), "{}", A::NAME);
            }
        });
    }
    for_every_algorithm!(6, Duration::from_millis(60), test);
}

#[test]
fn a_peek_reports_the_decision_a_check_would_get_and_changes_nothing() {
    fn test<A: Algorithm>(rule: A) {
        let capacity = rule.capacity();
        for setup in [half, fill] {
            for cost in 0..=capacity {
                let (lim, clock) = limiter(rule);
                setup(&lim, &clock);
                clock.advance_nanos(3 * MS);
                let peeked = lim.peek(cost).unwrap();
                assert_eq!(lim.peek(cost).unwrap(), peeked, "{}", A::NAME);
                assert_eq!(
                    lim.check_n(cost).unwrap(),
                    peeked,
                    "{} cost {cost}",
                    A::NAME
                );
            }
            changes_nothing(rule, setup, |lim| {
                for cost in 0..=capacity {
                    lim.peek(cost).unwrap();
                }
            });
        }
    }
    for_every_algorithm!(4, Duration::from_millis(40), test);
}

#[test]
fn keys_are_independent() {
    fn test<A: Algorithm>(rule: A) {
        // `b`'s decisions are the same whether or not `a` is hammered meanwhile.
        let run = |hammer_a: bool| {
            let (lim, clock) = keyed(rule);
            let mut b = Vec::new();
            for step in 0..400u64 {
                clock.set(step * 3 * MS);
                if hammer_a {
                    for _ in 0..3 {
                        let _ = lim.check_n("a", 1 + step % 2);
                    }
                    let _ = lim.peek("a", 1);
                    lim.refund("a", step % 3);
                }
                if step % 4 == 0 {
                    b.push(lim.check_n("b", step % 3).unwrap());
                    b.push(lim.peek("b", 1).unwrap());
                }
            }
            b
        };
        assert_eq!(run(true), run(false), "{}", A::NAME);
        // And an exhausted key leaves a fresh key at full capacity.
        let (lim, clock) = keyed(rule);
        clock.set(SEC);
        let capacity = rule.capacity();
        assert!(lim.check_n("a", capacity).unwrap().allowed());
        assert!(!lim.check("a").unwrap().allowed());
        let d = lim.check_n("b", capacity).unwrap();
        assert!(d.allowed(), "{}", A::NAME);
    }
    for_every_algorithm!(5, Duration::from_millis(100), test);
}

#[test]
fn time_never_goes_backwards() {
    fn test<A: Algorithm>(rule: A) {
        // A limiter whose clock reads earlier than before decides as at the newest reading.
        let (back, clock_a) = limiter(rule);
        let (steady, clock_b) = limiter(rule);
        clock_a.set(10 * SEC);
        clock_b.set(10 * SEC);
        for _ in 0..2 {
            assert_eq!(back.check(), steady.check());
        }
        for earlier in [10 * SEC - 1, 9 * SEC, 0] {
            clock_a.set(earlier);
            assert_eq!(back.check(), steady.check(), "{}", A::NAME);
            assert_eq!(back.peek(1).unwrap(), steady.peek(1).unwrap());
        }
        clock_a.set(10 * SEC + 50 * MS);
        clock_b.set(10 * SEC + 50 * MS);
        assert_eq!(back.check(), steady.check());
    }
    for_every_algorithm!(3, Duration::from_millis(30), test);
}

#[test]
fn every_decision_reports_the_limit() {
    fn test<A: Algorithm>(rule: A) {
        let (lim, clock) = limiter(rule);
        clock.set(SEC);
        for _ in 0..10 {
            assert_eq!(lim.check().limit(), 7, "{}", A::NAME);
        }
    }
    for_every_algorithm!(7, Duration::from_millis(70), test);
}

#[test]
fn every_algorithm_accepts_the_spec_minimum_limit() {
    let q = Quota::per_second((1 << 20) - 1).unwrap();
    Gcra::new(q).unwrap();
    LeakyQueue::new(q).unwrap();
    FixedWindow::new(q).unwrap();
    SlidingWindow::new(q).unwrap();
    SlidingLog::new(Quota::per_second(65_535).unwrap()).unwrap();
    // Windows need W ≥ 1 ms; GCRA takes any positive duration.
    let short = Quota::new(1, Duration::from_micros(999)).unwrap();
    assert!(FixedWindow::new(short).is_err());
    assert!(SlidingWindow::new(short).is_err());
    assert!(SlidingLog::new(short).is_err());
    assert!(Gcra::new(short).is_ok());
}

/// SPEC: time is clamped, never a panic: readings at the very end of the 64-bit range decide
/// (the 64-bit states may deny where they cannot record an admission) and never overflow.
#[test]
fn the_end_of_time_never_panics() {
    fn test<A: Algorithm>(rule: A) {
        let (lim, clock) = keyed(rule);
        for t in [u64::MAX - 3 * SEC, u64::MAX - 1, u64::MAX, 0] {
            clock.set(t);
            for cost in 0..=rule.capacity() + 1 {
                let _ = lim.check_n("k", cost);
                let _ = lim.peek("k", cost);
                if let Ok(d) = lim.check_n("k", cost) {
                    let _ = (d.remaining(), d.retry_after(), d.reset_after(), d.delay());
                }
                lim.refund("k", cost);
            }
            lim.evict_fresh();
        }
    }
    for_every_algorithm!(3, Duration::from_millis(30), test);
    for_every_algorithm!(1, Duration::from_secs(3600), test);
}
