//! The rule a Redis limiter runs: its parameters, the Redis tier's limits, and the decision's
//! figures computed from the facts a script returns.
//!
//! The scripts decide and write atomically; the figures (`remaining`, `retry_after`,
//! `reset_after`, `delay`) need products beyond 2^53, which Lua's doubles cannot hold, so they
//! are computed here in 128-bit integers from the facts the script saw. The verdict is
//! recomputed from the same facts and must match the script's: a reply that disagrees, or
//! holds values no correct state can produce, is refused with [`TierError::BadReply`].

use crate::algorithm::rule::{no_burst, window_at_least_1ms};
use crate::algorithm::{Gcra, LeakyQueue};
use crate::quota::{Quota, QuotaError};
use crate::AlgorithmName;
use crate::{FixedWindow, SlidingLog, SlidingWindow};

/// The largest limit `L` the Redis tier accepts for the window algorithms and the log: 2^51.
/// (GCRA and the leaky buckets are bounded by [`MAX_NANOS`] on `B·T` instead.)
///
/// # Examples
/// ```
/// use tollgate::{Quota, FixedWindow, redis::{RedisRule, MAX_LIMIT}};
/// assert_eq!(MAX_LIMIT, 1 << 51);
/// // Far above the in-process packed counters: a limit FixedWindow refuses, Redis takes.
/// let quota = Quota::per_second(100_000_000)?;
/// assert!(FixedWindow::new(quota).is_err());
/// assert_eq!(RedisRule::fixed_window(quota)?.limit(), 100_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_LIMIT: u64 = 1 << 51;

/// The longest duration the Redis tier accepts, in nanoseconds: 2^51 ns ≈ 26.06 days, for the
/// window `W` and for GCRA's bucket span `B·T`. Lua numbers are doubles, exact below 2^53; this
/// bound keeps every sum and difference the scripts form below 2^52.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, redis::{RedisRule, MAX_NANOS}};
/// // 2^51 ns: a little over 26 days.
/// assert_eq!(MAX_NANOS / 1_000_000_000 / 86_400, 26);
/// assert!(RedisRule::fixed_window(Quota::new(100, Duration::from_secs(7 * 86_400))?).is_ok());
/// // A 30-day window does not fit.
/// assert!(RedisRule::fixed_window(Quota::new(100, Duration::from_secs(30 * 86_400))?).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_NANOS: u64 = 1 << 51;

/// A rule the Redis tier can run: one of the decision rules' algorithms with its parameters, checked
/// against both the algorithm's rules and the Redis tier's limits ([`MAX_LIMIT`],
/// [`MAX_NANOS`]).
///
/// Build one from a [`Quota`] ([`RedisRule::gcra`], [`RedisRule::named`], …) or from an
/// in-process rule (`RedisRule::try_from(gcra)`); the same quota gives the same decisions in
/// both.
///
/// # Examples
/// ```
/// use tollgate::{Quota, redis::RedisRule};
/// let rule = RedisRule::named("sliding-window", Quota::per_minute(600)?)?;
/// assert_eq!(rule.name(), "sliding-window");
/// assert_eq!(rule.capacity(), 600);
/// // 30 days is longer than the Redis tier's maximum window.
/// let month = Quota::new(10, std::time::Duration::from_secs(30 * 86_400))?;
/// assert!(RedisRule::fixed_window(month).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisRule {
    pub(crate) limit: u64,
    pub(crate) kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// GCRA, token bucket, leaky bucket as a meter (`queue = false`) or as a queue.
    Gcra {
        interval: u64,
        burst: u64,
        span: u64,
        queue: bool,
        /// `W` (from the quota; `L·T` for a rule converted from an in-process one).
        window: u64,
    },
    FixedWindow {
        window: u64,
    },
    SlidingWindow {
        window: u64,
    },
    SlidingLog {
        window: u64,
    },
}

