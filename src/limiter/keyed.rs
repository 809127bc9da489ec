use std::borrow::Borrow;
use std::hash::Hash;

use super::algorithm::Algorithm;
use super::engine::{Engine, Sweep};
use crate::algorithm::{Gcra, LeakyQueue};
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::decision::{Decision, LimitError};
use crate::quota::QuotaError;
use crate::store::table::{Charge, Check, KeyTable, Reserve};
use crate::store::Stored;
use crate::store::{Evictor, KeyedStore};

pub use crate::store::table::OverflowPolicy;

pub(super) mod builder;

/// A limiter with one state per key.
///
/// # Eviction and memory
/// A key whose state can no longer be told apart from a fresh key's (a full bucket, an empty
/// window or log) may be evicted, with no background thread: when its memory is needed, and
/// when the window counters' indices are re-anchored. The lock-free table keeps every key
/// until it holds about [`evict_above`](crate::KeyedLimiterBuilder::evict_above) keys (default 2^21,
/// raised up to 2^24 while the keys it evicts come back), growing as a hash map does, so a
/// client that comes back to a full bucket finds its slot; above that, fresh keys unused since
/// their shard last filled make room. The dashmap store is
/// swept when it has doubled. An optional `max_keys` bound with an [`OverflowPolicy`] caps
/// memory outright. No call does more than a fixed amount of eviction, copy, build or release
/// work, whatever the number of keys: the bounds call by call, and how the tables, drains and
/// the eviction hand work, are in [`docs::design`](crate::docs::design).
///
/// # Examples
/// ```
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let limiter: KeyedLimiter<String, Gcra> = KeyedLimiter::new(Gcra::new(Quota::per_second(1)?)?);
/// assert!(limiter.check("alice").unwrap().allowed()); // &str lookup: no allocation once known
/// assert!(!limiter.check("alice").unwrap().allowed());
/// assert!(limiter.check("bob").unwrap().allowed()); // keys are independent
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// # Text keys
/// A `String` key of up to 71 bytes (IP addresses as text, names, UUIDs, most API keys and
/// tokens) is kept inline in the table: looked up by `&str`, a check reads no memory but the
/// table's, and the key holds no heap block. Texts of up to 23 bytes sit in the table's own
/// 32-byte slots, 24 to 39 bytes and 40 to 71 in two tables of 48- and 80-byte slots, made with
/// the first key of their lengths. A longer `String` keeps its bytes on the heap, where a check
/// reads them to compare the key: a second cache miss per check once the keys outgrow the
/// caches.
/// ```
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let limiter: KeyedLimiter<String, Gcra> = KeyedLimiter::new(Gcra::new(Quota::per_second(1)?)?);
/// let request_id = "67e55044-10b1-426f-9247-bb680e5fe0c8"; // 36 bytes: inline too
/// assert!(limiter.check(request_id).unwrap().allowed());
/// assert!(!limiter.check(request_id).unwrap().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// # Store
/// Every algorithm keeps its states in the lock-free word table ([design](crate::docs::design)): a
/// check on a known key takes no shared lock and writes no shared memory but the key's own
/// state (GCRA, the leaky buckets and both window counters: one word, by a CAS; the sliding
/// log: its ring, by a CAS on the ring's header). Inserts and evictions lock one of its 64 shards;
/// a check on a known key waits for that lock only when its thread's cached table of the shard
/// is stale (once after each table change). [`KeyedLimiterBuilder::build_with_store`](crate::KeyedLimiterBuilder::build_with_store) takes
/// another store (for example [`DashMapStore`](crate::store::DashMapStore), to compare).
///
/// # Caveats
/// - Keys are `Clone`: the word table copies them when it moves them to a new table.
/// - A thread that stops calling keeps the shard tables it last used alive until it calls again
///   (an exited thread's cache passes to the next thread that reuses its id): at most one
///   replaced table per shard and thread.
/// - On the dashmap store a sweep takes each shard's write lock in turn, and checks on that
///   shard wait for it.
/// - A key's `Hash`, `Eq`, `Clone` or `Drop` that panics makes the call it runs in panic: the
///   table runs a key's code before the step it serves changes anything, so no key is lost,
///   decided in two places or dropped twice, and [`len`](KeyedLimiter::len) stays true (with
///   `max_keys` it may read high until a later call reports what the interrupted one evicted;
///   never low, so the bound holds). A check that panics so has decided nothing (a [`Clock`]
///   that panics inside the decision is the one exception). A key whose code panics every time stops the drain that meets it in its
///   shard: later inserts there panic too.
pub struct KeyedLimiter<
    K,
    A: Algorithm,
    C: Clock = QuantaClock,
    S = <A as Algorithm>::DefaultStore<K>,
