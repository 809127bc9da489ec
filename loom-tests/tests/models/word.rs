//! `AtomicWord::update`, the CAS loop behind GCRA, the leaky bucket (meter and queue) and both
//! window counters, run with the real rules.

use std::cell::Cell;
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::AtomicWord;
use tollgate_loom_tests::WordRule;
use tollgate_loom_tests::{Decision, FixedWindow, Gcra, LeakyQueue, Quota, SlidingWindow, Stored};

use crate::{explore, MS};

/// A request as a model saw it: the time it was judged at, and its decision.
type Outcome = (Nanos, Decision);

/// A checked request of `cost` through the library's glue (`Stored::acquire`), reading the
/// time from `clock`, a loom atomic standing in for a monotonic clock.
fn check<A: Stored<Cell = AtomicWord>>(
    rule: &A,
    cell: &AtomicWord,
    clock: &AtomicU64,
    cost: u64,
) -> Outcome {
    let judged_at = Cell::new(0);
    let now = || {
        // Relaxed, as a TSC read is: nothing orders a reading but the Acquire load of the state
        // that `AtomicWord::update` does first. That is the protocol under test.
        let t = clock.load(Ordering::Relaxed);
        judged_at.set(t);
        t
    };
    let decision = rule.acquire(cell, now, cost, true);
    // The last reading is the one the committed (or final, read-only) attempt was judged at.
    (judged_at.get(), decision)
}

/// Replays `outcomes` through the pure rule one at a time, in time order, and asserts that as
/// many requests were admitted at each instant as the sequential rule admits; returns the state
/// the sequential run ends in.
///
/// This is the exact expectation for cost-1 requests on a monotonic clock: every write is judged
/// at a time no earlier than the state it replaces (the state is loaded before the clock is
/// read), so the successful CASes form a chain in time order; requests at one instant are
/// interchangeable; and a request denied against an older state would be denied against any
/// later state at the same instant.
fn replay<R: WordRule>(rule: &R, initial: u64, outcomes: &[Outcome]) -> u64 {
    let mut times: Vec<Nanos> = outcomes.iter().map(|(t, _)| *t).collect();
    times.sort_unstable();
    times.dedup();
    let mut state = initial;
    for t in times {
        let at_t = || outcomes.iter().filter(move |(when, _)| *when == t);
        let admitted = at_t().filter(|(_, d)| d.allowed()).count();
        let mut expected = 0;
        for _ in at_t() {
            let (decision, next) = rule.decide(state, t, 1);
            expected += usize::from(decision.allowed());
            state = next;
        }
        assert_eq!(
            admitted, expected,
            "at t = {t} ns {admitted} requests were admitted where the sequential rule admits \
             {expected}; outcomes: {outcomes:?}"
        );
    }
    state
}

/// Threads checking cost-1 requests against one word while, optionally, the clock moves.
#[derive(Clone, Copy)]
struct Race<R> {
    rule: R,
    /// The state before the race.
    initial: u64,
    /// The clock's reading when the race starts.
    start: Nanos,
    /// If set, one more thread moves the clock to this reading during the race.
    later: Option<Nanos>,
    /// How many checks each worker thread makes.
    checks: &'static [usize],
    /// No decision's `retry_after` or `reset_after` may exceed this (SPEC "Result of a
    /// decision"); a decision judged against a state written at a later time than its own
    /// reading breaks it.
    figure_bound: Nanos,
}

