//! A keyed limiter of any algorithm, chosen by name at run time: what replay and the Redis
//! tier's `Local` policy build from an [`AlgorithmName`], so that the two share one dispatch.
//! (Code that knows its algorithm at compile time uses `KeyedLimiter<K, A>` itself: one match
//! per call is the price of choosing late. The tower configuration and the Redis rule still
//! map a name to a rule type of their own.)

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crate::algorithm::{AlgorithmName, FixedWindow, Gcra, LeakyQueue, SlidingLog, SlidingWindow};
use crate::clock::Clock;
use crate::decision::{Decision, LimitError};
use crate::limiter::KeyedLimiter;
use crate::quota::{Quota, QuotaError};

/// One keyed limiter per algorithm that decides differently (the token bucket and the leaky
/// bucket as a meter are GCRA).
pub(crate) enum AnyKeyed<K: Clone + Hash + Eq + Send + Sync, C: Clock> {
    Gcra(KeyedLimiter<K, Gcra, C>),
    LeakyQueue(KeyedLimiter<K, LeakyQueue, C>),
    FixedWindow(KeyedLimiter<K, FixedWindow, C>),
    SlidingWindow(KeyedLimiter<K, SlidingWindow, C>),
    SlidingLog(KeyedLimiter<K, SlidingLog, C>),
}

/// Runs `$body` with `$limiter` bound to whichever limiter `$any` holds.
macro_rules! each {
    ($any:expr, $limiter:ident => $body:expr) => {
        match $any {
            AnyKeyed::Gcra($limiter) => $body,
            AnyKeyed::LeakyQueue($limiter) => $body,
            AnyKeyed::FixedWindow($limiter) => $body,
            AnyKeyed::SlidingWindow($limiter) => $body,
            AnyKeyed::SlidingLog($limiter) => $body,
        }
    };
}

impl<K, C> fmt::Debug for AnyKeyed<K, C>
where
    K: Clone + Hash + Eq + Send + Sync,
    C: Clock + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        each!(self, l => l.fmt(f))
    }
}

impl<K, C> AnyKeyed<K, C>
where
    K: Clone + Hash + Eq + Send + Sync,
    C: Clock,
{
    /// A limiter of `algorithm` with `quota` on `clock`.
    ///
    /// # Errors
    /// What the algorithm's constructor or [`KeyedLimiter::with_clock`] refuses.
    pub(crate) fn new(
        algorithm: AlgorithmName,
        quota: Quota,
        clock: C,
    ) -> Result<AnyKeyed<K, C>, QuotaError> {
        Ok(match algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                AnyKeyed::Gcra(KeyedLimiter::with_clock(Gcra::new(quota)?, clock)?)
            }
            AlgorithmName::LeakyQueue => {
                AnyKeyed::LeakyQueue(KeyedLimiter::with_clock(LeakyQueue::new(quota)?, clock)?)
            }
            AlgorithmName::FixedWindow => {
                AnyKeyed::FixedWindow(KeyedLimiter::with_clock(FixedWindow::new(quota)?, clock)?)
            }
            AlgorithmName::SlidingWindow => AnyKeyed::SlidingWindow(KeyedLimiter::with_clock(
                SlidingWindow::new(quota)?,
                clock,
            )?),
            AlgorithmName::SlidingLog => {
                AnyKeyed::SlidingLog(KeyedLimiter::with_clock(SlidingLog::new(quota)?, clock)?)
            }
        })
    }

    /// [`KeyedLimiter::check_n`].
    #[inline]
    pub(crate) fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        each!(self, l => l.check_n(key, cost))
    }

    /// [`KeyedLimiter::peek`].
    // (The Redis tier's `Local` policy is its user.)
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn peek<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        each!(self, l => l.peek(key, cost))
    }

    /// [`KeyedLimiter::refund`].
    // (The Redis tier's `Local` policy is its user.)
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn refund<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        each!(self, l => l.refund(key, cost))
    }

    /// [`KeyedLimiter::set_quota`] with the same algorithm and a new quota.
    ///
    /// # Errors
    /// What the algorithm's constructor or `set_quota` refuses; the quota is then unchanged.
    // (The Redis tier's `Local` policy is its user.)
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn set_quota(&self, quota: Quota) -> Result<(), QuotaError> {
        match self {
            AnyKeyed::Gcra(l) => l.set_quota(Gcra::new(quota)?),
            AnyKeyed::LeakyQueue(l) => l.set_quota(LeakyQueue::new(quota)?),
            AnyKeyed::FixedWindow(l) => l.set_quota(FixedWindow::new(quota)?),
            AnyKeyed::SlidingWindow(l) => l.set_quota(SlidingWindow::new(quota)?),
            AnyKeyed::SlidingLog(l) => l.set_quota(SlidingLog::new(quota)?),
        }
    }

    /// Whether the algorithm shapes (its admissions carry a delay to wait out).
    pub(crate) fn shapes(&self) -> bool {
        matches!(self, AnyKeyed::LeakyQueue(_))
    }
}