> {
    engine: Engine<A, C>,
    /// The store, the key count, `max_keys` and eviction (`store/table.rs`, model-checked).
    table: KeyTable<K, A::Cell, S>,
}

impl<K, A, C, S> std::fmt::Debug for KeyedLimiter<K, A, C, S>
where
    A: Algorithm,
    C: Clock + std::fmt::Debug,
    S: KeyedStore<K, A::Cell>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("rule", &self.engine.rule())
            .field("clock", self.engine.clock())
            .field("keys", &self.table.len())
            .field("max_keys", &self.table.max_keys())
            .finish()
    }
}

impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    S: KeyedStore<K, A::Cell>,
{
    /// The clock this limiter reads.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::{Clock, ManualClock}, Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(1)?)?)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// // A test moves the limiter's own clock.
    /// limiter.clock().advance(Duration::from_millis(5));
    /// assert_eq!(limiter.clock().now(), 5_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn clock(&self) -> &C {
        self.engine.clock()
    }

    /// The rule in force.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::new(Gcra::new(Quota::per_second(10)?.with_burst(20)?)?);
    /// assert_eq!((limiter.rule().limit(), limiter.rule().capacity()), (10, 20));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn rule(&self) -> A {
        self.engine.rule()
    }

    /// How many keys the limiter holds, fresh ones not yet evicted included. Without
    /// `max_keys`, on the word table, this locks each shard in turn (no shared counter is kept
    /// on the insert path).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::new(Gcra::new(Quota::per_second(1)?)?);
    /// assert!(limiter.is_empty());
    /// limiter.check(&1).unwrap();
    /// limiter.check(&2).unwrap();
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key holds state.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// assert!(limiter.is_empty());
    /// limiter.check(&1).unwrap();
    /// assert!(!limiter.is_empty());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// # Checking
