use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};

/// The two states a keyed store writes into a cell it retires, and that the cell's rule never
/// produces (each rule documents why): a lookup that meets one knows the cell no longer holds
/// the key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    /// An evicted key (its state was fresh).
    pub tombstone: u64,
    /// A key whose state was copied into a new table.
    pub moved: u64,
}

impl Retired {
    /// Whether `state` is one of the two marks.
    #[inline]
    pub fn any(self, state: u64) -> bool {
        state == self.tombstone || state == self.moved
    }
}

/// One packed 64-bit state, changed only by [`AtomicWord::update`]'s CAS loop.
///
/// 0 is a fresh key for every rule that uses it.
#[derive(Debug, Default)]
pub struct AtomicWord(AtomicU64);

impl AtomicWord {
    /// A cell holding `state`.
    pub fn new(state: u64) -> Self {
        AtomicWord(AtomicU64::new(state))
    }

    /// Starts loading the word's cache line, for a read soon after: see `TableCell::touch`.
    #[inline]
    pub(crate) fn touch(&self) {
        // A prefetch, where the CPU has one: unlike a load it never faults, so a page of a
        // fresh mapped table is first touched by the write that puts a key there, once,
        // instead of by a read (the zero page mapped) and then that write (copied): a small
        // table made when needed (`word_table/region.rs`) took two faults a page on the
        // flood's checks. It reads nothing, so no ordering is involved.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the intrinsic needs SSE, part of every x86_64 CPU (a baseline target
        // feature); a prefetch reads no memory, so any address would do, and this one is a
        // live word's.
        #[allow(unsafe_code)]
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(self).cast::<i8>());
        }
        // Relaxed: nothing is read from the value. (An Acquire load would hold back the loads
        // after it on weakly ordered CPUs: the overlap this is for.)
        #[cfg(not(target_arch = "x86_64"))]
        std::hint::black_box(self.0.load(Ordering::Relaxed));
    }

    /// The current state.
    #[inline]
    pub fn load(&self) -> u64 {
        // Acquire: pairs with the Release of `update`'s CAS, so that a thread that sees a state
        // also sees every clock reading that happened before it was written (the limiter's
        // clamp for non-monotonic clocks lives in another atomic).
        self.0.load(Ordering::Acquire)
    }

    /// Runs `rule(state, now)` and stores its next state, retrying on conflict.
    ///
    /// The clock is read *after* the state is loaded, on every attempt: a state written by
    /// another thread was computed from a reading taken before that write, so with a monotonic
    /// clock the state is never newer than the time it is judged at. `rule` may run several
    /// times and must be pure. When it returns the state unchanged nothing is written.
    #[inline]
    pub fn update<R>(
        &self,
        now: impl Fn() -> Nanos,
        rule: impl FnMut(u64, Nanos) -> (R, u64),
    ) -> R {
        match self.try_update(now, rule, |_| false) {
            Ok(result) => result,
            Err(_) => unreachable!("no state is retired here"),
        }
    }

    /// [`AtomicWord::update`] for a cell a keyed store can retire: if the state read is one for
    /// which `retired` holds (a store's tombstone, never a state a rule produces), nothing is
    /// decided or written and `Err(state)` is returned, so the caller looks the key up again.
    /// A retired state is only ever written by a CAS from a live one, so a decision either
    /// lands before the retirement (which then fails and re-judges) or sees it.
    #[inline]
    pub fn try_update<R>(
        &self,
        now: impl Fn() -> Nanos,
        mut rule: impl FnMut(u64, Nanos) -> (R, u64),
        retired: impl Fn(u64) -> bool,
    ) -> Result<R, u64> {
        let mut state = self.load();
        loop {
            if retired(state) {
                return Err(state);
            }
            let (result, next) = rule(state, now());
            if next == state {
                return Ok(result);
            }
            // AcqRel on success: Release publishes the state with the reading it came from (see
            // `load`); Acquire keeps the same guarantee for the value we replaced.
            // Acquire on failure: we judge the value we just saw, as `load` does.
            match self
                .0
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(result),
                Err(seen) => {
                    state = seen;
                    crate::sync::spin_loop();
                }
            }
        }
    }

    /// Replaces the state by `to` if `judge` accepts the current one (a live state); returns
    /// the state replaced. Used by keyed stores to retire a cell (evict or move it) with one CAS,
    /// so that no decision can land on it in between.
    pub fn retire_if(&self, to: u64, judge: impl Fn(u64) -> bool) -> Option<u64> {
        let mut state = self.load();
        loop {
            if !judge(state) {
                return None;
            }
            // AcqRel: as in `try_update`; a decision that lost this race re-reads and sees `to`.
            match self
                .0
                .compare_exchange_weak(state, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(state),
                Err(seen) => state = seen,
            }
        }
    }

    /// Stores `state` in a cell no other thread can reach yet (a new table's slot, before its
    /// key is published): a plain store, where a CAS would wait for every load before it.
    pub(crate) fn init(&self, state: u64) {
        // Relaxed: the slot's publication (the Release store of its tag) orders this store
        // before any reader's Acquire load of the tag.
        self.0.store(state, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn retired_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{
            algorithm::WordRule,
            state::{AtomicWord, Retired},
            FixedWindow, Quota,
        };
        let marks = Retired {
            tombstone: u64::MAX,
            moved: u64::MAX - 1,
        };
        let rule = FixedWindow::new(Quota::per_second(5)?)?;
        let cell = AtomicWord::new(marks.tombstone); // a store evicted this key
                                                     // A decision that meets the mark backs off, so the store can look the key up again.
        let r = cell.try_update(|| 0, |st, t| rule.decide(st, t, 1), |st| marks.any(st));
        assert!(r.is_err());
        Ok(())
    }

    #[test]
    fn any_example() {
        use crate::state::Retired;
        // Marks as a word rule might define them: states its decisions never produce.
        let marks = Retired {
            tombstone: u64::MAX,
            moved: u64::MAX - 1,
        };
        assert!(marks.any(u64::MAX) && marks.any(u64::MAX - 1));
        assert!(!marks.any(0)); // a fresh key's state is live
    }

    #[test]
    fn atomicword_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{algorithm::WordRule, state::AtomicWord, FixedWindow, Quota};
        // One key's state, decided by a word rule: the core of every limiter but the log.
        let rule = FixedWindow::new(Quota::per_second(2)?)?;
        let cell = AtomicWord::default();
        let decide = || cell.update(|| 0, |state, now| rule.decide(state, now, 1));
        assert!(decide().allowed());
        assert!(decide().allowed());
        assert!(!decide().allowed());
        Ok(())
    }

    #[test]
    fn new_example() {
        use crate::state::AtomicWord;
        assert_eq!(AtomicWord::new(42).load(), 42);
        // The default is 0: a fresh key, for every rule.
        assert_eq!(AtomicWord::default().load(), 0);
    }

    #[test]
    fn load_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{algorithm::WordRule, state::AtomicWord, FixedWindow, Quota};
        let rule = FixedWindow::new(Quota::per_second(5)?)?;
        let cell = AtomicWord::default();
        cell.update(|| 0, |state, now| rule.decide(state, now, 2));
        // The packed state now counts 2 units in the current window.
        assert_eq!(rule.decide(cell.load(), 0, 1).0.remaining(), 2);
        Ok(())
    }

    #[test]
    fn update_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{algorithm::WordRule, state::AtomicWord, Gcra, Quota};
        // A word rule on a cell of its own, shared by threads: what a limiter does per key.
        let rule = Gcra::new(Quota::per_second(10)?)?;
        let cell = AtomicWord::default();
        let admitted: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..5)
                            .filter(|_| cell.update(|| 0, |st, t| rule.decide(st, t, 1)).allowed())
                            .count() as u64
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        // 20 attempts at the same instant against a burst of 10: exactly 10 get through.
        assert_eq!(admitted, 10);
        Ok(())
    }

    #[test]
    fn try_update_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{algorithm::WordRule, state::AtomicWord, Gcra, Quota};
        let rule = Gcra::new(Quota::per_second(10)?)?;
        const TOMBSTONE: u64 = u64::MAX;
        let cell = AtomicWord::new(TOMBSTONE);
        // Retired by a store: no decision is made, and the caller looks the key up again.
        let r = cell.try_update(|| 0, |st, t| rule.decide(st, t, 1), |st| st == TOMBSTONE);
        assert_eq!(r.err(), Some(TOMBSTONE));
        Ok(())
    }

    #[test]
    fn retire_if_example() {
        use crate::state::AtomicWord;
        const TOMBSTONE: u64 = u64::MAX;
        let cell = AtomicWord::new(7);
        // A store evicts only a state its judge accepts (here: a fresh key, 0): not this one.
        assert_eq!(cell.retire_if(TOMBSTONE, |state| state == 0), None);
        // Any live state: retired, and the replaced state returned.
        assert_eq!(
            cell.retire_if(TOMBSTONE, |state| state != TOMBSTONE),
            Some(7)
        );
        assert_eq!(cell.load(), TOMBSTONE);
    }
}
