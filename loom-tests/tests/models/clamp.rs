//! The limiter's clamp for clocks that do not promise monotonic readings (`Core::now` in
//! `src/limiter.rs`), together with `AtomicWord::update`.
//!
//! `src/limiter.rs` also declares the limiter's submodules and pulls in dashmap and quanta, so
//! this crate cannot compile it; the clamp's one expression is copied below instead, and
//! `clamp_copy_matches_limiter_source` fails if the original changes.

use std::cell::Cell;

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::AtomicWord;

use crate::explore;

/// The clamp's expression, as `Core::now` has it.
const ORIGINAL: &str = "Some(high) => high.fetch_max(reading, Ordering::Relaxed).max(reading),";

/// `Core::now` for a clock that is not monotonic.
fn clamp(high: &AtomicU64, reading: Nanos) -> Nanos {
    high.fetch_max(reading, Ordering::Relaxed).max(reading)
}

#[test]
fn clamp_copy_matches_limiter_source() {
    let source = include_str!("../../../src/limiter.rs");
    assert!(
        source.contains(ORIGINAL),
        "Core::now in src/limiter.rs changed: update `clamp` in loom-tests/tests/models/clamp.rs"
    );
}

/// Three threads whose raw readings go backwards (10 then 1, 5 then 2, 7 then 3) update one
/// word that records the time it was written at. Each rule run asserts the state is not newer
/// than its own clamped reading (SPEC: a reading older than the newest seen is treated as the
/// newest), and each thread's clamped readings never decrease.
///
/// Three threads, not two: with two, loom's DPOR (which keeps one last access per object) never
/// schedules "B reads the clock; A reads, loads, writes; B loads", and so misses a clock read
/// hoisted above the state load; a third thread makes it explore that order.
#[test]
fn clamp_keeps_time_monotonic() {
    explore("clamp_keeps_time_monotonic", || {
        let high = Arc::new(AtomicU64::new(0));
        let word = Arc::new(AtomicWord::new(0));
        let run = |high: &AtomicU64, word: &AtomicWord, readings: [Nanos; 2]| {
            readings.map(|reading| {
                let judged = Cell::new(0);
                word.update(
                    || clamp(high, reading),
                    |state, t| {
                        assert!(state <= t, "judged at {t} a state written at {state}");
                        judged.set(t);
                        ((), t)
                    },
                );
                judged.get()
            })
        };
        let threads = [[10, 1], [5, 2], [7, 3]].map(|readings| {
            let (high, word) = (Arc::clone(&high), Arc::clone(&word));
            thread::spawn(move || run(&high, &word, readings))
        });
        for thread in threads {
            let times = thread.join().unwrap();
            assert!(
                times[0] <= times[1],
                "time went back in one thread: {times:?}"
            );
        }
        assert_eq!(word.load(), 10);
        assert_eq!(high.load(Ordering::Relaxed), 10);
    });
}
