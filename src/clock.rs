//! Time sources. Every limiter reads time as nanoseconds since its own origin.
//!
//! | clock | cost per read | resolution | use it when |
//! |---|---|---|---|
//! | [`QuantaClock`] (default) | one TSC read (~10–20 ns) | ~1 ns | always correct |
//! | [`CoarseClock`] | one relaxed load (~1 ns) | its tick (default 1 ms) | the tick is far below the quota's emission interval or window |
//! | [`ManualClock`] | one load | 1 ns | tests and trace replay |

mod coarse;
mod manual;
mod quanta;

pub use self::coarse::CoarseClock;
pub use self::manual::ManualClock;
pub use self::quanta::QuantaClock;

/// Nanoseconds since a limiter's origin.
pub type Nanos = u64;

/// A source of time for a limiter.
///
/// Implementations return nanoseconds since their own origin. A limiter never trusts a clock to
/// be monotonic unless [`Clock::is_monotonic`] says so: for other clocks it clamps every reading
/// to the newest one it has seen, as the SPEC requires.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since this clock's origin.
    fn now(&self) -> Nanos;

    /// The smallest step between two distinct readings, in nanoseconds.
    fn resolution(&self) -> Nanos {
        1
    }

    /// `true` only if readings never decrease, across all threads. A limiter then skips its own
    /// clamp (one shared atomic write per check).
    fn is_monotonic(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
    fn resolution(&self) -> Nanos {
        (**self).resolution()
    }
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}
