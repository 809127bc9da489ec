//! Async waiting (feature `tokio`): one vocabulary on every limiter, and a [`TokioClock`]
//! that follows tokio's time.
//!
//! | | decides now | waits as long as it takes | waits at most `max_wait` |
//! |---|---|---|---|
//! | [`Limiter`] | `check()`, `check_n(cost)` | `until_ready()`, `until_ready_n(cost)` | `acquire(max_wait)`, `acquire_n(cost, max_wait)` |
//! | [`KeyedLimiter`], [`MultiLimiter`] | `check(key)`, `check_n(key, cost)` | `until_ready(key)`, `until_ready_n(key, cost)` | `acquire(key, max_wait)`, `acquire_n(key, cost, max_wait)` |
//! | [`InFlight`](crate::InFlight) | `try_acquire(key)`, `try_acquire_n(key, cost)` | — | `acquire(key, max_wait)`, `acquire_n(key, cost, max_wait)` |
//!
//! The same arguments in the same order everywhere: the key (keyed limiters), then the cost,
//! only in the `_n` forms (a form without `_n` costs 1), then the bound. What a call returns
//! follows its limiter's check: a [`Decision`] for the rate limiters (`until_ready()` on a
//! [`Limiter`] cannot fail, as `check()` cannot), a permit for
//! [`InFlight`](crate::InFlight) (and `acquire_owned` / `acquire_n_owned` for a permit that
//! owns the limit).
//!
//! - `until_ready` / `until_ready_n` wait as long as it takes, then return the admitting
//!   decision; their errors are the check's ([`LimitError`]), at once.
//! - `acquire` / `acquire_n` wait at most `max_wait`, and every limiter gives up with the same
//!   [`WaitError`]: [`WaitError::TooLong`] when admission would take longer (the rate
//!   limiters know it in advance and answer at once, charging nothing;
//!   [`InFlight`](crate::InFlight) answers once it waited `max_wait` in vain), or
//!   [`WaitError::Limit`], the check's error.
//!
//! An [`InFlight`](crate::InFlight) has no unbounded wait: its permits come back only when
//! their holders drop them, which a stuck request may never do. The Redis leased tier's
//! `LeasedLimiter::check_waiting` / `check_n_waiting` (feature `redis`) are checks, not these
//! waits: they wait for a lease's grant, never for the key's budget, and may be denied.
//!
//! How a call waits depends on the algorithm:
//! - **GCRA** ([`Gcra`](crate::Gcra), the token and leaky buckets) and the **leaky queue**
//!   ([`LeakyQueue`](crate::LeakyQueue)): the call reserves its slot once and sleeps until it.
//!   GCRA's reservation takes the units even when a check would refuse them now
//!   (`TAT := max(TAT, t) + c·T`)
//!   and is due when a check would have admitted them; the queue's is its own (decision rules
//!   §3). Waiters are served in the order they reserved, with no re-check and no thundering
//!   herd, and each is charged once. Dropping the future before its slot gives the slot back (a
//!   [`refund`](KeyedLimiter::refund) of its cost: the tail moves back, later waiters keep the
//!   slots they were given), to the state it was taken from: a keyed limiter's waiter for a
//!   key over `max_keys` ([`OverflowPolicy::Shared`](crate::OverflowPolicy::Shared)) gives it
//!   back to the shared state, even if the key has found a place of its own since.
//! - **The windows and the log**: a denied check changes nothing, so the call sleeps for the
//!   decision's `retry_after` and checks again. It is charged once, by the check that admits
//!   it, and dropping it while it sleeps costs nothing (cancel-safe). These waiters are not
//!   served in order: one that wakes first may take the unit another waited for, and that one
//!   waits again (within `max_wait` for `acquire`).
//!
//! Sleeping uses tokio's timer, and the limiter reads its own clock: with tokio's paused time
//! (tests), give the limiter a [`TokioClock`] so that both see the same time.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use tollgate::wait::{TokioClock, WaitError};
//! use tollgate::{Gcra, KeyedLimiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = KeyedLimiter::<String, _, _>::with_clock(
//!     Gcra::new(Quota::per_second(2)?)?,
//!     TokioClock::new(),
//! )?;
//! limiter.until_ready_n("alice", 2).await?; // the burst: at once
//! let start = tokio::time::Instant::now();
//! limiter.until_ready("alice").await?; // 500 ms later
//! assert_eq!(start.elapsed(), Duration::from_millis(500));
//! // Two more units would take a second: more than we are willing to wait.
//! let e = limiter.acquire_n("alice", 2, Duration::from_millis(100)).await.unwrap_err();
//! assert!(matches!(e, WaitError::TooLong { .. }));
//! # Ok(())
//! # }
//! ```

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::Rule;
use crate::clock::{Clock, Nanos};
use crate::limiter::Algorithm;
use crate::store::KeyedStore;
use crate::{Decision, KeyedLimiter, LimitError, Limiter, MultiLimiter};

