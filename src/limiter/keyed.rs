use std::borrow::Borrow;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::algorithm::{Algorithm, LeakyQueue};
use crate::clock::{Clock, QuantaClock};
use crate::decision::{Decision, Error};
use crate::limiter::Core;
use crate::quota::QuotaError;
use crate::store::{DashMapStore, KeyedStore};

/// The table is swept once it holds at least this many keys, then whenever it doubles.
const FIRST_SWEEP: usize = 1024;

/// What a keyed limiter at its `max_keys` bound does with a request for a key it does not hold
/// (after a sweep has found no key left to evict).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowPolicy {
    /// Refuse the request with [`Error::KeyTableFull`]. Known keys keep their own limits.
    Deny,
    /// Count the request against one state shared by every key that did not fit: strict in
    /// aggregate (all overflow keys together get one key's quota), never unlimited.
    Shared,
}

/// A limiter with one state per key.
///
/// Keys whose state can no longer be told apart from a fresh key (a full bucket, an empty
/// window or log) are evicted automatically, as amortised work in the calls that insert keys:
/// the table is swept when it has doubled since the last sweep, so memory stays within twice
/// the keys that still hold state, with no background thread. An optional `max_keys` bound
/// with an [`OverflowPolicy`] caps memory under a flood of unique keys.
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
/// # Caveats
/// A sweep takes each shard's write lock in turn; checks on that shard wait for it.
pub struct KeyedLimiter<
    K,
    A: Algorithm,
    C: Clock = QuantaClock,
    S = DashMapStore<K, <A as Algorithm>::Cell>,
> {
    core: Core<A, C>,
    store: S,
    /// Keys in the store, counted by this limiter (the map's own `len` locks every shard).
    keys: AtomicUsize,
    max_keys: Option<(usize, OverflowPolicy)>,
    /// The state shared by keys that did not fit, for [`OverflowPolicy::Shared`].
    overflow: A::Cell,
    sweep_at: AtomicUsize,
    misses_since_sweep: AtomicUsize,
    sweeping: AtomicBool,
    _keys: PhantomData<fn(K)>,
}

impl<K, A: Algorithm, C: Clock + std::fmt::Debug, S> std::fmt::Debug for KeyedLimiter<K, A, C, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("rule", &self.core.rule())
            .field("clock", self.core.clock())
            .field("keys", &self.keys.load(Ordering::Relaxed))
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

/// Builds a [`KeyedLimiter`] with a clock or a key bound.
///
/// # Examples
/// ```
/// use tollgate::{clock::ManualClock, FixedWindow, KeyedLimiter, OverflowPolicy, Quota};
/// let limiter = KeyedLimiter::<u64, _, _>::builder(FixedWindow::new(Quota::per_minute(10)?)?)
///     .clock(ManualClock::new())
///     .max_keys(100_000, OverflowPolicy::Deny)
///     .build()?;
/// assert!(limiter.check(&7).unwrap().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug)]
pub struct KeyedLimiterBuilder<K, A, C> {
    rule: A,
    clock: C,
    max_keys: Option<(usize, OverflowPolicy)>,
    _keys: PhantomData<fn(K)>,
}

impl<K, A: Algorithm, C: Clock> KeyedLimiterBuilder<K, A, C> {
    /// Reads time from `clock` instead of the precise default.
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<K, A, C2> {
        KeyedLimiterBuilder {
            rule: self.rule,
            clock,
            max_keys: self.max_keys,
            _keys: PhantomData,
        }
    }

    /// Holds at most `max_keys` keys (at least 1); `policy` says what happens to new keys
    /// beyond it.
    pub fn max_keys(mut self, max_keys: usize, policy: OverflowPolicy) -> Self {
        self.max_keys = Some((max_keys.max(1), policy));
        self
    }

