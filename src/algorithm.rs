//! The algorithms of the decision rules (`docs/decision-rules.md`), one file each, as pure
//! functions.
//!
//! Each rule is a plain `Copy` value (its parameters) with a function from (state, now, cost)
//! to (decision, next state). Nothing here touches an atomic: the crate's state cells store the
//! states and run the compare-and-swap loops, which is what makes the rules testable, fuzzable and
//! model-checkable on their own.
//!
//! The rules' packed states are the crate's own (they change with its storage); a limiter on a
//! [`ManualClock`](crate::clock::ManualClock) runs a rule on chosen times:
//!
//! ```
//! use tollgate::{clock::ManualClock, FixedWindow, Limiter, Quota};
//! let clock = ManualClock::new();
//! let limiter = Limiter::with_clock(FixedWindow::new(Quota::per_second(2)?)?, clock.clone())?;
//! let d1 = limiter.check();
//! clock.advance(std::time::Duration::from_nanos(100));
//! let d2 = limiter.check();
//! let d3 = limiter.check();
//! assert_eq!([d1.allowed(), d2.allowed(), d3.allowed()], [true, true, false]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Explicit paths: `loom-tests` includes this file with `#[path]`, which makes rustc look for
// undecorated child modules beside it (`src/gcra.rs`); these resolve the same from both crates.
#[path = "algorithm/fixed_window.rs"]
pub mod fixed_window;
#[path = "algorithm/gcra.rs"]
pub mod gcra;
#[path = "algorithm/grid.rs"]
mod grid;
#[path = "algorithm/in_flight.rs"]
pub(crate) mod in_flight;
#[path = "algorithm/leaky_queue.rs"]
pub mod leaky_queue;
#[path = "algorithm/name.rs"]
mod name;
#[path = "algorithm/rule.rs"]
pub(crate) mod rule;
#[path = "algorithm/sliding_log.rs"]
pub mod sliding_log;
#[path = "algorithm/sliding_window.rs"]
pub mod sliding_window;

use crate::clock::Nanos;

pub use self::fixed_window::FixedWindow;
pub use self::gcra::Gcra;
pub(crate) use self::in_flight::Concurrency;
pub use self::leaky_queue::LeakyQueue;
pub use self::name::AlgorithmName;
pub use self::rule::Rule;
// The one-word rules' pure functions: crate-private (their packed states are the stores'),
// public to the fuzz targets only, which call them on arbitrary states.
#[cfg(fuzzing)]
pub use self::rule::WordRule;
#[cfg(not(fuzzing))]
pub(crate) use self::rule::WordRule;
pub(crate) use self::rule::{Words, WORDS};
pub use self::sliding_log::SlidingLog;
pub use self::sliding_window::SlidingWindow;

/// The token bucket is GCRA (decision rules §1): the same decisions, kept as one number.
///
/// # Examples
/// ```
/// use tollgate::{algorithm::TokenBucket, Limiter, Quota};
/// // Refill 10 tokens a second into a bucket of 20.
/// let bucket = TokenBucket::new(Quota::per_second(10)?.with_burst(20)?)?;
/// let limiter = Limiter::new(bucket);
/// // A full bucket to start with: 20 at once, then it is empty.
/// assert!(limiter.check_n(20)?.allowed());
/// assert!(!limiter.check().allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type TokenBucket = Gcra;
/// The leaky bucket as a meter decides exactly as GCRA with `B = C` (decision rules §2).
///
/// # Examples
/// ```
/// use tollgate::{algorithm::LeakyBucket, Limiter, Quota};
/// // Leaks 5 a second; holds at most 5 (the burst is the bucket's capacity C).
/// let limiter = Limiter::new(LeakyBucket::new(Quota::per_second(5)?)?);
/// for _ in 0..5 {
///     assert!(limiter.check().allowed());
/// }
/// // Full: the next drop overflows until one leaks out (200 ms).
/// let d = limiter.check();
/// assert!(!d.allowed());
/// assert!(d.retry_after() <= std::time::Duration::from_millis(200));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type LeakyBucket = Gcra;

macro_rules! rule {
    ($ty:ty, $name:literal, $capacity:ident, $period:ident, $window:ident) => {
        impl rule::sealed::Sealed for $ty {}
        impl Rule for $ty {
            const NAME: &'static str = $name;
            fn limit(&self) -> u64 {
                self.limit()
            }
            fn capacity(&self) -> u64 {
                self.$capacity()
            }
            fn period(&self) -> Nanos {
                self.$period()
            }
            fn window_nanos(&self) -> Nanos {
                self.$window()
            }
        }
    };
}

rule!(Gcra, "gcra", capacity, period, recovered_window);
rule!(
    LeakyQueue,
    "leaky-queue",
    capacity,
    period,
    recovered_window
);
rule!(FixedWindow, "fixed-window", capacity, period, window);
rule!(SlidingWindow, "sliding-window", capacity, period, window);
rule!(SlidingLog, "sliding-log", limit, window, window);
rule!(Concurrency, "in-flight", capacity, period, window);
