use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::time::{Clock, Nanos};

/// A clock that only moves when told to: for tests, simulations and trace replay.
///
/// Clones share the same time. It may be set to any instant, earlier ones included; a limiter
/// clamps a reading older than the newest it has seen (decision rules: time never goes backwards).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), 5_000_000);
/// clock.set(1);
/// assert_eq!(clock.now(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at instant 0.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new().now(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`, saturating at `u64::MAX` nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_minute(1)?)?, clock.clone())?;
    /// assert!(limiter.check().allowed());
    /// assert!(!limiter.check().allowed());
    /// clock.advance(Duration::from_secs(60)); // a minute passes in no time
    /// assert!(limiter.check().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.advance_nanos(by);
    }

    /// Moves the clock forward by `by` nanoseconds, saturating at `u64::MAX`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::{Clock, ManualClock};
    /// let clock = ManualClock::new();
    /// clock.advance_nanos(1_500);
    /// assert_eq!(clock.now(), 1_500);
    /// ```
    pub fn advance_nanos(&self, by: Nanos) {
        // Relaxed: the clock value carries no other data; limiters only read the number.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `nanos`, which may be earlier than now.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// clock.set(5_000_000_000);
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(1)?)?, clock.clone())?;
    /// assert!(limiter.check().allowed());
    /// clock.set(0); // back in time: the limiter treats it as the newest reading, 5 s
    /// assert!(!limiter.check().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn set(&self, nanos: Nanos) {
        // Relaxed: see `advance_nanos`.
        self.nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        // Relaxed: see `advance_nanos`.
        self.nanos.load(Ordering::Relaxed)
    }
}
