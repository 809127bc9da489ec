//! The limiter's clamp for clocks that do not promise monotonic readings (`state::HighWater`,
//! the very type `Engine::now` uses), together with `AtomicWord::update`.

use std::cell::Cell;

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::{AtomicWord, HighWater};

use crate::explore;

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
        let high = Arc::new(HighWater::new());
        let word = Arc::new(AtomicWord::new(0));
        let run = |high: &HighWater, word: &AtomicWord, readings: [Nanos; 2]| {
            readings.map(|reading| {
                let judged = Cell::new(0);
                word.update(
                    || high.clamp(reading),
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
        // A reading of 0 changes nothing and returns the newest reading seen.
        assert_eq!(high.clamp(0), 10);
    });
}
