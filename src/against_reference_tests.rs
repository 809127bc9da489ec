//! Property tests: the engine decides exactly as the reference model of SPEC.md
//! (`tests/support/reference.rs`), decision by decision and figure by figure (`allowed`, `limit`,
//! `remaining`, `retry_after`, `reset_after`, `delay`), on random traces: random quotas, a few
//! keys, bursts at one instant, steps inside and across windows, big idle jumps, costs from 0 to
//! past the capacity, peeks and refunds interleaved.
//!
//! Two layers are checked: (a) the pure rules (`WordRule::decide` on a `u64`, `SlidingLog::decide`
//! on a `Ring`), and (b) the stored limiters (`KeyedLimiter`, `Limiter`) on a `ManualClock`,
//! where the clock may also go backwards (the limiter clamps it, SPEC "time never goes back").
//!
//! `PROPTEST_CASES` raises the case count for a longer run.

#[path = "../tests/support/reference.rs"]
#[allow(dead_code)]
mod reference;

use std::collections::HashMap;
use std::time::Duration;

use crate::algorithm::sliding_log::Ring;
use crate::algorithm::WordRule;
use crate::clock::ManualClock;
use crate::{
    Algorithm, Decision, FixedWindow, Gcra, KeyedLimiter, LeakyQueue, LimitError, Limiter, Quota,
    QuotaError, SlidingLog, SlidingWindow,
};
use proptest::prelude::*;

use reference::{Algo, Model, Monotonic, Outcome, RefError};

const MS: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Generation
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gcra,
    LeakyQueue,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

/// A quota: `limit` per `window` ns, with an optional burst (GCRA and leaky only).
#[derive(Debug, Clone, Copy)]
struct Params {
    kind: Kind,
    limit: u64,
    window: u64,
    burst: Option<u64>,
}

impl Params {
    fn quota(&self) -> Quota {
        let q = Quota::new(self.limit, Duration::from_nanos(self.window)).unwrap();
        match self.burst {
            Some(b) => q.with_burst(b).unwrap(),
            None => q,
        }
    }

    fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// The reference algorithm; `tick` for the sliding log (1 = the SPEC's exact log).
    fn algo(&self, tick: u64) -> Algo {
        let (limit, window) = (self.limit, self.window);
        match self.kind {
            Kind::Gcra => Algo::Gcra {
                limit,
                window,
                burst: self.capacity(),
            },
            Kind::LeakyQueue => Algo::LeakyQueue {
                limit,
                window,
                capacity: self.capacity(),
            },
            Kind::FixedWindow => Algo::FixedWindow { limit, window },
            Kind::SlidingWindow => Algo::SlidingWindow { limit, window },
            Kind::SlidingLog => Algo::SlidingLog {
                limit,
                window,
                tick,
            },
        }
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Gcra),
        Just(Kind::LeakyQueue),
        Just(Kind::FixedWindow),
        Just(Kind::SlidingWindow),
        Just(Kind::SlidingLog),
    ]
}

fn limit() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 1..=12u64, 1 => 13..=300u64]
}

/// Windows from 1 ms to 10 s: odd values (so `W / L` is rarely whole) and round ones.
fn window_ms_up() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => MS..=10_000 * MS,
        1 => MS..=20 * MS,
        1 => prop::sample::select(vec![MS, 10 * MS, 60 * MS, 250 * MS, 1_000 * MS, 10_000 * MS]),
    ]
}

/// Random quotas: small limits, windows from 1 ms to 10 s, bursts; GCRA also with intervals
/// `W / L` of a few nanoseconds.
fn params() -> impl Strategy<Value = Params> {
    (
        kind(),
        limit(),
        window_ms_up(),
        1..=1_000u64,
        any::<bool>(),
        1..=40u64,
    )
        .prop_map(|(kind, limit, window, tiny, long, burst)| {
            let gcra = matches!(kind, Kind::Gcra | Kind::LeakyQueue);
            // GCRA takes any positive window: sometimes a few ns per unit.
            let window = if gcra && !long {
                limit + tiny % (limit * 1_000)
            } else {
                window
            };
            let burst = (gcra && burst % 2 == 0).then_some(burst / 2 + (burst % 3) * limit);
            Params {
                kind,
                limit,
                window,
                burst,
            }
        })
}