pub use crate::limiter::error::WaitError;

/// A [`Clock`] that reads tokio's time (`tokio::time::Instant`), so that a limiter and tokio's
/// timer agree, also under tokio's paused time (`#[tokio::test(start_paused = true)]`, where
/// time jumps to the next timer when every task waits).
///
/// Outside tests prefer the default precise clock: this one reads `Instant::now()` through
/// tokio (a little slower). Outside a runtime with paused time it is the monotonic clock.
///
/// # Examples
/// ```
/// use tollgate::clock::Clock;
/// use tollgate::wait::TokioClock;
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let clock = TokioClock::new();
/// tokio::time::sleep(std::time::Duration::from_millis(3)).await;
/// assert_eq!(clock.now(), 3_000_000);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::Clock, wait::TokioClock, Gcra, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = TokioClock::new();
    /// assert_eq!(clock.now(), 0); // its origin: the moment it was made
    /// // A limiter on tokio's (here paused) time: a test advances it without sleeping for real.
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(1)?)?, clock)?;
    /// assert!(limiter.check().allowed());
    /// assert!(!limiter.check().allowed());
    /// tokio::time::advance(std::time::Duration::from_secs(1)).await;
    /// assert!(limiter.check().allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        TokioClock {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        let nanos = Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos();
        Nanos::try_from(nanos).unwrap_or(Nanos::MAX)
    }
}

/// The shortest sleep between two checks: a denied decision always has a positive
/// `retry_after`, but a zero one must not spin.
pub(crate) const MIN_SLEEP: Duration = Duration::from_micros(1);

/// Gives a reservation back if its waiter is dropped before its slot.
struct RefundOnDrop<F: FnOnce()> {
    refund: Option<F>,
}

impl<F: FnOnce()> Drop for RefundOnDrop<F> {
    fn drop(&mut self) {
        if let Some(refund) = self.refund.take() {
            refund();
        }
    }
}

/// The wait loop shared by every limiter.
///
/// - `charge` decides and counts (a denial changes nothing), and says where it charged (`R`:
///   for a keyed limiter, the decision itself, which names the state it charged);
/// - `wait_now` reports how long an admission would take now, without changing anything;
/// - `refund` gives back a reservation where `charge` said it was made (only ever called after
///   an admitted `charge` whose decision carries a delay).
async fn drive<R>(
    mut charge: impl FnMut() -> Result<(Decision, R), LimitError>,
    wait_now: impl Fn() -> Result<Duration, LimitError>,
    refund: impl FnOnce(R),
    max_wait: Option<Duration>,
) -> Result<Decision, WaitError> {
    // A bound too far away to represent is no bound.
    let deadline = max_wait.and_then(|m| Instant::now().checked_add(m).map(|d| (d, m)));
    let too_long = |wait: Duration| -> Result<(), WaitError> {
        match deadline {
            // (`checked_add`: an instant past the clock's range is past any deadline.)
            Some((deadline, max_wait))
                if Instant::now()
                    .checked_add(wait)
                    .is_none_or(|wake| wake > deadline) =>
            {
                Err(WaitError::TooLong { wait, max_wait })
            }
            _ => Ok(()),
        }
    };
    let mut refund = Some(refund);
    loop {
        // Judge the wait before charging: a reservation that would be given back at once
        // would disturb the queue for nothing.
        if deadline.is_some() {
            too_long(wait_now()?)?;
        }
        let (decision, charged) = charge()?;
        if decision.allowed() {
            let delay = decision.delay();
            if delay.is_zero() {
                return Ok(decision);
            }
            let mut guard = RefundOnDrop {
                refund: refund.take().map(|refund| move || refund(charged)),
            };
            // Another waiter may have reserved between the look and the charge.
            too_long(delay)?;
            tokio::time::sleep(delay).await;
            guard.refund = None;
            return Ok(decision);
        }
        let wait = decision.retry_after().max(MIN_SLEEP);
        too_long(wait)?;
        tokio::time::sleep(wait).await;
    }
}

