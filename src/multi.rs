//! Several quotas on one key, all or nothing (e.g. 10/s and 1000/h).

use std::borrow::Borrow;
use std::hash::Hash;

use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, LimitError};
use crate::limiter::Algorithm;
use crate::limiter::KeyedLimiter;
use crate::quota::QuotaError;

// The protocol lives in its own file so that `loom-tests` can compile it without the keyed
// limiter (dashmap, quanta), which loom cannot see.
mod all_or_nothing;

pub(crate) use self::all_or_nothing::all_or_nothing;
use self::all_or_nothing::Limit;

/// Several keyed limits checked together: a request is admitted only if every limit admits it,
/// and a request refused by one limit consumes nothing from the others.
///
/// Every limit is first *peeked*; only if all would admit are they charged, in order. If a
/// concurrent request got in between and one limit now refuses, the limits already charged are
/// refunded. So no limit ever admits more than it allows on its own; under contention the
/// refund can make a concurrent request see a limit briefly fuller than it ends up (a stricter
/// decision, never a looser one).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{Gcra, MultiLimiter, Quota};
/// let per_second = Gcra::new(Quota::per_second(10)?)?;
/// let per_hour = Gcra::new(Quota::per_hour(1000)?)?;
/// let limiter: MultiLimiter<String, Gcra> = MultiLimiter::new([per_second, per_hour]);
/// assert!(limiter.check("alice").unwrap().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct MultiLimiter<K: Clone + Hash + Eq + Send + Sync, A: Algorithm, C: Clock = QuantaClock> {
    limits: Vec<KeyedLimiter<K, A, C>>,
}

impl<K: Clone + Hash + Eq + Send + Sync, A: Algorithm> MultiLimiter<K, A> {
    /// One keyed limiter per rule, on the precise default clock.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// // Short bursts are fine, sustained scraping is not: 10 a second and 1000 an hour.
    /// let limiter: MultiLimiter<String, Gcra> = MultiLimiter::new([
    ///     Gcra::new(Quota::per_second(10)?)?,
    ///     Gcra::new(Quota::per_hour(1000)?)?,
    /// ]);
    /// assert_eq!(limiter.limits().len(), 2);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(rules: impl IntoIterator<Item = A>) -> Self {
        MultiLimiter {
            limits: rules.into_iter().map(KeyedLimiter::new).collect(),
        }
    }
}

impl<K: Clone + Hash + Eq + Send + Sync, A: Algorithm, C: Clock + Clone> MultiLimiter<K, A, C> {
    /// One keyed limiter per rule, all reading `clock`.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve one of the quotas.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, MultiLimiter, Quota};
    /// let limiter: MultiLimiter<u64, Gcra, ManualClock> = MultiLimiter::with_clock(
    ///     [Gcra::new(Quota::per_second(1)?)?, Gcra::new(Quota::per_minute(2)?)?],
    ///     ManualClock::new(),
    /// )?;
    /// assert!(limiter.check(&7).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn with_clock(rules: impl IntoIterator<Item = A>, clock: C) -> Result<Self, QuotaError> {
        let limits = rules
            .into_iter()
            .map(|rule| KeyedLimiter::with_clock(rule, clock.clone()))
            .collect::<Result<_, _>>()?;
        Ok(MultiLimiter { limits })
    }
}

