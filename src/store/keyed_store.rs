//! The interface between a keyed limiter and its map (no dependency: `loom-tests` includes
//! this file to model-check the key table against a store of its own).

use std::borrow::Borrow;
use std::hash::Hash;

use crate::clock::Nanos;

/// A concurrent map from keys to state cells, for a [`KeyedLimiter`](crate::KeyedLimiter):
/// the lock-free word table (every algorithm's default) or
/// [`DashMapStore`](crate::store::DashMapStore). Name it to write code generic over the store.
///
/// Sealed: the calls a limiter makes on its store, and the eviction and re-anchoring protocol
/// behind them, are the crate's own (so that they can change with the table), and no other
/// type implements it.
///
/// # Examples
/// A limiter is generic over its store; the two stores of this crate decide alike:
/// ```
/// use tollgate::{store::{CellOf, DashMapStore, KeyedStore}, clock::QuantaClock};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// fn burst_of<S: KeyedStore<u64, CellOf<Gcra>>>(limiter: &KeyedLimiter<u64, Gcra, QuantaClock, S>) -> usize {
///     (0..10).take_while(|_| limiter.check(&1).unwrap().allowed()).count()
/// }
/// let rule = Gcra::new(Quota::per_hour(3)?)?;
/// let on_dashmap = KeyedLimiter::<u64, _>::builder(rule).build_with_store(DashMapStore::new())?;
/// let on_word_table = KeyedLimiter::<u64, _>::new(rule);
/// assert_eq!(burst_of(&on_dashmap), 3);
/// assert_eq!(burst_of(&on_word_table), 3);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub trait KeyedStore<K, V>: StoreProtocol<K, V> {}

impl<K, V, S: StoreProtocol<K, V>> KeyedStore<K, V> for S {}

/// The calls a keyed limiter makes on its store ([`KeyedStore`], which seals it: this trait is
/// the crate's, out of users' reach).
///
/// Contract: an admission is never lost to a concurrent eviction or move. Either a cell handed
/// to `f` stays in the map while `f` runs (the dashmap store: a shard lock), or the cell is
/// retired by one CAS that a decision in `f` cannot miss (the word table: `f` sees the mark and
/// returns `None`).
pub trait StoreProtocol<K, V>: Send + Sync {
    /// Whether the store evicts fresh keys on its own, when it needs room for a new one (the
    /// word table). A store that does not is swept by its key table, every time it doubles.
    const EVICTS_ON_INSERT: bool = false;

    /// Whether the store re-anchors its cells itself as the rule's era moves on (the word
    /// table: see [`StoreProtocol::set_carry`]). A store that does not is swept by its limiter at
    /// each re-anchoring of the window counters, in the call that finds it due.
    const RE_ANCHORS: bool = false;

