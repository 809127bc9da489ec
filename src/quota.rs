//! Quotas (`L` units per window `W`, optional burst) and their validation.

use std::time::Duration;

/// A rate: `limit` units per `window`, with an optional burst / capacity.
///
/// A `Quota` only checks what every algorithm needs (`limit ≥ 1`, a positive window, `burst ≥ 1`);
/// each algorithm's constructor checks the rest (its packed state's maximum, 1 ms windows, …),
/// so every invalid value is refused with a [`QuotaError`] at construction, never by a panic
/// later.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, QuotaError};
/// let q = Quota::per_second(100)?.with_burst(10)?;
/// assert_eq!(q.limit(), 100);
/// assert_eq!(q.burst(), 10);
/// assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
/// assert_eq!(Quota::new(5, Duration::ZERO), Err(QuotaError::ZeroWindow));
/// # Ok::<(), QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window: u64,
    burst: Option<u64>,
}

impl Quota {
    /// `limit` units per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Quota, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        let window = u64::try_from(window.as_nanos()).map_err(|_| QuotaError::WindowTooLong)?;
        if window == 0 {
            return Err(QuotaError::ZeroWindow);
        }
        Ok(Quota {
            limit,
            window,
            burst: None,
        })
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    pub fn per_minute(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    pub fn per_hour(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(3600))
    }

    /// Sets the burst `B` (GCRA) or capacity `C` (leaky bucket); it defaults to the limit.
    /// Window algorithms refuse a quota with a burst.
    pub fn with_burst(self, burst: u64) -> Result<Quota, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        Ok(Quota {
            burst: Some(burst),
            ..self
        })
    }

    /// `L`: units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `W`.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// `W` in nanoseconds.
    pub fn window_nanos(&self) -> u64 {
        self.window
    }

    /// `B` / `C`: the burst if one was set, else the limit.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// Whether a burst was set explicitly.
    pub fn has_burst(&self) -> bool {
        self.burst.is_some()
    }
}

/// Why a quota, or a limiter built from it, was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// `L = 0`.
    #[error("the limit must be at least 1")]
    ZeroLimit,
    /// `W = 0`.
    #[error("the window must be longer than zero")]
    ZeroWindow,
    /// `B = 0`.
    #[error("the burst (capacity) must be at least 1")]
    ZeroBurst,
    /// The window does not fit in 64-bit nanoseconds (about 584 years).
    #[error("the window is too long: it must fit in 64-bit nanoseconds (about 584 years)")]
    WindowTooLong,
    /// Window algorithms need `W ≥ 1 ms`.
    #[error("the window is {window_nanos} ns; window algorithms need at least 1 ms")]
    WindowTooShort {
        /// The refused window.
        window_nanos: u64,
    },
    /// `W / L` is under 1 ns.
    #[error("the emission interval window/limit is under 1 ns ({window_nanos} ns / {limit})")]
    IntervalTooShort {
        /// `W` in nanoseconds.
        window_nanos: u64,
        /// `L`.
        limit: u64,
    },
    /// `L` (or `B`) is larger than the algorithm's state can hold.
    #[error("{what} {value} exceeds this algorithm's maximum of {max}")]
    TooLarge {
        /// `"limit"` or `"burst"`.
        what: &'static str,
        /// The refused value.
        value: u64,
        /// The algorithm's maximum.
        max: u64,
    },
    /// `B × T` (the bucket's span in time) does not fit the 64-bit state.
    #[error("burst × emission interval ({burst} × {interval_nanos} ns) exceeds the state's span of 2^62 ns")]
    SpanOverflow {
        /// `B`.
        burst: u64,
        /// `T` in nanoseconds.
        interval_nanos: u64,
    },
    /// Window algorithms have no burst.
    #[error("{algorithm} has no burst; remove the burst from the quota")]
    BurstNotSupported {
        /// The algorithm's name.
        algorithm: &'static str,
    },
    /// The clock cannot tell instants apart finely enough for this quota: its resolution must
    /// be at most a tenth of the quota's period (the bucket span `B·T` for GCRA and the leaky
    /// buckets, the window `W` otherwise).
    #[error("the clock's resolution ({resolution_nanos} ns) is over a tenth of this quota's period ({period_nanos} ns); use the precise clock")]
    ClockTooCoarse {
        /// The clock's resolution.
        resolution_nanos: u64,
        /// The quota's period: `B·T` (GCRA, leaky) or `W` (windows, log).
        period_nanos: u64,
    },
}
