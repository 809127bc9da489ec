//! Exactness under contention, made deterministic: many threads (more than the machine has
//! cores) check one key on a `ManualClock` frozen for the round, each until its first denial.
//! With the clock frozen a key's room only shrinks, so the round's total is fixed by the rules:
//! it must equal, to the unit, what the same requests admit one at a time from the same state at
//! the same instant. More would be a unit decided twice; less, a denial while room remained
//! (a CAS that gave up, a state lost in a table move). Each expected total comes from a
//! single-threaded twin limiter fed the same cost sequences, and the twin must agree with the
//! SPEC model of `tests/support/reference.rs`; after each round the clock moves by a fraction
//! of the rule's span (none, a sliver, part, all, more) and the next round starts.
//!
//! What each test asserts, every round:
//! - `*_one_key_*` (GCRA, leaky bucket, leaky queue, fixed window, sliding window, sliding log;
//!   direct `Limiter` and `KeyedLimiter`): 8 threads, rounds of cost 1, 2 or 3 each, or mixed
//!   (cost-1 threads beside threads alternating 2 and 3, so that costs that no longer fit are
//!   refused while smaller ones still pass). The total equals the twin's and the model's; the
//!   limiter's state afterwards (`remaining`, `reset_after` of a cost-0 peek) equals the twin's;
//!   no check started after a denial of cost `c` returned is admitted at a cost `≥ c` (so a
//!   spurious denial is caught even when other threads drain the key afterwards); every denial
//!   reports `remaining < cost`.
//! - `multi_limiter_*`: a `MultiLimiter` of two quotas on one key, rounds of one cost each,
//!   the total equal to the sequential all-or-nothing one. (Not the denial-order check: a
//!   refused request's charge, refunded a moment later, may refuse a concurrent one by design.
//!   Nor mixed costs, for the same reason: the total then depends on the interleaving.)
//! - `hot_keys_beside_a_flood_*`: 4 threads check 8 hot keys (each until denial, per key; cost
//!   1, 2 or 3 a round) while 2 threads insert unique fresh keys (cost 0, some cost 1) until
//!   the hot threads are done, so shard tables fill, are replaced and drained during rounds.
//!   Every hot key gets exactly the twin's amount and ends in the twin's state; the same
//!   denial checks per key. Growing tables (default `evict_above`): the limiter holds every key
//!   checked, none lost or doubled. `evict_above(64)`: fresh keys are evicted, some were.
//!   `max_keys(256, Deny)`: the hot keys hold state at every round's start (checked on the
//!   model), so they must never be refused `KeyTableFull`; flood keys are, and the bound holds.
//!   (The fixed window is left out of that one: every key is fresh at a window's start, so a
//!   hot key could rightly find the table full of flood keys.)
//!
//! Nothing here depends on speed: no timing, only counts (the flood's length varies with the
//! machine; what is asserted does not).
//! Run: `cargo test --all-features --test exactness_stress` (seconds in debug).

#[path = "support/reference.rs"]
#[allow(dead_code)]
mod reference;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use reference::{Algo, Model};
use tollgate::clock::{Clock, ManualClock};
use tollgate::{
    Algorithm, Decision, FixedWindow, Gcra, KeyedLimiter, LeakyBucket, LeakyQueue, LimitError,
    Limiter, MultiLimiter, OverflowPolicy, Quota, SlidingLog, SlidingWindow,
};

/// Four times the two cores CI has: threads are preempted mid-check.
const THREADS: usize = 8;
const ROUNDS: usize = 48;
const MS: u64 = 1_000_000;
const KEY: u64 = 7;

// ---------------------------------------------------------------------------------------------
// Rules, their SPEC models, and the clock's schedule
// ---------------------------------------------------------------------------------------------

/// A rule, the SPEC model of it, the span its state takes to refill (`B·T` or `W`), and the
/// fractions of it the clock moves by between rounds.
#[derive(Clone, Copy)]
struct Case<A> {
    rule: A,
    model: Algo,
    period: u64,
    steps: Steps,
}

