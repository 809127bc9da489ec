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
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// // 30 units every 10 seconds: windows that are not a second, a minute or an hour.
    /// let q = Quota::new(30, Duration::from_secs(10))?;
    /// assert_eq!(q.window(), Duration::from_secs(10));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
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
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, QuotaError};
    /// assert_eq!(Quota::per_second(10)?.window_nanos(), 1_000_000_000);
    /// assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn per_second(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_minute(100)?.window(), Duration::from_secs(60));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn per_minute(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_hour(1000)?.window(), Duration::from_secs(3600));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn per_hour(limit: u64) -> Result<Quota, QuotaError> {
        Quota::new(limit, Duration::from_secs(3600))
    }

    /// Sets the burst `B` (GCRA) or capacity `C` (leaky bucket); it defaults to the limit.
    /// Window algorithms refuse a quota with a burst.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{FixedWindow, Gcra, Quota, QuotaError};
    /// // A steady 10 a second, but a client that was quiet may send 50 at once.
    /// let q = Quota::per_second(10)?.with_burst(50)?;
    /// assert!(Gcra::new(q).is_ok());
    /// // A window has no burst: refused when the rule is built, not silently ignored.
    /// assert!(matches!(FixedWindow::new(q), Err(QuotaError::BurstNotSupported { .. })));
    /// assert_eq!(q.with_burst(0), Err(QuotaError::ZeroBurst));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
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
    ///
    /// # Examples
    /// ```
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_minute(100)?.limit(), 100);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `W`.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_hour(1)?.window(), Duration::from_secs(3600));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// `W` in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_second(1)?.window_nanos(), 1_000_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn window_nanos(&self) -> u64 {
        self.window
    }

    /// `B` / `C`: the burst if one was set, else the limit.
    ///
    /// # Examples
    /// ```
    /// use tollgate::Quota;
    /// assert_eq!(Quota::per_second(10)?.burst(), 10); // defaults to the limit
    /// assert_eq!(Quota::per_second(10)?.with_burst(3)?.burst(), 3);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// Whether a burst was set explicitly.
    ///
    /// # Examples
    /// ```
    /// use tollgate::Quota;
    /// // Tells "burst 10 set on purpose" from "burst defaulted to a limit of 10".
    /// assert!(!Quota::per_second(10)?.has_burst());
    /// assert!(Quota::per_second(10)?.with_burst(10)?.has_burst());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn has_burst(&self) -> bool {
        self.burst.is_some()
    }
}

/// Why a quota, or a limiter built from it, was refused.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{FixedWindow, Quota, QuotaError};
/// // Every invalid quota is refused when the rule is built; show the message at start-up.
/// let too_short = Quota::new(10, Duration::from_micros(500))?;
/// let err = FixedWindow::new(too_short).unwrap_err();
/// assert_eq!(err, QuotaError::WindowTooShort { window_nanos: 500_000 });
/// assert!(err.to_string().contains("at least 1 ms"));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
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
