//! A keyed concurrency limit: at most `N` units held at once per key, each admission a permit
//! that gives its units back when dropped.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use super::error::InFlightBoundError;
use crate::algorithm::in_flight::MAX_IN_FLIGHT;
use crate::algorithm::Concurrency;
use crate::clock::Nanos;
use crate::decision::{Decision, LimitError};
use crate::state::AtomicWord;
use crate::store::table::{Check, KeyTable, OverflowPolicy};
use crate::store::{Evictor, Stored};

// Explicit paths: `loom-tests` includes this file on its own (see `src/algorithm.rs`).
// `pub(crate)` for the loom model, which polls the waiter future (`wait::Waiting`) itself and
// leaves a mark through `waiters::Places`.
#[cfg(feature = "tokio")]
#[path = "in_flight/wait.rs"]
pub(crate) mod wait;
#[cfg(feature = "tokio")]
#[path = "in_flight/waiters.rs"]
pub(crate) mod waiters;

#[cfg(test)]
#[path = "in_flight/tests.rs"]
mod tests;

/// The rule reads no time: every call runs at instant 0.
const NOW: Nanos = 0;

/// At most `N` requests (or units) in flight at once per key: nginx's `limit_conn`, per
/// client, exact.
///
/// A rate says how many requests a client may *start* per second; this says how many it may
/// have *running*: uploads, streams, expensive searches. [`InFlight::try_acquire`] admits a
/// request while the key holds fewer than `N` and returns an [`InFlightPermit`]; dropping the
/// permit gives the unit back, on every path (a panic unwinding past it, a future dropped
/// while it holds one).
///
/// The counts live in the same lock-free table as [`KeyedLimiter`](crate::KeyedLimiter)'s
/// states, one word a key, updated by a compare-and-swap: an acquire never blocks another key,
/// nor another acquire of the same key. A key with nothing in flight is as good as new: it may
/// be evicted when the table needs room, as a fresh rate-limit key is, but never while a
/// permit is out.
///
/// With the `tokio` feature, [`acquire(&key, max_wait)`](InFlight::acquire) (and
/// `acquire_n(&key, cost, max_wait)`) waits at most `max_wait` for a permit, as the rate
/// limiters' `acquire` waits for admission, and gives up with the same
/// [`WaitError::TooLong`](crate::wait::WaitError::TooLong): waiters are served first come,
/// first served, each woken only once its units are taken for it. Waiting takes a lock of its
/// own, touched only while someone waits. There is no unbounded wait (`until_ready`): a
/// permit comes back only when its holder drops it, which a stuck request may never do.
///
/// # Examples
/// ```
/// use tollgate::InFlight;
/// // At most 2 uploads at once per client.
/// let uploads = InFlight::<String>::new(2)?;
/// let first = uploads.try_acquire("alice")?.expect("none in flight yet");
/// let second = uploads.try_acquire("alice")?.expect("one in flight");
/// assert!(uploads.try_acquire("alice")?.is_none()); // a third waits for one to end
/// assert!(uploads.try_acquire("bob")?.is_some()); // other clients are not affected
/// assert_eq!(uploads.in_flight("alice"), 2);
/// drop(first); // the upload ended (or failed, or its task was cancelled)
/// assert_eq!(uploads.in_flight("alice"), 1);
/// assert!(uploads.try_acquire("alice")?.is_some());
/// # drop(second);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct InFlight<K: Clone + Hash + Eq + Send + Sync> {
    /// The keyed limiter's own key table on the concurrency rule, without its clock or its
    /// quota cell: the rule reads no time and never changes.
    table: KeyTable<K, AtomicWord, <Concurrency as Stored>::Store<K>>,
    rule: Concurrency,
    /// Callers of `acquire` waiting for a place.
    #[cfg(feature = "tokio")]
    waiters: waiters::Waiters<K, Held<K>, LimitError>,
}

