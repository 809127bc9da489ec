//! The key table: what a keyed limiter does around its store. It counts the keys (when a bound
//! or its sweep schedule needs the count), reserves a place below `max_keys` before inserting,
//! sends what does not fit to the overflow policy, sweeps keys that have become fresh when the
//! store does not evict on its own or the bound is reached (amortised over the calls that
//! insert), and decides on an existing key or else inserts it.
//!
//! Written against [`StoreProtocol`] and `crate::sync` only, with the rule and the clock passed
//! in, so that `loom-tests` compiles this very file against loom's atomics and a store of its
//! own. Its correctness rests on the store's contract: a cell handed to a closure stays in the
//! map while the closure runs, and `retain` judges and removes a cell with no closure running
//! on it, so a sweep either sees an admission or removes the key before it is looked up.

use std::borrow::Borrow;
use std::hash::Hash;
use std::marker::PhantomData;

use super::keyed_store::{Evictor, Inserted, StoreProtocol};
use super::stored::Stored;
use crate::clock::Nanos;
use crate::decision::{Decision, LimitError};
use crate::sync::{AtomicBool, AtomicUsize, Ordering};

/// The table is swept once it holds at least this many keys, then whenever it doubles (a store
/// that does not evict on its own).
const FIRST_SWEEP: usize = 1024;
/// Cells a store that evicts on its own judges for each new key that finds the table at its
/// bound.
const HAND_STEP: usize = 32;

/// Steps of the eviction hand a new key at the bound may take before it is refused. One step
/// can find no fresh key where many are held: its slot budget spent on a run of tombstones
/// (the hand's own, kept until the table is replaced) or on a nearly empty table.
///
/// One step in the loom models: the steps run one after another, each the protocol the models
/// check, and four of them exceed loom's branch budget (a step there visits every shard).
const HAND_TRIES: usize = if crate::sync::MODEL_CHECKED { 1 } else { 4 };

/// What a keyed limiter at its `max_keys` bound does with a request for a key it does not hold,
/// when no fresh key could be evicted to make room (on the word table: none among the few
/// cells its eviction hand judged for this request; on the dashmap store: none left after a
/// sweep).
///
/// # Examples
/// ```
/// use tollgate::{FixedWindow, KeyedLimiter, OverflowPolicy, Quota};
/// // A bound of 2 keys; keys beyond it share one state (one key's quota between them).
/// let limiter = KeyedLimiter::<u64, _>::builder(FixedWindow::new(Quota::per_hour(3)?)?)
///     .max_keys(2, OverflowPolicy::Shared)
///     .build()?;
/// assert!(limiter.check(&1).unwrap().allowed());
/// assert!(limiter.check(&2).unwrap().allowed());
/// // Keys 3, 4 and 5 do not fit: together they get 3 an hour, not 3 each.
/// assert!(limiter.check(&3).unwrap().allowed());
/// assert!(limiter.check(&4).unwrap().allowed());
/// assert!(limiter.check(&5).unwrap().allowed());
/// assert!(!limiter.check(&6).unwrap().allowed());
/// // Known keys keep their own limits.
/// assert!(limiter.check(&1).unwrap().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowPolicy {
    /// Refuse the request with [`LimitError::KeyTableFull`]. Known keys keep their own limits.
    Deny,
    /// Count the request against one state shared by every key that did not fit: strict in
    /// aggregate (all overflow keys together get one key's quota), never unlimited.
    Shared,
}

/// A store of per-key cells `V`, with the key count, the `max_keys` bound and eviction.
pub struct KeyTable<K, V, S> {
    store: S,
    /// Keys in the store, counted here (the map's own `len` locks every shard). A place is
    /// counted before its key is inserted and uncounted after its key is removed, so the count
    /// never reads below the keys held (and, bounded, never above `max_keys`).
    keys: AtomicUsize,
    max_keys: Option<(usize, OverflowPolicy)>,
    /// The state shared by keys that did not fit, for [`OverflowPolicy::Shared`].
    overflow: V,
    sweep_at: AtomicUsize,
    misses_since_sweep: AtomicUsize,
    sweeping: AtomicBool,
    /// The last new key at the bound was refused: the hand found nothing fresh in all its
    /// tries, so the next new key takes one step, not [`HAND_TRIES`], until a step evicts.
    hand_found_none: AtomicBool,
    _keys: PhantomData<fn(K)>,
}