/// How the clock moves before an operation, decoded against the window at run time.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// The same instant (bursts).
    Same,
    /// A few nanoseconds.
    Tiny(u64),
    /// Up to a quarter window.
    Small(u64),
    /// About one window, either side.
    AboutWindow(u64),
    /// An idle gap of up to 1000 windows.
    Jump(u64),
    /// The clock reads earlier by up to two windows (stored-limiter traces only; a no-op for
    /// the pure rules, which are defined for non-decreasing times).
    Back(u64),
    /// An idle gap of about a multiple of 2^21 windows, give or take a few: across the window
    /// counters' index horizon, where stored indices wrap (2^23 windows for the sliding
    /// counter; the limiter re-anchors them). Stored-limiter traces only: the pure rules
    /// document that they read states more than 2^23 − 16 windows old as recent ones.
    Wrap(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Same),
        2 => any::<u64>().prop_map(Step::Tiny),
        6 => any::<u64>().prop_map(Step::Small),
        3 => any::<u64>().prop_map(Step::AboutWindow),
        1 => any::<u64>().prop_map(Step::Jump),
        1 => any::<u64>().prop_map(Step::Back),
        1 => any::<u64>().prop_map(Step::Wrap),
    ]
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Check,
    Peek,
    Refund,
    /// `set_quota` with a new limit (and burst) and the same window, decoded from the op's raw
    /// cost (stored-limiter traces only; a no-op for the pure rules).
    SetLimit,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    step: Step,
    action: Action,
    key: u8,
    /// Decoded against the capacity: mostly 1, often 0, else anything in `0..=capacity + 2`.
    cost: u64,
}

fn op() -> impl Strategy<Value = Op> {
    (
        step(),
        prop_oneof![
            16 => Just(Action::Check),
            4 => Just(Action::Peek),
            2 => Just(Action::Refund),
            1 => Just(Action::SetLimit),
        ],
        0..3u8,
        any::<u64>(),
    )
        .prop_map(|(step, action, key, cost)| Op {
            step,
            action,
            key,
            cost,
        })
}

fn trace() -> impl Strategy<Value = (u64, Vec<Op>)> {
    (any::<u64>(), prop::collection::vec(op(), 1..160))
}

fn decode_cost(raw: u64, capacity: u64) -> u64 {
    match raw % 8 {
        0..=3 => 1,
        4 => 0,
        _ => (raw / 8) % (capacity + 3),
    }
}

/// The next clock reading (below 2^61 ns). `stored`: a stored limiter's trace, whose clock may
/// go back and jump across the window counters' index horizon.
fn next_time(t: u64, step: Step, window: u64, stored: bool) -> u64 {
    let next = match step {
        Step::Same => t,
        Step::Tiny(x) => t + x % 5,
        Step::Small(x) => t + x % (window / 4 + 1),
        Step::AboutWindow(x) => t + window - window / 8 + x % (window / 4 + 1),
        Step::Jump(x) => t + (x % 1000 + 1) * window + x % window,
        Step::Back(x) if stored => t.saturating_sub(x % (2 * window + 1)),
        Step::Wrap(x) if stored => {
            let windows = (x % 8 + 1) * (1 << 21) + x / 8 % 41;
            (t + windows.saturating_mul(window)).saturating_sub(20 * window)
        }
        Step::Back(_) | Step::Wrap(_) => t,
    };
    next.min(TIME_CAP)
}

/// Times stay below 2^61 ns (73 years): the model knows no end of time, while the engine's
/// 64-bit states deny rather than overflow near 2^64 ns.
const TIME_CAP: u64 = 1 << 61;

/// Where a trace starts: anywhere in the first 10^5 windows (or the first 2^61 ns).
fn start_time(raw: u64, window: u64) -> u64 {
    raw % (100_000 * window).min(TIME_CAP)
}

fn cases() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(96);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

fn outcome(d: &Decision) -> Outcome {
    Outcome {
        allowed: d.allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        retry_after: d.retry_after_nanos() as u128,
        reset_after: d.reset_after_nanos() as u128,
        delay: d.delay_nanos() as u128,
    }
}

