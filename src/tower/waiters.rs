//! How many requests a delay-mode policy holds waiting, in all and per key: each one holds a
//! connection (and on the rechecking algorithms wakes to call the backend again), so a flood
//! of refused requests must not become a flood of sleepers.

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::Key;

/// The waiters of one policy, shared by the layer's clones.
#[derive(Debug)]
pub(crate) struct Waiters {
    /// Requests waiting now.
    total: AtomicUsize,
    /// Requests waiting now, per key (a key is removed when its last waiter leaves).
    per_key: DashMap<Key, usize, foldhash::fast::RandomState>,
    pub(crate) max_total: usize,
    pub(crate) max_per_key: usize,
}

/// A place among the waiters, given back when dropped (the request admitted, refused, or
/// its future dropped).
#[derive(Debug)]
pub(crate) struct Place<'a> {
    waiters: &'a Waiters,
    key: &'a Key,
}

impl Waiters {
    pub(crate) fn new(max_total: usize, max_per_key: usize) -> Self {
        Waiters {
            total: AtomicUsize::new(0),
            per_key: DashMap::default(),
            max_total,
            max_per_key,
        }
    }

    /// A place for a request of `key`, or `None` when the policy or the key has as many
    /// waiting as it may.
    pub(crate) fn enter<'a>(&'a self, key: &'a Key) -> Option<Place<'a>> {
        // Relaxed: a counter bounding itself; no other memory is published through it.
        let before = self.total.fetch_add(1, Ordering::Relaxed);
        if before >= self.max_total {
            self.total.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // The entry's shard lock orders the per-key counts.
        let mut count = self.per_key.entry(key.clone()).or_insert(0);
        if *count >= self.max_per_key {
            drop(count);
            self.total.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        *count += 1;
        Some(Place { waiters: self, key })
    }

    /// Requests waiting now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.waiters.per_key.remove_if_mut(self.key, |_, count| {
            *count -= 1;
            *count == 0
        });
        self.waiters.total.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_in_all_and_per_key_and_given_back() {
        let waiters = Waiters::new(3, 2);
        let (a, b) = (Key::from("a"), Key::from("b"));
        let a1 = waiters.enter(&a).expect("room");
        let a2 = waiters.enter(&a).expect("room");
        assert!(waiters.enter(&a).is_none(), "two per key");
        let b1 = waiters.enter(&b).expect("room");
        assert!(waiters.enter(&b).is_none(), "three in all");
        assert_eq!(waiters.waiting(), 3);
        drop(a1);
        let b2 = waiters.enter(&b).expect("a place was given back");
        drop((a2, b1, b2));
        assert_eq!(waiters.waiting(), 0);
        assert!(waiters.per_key.is_empty(), "no key is left behind");
    }
}