type Steps = &'static [(u64, u64)];

/// None, a sliver, part of the span, all of it or more: rounds admit nothing, a partial
/// refill, or all.
const WIDE: Steps = &[
    (0, 1),
    (1, 2),
    (1, 7),
    (1, 1),
    (1, 1000),
    (3, 4),
    (2, 1),
    (1, 16),
    (5, 3),
    (1, 3),
];

/// A quarter of the window, or less: a log frees only what expired, and a step that freed
/// two cohorts of units (admitted at two instants) at once would merge them, until one cohort
/// is left and every round admits all or nothing. Quarters free the prelude's cohorts one at a
/// time, each round a partial refill.
const FINE: Steps = &[(1, 4), (1, 4), (0, 1), (1, 4), (1, 4), (1, 1000), (1, 4)];

fn quota(limit: u64, window_ms: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).unwrap()
}

fn gcra(limit: u64, window_ms: u64, burst: u64) -> Case<Gcra> {
    let model = Algo::Gcra {
        limit,
        window: window_ms * MS,
        burst,
    };
    let rule = Gcra::new(quota(limit, window_ms).with_burst(burst).unwrap()).unwrap();
    let period = (model.interval() * burst as u128) as u64;
    Case {
        rule,
        model,
        period,
        steps: WIDE,
    }
}

/// SPEC §2: the meter decides as GCRA with `B = C` (here `C = L`).
fn leaky_bucket(limit: u64, window_ms: u64) -> Case<Gcra> {
    let model = Algo::Gcra {
        limit,
        window: window_ms * MS,
        burst: limit,
    };
    let rule = LeakyBucket::new(quota(limit, window_ms)).unwrap();
    Case {
        rule,
        model,
        period: window_ms * MS,
        steps: WIDE,
    }
}

fn leaky_queue(limit: u64, window_ms: u64, capacity: u64) -> Case<LeakyQueue> {
    let model = Algo::LeakyQueue {
        limit,
        window: window_ms * MS,
        capacity,
    };
    let rule = LeakyQueue::new(quota(limit, window_ms).with_burst(capacity).unwrap()).unwrap();
    let period = (model.interval() * capacity as u128) as u64;
    Case {
        rule,
        model,
        period,
        steps: WIDE,
    }
}

fn fixed_window(limit: u64, window_ms: u64) -> Case<FixedWindow> {
    Case {
        rule: FixedWindow::new(quota(limit, window_ms)).unwrap(),
        model: Algo::FixedWindow {
            limit,
            window: window_ms * MS,
        },
        period: window_ms * MS,
        steps: WIDE,
    }
}

fn sliding_window(limit: u64, window_ms: u64) -> Case<SlidingWindow> {
    Case {
        rule: SlidingWindow::new(quota(limit, window_ms)).unwrap(),
        model: Algo::SlidingWindow {
            limit,
            window: window_ms * MS,
        },
        period: window_ms * MS,
        steps: WIDE,
    }
}

fn sliding_log(limit: u64, window_ms: u64) -> Case<SlidingLog> {
    let rule = SlidingLog::new(quota(limit, window_ms)).unwrap();
    Case {
        rule,
        model: Algo::SlidingLog {
            limit,
            window: window_ms * MS,
            tick: rule.tick_nanos(),
        },
        period: window_ms * MS,
        steps: FINE,
    }
}

/// How far the clock moves before round `r`: a step, plus a few odd nanoseconds.
fn step(r: usize, period: u64, steps: Steps) -> u64 {
    let (n, d) = steps[r % steps.len()];
    period / d * n + r as u64 % 3
}

/// What one round asks of each thread.
#[derive(Clone, Copy, Debug)]
enum Costs {
    /// Every check costs this much.
    Uniform(u64),
    /// Even threads cost 1; odd threads alternate 2 and 3. The cost-1 threads drain every
    /// last unit, so the total is still fixed, while 2s and 3s meet the partial fit.
    Mixed,
}