impl<K: Clone + Hash + Eq + Send + Sync> InFlight<K> {
    /// At most `max` units in flight per key, with no bound on the number of keys (keys with
    /// nothing in flight are evicted when the table needs the room, as
    /// [`KeyedLimiter`](crate::KeyedLimiter)'s fresh keys are).
    ///
    /// # Errors
    /// [`InFlightBoundError::Zero`] for `max = 0`; [`InFlightBoundError::TooLarge`] above
    /// `2^62 − 3`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{InFlight, InFlightBoundError};
    /// assert!(InFlight::<u64>::new(4).is_ok());
    /// assert_eq!(InFlight::<u64>::new(0).unwrap_err(), InFlightBoundError::Zero);
    /// ```
    pub fn new(max: u64) -> Result<Self, InFlightBoundError> {
        Self::on(max, None)
    }

    fn on(max: u64, max_keys: Option<(usize, OverflowPolicy)>) -> Result<Self, InFlightBoundError> {
        // The rule's own checks, named for a bound (the rule speaks of quotas).
        let rule = Concurrency::new(max).map_err(|_| {
            if max == 0 {
                InFlightBoundError::Zero
            } else {
                InFlightBoundError::TooLarge {
                    max,
                    largest: MAX_IN_FLIGHT,
                }
            }
        })?;
        Ok(InFlight {
            table: KeyTable::new(Concurrency::new_store(), max_keys),
            rule,
            #[cfg(feature = "tokio")]
            waiters: waiters::Waiters::new(),
        })
    }