fn race<R>(name: &str, race: Race<R>)
where
    R: Stored<Cell = AtomicWord> + WordRule,
{
    explore(name, move || {
        let Race {
            rule,
            initial,
            start,
            later,
            checks,
            figure_bound,
        } = race;
        let cell = Arc::new(AtomicWord::new(initial));
        let clock = Arc::new(AtomicU64::new(start));
        let mover = later.map(|t| {
            let clock = Arc::clone(&clock);
            // Relaxed: see `check`.
            thread::spawn(move || clock.store(t, Ordering::Relaxed))
        });
        let workers: Vec<_> = checks
            .iter()
            .map(|&n| {
                let (cell, clock) = (Arc::clone(&cell), Arc::clone(&clock));
                thread::spawn(move || {
                    (0..n)
                        .map(|_| check(&rule, &cell, &clock, 1))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut outcomes: Vec<Outcome> = Vec::new();
        for worker in workers {
            outcomes.extend(worker.join().unwrap());
        }
        if let Some(mover) = mover {
            mover.join().unwrap();
        }
        for (t, d) in &outcomes {
            assert!(
                d.retry_after_nanos() <= figure_bound && d.reset_after_nanos() <= figure_bound,
                "at t = {t} ns: figures beyond {figure_bound} ns, judged against a state from \
                 a later time: {d:?}; outcomes: {outcomes:?}"
            );
        }
        let expected = replay(&rule, initial, &outcomes);
        assert_eq!(
            cell.load(),
            expected,
            "the final state is not the sequential one: an update was lost; outcomes: \
             {outcomes:?}"
        );
    });
}

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).unwrap()
}

/// Three threads (2, 1 and 1 checks) at one instant on a bucket of 2: exactly 2 admitted, and
/// the final `TAT = t + 2·T`.
#[test]
fn gcra_frozen_time() {
    let rule = Gcra::new(quota(2, Duration::from_millis(2))).unwrap();
    race(
        "gcra_frozen_time",
        Race {
            rule,
            initial: 0,
            start: 10 * MS,
            later: None,
            checks: &[2, 1, 1],
            figure_bound: 2 * MS,
        },
    );
}

/// A bucket of 1 refilling every 1 ms; two threads of two checks each while the clock moves on
/// by one interval.
#[test]
fn gcra_clock_moves() {
    let rule = Gcra::new(quota(1, Duration::from_millis(1))).unwrap();
    race(
        "gcra_clock_moves",
        Race {
            rule,
            initial: 0,
            start: 10 * MS,
            later: Some(11 * MS),
            checks: &[2, 2],
            figure_bound: MS,
        },
    );
}

/// L = 2 per 1 ms window, one unit already spent in window 0; three threads (2, 1 and 1
/// checks) while the clock crosses from the last nanosecond of window 0 to the first of
/// window 1.
#[test]
fn fixed_window_across_boundary() {
    let rule = FixedWindow::new(quota(2, Duration::from_millis(1))).unwrap();
    let start = MS - 1;
    let (_, initial) = rule.decide(0, start, 1);
    race(
        "fixed_window_across_boundary",
        Race {
            rule,
            initial,
            start,
            later: Some(MS),
            checks: &[2, 1, 1],
            figure_bound: MS,
        },
    );
}

/// L = 2 per 1 ms, window 0 full; three threads (2, 1 and 1 checks) while the clock moves
/// from its last nanosecond (everything denied) to the middle of window 1, where the previous
/// window weighs 1/2 and exactly one more unit fits.
#[test]
fn sliding_window_across_boundary() {
    let rule = SlidingWindow::new(quota(2, Duration::from_millis(1))).unwrap();
    let start = MS - 1;
    let (_, one) = rule.decide(0, start, 1);
    let (_, initial) = rule.decide(one, start, 1);
    race(
        "sliding_window_across_boundary",
        Race {
            rule,
            initial,
            start,
            later: Some(MS + MS / 2),
            checks: &[2, 1, 1],
            figure_bound: 2 * MS,
        },
    );
}

/// Reservations of 1, 2 and 1 units racing for a queue of capacity 3 at one instant: the
/// admitted ones get disjoint slots that tile `[t, TAT)` with no gap, and a reservation is
/// refused only if it does not fit in what is left.
#[test]
fn leaky_queue_distinct_slots() {
    const CAPACITY: u64 = 3;
    const T: u64 = MS;
    const NOW: Nanos = 10 * MS;
    let rule = LeakyQueue::new(
        quota(1, Duration::from_millis(1))
            .with_burst(CAPACITY)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(rule.interval_nanos(), T);
    explore("leaky_queue_distinct_slots", move || {
        let cell = Arc::new(AtomicWord::new(0));
        let reserve =
            move |cell: &AtomicWord, cost: u64| (cost, rule.acquire(cell, || NOW, cost, true));
        let workers = [1, 2, 1].map(|cost| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || reserve(&cell, cost))
        });
        let outcomes = workers.map(|w| w.join().unwrap());

        let mut slots: Vec<(Nanos, Nanos)> = outcomes
            .iter()
            .filter(|(_, d)| d.allowed())
            .map(|(cost, d)| (NOW + d.delay_nanos(), NOW + d.delay_nanos() + cost * T))
            .collect();
        slots.sort_unstable();
        let mut tail = NOW;
        for &(from, to) in &slots {
            assert_eq!(
                from, tail,
                "reservations overlap or leave a gap: {slots:?}; outcomes: {outcomes:?}"
            );
            tail = to;
        }
        let reserved: u64 = (tail - NOW) / T;
        assert!(reserved <= CAPACITY, "over capacity: {outcomes:?}");
        assert_eq!(cell.load(), tail, "an update was lost: {outcomes:?}");
        for (cost, d) in &outcomes {
            assert!(
                d.allowed() || reserved + cost > CAPACITY,
                "a reservation of {cost} was refused with {} units free: {outcomes:?}",
                CAPACITY - reserved
            );
        }
    });
}

/// GCRA reservations of 1, 2 and 1 units racing on an empty bucket of 2 at one instant: every
/// one is admitted, their slots (`[TAT, TAT + c·T)` before each, read back from the delay as
/// `t + delay + B·T − c·T`) tile the time after the bucket's debt with no gap or overlap (first
/// come, first served), and the final `TAT` holds all four units (no update lost).
#[test]
fn gcra_reservations_tile_the_queue() {
    const T: u64 = MS;
    const BURST: u64 = 2;
    const NOW: Nanos = 10 * MS;
    let rule = Gcra::new(quota(BURST, Duration::from_millis(2))).unwrap();
    assert_eq!(rule.interval_nanos(), T);
    // The bucket is spent: TAT = t + B·T.
    let (_, initial) = rule.decide(0, NOW, BURST);
    explore("gcra_reservations_tile_the_queue", move || {
        let cell = Arc::new(AtomicWord::new(initial));
        let workers = [1, 2, 1].map(|cost| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || (cost, Stored::reserve(&rule, &*cell, || NOW, cost)))
        });
        let outcomes = workers.map(|w| w.join().unwrap());
        let mut slots: Vec<(Nanos, Nanos)> = outcomes
            .iter()
            .map(|(cost, d)| {
                assert!(d.allowed(), "a reservation was refused: {outcomes:?}");
                let end = NOW + d.delay_nanos() + BURST * T;
                (end - cost * T, end)
            })
            .collect();
        slots.sort_unstable();
        let mut tail = initial;
        for &(from, to) in &slots {
            assert_eq!(
                from, tail,
                "reservations overlap or leave a gap: {slots:?}; outcomes: {outcomes:?}"
            );
            tail = to;
        }
        assert_eq!(tail, initial + 4 * T);
        assert_eq!(cell.load(), tail, "an update was lost: {outcomes:?}");
    });
}

