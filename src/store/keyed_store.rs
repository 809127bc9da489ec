//! The interface between a keyed limiter and its map (no dependency: `loom-tests` includes
//! this file to model-check the key table against a store of its own).

use std::borrow::Borrow;
use std::hash::Hash;

/// A concurrent map from keys to state cells.
///
/// Contract: a cell handed to `f` stays in the map while `f` runs (no eviction can remove it
/// under a running decision), so an admission is never lost to a concurrent sweep.
pub trait KeyedStore<K, V>: Send + Sync {
    /// Runs `f` on the cell of an existing key; `None` if the key is absent. Must not allocate
    /// or clone the key.
    fn with_existing<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;

    /// Runs `f` on the key's cell, inserting a fresh one if absent. Returns whether this call
    /// inserted the key.
    fn with_inserted<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> (R, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// Keeps only the cells for which `keep` is true; returns how many were removed.
    fn retain(&self, keep: impl FnMut(&V) -> bool) -> usize;

    /// The number of keys (exact when no call runs concurrently).
    fn len(&self) -> usize;

    /// Whether the store holds no key.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
