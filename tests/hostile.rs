//! Hostile inputs: clocks that go backwards, jump by years or sit at the end of the u64
//! nanosecond range; costs near `u64::MAX`; limits at the edges of each packed layout. No
//! panic, and never more admissions than the SPEC allows.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{
    Algorithm, FixedWindow, Gcra, KeyedLimiter, LeakyQueue, LimitError, Limiter, Quota, SlidingLog,
    SlidingWindow,
};

const SEC: u64 = 1_000_000_000;
const YEAR: u64 = 365 * 24 * 3600 * SEC;

fn rules(
    limit: u64,
    window: Duration,
) -> (Gcra, LeakyQueue, FixedWindow, SlidingWindow, SlidingLog) {
    let q = Quota::new(limit, window).unwrap();
    (
        Gcra::new(q).unwrap(),
        LeakyQueue::new(q).unwrap(),
        FixedWindow::new(q).unwrap(),
        SlidingWindow::new(q).unwrap(),
        SlidingLog::new(q).unwrap(),
    )
}

/// Every algorithm, as `f(rule)`.
fn each(limit: u64, window: Duration, mut f: impl FnMut(&dyn Fn() -> Box<dyn Probe>)) {
    let (g, l, fw, sw, sl) = rules(limit, window);
    f(&move || Box::new(probe(g)));
    f(&move || Box::new(probe(l)));
    f(&move || Box::new(probe(fw)));
    f(&move || Box::new(probe(sw)));
    f(&move || Box::new(probe(sl)));
}

trait Probe {
    fn name(&self) -> &'static str;
    fn clock(&self) -> &ManualClock;
    fn check_n(&self, cost: u64) -> Result<bool, LimitError>;
}

struct P<A: Algorithm> {
    limiter: Limiter<A, ManualClock>,
}

fn probe<A: Algorithm>(rule: A) -> P<A> {
    P {
        limiter: Limiter::with_clock(rule, ManualClock::new()).unwrap(),
    }
}

impl<A: Algorithm> Probe for P<A> {
    fn name(&self) -> &'static str {
        A::NAME
    }
    fn clock(&self) -> &ManualClock {
        self.limiter.clock()
    }
    fn check_n(&self, cost: u64) -> Result<bool, LimitError> {
        self.limiter.check_n(cost).map(|d| {
            // Every figure is computable on any state.
            let _ = (d.remaining(), d.retry_after(), d.reset_after(), d.delay());
            d.allowed()
        })
    }
}

/// Admissions of cost 1 until the first denial (bounded).
fn drain(p: &dyn Probe) -> u64 {
    (0..1_000).take_while(|_| p.check_n(1).unwrap()).count() as u64
}

#[test]
fn a_clock_going_backwards_is_clamped_never_a_fresh_quota() {
    each(5, Duration::from_secs(10), |make| {
        let p = make();
        p.clock().set(100 * SEC);
        assert_eq!(drain(&*p), 5, "{}", p.name());
        // Back by a window and more: still the newest reading (100 s), still exhausted.
        for back in [99 * SEC, 90 * SEC, 50 * SEC, 0] {
            p.clock().set(back);
            assert!(
                !p.check_n(1).unwrap(),
                "{} after going back to {back}",
                p.name()
            );
        }
    });
}

#[test]
fn jumps_by_years_give_exactly_one_fresh_quota() {
    each(5, Duration::from_secs(10), |make| {
        let p = make();
        assert_eq!(drain(&*p), 5, "{}", p.name());
        for years in [1, 10, 100, 500] {
            p.clock().set(years * YEAR);
            assert_eq!(drain(&*p), 5, "{} after {years} years", p.name());
        }
    });
}

#[test]
fn the_end_of_the_nanosecond_range_never_panics_nor_over_admits() {
    each(5, Duration::from_secs(10), |make| {
        let p = make();
        for t in [u64::MAX - 10 * SEC, u64::MAX - 1, u64::MAX] {
            p.clock().set(t);
            // At most one quota's worth at any one instant.
            assert!(drain(&*p) <= 5, "{} at {t}", p.name());
        }
        p.clock().set(u64::MAX);
        assert!(
            !p.check_n(1).unwrap(),
            "{} after draining at the end",
            p.name()
        );
    });
}

#[test]
fn costs_near_u64_max_are_errors_that_change_nothing() {
    each(5, Duration::from_secs(1), |make| {
        let p = make();
        p.clock().set(SEC);
        for cost in [6, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            match p.check_n(cost) {
                Err(LimitError::CapacityExceeded { cost: c, capacity }) => {
                    assert_eq!((c, capacity), (cost, 5), "{}", p.name())
                }
                other => panic!("{}: cost {cost} gave {other:?}", p.name()),
            }
        }
        assert_eq!(drain(&*p), 5, "{}: errors consumed something", p.name());
    });
}

/// Admits `cost = L` once on a fresh key, then nothing more in the same instant.
fn full_quota_at_once<A: Algorithm>(rule: A) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u8, A, ManualClock>::with_clock(rule, clock.clone()).unwrap();
    clock.set(3 * SEC);
    let capacity = rule.capacity();
    let d = limiter.check_n(&1, capacity).unwrap();
    assert!(d.allowed(), "{} cost {capacity}", A::NAME);
    assert_eq!(d.remaining(), 0, "{}", A::NAME);
    assert!(!limiter.check(&1).unwrap().allowed(), "{}", A::NAME);
    assert!(matches!(
        limiter.check_n(&1, capacity + 1),
        Err(LimitError::CapacityExceeded { .. })
    ));
}

#[test]
fn limits_at_the_edges_of_each_packed_layout() {
    let second = Duration::from_secs(1);
    full_quota_at_once(
        FixedWindow::new(Quota::new(FixedWindow::MAX_LIMIT, second).unwrap()).unwrap(),
    );
    full_quota_at_once(
        SlidingWindow::new(Quota::new(SlidingWindow::MAX_LIMIT, second).unwrap()).unwrap(),
    );
    full_quota_at_once(
        SlidingLog::new(Quota::new(SlidingLog::MAX_LIMIT, second).unwrap()).unwrap(),
    );
    // GCRA: W/L = 1 ns exactly, and a span of 2^62 ns exactly.
    full_quota_at_once(
        Gcra::new(Quota::new(1 << 20, Duration::from_nanos(1 << 20)).unwrap()).unwrap(),
    );
    let span = Quota::new(1, Duration::from_nanos(1 << 42))
        .unwrap()
        .with_burst(1 << 20)
        .unwrap();
    full_quota_at_once(Gcra::new(span).unwrap());
    // One past each edge is a typed error.
    for limit in [FixedWindow::MAX_LIMIT + 1, u64::MAX] {
        assert!(FixedWindow::new(Quota::new(limit, second).unwrap()).is_err());
    }
    for limit in [SlidingWindow::MAX_LIMIT + 1, u64::MAX] {
        assert!(SlidingWindow::new(Quota::new(limit, second).unwrap()).is_err());
    }
    for limit in [SlidingLog::MAX_LIMIT + 1, u64::MAX] {
        assert!(SlidingLog::new(Quota::new(limit, second).unwrap()).is_err());
    }
    assert!(Gcra::new(span.with_burst((1 << 20) + 1).unwrap()).is_err());
    assert!(Gcra::new(Quota::new(u64::MAX, Duration::from_nanos(u64::MAX)).unwrap()).is_err());
}
