//! What a leased node is told ([`LeaseConfig`]), what it refuses ([`LeaseError`]) and what
//! it counts ([`LeaseStats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::word::MAX_LEASE;
use crate::redis::exact::Algo;
use crate::redis::rule::RedisRule;

/// Why a [`LeasedLimiter`](super::LeasedLimiter) could not be built.
///
/// # Examples
/// ```
/// use tollgate::redis::LeaseError;
/// let e = LeaseError::Unsupported { algorithm: "sliding-log" };
/// // The message names the algorithm and what to use instead.
/// assert!(e.to_string().contains("sliding-log"));
/// assert_eq!(LeaseError::NoRuntime.to_string(), "the leased tier needs a tokio runtime");
/// ```
/// Where it comes from: [`RedisLimiter::leased`](crate::redis::RedisLimiter::leased) (which
/// needs a server, so `no_run`):
/// ```no_run
/// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, LeaseConfig, LeaseError, RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let rule = RedisRule::sliding_log(Quota::per_minute(100)?)?;
/// let exact = RedisLimiter::connect("redis://127.0.0.1/", rule).await?;
/// // A sliding log records each request's time: it cannot be leased as a count of units.
/// let err = exact.leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local)).await.unwrap_err();
/// assert!(matches!(err, LeaseError::Unsupported { .. }));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The rule's algorithm cannot be leased: a lease is a count of units, which fits GCRA /
    /// token bucket / leaky bucket (meter), fixed window and sliding window counter. The
    /// leaky bucket as a queue must tell each request its own delay, and the sliding log
    /// must record each request's time: use the exact tier for them.
    #[error("the leased tier does not support {algorithm}: use gcra (token-bucket, leaky-bucket), fixed-window or sliding-window, or the exact tier")]
    Unsupported {
        /// The rule's algorithm.
        algorithm: &'static str,
    },
    /// Not called on a tokio runtime: refills run as tokio tasks.
    #[error("the leased tier needs a tokio runtime")]
    NoRuntime,
}

