//! `LogCell`, the sliding log's ring updated by a CAS on its header: admissions racing each
//! other, the clock, refunds, the ring's moves between the cell and the heap, and a quota
//! change of tick.

use std::time::Duration;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::LogCell;
use tollgate_loom_tests::store::TableCell;
use tollgate_loom_tests::{Quota, SlidingLog};

use crate::{explore, explore_reaching, MS};

const WINDOW: Nanos = MS;
const START: Nanos = 5 * MS;

/// One call on the cell, as a worker makes it.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    /// A check of cost 1 that does not commit.
    Peek,
    Refund(u64),
}

/// What a call came to: for a check, the time the cell decided at, its cost and whether it
/// was admitted; for a refund, what it gave back.
#[derive(Debug, Clone, Copy)]
enum Done {
    Checked { t: Nanos, cost: u64, allowed: bool },
    Peeked { remaining: u64 },
    Refunded(u64),
}

fn rule(limit: u64, window: Nanos) -> SlidingLog {
    SlidingLog::new(Quota::new(limit, Duration::from_nanos(window)).unwrap()).unwrap()
}

/// A log holding `prefill` entries at `START`; two workers run their calls (each with its own
/// rule: the same one, or one whose window, and so tick, a quota change replaced) while a third
/// thread moves the clock from `START` to `START + moved_by`. Then:
/// - every window `(x − W, x]` ending at an admitted entry holds at most L units, less what
///   refunds gave back (a refund takes the newest entries, which are in every such window
///   that holds the refunding worker's own, admitted, units);
/// - no entry is lost or counted twice: a check at the end counts exactly the admitted units
///   still in the window, less the refunds, and a window later none;
/// - with the clock still (`moved_by` < W): nothing is refused that fits, and a peek sees the
///   prefilled entries (they are live throughout).
fn model(
    name: &str,
    limit: u64,
    rules: [SlidingLog; 2],
    prefill: u64,
    ops: [&'static [Op]; 2],
    moved_by: Nanos,
) {
    explore(name, move || {
        let cell = Arc::new(LogCell::default());
        if prefill > 0 {
            let (d, _) = cell.decide_at(&rules[0], || START, prefill, true).unwrap();
            assert!(d.allowed());
        }
        let clock = Arc::new(AtomicU64::new(START));
        let mover = {
            let clock = Arc::clone(&clock);
            // Relaxed: a clock reading; the cell orders decisions by its own header.
            thread::spawn(move || clock.store(START + moved_by, Ordering::Relaxed))
        };
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (cell, clock, rule, ops) =
                    (Arc::clone(&cell), Arc::clone(&clock), rules[w], ops[w]);
                thread::spawn(move || {
                    let now = || clock.load(Ordering::Relaxed);
                    ops.iter()
                        .map(|&op| match op {
                            Op::Check(cost) => {
                                let (decision, t) = cell.decide_at(&rule, now, cost, true).unwrap();
                                Done::Checked {
                                    t,
                                    cost,
                                    allowed: decision.allowed(),
                                }
                            }
                            Op::Peek => {
                                let (decision, _) = cell.decide_at(&rule, now, 1, false).unwrap();
                                Done::Peeked {
                                    remaining: decision.remaining(),
                                }
                            }
                            Op::Refund(cost) => {
                                cell.refund(&rule, now, cost).unwrap();
                                Done::Refunded(cost)
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let done: Vec<Done> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        mover.join().unwrap();

        let admitted: Vec<(Nanos, u64)> = done
            .iter()
            .filter_map(|d| match *d {
                Done::Checked {
                    t,
                    cost,
                    allowed: true,
                } => Some((t, cost)),
                _ => None,
            })
            .chain((prefill > 0).then_some((START, prefill)))
            .collect();
        let refunded: u64 = done
            .iter()
            .map(|d| match *d {
                Done::Refunded(cost) => cost,
                _ => 0,
            })
            .sum();
        let window = rules[0].window();
        for &(x, _) in &admitted {
            let held: u64 = admitted
                .iter()
                .filter(|&&(y, _)| y <= x && y + window > x)
                .map(|&(_, cost)| cost)
                .sum();
            assert!(
                held <= limit + refunded,
                "{held} units in the window ending at {x}: {done:?}"
            );
        }
        // Every admitted unit still in the window is in the log, less the refunds (which the
        // models make only with units of their own still in the window).
        let end = START + moved_by;
        let live: u64 = admitted
            .iter()
            .filter(|&&(t, _)| t + window > end)
            .map(|&(_, cost)| cost)
            .sum();
        let (last, _) = cell.decide_at(&rules[0], || end, 0, false).unwrap();
        assert_eq!(
            last.remaining(),
            limit.saturating_sub(live.saturating_sub(refunded)),
            "entries lost or counted twice: {done:?}"
        );
        // And every entry was written: a window later the log is empty (a slot claimed and
        // never written would count as live for ever).
        let (later, _) = cell
            .decide_at(&rules[0], || end + window, 0, false)
            .unwrap();
        assert_eq!(later.remaining(), limit, "a slot never written: {done:?}");
        if moved_by < window {
            let demand: u64 = prefill
                + done
                    .iter()
                    .map(|d| match *d {
                        Done::Checked { cost, .. } => cost,
                        _ => 0,
                    })
                    .sum::<u64>();
            let units: u64 = admitted.iter().map(|&(_, cost)| cost).sum();
            assert!(units <= limit + refunded, "over the limit: {done:?}");
            if demand <= limit {
                assert_eq!(units, demand, "a spurious denial: {done:?}");
            }
            for d in &done {
                if let Done::Peeked { remaining } = *d {
                    assert!(
                        remaining + prefill <= limit + refunded,
                        "a peek missed the prefilled entries: {done:?}"
                    );
                }
            }
        }
    });
}

/// Two workers append (costs 1, 1 and 2) to a log of L = 2 per 1 ms while the clock moves by
/// exactly W, to where the first entries have just expired (an entry at exactly `t − W` no
/// longer counts): no window of length W ever holds more than L, and no entry is lost.
#[test]
fn log_cell_never_over_limit() {
    let r = rule(2, WINDOW);
    model(
        "log_cell_never_over_limit",
        2,
        [r, r],
        0,
        [&[Op::Check(1), Op::Check(1)], &[Op::Check(2)]],
        WINDOW,
    );
}

/// L = 12, 4 entries prefilled; one worker appends 1 then 2, the other 2 and then refunds 1.
/// Whichever append passes the 6 slots the cell holds moves the log to a heap ring (frozen)
/// while the other worker appends or refunds (frozen again); the clock moves by less than W:
/// nothing lost, nothing refused that fits.
#[test]
fn log_cell_moving_to_the_heap_and_refunding_loses_nothing() {
    let r = rule(12, WINDOW);
    model(
        "log_cell_moving_to_the_heap_and_refunding_loses_nothing",
        12,
        [r, r],
        4,
        [
            &[Op::Check(1), Op::Check(2)],
            &[Op::Check(2), Op::Refund(1)],
        ],
        WINDOW / 2,
    );
}

/// A heap log of 8 entries expires when the clock moves by W; a check after it keeps 2 and
/// moves the log back into the cell (frozen), racing the other worker's checks.
#[test]
fn log_cell_moving_back_into_the_cell_never_over_limit() {
    let r = rule(8, WINDOW);
    model(
        "log_cell_moving_back_into_the_cell_never_over_limit",
        8,
        [r, r],
        0,
        [&[Op::Check(8), Op::Check(2)], &[Op::Check(1)]],
        WINDOW,
    );
}

/// One worker decides under a rule of another tick (a quota change from a 1 ms window to a
/// 3 s one, whose tick is 2 ns): the first check under it re-expresses the log's entries
/// (frozen) while the other worker appends under the old rule. Nothing lost or refused.
#[test]
fn log_cell_retick_races_an_admission() {
    let (old, new) = (rule(4, WINDOW), rule(4, 3_000 * MS));
    assert_eq!(new.tick_nanos(), 2);
    model(
        "log_cell_retick_races_an_admission",
        4,
        [old, new],
        0,
        [&[Op::Check(1), Op::Check(1)], &[Op::Check(1)]],
        0,
    );
}

/// A peek under the old rule races a check that re-expresses the log in place under a new
/// tick: the peek must not read the new slots against the old header (it re-reads the header
/// before its decision stands), so it always sees the two prefilled entries.
#[test]
fn log_cell_a_peek_racing_a_retick_sees_every_entry() {
    let (old, new) = (rule(4, WINDOW), rule(4, 3_000 * MS));
    model(
        "log_cell_a_peek_racing_a_retick_sees_every_entry",
        4,
        [old, new],
        2,
        [&[Op::Peek], &[Op::Check(1)]],
        0,
    );
}

/// L = 1, a full log (1 entry prefilled); one worker refunds it in place and checks 1 again,
/// claiming the slot the refund freed, now the log's head, while the other checks 1. The
/// refund marks the freed slot as not written in its lap: a check that reads it claimed but
/// not yet written waits for it. Marked as written (at tick 0), it would read as an expired
/// entry at the head, and both checks would be admitted: 2 in the window.
#[test]
fn log_cell_a_slot_freed_by_a_refund_reads_as_not_written() {
    let r = rule(1, WINDOW);
    model(
        "log_cell_a_slot_freed_by_a_refund_reads_as_not_written",
        1,
        [r, r],
        1,
        [&[Op::Refund(1), Op::Check(1)], &[Op::Check(1)]],
        0,
    );
}

/// A check reads a heap ring of 7 entries while the other worker grows the log into a new ring
/// (10 more) and refunds the 10 in place, which brings the header back to the positions, time
/// and flags it had: only the generation tells the first check that its ring was replaced, and
/// its CAS must fail (an entry written into the old ring would be lost).
#[test]
fn log_cell_a_check_on_a_replaced_ring_fails_its_cas() {
    let r = rule(20, WINDOW);
    model(
        "log_cell_a_check_on_a_replaced_ring_fails_its_cas",
        20,
        [r, r],
        7,
        [&[Op::Check(1)], &[Op::Check(10), Op::Refund(10)]],
        0,
    );
}

/// L = 1, a log whose positions have gone once round the cell's six slots (six entries a window
/// apart, each expiring the last), two checks at once: the first claim of the second lap lands
/// on the slot of the first entry, long expired. Only the slot's lap bit tells the other check
/// that it is not written yet; read as written, it would be dropped as expired, a second unit
/// admitted, and the first lost.
#[test]
fn log_cell_in_its_second_lap_never_over_limit() {
    explore("log_cell_in_its_second_lap_never_over_limit", || {
        let r = rule(1, WINDOW);
        let cell = Arc::new(LogCell::default());
        for i in 0..6 {
            let (d, _) = cell.decide_at(&r, || START + i * WINDOW, 1, true).unwrap();
            assert!(d.allowed());
        }
        let at = START + 6 * WINDOW;
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let cell = Arc::clone(&cell);
                thread::spawn(move || cell.decide_at(&r, || at, 1, true).unwrap().0.allowed())
            })
            .collect();
        let admitted = workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .filter(|&allowed| allowed)
            .count();
        assert_eq!(admitted, 1, "two units admitted in one window of L = 1");
        let (last, _) = cell.decide_at(&r, || at, 0, false).unwrap();
        assert_eq!(last.remaining(), 0, "the admitted unit lost");
    });
}

/// A keyed store's drain moves a log of one entry (`take_to_move`, then `put` into a new cell)
/// while a check admits on it. The move freezes the header before it copies the slots, so the
/// check either lands first and is carried (the new cell holds 2 entries) or meets the frozen,
/// then moved, header and is turned away to look again (`None`; the new cell holds 1). A move
/// that copied without freezing would let the check's claim land after the copy: admitted, and
/// lost with the old cell.
#[test]
fn log_cell_a_move_racing_an_admission_carries_it_or_turns_it_away() {
    explore_reaching(
        "log_cell_a_move_racing_an_admission_carries_it_or_turns_it_away",
        &["carried", "turned away"],
        |seen| {
            let r = rule(3, WINDOW);
            let old = Arc::new(LogCell::default());
            assert!(old.decide_at(&r, || START, 1, true).unwrap().0.allowed());
            let checker = {
                let old = Arc::clone(&old);
                thread::spawn(move || old.decide_at(&r, || START, 1, true))
            };
            let moved = TableCell::take_to_move(&*old, ()).expect("a live log");
            let new = LogCell::default();
            TableCell::put(&new, moved);
            let checked = checker.join().unwrap();
            let (peek, _) = new.decide_at(&r, || START, 0, false).unwrap();
            let held = 3 - peek.remaining();
            match checked {
                Some((decision, _)) => {
                    assert!(decision.allowed(), "two of three");
                    assert_eq!(held, 2, "an admitted entry is carried by the move");
                    seen.saw("carried");
                }
                None => {
                    assert_eq!(held, 1, "nothing admitted on the old cell");
                    seen.saw("turned away");
                }
            }
        },
    );
}

/// A heap log of 33 entries (a ring of 66 slots, over the 64 a ring may keep idle) expires; one
/// check keeps 1 and moves the log back into the cell, releasing the large ring, while another
/// check of 17 grows the log out of the cell. The release must happen while the log is still
/// frozen: released after the next header is out, it could free the ring the growth had just
/// moved into, leaving a heap header with no ring (every later check retried for ever, which
/// loom reports as a model past its branch bound). Both checks admitted, both entries kept.
#[test]
fn log_cell_a_large_ring_released_racing_a_growth_keeps_the_log() {
    explore(
        "log_cell_a_large_ring_released_racing_a_growth_keeps_the_log",
        || {
            let r = rule(100, WINDOW);
            let cell = Arc::new(LogCell::default());
            assert!(cell.decide_at(&r, || START, 33, true).unwrap().0.allowed());
            let at = START + WINDOW;
            let workers: Vec<_> = [1, 17]
                .into_iter()
                .map(|cost| {
                    let cell = Arc::clone(&cell);
                    thread::spawn(move || cell.decide_at(&r, || at, cost, true).unwrap().0)
                })
                .collect();
            for w in workers {
                assert!(w.join().unwrap().allowed(), "a check refused under L = 100");
            }
            let (peek, _) = cell.decide_at(&r, || at, 0, false).unwrap();
            assert_eq!(peek.remaining(), 100 - 18, "entries lost or counted twice");
        },
    );
}
