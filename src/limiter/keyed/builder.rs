//! Building a [`KeyedLimiter`]: `new`, `with_clock`, and the [`KeyedLimiterBuilder`] for a
//! clock, a key bound or a store of one's own.

use std::hash::Hash;
use std::marker::PhantomData;

use super::{KeyedLimiter, OverflowPolicy};
use crate::clock::{Clock, QuantaClock};
use crate::limiter::algorithm::Algorithm;
use crate::limiter::engine::Engine;
use crate::quota::QuotaError;
use crate::store::table::KeyTable;
use crate::store::KeyedStore;

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
    evict_above: Option<usize>,
    _keys: PhantomData<fn(K)>,
}

impl<K, A: Algorithm> KeyedLimiterBuilder<K, A, QuantaClock> {
    /// [`KeyedLimiter::builder`]'s: the precise default clock, no key bound.
    pub(super) fn new(rule: A) -> Self {
        KeyedLimiterBuilder {
            rule,
            clock: QuantaClock::new(),
            max_keys: None,
            evict_above: None,
            _keys: PhantomData,
        }
    }
}

impl<K, A: Algorithm, C: Clock> KeyedLimiterBuilder<K, A, C> {
    /// Reads time from `clock` instead of the precise default.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, Gcra, KeyedLimiter, Quota};
    /// let clock = ManualClock::new(); // tests move time by hand
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(1)?)?)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert!(limiter.check(&7).unwrap().allowed());
    /// assert!(!limiter.check(&7).unwrap().allowed());
    /// clock.advance(std::time::Duration::from_secs(1));
    /// assert!(limiter.check(&7).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<K, A, C2> {
        KeyedLimiterBuilder {
            rule: self.rule,
            clock,
            max_keys: self.max_keys,
            evict_above: self.evict_above,
            _keys: PhantomData,
        }
    }

    /// Holds at most `max_keys` keys (at least 1); `policy` says what happens to new keys
    /// beyond it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{LimitError, Gcra, KeyedLimiter, OverflowPolicy, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_hour(10)?)?)
    ///     .max_keys(2, OverflowPolicy::Deny)
    ///     .build()?;
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// assert!(limiter.check(&2).unwrap().allowed());
    /// // Both keys hold state for an hour: a third key finds no room.
    /// assert!(matches!(limiter.check(&3), Err(LimitError::KeyTableFull { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize, policy: OverflowPolicy) -> Self {
        self.max_keys = Some((max_keys.max(1), policy));
        self
    }

    /// Keeps every key, fresh or not, until the limiter holds about `keys` keys: below that,
    /// the word table grows as a hash map does, so clients that come back to a full bucket
    /// always find their slot. Above it, a full shard table evicts keys that are fresh and
    /// were not used since it last filled, so that a flood of unique keys holds about `keys`
    /// keys (plus those still holding state). A soft bound, per shard; [`max_keys`] is the
    /// hard one. The dashmap store ignores it. With `String` keys it holds in each of the
    /// three tables texts are kept in by length (up to 23 bytes and over 71, 24 to 39, 40 to
    /// 71: see [`KeyedLimiter`]'s "Text keys"), so a flood of keys of every length may hold up
    /// to three times `keys`.
    ///
    /// Unset, the bound starts at [`DEFAULT_EVICT_ABOVE`](crate::store::DEFAULT_EVICT_ABOVE)
    /// (2^21) and follows a larger working set of clients that come back: a shard whose
    /// evicted keys return (at least one sampled insert in eight was a key it evicted)
    /// doubles its share, up to three times, so up to 2^24 keys (16.8M; with `u64` keys
    /// about 24 bytes each, some 400 MiB). A flood of keys seen once never raises it, but a
    /// client that picks its own keys (IPv6 addresses it owns) and cycles through millions of
    /// them does, as returning clients would: where clients choose their keys, fix the bound
    /// or set [`max_keys`]. A raised share stays raised. Set `evict_above` to fix the bound
    /// where you want it: a
    /// server with millions of returning clients and memory to spare sets it to about the
    /// number it expects (each check then finds its key); one with a memory budget sets it
    /// to what the budget holds (clients beyond it are evicted and inserted again as they
    /// return, decided as new keys: exact, but an insert a visit).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // A server with few clients: hold at most about 10k idle keys.
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(5)?)?)
    ///     .evict_above(10_000)
    ///     .build()?;
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    ///
    /// [`max_keys`]: KeyedLimiterBuilder::max_keys
    pub fn evict_above(mut self, keys: usize) -> Self {
        self.evict_above = Some(keys);
        self
    }

    /// The limiter, on the rule's default store: the lock-free word table.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve the quota.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{clock::CoarseClock, FixedWindow, Gcra, KeyedLimiter, Quota, QuotaError};
    /// let limiter = KeyedLimiter::<String, _>::builder(Gcra::new(Quota::per_second(5)?)?).build()?;
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// // A 1 ms clock cannot resolve a 5 ms window (it needs a tenth of it): refused here,
    /// // not mid-traffic.
    /// let coarse = KeyedLimiter::<String, _>::builder(FixedWindow::new(Quota::new(10, Duration::from_millis(5))?)?)
    ///     .clock(CoarseClock::new())
    ///     .build();
    /// assert!(matches!(coarse, Err(QuotaError::ClockTooCoarse { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn build(self) -> Result<KeyedLimiter<K, A, C>, QuotaError>
    where
        K: Clone + Hash + Eq + Send + Sync,
    {
        self.build_with_store(A::default_store())
    }

    /// The limiter, on `store` (which must be empty): for example a
    /// [`DashMapStore`](crate::store::DashMapStore) for a word rule, to compare the two.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve the quota.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{store::DashMapStore, Gcra, KeyedLimiter, Quota};
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(5)?)?)
    ///     .build_with_store(DashMapStore::new())?;
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn build_with_store<S>(self, store: S) -> Result<KeyedLimiter<K, A, C, S>, QuotaError>
    where
        K: Hash + Eq + Send + Sync,
        S: KeyedStore<K, A::Cell>,
    {
        let mut store = store;
        if let Some(keys) = self.evict_above {
            store.set_evict_above(keys);
        }
        store.set_carry(A::carry);
        Ok(KeyedLimiter {
            engine: Engine::new(self.rule, self.clock)?,
            table: KeyTable::new(store, self.max_keys),
        })
    }
}

