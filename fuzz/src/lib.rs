//! The fuzz targets' logic, kept out of the `fuzz_targets/` stubs so a plain `#[test]` in the
//! main crate (`tests/fuzz_corpus.rs`) can replay the committed corpus without cargo-fuzz.
//!
//! - `gcra`, `leaky_queue`, `fixed_window`, `sliding_window`, `sliding_log`: differential. An
//!   arbitrary sequence of operations (move the clock — forwards by any amount, or backwards —,
//!   check, check_n, peek, refund, set_quota, reserve, on a few keys) runs against the real
//!   keyed limiter and against the plain reference model of SPEC.md
//!   (`tests/support/reference.rs`); every decision and every figure must be equal.
//! - `construction`: quotas and limiters from arbitrary numbers: a typed error or a working
//!   limiter, never a panic or an overflow, whatever is then asked of it; the one-word rules'
//!   pure functions too, on any state, time and cost.
//! - `replay_parser`: arbitrary bytes as a trace: parsed, replayed, never a panic.
//! - `in_flight`: `InFlight` under arbitrary acquires (any cost), releases in any order,
//!   sweeps and a `max_keys` bound, against a map of counts: every admission and refusal as
//!   the map says, no count above `N`, every count back to 0 once the permits are gone.
//! - `in_flight_wait`: `InFlight` with waiters (`acquire`, feature `tokio`) against a model
//!   of its queues (`in_flight_wait.rs`).
//! - `client_ip`, `config`: the tower layer's forwarding-header parsing and configuration
//!   parser (`tower.rs`; features `tower` and `serde`, on by default here).

#![allow(clippy::new_without_default)]

#[path = "../../tests/support/reference.rs"]
#[allow(dead_code, unreachable_pub)]
pub mod reference;

#[cfg(all(feature = "tower", feature = "serde"))]
#[path = "tower.rs"]
pub mod tower;

#[cfg(feature = "tokio")]
#[path = "in_flight_wait.rs"]
pub mod in_flight_wait;

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use reference::{Algo, Model, Monotonic, Outcome};
#[cfg(fuzzing)]
use tollgate::algorithm::WordRule;
use tollgate::clock::ManualClock;
use tollgate::Algorithm;
use tollgate::{
    Decision, FixedWindow, Gcra, KeyedLimiter, LeakyQueue, LimitError, Quota, SlidingLog,
    SlidingWindow,
};

/// Prints what target `name` makes of `data` (for `cargo run --example show`).
pub fn show(name: &str, data: &[u8]) {
    let input = Unstructured::new(data);
    match name {
        "construction" => println!("{:#?}", Construction::arbitrary_take_rest(input)),
        "replay_parser" => println!("{:?}", String::from_utf8_lossy(data)),
        "in_flight" => println!("{:#?}", InFlightScenario::arbitrary_take_rest(input)),
        #[cfg(feature = "tokio")]
        "in_flight_wait" => println!(
            "{:#?}",
            in_flight_wait::WaitScenario::arbitrary_take_rest(input)
        ),
        #[cfg(all(feature = "tower", feature = "serde"))]
        "client_ip" => tower::show_client_ip(data),
        #[cfg(all(feature = "tower", feature = "serde"))]
        "config" => println!("{:?}", String::from_utf8_lossy(data)),
        _ => println!("{:#?}", Scenario::arbitrary_take_rest(input)),
    }
}