impl<K, A, C, S> KeyedLimiter<K, A, C, S>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
    S: KeyedStore<K, A::Cell>,
{
    /// Decides a request of cost 1 for `key`, and counts it if allowed.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // 2 requests per second per client, looked up by `&str` (no allocation once known).
    /// let limiter = KeyedLimiter::<String, _>::new(Gcra::new(Quota::per_second(2)?)?);
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// let denied = limiter.check("alice").unwrap();
    /// assert!(!denied.allowed());
    /// assert!(denied.retry_after() > std::time::Duration::ZERO); // for `Retry-After`
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    ///
    /// # Errors
    /// [`LimitError::KeyTableFull`] for a new key when `max_keys` is reached under
    /// [`OverflowPolicy::Deny`].
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_charged(key, 1, Check)
    }

    /// Decides a request of cost `cost` for `key`, and counts it if allowed.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] when `cost` can never be admitted (nothing changes, no key is
    /// inserted); [`LimitError::KeyTableFull`] as for [`KeyedLimiter::check`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LimitError, KeyedLimiter, Quota, SlidingLog};
    /// // 100 units a minute per key; an upload of 40 units costs 40.
    /// let limiter = KeyedLimiter::<u64, _>::new(SlidingLog::new(Quota::per_minute(100)?)?);
    /// assert_eq!(limiter.check_n(&1, 40).unwrap().remaining(), 60);
    /// assert!(!limiter.check_n(&1, 61).unwrap().allowed()); // denied: state unchanged
    /// // A cost no window can ever admit is an error, not a denial.
    /// assert!(matches!(limiter.check_n(&1, 101), Err(LimitError::CapacityExceeded { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_charged(key, cost, Check)
    }

    /// The decision a request of cost `cost` for `key` would get now; changes nothing and
    /// inserts no key.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] when `cost` can never be admitted.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{FixedWindow, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::new(FixedWindow::new(Quota::per_hour(3)?)?);
    /// assert!(limiter.peek(&1, 1).unwrap().allowed());
    /// assert!(limiter.is_empty(), "a peek inserts nothing");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        loop {
            let at = self.engine.attempt();
            self.engine.check_cost(at.rule(), cost)?;
            let decision = self
                .table
                .peek(key, at.rule(), || at.now_noting_due(), cost);
            if self.engine.settle(&at, &self.re_anchoring()) {
                return Ok(decision);
            }
        }
    }

    /// Gives back `cost` units admitted to `key` but not used (see [`crate::Limiter::refund`]).
    /// Does nothing for a key the limiter does not hold.
    ///
    /// The units go to the key's own state, as the limiter holds it now: units a key over
    /// `max_keys` was charged on the state such keys share ([`OverflowPolicy::Shared`]) do not
    /// go back there. (The waiting calls of feature `tokio`, `until_ready_n` and `acquire_n`
    /// and their forms of cost 1, note which state they charged, and a waiter that gives up
    /// hands its units back there.)
    ///
    /// # Examples
    /// ```
    /// use tollgate::{FixedWindow, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::new(FixedWindow::new(Quota::per_hour(3)?)?);
    /// limiter.check_n(&1, 3).unwrap();
    /// // The request failed upstream and should not count: hand two units back.
    /// limiter.refund(&1, 2);
    /// assert_eq!(limiter.peek(&1, 0).unwrap().remaining(), 2);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        loop {
            let at = self.engine.attempt();
            // Read the clock even for an unknown key: every call sees time alike.
            let seen = at.now_noting_due();
            self.table
                .refund(key, at.rule(), || at.now_noting_due().max(seen), cost);
            if self.engine.settle(&at, &self.re_anchoring()) {
                return;
            }
        }
    }

    /// Replaces the quota for every key (see [`crate::Limiter::set_quota`]).
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if this limiter's clock cannot serve the new quota.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{KeyedLimiter, Quota, SlidingWindow};
    /// let limiter = KeyedLimiter::<u64, _>::new(SlidingWindow::new(Quota::per_minute(10)?)?);
    /// limiter.set_quota(SlidingWindow::new(Quota::per_minute(100)?)?)?;
    /// assert_eq!(limiter.rule().limit(), 100);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        self.engine.set_quota(rule)
    }

    /// Evicts every key that is indistinguishable from a fresh one now; returns how many.
    /// Calls evict on their own when they need the room; this is for callers who want the
    /// memory back now (it visits every key, in this call).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, KeyedLimiter, Quota};
    /// let clock = ManualClock::new();
    /// let limiter: KeyedLimiter<u64, _, _> =
    ///     KeyedLimiter::with_clock(Gcra::new(Quota::per_second(10)?)?, clock.clone())?;
    /// limiter.check(&1).unwrap();
    /// clock.advance(std::time::Duration::from_secs(1)); // key 1's bucket is full again
    /// assert_eq!(limiter.evict_fresh(), 1);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn evict_fresh(&self) -> usize {
        self.engine.sweep(&self.sweep())
    }

    /// A request of `cost` for `key`, counted as `charge` says, under the rule in force.
    #[inline]
    fn check_charged<Q>(
        &self,
        key: &Q,
        cost: u64,
        charge: impl Charge,
    ) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let sweep = self.sweep();
        let evictor = LimiterEvictor {
            engine: &self.engine,
            sweep: &sweep,
        };
        loop {
            let at = self.engine.attempt();
            self.engine.check_cost(at.rule(), cost)?;
            let result = self.table.check_key(
                key,
                at.rule(),
                || at.now_noting_due(),
                cost,
                &evictor,
                charge,
            );
            if self.engine.settle(&at, &self.re_anchoring()) {
                return result;
            }
        }
    }

    /// [`KeyedLimiter::check_n`] as a reservation (`Stored::reserve`): what the waiting
    /// calls charge with.
    pub(crate) fn reserve_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_charged(key, cost, Reserve)
    }

    /// Gives back `cost` units that `decided` admitted to `key` (a reservation a waiter gave
    /// up, or a request refunded by its response), to the state it charged, whatever became
    /// of `key` since: the state keys over `max_keys` share ([`OverflowPolicy::Shared`]) if it
    /// was charged there (not `key`'s own state, should the key have found room meanwhile);
    /// else the key's own, by [`KeyedLimiter::refund`] (a key moved to a new table took its
    /// state along; a key evicted meanwhile was fresh, its units already due, and gets
    /// nothing).
    #[allow(dead_code)] // called by the waiting calls and the tower layer (features)
    pub(crate) fn refund_decided<Q>(&self, key: &Q, cost: u64, decided: &Decision)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !decided.charged_shared_state() {
            return self.refund(key, cost);
        }
        loop {
            let at = self.engine.attempt();
            at.rule()
                .refund(self.table.overflow(), || at.now_noting_due(), cost);
            if self.engine.settle(&at, &self.re_anchoring()) {
                return;
            }
        }
    }

    /// A keyed limiter's sweep: every key that is fresh evicted, the overflow state reset.
    fn sweep(&self) -> impl Sweep<A> + '_ {
        |rule: &A, now| self.table.sweep_all(rule, now)
    }

    /// What a re-anchoring of the window counters needs before the rule moves on (see
    /// [`KeyTable::re_anchor`]).
    fn re_anchoring(&self) -> impl Sweep<A> + '_ {
        |rule: &A, now| self.table.re_anchor(rule, now)
    }
}

