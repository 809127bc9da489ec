//! The interface between a keyed limiter and its map (no dependency: `loom-tests` includes
//! this file to model-check the key table against a store of its own).

use std::borrow::Borrow;
use std::hash::Hash;

/// A concurrent map from keys to state cells.
///
/// Contract: an admission is never lost to a concurrent sweep. Either a cell handed to `f`
/// stays in the map while `f` runs (the dashmap store: a shard lock), or the cell is retired by
/// one CAS that a decision in `f` cannot miss (the word table: `f` sees the mark and returns
/// `None`).
pub trait KeyedStore<K, V>: Send + Sync {
    /// Runs `f` on the cell of an existing key; `None` if the key is absent. Must not allocate
    /// or clone the key. `f` returns `None` when it finds the cell retired (evicted or moved by
    /// a concurrent sweep or rebuild): the store then looks again where the key's state now
    /// is, or answers `None` if it was evicted. `f` may run more than once.
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnMut(&V) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// Runs `f` on the key's cell, inserting a fresh one if absent. Returns whether this call
    /// inserted the key.
    fn with_inserted<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> (R, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// Keeps only the cells for which `keep` is true; returns how many were removed. `keep`
    /// retires a cell it rejects (`Algorithm::evict_if_fresh`), so a store may leave it in
    /// place as a tombstone rather than unlink it at once.
    fn retain(&self, keep: impl FnMut(&V) -> bool) -> usize;

    /// The number of keys (exact when no call runs concurrently).
    fn len(&self) -> usize;

    /// Whether the store holds no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
