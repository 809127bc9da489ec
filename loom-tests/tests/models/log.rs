//! `LogCell`, the sliding log's ring under its per-key mutex.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::LogCell;
use tollgate_loom_tests::{Quota, SlidingLog, Stored};

use crate::{explore, MS};

const WINDOW: Nanos = MS;

/// A request as the model saw it: its turn at the lock, the time read under the lock, its cost
/// and whether it was admitted.
#[derive(Debug, Clone, Copy)]
struct Entry {
    turn: usize,
    t: Nanos,
    cost: u64,
    allowed: bool,
}

fn check(
    rule: &SlidingLog,
    cell: &LogCell,
    clock: &AtomicU64,
    turns: &AtomicUsize,
    cost: u64,
) -> Entry {
    let seen = Cell::new((0, 0));
    let now = || {
        // Runs under the key's lock, so the turn is the lock order. A std atomic: bookkeeping
        // loom need not see (loom runs one thread at a time).
        let turn = turns.fetch_add(1, StdOrdering::Relaxed);
        // Relaxed: a clock reading; the lock orders it after the previous holder's.
        let t = clock.load(Ordering::Relaxed);
        seen.set((turn, t));
        t
    };
    let allowed = rule.acquire(cell, now, cost, true).allowed();
    let (turn, t) = seen.get();
    Entry {
        turn,
        t,
        cost,
        allowed,
    }
}

/// Two threads append (costs 1, 1 and 2) to a log of L = 2 per 1 ms while a third moves the
/// clock by exactly W, to where the first entries have just expired (SPEC §6: an entry at
/// exactly `t − W` no longer counts). Taken in lock order, the decisions are exactly SPEC's, and
/// no window of length W ever holds more than L admitted units.
#[test]
fn log_cell_never_over_limit() {
    model("log_cell_never_over_limit", 2, [&[1, 1], &[2]]);
}

/// The same race on a log of L = 12, one thread appending 8 then 1, the other 3: the log can
/// outgrow the 7 slots its cell holds and move to the heap, and move back into the cell when a
/// call after the clock passed W finds its entries expired. The moves change nothing SPEC can
/// see.
#[test]
fn log_cell_moving_to_the_heap_and_back_never_over_limit() {
    model(
        "log_cell_moving_to_the_heap_and_back_never_over_limit",
        12,
        [&[8, 1], &[3]],
    );
}

fn model(name: &str, limit: u64, costs: [&'static [u64]; 2]) {
    const START: Nanos = 5 * MS;
    let rule = SlidingLog::new(Quota::new(limit, Duration::from_nanos(WINDOW)).unwrap()).unwrap();
    explore(name, move || {
        let cell = Arc::new(LogCell::default());
        let clock = Arc::new(AtomicU64::new(START));
        let turns = Arc::new(AtomicUsize::new(0));
        let mover = {
            let clock = Arc::clone(&clock);
            // Relaxed: see `check`.
            thread::spawn(move || clock.store(START + WINDOW, Ordering::Relaxed))
        };
        let workers = costs.map(|costs| {
            let (cell, clock, turns) = (Arc::clone(&cell), Arc::clone(&clock), Arc::clone(&turns));
            thread::spawn(move || {
                costs
                    .iter()
                    .map(|&cost| check(&rule, &cell, &clock, &turns, cost))
                    .collect::<Vec<_>>()
            })
        });
        let mut entries: Vec<Entry> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        mover.join().unwrap();
        entries.sort_by_key(|e| e.turn);

        // SPEC §6, sequentially, in lock order.
        let mut log: Vec<Nanos> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                assert!(
                    e.t >= entries[i - 1].t,
                    "time went back under the lock: {entries:?}"
                );
            }
            let count = log.iter().filter(|&&x| x + WINDOW > e.t).count() as u64;
            let allowed = count + e.cost <= limit;
            assert_eq!(
                e.allowed, allowed,
                "not SPEC's decision for {e:?}: {entries:?}"
            );
            if allowed {
                log.extend((0..e.cost).map(|_| e.t));
            }
        }
        // The invariant itself: every window (x − W, x] ending at an admitted entry.
        for &x in &log {
            let held = log.iter().filter(|&&y| y <= x && y + WINDOW > x).count() as u64;
            assert!(
                held <= limit,
                "{held} units in the window ending at {x}: {entries:?}"
            );
        }
    });
}
