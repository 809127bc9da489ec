//! GCRA / token bucket (decision rules §1) and the leaky bucket as a meter (decision rules §2).
//!
//! State: the theoretical arrival time `TAT`, in nanoseconds since the limiter's origin; a fresh
//! key is `TAT = 0`, which behaves as `TAT = t` (a full bucket).
//!
//! ```text
//! tat = max(TAT, t)
//! allow iff tat + c·T − t ≤ B·T          then TAT := tat + c·T
//! ```

use crate::algorithm::rule::WordRule;
use crate::algorithm::rule::Words;
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};

/// The largest bucket span `B·T` the state can hold: 2^62 ns, about 146 years. Keeping two bits
/// of headroom means `(TAT − t) + c·T` never overflows.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::{algorithm::gcra::MAX_SPAN, Gcra, Quota, QuotaError};
/// assert_eq!(MAX_SPAN, 1 << 62);
/// // One unit per 150 years: B·T = 150 years, beyond the 146 the state spans.
/// let quota = Quota::new(1, Duration::from_secs(150 * 365 * 86_400))?;
/// assert!(matches!(Gcra::new(quota), Err(QuotaError::SpanOverflow { .. })));
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub const MAX_SPAN: u64 = 1 << 62;

/// GCRA: `limit` per `window`, emission interval `T = W / L` rounded to the nearest
/// nanosecond, burst `B` (default `L`).
///
/// # Examples
/// ```
/// use tollgate::{Gcra, Quota};
/// // Capacity 100, refill 10/s: 100 at once, then 10 per second.
/// let gcra = Gcra::new(Quota::per_second(10)?.with_burst(100)?)?;
/// assert_eq!(gcra.interval_nanos(), 100_000_000);
/// assert_eq!(gcra.burst(), 100);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    interval: u64,
    span: u64,
    limit: u64,
    burst: u64,
}

impl Gcra {
    /// The rule for `quota`; refuses `W / L < 1 ns` and `B·T > 2^62 ns`.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Gcra, Quota, QuotaError};
    /// let api = Gcra::new(Quota::per_second(10)?.with_burst(20)?)?;
    /// assert_eq!(api.capacity(), 20);
    /// // A billion a nanosecond cannot be spaced: refused here, not misjudged later.
    /// let absurd = Quota::new(2, Duration::from_nanos(1))?;
    /// assert!(matches!(Gcra::new(absurd), Err(QuotaError::IntervalTooShort { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(quota: Quota) -> Result<Gcra, QuotaError> {
        let (window, limit, burst) = (quota.window_nanos(), quota.limit(), quota.burst());
        if window < limit {
            return Err(QuotaError::IntervalTooShort {
                window_nanos: window,
                limit,
            });
        }
        // Round to nearest: (W + L/2) / L, in 128 bits so W near u64::MAX cannot overflow.
        let interval = ((window as u128 + (limit / 2) as u128) / limit as u128) as u64;
        let span = burst
            .checked_mul(interval)
            .filter(|span| *span <= MAX_SPAN)
            .ok_or(QuotaError::SpanOverflow {
                burst,
                interval_nanos: interval,
            })?;
        Ok(Gcra {
            interval,
            span,
            limit,
            burst,
        })
    }

    /// `W`, recovered from `T` (see [`Rule::window_nanos`](crate::algorithm::Rule::window_nanos)).
    pub(crate) fn recovered_window(&self) -> u64 {
        crate::algorithm::rule::window_of(self.interval_nanos(), self.limit())
    }

    /// `T` in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Quota};
    /// // One unit comes back every T = W / L.
    /// assert_eq!(Gcra::new(Quota::per_second(4)?)?.interval_nanos(), 250_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn interval_nanos(&self) -> u64 {
        self.interval
    }

    /// `B`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Quota};
    /// assert_eq!(Gcra::new(Quota::per_second(4)?.with_burst(8)?)?.burst(), 8);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// `L`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Quota};
    /// assert_eq!(Gcra::new(Quota::per_second(4)?.with_burst(8)?)?.limit(), 4);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `B`: the largest cost that can ever be admitted.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LimitError, Gcra, Limiter, Quota};
    /// let rule = Gcra::new(Quota::per_second(4)?.with_burst(8)?)?;
    /// assert_eq!(rule.capacity(), 8);
    /// // A cost above it can never be admitted: an error, not a denial.
    /// let limiter = Limiter::new(rule);
    /// assert_eq!(limiter.check_n(9), Err(LimitError::CapacityExceeded { cost: 9, capacity: 8 }));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.burst
    }

    /// The span `B·T`: a clock's error of one tick shifts admissions by `tick / T` units, which
    /// is negligible only when the tick is far below the whole bucket's span.
    pub(crate) fn period(&self) -> Nanos {
        self.span
    }

    /// Decides a request of `cost ≤ B` at `now` against `tat`. Returns the decision, the next
    /// state, and the shaping delay `max(TAT, t) − t`.
    #[inline]
    pub(crate) fn decide_with_delay(
        &self,
        tat: u64,
        now: Nanos,
        cost: u64,
    ) -> (Decision, u64, u64) {
        let start = tat.max(now);
        let debt = start - now;
        if cost == 0 || cost > self.burst {
            // Nothing changes. Cost 0 is always allowed, and its shaping delay is still SPEC
            // §3's `tat − t` (the queue's current wait), not 0. A cost above `B` is never
            // admissible; its figures are the state's own. (No recursive call for it: that kept
            // this function from being inlined, +50 instructions a direct check.)
            let free = self.figures(true, debt, debt, 0);
            return if cost == 0 {
                (free, tat, debt)
            } else {
                (free.never(), tat, 0)
            };
        }
        // cost ≤ B, so ≤ B·T ≤ 2^62.
        let increment = cost * self.interval;
        // ≤ 2^63 for the states this rule writes (debt ≤ an earlier span); saturated, and so
        // denied, for a state far beyond the span, which the public pure rule may be given.
        let debt_after = debt.saturating_add(increment);
        // The two largest values are a keyed store's marks (`RETIRED`), never a TAT.
        match start
            .checked_add(increment)
            .filter(|next| *next < u64::MAX - 1)
        {
            Some(next) if debt_after <= self.span => {
                (self.figures(true, debt_after, debt_after, 0), next, debt)
            }
            // At the very end of the u64 time range the next TAT cannot be stored: deny, never
            // over-admit.
            None => (self.figures(false, debt, debt, u64::MAX), tat, 0),
            Some(_) => {
                let retry = debt_after - self.span;
                (self.figures(false, debt, debt, retry), tat, 0)
            }
        }
    }

    /// The decision's figures from the debt `TAT' − t` after the decision.
    #[inline]
    fn figures(&self, allowed: bool, debt: u64, reset: u64, retry_after: u64) -> Decision {
        Decision {
            allowed: allowed.into(),
            limit: self.limit,
            retry_after,
            reset_after: reset,
            delay: 0,
            remaining: Remaining::Floor {
                num: self.span.saturating_sub(debt),
                den: self.interval,
            },
        }
    }

    pub(crate) fn take_over(self, _previous: &Self, _now: Nanos) -> Self {
        // TAT is an absolute time: the debt it records carries over to the new rate as time.
        self
    }

    // By reference on purpose: `Stored::to_words(&self)` forwards here, and a by-value
    // inherent method would lose method resolution to the trait method (endless recursion).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        [self.interval, self.span, self.limit, self.burst, 0]
    }

    pub(crate) fn from_words([interval, span, limit, burst, _]: Words) -> Self {
        Gcra {
            interval,
            span,
            limit,
            burst,
        }
    }
}