/// Runs target `name` on `data`.
pub fn run(name: &str, data: &[u8]) {
    let mut input = Unstructured::new(data);
    match name {
        "gcra" | "leaky_queue" | "fixed_window" | "sliding_window" | "sliding_log" => {
            if let Ok(scenario) = Scenario::arbitrary_take_rest(input) {
                differential(name, &scenario);
            }
        }
        "construction" => {
            if let Ok(c) = Construction::arbitrary(&mut input) {
                construction(&c);
            }
        }
        "replay_parser" => replay_parser(data),
        "in_flight" => {
            if let Ok(scenario) = InFlightScenario::arbitrary_take_rest(input) {
                in_flight(&scenario);
            }
        }
        #[cfg(feature = "tokio")]
        "in_flight_wait" => {
            if let Ok(scenario) = in_flight_wait::WaitScenario::arbitrary_take_rest(input) {
                in_flight_wait::in_flight_wait(&scenario);
            }
        }
        // Built without waiting: nothing to run (the corpus test lists every target).
        #[cfg(not(feature = "tokio"))]
        "in_flight_wait" => {}
        #[cfg(all(feature = "tower", feature = "serde"))]
        "client_ip" => tower::client_ip(data),
        #[cfg(all(feature = "tower", feature = "serde"))]
        "config" => tower::config(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

/// The targets, for the corpus replay test.
#[cfg(not(all(feature = "tower", feature = "serde")))]
pub const TARGETS: &[&str] = &[
    "gcra",
    "leaky_queue",
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "construction",
    "replay_parser",
    "in_flight",
    "in_flight_wait",
];

/// The targets, for the corpus replay test (with the tower layer's: `client_ip`, `config`).
#[cfg(all(feature = "tower", feature = "serde"))]
pub const TARGETS: &[&str] = &[
    "gcra",
    "leaky_queue",
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "construction",
    "replay_parser",
    "in_flight",
    "in_flight_wait",
    "client_ip",
    "config",
];

/// Times stay below 2^62 ns (146 years) in the differential targets: the reference model
/// counts in 128 bits and knows no end of time, while the engine refuses to admit where its
/// 64-bit state would overflow (the `construction` target and the hostile-input tests cover
/// that end).
const TIME_CAP: u64 = 1 << 62;

#[derive(Debug, Arbitrary)]
struct Params {
    limit: u16,
    window_ms: u16,
    window_extra_ns: u32,
    burst: Option<u16>,
    /// All 256 keys (instead of 4) on a limiter that evicts above one key: its tables are
    /// replaced and drained all along, so decisions meet moved, evicted and revived cells.
    churn: bool,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// Forward by up to ~4.3 s in ns.
    Advance(u32),
    /// Forward by any amount (capped).
    Jump(u64),
    /// Set the clock to any time, possibly earlier (the limiter must clamp).
    Set(u64),
    Check(u8),
    CheckN(u8, u64),
    Peek(u8, u64),
    Refund(u8, u64),
    /// A reservation (GCRA's `reserve`; the other rules reserve as they check).
    Reserve(u8, u64),
    /// New limit (and burst) on the live limiter; the window stays.
    SetLimit(u16, Option<u16>),
}

#[derive(Debug, Arbitrary)]
struct Scenario {
    params: Params,
    ops: Vec<Op>,
}

/// A keyed limiter of any algorithm, behind one interface.
trait Subject {
    fn check_n(&self, key: u8, cost: u64) -> Result<Decision, LimitError>;
    fn peek(&self, key: u8, cost: u64) -> Result<Decision, LimitError>;
    fn refund(&self, key: u8, cost: u64);
    fn reserve(&self, key: u8, cost: u64) -> Result<Decision, LimitError>;
    /// `false` if the engine refused the new quota.
    fn set_limit(&self, limit: u64, burst: Option<u64>) -> bool;
}

/// A rule's reservation on the engine (GCRA's `reserve`, the leaky queue's, else `check_n`).
type Reserve<A> = fn(&KeyedLimiter<u8, A, ManualClock>, u8, u64) -> Result<Decision, LimitError>;

struct Engine<A: Algorithm> {
    limiter: KeyedLimiter<u8, A, ManualClock>,
    make: fn(Quota) -> Result<A, tollgate::QuotaError>,
    /// The rule's reservation: GCRA's `reserve`, else `check_n`.
    reserve: Reserve<A>,
    window: Duration,
}

impl<A: Algorithm> Subject for Engine<A> {
    fn check_n(&self, key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.limiter.check_n(&key, cost)
    }
    fn peek(&self, key: u8, cost: u64) -> Result<Decision, LimitError> {
        self.limiter.peek(&key, cost)
    }
    fn refund(&self, key: u8, cost: u64) {
        self.limiter.refund(&key, cost)
    }
    fn reserve(&self, key: u8, cost: u64) -> Result<Decision, LimitError> {
        (self.reserve)(&self.limiter, key, cost)
    }
    fn set_limit(&self, limit: u64, burst: Option<u64>) -> bool {
        let quota =
            Quota::new(limit, self.window).and_then(|q| burst.map_or(Ok(q), |b| q.with_burst(b)));
        match quota.and_then(self.make) {
            Ok(rule) => self.limiter.set_quota(rule).is_ok(),
            Err(_) => false,
        }
    }
}

fn engine<A: Algorithm>(
    make: fn(Quota) -> Result<A, tollgate::QuotaError>,
    reserve: Reserve<A>,
    quota: Quota,
    clock: &ManualClock,
    churn: bool,
) -> Option<(Box<dyn Subject>, A)> {
    let rule = make(quota).ok()?;
    let builder = KeyedLimiter::builder(rule).clock(clock.clone());
    let limiter = if churn {
        builder.evict_above(1)
    } else {
        builder
    }
    .build()
    .ok()?;
    Some((
        Box::new(Engine {
            limiter,
            make,
            reserve,
            window: quota.window(),
        }),
        rule,
    ))
}

/// The reference model's parameters for the engine's rule.
fn algo(name: &str, limit: u64, window: u64, burst: u64, tick: u64) -> Algo {
    match name {
        "gcra" => Algo::Gcra {
            limit,
            window,
            burst,
        },
        "leaky_queue" => Algo::LeakyQueue {
            limit,
            window,
            capacity: burst,
        },
        "fixed_window" => Algo::FixedWindow { limit, window },
        "sliding_window" => Algo::SlidingWindow { limit, window },
        _ => Algo::SlidingLog {
            limit,
            window,
            tick,
        },
    }
}

fn differential(name: &str, scenario: &Scenario) {
    let p = &scenario.params;
    let limit = u64::from(p.limit.max(1));
    let windowed = !matches!(name, "gcra" | "leaky_queue");
    // Windows need ≥ 1 ms; GCRA any positive window with W/L ≥ 1 ns.
    let window = u64::from(p.window_ms.max(1)) * 1_000_000 + u64::from(p.window_extra_ns);
    let burst = p.burst.filter(|_| !windowed).map(|b| u64::from(b.max(1)));
    let Ok(mut quota) = Quota::new(limit, Duration::from_nanos(window)) else {
        return;
    };
    if let Some(b) = burst {
        quota = quota.with_burst(b).expect("burst ≥ 1");
    }
    let clock = ManualClock::new();
    let churn = p.churn;
    let built = match name {
        "gcra" => {
            engine(Gcra::new, |l, k, c| l.reserve(&k, c), quota, &clock, churn).map(|(s, _)| (s, 0))
        }
        "leaky_queue" => engine(
            LeakyQueue::new,
            |l, k, c| l.reserve(&k, c),
            quota,
            &clock,
            churn,
        )
        .map(|(s, _)| (s, 0)),
        "fixed_window" => engine(
            FixedWindow::new,
            |l, k, c| l.check_n(&k, c),
            quota,
            &clock,
            churn,
        )
        .map(|(s, _)| (s, 0)),
        "sliding_window" => engine(
            SlidingWindow::new,
            |l, k, c| l.check_n(&k, c),
            quota,
            &clock,
            churn,
        )
        .map(|(s, _)| (s, 0)),
        _ => engine(
            SlidingLog::new,
            |l, k, c| l.check_n(&k, c),
            quota,
            &clock,
            churn,
        )
        .map(|(s, r)| (s, r.tick_nanos())),
    };
    let pick = |key: u8| if churn { key } else { key % 4 };
    let Some((subject, tick)) = built else {
        return;
    };
    let mut model: Model<u8> = Model::new(algo(name, limit, window, quota.burst(), tick));
    let mut time = Monotonic::default();
    let mut raw: u64 = 0;
    for op in scenario.ops.iter().take(256) {
        match *op {
            Op::Advance(ns) => raw = raw.saturating_add(u64::from(ns)).min(TIME_CAP),
            Op::Jump(ns) => raw = raw.saturating_add(ns).min(TIME_CAP),
            Op::Set(ns) => raw = ns.min(TIME_CAP),
            _ => {}
        }
        clock.set(raw);
        let t = u128::from(raw);
        match *op {
            Op::Advance(_) | Op::Jump(_) | Op::Set(_) => {}
            Op::Check(key) => {
                let t = time.see(t);
                compare(
                    subject.check_n(pick(key), 1),
                    model.check(&(pick(key)), t, 1),
                    op,
                );
            }
            Op::CheckN(key, cost) => {
                let cost = cost % (model.algo.capacity() + 3);
                let t = time.see(t);
                compare(
                    subject.check_n(pick(key), cost),
                    model.check(&(pick(key)), t, cost),
                    op,
                );
            }
            Op::Peek(key, cost) => {
                let cost = cost % (model.algo.capacity() + 3);
                let t = time.see(t);
                compare(
                    subject.peek(pick(key), cost),
                    model.peek(&(pick(key)), t, cost),
                    op,
                );
            }
            Op::Reserve(key, cost) => {
                let cost = cost % (model.algo.capacity() + 3);
                let t = time.see(t);
                compare(
                    subject.reserve(pick(key), cost),
                    model.reserve(&pick(key), t, cost),
                    op,
                );
            }
            Op::Refund(key, cost) => {
                let t = time.see(t);
                subject.refund(pick(key), cost);
                model.refund(&(pick(key)), t, cost);
            }
            Op::SetLimit(new_limit, new_burst) => {
                let new_limit = u64::from(new_limit.max(1));
                let new_burst = new_burst.filter(|_| !windowed).map(|b| u64::from(b.max(1)));
                if subject.set_limit(new_limit, new_burst) {
                    // The engine read its clock to re-anchor the quota: that reading is seen.
                    time.see(t);
                    let algo = algo(
                        name,
                        new_limit,
                        window,
                        new_burst.unwrap_or(new_limit),
                        tick,
                    );
                    model.algo = algo;
                }
            }
        }
    }
}

fn compare(
    engine: Result<Decision, LimitError>,
    model: Result<Outcome, reference::RefError>,
    op: &Op,
) {
    match (engine, model) {
        (Ok(d), Ok(m)) => {
            let got = (
                d.allowed(),
                d.limit(),
                d.remaining(),
                u128::from(d.retry_after_nanos()),
                u128::from(d.reset_after_nanos()),
                u128::from(d.delay_nanos()),
            );
            let want = (
                m.allowed,
                m.limit,
                m.remaining,
                m.retry_after,
                m.reset_after,
                m.delay,
            );
            assert_eq!(got, want, "engine vs reference on {op:?}");
        }
        (Err(LimitError::CapacityExceeded { .. }), Err(_)) => {}
        (engine, model) => panic!("engine {engine:?} vs reference {model:?} on {op:?}"),
    }
}

#[derive(Debug, Arbitrary)]
struct Construction {
    algorithm: u8,
    limit: u64,
    window_nanos: u64,
    burst: Option<u64>,
    coarse: bool,
    probes: Vec<(u64, u64)>,
}

fn construction(c: &Construction) {
    let quota = Quota::new(c.limit, Duration::from_nanos(c.window_nanos))
        .and_then(|q| c.burst.map_or(Ok(q), |b| q.with_burst(b)));
    let Ok(quota) = quota else {
        return;
    };
    match c.algorithm % 5 {
        0 => word_rule(Gcra::new(quota), c),
        1 => word_rule(LeakyQueue::new(quota), c),
        2 => word_rule(FixedWindow::new(quota), c),
        3 => word_rule(SlidingWindow::new(quota), c),
        _ => exercise(SlidingLog::new(quota), c),
    }
}

/// A one-word rule: as a limiter ([`exercise`]), and as a pure rule, which takes any state,
/// time and cost (no capacity check before it): a decision, never a panic or overflow. The
/// pure rules are crate-private but to fuzzing builds (`cargo fuzz` sets `cfg(fuzzing)`), so
/// the corpus replay (`tests/fuzz_corpus.rs`) runs the limiter part only.
#[cfg(fuzzing)]
fn word_rule<A: Algorithm + WordRule>(rule: Result<A, tollgate::QuotaError>, c: &Construction) {
    if let Ok(rule) = rule {
        let mut own = 0; // the states the rule itself produces, from fresh
        for &(t, cost) in c.probes.iter().take(64) {
            own = pure_decision(&rule, own, t, cost);
            pure_decision(&rule, t.rotate_left(29) ^ cost, t, cost); // an arbitrary word
        }
    }
    exercise(rule, c);
}

#[cfg(not(fuzzing))]
fn word_rule<A: Algorithm>(rule: Result<A, tollgate::QuotaError>, c: &Construction) {
    exercise(rule, c);
}

/// One call of each pure function on `state`; returns the next state.
#[cfg(fuzzing)]
fn pure_decision<R: Algorithm + WordRule>(rule: &R, state: u64, t: u64, cost: u64) -> u64 {
    let (d, next) = WordRule::decide(rule, state, t, cost);
    let _ = (d.remaining(), d.retry_after(), d.reset_after(), d.delay());
    if !d.allowed() || cost == 0 {
        assert_eq!(next, state, "denied or free, yet the state changed");
    }
    if cost > rule.capacity() {
        assert!(!d.allowed() && d.retry_after_nanos() == u64::MAX);
    }
    let _ = (
        WordRule::refunded(rule, state, t, cost),
        WordRule::is_fresh(rule, state, t),
    );
    next
}

fn exercise<A: Algorithm>(rule: Result<A, tollgate::QuotaError>, c: &Construction) {
    let Ok(rule) = rule else {
        return;
    };
    assert!(rule.capacity() >= 1 && rule.limit() >= 1);
    if c.coarse {
        // Either refused as too coarse or a working limiter; never a panic.
        let clock = tollgate::clock::CoarseClock::new();
        if let Ok(limiter) = tollgate::Limiter::with_clock(rule, clock) {
            let _ = limiter.check_n(1);
        }
    }
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u8, A, ManualClock>::with_clock(rule, clock.clone())
        .expect("the manual clock resolves 1 ns");
    // The same clients as `String` keys of each length a table keeps apart (inline in its own
    // slots, in each wider table, on the heap): every answer the same as the `u8` keys'.
    let texts = KeyedLimiter::<String, A, ManualClock>::with_clock(rule, clock.clone())
        .expect("the manual clock resolves 1 ns");
    let text = |key: u8| format!("{key}").repeat([10, 36, 60, 90][usize::from(key)]);
    let capacity = rule.capacity();
    let mut admitted_at_end = 0u64;
    for (i, &(t, cost)) in c.probes.iter().take(64).enumerate() {
        clock.set(t);
        let key = (i % 4) as u8;
        let (as_u8, as_text) = (
            limiter.check_n(&key, cost),
            texts.check_n(text(key).as_str(), cost),
        );
        assert_eq!(as_u8, as_text, "a text key decided otherwise");
        match as_u8 {
            Ok(d) => {
                let _ = (d.remaining(), d.retry_after(), d.reset_after(), d.delay());
                if d.allowed() && t == u64::MAX {
                    admitted_at_end = admitted_at_end.saturating_add(cost);
                }
            }
            Err(LimitError::CapacityExceeded { capacity: cap, .. }) => {
                assert!(cost > capacity && cap == capacity)
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert_eq!(
            limiter.peek(&key, cost),
            texts.peek(text(key).as_str(), cost)
        );
        limiter.refund(&key, cost);
        texts.refund(text(key).as_str(), cost);
    }
    let _ = admitted_at_end;
}

fn replay_parser(data: &[u8]) {
    use tollgate::replay::{Replayer, TraceReader};
    use tollgate::AlgorithmName;
    let (head, trace) = data.split_at(data.len().min(2));
    let algorithm = AlgorithmName::ALL[usize::from(head.first().copied().unwrap_or(0)) % 7];
    let limit = u64::from(head.get(1).copied().unwrap_or(1)) + 1;
    let Ok(mut replayer) = Replayer::new(algorithm, limit, Duration::from_millis(250), None) else {
        return;
    };
    let mut reader = TraceReader::new(trace);
    let mut last = 0;
    while let Some(request) = reader.next_request() {
        match request {
            Ok(request) => {
                assert!(request.t_ms >= last, "time went backwards unnoticed");
                last = request.t_ms;
                let _ = replayer.decide(&request).to_string();
            }
            Err(e) => {
                assert!(e.line >= 1 && !e.message.is_empty());
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
struct InFlightScenario {
    max: u8,
    /// `Some((keys, deny))`: at most `keys` keys, a new one beyond them refused (`deny`) or
    /// sharing one count with the others that did not fit.
    bound: Option<(u8, bool)>,
    ops: Vec<InFlightOp>,
}

#[derive(Debug, Arbitrary)]
enum InFlightOp {
    Acquire { key: u8, cost: u8 },
    Release { index: u8 },
    EvictIdle,
}

/// `InFlight` against a map of counts. Without a key bound every decision is the map's; with
/// one, keys beyond it are refused or share a count, so only the bound on each count and the
/// releases are checked.
fn in_flight(scenario: &InFlightScenario) {
    use std::collections::HashMap;
    use tollgate::{InFlight, OverflowPolicy};
    let max = u64::from(scenario.max);
    let limit = match scenario.bound {
        None => InFlight::<u8>::new(max),
        Some((keys, deny)) => {
            let policy = if deny {
                OverflowPolicy::Deny
            } else {
                OverflowPolicy::Shared
            };
            InFlight::<u8>::with_max_keys(max, usize::from(keys), policy)
        }
    };
    let Ok(limit) = limit else {
        assert_eq!(max, 0, "only N = 0 is refused");
        return;
    };
    let exact = scenario.bound.is_none();
    let mut held: HashMap<u8, u64> = HashMap::new();
    let mut permits = Vec::new();
    for op in &scenario.ops {
        match *op {
            InFlightOp::Acquire { key, cost } => {
                let cost = u64::from(cost);
                let before = held.get(&key).copied().unwrap_or(0);
                match limit.try_acquire_n(&key, cost) {
                    Err(LimitError::CapacityExceeded { .. }) => assert!(cost > max),
                    Err(LimitError::KeyTableFull { .. }) => {
                        assert!(matches!(scenario.bound, Some((_, true))));
                    }
                    Ok(Some(permit)) => {
                        if exact {
                            assert!(before + cost <= max, "admitted past N");
                            assert_eq!(permit.remaining(), max - before - cost);
                        }
                        *held.entry(key).or_default() += cost;
                        permits.push(permit);
                    }
                    Ok(None) => {
                        if exact {
                            assert!(before + cost > max, "refused below N");
                        }
                    }
                }
            }
            InFlightOp::Release { index } => {
                if !permits.is_empty() {
                    let permit = permits.swap_remove(usize::from(index) % permits.len());
                    *held.get_mut(permit.key()).expect("a held key") -= permit.cost();
                }
            }
            InFlightOp::EvictIdle => {
                limit.evict_idle();
            }
        }
        for (key, count) in &held {
            let seen = limit.in_flight(key);
            assert!(seen <= max, "key {key}: {seen} in flight, N = {max}");
            if exact {
                assert_eq!(seen, *count, "key {key}");
            }
        }
    }
    drop(permits);
    for key in held.keys() {
        assert_eq!(limit.in_flight(key), 0, "key {key}: a release lost");
    }
}