/// What a keyed limiter lends its store to evict with: sweeps and judges run under the rule in
/// force, with no quota change or rebase meanwhile (`Engine::sweep`, `Engine::try_judge`).
struct LimiterEvictor<'a, A, C, W> {
    engine: &'a Engine<A, C>,
    sweep: &'a W,
}

impl<A: Algorithm, C: Clock, W: Sweep<A>> Evictor<A::Cell> for LimiterEvictor<'_, A, C, W> {
    fn sweep(&self) -> usize {
        self.engine.sweep(self.sweep)
    }

    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&A::Cell, Nanos) -> bool) -> R,
    ) -> Option<R> {
        self.engine
            .try_judge(|rule, now| f(now, &|cell, since| rule.evict_if_idle(cell, since, now)))
    }
}

/// # Shaping
impl<K, C, S> KeyedLimiter<K, LeakyQueue, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: KeyedStore<K, <LeakyQueue as Stored>::Cell>,
{
    /// Reserves `cost` units in `key`'s queue: if admitted, the request must wait
    /// [`Decision::delay`] before it proceeds. A reservation is kept even if the caller gives
    /// up; call [`KeyedLimiter::refund`] to hand its slot back.
    ///
    /// # Errors
    /// As for [`KeyedLimiter::check_n`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{KeyedLimiter, LeakyQueue, Quota};
    /// // Smooth each client to 10 requests a second, queueing up to 10.
    /// let limiter = KeyedLimiter::<u64, _>::new(LeakyQueue::new(Quota::per_second(10)?)?);
    /// assert_eq!(limiter.reserve(&1, 1).unwrap().delay_nanos(), 0);
    /// let second = limiter.reserve(&1, 1).unwrap();
    /// assert!(second.allowed() && second.delay_nanos() > 0); // wait, then proceed
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn reserve<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, cost)
    }
}

