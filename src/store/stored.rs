//! How each rule's state is stored: the glue between a pure rule (`crate::algorithm`) and the
//! atomics that hold its states (`crate::state`) in a store (`WordTable`).
//!
//! [`Stored`] is crate-private in effect (its module is not exported): limiters take an
//! [`Algorithm`](crate::Algorithm), a [`Rule`] that is `Stored`, so users name the rule and
//! never its storage, and the storage can change without a breaking change.

use std::hash::Hash;

use super::keyed_store::KeyedStore;
use super::word_table::WordTable;
use crate::algorithm::{
    Concurrency, FixedWindow, Gcra, LeakyQueue, Rule, SlidingLog, SlidingWindow, WordRule, Words,
};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::state::{AtomicWord, LogCell, Retired};
use crate::sync::StoreHasher;

/// GCRA and leaky-bucket TATs stay below `u64::MAX − 1` (`Gcra::decide_with_delay`).
pub(crate) const TAT_MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX - 1,
};

/// How far back `evict_if_idle` may judge, in periods: well within the window counters'
/// readable range (a quarter of the sliding window's 2^23 indices), and no limit in practice.
const IDLE_HORIZON: u64 = 1 << 20;

/// Both window states have impossible low bits: the fixed window's count (24 bits, `MAX_LIMIT`
/// = 2^24 − 2) and the sliding window's `cur` (21 bits, at most 2^20 − 1) never are all ones.
pub(crate) const WINDOW_MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX >> 1,
};

/// A rule whose per-key state a limiter can store: its cell, its default store, and each
/// decision, refund and judgement run on a cell (by a CAS loop on its word or header).
pub trait Stored: Rule {
    /// The per-key state as stored in a limiter.
    type Cell: Default + Send + Sync;

    /// Decides a request of `cost ≤ capacity()` against `cell`, committing it when `commit` and
    /// it is allowed. `now` is read after the state is loaded, so that a state written by another
    /// thread never looks newer than the time it is judged at.
    fn acquire<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Decision;

    /// Gives back `cost` units admitted earlier, as far as the rule allows.
    fn refund<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64);

    /// Reserves `cost ≤ capacity()` units: as [`Stored::acquire`] with `commit`, except
    /// that a rule that can ([`WordRule::reserve`](crate::algorithm::WordRule::reserve): GCRA) takes the units even when it would
    /// refuse them now, and the decision's delay says when they are due. What the waiting
    /// calls use, so that waiters are served in the order they reserved.
    #[inline]
    fn reserve<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64) -> Decision {
        self.acquire(cell, now, cost, true)
    }

    /// [`Stored::reserve`] in a keyed store: `None` if the cell was retired.
    #[inline]
    fn reserve_live<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
    ) -> Option<Decision> {
        self.acquire_live(cell, now, cost, true)
    }

    /// The keyed store this rule's cells live in by default: the lock-free [`WordTable`].
    type Store<K: Clone + Hash + Eq + Send + Sync>: KeyedStore<K, Self::Cell>;

    /// An empty default store.
    fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K>;

    /// [`Stored::acquire`] in a keyed store: `None` if the cell was retired (evicted or
    /// moved), so that the store looks the key up again.
    fn acquire_live<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Option<Decision>;

    /// [`Stored::refund`] in a keyed store: `None` if the cell was retired.
    fn refund_live<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64) -> Option<()>;

    /// Retires `cell` if it is fresh at `now`, atomically with respect to decisions on it
    /// (a decision lands before and the cell is kept, or sees the tombstone); whether it did.
    fn evict_if_fresh(&self, cell: &Self::Cell, now: Nanos) -> bool;

    /// Retires `cell` if it is fresh at `now` and already was at `since` (≤ `now`): a key left
    /// unused since then. Atomic as [`Stored::evict_if_fresh`]; whether it did. (`since` is
    /// clamped to at most 2^20 periods before `now`, within what the window counters can read.)
    fn evict_if_idle(&self, cell: &Self::Cell, since: Nanos, now: Nanos) -> bool;

    /// The rule that takes over from `previous` at `now` when the quota changes.
    fn take_over(self, previous: &Self, now: Nanos) -> Self;

    /// The window counters keep a window index in a few bits, anchored at a base the limiter
    /// moves up (see the index horizon in `algorithm/grid.rs`): the instant from which a
    /// limiter should sweep and call [`Stored::rebase`]. Never, for the other rules.
    #[inline]
    fn sweep_due(&self) -> Nanos {
        Nanos::MAX
    }

    /// Whether this rule may not store a state judged at `now` (a limiter must sweep and
    /// rebase first, then decide again). Rules refuse such writes: the state stays as it was.
    fn beyond_horizon(&self, _now: Nanos) -> bool {
        false
    }

    /// The rule re-anchored at `now`, once every state that is fresh at `now` is gone.
    fn rebase(self, _now: Nanos) -> Self {
        self
    }

    /// The anchor its states are written against: a store that re-anchors itself never hands
    /// a decision a cell of an older era ([`StoreProtocol::with_existing`]). 0 for the rules
    /// whose states need none.
    #[inline(always)]
    fn era(&self) -> u64 {
        0
    }

    /// Re-encodes, in place, a cell written in era `from` for the later era `to` (see
    /// [`StoreProtocol::set_carry`]): a state too old to be read in `to` is fresh, and becomes
    /// the fresh state. Nothing, for the rules whose states need no era.
    fn carry(_cell: &Self::Cell, _from: u64, _to: u64) {}

    /// Puts a cell that is fresh at `now` back to the fresh state (a direct limiter's sweep).
    fn reset_if_fresh(&self, _cell: &Self::Cell, _now: Nanos) {}

    fn to_words(&self) -> Words;
    fn from_words(words: Words) -> Self;
}

