//! The memory a table's slots and tags live in: the heap for a small table, pages mapped for it
//! alone for a larger one, so that freeing a table returns its pages to the system.
//!
//! A shard's table grows by ~1.3x steps from a few hundred bytes to megabytes, among 63 other
//! shards doing the same. On the heap, the tables a shard outgrows were kept resident by the
//! allocator, neither coalesced nor returned (glibc raises its own mapping threshold each time a
//! large block is freed): at 100k `u64` keys the process held 46 bytes a key for 24 live. A
//! mapped table is unmapped when it is freed, and a fresh one costs no initialisation loop: its
//! pages are zero (the empty table, for cells that say so) and each is touched only when a key
//! first lands in it.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::store::cell::ZeroedIsFresh;
use crate::sync::MODEL_CHECKED;

/// The smallest page size in use, in bytes: what a table's pages are touched apart by.
pub(super) const PAGE: usize = 4096;

/// Regions of at least this many bytes are mapped (one page of 4 KiB on most systems; with
/// larger pages a small mapped table holds a whole page once touched).
pub(super) const MAP_FROM: usize = PAGE;

#[cfg(test)]
thread_local! {
    /// Set by unit tests of the heap tables that mapping would otherwise serve: regions made on
    /// this thread are all on the heap, as when the system refuses a mapping.
    pub(crate) static HEAP_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the unit tests asked for heap regions only (never outside them).
#[inline(always)]
fn heap_only() -> bool {
    #[cfg(test)]
    return HEAP_ONLY.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// `len` values of `T`: on the heap, or in pages mapped for them alone.
///
/// The values are reached through `first` and `len` whichever owns them, so that a lookup's
/// access is a pointer and a bound, as a boxed slice's (a `match` on the owner at each access
/// cost ~7 % on the `returning` and `deny` rows).
pub(crate) struct Region<T> {
    /// The first value (dangling for none).
    first: NonNull<T>,
    len: usize,
    owner: Owner<T>,
}

/// What holds a region's memory.
enum Owner<T> {
    /// Full to capacity, but after a `truncate`; never borrowed as a slice once `first` is
    /// taken (only `Vec::truncate` and its drop touch it, through its raw pointer).
    Heap(Vec<T>),
    /// The pages, unmapped when the region is dropped; `first` is their start.
    Mapped { _map: memmap2::MmapMut },
}

// SAFETY: a region owns its values as a `Box<[T]>` does (the mapping is its alone, and the
// pointer is into it), so it may move to another thread when they may, and be shared when they
// may be.
#[allow(unsafe_code)]
unsafe impl<T: Send> Send for Region<T> {}
// SAFETY: as above: `&Region<T>` gives out only `&T`.
#[allow(unsafe_code)]
unsafe impl<T: Sync> Sync for Region<T> {}

impl<T> Region<T> {
    /// `len` values in zeroed pages mapped for them alone, if they span at least [`MAP_FROM`]
    /// bytes and the system grants the pages (never in the loom models).
    pub(crate) fn zeroed(len: usize, _promise: ZeroedIsFresh) -> Option<Self> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        if MODEL_CHECKED || bytes < MAP_FROM || heap_only() {
            return None;
        }
        Self::mapped(len, bytes)
    }

    /// Zeroed pages for `len` values; `None` if the system refuses them.
    fn mapped(len: usize, bytes: usize) -> Option<Self> {
        debug_assert!(
            !std::mem::needs_drop::<T>(),
            "the promise rules out drop glue"
        );
        let mut map = memmap2::MmapMut::map_anon(bytes).ok()?;
        let first = NonNull::new(map.as_mut_ptr().cast::<T>())?;
        // A mapping starts on a page, far beyond any slot's alignment (at most a cache line).
        if first.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
            return None;
        }
        Some(Region {
            first,
            len,
            owner: Owner::Mapped { _map: map },
        })
    }

    /// Drops the values from `len` on (a step of freeing a table whose cells have drop glue;
    /// the memory goes with the region).
    pub(crate) fn truncate(&mut self, len: usize) {
        // Shortened first: a value whose drop panics unwinds out of `Vec::truncate`, and the
        // values it was dropping must not stay reachable through `Deref` afterwards.
        self.len = len.min(self.len);
        match &mut self.owner {
            Owner::Heap(values) => values.truncate(len),
            // Mapped values have no drop glue (the promise): they are just left behind.
            Owner::Mapped { .. } => {}
        }
    }

    /// Whether the values are in pages of their own (zero pages: nothing was initialised).
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.owner, Owner::Mapped { .. })
    }
}