/// # Reservations
impl<K, C, S> KeyedLimiter<K, Gcra, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: KeyedStore<K, <Gcra as Stored>::Cell>,
{
    /// Reserves `cost` units for `key`: admitted at once when the bucket holds them, as
    /// [`KeyedLimiter::check_n`]; otherwise taken anyway, and the decision's
    /// [`Decision::delay`] says when they are due (when a check would have admitted them).
    /// Reservations queue behind each other, first come, first served: what
    /// [`until_ready_n`](KeyedLimiter::until_ready_n) does (feature `tokio`). A reservation is kept
    /// even if the caller gives up; call [`KeyedLimiter::refund`] to hand it back.
    ///
    /// # Errors
    /// As for [`KeyedLimiter::check_n`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::ManualClock, Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _, _>::with_clock(Gcra::new(Quota::per_second(10)?)?, ManualClock::new())?;
    /// assert_eq!(limiter.reserve(&1, 10)?.delay(), Duration::ZERO); // the burst
    /// // The bucket is empty: the next units are due 100 ms apart, in the order reserved.
    /// assert_eq!(limiter.reserve(&1, 1)?.delay(), Duration::from_millis(100));
    /// assert_eq!(limiter.reserve(&1, 2)?.delay(), Duration::from_millis(300));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve<Q>(&self, key: &Q, cost: u64) -> Result<Decision, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.reserve_n(key, cost)
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;
    use crate::algorithm::Gcra;
    use crate::clock::ManualClock;
    use crate::quota::Quota;
    use crate::store::StoreProtocol;
    use std::time::Duration;

    /// A clock of a given resolution (ns), frozen at 1 s.
    #[derive(Debug, Clone, Copy)]
    struct Ticks(Nanos);

    impl Clock for Ticks {
        fn now(&self) -> Nanos {
            1_000_000_000
        }
        fn resolution(&self) -> Nanos {
            self.0
        }
    }

    /// A clock must resolve at least 10 steps a period (`T` or `W`): a 1 ms clock serves a
    /// 10 ms period and not a 9 ms one, at build time and at `set_quota`; a 1 ns clock serves
    /// any.
    #[test]
    fn a_clock_too_coarse_for_the_period_is_refused() {
        use crate::algorithm::FixedWindow;
        use crate::quota::QuotaError;
        let every = |ms| Gcra::new(Quota::new(1, Duration::from_millis(ms)).unwrap()).unwrap();
        let built = |ms, clock| KeyedLimiter::<u64, _, _>::with_clock(every(ms), clock);
        assert!(built(10, Ticks(1_000_000)).is_ok());
        assert!(matches!(
            built(9, Ticks(1_000_000)),
            Err(QuotaError::ClockTooCoarse {
                resolution_nanos: 1_000_000,
                period_nanos: 9_000_000
            })
        ));
        assert!(built(1, Ticks(1)).is_ok());
        assert!(built(1, Ticks(0)).is_ok());
        // Even a period under 10 ns: time itself is counted in nanoseconds.
        let fast = Gcra::new(Quota::new(1, Duration::from_nanos(5)).unwrap()).unwrap();
        assert!(KeyedLimiter::<u64, _, _>::with_clock(fast, Ticks(1)).is_ok());
        let limiter = built(10, Ticks(1_000_000)).unwrap();
        assert!(limiter.set_quota(every(9)).is_err());
        assert!(limiter.set_quota(every(20)).is_ok());
        let window = FixedWindow::new(Quota::new(5, Duration::from_millis(9)).unwrap()).unwrap();
        assert!(KeyedLimiter::<u64, _, _>::with_clock(window, Ticks(1_000_000)).is_err());
    }