/// Why [`RedisRule::named`] refused its arguments.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, QuotaError, redis::{RedisRule, RuleError}};
/// let err = RedisRule::named("lottery", Quota::per_second(5)?).unwrap_err();
/// assert_eq!(err, RuleError::UnknownAlgorithm { name: "lottery".into() });
/// // A window below 1 ms is refused as in-process: the quota's error, passed through.
/// let quota = Quota::new(1, Duration::from_micros(10))?;
/// let err = RedisRule::named("fixed-window", quota).unwrap_err();
/// assert!(matches!(err, RuleError::Quota(QuotaError::WindowTooShort { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The name is none of the decision rules' algorithms.
    #[error("unknown algorithm {name:?}: expected gcra, token-bucket, leaky-bucket, leaky-queue, fixed-window, sliding-window or sliding-log")]
    UnknownAlgorithm {
        /// The name given.
        name: String,
    },
    /// The quota does not suit the algorithm or the Redis tier.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// Limits decided together must share an algorithm (one script decides them all).
    #[error("limits checked together must share an algorithm: {first} and {other}")]
    MixedAlgorithms {
        /// The first limit's algorithm.
        first: &'static str,
        /// The algorithm of a limit that differs from it.
        other: &'static str,
    },
}

/// # Construction
impl RedisRule {
    /// GCRA / token bucket (decision rules §1): `L` per `W`, burst `B` (default `L`), with `B·T ≤ 2^51 ns`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// let rule = RedisRule::gcra(Quota::per_second(10)?.with_burst(100)?)?;
    /// assert_eq!((rule.limit(), rule.capacity()), (10, 100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gcra(quota: Quota) -> Result<RedisRule, QuotaError> {
        let rule = Gcra::new(quota)?;
        gcra_rule(
            rule.limit(),
            rule.burst(),
            rule.interval_nanos(),
            quota.window_nanos(),
            false,
        )
    }

    /// The leaky bucket as a queue (decision rules §3): decisions carry the shaping
    /// [`Decision::delay`](crate::Decision::delay). Same limits as [`RedisRule::gcra`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// let rule = RedisRule::leaky_queue(Quota::per_second(10)?.with_burst(100)?)?;
    /// assert_eq!(rule.name(), "leaky-queue");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn leaky_queue(quota: Quota) -> Result<RedisRule, QuotaError> {
        let rule = LeakyQueue::new(quota)?;
        let (limit, capacity, interval) = (rule.limit(), rule.capacity(), rule.interval_nanos());
        gcra_rule(limit, capacity, interval, quota.window_nanos(), true)
    }

    /// Fixed window (decision rules §4), windows aligned to the Unix epoch: `1 ms ≤ W ≤ 2^51 ns`,
    /// `L ≤ 2^51`, no burst.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// // Far above the in-process packed counter's 2^24 − 1: a fleet-wide budget.
    /// let rule = RedisRule::fixed_window(Quota::per_hour(100_000_000)?)?;
    /// assert_eq!(rule.limit(), 100_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fixed_window(quota: Quota) -> Result<RedisRule, QuotaError> {
        let (limit, window) = window_params(&quota, "fixed-window")?;
        Ok(RedisRule {
            limit,
            kind: Kind::FixedWindow { window },
        })
    }

    /// Sliding window counter (decision rules §5), windows aligned to the Unix epoch. Limits as
    /// [`RedisRule::fixed_window`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// let rule = RedisRule::sliding_window(Quota::per_minute(60)?)?;
    /// assert_eq!(rule.name(), "sliding-window");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_window(quota: Quota) -> Result<RedisRule, QuotaError> {
        let (limit, window) = window_params(&quota, "sliding-window")?;
        Ok(RedisRule {
            limit,
            kind: Kind::SlidingWindow { window },
        })
    }

    /// Sliding window log (decision rules §6). Limits as [`RedisRule::fixed_window`]. Redis keeps one
    /// sorted-set member per admitted *request* (not per unit), with its exact time in
    /// nanoseconds.
    ///
    /// Memory in Redis grows with the limit: a key at its limit holds up to `limit` members,
    /// about 140 bytes each (`MEMORY USAGE` of a 10,000-member log on Redis 7.0: 1.4 MB), so
    /// 10,000 keys each at 10,000 an hour hold about 14 GB. For large limits prefer
    /// [`RedisRule::sliding_window`] (two counters a key, a weighted estimate) or
    /// [`RedisRule::gcra`] (one number a key); the log is for small limits that must be exact.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// let rule = RedisRule::sliding_log(Quota::per_minute(100)?)?;
    /// assert_eq!(rule.capacity(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_log(quota: Quota) -> Result<RedisRule, QuotaError> {
        let (limit, window) = window_params(&quota, "sliding-log")?;
        Ok(RedisRule {
            limit,
            kind: Kind::SlidingLog { window },
        })
    }

    /// The rule for an algorithm name, as `tollgate replay --algorithm` takes it: `gcra`,
    /// `token-bucket`, `leaky-bucket` (all three GCRA), `leaky-queue`, `fixed-window`,
    /// `sliding-window`, `sliding-log`.
    ///
    /// # Errors
    /// [`RuleError::UnknownAlgorithm`], or [`RuleError::Quota`] as the constructor for the
    /// algorithm returns it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::{RedisRule, RuleError}};
    /// assert_eq!(RedisRule::named("token-bucket", Quota::per_second(5)?)?.name(), "gcra");
    /// assert!(matches!(
    ///     RedisRule::named("lottery", Quota::per_second(5)?),
    ///     Err(RuleError::UnknownAlgorithm { .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn named(name: &str, quota: Quota) -> Result<RedisRule, RuleError> {
        let algorithm = name
            .parse::<AlgorithmName>()
            .map_err(|_| RuleError::UnknownAlgorithm {
                name: name.to_owned(),
            })?;
        Ok(RedisRule::for_algorithm(algorithm, quota)?)
    }

    /// The rule for an algorithm as the in-process replay names it, so that
    /// `tollgate replay --redis URL` builds the same rule as
    /// [`Replayer::new`](crate::replay::Replayer::new) from the same arguments.
    ///
    /// # Errors
    /// As the constructor for the algorithm.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{AlgorithmName, Quota, redis::RedisRule};
    /// let quota = Quota::new(100, Duration::from_secs(60))?.with_burst(10)?;
    /// let rule = RedisRule::for_algorithm(AlgorithmName::LeakyBucket, quota)?;
    /// assert_eq!((rule.name(), rule.capacity()), ("gcra", 10));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn for_algorithm(algorithm: AlgorithmName, quota: Quota) -> Result<RedisRule, QuotaError> {
        match algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                RedisRule::gcra(quota)
            }
            AlgorithmName::LeakyQueue => RedisRule::leaky_queue(quota),
            AlgorithmName::FixedWindow => RedisRule::fixed_window(quota),
            AlgorithmName::SlidingWindow => RedisRule::sliding_window(quota),
            AlgorithmName::SlidingLog => RedisRule::sliding_log(quota),
        }
    }
}