impl<K, V: Default, S> KeyTable<K, V, S> {
    /// An empty table over `store` (which must be empty), with an optional key bound (≥ 1).
    pub fn new(store: S, max_keys: Option<(usize, OverflowPolicy)>) -> Self {
        KeyTable {
            store,
            keys: AtomicUsize::new(0),
            max_keys,
            overflow: V::default(),
            sweep_at: AtomicUsize::new(FIRST_SWEEP),
            misses_since_sweep: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            hand_found_none: AtomicBool::new(false),
            _keys: PhantomData,
        }
    }
}

impl<K, V, S> KeyTable<K, V, S> {
    /// The map the cells live in.
    #[allow(dead_code)] // read by a unit test and by the loom models
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The cell shared by keys that did not fit ([`OverflowPolicy::Shared`]).
    #[allow(dead_code)] // read by the loom models and the waiting calls (feature `tokio`)
    pub fn overflow(&self) -> &V {
        &self.overflow
    }

    /// The key bound and its policy.
    pub fn max_keys(&self) -> Option<(usize, OverflowPolicy)> {
        self.max_keys
    }

    /// How many keys hold state (including keys not yet swept, and places reserved by inserts
    /// in progress).
    pub fn len(&self) -> usize
    where
        S: StoreProtocol<K, V>,
    {
        if !self.counts() {
            return self.store.len();
        }
        // Relaxed: a counter read on its own; no memory is published through it.
        self.keys.load(Ordering::Relaxed)
    }

    /// Whether `keys` is kept: for the bound, or for the sweep schedule of a store that does
    /// not evict on its own. Otherwise inserts write no shared counter.
    #[inline]
    fn counts(&self) -> bool
    where
        S: StoreProtocol<K, V>,
    {
        self.max_keys.is_some() || !S::EVICTS_ON_INSERT
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool
    where
        S: StoreProtocol<K, V>,
    {
        self.len() == 0
    }
}

/// How a decision counts a request: [`Check`] or [`Reserve`]. A type, not a value, so that
/// each charge compiles to its own path: an enum argument left a match (and the reservation's
/// code) on the check's hot path, 66 instructions more per check at 100k keys (callgrind).
pub trait Charge: Copy {
    /// A reservation ([`Stored::reserve`]) rather than a check; a constant of the type, so
    /// the branches below fold away.
    const RESERVE: bool;

    /// On a new key's cell.
    #[inline]
    fn on<A: Stored>(
        self,
        rule: &A,
        cell: &A::Cell,
        now: impl Fn() -> Nanos,
        cost: u64,
    ) -> Decision {
        if Self::RESERVE {
            rule.reserve(cell, now, cost)
        } else {
            rule.acquire(cell, now, cost, true)
        }
    }

    /// On a held key's cell; `None` if the cell was retired meanwhile.
    #[inline]
    fn on_live<A: Stored>(
        self,
        rule: &A,
        cell: &A::Cell,
        now: impl Fn() -> Nanos,
        cost: u64,
    ) -> Option<Decision> {
        if Self::RESERVE {
            rule.reserve_live(cell, now, cost)
        } else {
            rule.acquire_live(cell, now, cost, true)
        }
    }
}

/// A check: counted if allowed.
#[derive(Clone, Copy)]
pub struct Check;

impl Charge for Check {
    const RESERVE: bool = false;
}

/// A reservation ([`Stored::reserve`]).
#[derive(Clone, Copy)]
pub struct Reserve;

impl Charge for Reserve {
    const RESERVE: bool = true;
}

impl<K, V, S> KeyTable<K, V, S>
where
    K: Hash + Eq,
    S: StoreProtocol<K, V>,
{
    /// Decides a request of `cost` (at most the rule's capacity) for `key`, counted as
    /// `charge` says: on its cell if the key is held, else on a cell inserted for it, else (at
    /// the bound) by the overflow policy. Before inserting, sweeps through `evictor` if the
    /// amortised schedule says so; a store that evicts on insert judges with it.
    ///
    /// # Errors
    /// [`LimitError::KeyTableFull`] for a new key at the bound under [`OverflowPolicy::Deny`].
    #[inline]
    pub fn check_key<Q, A>(
        &self,
        key: &Q,
        rule: &A,
        now: impl Fn() -> Nanos + Copy,
        cost: u64,
        evictor: &impl Evictor<V>,
        charge: impl Charge,
    ) -> Result<Decision, LimitError>
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // `now` by value, not `&now`: the forwarding `Fn for &F` layer was not inlined.
        if let Some(decision) = self.store.try_existing(key, rule.era(), |cell| {
            charge.on_live(rule, cell, now, cost)
        }) {
            return Ok(decision);
        }
        self.decide_new_key(key, rule, now, cost, evictor, charge)
    }