    /// A new quota is in force for every key from the next call: held keys keep their state
    /// (the window counters' counts), and the new limit decides.
    #[test]
    fn set_quota_takes_effect_at_once() {
        use crate::algorithm::FixedWindow;
        let clock = ManualClock::new();
        let per_minute = |n| FixedWindow::new(Quota::per_minute(n).unwrap()).unwrap();
        let limiter = KeyedLimiter::<u64, _, _>::with_clock(per_minute(2), clock).unwrap();
        assert!(limiter.check_n(&1, 2).unwrap().allowed());
        assert!(!limiter.check(&1).unwrap().allowed());
        limiter.set_quota(per_minute(5)).unwrap();
        assert_eq!(limiter.rule().limit(), 5);
        let decision = limiter.check_n(&1, 3).unwrap();
        assert!(decision.allowed(), "the 2 units spent count, 3 more fit");
        assert_eq!(decision.remaining(), 0);
        limiter.set_quota(per_minute(1)).unwrap();
        assert!(!limiter.check(&1).unwrap().allowed(), "5 spent, 1 allowed");
        assert!(limiter.check(&2).unwrap().allowed());
        assert!(!limiter.check(&2).unwrap().allowed(), "a new key gets 1");
    }

    /// A new `W` starts its windows at the change (the current window's count carries on); an
    /// unchanged `W` keeps the grid's alignment.
    #[test]
    fn a_new_window_starts_at_the_change_and_an_unchanged_one_keeps_its_grid() {
        use crate::algorithm::FixedWindow;
        const MS: Nanos = 1_000_000;
        let window = |ms| FixedWindow::new(Quota::new(1, Duration::from_millis(ms)).unwrap());
        // (new W, still denied at, allowed again at), in ms; the change is at 1,500 ms.
        for (to, denied, allowed) in [(700, 2_100, 2_200), (1_000, 1_900, 2_000)] {
            let clock = ManualClock::new();
            let limiter =
                KeyedLimiter::<u64, _, _>::with_clock(window(1_000).unwrap(), clock.clone())
                    .unwrap();
            clock.set(1_500 * MS);
            assert!(limiter.check(&1).unwrap().allowed());
            limiter.set_quota(window(to).unwrap()).unwrap();
            clock.set(denied * MS);
            assert!(
                !limiter.check(&1).unwrap().allowed(),
                "W = {to} ms at {denied} ms"
            );
            clock.set(allowed * MS);
            assert!(
                limiter.check(&1).unwrap().allowed(),
                "W = {to} ms at {allowed} ms"
            );
        }
    }

    #[test]
    fn the_debug_output_shows_the_key_bound() {
        let rule = Gcra::new(Quota::per_second(1).unwrap()).unwrap();
        let bounded = KeyedLimiter::<u64, _>::builder(rule)
            .max_keys(10, super::OverflowPolicy::Deny)
            .build()
            .unwrap();
        let shown = format!("{bounded:?}");
        assert!(shown.contains("max_keys: Some((10, Deny))"), "{shown}");
        let unbounded = format!("{:?}", KeyedLimiter::<u64, _>::new(rule));
        assert!(!unbounded.contains("Some((10"), "{unbounded}");
    }

    /// A store that does not evict on its own (dashmap) is swept when it has doubled since
    /// its last sweep, so keys that each check once and go fresh never pile up; at a
    /// `max_keys` bound it is swept after a quarter of the bound in new keys, so fresh keys
    /// make room for new ones.
    #[test]
    fn a_store_that_does_not_evict_is_swept_as_it_grows_and_at_its_bound() {
        use crate::store::DashMapStore;
        let clock = ManualClock::new();
        // One a millisecond: a key is fresh a millisecond after its check.
        let rule = Gcra::new(Quota::per_second(1_000).unwrap()).unwrap();
        let limiter = KeyedLimiter::<u64, _>::builder(rule)
            .clock(clock.clone())
            .build_with_store(DashMapStore::new())
            .unwrap();
        for key in 0..20_000u64 {
            clock.advance_nanos(2_000_000);
            limiter.check(&key).unwrap();
        }
        assert!(limiter.len() <= 2_048, "{} keys held", limiter.len());
        let bounded = KeyedLimiter::<u64, _>::builder(rule)
            .clock(clock.clone())
            .max_keys(100, super::OverflowPolicy::Deny)
            .build_with_store(DashMapStore::new())
            .unwrap();
        for key in 0..100u64 {
            assert!(bounded.check(&key).unwrap().allowed());
        }
        clock.advance_nanos(2_000_000);
        for key in 100..1_000u64 {
            assert!(bounded.check(&key).unwrap().allowed(), "key {key}");
            clock.advance_nanos(2_000_000);
        }
    }

