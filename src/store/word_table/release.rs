//! Releasing retired tables a few slots per call, once no thread caches them, and clearing a
//! spare for reuse.

use std::cell::Cell;
use std::hash::{BuildHasher, Hash};
use std::mem::take;

use super::super::cell::TableCell;
use super::shards::*;
use super::slots::*;
use crate::sync::{Arc, AtomicU64, Ordering};

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// Tells lookups whether shard `index` (locked: `shard`) holds retired tables. Called
    /// before each unlock that may have retired or released one; it writes only on a change,
    /// so the flags stay in every core's cache, shared, for the lookups that read them.
    pub(super) fn note_retired(&self, index: usize, shard: &Shard<K, C>) {
        let pending = !shard.retiring.is_empty() || !shard.freeing.is_empty();
        let flag = &self.releasing.0[index];
        // Relaxed: a hint. A lookup that misses a change helps later or not at all; `release`
        // acts on the shard's own state, under its lock.
        if flag.load(Ordering::Relaxed) != pending {
            flag.store(pending, Ordering::Relaxed);
        }
    }

    /// A lookup's help with shard `index`'s retired tables: one in [`HELP_EVERY`] of this
    /// thread's lookups there drops [`CLEAR_STEP`] of their slots, if the lock is free (a
    /// lookup never waits for it). Without it a store whose key set stopped growing kept its
    /// last drained tables for good: no insert came to release them (at 750k `u64` keys,
    /// 62 bytes a key instead of 35).
    #[cold]
    #[inline(never)]
    pub(super) fn help_release(&self, index: usize, help: &Cell<u32>) {
        let n = help.get().wrapping_add(1);
        help.set(n);
        if n % HELP_EVERY != 0 {
            return;
        }
        if let Some(mut shard) = self.shards[index].try_lock() {
            Self::release(&mut shard);
            self.note_retired(index, &shard);
        }
    }

    /// Drops the next [`CLEAR_STEP`] slots of the shard's retired tables, taking the slots of
    /// a retired table once no thread caches it (the shard holds the last reference).
    pub(super) fn release(shard: &mut Shard<K, C>) {
        if shard.freeing.is_empty() {
            let Some(at) = shard
                .retiring
                .iter_mut()
                .position(|table| Arc::get_mut(table).is_some())
            else {
                return;
            };
            let mut table = shard.retiring.swap_remove(at);
            if let Some(table) = Arc::get_mut(&mut table) {
                let end = table.slots.len();
                // (A slot's key is dropped by hand, by its tag: the slot itself has no glue.)
                if std::mem::needs_drop::<K>() || std::mem::needs_drop::<C>() {
                    let (tags, slots) = (take(&mut table.tags), take(&mut table.slots));
                    shard.freeing.push(Freeing::new(tags, slots, end));
                }
                // Keys and cells without drop glue (`u64` or `IpAddr` keys and word cells):
                // nothing to drop, so the memory goes at once, with `table`.
            }
            // `table` is freed here: no loop.
        }
        if let Some(freeing) = shard.freeing.last_mut() {
            if freeing.step() {
                shard.freeing.pop();
            }
        }
    }

    /// Clears the next [`CLEAR_STEP`] slots of the shard's spare, if no thread caches it.
    pub(super) fn clear_spare(shard: &mut Shard<K, C>) {
        let Some(spare) = &mut shard.spare else {
            return;
        };
        let start = spare.cleared;
        let Some(table) = Arc::get_mut(&mut spare.table).filter(|t| start < t.len()) else {
            return;
        };
        let end = table.len().min(start + CLEAR_STEP);
        // SAFETY: a table's tags are its slots' (set by `occupy` once the key is written).
        #[allow(unsafe_code)]
        unsafe {
            drop_keys(&mut table.tags, &mut table.slots, start..end)
        };
        table.slots[start..end].fill_with(Slot::empty);
        let tags = &mut table.tags[tag_words(start)..tag_words(end)];
        // A step's own tag words only: clearing earlier ones again would be the same table at
        // a cost that grows with it (the work meter counts slots, not tag words).
        debug_assert!(
            tags.len() <= CLEAR_STEP / 8,
            "{} tag words cleared",
            tags.len()
        );
        tags.fill_with(|| AtomicU64::new(0));
        spare.cleared = end;
    }
}