    /// The decision a request of `cost` for `key` would get; changes nothing, inserts nothing.
    pub fn peek<Q, A>(&self, key: &Q, rule: &A, now: impl Fn() -> Nanos, cost: u64) -> Decision
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Default,
    {
        self.store
            .with_existing(key, rule.era(), |cell| {
                rule.acquire_live(cell, &now, cost, false)
            })
            .unwrap_or_else(|| rule.acquire(&V::default(), &now, cost, false))
    }

    /// Gives back `cost` units to `key`'s cell; nothing for a key not held.
    pub fn refund<Q, A>(&self, key: &Q, rule: &A, now: impl Fn() -> Nanos, cost: u64)
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Alone: units given back must not be lost to another key's panic in the store's
        // upkeep (a permit's would be lost for good, and a rate's refund cannot be tried
        // again: the caller does not know whether it ran).
        self.store
            .with_existing_alone(key, rule.era(), |cell| rule.refund_live(cell, &now, cost));
    }

    /// Decides a request of `cost` for `key` as `charge` says, if the table holds the key,
    /// running no other key's code ([`StoreProtocol::with_existing_alone`]); `None` if the key
    /// is not held (nothing changed).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the waiter queue's reservations
    pub fn check_held<Q, A>(
        &self,
        key: &Q,
        rule: &A,
        now: impl Fn() -> Nanos,
        cost: u64,
        charge: impl Charge,
    ) -> Option<Decision>
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.store.with_existing_alone(key, rule.era(), |cell| {
            charge.on_live(rule, cell, &now, cost)
        })
    }

    /// Evicts every key whose cell is indistinguishable from a fresh one at `now`; returns how
    /// many.
    pub fn evict_fresh<A: Stored<Cell = V>>(&self, rule: &A, now: Nanos) -> usize {
        let removed = self.store.retain(|cell| !rule.evict_if_fresh(cell, now));
        if self.counts() {
            // Relaxed: a counter; uncounted only after the keys are gone (see `keys`).
            self.keys.fetch_sub(removed, Ordering::Relaxed);
        }
        removed
    }

    /// [`KeyTable::evict_fresh`], and the overflow state put back to fresh if it is: afterwards
    /// no state fresh at `now` is left (what a rebase of the window counters needs).
    pub fn sweep_all<A: Stored<Cell = V>>(&self, rule: &A, now: Nanos) -> usize {
        rule.reset_if_fresh(&self.overflow, now);
        self.evict_fresh(rule, now)
    }

    /// What a re-anchoring of the window counters at `now` needs before the rule moves on: no
    /// state fresh at `now` left where the new rule may read it. The overflow state is put
    /// back to fresh if it is; a store that re-anchors itself (the word table) carries its
    /// states into the new era as calls meet them, a drain step at a time, so nothing more is
    /// done here; any other is swept ([`KeyTable::sweep_all`]). Returns the keys evicted.
    pub fn re_anchor<A: Stored<Cell = V>>(&self, rule: &A, now: Nanos) -> usize {
        if S::RE_ANCHORS {
            rule.reset_if_fresh(&self.overflow, now);
            return 0;
        }
        self.sweep_all(rule, now)
    }

    #[cold]
    fn decide_new_key<Q, A>(
        &self,
        key: &Q,
        rule: &A,
        now: impl Fn() -> Nanos,
        cost: u64,
        evictor: &impl Evictor<V>,
        charge: impl Charge,
    ) -> Result<Decision, LimitError>
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.sweep_if_due(evictor);
        let Some((max_keys, policy)) = self.max_keys else {
            if !self.counts() {
                return Ok(self.store.with_inserted(
                    key,
                    rule.era(),
                    |cell| charge.on(rule, cell, &now, cost),
                    evictor,
                    &mut Inserted::default(),
                ));
            }
            // Count the place before inserting, as below: counted after, a sweep could remove
            // the key first (it is fresh again once the time it was judged at has passed) and
            // wrap the count below zero, and a sweeper reading that count would set the next
            // sweep at `usize::MAX`, i.e. never (loom: `key_evicted_before_it_is_counted`).
            // Relaxed: a counter; no memory is published through it.
            self.keys.fetch_add(1, Ordering::Relaxed);
            return Ok(self.insert_in_place(key, rule, now, cost, evictor, charge));
        };
        // Reserve a place first, and only below the bound, so that racing inserts cannot
        // overshoot it, not even for an instant (`len()` never reads above `max_keys`).
        // Relaxed: the counter's own modification order is all the bound needs.
        let reserve = || {
            self.keys
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max_keys).then_some(n + 1)
                })
                .is_ok()
        };
        let reserved = reserve() || (S::EVICTS_ON_INSERT && self.make_room(evictor) && reserve());
        if !reserved {
            // The key may have been inserted by another thread meanwhile (or be on its way to
            // a new table: `with_existing` looks there too).
            if let Some(decision) = self.store.with_existing(key, rule.era(), |cell| {
                charge.on_live(rule, cell, &now, cost)
            }) {
                return Ok(decision);
            }
            return match policy {
                OverflowPolicy::Deny => Err(LimitError::KeyTableFull { max_keys }),
                OverflowPolicy::Shared => Ok(charge
                    .on(rule, &self.overflow, &now, cost)
                    .on_shared_state()),
            };
        }
        Ok(self.insert_in_place(key, rule, now, cost, evictor, charge))
    }

    /// Decides on `key`'s cell, inserting it into the place counted for it in `keys`; gives
    /// the place back if the key was there already (or the call panicked before inserting it),
    /// and uncounts the keys the store evicted.
    fn insert_in_place<Q, A>(
        &self,
        key: &Q,
        rule: &A,
        now: impl Fn() -> Nanos,
        cost: u64,
        evictor: &impl Evictor<V>,
        charge: impl Charge,
    ) -> Decision
    where
        A: Stored<Cell = V>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        /// Settles the count when the insert returns or unwinds (a key's `Hash`, `Eq` or
        /// `Clone`, or the clock, may panic in it): whatever the store wrote to `done` by then.
        struct Settle<'a> {
            keys: &'a AtomicUsize,
            done: Inserted,
        }
        impl Drop for Settle<'_> {
            fn drop(&mut self) {
                let Inserted { inserted, evicted } = self.done;
                // Relaxed: a counter; evicted keys are uncounted after they are gone (see
                // `keys`).
                self.keys
                    .fetch_sub(usize::from(!inserted) + evicted, Ordering::Relaxed);
            }
        }
        let mut settle = Settle {
            keys: &self.keys,
            done: Inserted::default(),
        };
        self.store.with_inserted(
            key,
            rule.era(),
            |cell| charge.on(rule, cell, &now, cost),
            evictor,
            &mut settle.done,
        )
    }

    /// At the bound, for a store that evicts on its own: up to [`HAND_TRIES`] steps of its
    /// eviction hand (a fixed amount of work), until one frees a place; whether one did. Under
    /// a flood of keys that all hold state, each refused key after the first pays one step.
    fn make_room(&self, evictor: &impl Evictor<V>) -> bool {
        // Relaxed (this load and the stores): a heuristic for how hard to look; a stale value
        // costs a few steps, or refuses a key that three more steps might have made room for.
        let found_none = self.hand_found_none.load(Ordering::Relaxed);
        for _ in 0..if found_none { 1 } else { HAND_TRIES } {
            let evicted = self.store.evict_some(evictor, HAND_STEP);
            // Relaxed: a counter; uncounted after the keys are gone (see `keys`).
            self.keys.fetch_sub(evicted, Ordering::Relaxed);
            if evicted > 0 {
                if found_none {
                    self.hand_found_none.store(false, Ordering::Relaxed);
                }
                return true;
            }
        }
        if !found_none {
            self.hand_found_none.store(true, Ordering::Relaxed);
        }
        false
    }

    /// Amortised eviction of a store that does not evict on its own: sweep when the table has
    /// doubled since the last sweep, or, at the `max_keys` bound, after a quarter of the bound
    /// in misses.
    fn sweep_if_due(&self, evictor: &impl Evictor<V>) {
        if S::EVICTS_ON_INSERT {
            return; // at the bound: `make_room` instead, a step at a time
        }
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
        evictor.sweep();
        // Relaxed (this load and the two stores): the same heuristics as above.
        let live = self.keys.load(Ordering::Relaxed);
        self.sweep_at
            .store(live.saturating_mul(2).max(FIRST_SWEEP), Ordering::Relaxed);
        self.misses_since_sweep.store(0, Ordering::Relaxed);
        // Release: pairs with the Acquire swap above (one sweeper at a time).
        self.sweeping.store(false, Ordering::Release);
    }
}