    #[test]
    fn key_count_matches_the_store_through_sweeps() {
        let clock = ManualClock::new();
        let rule = Gcra::new(Quota::per_second(64).unwrap()).unwrap();
        let limiter = KeyedLimiter::<u64, _, _>::with_clock(rule, clock.clone()).unwrap();
        for key in 0..100_000u64 {
            clock.advance_nanos(1_000);
            limiter.check(&key).unwrap();
        }
        assert_eq!(limiter.len(), limiter.table.store().len());
    }

    /// At the `max_keys` bound a new key takes the place of a fresh one whatever the hash seed.
    /// With these seeds one step of the eviction hand used to find no fresh key and the key was
    /// refused (`KeyTableFull`) with 90 % of the held keys fresh: the step's slot budget went
    /// to a shard's nearly empty new table while its keys were still in the drained old one, to
    /// a run of tombstones (the hand's own), or to tables of shards holding no live key.
    #[test]
    fn the_bound_makes_room_from_a_shard_being_drained() {
        use crate::algorithm::{LeakyQueue, SlidingWindow};
        use crate::limiter::OverflowPolicy;
        use crate::store::word_table::WordTable;
        use crate::store::{TAT_MARKS, WINDOW_MARKS};
        use foldhash::fast::SeedableRandomState;
        use foldhash::SharedSeed;
        use std::time::Duration;

        fn run<A: Algorithm<Cell = crate::state::AtomicWord>>(
            rule: A,
            marks: crate::state::Retired,
            max_keys: usize,
            seed: u64,
        ) -> Result<(), (u64, LimitError)> {
            let clock = ManualClock::new();
            let limiter = KeyedLimiter::<u64, A>::builder(rule)
                .clock(clock.clone())
                .max_keys(max_keys, OverflowPolicy::Deny)
                .build_with_store(WordTable::new(
                    marks,
                    SeedableRandomState::with_seed(
                        seed,
                        Box::leak(Box::new(SharedSeed::from_u64(seed))),
                    ),
                ))
                .unwrap();
            // 10 new keys a millisecond; a key holds state for 10 ms (the queue) or 200 ms
            // (the window counter): 10x more places than keys holding state.
            for key in 0..100_000u64 {
                if key % 10 == 0 {
                    clock.advance_nanos(1_000_000);
                }
                limiter.check(&key).map_err(|e| (key, e))?;
            }
            Ok(())
        }
        let quota = Quota::new(10, Duration::from_millis(100)).unwrap();
        // A thread for each run: the runs are independent, and this is the crate's longest test.
        std::thread::scope(|s| {
            for seed in SEEDS {
                s.spawn(move || {
                    let queue = run(LeakyQueue::new(quota).unwrap(), TAT_MARKS, 1_000, seed);
                    assert_eq!(queue, Ok(()), "leaky queue, seed {seed}");
                });
                s.spawn(move || {
                    let window = run(
                        SlidingWindow::new(quota).unwrap(),
                        WINDOW_MARKS,
                        20_000,
                        seed,
                    );
                    assert_eq!(window, Ok(()), "sliding window, seed {seed}");
                });
            }
        });
    }

    /// Hash seeds (shared and per table) under which a rule was refused a key: 19 of the first
    /// 1,250 seeds with one hand step on the drain-blind hand; 2209 with the drain fixed and
    /// four steps, before shards without a live key were skipped; 0 (a degenerate seed: every
    /// key in two shards, neighbouring keys in neighbouring slots) with steps that judged 32
    /// neighbouring keys, before the runs were spread. All of 0..3000 pass now; with one step
    /// instead of four, 17 of these seeds fail, among them the last five (found that way).
    const SEEDS: [u64; 25] = [
        0, 97, 99, 119, 131, 345, 350, 361, 373, 585, 590, 613, 700, 961, 994, 1161, 1176, 1230,
        1245, 2209, 29, 92, 165, 190, 273,
    ];
}
