//! A concurrency limit: at most `N` units held at once. Not a rate: the state is the count of
//! units held, taken by an admission and given back by a release, whatever the time.
//!
//! ```text
//! admit iff held + c ≤ N,  then held := held + c;   release: held := held − c
//! ```
//!
//! Waiters ([`InFlight::acquire`](crate::InFlight::acquire), feature `tokio`) add a mark to the
//! word: a key with waiters queued refuses checks (a newcomer never takes the units a waiter is
//! owed), and its units go to the waiters in turn, each by a reservation that ignores the mark.
//!
//! ```text
//! bits 0..62: held    bit 62: poke (flipped by every refused reservation)    bit 63: queued
//! ```
//!
//! A refused reservation sets `queued` and flips `poke`, so that it always *writes* the word:
//! a waiter that counted itself before reserving is then seen by any release that writes the
//! word after it, and a release written before it is seen by the reservation (the waiter queue's
//! ordering argument, `limiter/in_flight/waiters.rs`).
//!
//! The rule behind [`InFlight`](crate::InFlight), which gives each admission a permit that
//! releases its units when dropped. Crate-private (its module is not exported): a rule whose
//! units come back only by a release must not be handed to a limiter that would never release
//! them.

use crate::algorithm::rule::{WordRule, Words, WORDS};
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::QuotaError;

/// The largest `N`: the count has 62 bits, and with both mark bits set the word must stay
/// below the store's two marks (`u64::MAX`, `u64::MAX − 1`).
pub(crate) const MAX_IN_FLIGHT: u64 = (1 << 62) - 3;

/// The units held.
const HELD: u64 = (1 << 62) - 1;
/// Flipped by every refused reservation, so that it writes the word.
const POKE: u64 = 1 << 62;
/// Waiters are queued for this key: checks are refused, reservations are not.
const QUEUED: u64 = 1 << 63;

/// At most `max` units held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Concurrency {
    max: u64,
    /// This value's refund also clears the queued mark: the rule a waiter queue uses once it
    /// is empty ([`Concurrency::unqueuing`]).
    unqueue: bool,
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
        Ok(Concurrency {
            max,
            unqueue: false,
        })
    }

    /// The same bound, whose refund (of any cost, 0 included) also clears the queued mark:
    /// for a waiter queue that has just emptied.
    #[allow(dead_code)] // used by the waiter queue (feature `tokio`)
    pub(crate) fn unqueuing(self) -> Self {
        Concurrency {
            unqueue: true,
            ..self
        }
    }

    /// The units `state` holds (without its marks).
    #[cfg(test)]
    pub(crate) fn held(state: u64) -> u64 {
        state & HELD
    }

    /// Whether `state` has waiters queued.
    #[cfg(test)]
    pub(crate) fn queued(state: u64) -> bool {
        state & QUEUED != 0
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
        Concurrency {
            max: words[0],
            unqueue: false,
        }
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
    /// A check: refused while waiters are queued, whatever is free (they are served first).
    #[inline]
    fn decide(&self, state: u64, _now: Nanos, cost: u64) -> (Decision, u64) {
        let held = state & HELD;
        if cost > self.max {
            return (self.decision(false, held).never(), state);
        }
        if state & QUEUED == 0 && held + cost <= self.max {
            // No overflow: held ≤ max and cost ≤ max, both below 2^62.
            return (self.decision(true, held + cost), state + cost);
        }
        (self.decision(false, held), state)
    }

    fn refunded(&self, state: u64, _now: Nanos, cost: u64) -> u64 {
        let marks = if self.unqueue { 0 } else { state & !HELD };
        marks | (state & HELD).saturating_sub(cost)
    }

    /// A waiter's reservation: admitted if the units are free, marks or not; refused, it marks
    /// the key queued and flips the poke bit (a write, always).
    fn reserve(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let held = state & HELD;
        if cost > self.max {
            return self.decide(state, now, cost);
        }
        if held + cost <= self.max {
            return (self.decision(true, held + cost), state + cost);
        }
        (self.decision(false, held), (state | QUEUED) ^ POKE)
    }

    /// A key with nothing held and no waiter is as good as new, whatever the time (the poke
    /// bit is set only with the queued one, and cleared with it).
    fn is_fresh(&self, state: u64, _now: Nanos) -> bool {
        state == 0
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
    fn a_queued_key_refuses_checks_and_serves_reservations() {
        let rule = Concurrency::new(2).unwrap();
        let (_, full) = rule.decide(0, 0, 2);
        // A waiter's refused reservation marks the key, and always writes the word.
        let (d, marked) = rule.reserve(full, 0, 1);
        assert!(!d.allowed() && Concurrency::queued(marked) && marked != full);
        let (d, again) = rule.reserve(marked, 0, 1);
        assert!(!d.allowed() && Concurrency::queued(again) && again != marked);
        // A release keeps the mark: the freed unit is the waiter's, not a newcomer's.
        let freed = rule.refunded(again, 0, 1);
        assert_eq!(Concurrency::held(freed), 1);
        let (d, same) = rule.decide(freed, 0, 1);
        assert!(!d.allowed() && same == freed && d.remaining() == 1);
        let (d, served) = rule.reserve(freed, 0, 1);
        assert!(d.allowed() && Concurrency::held(served) == 2 && Concurrency::queued(served));
        // The queue emptied: the mark goes, and with nothing held the key is fresh again.
        let cleared = rule.unqueuing().refunded(served, 0, 2);
        assert_eq!(cleared, 0);
        assert!(rule.is_fresh(cleared, 0) && !rule.is_fresh(freed, 0));
        assert!(rule.decide(cleared, 0, 2).0.allowed());
    }

    #[test]
    fn marked_words_stay_below_the_stores_marks() {
        let rule = Concurrency::new(MAX_IN_FLIGHT).unwrap();
        let (d, full) = rule.decide(0, 0, MAX_IN_FLIGHT);
        assert!(d.allowed());
        let (_, a) = rule.reserve(full, 0, 1);
        let (_, b) = rule.reserve(a, 0, 1);
        for state in [a, b] {
            assert!(state <= u64::MAX - 2, "{state:#x} would read as a mark");
            assert_eq!(Concurrency::held(state), MAX_IN_FLIGHT);
        }
        let (d, _) = rule.reserve(full, 0, MAX_IN_FLIGHT + 1);
        assert_eq!(d.retry_after_nanos(), u64::MAX, "never: nothing queued");
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
