//! The guarded limiter's circuit breaker (`src/redis/guard/breaker.rs`): transient failures
//! racing each other, an answer, and the probes that close it.

use loom::thread;
use std::sync::Arc;
use tollgate_loom_tests::breaker::{Breaker, Phase, Settings};

use crate::{explore_reaching, MS};

/// A run of failures opens it once it has lasted 10 ms; no threshold or rate rule in play.
fn settings() -> Settings {
    Settings {
        threshold: u32::MAX,
        open_after: 10 * MS,
        window: 1_000 * MS,
        rate_ppm: 1_000_000,
        min_failures: u32::MAX,
        half_open_successes: 2,
    }
}

/// Two callers fail (at 0 and 10 ms, and at 10 ms) while a third's call is answered: each
/// opening is reported by exactly one call, the flag agrees with the machine, and the breaker
/// opens only if the answer did not split the run. Then two probes close it, once.
#[test]
fn failures_race_each_other_an_answer_and_the_probes() {
    let reached = ["opened", "split by the answer"];
    explore_reaching(
        "breaker: fail x fail x answer, then probes",
        &reached,
        |seen| {
            let breaker = Arc::new(Breaker::new(settings()));
            let failing: Vec<_> = [vec![0, 10 * MS], vec![10 * MS]]
                .into_iter()
                .map(|times| {
                    let breaker = Arc::clone(&breaker);
                    thread::spawn(move || times.into_iter().filter(|&t| breaker.failed(t)).count())
                })
                .collect();
            breaker.answered(|| 5 * MS);
            let opened: usize = failing.into_iter().map(|t| t.join().unwrap()).sum();
            assert!(opened <= 1, "one opening reported {opened} times");
            assert_eq!(
                opened == 1,
                breaker.is_open(),
                "the flag follows the machine"
            );
            assert_eq!(breaker.phase() == Phase::Open, breaker.is_open());
            seen.saw(if breaker.is_open() {
                "opened"
            } else {
                "split by the answer"
            });
            if breaker.is_open() {
                let probes: Vec<_> = [20 * MS, 21 * MS]
                    .into_iter()
                    .map(|t| {
                        let breaker = Arc::clone(&breaker);
                        thread::spawn(move || breaker.probe_answered(t))
                    })
                    .collect();
                let closed = probes
                    .into_iter()
                    .map(|t| t.join().unwrap())
                    .filter(|&closed| closed)
                    .count();
                assert_eq!(closed, 1, "two probes close it once");
                assert!(!breaker.is_open());
                assert_eq!(breaker.phase(), Phase::Closed);
            }
        },
    );
}