impl<K: Clone + Hash + Eq + Send + Sync, A: Algorithm, C: Clock> MultiLimiter<K, A, C> {
    /// A limiter over `limits`, each a keyed limiter built as you like (say with its own
    /// [`max_keys`](crate::KeyedLimiterBuilder::max_keys)), checked in this order.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, MultiLimiter, OverflowPolicy, Quota};
    /// // 10 a second and 1000 an hour per API key, each holding at most 100,000 keys.
    /// let bounded = |quota| {
    ///     KeyedLimiter::<String, _>::builder(Gcra::new(quota)?)
    ///         .max_keys(100_000, OverflowPolicy::Shared)
    ///         .build()
    /// };
    /// let limiter = MultiLimiter::from_limits([
    ///     bounded(Quota::per_second(10)?)?,
    ///     bounded(Quota::per_hour(1000)?)?,
    /// ]);
    /// assert!(limiter.check("key-1").unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn from_limits(limits: impl IntoIterator<Item = KeyedLimiter<K, A, C>>) -> Self {
        MultiLimiter {
            limits: limits.into_iter().collect(),
        }
    }

    /// The limits, in the order they are checked.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// let limiter: MultiLimiter<String, Gcra> =
    ///     MultiLimiter::new([Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_hour(1000)?)?]);
    /// // Each limit is a keyed limiter of its own: read its rule, its key count, or change its quota.
    /// assert_eq!(limiter.limits()[1].rule().limit(), 1000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn limits(&self) -> &[KeyedLimiter<K, A, C>] {
        &self.limits
    }

    /// Decides a request of cost 1 (see [`MultiLimiter::check_n`]).
    ///
    /// # Errors
    /// As for [`MultiLimiter::check_n`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, MultiLimiter, Quota};
    /// let limiter: MultiLimiter<String, Gcra, ManualClock> = MultiLimiter::with_clock(
    ///     [Gcra::new(Quota::per_second(5)?)?, Gcra::new(Quota::per_minute(2)?)?],
    ///     ManualClock::new(),
    /// )?;
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// // The per-second limit would admit a third, the per-minute one refuses: denied.
    /// let third = limiter.check("alice").unwrap();
    /// assert!(!third.allowed());
    /// assert_eq!(third.limit(), 2); // the refusing limit's figures
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn check<Q>(&self, key: &Q) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, 1)
    }

    /// Decides a request of cost `cost` against every limit, all or nothing. Returns the
    /// refusing limit's decision, or, when admitted, the decision of the limit with the fewest
    /// units remaining.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] if any limit can never admit `cost`; [`LimitError::KeyTableFull`]
    /// if a limit's key bound refuses the key. Nothing is consumed in either case.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, MultiLimiter, Quota};
    /// let limiter: MultiLimiter<String, Gcra, ManualClock> = MultiLimiter::with_clock(
    ///     [Gcra::new(Quota::per_second(5)?)?, Gcra::new(Quota::per_minute(20)?)?],
    ///     ManualClock::new(),
    /// )?;
    /// assert!(!limiter.check_n("bob", 6).is_ok_and(|d| d.allowed())); // above the first's burst
    /// assert!(limiter.check_n("bob", 5).unwrap().allowed());
    /// // Admitted: the figures of the limit with the fewest units left (the per-second one).
    /// assert_eq!(limiter.check_n("bob", 0).unwrap().remaining(), 0);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        all_or_nothing(&self.limits, key, cost).map(|(decision, _)| decision)
    }

    /// Reserves `cost` on every limit, in order ([`KeyedLimiter::reserve`]'s first come, first
    /// served for GCRA): the decision with the longest delay (the request may go when every
    /// limit has its slot) and its limit's index. If a limit refuses (a window or the log,
    /// which do not reserve; a full queue), the limits reserved before it are refunded and its
    /// refusal returned, so that a refused call leaves nothing charged.
    #[cfg(any(feature = "tokio", feature = "tower"))]
    pub(crate) fn reserve_n<Q>(&self, key: &Q, cost: u64) -> Result<(Decision, usize), LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut latest: Option<(Decision, usize)> = None;
        let mut reserved = self::all_or_nothing::Charges::default();
        for (index, limit) in self.limits.iter().enumerate() {
            match limit.reserve_n(key, cost) {
                Ok(decision) if decision.allowed() => {
                    if latest.is_none_or(|(l, _)| decision.delay() >= l.delay()) {
                        latest = Some((decision, index));
                    }
                    reserved.push(decision);
                }
                other => {
                    for (earlier, decided) in self.limits.iter().zip(reserved.iter()) {
                        earlier.refund_decided(key, cost, decided);
                    }
                    return other.map(|decision| (decision, index));
                }
            }
        }
        // No limit at all admits everything, as `check_n` does.
        Ok(latest.unwrap_or_else(|| {
            let free = Decision::free(0, crate::decision::Remaining::Exact(0), 0);
            (free, 0)
        }))
    }
}

impl<K, A, C, Q> Limit<Q> for KeyedLimiter<K, A, C>
where
    K: Clone + Hash + Eq + Send + Sync + Borrow<Q>,
    A: Algorithm,
    C: Clock,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    fn peek(&self, key: &Q, cost: u64) -> Result<Decision, LimitError> {
        KeyedLimiter::peek(self, key, cost)
    }

    fn charge(&self, key: &Q, cost: u64) -> Result<Decision, LimitError> {
        self.check_n(key, cost)
    }

    fn refund(&self, key: &Q, cost: u64, charged: &Decision) {
        self.refund_decided(key, cost, charged);
    }
}
