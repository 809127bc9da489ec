//! Loom models of tollgate's lock-free state machines (see `loom-tests/README.md`).
//!
//! Each model runs 2–3 threads against the library's own state code (compiled by this crate
//! from `src/`), with time passed in as a value or read from a loom atomic standing in for a
//! monotonic clock, and asserts the SPEC invariant in every execution loom explores.

mod clamp;
mod log;
mod multi;
mod params;
mod table;
mod word;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// One millisecond in nanoseconds.
pub const MS: u64 = 1_000_000;

/// Explores every execution of `body` within the preemption bound, `LOOM_MAX_PREEMPTIONS`
/// (default 2), and prints how many executions that took (or which one failed).
pub fn explore(name: &str, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(2));
    let report = Report {
        name: name.to_owned(),
        bound: builder.preemption_bound.unwrap_or(0),
        executions: Arc::new(AtomicUsize::new(0)),
        started: Instant::now(),
    };
    let counter = Arc::clone(&report.executions);
    builder.check(move || {
        // Relaxed: a tally read after `check` returns; it synchronises nothing.
        counter.fetch_add(1, Ordering::Relaxed);
        body();
    });
}

/// Prints a model's execution count when it ends, passed or failed.
struct Report {
    name: String,
    bound: usize,
    executions: Arc<AtomicUsize>,
    started: Instant,
}

impl Drop for Report {
    fn drop(&mut self) {
        let executions = self.executions.load(Ordering::Relaxed);
        let outcome = if std::thread::panicking() {
            format!("FAILED in execution {executions}")
        } else {
            format!("{executions} executions")
        };
        println!(
            "loom model {}: {outcome} in {:.2?} (preemption bound {})",
            self.name,
            self.started.elapsed(),
            self.bound,
        );
    }
}