/// # Construction
impl<K: Clone + Hash + Eq + Send + Sync, A: Algorithm> KeyedLimiter<K, A> {
    /// A keyed limiter on the precise default clock, with no key bound.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Per user id: 2 a second.
    /// let limiter = KeyedLimiter::<u64, _>::new(Gcra::new(Quota::per_second(2)?)?);
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// assert!(!limiter.check(&1).unwrap().allowed());
    /// assert!(limiter.check(&2).unwrap().allowed()); // another key, its own budget
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(rule: A) -> Self {
        Self::builder(rule)
            .build()
            .expect("the precise clock resolves 1 ns")
    }

    /// A builder for a clock or a key bound.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Gcra, KeyedLimiter, OverflowPolicy, Quota};
    /// let limiter = KeyedLimiter::<String, _>::builder(Gcra::new(Quota::per_second(5)?)?)
    ///     .max_keys(100_000, OverflowPolicy::Shared)
    ///     .build()?;
    /// assert!(limiter.check("198.51.100.4").unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn builder(rule: A) -> KeyedLimiterBuilder<K, A, QuantaClock> {
        KeyedLimiterBuilder::new(rule)
    }
}

impl<K, A, C> KeyedLimiter<K, A, C>
where
    K: Clone + Hash + Eq + Send + Sync,
    A: Algorithm,
    C: Clock,
{
    /// A keyed limiter on `clock`, with no key bound.
    ///
    /// # Errors
    /// [`QuotaError::ClockTooCoarse`] if the clock cannot serve the quota.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::ManualClock, FixedWindow, KeyedLimiter, Quota};
    /// let limiter: KeyedLimiter<u64, _, _> =
    ///     KeyedLimiter::with_clock(FixedWindow::new(Quota::per_second(2)?)?, ManualClock::new())?;
    /// assert_eq!(limiter.check(&1).unwrap().remaining(), 1);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn with_clock(rule: A, clock: C) -> Result<Self, QuotaError> {
        KeyedLimiter::<K, A>::builder(rule).clock(clock).build()
    }
}