macro_rules! word_cells {
    ($ty:ty, $marks:expr $(, $windowed:ident)?) => {
        impl Stored for $ty {
            type Cell = AtomicWord;
            type Store<K: Clone + Hash + Eq + Send + Sync> =
                WordTable<K, StoreHasher>;

            fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K> {
                WordTable::new($marks, StoreHasher::default())
            }

            #[inline]
            fn acquire<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
                commit: bool,
            ) -> Decision {
                if commit {
                    cell.update(now, |state, t| WordRule::decide(self, state, t, cost))
                } else {
                    WordRule::decide(self, cell.load(), now(), cost).0
                }
            }
            fn refund<F: Fn() -> Nanos>(&self, cell: &AtomicWord, now: F, cost: u64) {
                cell.update(now, |state, t| {
                    ((), WordRule::refunded(self, state, t, cost))
                })
            }
            fn reserve<F: Fn() -> Nanos>(&self, cell: &AtomicWord, now: F, cost: u64) -> Decision {
                cell.update(now, |state, t| WordRule::reserve(self, state, t, cost))
            }
            fn reserve_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
            ) -> Option<Decision> {
                let marks: Retired = $marks;
                cell.try_update(
                    now,
                    |state, t| WordRule::reserve(self, state, t, cost),
                    |state| marks.any(state),
                )
                .ok()
            }
            #[inline]
            fn acquire_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
                commit: bool,
            ) -> Option<Decision> {
                let marks: Retired = $marks;
                if commit {
                    cell.try_update(
                        now,
                        |state, t| WordRule::decide(self, state, t, cost),
                        |state| marks.any(state),
                    )
                    .ok()
                } else {
                    let state = cell.load();
                    (!marks.any(state)).then(|| WordRule::decide(self, state, now(), cost).0)
                }
            }
            fn refund_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
            ) -> Option<()> {
                let marks: Retired = $marks;
                cell.try_update(
                    now,
                    |state, t| ((), WordRule::refunded(self, state, t, cost)),
                    |state| marks.any(state),
                )
                .ok()
            }
            fn evict_if_fresh(&self, cell: &AtomicWord, now: Nanos) -> bool {
                let marks: Retired = $marks;
                cell.retire_if(marks.tombstone, |state| {
                    !marks.any(state) && WordRule::is_fresh(self, state, now)
                })
                .is_some()
            }
            fn evict_if_idle(&self, cell: &AtomicWord, since: Nanos, now: Nanos) -> bool {
                let marks: Retired = $marks;
                let since = since
                    .max(now.saturating_sub(self.period().saturating_mul(IDLE_HORIZON)))
                    .min(now);
                cell.retire_if(marks.tombstone, |state| {
                    !marks.any(state)
                        && WordRule::is_fresh(self, state, now)
                        && WordRule::is_fresh(self, state, since)
                })
                .is_some()
            }
            fn take_over(self, previous: &Self, now: Nanos) -> Self {
                self.take_over(previous, now)
            }
            fn reset_if_fresh(&self, cell: &AtomicWord, now: Nanos) {
                cell.retire_if(0, |state| {
                    state != 0 && WordRule::is_fresh(self, state, now)
                });
            }
            $(
                #[inline]
                fn sweep_due(&self) -> Nanos {
                    let $windowed = self.horizon();
                    $windowed.sweep_due()
                }
                fn beyond_horizon(&self, now: Nanos) -> bool {
                    self.horizon().beyond_horizon(now)
                }
                fn rebase(self, now: Nanos) -> Self {
                    self.rebase(now)
                }
                #[inline(always)]
                fn era(&self) -> u64 {
                    self.horizon().base
                }
                fn carry(cell: &AtomicWord, from: u64, to: u64) {
                    let $windowed = <Self>::carried(cell.load(), from, to);
                    cell.init($windowed);
                }
            )?
            fn to_words(&self) -> Words {
                self.to_words()
            }
            fn from_words(words: Words) -> Self {
                Self::from_words(words)
            }
        }
    };
}