/// The outcome of a wait without a bound: it is never too long.
fn unbounded(result: Result<Decision, WaitError>) -> Result<Decision, LimitError> {
    result.map_err(|e| match e {
        WaitError::Limit(e) => e,
        // Only a bounded wait (`Some(max_wait)`) is ever too long; should one be reported,
        // the caller is told the cost cannot be admitted rather than given a panic.
        WaitError::TooLong { .. } => LimitError::CapacityExceeded {
            cost: 0,
            capacity: 0,
        },
    })
}

/// How long a peek's `decision` under rule `A` says an admission takes: its delay when
/// admitted; when refused, `retry_after` and then, for the leaky queue, the delay the queue
/// assigns then: `tat − t` in all, which is the refusal's `reset_after` (decision rules §3).
fn wait_of<A: Algorithm>(decision: Decision) -> Duration {
    if decision.allowed() {
        decision.delay()
    } else if A::NAME == crate::LeakyQueue::NAME {
        decision.reset_after().max(decision.retry_after())
    } else {
        decision.retry_after()
    }
}

/// # Waiting (feature `tokio`)
impl<A: Algorithm, C: Clock> Limiter<A, C> {
    /// Waits until a request of cost 1 is admitted, and returns the admitting decision (see
    /// the [`wait`](crate::wait) module for how each algorithm waits). Like
    /// [`Limiter::check`], it cannot fail.
    ///
    /// # Examples
    /// ```
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(10)?)?, TokioClock::new())?;
    /// for _ in 0..20 {
    ///     limiter.until_ready().await; // 10 at once, then one every 100 ms
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready(&self) -> Decision {
        match self.wait_inner(1, None).await {
            Ok(decision) => decision,
            // Not reached: every rule admits a cost of 1 (its capacity is at least 1), and a
            // wait without a bound is never too long. Should it be, the caller gets a decision
            // rather than a panic.
            Err(_) => self.check(),
        }
    }

    /// Waits until `cost` units are admitted, and returns the admitting decision.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] at once if `cost` can never be admitted.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(10)?)?, TokioClock::new())?;
    /// limiter.until_ready_n(10).await?; // the burst, at once
    /// let start = tokio::time::Instant::now();
    /// limiter.until_ready_n(5).await?; // 5 more: 500 ms later
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// assert!(limiter.until_ready_n(11).await.is_err()); // above the burst: never
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready_n(&self, cost: u64) -> Result<Decision, LimitError> {
        unbounded(self.wait_inner(cost, None).await)
    }

    /// Waits at most `max_wait` for a request of cost 1.
    ///
    /// # Errors
    /// [`WaitError::TooLong`] at once, charging nothing, when admission would take longer.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::{TokioClock, WaitError};
    /// use tollgate::{Gcra, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(1)?)?, TokioClock::new())?;
    /// limiter.acquire(Duration::ZERO).await?;
    /// let late = limiter.acquire(Duration::from_millis(500)).await;
    /// assert!(matches!(late, Err(WaitError::TooLong { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, max_wait: Duration) -> Result<Decision, WaitError> {
        self.wait_inner(1, Some(max_wait)).await
    }

    /// Waits at most `max_wait` for `cost` units.
    ///
    /// # Errors
    /// [`WaitError::TooLong`] at once, charging nothing, when admission would take longer;
    /// [`WaitError::Limit`] when the limiter refuses to decide.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::{TokioClock, WaitError};
    /// use tollgate::{Gcra, Limiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(10)?)?, TokioClock::new())?;
    /// limiter.acquire_n(10, Duration::ZERO).await?;
    /// // 5 more units take 500 ms: within a second, not within 100 ms.
    /// let late = limiter.acquire_n(5, Duration::from_millis(100)).await;
    /// assert!(matches!(late, Err(WaitError::TooLong { .. })));
    /// limiter.acquire_n(5, Duration::from_secs(1)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n(&self, cost: u64, max_wait: Duration) -> Result<Decision, WaitError> {
        self.wait_inner(cost, Some(max_wait)).await
    }

    async fn wait_inner(
        &self,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> Result<Decision, WaitError> {
        drive(
            || self.reserve_n(cost).map(|decision| (decision, ())),
            || self.peek(cost).map(wait_of::<A>),
            |()| self.refund(cost),
            max_wait,
        )
        .await
    }
}

