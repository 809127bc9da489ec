use crossbeam_utils::CachePadded;

use crate::algorithm::{Algorithm, LeakyQueue};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Error};
use crate::limiter::{Core, Sweep};
use crate::quota::QuotaError;

/// A limiter with a single state: every call counts against the same quota.
///
/// # Examples
/// ```
/// use tollgate::{Gcra, Limiter, Quota};
/// let limiter = Limiter::new(Gcra::new(Quota::per_second(2)?)?);
/// assert!(limiter.check().allowed());
/// assert!(limiter.check().allowed());
/// let third = limiter.check();
/// assert!(!third.allowed());
/// assert!(third.retry_after().as_millis() <= 500);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug)]
pub struct Limiter<A: Algorithm, C: Clock = QuantaClock> {
    /// Padded: the one hot word every thread writes should not share its cache line.
    cell: CachePadded<A::Cell>,
    core: Core<A, C>,
}

/// # Construction
impl<A: Algorithm> Limiter<A, QuantaClock> {
    /// A limiter on the precise default clock.
    pub fn new(rule: A) -> Self {
        Self::with_clock(rule, QuantaClock::new()).expect("the precise clock resolves 1 ns")
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// A limiter on `clock`. Refused if the clock is too coarse for the quota
    /// ([`QuotaError::ClockTooCoarse`]).
    pub fn with_clock(rule: A, clock: C) -> Result<Self, QuotaError> {
        Ok(Limiter {
            cell: CachePadded::new(A::Cell::default()),
            core: Core::new(rule, clock)?,
        })
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        self.core.clock()
    }

    /// The rule in force.
    pub fn rule(&self) -> A {
        self.core.rule()
    }
}

/// # Checking
impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// Decides a request of cost 1, and counts it if allowed.
    #[inline]
    pub fn check(&self) -> Decision {
        loop {
            let at = self.core.attempt();
            let decision = at.rule().acquire(&self.cell, || at.now(), 1, true);
            if self.core.settle(&at, &self.sweep()) {
                return decision;
            }
        }
    }

    /// Decides a request of cost `cost`, and counts it if allowed. `cost = 0` is always allowed
    /// and changes nothing.
    ///
    /// # Errors
    /// [`Error::CapacityExceeded`] when `cost` can never be admitted; nothing changes.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, Error> {
        self.acquire(cost, true)
    }

    /// The decision a request of cost `cost` would get now; changes nothing.
    ///
    /// # Errors
    /// [`Error::CapacityExceeded`] as for [`Limiter::check_n`].
    pub fn peek(&self, cost: u64) -> Result<Decision, Error> {
        self.acquire(cost, false)
    }

    /// Gives back `cost` units that were admitted but not used.
    ///
    /// GCRA and the leaky bucket move their state back by `cost` emission intervals (never past
    /// a full bucket); the window counters take the units off the window that counted them;
    /// the sliding log drops its `cost` newest entries. Refunding more than was admitted cannot
    /// raise capacity above full.
    pub fn refund(&self, cost: u64) {
        loop {
            let at = self.core.attempt();
            at.rule().refund(&self.cell, || at.now(), cost);
            if self.core.settle(&at, &self.sweep()) {
                return;
            }
        }
    }

    /// Replaces the quota on the live limiter, keeping its state meaningful: GCRA and leaky
    /// states keep their debt in time; window counters keep their counts. A new window length
    /// starts its first window now, carrying the current window's counts (so toggling `W` never
    /// hands out a fresh quota); windows are then aligned to that instant, not the origin.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if this limiter's clock cannot serve the new quota.
    pub fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        self.core.set_quota(rule)
    }

    #[inline]
    fn acquire(&self, cost: u64, commit: bool) -> Result<Decision, Error> {
        loop {
            let at = self.core.attempt();
            self.core.check_cost(at.rule(), cost)?;
            let decision = at.rule().acquire(&self.cell, || at.now(), cost, commit);
            if self.core.settle(&at, &self.sweep()) {
                return Ok(decision);
            }
        }
    }

    /// A direct limiter's sweep: its one state back to fresh if it is.
    fn sweep(&self) -> impl Sweep<A> + '_ {
        |rule: &A, now| {
            rule.reset_if_fresh(&self.cell, now);
            0
        }
    }
}

/// # Shaping
impl<C: Clock> Limiter<LeakyQueue, C> {
    /// Reserves `cost` units in the queue: if admitted, the request must wait
    /// [`Decision::delay`] before it proceeds. A reservation is kept even if the caller gives
    /// up; call [`Limiter::refund`] to hand its slot back.
    ///
    /// # Errors
    /// [`Error::CapacityExceeded`] when `cost > C`.
    pub fn reserve(&self, cost: u64) -> Result<Decision, Error> {
        self.check_n(cost)
    }
}