/// # Parameters
impl RedisRule {
    /// The canonical name of the algorithm: `gcra` (also for the token bucket and the leaky bucket
    /// as a meter), `leaky-queue`, `fixed-window`, `sliding-window` or `sliding-log`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// // The token bucket is GCRA under another name: one script, one name.
    /// assert_eq!(RedisRule::named("token-bucket", Quota::per_second(5)?)?.name(), "gcra");
    /// assert_eq!(RedisRule::sliding_log(Quota::per_second(5)?)?.name(), "sliding-log");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &'static str {
        self.algorithm().as_str()
    }

    /// The algorithm, by its canonical name (see [`RedisRule::name`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{AlgorithmName, Quota, redis::RedisRule};
    /// let rule = RedisRule::for_algorithm(AlgorithmName::TokenBucket, Quota::per_second(5)?)?;
    /// assert_eq!(rule.algorithm(), AlgorithmName::Gcra);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn algorithm(&self) -> AlgorithmName {
        match self.kind {
            Kind::Gcra { queue: false, .. } => AlgorithmName::Gcra,
            Kind::Gcra { queue: true, .. } => AlgorithmName::LeakyQueue,
            Kind::FixedWindow { .. } => AlgorithmName::FixedWindow,
            Kind::SlidingWindow { .. } => AlgorithmName::SlidingWindow,
            Kind::SlidingLog { .. } => AlgorithmName::SlidingLog,
        }
    }

    /// `L`, as reported in every decision.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// assert_eq!(RedisRule::fixed_window(Quota::per_minute(100)?)?.limit(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `W`: the window of the quota the rule was built from (for GCRA and the leaky buckets,
    /// the time `L` units take to refill), as the tower layer's `RateLimit-Policy` shows it.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, redis::RedisRule};
    /// let rule = RedisRule::gcra(Quota::per_minute(100)?.with_burst(10)?)?;
    /// assert_eq!((rule.limit(), rule.window()), (100, Duration::from_secs(60)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn window(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.window_nanos())
    }

    /// The largest cost that can ever be admitted: `B` / `C` for GCRA and the leaky buckets,
    /// `L` otherwise. A larger cost is an error, not a denial.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, redis::RedisRule};
    /// // GCRA: the burst.
    /// assert_eq!(RedisRule::gcra(Quota::per_second(10)?.with_burst(50)?)?.capacity(), 50);
    /// // A window: the limit.
    /// assert_eq!(RedisRule::sliding_window(Quota::per_second(10)?)?.capacity(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        match self.kind {
            Kind::Gcra { burst, .. } => burst,
            _ => self.limit,
        }
    }

    /// The Redis key segment naming the algorithm (the leaky buckets as meters share GCRA's
    /// state, decision rules §2).
    pub(crate) fn key_segment(&self) -> &'static str {
        self.name()
    }

    pub(crate) fn script(&self) -> &'static super::scripts::Lua {
        use super::scripts::scripts;
        match self.kind {
            Kind::Gcra { .. } => &scripts().gcra,
            Kind::FixedWindow { .. } => &scripts().fixed_window,
            Kind::SlidingWindow { .. } => &scripts().sliding_window,
            Kind::SlidingLog { .. } => &scripts().sliding_log,
        }
    }

    /// The two fixed parameters of the rule's script (`ARGV[3]`, `ARGV[4]`).
    pub(crate) fn script_params(&self) -> [u64; 2] {
        match self.kind {
            Kind::Gcra { interval, span, .. } => [span, interval],
            Kind::FixedWindow { window }
            | Kind::SlidingWindow { window }
            | Kind::SlidingLog { window } => [self.limit, window],
        }
    }
}

