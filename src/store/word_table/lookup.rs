//! Finding a key: lock-free in this thread's cached table, or under the shard lock, in the
//! drains as well as the table.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::super::cell::TableCell;
use super::shards::*;
use super::slots::*;
use crate::sync::Ordering;

/// A lookup that does the shard's upkeep on the way (a drain step, a release step of its
/// retired tables), which runs other keys' code: a check's, before it decides anything, so a
/// panic there interrupts a call that changed nothing.
pub(super) const UPKEEP: bool = true;
/// A lookup that does none (`StoreProtocol::with_existing_alone`): a refund's, which must not be
/// interrupted by another key's panic (a permit's units would be lost for good).
pub(super) const ALONE: bool = false;

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// The key's cell, lock-free in this thread's cached table, else under the shard lock
    /// (absent from the cached table, or tombstoned there: perhaps still in a drain).
    /// `UPKEEP_`: [`UPKEEP`] or [`ALONE`].
    #[inline]
    pub(super) fn existing<const UPKEEP_: bool, Q, R>(
        &self,
        key: &Q,
        era: u64,
        mut f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.hash(key);
        if let Some(result) = self.existing_fast::<UPKEEP_, _, _>(hash, shard, key, era, &mut f) {
            return Some(result);
        }
        self.existing_locked(shard, hash, key, era, UPKEEP_, f)
    }

    /// The authoritative lookup after a miss on the lock-free path: under the shard lock, in
    /// the drain as well as the table. `upkeep`: [`UPKEEP`] or [`ALONE`].
    #[cold]
    #[inline(never)]
    pub(super) fn existing_locked<Q, R>(
        &self,
        index: usize,
        hash: u64,
        key: &Q,
        era: u64,
        upkeep: bool,
        f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut shard = self.shards[index].lock();
        // (No key's code here: a table that moves to a new era joins the drains untouched.)
        self.enter_era(&mut shard, era);
        if upkeep {
            // Lookups drain too (moving keys only: no judge here), so that a drain ends, and
            // its table is freed, even when no insert comes. Before the key is taken from the
            // drains: a step may chain the table, and the key must be in the table looked in.
            self.drain(&mut shard, self.drain_step, None);
        }
        // The key's own code only (its hash, compare and clone as it moves).
        self.take_from_drain(&mut shard, hash, key);
        if upkeep {
            Self::release(&mut shard);
        }
        self.note_retired(index, &shard);
        let at = find(&shard.table, hash, key).ok()?;
        // Under the lock the cell is neither moved nor evicted: `f` sees a live state or a
        // tombstone (absent).
        let mut f = f;
        f(&shard.table[at].state)
    }

    /// The lock-free lookup. `None` when the key is not in this thread's cached table of the
    /// shard, or is tombstoned there. `UPKEEP_`: [`UPKEEP`] or [`ALONE`] (a constant, so
    /// that the hot path is the same code as before).
    #[inline]
    pub(super) fn existing_fast<const UPKEEP_: bool, Q, R>(
        &self,
        hash: u64,
        shard: usize,
        key: &Q,
        era: u64,
        mut f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let retired = self.retired;
        self.cache.with(|cache| {
            // Relaxed: a hint (see `note_retired`). Before the decision: a key's `Drop` that
            // panics as a table is released then interrupts a call that decided nothing. Not
            // at all for a refund: before it, the panic would lose it; after it, the panic
            // would still come out of a permit's drop, and abort the process if that drop runs
            // as another panic unwinds.
            if UPKEEP_ && self.releasing.0[shard].load(Ordering::Relaxed) {
                self.help_release(shard, &cache.help);
            }
            let cached = &cache.tables[shard];
            let mut table = cached.take();
            let mut fetched = false;
            // One loop and one call of `f`, so that its result stays in registers: a second
            // path returning it through memory made the compiler copy every decision through
            // the stack, and the copy stalled on store forwarding (benches/README.md).
            let result = loop {
                if let Some(table) = table.as_deref() {
                    // A table of an older era than the rule's is never decided on: its states
                    // are carried into the new era first, under the lock. (For the rules
                    // without eras, `era` is 0 and this test compiles away.)
                    if table.era() >= era {
                        match find(table, hash, key) {
                            Err(_) => break None,
                            Ok(at) => {
                                let slot = &table[at];
                                let result = f(&slot.state);
                                // Moved is final: the table is stale. A tombstone (or a key
                                // revived since): absent here; the locked path looks again.
                                if result.is_some() || !slot.state.is_moved(retired) {
                                    break result;
                                }
                            }
                        }
                    } else if fetched {
                        break None; // the shard itself is behind: the locked path moves it on
                    }
                }
                // No table of the shard cached yet, or a stale one.
                table = Some(self.current(shard));
                fetched = true;
                // In the loom models that ask for it, other threads run between the fetch
                // and the probe (see `model_yield`); compiled away otherwise.
                if self.yield_after_fetch.is_on() {
                    crate::sync::model_yield();
                }
            };
            cached.set(table);
            result
        })
    }
}
