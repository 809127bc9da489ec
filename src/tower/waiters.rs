//! How many requests a delay-mode policy holds waiting, in all and per key: each one holds a
//! connection (and on the rechecking algorithms wakes to call the backend again), so a flood
//! of refused requests must not become a flood of sleepers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::key::Key;

/// The waiters of one policy, shared by the layer's clones.
#[derive(Debug)]
pub(crate) struct Waiters {
    /// Requests waiting now.
    total: AtomicUsize,
    /// Requests waiting now, per key (a key is removed when its last waiter leaves).
    per_key: DashMap<Key, usize, foldhash::fast::RandomState>,
    pub(crate) max_total: usize,
    pub(crate) max_per_key: usize,
    /// Sleeps spread so far: the seed of the next spread.
    spreads: AtomicU64,
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
            spreads: AtomicU64::new(0),
        }
    }

    /// A duration in `[0, up_to]` to add to a waiter's sleep, so that waiters refused
    /// together do not check again together. Pseudo-random from a per-policy sequence
    /// (SplitMix64): spread across waiters, yet the same for the same order of requests, so
    /// that a replay of a trace (`tollgate replay --config`) decides the same every time.
    pub(crate) fn spread(&self, up_to: Duration) -> Duration {
        // Relaxed: a sequence number; nothing else is ordered by it.
        let n = self.spreads.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let nanos = u64::try_from(up_to.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(z % nanos.saturating_add(1))
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

    #[test]
    fn spreads_stay_within_their_bound_and_vary() {
        let waiters = Waiters::new(1, 1);
        let up_to = Duration::from_millis(250);
        let spreads: Vec<Duration> = (0..64).map(|_| waiters.spread(up_to)).collect();
        assert!(spreads.iter().all(|&d| d <= up_to));
        let distinct: std::collections::BTreeSet<_> = spreads.iter().collect();
        assert!(distinct.len() > 32, "{spreads:?}");
        assert_eq!(
            Waiters::new(1, 1).spread(up_to),
            spreads[0],
            "the same sequence"
        );
        assert_eq!(waiters.spread(Duration::ZERO), Duration::ZERO);
    }
}