/// How a [`LeasedLimiter`](super::LeasedLimiter) sizes, refills and returns its leases.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::LeaseConfig;
/// let config = LeaseConfig::new()
///     .horizon(Duration::from_millis(20))
///     .max_lease(10_000)
///     .idle_timeout(Duration::from_millis(500));
/// assert_eq!(config.max_lease_for(1_000_000), 10_000);
/// assert_eq!(LeaseConfig::new().max_lease_for(1_600), 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    pub(super) horizon: Duration,
    pub(super) max_lease: Option<u64>,
    pub(super) idle_timeout: Duration,
    pub(super) max_age: Duration,
    pub(super) backoff: Duration,
    pub(super) first_touch: Option<u64>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseConfig {
    /// Leases of 50 ms of demand, at most 1/16 of the capacity, returned after 1 s idle;
    /// window leases live at most 10 s; a short grant is retried after at least 1 ms.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::LeaseConfig;
    /// // The defaults, spelled out (Default is the same).
    /// assert_eq!(
    ///     LeaseConfig::new(),
    ///     LeaseConfig::default()
    ///         .horizon(Duration::from_millis(50))
    ///         .idle_timeout(Duration::from_secs(1))
    ///         .max_age(Duration::from_secs(10))
    ///         .backoff(Duration::from_millis(1))
    ///         .first_touch(0)
    /// );
    /// ```
    pub fn new() -> Self {
        LeaseConfig {
            horizon: Duration::from_millis(50),
            max_lease: None,
            idle_timeout: Duration::from_secs(1),
            max_age: Duration::from_secs(10),
            backoff: Duration::from_millis(1),
            first_touch: Some(0),
        }
    }

    /// A lease holds about this much of the key's recent demand (default 50 ms; at least
    /// 1 ms). Longer means fewer round trips and a larger under-admission bound; for GCRA it
    /// is also how long past its slot in the bucket a leased unit may be spent, which the
    /// fleet bound adds (`horizon / T` units, see "Guarantee" on
    /// [`LeasedLimiter`](super::LeasedLimiter)).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::LeaseConfig;
    /// // Fewer round trips for a steady, high-rate key.
    /// let config = LeaseConfig::new().horizon(Duration::from_millis(200));
    /// assert_ne!(config, LeaseConfig::new());
    /// // Below the 1 ms floor, the floor applies.
    /// assert_eq!(
    ///     LeaseConfig::new().horizon(Duration::ZERO),
    ///     LeaseConfig::new().horizon(Duration::from_millis(1))
    /// );
    /// ```
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon.max(Duration::from_millis(1));
        self
    }

    /// The most units a node holds for one key (default: the rule's capacity ÷ 16, at least
    /// 1; at most [`MAX_LEASE`]). The under-admission bound is `nodes × max_lease`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{LeaseConfig, MAX_LEASE};
    /// // 10 nodes × 500 units: the fleet falls short of the limit by at most 5,000 units.
    /// assert_eq!(LeaseConfig::new().max_lease(500).max_lease_for(1_000_000), 500);
    /// // Clamped to [1, MAX_LEASE].
    /// assert_eq!(LeaseConfig::new().max_lease(0).max_lease_for(1_000_000), 1);
    /// assert_eq!(LeaseConfig::new().max_lease(u64::MAX).max_lease_for(u64::MAX), MAX_LEASE);
    /// ```
    pub fn max_lease(mut self, units: u64) -> Self {
        self.max_lease = Some(units.clamp(1, MAX_LEASE));
        self
    }

    /// A key whose lease is untouched this long gives its units back and is forgotten
    /// (default 1 s; at least 10 ms).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::LeaseConfig;
    /// // Many short-lived keys (one per client IP): give their units back sooner.
    /// let config = LeaseConfig::new().idle_timeout(Duration::from_millis(200));
    /// assert_ne!(config, LeaseConfig::new());
    /// assert_eq!(
    ///     LeaseConfig::new().idle_timeout(Duration::from_millis(1)),
    ///     LeaseConfig::new().idle_timeout(Duration::from_millis(10))
    /// );
    /// ```
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// A window lease expires after this long even if its window lasts longer (default 10 s,
    /// between 1 ms and 1 day): it bounds how far the node's clock may drift from the
    /// server's while it holds units.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::LeaseConfig;
    /// // Nodes whose clocks are only loosely synchronized: hold window units 2 s at most.
    /// let config = LeaseConfig::new().max_age(Duration::from_secs(2));
    /// assert_ne!(config, LeaseConfig::new());
    /// // At most a day.
    /// assert_eq!(
    ///     LeaseConfig::new().max_age(Duration::from_secs(7 * 86_400)),
    ///     LeaseConfig::new().max_age(Duration::from_secs(86_400))
    /// );
    /// ```
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age.clamp(Duration::from_millis(1), Duration::from_secs(86_400));
        self
    }

    /// After a grant that was short (the global budget ran out), the next request for that
    /// key waits at least this long (default 1 ms), and at most the
    /// [horizon](LeaseConfig::horizon) or until more budget is due, whichever comes first
    /// (units given back by other nodes are picked up within the horizon).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::LeaseConfig;
    /// // A key whose budget is spent: ask Redis again at most every 5 ms, not every 1 ms.
    /// let config = LeaseConfig::new().backoff(Duration::from_millis(5));
    /// assert_ne!(config, LeaseConfig::new());
    /// ```
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How many units a node may admit for a key it holds no lease of, while the key's first
    /// grant is in flight (its *first touch*; see [`LeasedLimiter`](super::LeasedLimiter)). Default `0`, strict: a
    /// key's checks are denied until its first grant arrives (or [`LeasedLimiter::prefetch`](super::LeasedLimiter::prefetch)
    /// ran), and the fleet admits no more than the bound on
    /// [`LeasedLimiter`](super::LeasedLimiter) ("Guarantee"). A positive allowance serves first
    /// touches at once, at the price of the bounded overdraft documented on
    /// [`LeasedLimiter`](super::LeasedLimiter); [`LeaseConfig::first_touch_share`] picks one per node. At most
    /// [`MAX_LEASE`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::LeaseConfig;
    /// assert_eq!(LeaseConfig::new().first_touch_for(1_600, 1), 0);
    /// assert_eq!(LeaseConfig::new().first_touch(10).first_touch_for(1_600, 1), 10);
    /// assert_eq!(LeaseConfig::new().first_touch_share().first_touch_for(1_600, 2), 25);
    /// assert_eq!(LeaseConfig::new().first_touch_share().first_touch_for(1_600, 100), 16);
    /// ```
    pub fn first_touch(mut self, units: u64) -> Self {
        self.first_touch = Some(units.min(MAX_LEASE));
        self
    }

    /// First touches get this node's share of the capacity, `⌊capacity ÷ live nodes⌋`, at most
    /// a quarter of the largest lease (see [`LeaseConfig::first_touch`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::LeaseConfig;
    /// let config = LeaseConfig::new().first_touch_share();
    /// // Capacity 1,600 on 4 nodes: a share of 400, capped at a quarter of the 100-unit lease.
    /// assert_eq!(config.first_touch_for(1_600, 4), 25);
    /// // Capacity 1,600 on 200 nodes: the share, 8, is below the cap.
    /// assert_eq!(config.first_touch_for(1_600, 200), 8);
    /// ```
    pub fn first_touch_share(mut self) -> Self {
        self.first_touch = None;
        self
    }

    /// The first-touch allowance for a rule of capacity `capacity` on a fleet of `nodes`
    /// (more examples on [`LeaseConfig::first_touch`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::LeaseConfig;
    /// // A fixed allowance never exceeds the rule's capacity.
    /// assert_eq!(LeaseConfig::new().first_touch(50).first_touch_for(20, 1), 20);
    /// ```
    pub fn first_touch_for(&self, capacity: u64, nodes: u64) -> u64 {
        match self.first_touch {
            Some(units) => units.min(capacity),
            None => (capacity / nodes.max(1)).min((self.max_lease_for(capacity) / 4).max(1)),
        }
    }

    /// The largest lease for a rule of capacity `capacity`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::LeaseConfig;
    /// // By default, capacity ÷ 16 …
    /// assert_eq!(LeaseConfig::new().max_lease_for(1_600), 100);
    /// // … at least 1 …
    /// assert_eq!(LeaseConfig::new().max_lease_for(10), 1);
    /// // … and never more than the capacity.
    /// assert_eq!(LeaseConfig::new().max_lease(500).max_lease_for(200), 200);
    /// ```
    pub fn max_lease_for(&self, capacity: u64) -> u64 {
        self.max_lease
            .unwrap_or(capacity / 16)
            .clamp(1, MAX_LEASE)
            .min(capacity.max(1))
    }
}