impl Costs {
    fn of_round(r: usize) -> Costs {
        match r % 4 {
            0 => Costs::Uniform(1),
            1 => Costs::Uniform(2),
            2 => Costs::Uniform(3),
            _ => Costs::Mixed,
        }
    }

    /// The cost of thread `thread`'s `i`-th check.
    fn cost(self, thread: usize, i: usize) -> u64 {
        match self {
            Costs::Uniform(c) => c,
            Costs::Mixed if thread % 2 == 0 => 1,
            Costs::Mixed => 2 + (i % 2) as u64,
        }
    }
}

/// The round done one check at a time, threads taking turns (each stopping at its first
/// denial), against `take`, which says whether a check of that cost was admitted. Returns the
/// units admitted: what the concurrent round must admit too.
fn sequential(costs: Costs, mut take: impl FnMut(u64) -> bool) -> u64 {
    let mut next = [0usize; THREADS];
    let mut running = [true; THREADS];
    let (mut total, mut left) = (0, THREADS);
    while left > 0 {
        for thread in 0..THREADS {
            if !running[thread] {
                continue;
            }
            let cost = costs.cost(thread, next[thread]);
            next[thread] += 1;
            if take(cost) {
                total += cost;
            } else {
                running[thread] = false;
                left -= 1;
            }
        }
    }
    total
}

/// The model's sliding logs keep every entry ever admitted and copy them on each decision:
/// entries already expired at `t` never count again (time does not go back), so they go.
fn prune(model: &mut Model<u64>, t: u128) {
    let window = model.algo.window() as u128;
    for state in model.keys.values_mut() {
        state.log.retain(|&entry| entry + window > t);
    }
}

fn now(clock: &ManualClock) -> u128 {
    clock.now() as u128
}

// ---------------------------------------------------------------------------------------------
// The round protocol
// ---------------------------------------------------------------------------------------------

/// What the workers of a test share: two barriers a round (the main thread is a party to
/// both, and moves the clock only between them), and what went wrong. Workers never panic
/// (a panicking worker would leave the others at a barrier): they note failures here.
struct Rounds {
    start: Barrier,
    end: Barrier,
    stop: AtomicBool,
    round: AtomicUsize,
    /// Workers past `start` this round: each waits for all, so that the round starts with
    /// every worker runnable, rather than the first woken taking most of it alone.
    ready: AtomicUsize,
    workers: usize,
    failures: Mutex<Vec<String>>,
}

impl Rounds {
    fn new(workers: usize) -> Rounds {
        Rounds {
            start: Barrier::new(workers + 1),
            end: Barrier::new(workers + 1),
            stop: AtomicBool::new(false),
            round: AtomicUsize::new(0),
            ready: AtomicUsize::new(0),
            workers,
            failures: Mutex::new(Vec::new()),
        }
    }

    /// A worker's next round, or `None` when the test is over.
    fn next(&self) -> Option<usize> {
        self.start.wait();
        if self.stop.load(SeqCst) {
            return None;
        }
        self.ready.fetch_add(1, SeqCst);
        while self.ready.load(SeqCst) < self.workers {
            thread::yield_now();
        }
        Some(self.round.load(SeqCst))
    }

    fn fail(&self, what: String) {
        let mut failures = self.failures.lock().unwrap();
        if failures.len() < 20 {
            failures.push(what);
        }
    }

    /// Runs round `r` (the workers wait for it at `start`) and waits for its end.
    fn run(&self, r: usize) {
        self.round.store(r, SeqCst);
        self.ready.store(0, SeqCst);
        self.start.wait();
        self.end.wait();
    }

    /// Panics if a round failed.
    fn check(&self, outcome: Result<(), String>) {
        let failures = self.failures.lock().unwrap();
        if let Err(what) = outcome {
            panic!("{what}\nworkers noted: {failures:#?}");
        }
        assert!(failures.is_empty(), "workers noted: {failures:#?}");
    }

    fn failed(&self) -> bool {
        !self.failures.lock().unwrap().is_empty()
    }
}