impl RedisRule {
    /// `W` in nanoseconds (for GCRA and the leaky buckets, the window of the quota).
    pub(crate) fn window_nanos(&self) -> u64 {
        match self.kind {
            Kind::Gcra { window, .. }
            | Kind::FixedWindow { window }
            | Kind::SlidingWindow { window }
            | Kind::SlidingLog { window } => window,
        }
    }

    /// This node's share of the quota when `nodes` nodes share it: `⌊L / n⌋` per `W` (and
    /// `⌊B / n⌋` for the buckets), at least 1, and at most what the in-process state holds.
    pub(crate) fn share(&self, nodes: u64) -> Result<Quota, QuotaError> {
        let nodes = nodes.max(1);
        let cap = match self.kind {
            Kind::Gcra { .. } => u64::MAX,
            Kind::FixedWindow { .. } => FixedWindow::MAX_LIMIT,
            Kind::SlidingWindow { .. } => SlidingWindow::MAX_LIMIT,
            Kind::SlidingLog { .. } => SlidingLog::MAX_LIMIT,
        };
        let limit = (self.limit / nodes).clamp(1, cap);
        let quota = Quota::new(limit, std::time::Duration::from_nanos(self.window_nanos()))?;
        match self.kind {
            Kind::Gcra { burst, .. } => quota.with_burst((burst / nodes).max(1)),
            _ => Ok(quota),
        }
    }
}

impl TryFrom<Gcra> for RedisRule {
    type Error = QuotaError;

    /// The in-process rule's parameters, if `B·T ≤ 2^51 ns`.
    fn try_from(rule: Gcra) -> Result<RedisRule, QuotaError> {
        let window = rule.interval_nanos().saturating_mul(rule.limit());
        gcra_rule(
            rule.limit(),
            rule.burst(),
            rule.interval_nanos(),
            window,
            false,
        )
    }
}

