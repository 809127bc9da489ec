//! `Engine`, the part every limiter shares, on a window counter whose stored indices must be
//! re-anchored: the sweep-then-rebase protocol racing decisions (`src/limiter/engine.rs`).
//!
//! The fixed window keeps its window index in 40 bits, read within `[base − Q, base + 3Q)`,
//! `Q = 2^38`. From window `base + 2Q` a call sweeps and rebases after it is done (one caller,
//! the others go on under the old base); from `base + 3Q` the rule refuses to store, and every
//! caller waits for the rebase and decides again. The models put readings there and check that
//! no admission is lost or doubled, whoever rebases and whichever base a decision used.

use loom::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use tollgate_loom_tests::clock::{Clock, Nanos};
use tollgate_loom_tests::limiter::Engine;
use tollgate_loom_tests::state::AtomicWord;
use tollgate_loom_tests::{Decision, FixedWindow, Quota, Stored};

use crate::{explore, MS};

/// `Q` for the fixed window, in windows of 1 ms.
const Q: u64 = 1 << 38;

/// The first reading of window `index`, plus `offset` ns.
fn at_window(index: u64, offset: Nanos) -> Nanos {
    index * MS + offset
}

/// A clock that a model moves: readings never decrease (each thread sees the stores in order,
/// and a state written after a reading carries that reading to whoever loads it).
#[derive(Debug)]
struct SetClock(AtomicU64);

impl Clock for SetClock {
    fn now(&self) -> Nanos {
        // Acquire: pairs with `set`, as a real clock's reading follows the instant it reports.
        self.0.load(Ordering::Acquire)
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

impl SetClock {
    fn set(&self, t: Nanos) {
        // Release: see `now`.
        self.0.store(t, Ordering::Release);
    }
}

/// A direct limiter: one cell, swept by resetting it if it is fresh.
struct Direct {
    engine: Engine<FixedWindow, Arc<SetClock>>,
    cell: AtomicWord,
}

impl Direct {
    /// L = 1 per 1 ms, anchored at window 0, one unit admitted in window 5.
    fn start() -> Arc<Direct> {
        let rule = FixedWindow::new(Quota::new(1, Duration::from_millis(1)).unwrap()).unwrap();
        let clock = Arc::new(SetClock(AtomicU64::new(0)));
        let direct = Direct {
            engine: Engine::new(rule, clock).unwrap(),
            cell: AtomicWord::new(0),
        };
        direct.set_clock(at_window(5, 0));
        assert!(direct.check().allowed());
        Arc::new(direct)
    }

    fn set_clock(&self, t: Nanos) {
        self.engine.clock().set(t);
    }

    fn check(&self) -> Decision {
        let sweep = |rule: &FixedWindow, now: Nanos| {
            rule.reset_if_fresh(&self.cell, now);
            0
        };
        loop {
            let at = self.engine.attempt();
            let decision = at
                .rule()
                .acquire(&self.cell, || at.now_noting_due(), 1, true);
            if self.engine.settle(&at, &sweep) {
                return decision;
            }
        }
    }

    fn peek(&self) -> Decision {
        let rule = self.engine.rule();
        rule.acquire(&self.cell, || self.engine.now(), 1, false)
    }
}

/// Two checks at a reading past the horizon (window 3Q + 7): both must wait for one rebase,
/// and exactly one is admitted (a fresh window, L = 1). Afterwards the window is full and the
/// base has moved up to the reading.
#[test]
fn checks_past_the_horizon_wait_for_the_rebase() {
    explore("checks_past_the_horizon_wait_for_the_rebase", || {
        let direct = Direct::start();
        let now = at_window(3 * Q + 7, 0);
        direct.set_clock(now);
        let threads = [0, 1].map(|_| {
            let direct = Arc::clone(&direct);
            thread::spawn(move || direct.check().allowed())
        });
        let admitted = threads
            .map(|t| t.join().unwrap())
            .iter()
            .filter(|&&a| a)
            .count();
        assert_eq!(admitted, 1, "admitted in one fresh window of L = 1");
        assert!(!direct.peek().allowed(), "the admission was stored");
        assert!(direct.engine.rule().sweep_due() > now, "rebased");
    });
}

/// One check at window 2Q + 3 (past the sweep instant, before the horizon: it may sweep and
/// rebase, or leave it to the other), one at window 3Q + 7 (past the horizon: it must wait for
/// a rebase). A check that reads the earlier time admits in its own window; one that loaded
/// the later check's state reads the later time too and shares its window. So: both admitted,
/// or exactly one if both judged at the later time; and the later window is full at the end.
#[test]
fn a_rebase_races_a_check_under_the_old_base() {
    explore("a_rebase_races_a_check_under_the_old_base", || {
        let direct = Direct::start();
        let early = at_window(2 * Q + 3, 0);
        let late = at_window(3 * Q + 7, 0) + MS / 2;
        direct.set_clock(early);
        let first = {
            let direct = Arc::clone(&direct);
            thread::spawn(move || direct.check())
        };
        let second = {
            let direct = Arc::clone(&direct);
            thread::spawn(move || {
                direct.set_clock(late);
                direct.check()
            })
        };
        let (first, second) = (first.join().unwrap(), second.join().unwrap());
        // The figures tell the reading: a full window of 1 ms from its start, or half of it.
        let first_early = first.reset_after_nanos().max(first.retry_after_nanos()) == MS;
        if first_early {
            assert!(first.allowed() && second.allowed(), "{first:?} {second:?}");
        } else {
            assert_eq!(
                first.allowed() as u8 + second.allowed() as u8,
                1,
                "{first:?} {second:?}"
            );
        }
        assert!(!direct.peek().allowed(), "the later window is full");
        assert!(direct.engine.rule().sweep_due() > late, "rebased");
    });
}
