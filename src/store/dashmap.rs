use std::borrow::Borrow;
use std::hash::Hash;

use dashmap::DashMap;

use super::keyed_store::{Evictor, Inserted, StoreProtocol};

/// A keyed store on a sharded [`DashMap`] (the limiters' default is the lock-free
/// word table; this one is there to compare with, and to plug in
/// with [`KeyedLimiterBuilder::build_with_store`](crate::KeyedLimiterBuilder::build_with_store)),
/// with foldhash, a fast non-cryptographic
/// hasher seeded per map (so keys chosen by an attacker cannot be aimed at one bucket).
///
/// A lookup of an existing key takes its shard's read lock, runs the decision, and releases it:
/// no allocation, no clone of the key. Only a miss clones the key (`ToOwned`) and takes the
/// shard's write lock.
///
/// # Examples
/// ```
/// use tollgate::{store::DashMapStore, Gcra, KeyedLimiter, Quota};
/// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_second(1)?)?)
///     .build_with_store(DashMapStore::new())?;
/// assert!(limiter.check(&1).unwrap().allowed());
/// assert!(!limiter.check(&1).unwrap().allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub struct DashMapStore<K, V> {
    map: DashMap<K, V, foldhash::fast::RandomState>,
}

impl<K, V> std::fmt::Debug for DashMapStore<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DashMapStore").finish_non_exhaustive()
    }
}

impl<K: Hash + Eq, V> DashMapStore<K, V> {
    /// An empty store.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{store::DashMapStore, FixedWindow, KeyedLimiter, Quota};
    /// // The dashmap store for a word rule, e.g. to compare it with the default word table.
    /// let limiter = KeyedLimiter::<String, _>::builder(FixedWindow::new(Quota::per_second(1)?)?)
    ///     .build_with_store(DashMapStore::new())?;
    /// assert!(limiter.check("alice").unwrap().allowed());
    /// assert!(!limiter.check("alice").unwrap().allowed());
    /// assert_eq!(limiter.len(), 1);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new() -> Self {
        DashMapStore {
            map: DashMap::with_hasher(foldhash::fast::RandomState::default()),
        }
    }
}

impl<K: Hash + Eq, V> Default for DashMapStore<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> StoreProtocol<K, V> for DashMapStore<K, V>
where
    K: Hash + Eq + Send + Sync,
    V: Default + Send + Sync,
{
    #[inline]
    fn with_existing<Q, R>(
        &self,
        key: &Q,
        _era: u64,
        mut f: impl FnMut(&V) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // The read guard is held while `f` runs: `retain` needs the shard's write lock, so
        // the cell cannot be evicted under a decision.
        // `f` never meets a retired cell here: a sweep retires and removes it under the write
        // lock, before any reader can see it.
        self.map.get(key).and_then(|cell| f(cell.value()))
    }

    /// Never evicts on insert: its key table sweeps it as it grows.
    fn with_inserted<Q, R>(
        &self,
        key: &Q,
        _era: u64,
        f: impl FnOnce(&V) -> R,
        _evictor: &impl Evictor<V>,
        done: &mut Inserted,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.map.entry(key.to_owned()) {
            dashmap::mapref::entry::Entry::Occupied(cell) => f(cell.get()),
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                let cell = slot.insert(V::default());
                done.inserted = true;
                f(cell.value())
            }
        }
    }

    fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut removed = 0;
        self.map.retain(|_, cell| {
            let kept = keep(cell);
            removed += usize::from(!kept);
            kept
        });
        removed
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeepAll;

    #[test]
    fn it_counts_the_keys_it_holds_and_says_which_it_inserted() {
        let store = DashMapStore::<u64, u64>::new();
        assert!(store.is_empty());
        for (key, new) in [(1, true), (2, true), (3, true), (2, false)] {
            let mut done = Inserted::default();
            store.with_inserted(&key, 0, |_| (), &KeepAll, &mut done);
            assert_eq!(done.inserted, new, "key {key}");
        }
        assert_eq!((store.len(), store.is_empty()), (3, false));
    }
}
