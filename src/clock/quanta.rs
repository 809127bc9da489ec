use std::cell::Cell;
use std::sync::OnceLock;

use super::time::{Clock, Nanos};

thread_local! {
    /// The newest raw reading this thread has taken: readings never go back on one thread.
    /// Raw readings share one time line across every `QuantaClock` in the process.
    static NEWEST_RAW: Cell<u64> = const { Cell::new(0) };
}

/// The process-wide calibrated quanta clock: `quanta::Clock::new()` calibrates the TSC, which
/// takes time, so it runs once per process and every limiter shares the result.
pub(crate) fn shared() -> &'static ::quanta::Clock {
    static CLOCK: OnceLock<::quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(::quanta::Clock::new)
}

/// The default, precise clock: quanta's TSC-based clock, nanosecond resolution.
///
/// Cloning is cheap and keeps the origin, so several limiters can share one time line. The TSC
/// is calibrated once per process and shared by every clock.
///
/// # Caveats
/// quanta uses the TSC only where it is invariant and falls back to the OS monotonic clock
/// otherwise. A thread that migrates between cores whose TSCs are not perfectly synchronised
/// could read a slightly earlier value than it read before; every reading is therefore clamped
/// to the newest one the same thread has seen (a thread-local, so no shared cache line is
/// written). Across threads the clamp relies on the TSC being synchronised; where it is not, a
/// reading a few nanoseconds stale reaches the per-key state as a slightly earlier request, which
/// every rule judges at least as strictly (window indices never go back, GCRA never admits more
/// for an earlier time). The TSC read is not fenced (quanta issues a plain `rdtsc`), so the CPU
/// may take it before the state load that precedes it in program order: the same case, a
/// reading slightly older than the state it judges, and judged the same way, so no fence is paid
/// for on every check.
///
/// # Examples
/// ```
/// use tollgate::clock::{Clock, QuantaClock};
/// let clock = QuantaClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone)]
pub struct QuantaClock {
    origin: u64,
    /// The shared calibrated clock, looked up once here rather than through the `OnceLock` on
    /// every reading.
    clock: &'static ::quanta::Clock,
}

impl QuantaClock {
    /// A clock whose origin is now.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::QuantaClock, Gcra, KeyedLimiter, Quota};
    /// // What `new` constructors use; pass one explicitly to share it between limiters.
    /// let clock = QuantaClock::new();
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(5)?)?)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new() -> Self {
        let clock = shared();
        QuantaClock {
            origin: clock.raw(),
            clock,
        }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> Nanos {
        let clock = self.clock;
        let raw = NEWEST_RAW.with(|newest| {
            let raw = clock.raw().max(newest.get());
            newest.set(raw);
            raw
        });
        clock.delta_as_nanos(self.origin, raw)
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}