/// A check that refunds what it was admitted, racing two plain checks, capacity 2, one
/// instant: the final state holds exactly `admitted − refunded` units (no update lost), never
/// more than the capacity, and a check is refused only while both other checks hold a unit.
fn refund_race<R: Stored<Cell = AtomicWord>>(name: &str, rule: R, now: Nanos) {
    assert_eq!(rule.capacity(), 2);
    explore(name, move || {
        let cell = Arc::new(AtomicWord::new(0));
        let refunder = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                let d = rule.acquire(&*cell, || now, 1, true);
                if d.allowed() {
                    rule.refund(&*cell, || now, 1);
                }
                d
            })
        };
        let others = [(); 2].map(|()| {
            let cell = Arc::clone(&cell);
            thread::spawn(move || rule.acquire(&*cell, || now, 1, true))
        });
        let [b, c] = others.map(|o| o.join().unwrap());
        let decisions = [refunder.join().unwrap(), b, c];

        let admitted = decisions.iter().filter(|d| d.allowed()).count() as u64;
        let refunded = u64::from(decisions[0].allowed());
        let held = 2 - rule.acquire(&*cell, || now, 0, false).remaining();
        assert_eq!(
            held,
            admitted - refunded,
            "an update was lost: {decisions:?}"
        );
        for (i, d) in decisions.iter().enumerate() {
            assert!(d.remaining() <= 2, "above capacity: {decisions:?}");
            let others_held = decisions
                .iter()
                .enumerate()
                .all(|(j, o)| j == i || o.allowed());
            assert!(
                d.allowed() || others_held,
                "request {i} refused while a unit was free: {decisions:?}"
            );
        }
    });
}

#[test]
fn gcra_refund_races_check() {
    let rule = Gcra::new(quota(2, Duration::from_millis(2))).unwrap();
    refund_race("gcra_refund_races_check", rule, 10 * MS);
}

#[test]
fn fixed_window_refund_races_check() {
    let rule = FixedWindow::new(quota(2, Duration::from_millis(1))).unwrap();
    refund_race("fixed_window_refund_races_check", rule, MS / 2);
}

#[test]
fn sliding_window_refund_races_check() {
    let rule = SlidingWindow::new(quota(2, Duration::from_millis(1))).unwrap();
    refund_race("sliding_window_refund_races_check", rule, MS / 2);
}
