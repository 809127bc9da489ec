//! The answer to a check, and the typed errors a check can return.

use std::time::Duration;

use crate::clock::Nanos;

/// The outcome of a check: whether the request may proceed, and the figures HTTP users render
/// as `Retry-After`, `X-RateLimit-*` or the IETF `RateLimit` fields.
///
/// Every figure is computed exactly from the key's state right after the decision, assuming no
/// other request arrives for the key ([`docs::decision_rules`](crate::docs::decision_rules),
/// "What a decision reports").
///
/// # Examples
/// ```
/// use tollgate::{Gcra, Limiter, Quota};
/// let limiter = Limiter::new(Gcra::new(Quota::per_second(10)?)?);
/// let d = limiter.check();
/// assert!(d.allowed());
/// assert_eq!(d.limit(), 10);
/// assert!(d.remaining() <= 9);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: Flag,
    pub(crate) limit: u64,
    pub(crate) retry_after: Nanos,
    pub(crate) reset_after: Nanos,
    pub(crate) delay: Nanos,
    pub(crate) remaining: Remaining,
}

/// A decision's verdict, kept in a whole word: a decision is copied word by word right after
/// it is built, and reloading a word over a byte-wide store of a `bool` defeats store
/// forwarding (`benches/README.md`, "Method"). Bit 0: allowed;
/// bit 1: charged to the state keys over `max_keys` share ([`Decision::on_shared_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag(u64);

impl From<bool> for Flag {
    #[inline]
    fn from(allowed: bool) -> Self {
        Flag(u64::from(allowed))
    }
}

impl Flag {
    const ALLOWED: u64 = 1;
    const SHARED: u64 = 2;
}

/// `remaining` is computed on demand: for GCRA and the sliding window counter it needs a
/// division, which the hot path should not pay for when nobody reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remaining {
    /// Already known.
    Exact(u64),
    /// `floor(num / den)`.
    Floor { num: u64, den: u64 },
    /// `max(0, ceil(num / den))`, with `num = num_hi·2^64 + num_lo` possibly negative (kept
    /// as two words: an `i128` field would align the whole decision to 16 bytes and make
    /// every copy of it wider).
    Ceil { num_hi: i64, num_lo: u64, den: u64 },
}

impl Remaining {
    /// `max(0, ceil(num / den))`.
    pub(crate) fn ceil(num: i128, den: u64) -> Self {
        Remaining::Ceil {
            num_hi: (num >> 64) as i64,
            num_lo: num as u64,
            den,
        }
    }

    fn value(self) -> u64 {
        match self {
            Remaining::Exact(n) => n,
            Remaining::Floor { num, den } => num / den.max(1),
            Remaining::Ceil {
                num_hi,
                num_lo,
                den,
            } => {
                let num = ((num_hi as i128) << 64) | num_lo as i128;
                if num <= 0 {
                    0
                } else {
                    let den = den.max(1) as i128;
                    u64::try_from((num + den - 1) / den).unwrap_or(u64::MAX)
                }
            }
        }
    }
}

