//! The eviction hand: a bounded step of judging keys at the `max_keys` bound, and the full
//! sweep an explicit `retain` asks for.

use std::hash::{BuildHasher, Hash};

use super::super::cell::TableCell;
use super::super::keyed_store::Evictor;
use super::shards::*;
use super::slots::*;
use crate::sync::{Arc, Ordering};

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// Judges about `budget` keys, shard after shard from where the last call stopped: first
    /// those of a shard's drain, then `HAND_RUNS` runs spread over its table. At most one
    /// round of the shards and `32 × budget` slots (tombstones and empty slots cost a visit
    /// too): a fixed amount of work, about `budget` slots in a dense table.
    pub(super) fn hand_step(&self, evictor: &impl Evictor<C>, budget: usize) -> usize {
        // The bound is reached: memory is needed now, so any fresh key may go.
        let retired = self.retired;
        let mut taken = Taken::new(&self.shards);
        evictor.judging(|now, idle| {
            let fresh = |c: &C| idle(c, now);
            let (mut judged, mut slots) = (0, 0);
            for _ in 0..SHARDS {
                if judged >= budget || slots >= 32 * budget {
                    break;
                }
                // Relaxed: the hand's position is a schedule; any value is a valid shard.
                let index = self.hand.fetch_add(1, Ordering::Relaxed) % SHARDS;
                let mut shard = self.shards[index].lock();
                taken.evicted += shard.take_evicted();
                if shard.live == 0 {
                    // Nothing to judge: its table may still be a long run of tombstones,
                    // which would spend the step's slots for nothing.
                    continue;
                }
                // A fresh key still in a drain counts too: no insert drains it meanwhile.
                // The drain goes first: while a shard is drained most of its keys are still
                // in the old table, and the new one, nearly empty, would use the slots up
                // and judge next to nothing (the bound then refused a new key with 90 % of
                // the held keys fresh). Every key it visits is judged (evicted or moved).
                let left = |shard: &Shard<K, C>| {
                    let drains = shard.drains.iter();
                    drains.fold((0, 0), |(keys, slots), d| {
                        (keys + d.left, slots + d.from.len() - d.next)
                    })
                };
                while !shard.drains.is_empty() && judged < budget && slots < 32 * budget {
                    let ((keys, unvisited), chunk) = (left(&shard), budget - judged);
                    // At most one key a slot: `chunk` slots judge at most `chunk` keys.
                    self.drain(&mut shard, chunk, Some(&mut |c| fresh(c)));
                    let (keys_now, unvisited_now) = left(&shard);
                    // (A chained table adds keys and slots: counted as none judged.)
                    judged += keys.saturating_sub(keys_now);
                    // A drain that ended skipped its last, keyless, slots.
                    slots += chunk.min(unvisited.saturating_sub(unvisited_now)).max(1);
                }
                // Runs spread over the table, so that keys placed by age (the newest
                // after the hand's tombstones, or every key by a hasher that keeps
                // neighbouring keys together) cannot fill a step with keys that hold
                // state. The first run judges its share of keys, the others walk as many
                // slots. Against the probe direction: a key inserted past the hand's
                // tombstones lands after them, behind the hand.
                let (table, len) = (&shard.table, shard.table.len());
                let judge_run = |from: usize, slots: usize, keys: usize| {
                    let (mut at, mut visited, mut judged, mut gone) = (from % len, 0, 0, 0);
                    let mut set = TagWords::new(&table.tags);
                    while visited < slots && judged < keys {
                        visited += 1;
                        at = at.checked_sub(1).unwrap_or(len - 1);
                        let slot = &table[at];
                        // Only live keys count as judged: a run of tombstones (the hand's
                        // own, kept until the table is next replaced) must not end the step.
                        if set.is_set(at) && slot.state.is_live(retired) {
                            judged += 1;
                            gone += usize::from(fresh(&slot.state));
                        }
                    }
                    work::visited(visited);
                    (visited, judged, gone)
                };
                let hand = shard.hand;
                let run_slots = len.min((32 * budget).saturating_sub(slots)) / HAND_RUNS;
                let run_keys = budget.saturating_sub(judged).div_ceil(HAND_RUNS);
                let (mut run, mut visited, mut gone) = (run_slots.max(1), 0, 0);
                for i in 0..HAND_RUNS {
                    let keys = if i == 0 { run_keys } else { usize::MAX };
                    let (v, j, g) = judge_run(hand + i * (len / HAND_RUNS), run, keys);
                    if i == 0 {
                        run = v;
                    }
                    (visited, judged, gone) = (visited + v, judged + j, gone + g);
                }
                shard.hand = (hand + len - run) % len; // a run walks at most `len` slots
                shard.evict(gone);
                self.note_retired(index, &shard);
                slots += visited;
                taken.evicted += shard.take_evicted();
            }
        });
        taken.report()
    }

    /// Judges every key by `keep` (the drains end first) and evicts those it refuses;
    /// reclaims tombstones and oversized tables, and drops the retired tables no thread caches.
    pub(super) fn sweep_all(&self, mut keep: impl FnMut(&C) -> bool) -> usize {
        let retired = self.retired;
        let mut removed = Taken::new(&self.shards);
        for (index, shard) in self.shards.iter().enumerate() {
            let mut shard = shard.lock();
            // An explicit sweep may take its time: the drains end here, judged by `keep`.
            while !shard.drains.is_empty() {
                self.drain(&mut shard, usize::MAX, Some(&mut |cell| !keep(cell)));
            }
            let mut gone = 0;
            work::visited(shard.table.len());
            let mut set = TagWords::new(&shard.table.tags);
            for (i, slot) in shard.table.iter().enumerate() {
                let live = set.is_set(i) && slot.state.is_live(retired);
                if live && !keep(&slot.state) {
                    gone += 1;
                }
            }
            shard.evict(gone);
            removed.evicted += shard.take_evicted();
            // Reclaim tombstones once they outnumber the live keys, and a table four times
            // the size its live keys need (a growing shard's new table, whose drain this sweep
            // ended, holds its few keys): into a table sized for them.
            let needed = sized_for(shard.live.max(MIN_CAPACITY));
            if shard.used - shard.live > shard.live.max(MIN_CAPACITY)
                || shard.table.len() > 4 * needed
            {
                let since = shard.filled_at;
                self.replace_table(&mut shard, None, since);
                while !shard.drains.is_empty() {
                    self.drain(&mut shard, usize::MAX, None);
                }
            }
            // An explicit sweep may take its time: the tables no thread caches go now.
            shard.freeing.clear();
            shard
                .retiring
                .retain_mut(|table| Arc::get_mut(table).is_none());
            self.note_retired(index, &shard);
        }
        removed.report()
    }
}
