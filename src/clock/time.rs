//! The time type and the clock trait (no dependency: `loom-tests` includes this file).

/// Nanoseconds since a limiter's origin.
pub type Nanos = u64;

/// A source of time for a limiter.
///
/// Implementations return nanoseconds since their own origin. A limiter never trusts a clock to
/// be monotonic unless [`Clock::is_monotonic`] says so: for other clocks it clamps every reading
/// to the newest one it has seen, as the SPEC requires.
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since this clock's origin.
    ///
    /// A limiter may read its clock while it holds one of its own locks (a shard's while it
    /// inserts a key, a sliding log's): `now` must not insert a key into, or check a sliding log
    /// of, the limiter that reads it, or the two calls may wait for each other forever.
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