word_cells!(Gcra, TAT_MARKS);
word_cells!(LeakyQueue, TAT_MARKS);
// A count held stays at most `MAX_IN_FLIGHT`, below both marks.
word_cells!(Concurrency, TAT_MARKS);
word_cells!(FixedWindow, WINDOW_MARKS, windowed);
word_cells!(SlidingWindow, WINDOW_MARKS, windowed);

impl Stored for SlidingLog {
    type Cell = LogCell;

    fn acquire<F: Fn() -> Nanos>(
        &self,
        cell: &LogCell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Decision {
        // Only a keyed store retires a cell, and not the new key's cell it decides on here; if
        // one were retired, nothing would be admitted on it.
        cell.decide(self, now, cost, commit).unwrap_or(Decision {
            allowed: false.into(),
            limit: self.limit(),
            retry_after: 0,
            reset_after: 0,
            delay: 0,
            remaining: crate::decision::Remaining::Exact(0),
        })
    }
    fn refund<F: Fn() -> Nanos>(&self, cell: &LogCell, now: F, cost: u64) {
        cell.refund(self, now, cost);
    }
    type Store<K: Clone + Hash + Eq + Send + Sync> = WordTable<K, StoreHasher, LogCell>;
    fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K> {
        WordTable::new((), StoreHasher::default())
    }
    #[inline]
    fn acquire_live<F: Fn() -> Nanos>(
        &self,
        cell: &LogCell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Option<Decision> {
        cell.decide(self, now, cost, commit)
    }
    fn refund_live<F: Fn() -> Nanos>(&self, cell: &LogCell, now: F, cost: u64) -> Option<()> {
        cell.refund(self, now, cost)
    }
    /// One CAS from the header judged empty, so no admission lands between the judgement and
    /// the tombstone.
    fn evict_if_fresh(&self, cell: &LogCell, now: Nanos) -> bool {
        cell.evict_if_empty(self, now)
    }
    /// Empty at `since` means no entry after `since − W`, so empty at `now ≥ since` too.
    fn evict_if_idle(&self, cell: &LogCell, since: Nanos, now: Nanos) -> bool {
        cell.evict_if_empty(self, since.min(now))
    }
    fn take_over(self, _previous: &Self, _now: Nanos) -> Self {
        // Entries are absolute times: a new window or limit applies to them as they are.
        self
    }
    fn to_words(&self) -> Words {
        self.to_words()
    }
    fn from_words(words: Words) -> Self {
        Self::from_words(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use std::time::Duration;

    /// The states a window counter writes at its largest stored index (all ones: every
    /// `2^bits` windows) with its largest counts are not marks: a lookup would read a key's
    /// full window as moved or evicted. The fixed window's index and count are then all ones
    /// but the count's lowest bit; the sliding window's `cur` never sets its top bit.
    #[test]
    fn full_windows_at_the_last_stored_index_are_not_marks() {
        const MS: u64 = 1_000_000;
        let per_ms = |limit| Quota::new(limit, Duration::from_millis(1)).unwrap();

        let fixed = FixedWindow::new(per_ms(FixedWindow::MAX_LIMIT)).unwrap();
        for index in [(1 << 40) - 1, (1 << 41) - 1, (1 << 40) - 2] {
            for cost in [FixedWindow::MAX_LIMIT, FixedWindow::MAX_LIMIT - 1, 1] {
                let (d, state) = fixed.decide(0, index * MS, cost);
                assert!(d.allowed());
                assert!(
                    !WINDOW_MARKS.any(state),
                    "{state:#x}: window {index}, n = {cost}"
                );
            }
        }

        let limit = SlidingWindow::MAX_LIMIT;
        let sliding = SlidingWindow::new(per_ms(limit)).unwrap();
        for index in [(1 << 23) - 1, (1 << 24) - 1] {
            // A full previous window and a nearly full current one (the previous window weighs
            // 1/W at the current one's last nanosecond: a unit or two of it left).
            let (_, prev) = sliding.decide(0, (index - 1) * MS, limit);
            let (d, state) = sliding.decide(prev, (index + 1) * MS - 1, limit - 2);
            assert!(d.allowed());
            let (_, alone) = sliding.decide(0, index * MS, limit);
            for state in [prev, state, alone] {
                assert!(!WINDOW_MARKS.any(state), "{state:#x}: window {index}");
            }
        }
    }
}