impl WordRule for Gcra {
    #[inline]
    fn decide(&self, tat: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let (decision, next, _delay) = self.decide_with_delay(tat, now, cost);
        (decision, next)
    }

    /// A refused request of `cost ≤ B` is reserved: `TAT` moves on by `c·T` as for an
    /// admission, and the decision admits it after the refusal's `retry_after`, the instant a
    /// check would have admitted it. Above `B`, or past the end of the time range, as `decide`.
    #[inline]
    fn reserve(&self, tat: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let (decision, next, _) = self.decide_with_delay(tat, now, cost);
        let wait = decision.retry_after_nanos();
        if decision.allowed() || cost > self.burst || wait == u64::MAX {
            return (decision, next);
        }
        // Refused: `max(TAT, t) + c·T` fits (below the marks) and its debt exceeds `B·T` by `wait`.
        let increment = cost * self.interval;
        let debt_after = wait + self.span;
        let mut reserved = self.figures(true, debt_after, debt_after, 0);
        reserved.delay = wait;
        (reserved, tat.max(now) + increment)
    }

    fn refunded(&self, tat: u64, now: Nanos, cost: u64) -> u64 {
        let back = cost.saturating_mul(self.interval);
        if tat <= now {
            tat
        } else {
            tat.saturating_sub(back).max(now)
        }
    }

    fn is_fresh(&self, tat: u64, now: Nanos) -> bool {
        tat <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn spec_worked_example_capacity_100_refill_10_per_second() {
        let gcra = Gcra::new(Quota::per_second(10).unwrap().with_burst(100).unwrap()).unwrap();
        let mut tat = 0;
        let t0 = 5 * SEC;
        for i in 0..100 {
            let (d, next) = gcra.decide(tat, t0, 1);
            assert!(d.allowed(), "request {i} of the burst");
            tat = next;
        }
        assert!(!gcra.decide(tat, t0, 1).0.allowed());
        // 10 per second afterwards: one every 100 ms.
        let (d, _) = gcra.decide(tat, t0 + 99_999_999, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), 1);
        for k in 1..=10 {
            let (d, next) = gcra.decide(tat, t0 + k * 100_000_000, 1);
            assert!(d.allowed(), "refill {k}");
            tat = next;
        }
    }

    #[test]
    fn figures_follow_spec() {
        let gcra = Gcra::new(Quota::new(4, Duration::from_secs(4)).unwrap()).unwrap();
        let (d, tat) = gcra.decide(0, 10 * SEC, 3);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.reset_after_nanos(), 3 * SEC);
        let (d, _) = gcra.decide(tat, 10 * SEC, 2);
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), SEC);
        assert_eq!(d.remaining(), 1);
    }

    #[test]
    fn construction_refuses_bad_values() {
        let q = Quota::new(10, Duration::from_nanos(5)).unwrap();
        assert!(matches!(
            Gcra::new(q),
            Err(QuotaError::IntervalTooShort { .. })
        ));
        let q = Quota::per_second(1).unwrap().with_burst(u64::MAX).unwrap();
        assert!(matches!(Gcra::new(q), Err(QuotaError::SpanOverflow { .. })));
        let q = Quota::new(1, Duration::from_nanos(u64::MAX)).unwrap();
        assert!(matches!(Gcra::new(q), Err(QuotaError::SpanOverflow { .. })));
    }

    #[test]
    fn end_of_time_denies_instead_of_overflowing() {
        let gcra = Gcra::new(Quota::per_second(1).unwrap()).unwrap();
        let (d, _) = gcra.decide(0, u64::MAX - 10, 1);
        assert!(!d.allowed());
    }
}
