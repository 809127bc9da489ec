use std::sync::OnceLock;

use super::{Clock, Nanos};

/// The process-wide calibrated quanta clock: `quanta::Clock::new()` calibrates the TSC, which
/// takes time, so it runs once per process and every limiter shares the result.
pub(crate) fn shared() -> &'static ::quanta::Clock {
    static CLOCK: OnceLock<::quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(::quanta::Clock::new)
}

/// The default, precise clock: quanta's TSC-based clock, nanosecond resolution.
///
/// Cloning is cheap and keeps the origin, so several limiters can share one time line.
///
/// # Caveats
/// quanta uses the TSC only where it is invariant and falls back to the OS monotonic clock
/// otherwise. On machines whose TSCs are not synchronised across cores a reading could be
/// observed out of order between threads; tollgate treats this clock as monotonic, so such a
/// reading acts on the per-key state as a slightly earlier request (each algorithm clamps what it
/// can: window indices never go back, GCRA never treats a request as older than its last
/// admission allows).
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
}

impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        QuantaClock {
            origin: shared().raw(),
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
        let clock = shared();
        clock.delta_as_nanos(self.origin, clock.raw())
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}
