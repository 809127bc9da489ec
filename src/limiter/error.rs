//! The limiters' errors beside [`LimitError`] (a limiter that cannot decide) and
//! [`QuotaError`](crate::QuotaError) (a quota it cannot hold): [`InFlightBoundError`], an
//! in-flight bound [`InFlight`](crate::InFlight) cannot hold, and [`WaitError`] (feature
//! `tokio`), why a bounded wait gave up, on every limiter that waits.

#[cfg(feature = "tokio")]
use std::time::Duration;

#[cfg(feature = "tokio")]
use crate::decision::LimitError;

/// Why an in-flight bound was refused, by [`InFlight::new`](crate::InFlight::new) and
/// [`InFlight::with_max_keys`](crate::InFlight::with_max_keys).
///
/// A concurrency limit has no quota (no window, no rate), hence an error of its own rather
/// than a [`QuotaError`](crate::QuotaError). Like it, it is a configuration mistake: report it
/// at start-up.
///
/// # Examples
/// ```
/// use tollgate::{InFlight, InFlightBoundError};
/// assert_eq!(InFlight::<u64>::new(0).unwrap_err(), InFlightBoundError::Zero);
/// let e = InFlight::<u64>::new(u64::MAX).unwrap_err();
/// assert!(matches!(e, InFlightBoundError::TooLarge { max: u64::MAX, .. }));
/// assert!(e.to_string().contains("in-flight bound"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InFlightBoundError {
    /// `N = 0`: nothing could ever be admitted.
    #[error("the in-flight bound must be at least 1")]
    Zero,
    /// `N` is above what a key's count holds: `2^62 − 3` (the count's word keeps two bits
    /// for its waiters).
    #[error("the in-flight bound {max} exceeds the largest, {largest}")]
    TooLarge {
        /// The refused bound.
        max: u64,
        /// The largest bound.
        largest: u64,
    },
}

/// Why a bounded wait gave up: `acquire` and `acquire_n` on [`Limiter`](crate::Limiter),
/// [`KeyedLimiter`](crate::KeyedLimiter), [`MultiLimiter`](crate::MultiLimiter) and
/// [`InFlight`](crate::InFlight) (feature `tokio`; see the [`wait`](crate::wait) module).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::wait::{TokioClock, WaitError};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = KeyedLimiter::<String, _, _>::with_clock(Gcra::new(Quota::per_second(1)?)?, TokioClock::new())?;
/// match limiter.acquire_n("k", 2, Duration::from_secs(1)).await {
///     Err(WaitError::Limit(e)) => println!("never admissible: {e}"), // 2 > the burst of 1
///     Err(WaitError::TooLong { wait, .. }) => println!("would wait {wait:?}"),
///     Ok(_) => unreachable!(),
/// }
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The limiter refused to decide (a cost above the capacity, a full key table), at once.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// Not admitted within `max_wait`; nothing was charged, nothing is held.
    ///
    /// The rate limiters know the wait in advance and answer at once, without waiting; an
    /// [`InFlight`](crate::InFlight), which cannot know when a permit comes back, answers once
    /// it has waited `max_wait` in vain (at once for a key over `max_keys` sharing the
    /// overflow count, where nobody waits).
    #[error("not admitted within the {max_wait:?} allowed (the wait would be {wait:?} or more)")]
    TooLong {
        /// How long admission would still have taken, at least: for the rate limiters, the
        /// wait they saw (longer than `max_wait`); for an [`InFlight`](crate::InFlight),
        /// `max_wait`.
        wait: Duration,
        /// The bound given.
        max_wait: Duration,
    },
}
