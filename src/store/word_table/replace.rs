//! Replacing a full table: sizing the next one, draining the old one a few slots per call
//! (moving live keys, evicting fresh ones at the bound), chaining a table that fills before
//! its drain ends, and the tables built ahead or kept as spares.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::super::cell::TableCell;
use super::shards::*;
use super::slots::*;
use super::text::{Held, NewKey};
use crate::clock::Nanos;
use crate::sync::{Arc, Ordering};

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// Replaces `shard`'s table by an empty one and starts draining the old one. Below the
    /// store's [`WordTable::evict_above`] share, the new table holds every live key, as a hash
    /// map grows. At or above it, fresh keys unused since `since` may go: the keys kept are
    /// estimated by judging [`SAMPLE`] slots spread over the old table (evicting the fresh ones
    /// at once), and the new table is sized for them and the inserts until the drain ends, or
    /// to hold the share if that is more (the store does not shrink below what it may hold: a
    /// smaller table's short cycles would evict clients that come back). With a drain still
    /// running (the estimate was low), the table joins it instead ([`WordTable::chain`]).
    pub(super) fn replace_table(
        &self,
        shard: &mut Shard<K, C>,
        judge: Option<&mut Judge<'_, C>>,
        since: Nanos,
    ) {
        if !shard.drains.is_empty() {
            return self.chain(shard, since);
        }
        let mut at_share = shard.live >= self.share(shard);
        if at_share && judge.is_some() {
            if self.raises(shard) {
                // Its evicted keys come back: the shard keeps them, growing as below its share.
                shard.returns.raises += 1;
                at_share = false;
            }
            shard.returns.judged();
        }
        let (slots, since) = match judge {
            Some(fresh) if at_share => {
                let kept = self.estimate_kept(shard, fresh);
                (self.bound_slots(shard, kept), Some(since))
            }
            // (No room for the drain's inserts here: the larger table takes a quarter of its
            // keys in inserts before it fills, and the drain ends after one insert per
            // `DRAIN_STEP` of its slots.)
            _ => (shard.grown_for(shard.live), None),
        };
        let era = shard.table.era();
        let next = Self::fresh_table(shard, slots, era);
        self.start_drain(shard, next, since);
    }

    /// Makes `next` the shard's table and starts draining the one it replaces, whose live keys
    /// are the shard's not in a drain already.
    pub(super) fn start_drain(
        &self,
        shard: &mut Shard<K, C>,
        next: Arc<Table<K, C>>,
        since: Option<Nanos>,
    ) {
        let in_drains: usize = shard.drains.iter().map(|drain| drain.left).sum();
        let from = std::mem::replace(&mut shard.table, next);
        shard.drains.push(Drain {
            start: shard.hand % from.len(),
            from,
            next: 0,
            since,
            left: shard.live - in_drains,
        });
        shard.used = 0;
    }

    /// The slots of the table a shard at its `evict_above` share moves to from its table when
    /// the drain will keep `kept` keys: room for [`SHARE_ROOM`]'s inserts (or the drain's, if
    /// more: a loom model's short steps) twice, and never less than the share (what
    /// [`WordTable::build_next`] builds ahead).
    pub(super) fn bound_slots(&self, shard: &Shard<K, C>, kept: usize) -> usize {
        let len = shard.table.len();
        let room = self.drain_inserts(len).max(len / SHARE_ROOM + 1);
        holding(kept.saturating_add(2 * room).max(self.share(shard)))
    }

    /// The fallback when the shard's table fills while a drain into it runs (the estimate
    /// that sized it was low): the table joins the drains, and is replaced by one sized for
    /// every live key and for the inserts until every drain ends, which neither the drains nor
    /// those inserts can overfill. Rare. No key is visited here, so the call's work stays one
    /// drain step; but the new table may have to be allocated (a spare or a table built ahead
    /// serves if one fits): the one call that initialises a table's slots at once. Its drain
    /// evicts, as the drain before it does, keys unused since `since`.
    #[cold]
    #[inline(never)]
    pub(super) fn chain(&self, shard: &mut Shard<K, C>, since: Nanos) {
        let era = shard.table.era();
        self.chain_into(shard, since, era);
    }

    /// [`WordTable::chain`], into a table of era `era`.
    pub(super) fn chain_into(&self, shard: &mut Shard<K, C>, since: Nanos, era: u64) {
        let unvisited = |drain: &Drain<K, C>| drain.from.len() - drain.next;
        let room = shard
            .drains
            .iter()
            .map(|drain| self.drain_inserts(unvisited(drain)))
            .sum::<usize>()
            + self.drain_inserts(shard.table.len());
        let evicting = shard
            .drains
            .last()
            .is_some_and(|drain| drain.since.is_some());
        let next = Self::fresh_table(shard, shard.grown_for(shard.live.saturating_add(room)), era);
        self.start_drain(shard, next, evicting.then_some(since));
    }

    /// Moves the shard into era `era` if its table is of an older one (see "Re-anchoring" in
    /// the module docs).
    #[inline]
    pub(super) fn enter_era(&self, shard: &mut Shard<K, C>, era: u64) {
        if shard.table.era() < era {
            self.forget(shard, era);
        }
    }

    /// A table with no live key takes the new era in place. Any other joins the drains, as a
    /// full table does ([`WordTable::chain`]): its keys are carried into a table of the new
    /// era as the drain visits them or as they are looked up, a drain step per call. No key
    /// is visited here.
    #[cold]
    #[inline(never)]
    pub(super) fn forget(&self, shard: &mut Shard<K, C>, era: u64) {
        if shard.live == 0 && shard.drains.is_empty() {
            // Relaxed: see `Table::era`.
            shard.table.era.store(era, Ordering::Relaxed);
            return;
        }
        let since = shard.filled_at;
        self.chain_into(shard, since, era);
    }

    /// How many of the shard's live keys a drain judged by `fresh` would keep, from a sample
    /// of its table (whose fresh keys are evicted now). Errs high: `(k + 4) / (n + 4)` of the
    /// live keys when `k` of the `n` live keys sampled are kept.
    pub(super) fn estimate_kept(&self, shard: &mut Shard<K, C>, fresh: &mut Judge<'_, C>) -> usize {
        let retired = self.retired;
        let table = &shard.table;
        let step = (table.len() / SAMPLE).max(1);
        let (mut sampled, mut kept, mut gone) = (0usize, 0usize, 0usize);
        for i in (0..table.len()).step_by(step).take(SAMPLE) {
            let slot = &table[i];
            work::visited(1);
            if table.key(i).is_none() || !slot.state.is_live(retired) {
                continue;
            }
            sampled += 1;
            if fresh(&slot.state) {
                gone += 1;
            } else {
                kept += 1;
            }
        }
        shard.evict(gone);
        let estimate = shard.live as u128 * (kept as u128 + 4) / (sampled as u128 + 4);
        estimate as usize
    }

    /// Visits up to `budget` slots of the shard's oldest drain (it ends there if it ends
    /// within them): a live key is evicted if `judge` finds it fresh (this is when its memory
    /// is needed), else moved (rule 2).
    pub(super) fn drain(
        &self,
        shard: &mut Shard<K, C>,
        budget: usize,
        mut judge: Option<&mut Judge<'_, C>>,
    ) {
        let mut visited = 0;
        while let Some(drain) = shard.drains.first() {
            if drain.left == 0 || drain.next == drain.from.len() {
                let drain = shard.drains.remove(0);
                Self::drained(shard, drain);
                break;
            }
            if visited == budget {
                break;
            }
            if over_full(shard.used + 1, shard.table.len()) {
                // The table would overfill: it joins the drains.
                let since = shard.filled_at;
                self.chain(shard, since);
                continue;
            }
            // The drain is left in place: a key's `Hash`, `Eq` or `Clone` that panics in the
            // visit leaves the slot as it was, to be visited again.
            let at = drain.index(drain.next);
            let visit = self.visit(&drain.from, at, &shard.table, judge.as_deref_mut());
            let drain = &mut shard.drains[0];
            drain.next += 1;
            visited += 1;
            work::visited(1);
            match visit {
                Visit::Empty => {}
                Visit::Moved => {
                    shard.used += 1;
                    drain.left -= 1;
                }
                Visit::Evicted(sampled) => {
                    drain.left -= 1;
                    shard.evict(1);
                    if let Some(hash) = sampled {
                        let share = self.share(shard);
                        shard.returns.evicted(hash, share);
                    }
                }
            }
        }
    }

    /// A drain ended. One that evicted (the shard is at its `evict_above` share, where a
    /// table is replaced by one of about its size) leaves its table as the shard's spare if it
    /// is on the heap; a table in mapped pages, and a growing shard's old table (it will not
    /// be wanted again), is retired, to be released a few slots per insert. A mapped spare
    /// would stay resident, cleared, beside the table: at 4M `u64` keys (twice the default
    /// `evict_above`) 39 bytes a key against 22 without; the next table is built ahead in
    /// fresh pages instead, as a growing shard's is.
    pub(super) fn drained(shard: &mut Shard<K, C>, drain: Drain<K, C>) {
        if drain.since.is_some() && !drain.from.slots.is_mapped() {
            let spare = Spare {
                table: drain.from,
                cleared: 0,
            };
            if let Some(old) = shard.spare.replace(spare) {
                shard.retiring.push(old.table);
            }
        } else {
            shard.retiring.push(drain.from);
        }
    }

    /// An empty table of at least `slots` slots: the spare if it is cleared, or the table
    /// built ahead if it is complete, and not more than half as large again; else a new one
    /// (and the spare or the table built ahead is freed).
    pub(super) fn fresh_table(shard: &mut Shard<K, C>, slots: usize, era: u64) -> Arc<Table<K, C>> {
        let len = table_len(slots);
        let fits = |table_len: usize| (len..=len + len / 2).contains(&table_len);
        if let Some(spare) = shard.spare.take() {
            if spare.cleared == spare.table.len() && fits(spare.table.len()) {
                // A key left in it would be found by probes (or fill it past its count).
                debug_assert!(
                    spare
                        .table
                        .tags
                        .iter()
                        .all(|t| t.load(Ordering::Relaxed) == 0),
                    "a reused spare holds keys"
                );
                // Relaxed: no thread caches the spare; the lock publishes it.
                spare.table.era.store(era, Ordering::Relaxed);
                shard.spares_reused.add(1);
                return spare.table;
            }
            shard.retiring.push(spare.table);
        }
        if let Some(next) = shard.next.take() {
            if next.is_built() && fits(next.len) {
                return Arc::new(next.into_table(era));
            }
            shard.built_unused.add(1);
            shard.freeing.push(next.into_freeing());
        }
        let table = new_table(slots, era);
        shard.allocated_large.add(usize::from(len > BUILD_ABOVE));
        table
    }

    /// Builds [`build_step`] more slots of the table the shard will move to, once its table is
    /// [`build_from`] inserts from full (the next table's steps and an eighth), so that the insert
    /// that finds it full allocates and fills nothing (a large table is up to ~1 MB at the default
    /// bound: hundreds of µs in one call otherwise). The table [`WordTable::replace_table`] will
    /// want: below the `evict_above` share, one for the live keys the shard will hold when full; at
    /// it, one for the share and the drain's inserts, unless the shard has a spare of that size to
    /// reuse (then nothing is built: a table built there was never used, and held ~1 MB a shard).
    pub(super) fn build_next(&self, shard: &mut Shard<K, C>) {
        let len = shard.table.len();
        if shard.next.is_none() {
            let left = capacity(len).saturating_sub(shard.used);
            // No sizing before a table twice the current one would start: a grown table is
            // about 1.27 times it, up to 1.6 at the first staggered length (a larger one would
            // be built late, and made in the call that needs it).
            if !shard.drains.is_empty() || left > build_from::<K, C>(2 * len) {
                return;
            }
            let at_full = shard.live + left;
            let target = if at_full < self.share(shard) || self.raises(shard) {
                table_len(shard.grown_for(at_full))
            } else if shard.spare.is_none() {
                table_len(self.bound_slots(shard, self.share(shard)))
            } else {
                return;
            };
            // A small table is allocated when needed (in mapped pages, at most 16 of them
            // are first touched by the calls that fill it).
            if target <= BUILD_ABOVE || left > build_from::<K, C>(target) {
                return;
            }
            shard.next = Some(Building::new(target));
        }
        if let Some(next) = &mut shard.next {
            next.step();
        }
    }

    /// Evicts or moves the key of slot `at` of `from` (a drained table) into `to`, which must
    /// have room for it (not `over_full` with one more key: `find` then ends at an empty slot).
    pub(super) fn visit<'j>(
        &self,
        from: &Table<K, C>,
        at: usize,
        to: &Table<K, C>,
        judge: Option<&mut Judge<'j, C>>,
    ) -> Visit {
        let Some(key) = from.key(at) else {
            return Visit::Empty;
        };
        let slot = &from[at];
        let retired = self.retired;
        let mut hash = None;
        if let Some(fresh) = judge {
            // A sampled key's hash, for the shard's memory of the keys it evicts (`returns.rs`),
            // is taken before the judge retires it: the key's code runs (and may panic) while
            // nothing has changed, as below.
            if self.raise && from.sampled(at) {
                hash = Some(match key {
                    Held::Key(key) => self.hash(key).0,
                    Held::Text(text) => self.hash(text).0,
                });
            }
            // A judge retires the cell itself (one CAS to the tombstone), so an admission
            // racing it either lands first, and the key is not fresh any more, or sees the
            // tombstone.
            if fresh(&slot.state) {
                return Visit::Evicted(hash);
            }
        }
        if !slot.state.is_live(retired) {
            return Visit::Empty; // a tombstone (dropped with its table), or moved already
        }
        // The key's own code first (hash, compare, clone): if it panics, the cell is still live
        // here, and nothing was written to `to`. (Under the shard lock a live cell stays live:
        // only the lock's holder retires cells.)
        let (hash, place, key) = match key {
            Held::Key(key) => {
                let hash = hash.unwrap_or_else(|| self.hash(key).0);
                (hash, find(to, hash, key), NewKey::Key(key.clone()))
            }
            Held::Text(text) => {
                let hash = hash.unwrap_or_else(|| self.hash(text).0);
                (hash, find_text(to, hash, text), NewKey::Text(text))
            }
        };
        let Some(state) = slot.state.take_to_move(retired) else {
            return Visit::Empty;
        };
        // A key is in at most one of the tables: the insert path moves a key still in a drain
        // before it looks in the table.
        if let Err(empty) = place {
            to[empty].state.put(state);
            let (from, to_era) = (from.era(), to.era());
            if from != to_era {
                // Not shared yet: the slot's tag is set below.
                (self.carry)(&to[empty].state, from, to_era);
            }
            // SAFETY: the caller holds the shard lock, and `find` ended at this empty slot.
            #[allow(unsafe_code)]
            unsafe {
                occupy(to, empty, hash, key)
            };
        }
        Visit::Moved
    }

    /// Moves `key` out of the shard's drains if it is still there and live, so that it is
    /// decided in the shard's table.
    pub(super) fn take_from_drain<Q>(&self, shard: &mut Shard<K, C>, hash: u64, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // Where the key is live: a drain older than another may still hold the key's slot,
        // moved or tombstoned, after it came back and moved into a table drained since.
        let retired = self.retired;
        let found = shard.drains.iter().enumerate().find_map(|(d, drain)| {
            let at = find(&drain.from, hash, key).ok()?;
            drain.from[at].state.is_live(retired).then_some((d, at))
        });
        let Some((d, at)) = found else {
            return;
        };
        if over_full(shard.used + 1, shard.table.len()) {
            // No room to move one key: the table joins the drains (behind `d`).
            let since = shard.filled_at;
            self.chain(shard, since);
        }
        let drain = &shard.drains[d];
        work::visited(1);
        if let Visit::Moved = self.visit(&drain.from, at, &shard.table, None) {
            shard.used += 1;
            let drain = &mut shard.drains[d];
            drain.left -= 1;
            if drain.left == 0 {
                let drain = shard.drains.remove(d);
                Self::drained(shard, drain);
            }
        }
    }

    /// The calls into a shard until a drain of a table of `len` slots ends (each visits
    /// `drain_step` slots).
    pub(super) fn drain_inserts(&self, len: usize) -> usize {
        len / self.drain_step + 1
    }
}