impl TryFrom<LeakyQueue> for RedisRule {
    type Error = QuotaError;

    /// The in-process rule's parameters, if `C·T ≤ 2^51 ns`.
    fn try_from(rule: LeakyQueue) -> Result<RedisRule, QuotaError> {
        let window = rule.interval_nanos().saturating_mul(rule.limit());
        gcra_rule(
            rule.limit(),
            rule.capacity(),
            rule.interval_nanos(),
            window,
            true,
        )
    }
}

impl TryFrom<FixedWindow> for RedisRule {
    type Error = QuotaError;

    /// The in-process rule's parameters, if `W ≤ 2^51 ns`.
    fn try_from(rule: FixedWindow) -> Result<RedisRule, QuotaError> {
        let window = window_at_most(rule.window())?;
        Ok(RedisRule {
            limit: rule.limit(),
            kind: Kind::FixedWindow { window },
        })
    }
}

impl TryFrom<SlidingWindow> for RedisRule {
    type Error = QuotaError;

    /// The in-process rule's parameters, if `W ≤ 2^51 ns`.
    fn try_from(rule: SlidingWindow) -> Result<RedisRule, QuotaError> {
        let window = window_at_most(rule.window())?;
        Ok(RedisRule {
            limit: rule.limit(),
            kind: Kind::SlidingWindow { window },
        })
    }
}

impl TryFrom<SlidingLog> for RedisRule {
    type Error = QuotaError;

    /// The in-process rule's parameters, if `W ≤ 2^51 ns`.
    fn try_from(rule: SlidingLog) -> Result<RedisRule, QuotaError> {
        let window = window_at_most(rule.window())?;
        Ok(RedisRule {
            limit: rule.limit(),
            kind: Kind::SlidingLog { window },
        })
    }
}

fn gcra_rule(
    limit: u64,
    burst: u64,
    interval: u64,
    window: u64,
    queue: bool,
) -> Result<RedisRule, QuotaError> {
    let span = burst
        .checked_mul(interval)
        .filter(|span| *span <= MAX_NANOS)
        .ok_or(QuotaError::TooLarge {
            what: "burst × emission interval (ns)",
            value: burst.saturating_mul(interval),
            max: MAX_NANOS,
        })?;
    Ok(RedisRule {
        limit,
        kind: Kind::Gcra {
            interval,
            burst,
            span,
            queue,
            window,
        },
    })
}

fn window_at_most(window: u64) -> Result<u64, QuotaError> {
    if window > MAX_NANOS {
        Err(QuotaError::TooLarge {
            what: "window (ns)",
            value: window,
            max: MAX_NANOS,
        })
    } else {
        Ok(window)
    }
}

fn window_params(quota: &Quota, algorithm: &'static str) -> Result<(u64, u64), QuotaError> {
    no_burst(quota, algorithm)?;
    let window = window_at_most(window_at_least_1ms(quota)?)?;
    let limit = quota.limit();
    if limit > MAX_LIMIT {
        return Err(QuotaError::TooLarge {
            what: "limit",
            value: limit,
            max: MAX_LIMIT,
        });
    }
    Ok((limit, window))
}

pub(crate) mod reply;

#[cfg(test)]
mod tests {
    use super::super::error::TierError;
    use super::*;
    use std::time::Duration;

    #[test]
    fn redis_limits_are_enforced_at_construction() {
        let q = Quota::new(MAX_LIMIT + 1, Duration::from_secs(1)).unwrap();
        assert!(matches!(
            RedisRule::fixed_window(q),
            Err(QuotaError::TooLarge { what: "limit", .. })
        ));
        let q = Quota::new(1, Duration::from_nanos(MAX_NANOS + 1)).unwrap();
        assert!(matches!(
            RedisRule::sliding_log(q),
            Err(QuotaError::TooLarge { .. })
        ));
        assert!(
            RedisRule::sliding_log(Quota::new(1, Duration::from_nanos(MAX_NANOS)).unwrap()).is_ok()
        );
        // B·T = 2^51 + 1 ns.
        let q = Quota::new(1, Duration::from_nanos(MAX_NANOS + 1)).unwrap();
        assert!(matches!(
            RedisRule::gcra(q),
            Err(QuotaError::TooLarge { .. })
        ));
        let q = Quota::per_second(1).unwrap().with_burst(2).unwrap();
        assert!(matches!(
            RedisRule::sliding_window(q),
            Err(QuotaError::BurstNotSupported { .. })
        ));
    }