fn from_engine(r: Result<Decision, LimitError>) -> Result<Outcome, RefError> {
    match r {
        Ok(d) => Ok(outcome(&d)),
        Err(LimitError::CapacityExceeded { cost, capacity }) => {
            Err(RefError::CapacityExceeded { cost, capacity })
        }
        Err(e) => panic!("unexpected error {e:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// (a) The pure rules
// ---------------------------------------------------------------------------------------------

/// A pure rule over one key's state, as the tests drive it.
trait Pure {
    type State: Default;
    fn capacity(&self) -> u64;
    fn decide(&self, state: &mut Self::State, t: u64, cost: u64, commit: bool) -> Decision;
    fn refund(&self, state: &mut Self::State, t: u64, cost: u64);
    fn is_fresh(&self, state: &mut Self::State, t: u64) -> bool;
}

/// A `WordRule` on its `u64` state.
struct Word<R>(R, u64);

impl<R: WordRule> Pure for Word<R> {
    type State = u64;
    fn capacity(&self) -> u64 {
        self.1
    }
    fn decide(&self, state: &mut u64, t: u64, cost: u64, commit: bool) -> Decision {
        let (d, next) = self.0.decide(*state, t, cost);
        if !d.allowed() || cost == 0 {
            assert_eq!(next, *state, "a denied or free request changed the state");
        }
        if commit {
            *state = next;
        }
        d
    }
    fn refund(&self, state: &mut u64, t: u64, cost: u64) {
        *state = self.0.refunded(*state, t, cost);
    }
    fn is_fresh(&self, state: &mut u64, t: u64) -> bool {
        self.0.is_fresh(*state, t)
    }
}

impl Pure for SlidingLog {
    type State = Ring;
    fn capacity(&self) -> u64 {
        self.limit()
    }
    fn decide(&self, ring: &mut Ring, t: u64, cost: u64, commit: bool) -> Decision {
        let before = ring.len();
        let d = SlidingLog::decide(self, ring, t, cost, commit);
        if !commit || !d.allowed() {
            assert!(ring.len() <= before, "a peek or a denial added entries");
        }
        d
    }
    fn refund(&self, ring: &mut Ring, t: u64, cost: u64) {
        SlidingLog::refund(self, ring, t, cost)
    }
    fn is_fresh(&self, ring: &mut Ring, t: u64) -> bool {
        self.is_empty_at(ring, t)
    }
}

/// Runs `ops` on the pure rule and on the model, comparing every answer. Times never go back;
/// for the sliding log they are rounded up to `round_to` (its tick, so it is exact).
fn run_pure<P: Pure>(
    rule: &P,
    algo: Algo,
    start: u64,
    ops: &[Op],
    round_to: u64,
) -> Result<(), TestCaseError> {
    let window = algo.window();
    let capacity = rule.capacity();
    prop_assert_eq!(capacity, algo.capacity());
    let mut states: HashMap<u8, P::State> = HashMap::new();
    let mut model: Model<u8> = Model::new(algo);
    let mut t = start_time(start, window);
    for (i, op) in ops.iter().enumerate() {
        t = next_time(t, op.step, window, false).div_ceil(round_to) * round_to;
        let cost = decode_cost(op.cost, capacity);
        let state = states.entry(op.key).or_default();
        let tt = t as u128;
        match op.action {
            Action::Check | Action::Peek => {
                let commit = matches!(op.action, Action::Check);
                let expected = if commit {
                    model.check(&op.key, tt, cost)
                } else {
                    model.peek(&op.key, tt, cost)
                };
                match expected {
                    Err(RefError::CapacityExceeded { .. }) => prop_assert!(cost > capacity),
                    Ok(expected) => {
                        let actual = outcome(&rule.decide(state, t, cost, commit));
                        prop_assert_eq!(
                            actual,
                            expected,
                            "op {} {:?} key {} cost {} at t={}",
                            i,
                            op.action,
                            op.key,
                            cost,
                            t
                        );
                    }
                }
            }
            Action::Refund => {
                model.refund(&op.key, tt, cost);
                rule.refund(state, t, cost);
            }
            Action::SetLimit => {}
        }
        for (key, state) in states.iter_mut() {
            prop_assert_eq!(
                rule.is_fresh(state, t),
                model.is_fresh(key, tt),
                "is_fresh of key {} after op {} at t={}",
                key,
                i,
                t
            );
        }
    }
    Ok(())
}

fn check_pure(p: Params, start: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    fn word<R: Algorithm + WordRule>(
        new: fn(Quota) -> Result<R, QuotaError>,
        q: Quota,
        algo: Algo,
        start: u64,
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let r = new(q).unwrap();
        run_pure(&Word(r, r.capacity()), algo, start, ops, 1)
    }
    let (q, algo) = (p.quota(), p.algo(1));
    match p.kind {
        Kind::Gcra => word(Gcra::new, q, algo, start, ops),
        Kind::LeakyQueue => word(LeakyQueue::new, q, algo, start, ops),
        Kind::FixedWindow => word(FixedWindow::new, q, algo, start, ops),
        Kind::SlidingWindow => word(SlidingWindow::new, q, algo, start, ops),
        Kind::SlidingLog => {
            let r = SlidingLog::new(q).unwrap();
            // Times on the tick: the log is the SPEC's exact log.
            run_pure(&r, algo, start, ops, r.tick_nanos())
        }
    }
}

proptest! {
    #![proptest_config(cases())]

    /// Every pure rule decides as the SPEC, figure by figure.
    #[test]
    fn pure_rules_match_the_reference(p in params(), (start, ops) in trace()) {
        check_pure(p, start, &ops)?;
    }

    /// The sliding log at any nanosecond: entry times rounded up to the tick, as documented,
    /// and otherwise the SPEC's rule (the model stores rounded times too).
    #[test]
    fn sliding_log_rounds_times_up_to_its_tick(
        limit in limit(),
        window in prop_oneof![MS..=10_000 * MS, 2_200 * MS..=3_600_000 * MS],
        (start, ops) in trace(),
    ) {
        let p = Params { kind: Kind::SlidingLog, limit, window, burst: None };
        let r = SlidingLog::new(p.quota()).unwrap();
        run_pure(&r, p.algo(r.tick_nanos()), start, &ops, 1)?;
    }

    /// With times on the tick the log is exact even for long windows (coarse ticks).
    #[test]
    fn sliding_log_is_exact_on_its_tick_for_long_windows(
        limit in limit(),
        window in 2_200 * MS..=86_400_000 * MS,
        (start, ops) in trace(),
    ) {
        let p = Params { kind: Kind::SlidingLog, limit, window, burst: None };
        let r = SlidingLog::new(p.quota()).unwrap();
        run_pure(&r, p.algo(1), start, &ops, r.tick_nanos())?;
    }
}

/// Large limits, bursts and windows: the packed states' widths and 128-bit products.
fn large_params() -> impl Strategy<Value = Params> {
    (
        kind(),
        prop_oneof![1 => 1..=65_535u64, 1 => 65_536..=(1u64 << 20) - 1],
        prop_oneof![MS..=10_000 * MS, 10_000 * MS..=86_400_000 * MS],
        prop::option::of(1..=(1u64 << 20)),
    )
        .prop_map(|(kind, limit, window, burst)| {
            let gcra = matches!(kind, Kind::Gcra | Kind::LeakyQueue);
            // The log keeps one slot per unit (and the model one entry): keep it smaller.
            let limit = if kind == Kind::SlidingLog {
                limit % 4_096 + 1
            } else {
                limit
            };
            Params {
                kind,
                limit,
                window,
                burst: burst.filter(|_| gcra),
            }
        })
        .prop_filter("GCRA needs W / L ≥ 1 ns", |p| p.window >= p.limit)
}

fn short_trace() -> impl Strategy<Value = (u64, Vec<Op>)> {
    (any::<u64>(), prop::collection::vec(op(), 1..40))
}

proptest! {
    #![proptest_config(cases())]

    /// Large quotas decide as the SPEC too.
    #[test]
    fn large_quotas_match_the_reference(p in large_params(), (start, ops) in short_trace()) {
        check_pure(p, start, &ops)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (b) The stored limiters
// ---------------------------------------------------------------------------------------------

/// A limiter as the tests drive it: by key (a direct limiter ignores the key).
trait Stored {
    fn check(&self, key: u8, cost: u64) -> Result<Decision, LimitError>;
    fn peek(&self, key: u8, cost: u64) -> Result<Decision, LimitError>;
    fn refund(&self, key: u8, cost: u64);
    fn set_quota(&self, quota: Quota);
    /// Keys held, where the limiter counts them.
    fn len(&self) -> Option<usize>;
}

type Make<A> = fn(Quota) -> Result<A, QuotaError>;

struct Keyed<A: Algorithm>(KeyedLimiter<u8, A, ManualClock>, Make<A>);
struct Direct<A: Algorithm>(Limiter<A, ManualClock>, Make<A>);

impl<A: Algorithm> Stored for Keyed<A> {
    fn check(&self, key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.0.check_n(&key, cost)
    }
    fn peek(&self, key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.0.peek(&key, cost)
    }
    fn refund(&self, key: u8, cost: u64) {
        self.0.refund(&key, cost)
    }
    fn set_quota(&self, quota: Quota) {
        self.0.set_quota((self.1)(quota).unwrap()).unwrap()
    }
    fn len(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

impl<A: Algorithm> Stored for Direct<A> {
    fn check(&self, _key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.0.check_n(cost)
    }
    fn peek(&self, _key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.0.peek(cost)
    }
    fn refund(&self, _key: u8, cost: u64) {
        self.0.refund(cost)
    }
    fn set_quota(&self, quota: Quota) {
        self.0.set_quota((self.1)(quota).unwrap()).unwrap()
    }
    fn len(&self) -> Option<usize> {
        None
    }
}

/// `algo` with a new limit (and, for GCRA and leaky, burst), decoded from `raw`; same window.
fn new_limit(algo: Algo, raw: u64) -> (Algo, Quota) {
    let window = algo.window();
    // GCRA needs W / L ≥ 1 ns.
    let limit = 1 + raw % 20.min(window);
    let burst = (raw / 32) % 3;
    let burst = (burst > 0).then_some(burst * ((raw / 128) % 10 + 1));
    let quota = Quota::new(limit, Duration::from_nanos(window)).unwrap();
    match algo {
        Algo::Gcra { .. } => (
            Algo::Gcra {
                limit,
                window,
                burst: burst.unwrap_or(limit),
            },
            burst.map_or(quota, |b| quota.with_burst(b).unwrap()),
        ),
        Algo::LeakyQueue { .. } => (
            Algo::LeakyQueue {
                limit,
                window,
                capacity: burst.unwrap_or(limit),
            },
            burst.map_or(quota, |b| quota.with_burst(b).unwrap()),
        ),
        Algo::FixedWindow { .. } => (Algo::FixedWindow { limit, window }, quota),
        Algo::SlidingWindow { .. } => (Algo::SlidingWindow { limit, window }, quota),
        Algo::SlidingLog { tick, .. } => (
            Algo::SlidingLog {
                limit,
                window,
                tick,
            },
            quota,
        ),
    }
}

/// Runs `ops` on a stored limiter driven by `clock` and on the model. The clock may go back: the
/// model is handed the clamped time, as SPEC says ("a reading older than the newest one seen is
/// treated as the newest one"). A limiter reads its clock on every call, errors and refunds of
/// unknown keys included.
fn run_stored(
    limiter: &dyn Stored,
    clock: &ManualClock,
    algo: Algo,
    start: u64,
    ops: &[Op],
    round_to: u64,
    keyed: bool,
) -> Result<(), TestCaseError> {
    let window = algo.window();
    let mut model: Model<u8> = Model::new(algo);
    let mut seen = Monotonic::default();
    let mut reading = start_time(start, window).div_ceil(round_to) * round_to;
    // Sweeps run when the window counters re-anchor their indices: keys may then be evicted.
    let mut swept = false;
    for (i, op) in ops.iter().enumerate() {
        swept |= matches!(op.step, Step::Wrap(_));
        reading = next_time(reading, op.step, window, true).div_ceil(round_to) * round_to;
        clock.set(reading);
        let key = if keyed { op.key } else { 0 };
        let cost = decode_cost(op.cost, model.algo.capacity());
        match op.action {
            Action::Check | Action::Peek => {
                let commit = matches!(op.action, Action::Check);
                let t = seen.see(reading as u128);
                let (expected, actual) = if commit {
                    (model.check(&key, t, cost), limiter.check(key, cost))
                } else {
                    (model.peek(&key, t, cost), limiter.peek(key, cost))
                };
                prop_assert_eq!(
                    from_engine(actual),
                    expected,
                    "op {} {:?} key {} cost {} clock {} (newest {})",
                    i,
                    op.action,
                    key,
                    cost,
                    reading,
                    seen.newest()
                );
            }
            Action::Refund => {
                let t = seen.see(reading as u128);
                model.refund(&key, t, cost);
                limiter.refund(key, cost);
            }
            Action::SetLimit => {
                // The limiter reads its clock to re-anchor the quota: that reading is seen.
                seen.see(reading as u128);
                let (algo, quota) = new_limit(model.algo, op.cost);
                limiter.set_quota(quota);
                model.algo = algo;
            }
        }
        if let Some(len) = limiter.len() {
            if swept {
                // Only fresh keys are evicted, and a later check inserts them again.
                prop_assert!(len <= model.keys.len(), "keys held after op {}", i);
            } else {
                // Few keys: no sweep runs, so the limiter holds every key it has checked.
                prop_assert_eq!(len, model.keys.len(), "keys held after op {}", i);
            }
        }
    }
    Ok(())
}

fn check_stored(p: Params, start: u64, ops: &[Op], keyed: bool) -> Result<(), TestCaseError> {
    fn go<A: Algorithm>(
        make: Make<A>,
        quota: Quota,
        algo: Algo,
        start: u64,
        ops: &[Op],
        keyed: bool,
    ) -> Result<(), TestCaseError> {
        let rule = make(quota).unwrap();
        let clock = ManualClock::new();
        // The sliding log is exact for times on its tick; the others take any nanosecond.
        let round_to = match algo {
            Algo::SlidingLog { .. } => SlidingLog::new(quota).unwrap().tick_nanos(),
            _ => 1,
        };
        if keyed {
            let limiter = KeyedLimiter::<u8, A, ManualClock>::with_clock(rule, clock.clone())
                .expect("a 1 ns clock serves every generated quota");
            run_stored(
                &Keyed(limiter, make),
                &clock,
                algo,
                start,
                ops,
                round_to,
                true,
            )
        } else {
            let limiter = Limiter::with_clock(rule, clock.clone())
                .expect("a 1 ns clock serves every generated quota");
            run_stored(
                &Direct(limiter, make),
                &clock,
                algo,
                start,
                ops,
                round_to,
                false,
            )
        }
    }
    let (q, algo) = (p.quota(), p.algo(1));
    match p.kind {
        Kind::Gcra => go(Gcra::new, q, algo, start, ops, keyed),
        Kind::LeakyQueue => go(LeakyQueue::new, q, algo, start, ops, keyed),
        Kind::FixedWindow => go(FixedWindow::new, q, algo, start, ops, keyed),
        Kind::SlidingWindow => go(SlidingWindow::new, q, algo, start, ops, keyed),
        Kind::SlidingLog => go(SlidingLog::new, q, algo, start, ops, keyed),
    }
}

proptest! {
    #![proptest_config(cases())]

    /// `KeyedLimiter` on a manual clock decides as the SPEC, key by key.
    #[test]
    fn keyed_limiter_matches_the_reference(p in params(), (start, ops) in trace()) {
        check_stored(p, start, &ops, true)?;
    }

    /// `Limiter` (one state) on a manual clock decides as the SPEC.
    #[test]
    fn direct_limiter_matches_the_reference(p in params(), (start, ops) in trace()) {
        check_stored(p, start, &ops, false)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: cases found by the properties above, kept as plain tests.
// ---------------------------------------------------------------------------------------------
