use crate::algorithm::sliding_log::{Mark, Ring};
use crate::clock::Nanos;
use crate::sync::Mutex;

/// A sliding log's ring buffer behind its own lock.
///
/// The log is the one state that does not fit a word: an admission appends up to `c` slots and
/// a check reads one, and no lock-free scheme keeps that exact with 4-byte slots (a slot written
/// late by a preempted thread would make a live entry look expired). The lock is per key, held
/// for O(c + expired entries) work, and the clock is read while it is held, so entries are
/// appended in time order.
///
/// In a keyed limiter the cell lives in the lock-free table, which finds it without a lock; the
/// table retires it (evicts or moves it) under the same lock, leaving a mark in the ring that a
/// decision sees first ([`LogCell::with_live`]), as a word rule's decision sees a retired word.
#[derive(Debug, Default)]
pub struct LogCell(Mutex<Ring>);

impl LogCell {
    /// Runs `f` on the ring with the time read under the lock.
    pub fn with<R>(&self, now: impl Fn() -> Nanos, f: impl FnOnce(&mut Ring, Nanos) -> R) -> R {
        let mut ring = self.0.lock();
        let t = now();
        f(&mut ring, t)
    }

    /// [`LogCell::with`] on a cell a keyed store may have retired: `None`, without running `f`,
    /// if it did.
    #[inline]
    pub fn with_live<R>(
        &self,
        now: impl Fn() -> Nanos,
        f: impl FnOnce(&mut Ring, Nanos) -> R,
    ) -> Option<R> {
        let mut ring = self.0.lock();
        if ring.mark().is_some() {
            return None;
        }
        let t = now();
        Some(f(&mut ring, t))
    }

    /// Retires a live cell as a tombstone if `judge` finds its ring fresh; whether it did.
    pub fn evict_if(&self, judge: impl FnOnce(&mut Ring) -> bool) -> bool {
        let mut ring = self.0.lock();
        let evict = ring.mark().is_none() && judge(&mut ring);
        if evict {
            *ring = Ring::marked(Mark::Tombstone);
        }
        evict
    }

    /// The mark of a retired cell.
    pub(crate) fn retired(&self) -> Option<Mark> {
        self.0.lock().mark()
    }

    /// Marks a live cell moved and returns its ring; `None` for a tombstone.
    pub(crate) fn take_to_move(&self) -> Option<Ring> {
        let mut ring = self.0.lock();
        match ring.mark() {
            Some(_) => None,
            None => Some(std::mem::replace(&mut *ring, Ring::marked(Mark::Moved))),
        }
    }

    /// Stores a moved ring in a cell no decision has reached yet.
    pub(crate) fn put(&self, ring: Ring) {
        *self.0.lock() = ring;
    }

    /// Makes a tombstone fresh again; whether it was one.
    pub(crate) fn revive(&self) -> bool {
        let mut ring = self.0.lock();
        let tombstone = ring.mark() == Some(Mark::Tombstone);
        if tombstone {
            *ring = Ring::default();
        }
        tombstone
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn a_log_cell_is_48_bytes() {
        // The 40-byte ring and its lock.
        assert_eq!(std::mem::size_of::<crate::state::LogCell>(), 48);
    }

    #[test]
    fn logcell_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{state::LogCell, Quota, SlidingLog};
        let rule = SlidingLog::new(Quota::per_second(100)?)?;
        let cell = LogCell::default();
        // Four threads, 50 requests each at the same instant: exactly L = 100 admitted.
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..50)
                            .filter(|_| {
                                cell.with(|| 0, |ring, t| rule.decide(ring, t, 1, true))
                                    .allowed()
                            })
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        Ok(())
    }

    #[test]
    fn with_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{state::LogCell, Quota, SlidingLog};
        let rule = SlidingLog::new(Quota::per_second(2)?)?;
        let cell = LogCell::default();
        // The clock is read under the key's lock, so entries go in in time order.
        let d = cell.with(|| 0, |ring, now| rule.decide(ring, now, 2, true));
        assert!(d.allowed());
        assert_eq!(cell.with(|| 0, |ring, _| ring.len()), 2);
        Ok(())
    }

    #[test]
    fn with_live_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{state::LogCell, Quota, SlidingLog};
        let rule = SlidingLog::new(Quota::per_second(2)?)?;
        let cell = LogCell::default();
        assert!(cell
            .with_live(|| 0, |ring, now| rule.decide(ring, now, 1, true).allowed())
            .unwrap());
        // Once a store evicted the cell, decisions on it find it retired.
        assert!(!cell.evict_if(|ring| ring.is_empty())); // it holds an entry: kept
        assert!(cell.evict_if(|ring| rule.is_empty_at(ring, 1_000_000_000))); // expired at 1 s: evicted
        assert!(cell
            .with_live(|| 0, |ring, now| rule.decide(ring, now, 1, true))
            .is_none());
        Ok(())
    }

    #[test]
    fn evict_if_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{state::LogCell, Quota, SlidingLog};
        let rule = SlidingLog::new(Quota::per_second(2)?)?;
        let cell = LogCell::default();
        cell.with(|| 0, |ring, now| rule.decide(ring, now, 1, true));
        // A sweep at 0.5 s: the entry still counts, the key keeps its state.
        assert!(!cell.evict_if(|ring| rule.is_empty_at(ring, 500_000_000)));
        // At 1 s it has expired: evicted.
        assert!(cell.evict_if(|ring| rule.is_empty_at(ring, 1_000_000_000)));
        // A tombstone is not evicted twice.
        assert!(!cell.evict_if(|_| true));
        Ok(())
    }
}
