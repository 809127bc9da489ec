//! What the lock-free table needs of a cell: a way to retire it (evict or move it) in one step
//! that a decision on it cannot miss, and to carry its state into a new table.
//!
//! Two cells implement it: [`AtomicWord`] (GCRA, the leaky buckets and both window counters),
//! retired by one CAS to a rule's mark, and [`LogCell`] (the sliding log), retired by a CAS on
//! its header (a tombstone) or frozen and then marked (a move). The table's protocol (module
//! docs of `word_table.rs`) is the same for both.

use crate::state::{AtomicWord, LogCell, LogState, Retired};
use crate::sync::MODEL_CHECKED;

/// A promise that a value whose bytes are all zero is a valid value of some type, and the very
/// value a new table starts with (see [`TableCell::ZEROED`]).
#[derive(Debug, Clone, Copy)]
pub struct ZeroedIsFresh(());

impl ZeroedIsFresh {
    /// The promise.
    ///
    /// # Safety
    /// All-zero bytes are a valid value of the type it is given for, the value a new table's
    /// slot (or tag) starts with, and the type has no drop glue.
    #[allow(unsafe_code)]
    pub(crate) const unsafe fn promise() -> Self {
        ZeroedIsFresh(())
    }
}

/// A per-key cell of [`WordTable`](crate::store::WordTable). A decision on the cell returns
/// `None` when it finds the cell retired (`Stored::acquire_live`), so that the table looks
/// the key up again where its state now is.
///
/// # Examples
/// A word cell's life in the table, driven by hand: live, moved to a new table, revived
/// from a tombstone.
pub trait TableCell: Default + Send + Sync {
    /// What tells a retired cell from a live one: a rule's two marks for a word, nothing for a
    /// log (its header has flags of its own).
    type Marks: Copy + Send + Sync + std::fmt::Debug;
    /// A live state, taken out of a cell that is moved to a new table.
    type State;
    /// A zero-sized type whose alignment the table gives each slot (cell and key).
    type Align: Send + Sync;

    /// Whether the cell holds a live state: neither a tombstone nor moved.
    fn is_live(&self, marks: Self::Marks) -> bool;

    /// Whether the cell was moved to a new table (final: a table holding it is stale).
    fn is_moved(&self, marks: Self::Marks) -> bool;

    /// Marks a live cell moved and returns the state it held, in one step no decision can
    /// interleave with; `None`, and the cell unchanged, if it is a tombstone.
    fn take_to_move(&self, marks: Self::Marks) -> Option<Self::State>;

    /// Stores a moved state in an empty cell of the new table, before its key is published.
    fn put(&self, state: Self::State);

    /// Turns a tombstone back into a fresh cell (its key came back); whether it was one.
    fn revive(&self, marks: Self::Marks) -> bool;

    /// `Some` if a cell whose bytes are all zero is a valid, fresh cell (`Default`), and the
    /// cell has no drop glue: a table of such cells can start as zeroed pages (see
    /// `word_table/region.rs`). Only an `unsafe` promise makes the value.
    const ZEROED: Option<ZeroedIsFresh> = None;

    /// Starts loading the cell, whose value is not needed yet: a lookup touches its key's home
    /// slot before it reads the table's tags, so that the two cache misses overlap instead of
    /// following each other. It should not fault a page in (a prefetch, not a load): the
    /// lookup may be for a key absent from a fresh table in zeroed pages. The default does
    /// nothing.
    #[inline]
    fn touch(&self) {}
}

/// Aligns a table slot to a 64-byte cache line (zero-sized).
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
pub struct CacheLine;

impl TableCell for AtomicWord {
    type Marks = Retired;
    type State = u64;
    type Align = ();
    // SAFETY: an `AtomicWord` is one `AtomicU64` (all-zero bytes are 0, a valid value), 0 is
    // the fresh state (`Default`), and it has no drop glue. Not in the loom models, whose
    // atomics are not plain memory.
    #[allow(unsafe_code)]
    const ZEROED: Option<ZeroedIsFresh> = if MODEL_CHECKED {
        None
    } else {
        Some(unsafe { ZeroedIsFresh::promise() })
    };

    #[inline]
    fn touch(&self) {
        AtomicWord::touch(self);
    }

    #[inline]
    fn is_live(&self, marks: Retired) -> bool {
        !marks.any(self.load())
    }

    #[inline]
    fn is_moved(&self, marks: Retired) -> bool {
        self.load() == marks.moved
    }

    fn take_to_move(&self, marks: Retired) -> Option<u64> {
        self.retire_if(marks.moved, |state| !marks.any(state))
    }

    fn put(&self, state: u64) {
        self.init(state);
    }

    fn revive(&self, marks: Retired) -> bool {
        self.retire_if(0, |state| state == marks.tombstone)
            .is_some()
    }
}

impl TableCell for LogCell {
    type Marks = ();
    type State = LogState;
    /// A log's cell (48 bytes) and a `u64` key fill one cache line: a check reads one line,
    /// as a word rule's does. A key over 8 bytes makes the slot two lines (128 bytes).
    type Align = CacheLine;

    fn is_live(&self, (): ()) -> bool {
        self.retired().is_none()
    }

    fn is_moved(&self, (): ()) -> bool {
        self.retired() == Some(true)
    }

    fn take_to_move(&self, (): ()) -> Option<LogState> {
        self.take_to_move()
    }

    fn put(&self, state: LogState) {
        self.put(state);
    }

    fn revive(&self, (): ()) -> bool {
        self.revive()
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn tablecell_example() {
        use crate::state::{AtomicWord, Retired};
        use crate::store::cell::TableCell;
        let marks = Retired {
            tombstone: u64::MAX,
            moved: u64::MAX - 1,
        };
        let old = AtomicWord::new(42);
        assert!(old.is_live(marks));
        // A rebuild moves the state: the old cell says so, the new one holds it.
        let state = old.take_to_move(marks).unwrap();
        assert!(old.is_moved(marks) && !old.is_live(marks));
        let new = AtomicWord::default();
        new.put(state);
        assert_eq!(new.load(), 42);
        // A tombstone (an evicted key) comes back fresh when its key returns.
        let evicted = AtomicWord::new(marks.tombstone);
        assert!(evicted.revive(marks));
        assert_eq!(evicted.load(), 0);
    }

    #[test]
    fn cacheline_example() {
        use crate::store::cell::CacheLine;
        assert_eq!(
            (
                std::mem::size_of::<CacheLine>(),
                std::mem::align_of::<CacheLine>()
            ),
            (0, 64)
        );
    }
}
