use crossbeam_utils::CachePadded;

use super::algorithm::Algorithm;
use super::engine::{Engine, Sweep};
use crate::algorithm::{Gcra, LeakyQueue};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, LimitError};
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
    engine: Engine<A, C>,
}

/// # Construction
impl<A: Algorithm> Limiter<A, QuantaClock> {
    /// A limiter on the precise default clock.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Limiter, Quota};
    /// // One limit for the whole process, e.g. outgoing calls to one upstream.
    /// let upstream = Limiter::new(Gcra::new(Quota::per_second(100)?)?);
    /// assert!(upstream.check().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(rule: A) -> Self {
        Self::with_clock(rule, QuantaClock::new()).expect("the precise clock resolves 1 ns")
    }
}

impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// A limiter on `clock`. Refused if the clock is too coarse for the quota
    /// ([`QuotaError::ClockTooCoarse`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::{CoarseClock, ManualClock}, Gcra, Limiter, Quota, QuotaError};
    /// // Tests drive time by hand.
    /// let test = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// assert!(test.check().allowed());
    /// // A 1 ms tick cannot enforce a bucket that spans 10 µs: refused up front.
    /// let fine = Gcra::new(Quota::per_second(100_000)?.with_burst(1)?)?;
    /// assert!(matches!(
    ///     Limiter::with_clock(fine, CoarseClock::new()),
    ///     Err(QuotaError::ClockTooCoarse { .. })
    /// ));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn with_clock(rule: A, clock: C) -> Result<Self, QuotaError> {
        Ok(Limiter {
            cell: CachePadded::new(A::Cell::default()),
            engine: Engine::new(rule, clock)?,
        })
    }

    /// The clock this limiter reads.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// clock.advance(std::time::Duration::from_secs(1));
    /// assert_eq!(tollgate::clock::Clock::now(limiter.clock()), 1_000_000_000); // clones share time
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn clock(&self) -> &C {
        self.engine.clock()
    }

    /// The rule in force.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, Limiter, Quota};
    /// let limiter = Limiter::new(Gcra::new(Quota::per_second(2)?)?);
    /// limiter.set_quota(Gcra::new(Quota::per_second(5)?)?)?;
    /// assert_eq!(limiter.rule().limit(), 5); // the rule in force now, after any `set_quota`
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn rule(&self) -> A {
        self.engine.rule()
    }
}

/// # Checking
impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// Decides a request of cost 1, and counts it if allowed.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// assert!(limiter.check().allowed());
    /// assert!(limiter.check().allowed());
    /// let denied = limiter.check();
    /// assert!(!denied.allowed());
    /// assert_eq!(denied.retry_after().as_millis(), 500);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    #[inline]
    pub fn check(&self) -> Decision {
        loop {
            let at = self.engine.attempt();
            let decision = at
                .rule()
                .acquire(&self.cell, || at.now_noting_due(), 1, true);
            if self.engine.settle(&at, &self.sweep()) {
                return decision;
            }
        }
    }

    /// Decides a request of cost `cost`, and counts it if allowed. `cost = 0` is always allowed
    /// and changes nothing.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] when `cost` can never be admitted; nothing changes.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// // A batch of 2 rows costs 2 units: admitted whole or not at all.
    /// assert!(limiter.check_n(2)?.allowed());
    /// assert!(!limiter.check_n(1)?.allowed());
    /// assert!(limiter.check_n(0)?.allowed()); // free, changes nothing
    /// assert!(limiter.check_n(3).is_err()); // above the burst: never admissible
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, LimitError> {
        self.decide_n(cost, true)
    }

    /// The decision a request of cost `cost` would get now; changes nothing.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] as for [`Limiter::check_n`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// // Ask before starting expensive work; nothing is counted.
    /// assert!(limiter.peek(2)?.allowed());
    /// assert!(limiter.peek(2)?.allowed());
    /// assert_eq!(limiter.check().remaining(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek(&self, cost: u64) -> Result<Decision, LimitError> {
        self.decide_n(cost, false)
    }

    /// Gives back `cost` units that were admitted but not used.
    ///
    /// GCRA and the leaky bucket move their state back by `cost` emission intervals (never past
    /// a full bucket); the window counters take the units off the window that counted them;
    /// the sliding log drops its `cost` newest entries. Refunding more than was admitted cannot
    /// raise capacity above full.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// assert!(limiter.check_n(2).unwrap().allowed());
    /// // The request failed before doing any work: do not charge the client for it.
    /// limiter.refund(2);
    /// assert!(limiter.peek(2).unwrap().allowed()); // the whole burst is back
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn refund(&self, cost: u64) {
        loop {
            let at = self.engine.attempt();
            at.rule().refund(&self.cell, || at.now_noting_due(), cost);
            if self.engine.settle(&at, &self.sweep()) {
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
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, clock.clone())?;
    /// limiter.check_n(2).unwrap();
    /// // More per second from now on. The 1 s of debt already run up is kept: it fills the
    /// // new bucket too (10 × 100 ms), so switching quotas never hands out a fresh burst.
    /// limiter.set_quota(Gcra::new(Quota::per_second(10)?)?)?;
    /// assert!(!limiter.check().allowed());
    /// clock.advance(std::time::Duration::from_millis(200));
    /// assert!(limiter.check().allowed()); // the new rate: a unit every 100 ms
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        self.engine.set_quota(rule)
    }

    /// A request of `cost` decided now, counted if `commit` and allowed.
    #[inline]
    fn decide_n(&self, cost: u64, commit: bool) -> Result<Decision, LimitError> {
        loop {
            let at = self.engine.attempt();
            self.engine.check_cost(at.rule(), cost)?;
            let decision = at
                .rule()
                .acquire(&self.cell, || at.now_noting_due(), cost, commit);
            if self.engine.settle(&at, &self.sweep()) {
                return Ok(decision);
            }
        }
    }

    /// [`Limiter::check_n`] as a reservation (`Stored::reserve`): what the waiting calls
    /// charge with.
    pub(crate) fn reserve_n(&self, cost: u64) -> Result<Decision, LimitError> {
        loop {
            let at = self.engine.attempt();
            self.engine.check_cost(at.rule(), cost)?;
            let decision = at.rule().reserve(&self.cell, || at.now_noting_due(), cost);
            if self.engine.settle(&at, &self.sweep()) {
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
    /// [`LimitError::CapacityExceeded`] when `cost > C`.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, LeakyQueue, Limiter, Quota};
    /// let queue = Limiter::with_clock(LeakyQueue::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// let first = queue.reserve(1).unwrap();
    /// let second = queue.reserve(1).unwrap();
    /// assert!(first.allowed() && second.allowed());
    /// // Both admitted; the second must wait its turn before it goes.
    /// assert_eq!(second.delay(), Duration::from_millis(100));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reserve(&self, cost: u64) -> Result<Decision, LimitError> {
        self.check_n(cost)
    }
}

/// # Reservations
impl<C: Clock> Limiter<Gcra, C> {
    /// Reserves `cost` units: admitted at once when the bucket holds them, else taken anyway
    /// and due after the decision's [`Decision::delay`] (see [`KeyedLimiter::reserve`](crate::KeyedLimiter::reserve)).
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] when `cost` exceeds the burst.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// limiter.check_n(2)?;
    /// assert_eq!(limiter.reserve(1)?.delay(), Duration::from_millis(500));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(&self, cost: u64) -> Result<Decision, LimitError> {
        self.reserve_n(cost)
    }
}
