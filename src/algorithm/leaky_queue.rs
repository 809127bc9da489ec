//! The leaky bucket as a queue, a shaper (decision rules §3): GCRA's admission rule with `B = C`, but an
//! admitted request is told *when* it may proceed, so the output is one unit per `T`.
//!
//! ```text
//! tat = max(TAT, t)
//! admit iff tat + c·T − t ≤ C·T,  delay = tat − t,  then TAT := tat + c·T
//! ```

use crate::algorithm::gcra::Gcra;
use crate::algorithm::rule::WordRule;
use crate::algorithm::rule::Words;
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::{Quota, QuotaError};

/// A shaper: capacity `C` (the quota's burst, default `L`), draining `L` per `W`.
///
/// # Examples
/// ```
/// use tollgate::{LeakyQueue, Limiter, Quota, clock::ManualClock};
/// // Capacity 100, 10/s: 200 requests at once get 100 admissions, delays 0, 0.1 s, … 9.9 s.
/// let q = LeakyQueue::new(Quota::per_second(10)?.with_burst(100)?)?;
/// let limiter = Limiter::with_clock(q, ManualClock::new()).unwrap();
/// let delays: Vec<_> = (0..200).map(|_| limiter.reserve(1).unwrap()).collect();
/// assert_eq!(delays.iter().filter(|d| d.allowed()).count(), 100);
/// assert_eq!(delays[99].delay().as_millis(), 9_900);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyQueue(Gcra);

impl LeakyQueue {
    /// The shaper for `quota` (same limits as [`Gcra::new`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LeakyQueue, Limiter, Quota};
    /// // Calls to a paid API: at most 5 a second, spaced 200 ms apart, up to 10 queued.
    /// let queue = Limiter::new(LeakyQueue::new(Quota::per_second(5)?.with_burst(10)?)?);
    /// let slot = queue.reserve(1).unwrap();
    /// assert!(slot.allowed());
    /// // then sleep `slot.delay()` before the call
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(quota: Quota) -> Result<LeakyQueue, QuotaError> {
        Gcra::new(quota).map(LeakyQueue)
    }

    /// `W`, recovered from `T` (see [`Rule::window_nanos`](crate::algorithm::Rule::window_nanos)).
    pub(crate) fn recovered_window(&self) -> u64 {
        crate::algorithm::rule::window_of(self.interval_nanos(), self.limit())
    }

    /// `T` in nanoseconds: the spacing of the shaped output.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LeakyQueue, Quota};
    /// assert_eq!(LeakyQueue::new(Quota::per_second(5)?)?.interval_nanos(), 200_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn interval_nanos(&self) -> u64 {
        self.0.interval_nanos()
    }

    /// `L`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LeakyQueue, Quota};
    /// assert_eq!(LeakyQueue::new(Quota::per_second(5)?)?.limit(), 5);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.0.limit()
    }

    /// `C`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LeakyQueue, Quota};
    /// // How much may wait in the queue at once (the burst, default the limit).
    /// assert_eq!(LeakyQueue::new(Quota::per_second(5)?.with_burst(10)?)?.capacity(), 10);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    pub(crate) fn period(&self) -> Nanos {
        self.0.period()
    }

    pub(crate) fn take_over(self, _previous: &Self, _now: Nanos) -> Self {
        self
    }

    // By reference on purpose: `Stored::to_words(&self)` forwards here, and a by-value
    // inherent method would lose method resolution to the trait method (endless recursion).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        self.0.to_words()
    }

    pub(crate) fn from_words(words: Words) -> Self {
        LeakyQueue(Gcra::from_words(words))
    }
}

impl WordRule for LeakyQueue {
    #[inline]
    fn decide(&self, tat: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let (mut decision, next, delay) = self.0.decide_with_delay(tat, now, cost);
        decision.delay = delay;
        (decision, next)
    }

    /// Cancels a reservation: the queue's tail moves back by `c·T` (never before now). Later
    /// reservations keep the delays they were given, so refunding a reservation that is not the
    /// last one hands back *capacity*, not its exact slot: the next reservation may be given the
    /// same slot as a live one, and the output may briefly exceed one unit per `T`.
    fn refunded(&self, tat: u64, now: Nanos, cost: u64) -> u64 {
        self.0.refunded(tat, now, cost)
    }

    fn is_fresh(&self, tat: u64, now: Nanos) -> bool {
        self.0.is_fresh(tat, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_worked_example_200_at_once() {
        let q = LeakyQueue::new(Quota::per_second(10).unwrap().with_burst(100).unwrap()).unwrap();
        let now = 1_000_000_000;
        let mut tat = 0;
        let mut delays = Vec::new();
        let mut rejected = 0;
        for _ in 0..200 {
            let (d, next) = q.decide(tat, now, 1);
            if d.allowed() {
                delays.push(d.delay_nanos());
            } else {
                rejected += 1;
            }
            tat = next;
        }
        assert_eq!(rejected, 100);
        let expected: Vec<u64> = (0..100).map(|i| i * 100_000_000).collect();
        assert_eq!(delays, expected);
    }
}
