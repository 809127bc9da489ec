//! A concurrency limit: at most `N` units held at once. Not a rate: the state is the count of
//! units held, taken by an admission and given back by a release, whatever the time.
//!
//! ```text
//! admit iff held + c ≤ N,  then held := held + c;   release: held := held − c
//! ```
//!
//! The rule behind [`InFlight`](crate::InFlight), which gives each admission a permit that
//! releases its units when dropped. Crate-private (its module is not exported): a rule whose
//! units come back only by a release must not be handed to a limiter that would never release
//! them.

use crate::algorithm::rule::{WordRule, Words, WORDS};
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::QuotaError;

/// The largest `N`: the store keeps the two states above it as marks.
pub(crate) const MAX_IN_FLIGHT: u64 = u64::MAX - 2;

/// At most `max` units held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Concurrency {
    max: u64,
}

impl Concurrency {
    /// Refuses 0 (nothing could ever be admitted) and a bound above [`MAX_IN_FLIGHT`].
    pub(crate) fn new(max: u64) -> Result<Self, QuotaError> {
        if max == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if max > MAX_IN_FLIGHT {
            return Err(QuotaError::TooLarge {
                what: "in-flight bound",
                value: max,
                max: MAX_IN_FLIGHT,
            });
        }
        Ok(Concurrency { max })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.max
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.max
    }

    /// No time to resolve: a whole second, so that any clock serves.
    pub(crate) fn period(&self) -> Nanos {
        1_000_000_000
    }

    /// No window: 0.
    pub(crate) fn window(&self) -> Nanos {
        0
    }

    pub(crate) fn take_over(self, _previous: &Self, _now: Nanos) -> Self {
        self
    }

    // By reference, as the other rules' (see `LeakyQueue::to_words`).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        let mut words = [0; WORDS];
        words[0] = self.max;
        words
    }

    pub(crate) fn from_words(words: Words) -> Self {
        Concurrency { max: words[0] }
    }

    fn decision(&self, allowed: bool, held: u64) -> Decision {
        Decision {
            allowed: allowed.into(),
            limit: self.max,
            // Units come back when a holder releases them, at no time the rule can tell.
            retry_after: 0,
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(self.max.saturating_sub(held)),
        }
    }
}

impl WordRule for Concurrency {
    #[inline]
    fn decide(&self, held: u64, _now: Nanos, cost: u64) -> (Decision, u64) {
        if cost > self.max {
            return (self.decision(false, held).never(), held);
        }
        match held.checked_add(cost) {
            Some(after) if after <= self.max => (self.decision(true, after), after),
            _ => (self.decision(false, held), held),
        }
    }

    fn refunded(&self, held: u64, _now: Nanos, cost: u64) -> u64 {
        held.saturating_sub(cost)
    }

    /// A key with nothing held is as good as new, whatever the time.
    fn is_fresh(&self, held: u64, _now: Nanos) -> bool {
        held == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_bound_and_releases() {
        let rule = Concurrency::new(3).unwrap();
        let (d, held) = rule.decide(0, 0, 2);
        assert!(d.allowed());
        assert_eq!((held, d.remaining()), (2, 1));
        let (d, same) = rule.decide(held, 0, 2);
        assert!(!d.allowed());
        assert_eq!((same, d.remaining(), d.retry_after_nanos()), (2, 1, 0));
        let (d, full) = rule.decide(held, 0, 1);
        assert!(d.allowed() && d.remaining() == 0);
        assert_eq!(rule.refunded(full, 0, 2), 1);
        assert_eq!(rule.refunded(1, 0, 5), 0, "never below nothing held");
        assert!(rule.is_fresh(0, 0) && !rule.is_fresh(1, u64::MAX));
    }

    #[test]
    fn bad_bounds_and_costs() {
        assert_eq!(Concurrency::new(0), Err(QuotaError::ZeroLimit));
        assert!(Concurrency::new(MAX_IN_FLIGHT + 1).is_err());
        let rule = Concurrency::new(MAX_IN_FLIGHT).unwrap();
        let (d, held) = rule.decide(MAX_IN_FLIGHT, 0, 1);
        assert!(!d.allowed() && held == MAX_IN_FLIGHT);
        let small = Concurrency::new(2).unwrap();
        let (d, held) = small.decide(1, 0, 3);
        assert_eq!(
            (d.allowed(), held, d.retry_after_nanos()),
            (false, 1, u64::MAX)
        );
        let (d, held) = small.decide(2, 0, 0);
        assert!(d.allowed() && held == 2, "a cost of 0 is free");
    }
}