    /// Runs `f` on the cell of an existing key; `None` if the key is absent. Must not allocate
    /// or clone the key. `f` returns `None` when it finds the cell retired (evicted or moved by
    /// a concurrent sweep or rebuild): the store then looks again where the key's state now
    /// is, or answers `None` if it was evicted. `f` may run more than once.
    ///
    /// `era` is the anchor of the caller's rule (`Stored::era`: 0 but for the window
    /// counters, whose limiter moves it up now and then). A store that re-anchors itself
    /// hands `f` only a cell whose state was written in `era` or a later one.
    fn with_existing<Q, R>(&self, key: &Q, era: u64, f: impl FnMut(&V) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// [`StoreProtocol::with_existing`] for a change that must not be lost (a refund, which its
    /// caller cannot try again): besides the lookup's own calls (the key's `Hash`, and `Eq`
    /// against the keys it probes past) the call runs no key's code, so that no other key's
    /// panic can interrupt it. A store whose lookups also do upkeep that runs keys' code (the
    /// word table: dropping the keys of a table it frees, hashing and cloning the keys a drain
    /// moves) leaves that to other calls here. The default is `with_existing`, for a store
    /// whose lookups do no such upkeep.
    fn with_existing_alone<Q, R>(
        &self,
        key: &Q,
        era: u64,
        f: impl FnMut(&V) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.with_existing(key, era, f)
    }

    /// [`StoreProtocol::with_existing`] on the fast path only: `None` may also mean that the key
    /// is being moved, so a caller that gets `None` must go on to
    /// [`StoreProtocol::with_inserted`], which finds it.
    #[inline]
    fn try_existing<Q, R>(&self, key: &Q, era: u64, f: impl FnMut(&V) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.with_existing(key, era, f)
    }

    /// Runs `f` on the key's cell, inserting a fresh one if the key is absent. A store that
    /// evicts on insert judges the cells it meets while making room with `evictor`.
    ///
    /// What the call did besides is written to `done` before `f` runs, so that a caller knows
    /// it even if `f` panics. A call that a key's own code interrupts (a panic in its `Hash`,
    /// `Eq`, `Clone` or `Drop`) leaves `done` as it was and inserts nothing; keys it evicted
    /// are reported by a later call of the store's. `era` as for [`StoreProtocol::with_existing`].
    fn with_inserted<Q, R>(
        &self,
        key: &Q,
        era: u64,
        f: impl FnOnce(&V) -> R,
        evictor: &impl Evictor<V>,
        done: &mut Inserted,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// For a store that evicts on its own, at the `max_keys` bound: judges about `budget` more
    /// cells with `evictor` (a hand that goes round the whole store, a step per call), evicting
    /// the fresh ones; returns how many. A store that does not evict on its own evicts nothing
    /// here (its key table sweeps it).
    fn evict_some(&self, _evictor: &impl Evictor<V>, _budget: usize) -> usize {
        0
    }

    /// For a store that evicts on its own: keep every key until the store holds about `keys`
    /// (see [`KeyedLimiterBuilder::evict_above`](crate::KeyedLimiterBuilder::evict_above)).
    /// Other stores ignore it.
    fn set_evict_above(&mut self, _keys: usize) {}

    /// For a store that re-anchors itself ([`StoreProtocol::RE_ANCHORS`]): how to carry a cell
    /// written in one era into a later one (`Stored::carry`), applied to each cell it
    /// moves out of a table of an older era. Other stores ignore it.
    fn set_carry(&mut self, _carry: Carry<V>) {}

    /// Keeps only the cells for which `keep` is true; returns how many were removed. `keep`
    /// retires a cell it rejects (`Stored::evict_if_fresh`), so a store may leave it in
    /// place as a tombstone rather than unlink it at once.
    fn retain(&self, keep: impl FnMut(&V) -> bool) -> usize;

    /// The number of keys (exact when no call runs concurrently).
    fn len(&self) -> usize;

    /// Whether the store holds no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Re-encodes a cell written in era `from` for era `to` (`from < to`), in place, before any
/// other thread can see it: see [`StoreProtocol::set_carry`].
pub type Carry<V> = fn(cell: &V, from: u64, to: u64);

/// What [`StoreProtocol::with_inserted`] did besides running its closure (and keys evicted
/// earlier that no call had reported yet).
/// (Default: an existing key, nothing evicted.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inserted {
    /// Whether the key was inserted (or revived) by this call.
    pub inserted: bool,
    /// Keys the store evicted while making room.
    pub evicted: usize,
}

/// What a keyed limiter lends its store to evict with: the rule in force and a clock reading.
/// Stores receive one from the limiter; a test of a store lends its own (`word_table_tests.rs`).
pub trait Evictor<V> {
    /// Evicts every fresh key now (the amortised sweep of a store that does not evict on its
    /// own); returns how many.
    fn sweep(&self) -> usize;

    /// Runs `f` with the current time and a judge `(cell, since)` that retires a cell whose key
    /// has been fresh since `since` (unused since then: `since = now` for any fresh key) and
    /// says whether it did; `None`, without running `f`, while the rule is being replaced or
    /// re-anchored (a judge holding a stale rule could misread a state written under the new
    /// one), in which case the store keeps every key.
    fn judging<R>(&self, f: impl FnOnce(Nanos, &dyn Fn(&V, Nanos) -> bool) -> R) -> Option<R>;
}

/// For tests of a store or a key table: a limiter that never lets its store evict (it judges
/// nothing, so a table grows and every key stays).
#[cfg(test)]
pub(crate) struct KeepAll;

#[cfg(test)]
impl<V> Evictor<V> for KeepAll {
    fn sweep(&self) -> usize {
        0
    }

    fn judging<R>(&self, _: impl FnOnce(Nanos, &dyn Fn(&V, Nanos) -> bool) -> R) -> Option<R> {
        None
    }
}