/// Releases the workers for good when dropped, also by a panic of the main thread, which
/// would otherwise leave them at the barrier and the test hanging.
struct Release<'a>(&'a Rounds);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, SeqCst);
        self.0.start.wait();
    }
}

/// One worker's check of `cost`, judged: admitted or not. `denied_before`, read from `denied`
/// *before* the check, is the smallest cost refused this round (for this key) by a denial
/// that had already returned to some thread: a check then admitted at a cost no smaller
/// started after that denial, which a frozen clock rules out (the key's room only shrinks)
/// unless the denial was spurious. `denied` is `None` where that does not hold by design.
fn judge(
    rounds: &Rounds,
    what: &dyn Fn() -> String,
    result: Result<Decision, LimitError>,
    cost: u64,
    denied: Option<&AtomicU64>,
    denied_before: u64,
) -> bool {
    match result {
        Ok(decision) if decision.allowed() => {
            if denied.is_some() && cost >= denied_before {
                rounds.fail(format!(
                    "{}: cost {cost} admitted after a denial of cost {denied_before} returned",
                    what()
                ));
            }
            true
        }
        Ok(decision) => {
            // SPEC: `remaining` counts cost-1 requests that would pass now; a denial of `cost`
            // means fewer than `cost` would.
            if decision.remaining() >= cost {
                rounds.fail(format!(
                    "{}: cost {cost} denied with {} remaining",
                    what(),
                    decision.remaining()
                ));
            }
            if let Some(denied) = denied {
                denied.fetch_min(cost, SeqCst);
            }
            false
        }
        Err(e) => {
            rounds.fail(format!("{}: cost {cost}: {e}", what()));
            false
        }
    }
}