    /// At most `max` units in flight per key, and at most `max_keys` keys held: a new key
    /// beyond them is refused ([`OverflowPolicy::Deny`], [`LimitError::KeyTableFull`]) or
    /// shares one count with every other key that did not fit ([`OverflowPolicy::Shared`]:
    /// together they have `max` in flight). Keys with nothing in flight make room.
    ///
    /// # Errors
    /// As for [`InFlight::new`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{InFlight, LimitError, OverflowPolicy};
    /// let limit = InFlight::<u64>::with_max_keys(1, 1, OverflowPolicy::Deny)?;
    /// let held = limit.try_acquire(&1)?.expect("a first key");
    /// // Key 1 holds a permit, so it cannot make room for key 2.
    /// assert!(matches!(limit.try_acquire(&2), Err(LimitError::KeyTableFull { .. })));
    /// drop(held);
    /// assert!(limit.try_acquire(&2)?.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_max_keys(
        max: u64,
        max_keys: usize,
        policy: OverflowPolicy,
    ) -> Result<Self, InFlightBoundError> {
        Self::on(max, Some((max_keys.max(1), policy)))
    }

    /// A permit for one unit, if `key` holds fewer than `N`; `None` if it is at its bound, or
    /// while callers of `acquire` (feature `tokio`) wait for the key: they come first. The
    /// permit keeps its own copy of the key (`key.to_owned()`), to release the unit with.
    ///
    /// # Errors
    /// [`LimitError::KeyTableFull`] for a new key at `max_keys` under [`OverflowPolicy::Deny`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::InFlight;
    /// let searches = InFlight::<u64>::new(1)?;
    /// let permit = searches.try_acquire(&7)?;
    /// assert!(permit.is_some());
    /// assert!(searches.try_acquire(&7)?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<Option<InFlightPermit<'_, K>>, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_n(key, 1)
    }

    /// A permit for `cost` units (a request that weighs more than others), if `key` holds at
    /// most `N − cost`.
    ///
    /// # Errors
    /// [`LimitError::CapacityExceeded`] if `cost > N` (it could never be admitted; nothing
    /// changes); [`LimitError::KeyTableFull`] as for [`InFlight::try_acquire`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::{InFlight, LimitError};
    /// let exports = InFlight::<u64>::new(10)?;
    /// let big = exports.try_acquire_n(&1, 8)?.expect("8 of 10");
    /// assert_eq!(big.remaining(), 2);
    /// assert!(exports.try_acquire_n(&1, 3)?.is_none());
    /// assert!(matches!(exports.try_acquire_n(&1, 11), Err(LimitError::CapacityExceeded { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_n<Q>(
        &self,
        key: &Q,
        cost: u64,
    ) -> Result<Option<InFlightPermit<'_, K>>, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let held = self.take(key, cost)?;
        Ok(held.map(|held| InFlightPermit { owner: self, held }))
    }

    /// [`InFlight::try_acquire`] for a permit that owns a handle to the limit, to move into a
    /// spawned task or a response body (`'static`).
    ///
    /// # Errors
    /// As for [`InFlight::try_acquire`].
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::InFlight;
    /// let jobs = Arc::new(InFlight::<u64>::new(1)?);
    /// let permit = jobs.try_acquire_owned(&1)?.expect("none running");
    /// let worker = std::thread::spawn(move || {
    ///     // ... the job, holding its permit ...
    ///     drop(permit);
    /// });
    /// worker.join().unwrap();
    /// assert_eq!(jobs.in_flight(&1), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
    ) -> Result<Option<OwnedInFlightPermit<K>>, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_n_owned(key, 1)
    }

    /// [`InFlight::try_acquire_n`] for a permit that owns a handle to the limit.
    ///
    /// # Errors
    /// As for [`InFlight::try_acquire_n`].
    pub fn try_acquire_n_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
        cost: u64,
    ) -> Result<Option<OwnedInFlightPermit<K>>, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let held = self.take(key, cost)?;
        Ok(held.map(|held| OwnedInFlightPermit {
            owner: Arc::clone(self),
            held,
        }))
    }

    /// Takes `cost` units of `key`, if it holds at most `N − cost`.
    fn take<Q>(&self, key: &Q, cost: u64) -> Result<Option<Held<K>>, LimitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let capacity = self.rule.capacity();
        if cost > capacity {
            return Err(LimitError::CapacityExceeded { cost, capacity });
        }
        // The key copied first: once the units are taken, no user code runs before the permit
        // that gives them back exists.
        let owned = key.to_owned();
        let check = || {
            self.table
                .check_key(key, &self.rule, || NOW, cost, &Idle(self), Check)
        };
        #[cfg_attr(not(feature = "tokio"), allow(unused_mut))] // reassigned by a heal
        let mut decision = check()?;
        // Refused with the units free: waiters are queued for them, or a mark was left by a
        // waiter whose key panicked on the way into the queue; the queue clears the latter,
        // and the check runs again.
        #[cfg(feature = "tokio")]
        if !decision.allowed() && decision.remaining() >= cost && self.waiters.heal(self, key) {
            decision = check()?;
        }
        Ok(decision.allowed().then(|| Held {
            key: owned,
            cost,
            decision,
        }))
    }

    /// The units `key` holds now (0 for a key it does not hold).
    ///
    /// # Examples
    /// ```
    /// use tollgate::InFlight;
    /// let limit = InFlight::<u64>::new(3)?;
    /// let _permit = limit.try_acquire_n(&1, 2)?;
    /// assert_eq!((limit.in_flight(&1), limit.in_flight(&2)), (2, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let decision = self.table.peek(key, &self.rule, || NOW, 0);
        decision.limit() - decision.remaining()
    }

    /// `N`.
    pub fn max(&self) -> u64 {
        self.rule.limit()
    }

    /// Keys held (those with units in flight, and some with none not evicted yet).
    ///
    /// # Examples
    /// ```
    /// use tollgate::InFlight;
    /// let limit = InFlight::<u64>::new(1)?;
    /// let _a = limit.try_acquire(&1)?;
    /// let _b = limit.try_acquire(&2)?;
    /// assert_eq!(limit.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Evicts every key with nothing in flight now; returns how many. Not needed for bounded
    /// memory (the table evicts them when it needs the room): for a server that wants its
    /// memory back after a burst of clients.
    ///
    /// # Examples
    /// ```
    /// use tollgate::InFlight;
    /// let limit = InFlight::<u64>::new(1)?;
    /// let held = limit.try_acquire(&1)?;
    /// drop(limit.try_acquire(&2)?);
    /// assert_eq!(limit.evict_idle(), 1); // key 2; key 1 holds a permit
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.table.evict_fresh(&self.rule, NOW)
    }

    /// Gives `held`'s units back to where they were taken, and serves the key's waiters.
    fn release(&self, held: &Held<K>) {
        if held.decision.charged_shared_state() {
            // Nobody waits on the shared count (`acquire` answers such a key at once).
            self.rule.refund(self.table.overflow(), || NOW, held.cost);
            return;
        }
        // The key holds these units, so it is not fresh and was not evicted: the release
        // finds it (moved to a new table, if one replaced its table meanwhile). The refund and
        // the waiters' service run no other key's code (`KeyTable::refund`,
        // `Places::reserve`): another key's panic cannot lose these units.
        self.table.refund(&held.key, &self.rule, || NOW, held.cost);
        #[cfg(feature = "tokio")]
        self.waiters.released(self, &held.key);
    }
}