/// # Waiting (feature `tokio`)
impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    S: KeyedStore<K, A::Cell>,
{
    /// Waits until a request of cost 1 is admitted for `key` (see [`Limiter::until_ready`]).
    ///
    /// # Errors
    /// As for [`KeyedLimiter::check`], at once.
    ///
    /// # Examples
    /// ```
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::<String, _, _>::with_clock(
    ///     Gcra::new(Quota::per_second(10)?)?,
    ///     TokioClock::new(),
    /// )?;
    /// let decision = limiter.until_ready("bob").await?;
    /// assert!(decision.allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready<Q>(&self, key: &Q) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_ready_n(key, 1).await
    }

    /// Waits until `cost` units are admitted for `key` (see [`Limiter::until_ready_n`]).
    ///
    /// # Errors
    /// As for [`KeyedLimiter::check_n`], at once.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::<String, _, _>::with_clock(
    ///     Gcra::new(Quota::per_second(10)?)?,
    ///     TokioClock::new(),
    /// )?;
    /// limiter.until_ready_n("bob", 10).await?;
    /// let start = tokio::time::Instant::now();
    /// limiter.until_ready_n("bob", 3).await?;
    /// assert_eq!(start.elapsed(), Duration::from_millis(300));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        unbounded(self.wait_inner(key, cost, None).await)
    }

    /// Waits at most `max_wait` for a request of cost 1 for `key` (see [`Limiter::acquire`]).
    ///
    /// # Errors
    /// As for [`Limiter::acquire_n`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{KeyedLimiter, LeakyQueue, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A shaper: one request every 100 ms, up to 5 queued.
    /// let queue = KeyedLimiter::<String, _, _>::with_clock(
    ///     LeakyQueue::new(Quota::per_second(10)?.with_burst(5)?)?,
    ///     TokioClock::new(),
    /// )?;
    /// let start = tokio::time::Instant::now();
    /// for _ in 0..3 {
    ///     queue.acquire("carol", Duration::from_secs(1)).await?;
    /// }
    /// assert_eq!(start.elapsed(), Duration::from_millis(200));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<Q>(&self, key: &Q, max_wait: Duration) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_n(key, 1, max_wait).await
    }

    /// Waits at most `max_wait` for `cost` units for `key` (see [`Limiter::acquire_n`]).
    ///
    /// # Errors
    /// As for [`Limiter::acquire_n`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::{TokioClock, WaitError};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::<String, _, _>::with_clock(
    ///     Gcra::new(Quota::per_second(10)?)?,
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire_n("carol", 10, Duration::ZERO).await?;
    /// let e = limiter.acquire_n("carol", 5, Duration::from_millis(100)).await.unwrap_err();
    /// assert_eq!(
    ///     e,
    ///     WaitError::TooLong { wait: Duration::from_millis(500), max_wait: Duration::from_millis(100) }
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait_inner(key, cost, Some(max_wait)).await
    }

    async fn wait_inner<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        drive(
            || {
                self.reserve_n(key, cost)
                    .map(|decision| (decision, decision))
            },
            || self.peek(key, cost).map(wait_of::<A>),
            |decided| self.refund_decided(key, cost, &decided),
            max_wait,
        )
        .await
    }
}

