//! The guarded limiter's circuit breaker (`src/redis/guard/breaker.rs`): transient failures
//! racing each other and a probe that closes the breaker.

use loom::thread;
use std::sync::Arc;
use tollgate_loom_tests::breaker::Breaker;

use crate::explore;

/// Threshold 2. Two callers fail (twice and once) while a probe answers (`recovered`): each
/// opening and each closing is reported by exactly one call, so the reports alternate and
/// their difference is the breaker's final state; the breaker opens only after 2 failures
/// counted since the last reset. (With a load-then-store election in `failed`, two callers
/// report one opening.)
#[test]
fn failures_race_each_other_and_a_probe() {
    explore("breaker: fail x fail x recover", || {
        let breaker = Arc::new(Breaker::new(2));
        let failing: Vec<_> = [2, 1]
            .into_iter()
            .map(|times| {
                let breaker = Arc::clone(&breaker);
                thread::spawn(move || (0..times).filter(|_| breaker.failed()).count())
            })
            .collect();
        let closed = usize::from(breaker.recovered());
        let opened: usize = failing.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(closed <= opened, "closed before it opened");
        assert_eq!(
            opened - closed,
            usize::from(breaker.is_open()),
            "{opened} openings and {closed} closings reported"
        );
        assert!(
            opened <= 2,
            "3 failures open it at most twice around one probe"
        );
    });
}
