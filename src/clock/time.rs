//! The time type and the clock trait (no dependency: `loom-tests` includes this file).

/// Nanoseconds since a limiter's origin.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::clock::Nanos;
/// let retry: Nanos = 1_500_000_000;
/// assert_eq!(Duration::from_nanos(retry), Duration::from_millis(1500));
/// ```
pub type Nanos = u64;

/// A source of time for a limiter.
///
/// Implementations return nanoseconds since their own origin. A limiter never trusts a clock to
/// be monotonic unless [`Clock::is_monotonic`] says so: for other clocks it clamps every reading
/// to the newest one it has seen ([`docs::decision_rules`](crate::docs::decision_rules):
/// time never goes backwards for a limiter).
///
/// # Examples
/// ```
/// use std::time::Instant;
/// use tollgate::{clock::{Clock, Nanos}, Gcra, Limiter, Quota};
///
/// /// Time from `std::time::Instant`, e.g. to share an origin with the rest of a program.
/// struct StdClock(Instant);
///
/// impl Clock for StdClock {
///     fn now(&self) -> Nanos {
///         self.0.elapsed().as_nanos() as Nanos
///     }
///     fn is_monotonic(&self) -> bool {
///         true // `Instant` never goes back, so the limiter may skip its clamp
///     }
/// }
///
/// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(1)?)?, StdClock(Instant::now()))?;
/// assert!(limiter.check().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since this clock's origin.
    ///
    /// A limiter may read its clock while it holds one of its own locks (a shard's while it
    /// inserts a key, a sliding log's): `now` must not insert a key into, or check a sliding log
    /// of, the limiter that reads it, or the two calls may wait for each other forever.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// clock.advance_nanos(42);
    /// assert_eq!(clock.now(), 42);
    /// ```
    fn now(&self) -> Nanos;

    /// The smallest step between two distinct readings, in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::{Clock, CoarseClock, QuantaClock};
    /// assert_eq!(QuantaClock::new().resolution(), 1);
    /// assert_eq!(CoarseClock::new().resolution(), 1_000_000); // what limiters judge quotas against
    /// ```
    fn resolution(&self) -> Nanos {
        1
    }

    /// `true` only if readings never decrease, across all threads. A limiter then skips its own
    /// clamp (one shared atomic write per check).
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::{Clock, ManualClock};
    /// // A manual clock may be set back, so limiters clamp its readings.
    /// assert!(!ManualClock::new().is_monotonic());
    /// ```
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