impl Decision {
    /// Whether the request may proceed (for a shaper: may proceed after [`Decision::delay`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Limiter, Quota};
    /// let limiter = Limiter::new(Gcra::new(Quota::per_second(10)?)?);
    /// assert!(limiter.check().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed.0 & Flag::ALLOWED != 0
    }

    /// The quota's limit `L` (units per window).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Limiter, Quota};
    /// let limiter = Limiter::new(Gcra::new(Quota::per_second(10)?)?);
    /// // What `X-RateLimit-Limit` / `RateLimit-Policy: q=` show.
    /// assert_eq!(limiter.check().limit(), 10);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How many cost-1 requests in a row would be allowed right now.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// assert_eq!(limiter.check().remaining(), 9);
    /// assert_eq!(limiter.check_n(9).unwrap().remaining(), 0);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn remaining(&self) -> u64 {
        self.remaining.value()
    }

    /// Zero when allowed; when denied, the shortest wait after which this same request would be
    /// allowed.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// assert_eq!(limiter.check_n(2).unwrap().retry_after(), Duration::ZERO);
    /// // Denied: one unit comes back every 500 ms.
    /// assert_eq!(limiter.check().retry_after(), Duration::from_millis(500));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after)
    }

    /// The wait until the key is back to full capacity; zero when it already is.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// // Two units spent: the bucket is full again after 1 s (`X-RateLimit-Reset`).
    /// assert_eq!(limiter.check_n(2).unwrap().reset_after(), Duration::from_secs(1));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// For the leaky-bucket queue (shaper): how long an admitted request must wait before it
    /// proceeds. Zero for every other algorithm.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, LeakyQueue, Limiter, Quota};
    /// // A shaper: 10 a second, one every 100 ms; admitted requests are told when to go.
    /// let queue = Limiter::with_clock(LeakyQueue::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// assert_eq!(queue.reserve(1).unwrap().delay(), Duration::ZERO);
    /// assert_eq!(queue.reserve(1).unwrap().delay(), Duration::from_millis(100));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay)
    }

    /// [`Decision::retry_after`] in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// limiter.check_n(2).unwrap();
    /// // The exact figure, for callers that schedule in nanoseconds without a `Duration`.
    /// assert_eq!(limiter.check().retry_after_nanos(), 500_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn retry_after_nanos(&self) -> Nanos {
        self.retry_after
    }

    /// [`Decision::reset_after`] in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// assert_eq!(limiter.check().reset_after_nanos(), 500_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reset_after_nanos(&self) -> Nanos {
        self.reset_after
    }

    /// [`Decision::delay`] in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, LeakyQueue, Limiter, Quota};
    /// let queue = Limiter::with_clock(LeakyQueue::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// queue.reserve(1).unwrap();
    /// assert_eq!(queue.reserve(1).unwrap().delay_nanos(), 100_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn delay_nanos(&self) -> Nanos {
        self.delay
    }

    /// This decision, made on the state that keys over a keyed limiter's `max_keys` share
    /// ([`OverflowPolicy::Shared`](crate::OverflowPolicy::Shared)): a refund of what it
    /// admitted goes back there, not to the key's own state.
    pub(crate) fn on_shared_state(self) -> Self {
        Decision {
            allowed: Flag(self.allowed.0 | Flag::SHARED),
            ..self
        }
    }

    /// Whether [`Decision::on_shared_state`] made it.
    #[allow(dead_code)] // read by the waiting calls and the tower layer (features)
    pub(crate) fn charged_shared_state(&self) -> bool {
        self.allowed.0 & Flag::SHARED != 0
    }

    /// These figures for a request that can never be admitted (a cost above the rule's
    /// capacity, given to a pure rule: limiters refuse it with [`LimitError::CapacityExceeded`]
    /// first): denied, and no wait would help.
    pub(crate) fn never(self) -> Self {
        Decision {
            allowed: false.into(),
            retry_after: Nanos::MAX,
            delay: 0,
            ..self
        }
    }

    /// A reservation given back because its slot was too far away (the tower layer's delay
    /// mode, past `max_wait`): denied, nothing left, to be retried when the slot would have
    /// come.
    #[cfg(all(feature = "tower", feature = "tokio"))]
    pub(crate) fn too_late(self) -> Self {
        Decision {
            allowed: false.into(),
            retry_after: self.delay.max(1),
            delay: 0,
            remaining: Remaining::Exact(0),
            ..self
        }
    }

    /// The decision for a cost-0 request or a peek of cost 0 on any state: always allowed.
    pub(crate) fn free(limit: u64, remaining: Remaining, reset_after: Nanos) -> Self {
        Decision {
            allowed: true.into(),
            limit,
            retry_after: 0,
            reset_after,
            delay: 0,
            remaining,
        }
    }
}

/// Why a check could not be decided. A denial is not an error: it is a [`Decision`] with
/// `allowed() == false`.
///
/// # Examples
/// ```
/// use tollgate::{LimitError, Gcra, Limiter, Quota};
/// let limiter = Limiter::new(Gcra::new(Quota::per_second(10)?.with_burst(5)?)?);
/// match limiter.check_n(6) {
///     Ok(d) if d.allowed() => { /* serve */ }
///     Ok(_) => { /* 429: try again after `retry_after` */ }
///     // Never admissible, whatever the wait: a client error (400/413), not a 429.
///     Err(LimitError::CapacityExceeded { cost, capacity }) => assert_eq!((cost, capacity), (6, 5)),
///     Err(LimitError::KeyTableFull { .. }) => unreachable!("a direct limiter has no keys"),
/// }
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The cost can never be admitted: it exceeds the burst / capacity (GCRA, leaky) or the limit
    /// (windows, log). Nothing was changed.
    #[error("cost {cost} exceeds the capacity {capacity}: such a request can never be admitted")]
    CapacityExceeded {
        /// The requested cost.
        cost: u64,
        /// The largest cost this quota can ever admit.
        capacity: u64,
    },
    /// The keyed limiter holds `max_keys` keys and its overflow policy refuses new ones.
    #[error("the limiter already tracks its maximum of {max_keys} keys")]
    KeyTableFull {
        /// The configured bound.
        max_keys: usize,
    },
}