    #[test]
    fn replies_out_of_contract_are_errors_not_panics() {
        let rules = [
            RedisRule::gcra(Quota::per_second(10).unwrap()).unwrap(),
            RedisRule::leaky_queue(Quota::per_second(10).unwrap()).unwrap(),
            RedisRule::fixed_window(Quota::per_second(10).unwrap()).unwrap(),
            RedisRule::sliding_window(Quota::per_second(10).unwrap()).unwrap(),
            RedisRule::sliding_log(Quota::per_second(10).unwrap()).unwrap(),
            RedisRule::sliding_window(
                Quota::new(MAX_LIMIT, Duration::from_nanos(MAX_NANOS)).unwrap(),
            )
            .unwrap(),
        ];
        // Edge values and random ones, in replies of 0 to 5 fields: every one must give a
        // decision or an error, never a panic (overflow checks are on in tests).
        let edges = [
            i64::MIN,
            -3,
            -2,
            -1,
            0,
            1,
            2,
            9,
            10,
            11,
            999_999_999,
            1_000_000_000,
            (1 << 51) - 1,
            1 << 51,
            (1 << 53) - 1,
            1 << 53,
            i64::MAX,
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200_000 {
            let len = (next() % 6) as usize;
            let reply: Vec<i64> = (0..len)
                .map(|i| match next() % 3 {
                    // Keep the verdict code valid most of the time, to reach the figures.
                    _ if i == 0 && next() % 4 != 0 => (next() % 2) as i64,
                    0 => (next() % (1 << 53)) as i64,
                    _ => edges[(next() % edges.len() as u64) as usize],
                })
                .collect();
            let rule = rules[(next() % rules.len() as u64) as usize];
            let cost =
                [0, 1, rule.capacity(), next() % (rule.capacity() + 1)][(next() % 4) as usize];
            for unit in [1, 1000] {
                if let Ok(d) = rule.decision(cost, &reply, unit) {
                    let _ = (d.remaining(), d.retry_after(), d.reset_after(), d.delay());
                }
            }
        }
    }

    #[test]
    fn a_node_share_divides_the_quota_and_fits_in_process() {
        let q = Quota::new(10, Duration::from_secs(1))
            .unwrap()
            .with_burst(20)
            .unwrap();
        let share = RedisRule::gcra(q).unwrap().share(3).unwrap();
        assert_eq!(
            (share.limit(), share.burst(), share.window()),
            (3, 6, Duration::from_secs(1))
        );
        assert_eq!(
            RedisRule::gcra(q).unwrap().share(0).unwrap(),
            q,
            "0 nodes counts as 1"
        );
        assert_eq!(
            RedisRule::gcra(q).unwrap().share(100).unwrap().limit(),
            1,
            "at least 1"
        );
        let big = Quota::new(1 << 30, Duration::from_secs(60)).unwrap();
        let share = RedisRule::fixed_window(big).unwrap().share(2).unwrap();
        assert_eq!(share.limit(), crate::FixedWindow::MAX_LIMIT);
        assert!(FixedWindow::new(share).is_ok());
    }

    #[test]
    fn a_reply_that_contradicts_its_facts_is_refused() {
        let rule = RedisRule::fixed_window(Quota::per_second(10).unwrap()).unwrap();
        // "allowed" with 10 of 10 already admitted.
        assert!(matches!(
            rule.decision(1, &[1, 5, 10], 1),
            Err(TierError::BadReply { .. })
        ));
        assert!(rule.decision(1, &[0, 5, 10], 1).is_ok());
    }
}