/// A round's verdict on one key: the units the threads admitted (`got`) against the
/// sequential twin's, the twin's against the SPEC model's, and the state left, as
/// (remaining, reset_after) per quota, against the twin's.
fn verdict(
    at: &str,
    got: u64,
    (twin, model): (u64, u64),
    (state, twin_state): (Figures, Figures),
) -> Result<(), String> {
    if twin != model {
        return Err(format!(
            "{at}: the sequential twin admits {twin}, the SPEC model {model}"
        ));
    }
    if got != twin {
        return Err(format!(
            "{at}: the threads admitted {got}, one at a time {twin}"
        ));
    }
    if state != twin_state {
        return Err(format!(
            "{at}: (remaining, reset_after) {state:?}, the twin's {twin_state:?}"
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Part 1: one key
// ---------------------------------------------------------------------------------------------

/// One key's limiter, whichever kind.
trait OneKey: Sync {
    fn check(&self, cost: u64) -> Result<Decision, LimitError>;
    fn figures(&self) -> Figures;
}

/// `remaining` and `reset_after` of each state behind a key (a cost-0 peek): what a state is
/// worth to the next request.
type Figures = Vec<(u64, u64)>;

fn figures(decision: Decision) -> (u64, u64) {
    (decision.remaining(), decision.reset_after_nanos())
}

impl<A: Algorithm> OneKey for Limiter<A, ManualClock> {
    fn check(&self, cost: u64) -> Result<Decision, LimitError> {
        self.check_n(cost)
    }
    fn figures(&self) -> Figures {
        vec![figures(self.peek(0).unwrap())]
    }
}

impl<A: Algorithm> OneKey for KeyedLimiter<u64, A, ManualClock> {
    fn check(&self, cost: u64) -> Result<Decision, LimitError> {
        self.check_n(&KEY, cost)
    }
    fn figures(&self) -> Figures {
        vec![figures(self.peek(&KEY, 0).unwrap())]
    }
}

impl<A: Algorithm> OneKey for MultiLimiter<u64, A, ManualClock> {
    fn check(&self, cost: u64) -> Result<Decision, LimitError> {
        self.check_n(&KEY, cost)
    }
    fn figures(&self) -> Figures {
        let limits = self.limits().iter();
        limits.map(|l| figures(l.peek(&KEY, 0).unwrap())).collect()
    }
}

/// The SPEC model of one key behind one quota, or several all or nothing.
struct Spec(Vec<Model<u64>>);

impl Spec {
    fn new(algos: &[Algo]) -> Spec {
        Spec(algos.iter().map(|&algo| Model::new(algo)).collect())
    }

    /// A check of `cost` at `t`, all or nothing.
    fn take(&mut self, t: u128, cost: u64) -> bool {
        if let [model] = &mut self.0[..] {
            return model.check(&KEY, t, cost).unwrap().allowed;
        }
        let admits = |m: &Model<u64>| m.peek(&KEY, t, cost).unwrap().allowed;
        if !self.0.iter().all(admits) {
            return false;
        }
        for model in &mut self.0 {
            assert!(model.check(&KEY, t, cost).unwrap().allowed);
        }
        true
    }

    fn prune(&mut self, t: u128) {
        self.0.iter_mut().for_each(|model| prune(model, t));
    }
}

/// `ROUNDS` rounds of `THREADS` threads on `limiter`, each round's total checked against the
/// sequential `twin` (built alike, on the same clock: it is only used while the workers wait)
/// and the model. `ordered`: whether a denial must be final within the round.
fn exact_rounds<T: OneKey>(
    name: &str,
    make: impl Fn(ManualClock) -> T,
    models: &[Algo],
    (period, steps): (u64, Steps),
    ordered: bool,
) {
    let clock = ManualClock::new();
    let (limiter, twin) = (make(clock.clone()), make(clock.clone()));
    let mut spec = Spec::new(models);
    // Cohorts of units a quarter of the span apart before round 0, of unequal sizes: a
    // sliding log frees them one at a time (see `FINE`).
    let capacity = models.iter().map(|m| m.capacity()).min().unwrap();
    for part in [8, 4, 16] {
        let t = now(&clock);
        for _ in 0..capacity / part {
            assert!(limiter.check(1).unwrap().allowed() && twin.check(1).unwrap().allowed());
            assert!(spec.take(t, 1));
        }
        clock.advance_nanos(period / 4);
    }
    let rounds = Rounds::new(THREADS);
    let admitted = AtomicU64::new(0);
    let denied = AtomicU64::new(0);
    let outcome = thread::scope(|s| {
        for id in 0..THREADS {
            let (rounds, limiter, admitted, denied) = (&rounds, &limiter, &admitted, &denied);
            s.spawn(move || {
                while let Some(r) = rounds.next() {
                    let costs = Costs::of_round(r);
                    let mut mine = 0;
                    for i in 0.. {
                        let cost = costs.cost(id, i);
                        let denied_before = denied.load(SeqCst);
                        let what = || format!("{name}, round {r} ({costs:?}), thread {id}");
                        let result = limiter.check(cost);
                        let order = ordered.then_some(denied);
                        if !judge(rounds, &what, result, cost, order, denied_before) {
                            break;
                        }
                        mine += cost;
                    }
                    admitted.fetch_add(mine, SeqCst);
                    rounds.end.wait();
                }
            });
        }
        let _release = Release(&rounds);
        (|| {
            for r in 0..ROUNDS {
                clock.advance_nanos(step(r, period, steps));
                let t = now(&clock);
                spec.prune(t);
                admitted.store(0, SeqCst);
                denied.store(u64::MAX, SeqCst);
                rounds.run(r);
                let costs = Costs::of_round(r);
                let expected = sequential(costs, |c| twin.check(c).unwrap().allowed());
                let modelled = sequential(costs, |c| spec.take(t, c));
                let got = admitted.load(SeqCst);
                let at = format!("{name}, round {r} ({costs:?}) at t = {t} ns");
                let states = (limiter.figures(), twin.figures());
                verdict(&at, got, (expected, modelled), states)?;
                if rounds.failed() {
                    return Err(at);
                }
            }
            Ok(())
        })()
    });
    rounds.check(outcome);
}

fn one_key<A: Algorithm>(case: Case<A>) {
    let Case {
        rule,
        model,
        period,
        steps,
    } = case;
    exact_rounds(
        &format!("{} direct", A::NAME),
        |clock| Limiter::with_clock(rule, clock).unwrap(),
        &[model],
        (period, steps),
        true,
    );
    exact_rounds(
        &format!("{} keyed", A::NAME),
        |clock| KeyedLimiter::<u64, A, ManualClock>::with_clock(rule, clock).unwrap(),
        &[model],
        (period, steps),
        true,
    );
}

#[test]
fn gcra_one_key_admits_exactly_the_sequential_amount() {
    // T = 0.5 ms, B = 1999 (a prime: rounds of cost 2 and 3 end with a unit that does not fit).
    one_key(gcra(2_000, 1_000, 1_999));
    one_key(leaky_bucket(1_999, 1_999));
}

#[test]
fn leaky_queue_one_key_admits_exactly_the_sequential_amount() {
    one_key(leaky_queue(2_000, 1_000, 1_999));
}

#[test]
fn fixed_window_one_key_admits_exactly_the_sequential_amount() {
    one_key(fixed_window(1_999, 1_000));
}

#[test]
fn sliding_window_one_key_admits_exactly_the_sequential_amount() {
    one_key(sliding_window(1_999, 1_000));
}

#[test]
fn sliding_log_one_key_admits_exactly_the_sequential_amount() {
    one_key(sliding_log(997, 1_000));
}

// ---------------------------------------------------------------------------------------------
// MultiLimiter
// ---------------------------------------------------------------------------------------------

/// Two quotas on one key, either of which binds depending on the clock's step: a short one
/// (bursts of 600, back in 0.3 s) and a slower one (1000, back in 1 s), checked in the order
/// given.
fn multi<A: Algorithm>(a: Case<A>, b: Case<A>) {
    let (rules, models) = ([a.rule, b.rule], [a.model, b.model]);
    let period = a.period.max(b.period);
    exact_rounds(
        &format!("{} multi", A::NAME),
        |clock| MultiLimiter::<u64, A, ManualClock>::with_clock(rules, clock).unwrap(),
        &models,
        (period, a.steps),
        false,
    );
}

#[test]
fn multi_limiter_admits_exactly_the_sequential_amount() {
    multi(gcra(2_000, 1_000, 600), gcra(1_000, 1_000, 1_000));
    multi(
        leaky_queue(1_000, 1_000, 1_000),
        leaky_queue(2_000, 1_000, 600),
    );
    multi(fixed_window(600, 300), fixed_window(1_000, 1_000));
    multi(sliding_window(1_000, 1_000), sliding_window(600, 300));
    multi(sliding_log(600, 300), sliding_log(1_000, 1_000));
}

// ---------------------------------------------------------------------------------------------
// Part 2: hot keys beside a flood of new keys
// ---------------------------------------------------------------------------------------------

const HOT_KEYS: usize = 8;
const HOT_THREADS: usize = 4;
const FLOOD_THREADS: usize = 2;
/// New keys each flood thread checks in a round at least (and then until the hot threads are
/// done, up to `FLOOD_MAX`).
const FLOOD_MIN: u64 = 300;
const FLOOD_MAX: u64 = 20_000;
const MAX_KEYS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Bound {
    /// Default `evict_above`: tables grow and every key moves.
    Grow,
    /// `evict_above(n)`: a full table is replaced by one of its size, fresh keys evicted.
    EvictAbove(usize),
    /// `max_keys(n, Deny)`: the eviction hand makes room, or a new key is refused.
    MaxKeys(usize),
}

impl Bound {
    /// Rounds: more where tables are replaced at the same size (a hot key then meets a drain,
    /// a chained drain or a full table more often than on the doubling tables).
    fn rounds(self) -> usize {
        match self {
            Bound::Grow => 30,
            Bound::EvictAbove(_) | Bound::MaxKeys(_) => 60,
        }
    }
}

/// A flood key: unique per round, thread and index, never a hot key.
fn flood_key(r: usize, thread: usize, i: u64) -> u64 {
    (1 << 40) + ((r as u64) << 24) + ((thread as u64) << 20) + i
}

fn hot_keys_beside_a_flood<A: Algorithm>(case: Case<A>, bound: Bound) {
    let Case {
        rule,
        model,
        period,
        steps,
    } = case;
    let clock = ManualClock::new();
    let builder = KeyedLimiter::<u64, A>::builder(rule).clock(clock.clone());
    let limiter = match bound {
        Bound::Grow => builder.build(),
        Bound::EvictAbove(keys) => builder.evict_above(keys).build(),
        Bound::MaxKeys(keys) => builder.max_keys(keys, OverflowPolicy::Deny).build(),
    }
    .unwrap();
    let twin = KeyedLimiter::<u64, A, ManualClock>::with_clock(rule, clock.clone()).unwrap();
    let mut spec = Model::new(model);
    let name = format!("{} beside a flood, {bound:?}", A::NAME);
    // At the bound every key that holds state is kept, so the hot keys must hold state at
    // every round's start: half of each is taken first, and the clock then moves by less than
    // a refill (GCRA, leaky), or by half a window (a log keeps the half taken a round before;
    // a sliding window's previous count still weighs).
    let held = matches!(bound, Bound::MaxKeys(_));
    let advance = |r: usize| match (held, model) {
        (false, _) => step(r, period, steps),
        (true, Algo::Gcra { .. } | Algo::LeakyQueue { .. }) => {
            period / 16 * (r as u64 * 7 % 12 + 1)
        }
        (true, _) => period / 2,
    };
    let capacity = model.capacity();
    for key in 0..HOT_KEYS as u64 {
        for _ in 0..capacity / 2 {
            assert!(limiter.check(&key).unwrap().allowed());
            assert!(twin.check(&key).unwrap().allowed());
            assert!(spec.check(&key, 0, 1).unwrap().allowed);
        }
    }

    let rounds = Rounds::new(HOT_THREADS + FLOOD_THREADS);
    let admitted: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
    let denied: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
    let hot_left = AtomicUsize::new(0);
    let (inserted, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let outcome = thread::scope(|s| {
        for id in 0..HOT_THREADS {
            let (rounds, limiter, admitted, denied, hot_left) =
                (&rounds, &limiter, &admitted, &denied, &hot_left);
            let name = &name;
            s.spawn(move || {
                while let Some(r) = rounds.next() {
                    let cost = 1 + r as u64 % 3;
                    let mut mine = [0; HOT_KEYS];
                    let mut done = [false; HOT_KEYS];
                    let (mut left, mut i) = (HOT_KEYS, id);
                    // Key after key, each thread from its own, until every key denied it.
                    while left > 0 {
                        let k = i % HOT_KEYS;
                        i += 1;
                        if done[k] {
                            continue;
                        }
                        let denied_before = denied[k].load(SeqCst);
                        let what = || format!("{name}, round {r}, thread {id}, hot key {k}");
                        let result = limiter.check_n(&(k as u64), cost);
                        if judge(rounds, &what, result, cost, Some(&denied[k]), denied_before) {
                            mine[k] += cost;
                        } else {
                            done[k] = true;
                            left -= 1;
                        }
                    }
                    for (total, mine) in admitted.iter().zip(mine) {
                        total.fetch_add(mine, SeqCst);
                    }
                    hot_left.fetch_sub(1, SeqCst);
                    rounds.end.wait();
                }
            });
        }
        for id in 0..FLOOD_THREADS {
            let (rounds, limiter, hot_left, inserted, refused) =
                (&rounds, &limiter, &hot_left, &inserted, &refused);
            let name = &name;
            s.spawn(move || {
                // Cost 0 leaves a new key fresh; cost 1 makes it hold state for a while. At the
                // bound, enough of them hold state to fill it, so that flood keys are refused.
                let holding_every = if held { 2 } else { 4 };
                while let Some(r) = rounds.next() {
                    let mut i = 0;
                    while i < FLOOD_MIN || (hot_left.load(SeqCst) > 0 && i < FLOOD_MAX) {
                        let cost = u64::from(i % holding_every == 0);
                        match limiter.check_n(&flood_key(r, id, i), cost) {
                            Ok(_) => inserted.fetch_add(1, SeqCst),
                            Err(LimitError::KeyTableFull { .. }) if held => {
                                refused.fetch_add(1, SeqCst)
                            }
                            Err(e) => {
                                rounds.fail(format!("{name}, round {r}, flood key {i}: {e}"));
                                break;
                            }
                        };
                        i += 1;
                    }
                    rounds.end.wait();
                }
            });
        }
        let _release = Release(&rounds);
        (|| {
            for r in 0..bound.rounds() {
                clock.advance_nanos(advance(r));
                let t = now(&clock);
                prune(&mut spec, t);
                let at = format!("{name}, round {r} at t = {t} ns");
                if held {
                    // The premise of "never refused" (a check of this test's schedule).
                    if let Some(key) = (0..HOT_KEYS as u64).find(|key| spec.is_fresh(key, t)) {
                        return Err(format!(
                            "{at}: hot key {key} is fresh; the schedule must keep it held"
                        ));
                    }
                }
                admitted.iter().for_each(|n| n.store(0, SeqCst));
                denied.iter().for_each(|n| n.store(u64::MAX, SeqCst));
                hot_left.store(HOT_THREADS, SeqCst);
                rounds.run(r);
                let cost = 1 + r as u64 % 3;
                for (k, got) in admitted.iter().enumerate() {
                    let key = k as u64;
                    let expected = sequential(Costs::Uniform(cost), |c| {
                        twin.check_n(&key, c).unwrap().allowed()
                    });
                    let modelled = sequential(Costs::Uniform(cost), |c| {
                        spec.check(&key, t, c).unwrap().allowed
                    });
                    let states = (
                        vec![figures(limiter.peek(&key, 0).unwrap())],
                        vec![figures(twin.peek(&key, 0).unwrap())],
                    );
                    let at = format!("{at}, hot key {k} (cost {cost})");
                    verdict(&at, got.load(SeqCst), (expected, modelled), states)?;
                }
                if rounds.failed() {
                    return Err(at);
                }
            }
            Ok(())
        })()
    });
    rounds.check(outcome);

    let (inserted, refused) = (inserted.into_inner() as usize, refused.into_inner());
    let held_keys = limiter.len();
    match bound {
        // Nothing is evicted below `evict_above`: every key checked is held, once.
        Bound::Grow => assert_eq!(held_keys, HOT_KEYS + inserted, "{name}"),
        Bound::EvictAbove(_) => assert!(held_keys < HOT_KEYS + inserted, "{name}: nothing evicted"),
        Bound::MaxKeys(max) => {
            assert!(held_keys <= max, "{name}: {held_keys} keys held");
            assert!(refused > 0, "{name}: the flood never met the bound");
        }
    }
}

/// Small quotas (`B` or `L` = 64), so that rounds are short and the flood runs through them.
fn flood_all(bound: Bound) {
    hot_keys_beside_a_flood(gcra(1_000, 1_000, 64), bound);
    hot_keys_beside_a_flood(leaky_queue(1_000, 1_000, 64), bound);
    hot_keys_beside_a_flood(sliding_window(64, 64), bound);
    hot_keys_beside_a_flood(sliding_log(64, 64), bound);
    if !matches!(bound, Bound::MaxKeys(_)) {
        hot_keys_beside_a_flood(fixed_window(64, 64), bound);
    }
}

#[test]
fn hot_keys_beside_a_flood_on_growing_tables() {
    flood_all(Bound::Grow);
}

#[test]
fn hot_keys_beside_a_flood_with_evict_above() {
    flood_all(Bound::EvictAbove(64));
}

#[test]
fn hot_keys_beside_a_flood_at_max_keys_deny() {
    flood_all(Bound::MaxKeys(MAX_KEYS));
}