/// # Waiting (feature `tokio`)
impl<K, A, C> MultiLimiter<K, A, C>
where
    K: Clone + Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
{
    /// Waits until every limit admits a request of cost 1 for `key` (all or nothing; see
    /// [`Limiter::until_ready`]).
    ///
    /// # Errors
    /// As for [`MultiLimiter::check`], at once.
    ///
    /// # Examples
    /// ```
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = MultiLimiter::<String, _, _>::with_clock(
    ///     [Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_minute(100)?)?],
    ///     TokioClock::new(),
    /// )?;
    /// limiter.until_ready("dave").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready<Q>(&self, key: &Q) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_ready_n(key, 1).await
    }

    /// Waits until every limit admits `cost` units for `key` (all or nothing; see
    /// [`Limiter::until_ready_n`]). With a leaky queue among the limits, the call waits the
    /// delay of the decision [`MultiLimiter::check_n`] returns.
    ///
    /// # Errors
    /// As for [`MultiLimiter::check_n`], at once.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::TokioClock;
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = MultiLimiter::<String, _, _>::with_clock(
    ///     [Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_minute(100)?)?],
    ///     TokioClock::new(),
    /// )?;
    /// limiter.until_ready_n("dave", 10).await?;
    /// let start = tokio::time::Instant::now();
    /// limiter.until_ready_n("dave", 2).await?; // the per-second limit: 200 ms
    /// assert_eq!(start.elapsed(), Duration::from_millis(200));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        unbounded(self.wait_inner(key, cost, None).await)
    }

    /// Waits at most `max_wait` until every limit admits a request of cost 1 for `key` (see
    /// [`Limiter::acquire`]).
    ///
    /// # Errors
    /// As for [`Limiter::acquire_n`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::{TokioClock, WaitError};
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = MultiLimiter::<String, _, _>::with_clock(
    ///     [Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_minute(1)?)?],
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire("erin", Duration::ZERO).await?;
    /// // The per-minute limit needs a minute for one more unit.
    /// let e = limiter.acquire("erin", Duration::from_secs(1)).await.unwrap_err();
    /// assert!(matches!(e, WaitError::TooLong { .. }));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<Q>(&self, key: &Q, max_wait: Duration) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_n(key, 1, max_wait).await
    }

    /// Waits at most `max_wait` until every limit admits `cost` units for `key` (see
    /// [`Limiter::acquire_n`]).
    ///
    /// # Errors
    /// As for [`Limiter::acquire_n`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::{TokioClock, WaitError};
    /// use tollgate::{Gcra, MultiLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = MultiLimiter::<String, _, _>::with_clock(
    ///     [Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_minute(10)?)?],
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire_n("erin", 10, Duration::ZERO).await?;
    /// // The per-minute limit needs 6 s for one more unit.
    /// let e = limiter.acquire_n("erin", 1, Duration::from_secs(1)).await.unwrap_err();
    /// assert!(matches!(e, WaitError::TooLong { .. }));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait_inner(key, cost, Some(max_wait)).await
    }

    async fn wait_inner<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Option<Duration>,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        drive(
            || {
                self.reserve_n(key, cost)
                    .map(|(decision, _)| (decision, ()))
            },
            || {
                // The longest wait of any limit.
                let mut wait = Duration::ZERO;
                for limit in self.limits() {
                    wait = wait.max(wait_of::<A>(limit.peek(key, cost)?));
                }
                Ok(wait)
            },
            // A `MultiLimiter`'s limits have no `max_keys` bound, hence no overflow state:
            // each reservation was charged to the key's own state, where a refund by key finds
            // it (or finds nothing: a key evicted since was fresh, its reservation due).
            |()| {
                for limit in self.limits() {
                    limit.refund(key, cost);
                }
            },
            max_wait,
        )
        .await
    }
}