/// What the table evicts with: keys with nothing in flight, at any time.
struct Idle<'a, K: Clone + Hash + Eq + Send + Sync>(&'a InFlight<K>);

impl<K: Clone + Hash + Eq + Send + Sync> Evictor<AtomicWord> for Idle<'_, K> {
    fn sweep(&self) -> usize {
        self.0.evict_idle()
    }

    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&AtomicWord, Nanos) -> bool) -> R,
    ) -> Option<R> {
        let rule = self.0.rule;
        Some(f(NOW, &|cell, _since| rule.evict_if_fresh(cell, NOW)))
    }
}

impl<K: Clone + Hash + Eq + Send + Sync> fmt::Debug for InFlight<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("max", &self.rule.limit())
            .finish_non_exhaustive()
    }
}

/// Units taken for a key: what a permit gives back.
pub struct Held<K> {
    key: K,
    cost: u64,
    /// Where the units were taken: the key's own count, or the count keys over `max_keys`
    /// share. They go back there, whatever became of the key since.
    decision: Decision,
}

/// Units held for a key of an [`InFlight`] limit, given back when dropped.
///
/// # Examples
/// ```
/// use tollgate::InFlight;
/// let limit = InFlight::<u64>::new(1)?;
/// let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
///     let _permit = limit.try_acquire(&1).unwrap().unwrap();
///     panic!("the request failed");
/// }));
/// assert!(result.is_err());
/// assert_eq!(limit.in_flight(&1), 0); // released on the way out
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping the permit releases its units at once"]
pub struct InFlightPermit<'a, K: Clone + Hash + Eq + Send + Sync> {
    /// The limit the units go back to; `pub(crate)` for the loom model's waiter.
    pub(crate) owner: &'a InFlight<K>,
    /// The units; `pub(crate)` for the loom model's waiter, which makes a permit of them.
    pub(crate) held: Held<K>,
}

/// Units held for a key of an [`InFlight`] limit behind an `Arc`, given back when dropped:
/// [`InFlight::try_acquire_owned`].
#[must_use = "dropping the permit releases its units at once"]
pub struct OwnedInFlightPermit<K: Clone + Hash + Eq + Send + Sync> {
    owner: Arc<InFlight<K>>,
    held: Held<K>,
}

macro_rules! permit {
    ($permit:ident $(<$lt:lifetime>)?) => {
        impl<K: Clone + Hash + Eq + Send + Sync> $permit<$($lt,)? K> {
            /// The key the units are held for.
            pub fn key(&self) -> &K {
                &self.held.key
            }

            /// The units held.
            pub fn cost(&self) -> u64 {
                self.held.cost
            }

            /// Units the key could still take when this permit was granted.
            pub fn remaining(&self) -> u64 {
                self.held.decision.remaining()
            }
        }

        impl<K: Clone + Hash + Eq + Send + Sync> Drop for $permit<$($lt,)? K> {
            fn drop(&mut self) {
                self.owner.release(&self.held);
            }
        }

        impl<K: Clone + Hash + Eq + Send + Sync + fmt::Debug> fmt::Debug for $permit<$($lt,)? K> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($permit))
                    .field("key", &self.held.key)
                    .field("cost", &self.held.cost)
                    .finish()
            }
        }
    };
}

permit!(InFlightPermit<'_>);
permit!(OwnedInFlightPermit);
