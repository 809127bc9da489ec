use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Clock, Nanos};

/// A clock that only moves when told to: for tests, simulations and trace replay.
///
/// Clones share the same time. It may be set to any instant, earlier ones included; a limiter
/// clamps a reading older than the newest it has seen (SPEC: time never goes backwards).
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
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.advance_nanos(by);
    }

    /// Moves the clock forward by `by` nanoseconds, saturating at `u64::MAX`.
    pub fn advance_nanos(&self, by: Nanos) {
        // Relaxed: the clock value carries no other data; limiters only read the number.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `nanos`, which may be earlier than now.
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
