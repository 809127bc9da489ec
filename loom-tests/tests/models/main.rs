//! Loom models of tollgate's lock-free state machines (see `loom-tests/README.md`).
//!
//! Each model runs 2–3 threads against the library's own state code (compiled by this crate
//! from `src/`), with time passed in as a value or read from a loom atomic standing in for a
//! monotonic clock, and asserts the SPEC invariant in every execution loom explores.

mod breaker;
mod clamp;
mod engine;
mod in_flight;
mod lease;
mod log;
mod log_table;
mod multi;
mod params;
mod table;
mod word;
mod word_table;
mod word_table_panics;

use std::collections::BTreeSet;
use std::hash::Hash;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::store::{Evictor, KeyTable, StoreProtocol};
use tollgate_loom_tests::{Gcra, Stored};

/// A keyed limiter's evictor at a frozen instant: sweeps `table` and judges its cells under
/// `rule` at `at`, as `KeyedLimiter` does under the rule in force (no quota change runs in the
/// models).
pub struct At<'a, S, A: Stored = Gcra> {
    pub table: &'a KeyTable<u64, A::Cell, S>,
    pub rule: A,
    pub at: Nanos,
}

impl<S: StoreProtocol<u64, A::Cell>, A: Stored> Evictor<A::Cell> for At<'_, S, A> {
    fn sweep(&self) -> usize {
        self.table.evict_fresh(&self.rule, self.at)
    }

    /// Judges every cell as if unused since `at` (any fresh key may go): the models check the
    /// retire-vs-decide protocol, not which keys a shard keeps.
    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&A::Cell, Nanos) -> bool) -> R,
    ) -> Option<R> {
        Some(f(self.at, &|cell, _since| {
            self.rule.evict_if_fresh(cell, self.at)
        }))
    }
}

/// A fixed hasher for the table models: loom replays executions, so slots must not move
/// between them.
pub type Hasher = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;

/// `n` keys that fall in the same shard of a table hashed by [`Hasher`] (the top 6 bits of
/// their hash), so that inserting them fills one table of 8 slots.
pub fn same_shard_keys(n: usize) -> Vec<u64> {
    use std::hash::BuildHasher;
    let shard = |key: &u64| Hasher::default().hash_one(key) >> 58;
    let first = shard(&0);
    (0..).filter(|k| shard(k) == first).take(n).collect()
}

/// One millisecond in nanoseconds.
pub const MS: u64 = 1_000_000;

/// Explores every execution of `body` within the preemption bound, `LOOM_MAX_PREEMPTIONS`
/// (default 2), and prints how many executions that took (or which one failed).
pub fn explore(name: &str, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(2));
    // Room for a model whose keys have drop glue: a table dropped in it visits each slot's
    // cell (loom's default is 1,000 branches).
    builder.max_branches = 20_000;
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

/// The outcomes a model's executions reached, so that a model can show it explored the race it
/// is about (an ordering that never happens proves nothing).
#[derive(Default)]
pub struct Seen(Mutex<BTreeSet<String>>);

impl Seen {
    pub fn saw(&self, outcome: impl Into<String>) {
        self.0.lock().unwrap().insert(outcome.into());
    }

    /// Asserts that every one of `expected` was reached in some execution.
    pub fn assert_reached(&self, expected: &[&str]) {
        let seen = self.0.lock().unwrap();
        for outcome in expected {
            assert!(
                seen.contains(*outcome),
                "never reached {outcome:?}; reached {seen:?}"
            );
        }
    }
}

/// Explores `body`, then checks that the executions reached each of `expected`.
pub fn explore_reaching(
    name: &str,
    expected: &[&str],
    body: impl Fn(&Seen) + Sync + Send + 'static,
) {
    let seen = std::sync::Arc::new(Seen::default());
    let in_model = std::sync::Arc::clone(&seen);
    explore(name, move || body(&in_model));
    seen.assert_reached(expected);
}

/// A key with drop glue whose live copies are counted in the [`Copies`] that made it: every
/// copy the library makes (a drain's move, a permit's key) must be dropped once.
#[derive(Debug)]
pub struct Counted<T> {
    value: T,
    live: Arc<AtomicIsize>,
}

impl<T: Clone> Clone for Counted<T> {
    fn clone(&self) -> Self {
        Copies(Arc::clone(&self.live)).key(self.value.clone())
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        // SeqCst: the models' own tally (a std atomic: loom does not explore it).
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T: PartialEq> PartialEq for Counted<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for Counted<T> {}

impl<T: Hash> Hash for Counted<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

/// The live copies of the keys a model made.
#[derive(Default)]
pub struct Copies(Arc<AtomicIsize>);

impl Copies {
    pub fn new() -> Copies {
        Copies::default()
    }

    /// A key of `value`, counted.
    pub fn key<T>(&self, value: T) -> Counted<T> {
        // SeqCst: as in `Counted::drop`.
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted {
            value,
            live: Arc::clone(&self.0),
        }
    }

    /// Asserts that every copy of a key was dropped, none twice (call once the store and the
    /// model's keys are gone, and every thread that held one has been joined).
    pub fn assert_all_dropped(&self) {
        // SeqCst: as in `Counted::drop`.
        let left = self.0.load(Ordering::SeqCst);
        assert_eq!(
            left, 0,
            "copies of keys left (or dropped twice, if negative)"
        );
    }
}