impl<T> Default for Region<T> {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl<T> From<Vec<T>> for Region<T> {
    fn from(mut values: Vec<T>) -> Self {
        // `as_mut_ptr` takes no reference to the buffer: the pointer stays valid beside the
        // vector's own later `truncate` and drop. Never null (dangling when empty).
        let first = NonNull::new(values.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Region {
            first,
            len: values.len(),
            owner: Owner::Heap(values),
        }
    }
}

impl<T> Deref for Region<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `first` starts `len` initialised values this region owns, aligned for `T`:
        // a vector's buffer (its length at least `len`: `truncate` shortens both), or a live
        // mapping of at least `len` values' bytes (alignment checked when mapped) whose bytes
        // were zero when mapped, a valid `T` each (the promise), and since then were changed
        // only through `&T` (atomics and cells) or `&mut [T]`, which keep them valid. No
        // `&mut` to them lives while `&self` does.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.first.as_ptr(), self.len)
        }
    }
}

impl<T> DerefMut for Region<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow of the values.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.first.as_ptr(), self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicU64, Ordering};

    /// Run under Miri too (`scripts/test.sh`): the mapped values are written, read, shared and
    /// unmapped.
    #[test]
    fn a_large_region_is_mapped_zeroed_and_a_small_one_is_not() {
        // SAFETY: a zero `AtomicU64` is 0, what `fresh` makes, and it has no drop glue.
        #[allow(unsafe_code)]
        let zeroed = unsafe { ZeroedIsFresh::promise() };
        let large: Region<AtomicU64> = Region::zeroed(1024, zeroed).expect("pages granted");
        assert!(large.is_mapped());
        assert_eq!(large.len(), 1024);
        assert!(large.iter().all(|v| v.load(Ordering::Relaxed) == 0));
        std::thread::scope(|s| {
            s.spawn(|| large[1023].store(7, Ordering::Relaxed));
        });
        assert_eq!(large[1023].load(Ordering::Relaxed), 7);
        let mut large = large;
        *large[0].get_mut() = 3;
        assert_eq!(large[0].load(Ordering::Relaxed), 3);
        drop(large);

        assert!(
            Region::<AtomicU64>::zeroed(8, zeroed).is_none(),
            "under a page: the heap"
        );
        let page = MAP_FROM / std::mem::size_of::<AtomicU64>();
        assert!(Region::<AtomicU64>::zeroed(page, zeroed).is_some_and(|r| r.is_mapped()));
        assert!(Region::<AtomicU64>::zeroed(page - 1, zeroed).is_none());
        let small: Region<AtomicU64> = (0..8).map(|_| AtomicU64::new(1)).collect::<Vec<_>>().into();
        assert!(!small.is_mapped());
        assert!(small.iter().all(|v| v.load(Ordering::Relaxed) == 1));
    }

    /// A heap region's values are dropped as it is truncated (a retired table's cells go a
    /// step at a time), and the rest with it.
    #[test]
    fn truncating_a_heap_region_drops_its_values() {
        struct Counted(std::rc::Rc<std::cell::Cell<usize>>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let dropped = std::rc::Rc::new(std::cell::Cell::new(0));
        let values: Vec<_> = (0..10).map(|_| Counted(dropped.clone())).collect();
        let mut region = Region::from(values);
        region.truncate(6);
        assert_eq!((region.len(), dropped.get()), (6, 4));
        drop(region);
        assert_eq!(dropped.get(), 10);
    }
}