/// Counters of a [`LeasedLimiter`](super::LeasedLimiter)'s traffic with Redis, since it was built.
///
/// # Examples
/// ```
/// use tollgate::redis::LeaseStats;
/// // Read from a live limiter with `LeasedLimiter::stats`; here, figures such a node might show.
/// let stats = LeaseStats { round_trips: 40, refills: 120, granted: 9_000, returned: 600, ..LeaseStats::default() };
/// // Three keys' refills shared each script call on average.
/// assert_eq!(stats.refills / stats.round_trips, 3);
/// // Units granted and not given back: spent, or still held in leases.
/// assert_eq!(stats.granted - stats.returned, 8_400);
/// assert_eq!(stats.overdrawn, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Script calls sent to Redis (grants, returns and charges). Refills and returns of many
    /// keys due together share calls: one per Cluster slot (per 256 keys on a single server).
    pub round_trips: u64,
    /// Grant requests (one per key refilled), however many calls carried them.
    pub refills: u64,
    /// Units Redis granted.
    pub granted: u64,
    /// Units given back to Redis.
    pub returned: u64,
    /// Units admitted on first touches, before the key's first grant arrived.
    pub provisional: u64,
    /// Of those, units the first grant did not cover (the global budget was spent): admitted
    /// beyond the limit, and charged to Redis so that its state counts them.
    pub overdrawn: u64,
}

/// The counters behind [`LeaseStats`]. Relaxed everywhere: counters that publish nothing.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub round_trips: AtomicU64,
    pub refills: AtomicU64,
    pub granted: AtomicU64,
    pub returned: AtomicU64,
    pub provisional: AtomicU64,
    pub overdrawn: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        // Relaxed: a statistics counter.
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LeaseStats {
        // Relaxed: statistics counters.
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LeaseStats {
            round_trips: read(&self.round_trips),
            refills: read(&self.refills),
            granted: read(&self.granted),
            returned: read(&self.returned),
            provisional: read(&self.provisional),
            overdrawn: read(&self.overdrawn),
        }
    }
}

/// What every part of a leased node reads and nobody changes: the rule, its algorithm, the
/// configuration and the largest lease it implies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Terms {
    pub rule: RedisRule,
    pub algo: Algo,
    pub config: LeaseConfig,
    pub max_lease: u64,
}

impl Terms {
    /// How a lease's units decay before its deadline ([`usable`](super::word::usable)): the
    /// emission interval `T` in ns for GCRA, 0 (no decay) for windows.
    pub fn decay(&self) -> u64 {
        match self.algo {
            Algo::Gcra { interval, .. } => interval.max(1),
            Algo::Fixed { .. } | Algo::Sliding { .. } => 0,
        }
    }

    /// The window `W` in ns (`None` for GCRA).
    pub fn window(&self) -> Option<u64> {
        match self.algo {
            Algo::Gcra { .. } => None,
            Algo::Fixed { window } | Algo::Sliding { window } => Some(window),
        }
    }

    pub fn nanos(duration: Duration) -> u64 {
        u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
impl Terms {
    /// The terms a leased node of `rule` keeps under the default configuration.
    pub fn of(rule: RedisRule) -> Terms {
        let config = LeaseConfig::new();
        Terms {
            max_lease: config.max_lease_for(rule.capacity()),
            algo: Algo::of(&rule).expect("a leasable rule"),
            rule,
            config,
        }
    }

    /// The terms of `rule` at a thousand units a second: a 50 ms horizon, leases of at most
    /// capacity / 16 = 62 units, a 1 ms backoff.
    pub fn thousand_a_second(
        rule: fn(crate::Quota) -> Result<RedisRule, crate::QuotaError>,
    ) -> Terms {
        Terms::of(rule(crate::Quota::per_second(1_000).unwrap()).unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    /// A GCRA lease's units decay one per emission interval before its deadline; a window
    /// lease's do not decay (its units are the window's until the deadline). The leased tests
    /// cannot tell a decay of 1 ns from none: a lease's units are far fewer than the
    /// nanoseconds it has left.
    #[test]
    fn a_gcra_lease_decays_by_its_interval_and_a_window_lease_not_at_all() {
        let quota = Quota::per_second(1_000).unwrap();
        assert_eq!(
            Terms::of(RedisRule::gcra(quota).unwrap()).decay(),
            1_000_000
        );
        assert_eq!(
            Terms::of(RedisRule::fixed_window(quota).unwrap()).decay(),
            0
        );
        assert_eq!(
            Terms::of(RedisRule::sliding_window(quota).unwrap()).decay(),
            0
        );
    }
}