    /// The limiter.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve the quota.
    pub fn build(self) -> Result<KeyedLimiter<K, A, C>, QuotaError>
    where
        K: Hash + Eq + Send + Sync,
    {
        Ok(KeyedLimiter {
            core: Core::new(self.rule, self.clock)?,
            store: DashMapStore::new(),
            keys: AtomicUsize::new(0),
            max_keys: self.max_keys,
            overflow: A::Cell::default(),
            sweep_at: AtomicUsize::new(FIRST_SWEEP),
            misses_since_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            _keys: PhantomData,
        })
    }
}

/// # Construction
impl<K: Hash + Eq + Send + Sync, A: Algorithm> KeyedLimiter<K, A> {
    /// A keyed limiter on the precise default clock, with no key bound.
    pub fn new(rule: A) -> Self {
        Self::builder(rule)
            .build()
            .expect("the precise clock resolves 1 ns")
    }

    /// A builder for a clock or a key bound.
    pub fn builder(rule: A) -> KeyedLimiterBuilder<K, A, QuantaClock> {
        KeyedLimiterBuilder {
            rule,
            clock: QuantaClock::new(),
            max_keys: None,
            _keys: PhantomData,
        }
    }
}

impl<K, A, C> KeyedLimiter<K, A, C>
where
    K: Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
{
    /// A keyed limiter on `clock`, with no key bound.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve the quota.
    pub fn with_clock(rule: A, clock: C) -> Result<Self, QuotaError> {
        KeyedLimiter::<K, A>::builder(rule).clock(clock).build()
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
    pub fn clock(&self) -> &C {
        self.core.clock()
    }

    /// The rule in force.
    pub fn rule(&self) -> A {
        self.core.rule()
    }

    /// How many keys hold state (including keys not yet swept).
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    /// # Errors
    /// [`Error::KeyTableFull`] for a new key when `max_keys` is reached under
    /// [`OverflowPolicy::Deny`].
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, 1, true)
    }

    /// Decides a request of cost `cost` for `key`, and counts it if allowed.
    ///
    /// # Errors
    /// [`Error::CapacityExceeded`] when `cost` can never be admitted (nothing changes, no key is
    /// inserted); [`Error::KeyTableFull`] as for [`KeyedLimiter::check`].
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, cost, true)
    }

    /// The decision a request of cost `cost` for `key` would get now; changes nothing and
    /// inserts no key.
    ///
    /// # Errors
    /// [`Error::CapacityExceeded`] when `cost` can never be admitted.
    pub fn peek<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let rule = self.core.rule();
        self.core.check_cost(&rule, cost)?;
        let now = || self.core.now();
        Ok(self
            .store
            .with_existing(key, |cell| rule.acquire(cell, now, cost, false))
            .unwrap_or_else(|| rule.acquire(&A::Cell::default(), now, cost, false)))
    }

    /// Gives back `cost` units admitted to `key` but not used (see [`crate::Limiter::refund`]).
    /// Does nothing for a key the limiter does not hold.
    pub fn refund<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let rule = self.core.rule();
        // Read the clock even for an unknown key: every call sees time alike.
        let seen = self.core.now();
        self.store.with_existing(key, |cell| {
            rule.refund(cell, || self.core.now().max(seen), cost)
        });
    }

    /// Replaces the quota for every key (see [`crate::Limiter::set_quota`]).
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if this limiter's clock cannot serve the new quota.
    pub fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        self.core.set_quota(rule)
    }

    /// Evicts every key that is indistinguishable from a fresh one now; returns how many.
    /// Calls do this on their own as they insert keys; this is for callers who want it now.
    pub fn evict_fresh(&self) -> usize {
        let now = self.core.now();
        let rule = self.core.rule();
        let removed = self.store.retain(|cell| !rule.is_fresh(cell, now));
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    #[inline]
    fn decide<Q>(&self, key: &Q, cost: u64, commit: bool) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let rule = self.core.rule();
        self.core.check_cost(&rule, cost)?;
        let now = || self.core.now();
        if let Some(decision) = self
            .store
            .with_existing(key, |cell| rule.acquire(cell, now, cost, commit))
        {
            return Ok(decision);
        }
        self.decide_new_key(key, &rule, cost, commit)
    }

    #[cold]
    fn decide_new_key<Q>(
        &self,
        key: &Q,
        rule: &A,
        cost: u64,
        commit: bool,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.sweep_if_due();
        let now = || self.core.now();
        let Some((max_keys, policy)) = self.max_keys else {
            let (decision, inserted) = self
                .store
                .with_inserted(key, |cell| rule.acquire(cell, now, cost, commit));
            // Relaxed: a counter; no memory is published through it.
            self.keys
                .fetch_add(usize::from(inserted), Ordering::Relaxed);
            return Ok(decision);
        };
        // Reserve a place first, and only below the bound, so that racing inserts cannot
        // overshoot it, not even for an instant (`len()` never reads above `max_keys`).
        // Relaxed: the counter's own modification order is all the bound needs.
        let reserved = self
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max_keys).then_some(n + 1)
            })
            .is_ok();
        if !reserved {
            // The key may have been inserted by another thread meanwhile.
            if let Some(decision) = self
                .store
                .with_existing(key, |cell| rule.acquire(cell, now, cost, commit))
            {
                return Ok(decision);
            }
            return match policy {
                OverflowPolicy::Deny => Err(Error::KeyTableFull { max_keys }),
                OverflowPolicy::Shared => Ok(rule.acquire(&self.overflow, now, cost, commit)),
            };
        }
        let (decision, inserted) = self
            .store
            .with_inserted(key, |cell| rule.acquire(cell, now, cost, commit));
        if !inserted {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(decision)
    }

    /// Amortised eviction: sweep when the table has doubled since the last sweep, or, at the
    /// `max_keys` bound, after a quarter of the bound in misses.
    fn sweep_if_due(&self) {
        // Relaxed (all three counters): heuristics for *when* to sweep; correctness does not
        // depend on their values.
        let misses = self.misses_since_sweep.fetch_add(1, Ordering::Relaxed) + 1;
        let keys = self.keys.load(Ordering::Relaxed);
        let due = keys >= self.sweep_at.load(Ordering::Relaxed)
            || self
                .max_keys
                .is_some_and(|(max, _)| keys >= max && misses >= (max / 4).max(1));
        // Acquire/Release on the flag: one sweeper at a time; the flag guards no data.
        if !due || self.sweeping.swap(true, Ordering::Acquire) {
            return;
        }
        self.evict_fresh();
        let live = self.keys.load(Ordering::Relaxed);
        self.sweep_at
            .store(live.saturating_mul(2).max(FIRST_SWEEP), Ordering::Relaxed);
        self.misses_since_sweep.store(0, Ordering::Relaxed);
        self.sweeping.store(false, Ordering::Release);
    }
}

/// # Shaping
impl<K, C, S> KeyedLimiter<K, LeakyQueue, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: KeyedStore<K, <LeakyQueue as Algorithm>::Cell>,
{
    /// Reserves `cost` units in `key`'s queue: if admitted, the request must wait
    /// [`Decision::delay`] before it proceeds. A reservation is kept even if the caller gives
    /// up; call [`KeyedLimiter::refund`] to hand its slot back.
    ///
    /// # Errors
    /// As for [`KeyedLimiter::check_n`].
    pub fn reserve<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n(key, cost)
    }
}

#[cfg(test)]
mod count_tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Gcra, Quota};

    #[test]
    fn key_count_matches_the_store_through_sweeps() {
        let clock = ManualClock::new();
        let rule = Gcra::new(Quota::per_second(64).unwrap()).unwrap();
        let limiter = KeyedLimiter::<u64, _, _>::with_clock(rule, clock.clone()).unwrap();
        for key in 0..100_000u64 {
            clock.advance_nanos(1_000);
            limiter.check(&key).unwrap();
        }
        assert_eq!(limiter.len(), limiter.store.len());
    }
}
