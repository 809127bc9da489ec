//! The lock-free keyed store: a lookup of an existing key takes no shared lock and writes
//! nothing but the key's own state. A cell is one word for GCRA, the leaky buckets and both
//! window counters (updated by a CAS), and the sliding log's ring (updated by a CAS on its
//! header) ([`TableCell`] says what the table needs of a cell).
//!
//! # Design
//! Keys are spread over [`SHARDS`] shards; each shard owns an open-addressing table (linear
//! probing) of slots `{ state word, key set once }`. Only inserts, evictions and rebuilds lock
//! their shard. Three rules make lock-free lookups safe without epochs:
//!
//! 1. **A slot's key never changes** within a shared table (written once under the lock, then
//!    published by the slot's tag: [`SlotKey`], the table's `unsafe`), so a reader that
//!    matched a key can never act on another key's state (no ABA through slot reuse).
//! 2. **A cell is retired by one CAS** from a live state (a log cell: on its header):
//!    eviction writes the rule's tombstone (only if the state is fresh), a rebuild writes the
//!    rule's `moved` mark (whatever the live state) and copies the state it replaced. A
//!    decision's CAS therefore lands either before the retirement (which then re-reads and
//!    judges or copies the new state) or fails and sees it: no admission is lost to an
//!    eviction or a move. Rules never produce either mark (`WordRule::RETIRED`; a log's marks
//!    are ticks no rule uses).
//! 3. **Tables are reference-counted and each thread caches its shard tables** (a thread-local
//!    per store), so the hot path reads the cached table without touching any shared counter.
//!    A stale cached table is still safe: a key live there is decided there (the drain's CAS
//!    will copy what it wrote), a `moved` slot sends the reader to the shard's current table
//!    (its cache is refreshed under the shard lock), and a key missing or tombstoned there is
//!    looked up again under the lock, in the current table and in the table being drained.
//!
//! # Eviction and growth: a fixed amount of work per call
//! A key whose state is fresh (a full bucket, an empty window) is kept as long as its memory is
//! not needed: a client that comes back finds its slot and pays one CAS. When an insert finds
//! its shard's table full, the table is replaced by an empty one and the old table is
//! **drained**: every later insert into the shard, and every lookup that misses the new table,
//! visits the next [`DRAIN_STEP`] slots of the old one. No call sweeps or copies a whole table,
//! so no call does more than `DRAIN_STEP` slots of eviction and copying work (a table that
//! fills before the drain into it ends joins the drains, oldest drained first:
//! [`WordTable::chain`]). Nor does a call allocate a large table: a growing shard builds its
//! next table a page of slots per insert ([`build_step`]), from [`build_from`] inserts before
//! its table is full (at the bound too, where a heap table reuses its drained one instead:
//! below); only a chained table's replacement may be allocated in the call that needs
//! it, as may a table that moves to a new era (below). (`StoreProtocol::retain`, an explicit
//! sweep, visits every slot.)
//!
//! # Re-anchoring: eras
//! The window counters keep a window index of a few bits, read relative to an anchor (`base`)
//! that their limiter moves up every 2^22 − 2 windows (sliding) or 2^39 − 2 (fixed): the rule's
//! *era* (`Stored::era`, 0 for the other rules). A state is exact only in the era it was
//! written in and the next, and a key may sit idle for any number of eras. So each table
//! records its era, and no decision is made on a table of an older era than the caller's
//! rule: the lookup takes the shard's lock, and the first call into a shard after an era
//! change *forgets* its table, which joins the drains as a full table does
//! ([`WordTable::chain`]; one with no live key just takes the new era). The drain and the
//! lookups then carry each key into a table of the new era, one drain step per call, through
//! the rule's `carry` ([`StoreProtocol::set_carry`]): a state too old to read in the new era is
//! fresh, and becomes 0. So moving the anchor costs the limiter one store of its rule, and no
//! call visits more slots than a drain step. A caller still holding the old rule may decide on
//! a table of the new era: the states there lie within both eras' ranges.
//!
//! - **Below** the store's share of [`StoreProtocol::set_evict_above`] (by default
//!   [`DEFAULT_EVICT_ABOVE`] keys), the new table is larger, sized for every live key to fill
//!   it to 5/8, and the drain moves every key: the store grows as a hash map does, and keeps
//!   every client, fresh or not.
//! - **At or above it**, memory is what is needed: the drain evicts each key that is fresh *and
//!   was not used since the table was last replaced* (a second chance, in time) and moves the
//!   others (rule 2). The new table is sized for the keys the drain will keep (estimated by
//!   judging [`SAMPLE`] slots), and never below the share: a smaller table would fill again
//!   sooner, and its shorter cycles would evict clients that come back (tables sized for the
//!   kept keys alone collapse so, to a few slots). Under a flood of unique keys the store so
//!   holds about `evict_above` keys plus those holding state, and the drains' keys not visited
//!   yet (`tests/flood.rs` holds it to 1.25 × `evict_above` at the defaults). At the default
//!   bound a shard whose evicted keys come back raises its share instead (`returns.rs`), so
//!   a working set of returning clients larger than the bound is kept (`tests/flood.rs` again:
//!   2 and 4 times the bound, every key held by the third round, usually from the second).
//!   There a shard replaces its table every few thousand inserts by one of the same size,
//!   built ahead as a growing shard's is; the drained table is released (a table in mapped
//!   pages) or, on the heap, kept as a spare, cleared a few slots per insert once no thread
//!   caches it, to serve as the next table, so the replacing call fills no table. A mapped
//!   spare would keep two tables a shard resident at the bound.
//!
//! Nor does a call drop a whole table: a table the shard no longer needs (a growing shard's
//! drained one) is released [`CLEAR_STEP`] slots per insert once no thread caches it, and per
//! lookup too (one in [`HELP_EVERY`] of a thread's, if the shard's lock is free; not a
//! refund's: [`StoreProtocol::with_existing_alone`]), so that memory comes back when the key set
//! stops growing and no insert comes. Dropping a table of
//! keys with drop glue loops over its slots (a free per `String` key), and a call that did it
//! at once was the flood's worst tail; keys without it (`u64`, `IpAddr`) need no loop (the
//! slots keep no `OnceLock`, whose drop would loop).
//!
//! Evicting judges a state against the rule in force: the limiter lends the judge through
//! [`Evictor`], and withholds it while a quota change or a window re-anchoring runs (the drain
//! then moves every key, which is always safe). A judge reading a state of an older era can
//! only err towards keeping it: a state too old for the rule's era reads as ahead of the clock,
//! or as recent, never as fresh when it is not.
//!
//! A tombstoned key is revived in place if it comes back (a tombstone in the current table is
//! left by an explicit sweep, [`StoreProtocol::retain`], which also reclaims tombstones once they
//! outnumber the live keys).
//!
//! # Text keys
//! A table of `String` keys keeps texts of up to 23 bytes inline in its own slots
//! (`text.rs`), texts of 24 to 71 bytes in two word tables of wider slots that it makes with
//! their first key (`texts.rs`), and longer ones as `String`s. Each of the three is a word
//! table as above, with its own shards, drains and share of `evict_above`.
//!
//! # Caveats
//! - A thread that stops calling keeps the tables it cached alive until it calls again (an
//!   exited thread's cache passes to the next thread that gets its id): at most one replaced
//!   table per shard per thread, which its shard releases once the thread moves on.
//! - Keys are cloned when they move to a new table (`K: Clone`).
//! - A sliding log's check waits only while its key's ring changes size, gives units back or
//!   changes tick (`LogCell`'s exclusive changes); checks between do not wait for each other.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::cell::TableCell;
use super::keyed_store::{Carry, Evictor, Inserted, StoreProtocol};

// Explicit paths: `loom-tests` includes this file with `#[path]` (see `algorithm.rs`).
#[path = "word_table/hand.rs"]
mod hand;
#[path = "word_table/inspect.rs"]
mod inspect;
#[path = "word_table/lookup.rs"]
mod lookup;
#[path = "word_table/region.rs"]
mod region;
#[path = "word_table/release.rs"]
mod release;
#[path = "word_table/replace.rs"]
mod replace;
#[path = "word_table/returns.rs"]
mod returns;
#[path = "word_table/shards.rs"]
mod shards;
#[path = "word_table/slots.rs"]
mod slots;
#[path = "word_table/text.rs"]
mod text;
#[path = "word_table/texts.rs"]
mod texts;

use self::lookup::{ALONE, UPKEEP};
#[cfg(test)]
pub(super) use self::region::HEAP_ONLY;
pub use self::shards::WordTable;
#[allow(unused_imports)] // `loom-tests` has no use for it
pub use self::shards::DEFAULT_EVICT_ABOVE;
pub(crate) use self::slots::SHARDS;
use self::slots::*;
use self::texts::{AnyText, Class, Foreign, Texts};
// Read by the unit tests (`word_table_tests.rs`) and the loom models.
#[allow(unused_imports)]
pub(crate) use self::{
    inspect::HandView,
    shards::{DRAIN_STEP, HAND_RUNS, MOST_VISITED, SHARE_ROOM},
    slots::{staggered, work, Slot, CLEAR_STEP},
};
#[cfg(test)]
pub(crate) use self::{
    returns::MOST_RAISES,
    shards::{BUILD_ABOVE, HELP_EVERY, SAMPLE},
};

impl<K, H, C> StoreProtocol<K, C> for WordTable<K, H, C>
where
    C: TableCell,
    K: Clone + Hash + Eq + Send + Sync,
    H: BuildHasher + Clone + Send + Sync,
{
    const EVICTS_ON_INSERT: bool = true;
    const RE_ANCHORS: bool = true;

    fn with_existing<Q, R>(&self, key: &Q, era: u64, f: impl FnMut(&C) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if text::inline_strings::<K>() {
            return self.existing_in_class::<UPKEEP, _, _>(key, era, f);
        }
        self.existing::<UPKEEP, _, _>(key, era, f)
    }

    /// No drain step and no release of retired tables: those run other keys' code (`Hash`
    /// and `Clone` as keys move, `Drop` as a table is freed), and a panic there would lose the
    /// refund. The key's own move out of a drain still runs (its own `Hash`, `Eq`, `Clone`).
    fn with_existing_alone<Q, R>(
        &self,
        key: &Q,
        era: u64,
        f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if text::inline_strings::<K>() {
            return self.existing_in_class::<ALONE, _, _>(key, era, f);
        }
        self.existing::<ALONE, _, _>(key, era, f)
    }

    #[inline]
    fn try_existing<Q, R>(&self, key: &Q, era: u64, f: impl FnMut(&C) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if text::inline_strings::<K>() {
            return self.try_existing_in_class(key, era, f);
        }
        let (hash, shard) = self.hash(key);
        self.existing_fast::<UPKEEP, _, _>(hash, shard, key, era, f)
    }

    fn with_inserted<Q, R>(
        &self,
        key: &Q,
        era: u64,
        f: impl FnOnce(&C) -> R,
        evictor: &impl Evictor<C>,
        done: &mut Inserted,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A caller's own `Borrow` type: its class from the `String` it makes, which the own
        // table then keeps if the key is new.
        let mut owned = None;
        let class = match texts::class::<K, Q>(key) {
            Class::Unknown => texts::class::<K, K>(owned.insert(key.to_owned())),
            class => class,
        };
        match class {
            Class::Own | Class::Unknown => self.inserted(key, owned, era, f, evictor, done),
            Class::Mid(text) => self.texts().mid.with_inserted(&text, era, f, evictor, done),
            Class::Long(text) => self
                .texts()
                .long
                .with_inserted(&text, era, f, evictor, done),
        }
    }

    /// Judges about `budget` keys, shard after shard from where the last call stopped: first
    /// those of a shard's drain, then `HAND_RUNS` runs spread over its table. At most one
    /// round of the shards and `32 × budget` slots (tombstones and empty slots cost a visit
    /// too): a fixed amount of work, about `budget` slots in a dense table. (A table of
    /// `String` keys then goes on in its wider tables with what is left of `budget`.)
    fn evict_some(&self, evictor: &impl Evictor<C>, budget: usize) -> usize {
        let mut evicted = self.hand_step(evictor, budget);
        if let Some(texts) = self.texts.get() {
            if evicted < budget {
                evicted += texts.mid.evict_some(evictor, budget - evicted);
            }
            if evicted < budget {
                evicted += texts.long.evict_some(evictor, budget - evicted);
            }
        }
        evicted
    }

    /// Keeps every key, fresh or not, until the store holds about `keys` keys (each shard its
    /// share): below that, a full table grows, as a hash map's does; above it, a full table is
    /// replaced by one of the same size and evicts keys that are fresh and were not used since
    /// it last filled. Memory under a flood of unique keys is then bounded by about `keys`
    /// keys plus those holding state. The default is [`DEFAULT_EVICT_ABOVE`], raised by shards
    /// whose evicted keys come back; a bound set here is never raised. (A table of `String`
    /// keys holds it in each of its tables.)
    fn set_evict_above(&mut self, keys: usize) {
        self.base_share = keys.div_ceil(SHARDS).max(1);
        self.raise = false;
        if let Some(texts) = self.texts.get_mut() {
            texts.mid.set_evict_above(keys);
            texts.long.set_evict_above(keys);
        }
    }

    fn set_carry(&mut self, carry: Carry<C>) {
        self.carry = carry;
        if let Some(texts) = self.texts.get_mut() {
            texts.mid.set_carry(carry);
            texts.long.set_carry(carry);
        }
    }

    fn retain(&self, mut keep: impl FnMut(&C) -> bool) -> usize {
        let own = self.sweep_all(&mut keep);
        own + self.texts.get().map_or(0, |texts| {
            // Their sweeps, not their `retain`, which would hand `&mut &mut keep` on to tables
            // of their own: a closure type without end.
            texts.mid.sweep_all(&mut keep) + texts.long.sweep_all(&mut keep)
        })
    }

    fn len(&self) -> usize {
        self.own_len()
            + (self.texts.get()).map_or(0, |texts| texts.mid.own_len() + texts.long.own_len())
    }
}

impl<K, H, C> WordTable<K, H, C>
where
    C: TableCell,
    K: Clone + Hash + Eq + Send + Sync,
    H: BuildHasher + Clone + Send + Sync,
{
    /// [`StoreProtocol::try_existing`] in a table of `String` keys: in the table of the key's
    /// class. Not inlined, as [`WordTable::existing_in_class`].
    #[inline(never)]
    fn try_existing_in_class<Q, R>(
        &self,
        key: &Q,
        era: u64,
        f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match texts::class::<K, Q>(key) {
            Class::Own => {
                let (hash, shard) = self.hash(key);
                self.existing_fast::<UPKEEP, _, _>(hash, shard, key, era, f)
            }
            Class::Mid(text) => self.texts.get()?.mid.try_existing(&text, era, f),
            Class::Long(text) => self.texts.get()?.long.try_existing(&text, era, f),
            // The slower lookup of every class (`try_existing` may always say less).
            Class::Unknown => self.with_existing(key, era, f),
        }
    }

    /// [`WordTable::existing`] in a table of `String` keys: in the table of the key's class,
    /// `None` while a wider table is not made; a caller's own `Borrow` type asks this table,
    /// then each wider one. Not inlined: the decision `f` is inlined where it is called once,
    /// and in the lookups of every other key type this function is not called.
    #[inline(never)]
    fn existing_in_class<const UPKEEP_: bool, Q, R>(
        &self,
        key: &Q,
        era: u64,
        mut f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match texts::class::<K, Q>(key) {
            Class::Own => self.existing::<UPKEEP_, _, _>(key, era, f),
            Class::Mid(text) => self
                .texts
                .get()?
                .mid
                .existing::<UPKEEP_, _, _>(&text, era, f),
            Class::Long(text) => self
                .texts
                .get()?
                .long
                .existing::<UPKEEP_, _, _>(&text, era, f),
            Class::Unknown => {
                if let Some(found) = self.existing::<UPKEEP_, _, _>(key, era, &mut f) {
                    return Some(found);
                }
                let texts = self.texts.get()?;
                let foreign = Foreign::<K, Q>::new(key);
                let any: &dyn AnyText = &foreign;
                texts
                    .mid
                    .existing::<UPKEEP_, dyn AnyText, _>(any, era, &mut f)
                    .or_else(|| {
                        texts
                            .long
                            .existing::<UPKEEP_, dyn AnyText, _>(any, era, &mut f)
                    })
            }
        }
    }

    /// The wider tables, made with the first key of their classes.
    fn texts(&self) -> &Texts<H, C> {
        // loom does not see std's `OnceLock`, so a model making them would race on their
        // atomics unseen: models keep to texts of up to 23 or over 71 bytes.
        if crate::sync::MODEL_CHECKED {
            panic!("a loom model made a String table's wider tables");
        }
        self.texts.get_or_init(|| {
            Box::new(Texts {
                mid: self.wider(),
                long: self.wider(),
            })
        })
    }

    /// A wider table, set as this one is.
    fn wider<T: Send + Sync>(&self) -> WordTable<T, H, C> {
        let mut table = WordTable::new(self.retired, self.hasher.clone());
        table.base_share = self.base_share;
        table.raise = self.raise;
        table.carry = self.carry;
        table.drain_step = self.drain_step;
        table
    }

    /// [`StoreProtocol::with_inserted`] in this table; `owned` is `key`'s clone if the caller
    /// made one already.
    fn inserted<Q, R>(
        &self,
        key: &Q,
        owned: Option<K>,
        era: u64,
        f: impl FnOnce(&C) -> R,
        evictor: &impl Evictor<C>,
        done: &mut Inserted,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hash, index) = self.hash(key);
        let mut shard = self.shards[index].lock();
        self.enter_era(&mut shard, era);
        // Each call drains a few slots (a fixed amount of work), evicting fresh keys if the
        // limiter lets it judge now; a drain never waits for a rule change.
        if let Some(since) = shard.drains.first().map(|drain| drain.since) {
            since
                .and_then(|since| {
                    evictor.judging(|_, idle| {
                        self.drain(&mut shard, self.drain_step, Some(&mut |c| idle(c, since)))
                    })
                })
                .unwrap_or_else(|| self.drain(&mut shard, self.drain_step, None));
        }
        Self::clear_spare(&mut shard);
        Self::release(&mut shard);
        self.build_next(&mut shard);
        self.take_from_drain(&mut shard, hash, key);
        // `revived`: the key came back to its tombstone (it returns, as `returns.rs` counts).
        let (at, inserted, revived) = match find(&shard.table, hash, key) {
            // A tombstoned key comes back in place, fresh (rule 1: same key).
            Ok(at) => {
                let revived = shard.table[at].state.revive(self.retired);
                (at, revived, revived)
            }
            Err(_) => {
                // The key's clone first: if it panics, the shard is as it was.
                let owned = match owned {
                    Some(owned) => text::NewKey::Key(owned),
                    None => text::NewKey::of(key),
                };
                if over_full(shard.used + 1, shard.table.len()) {
                    // The table is full: it is replaced, and the old one drained from now on,
                    // a few slots per call. Above the shard's share of `evict_above`, keys
                    // unused since the table's previous replacement may go.
                    let since = shard.filled_at;
                    evictor
                        .judging(|now, idle| {
                            shard.filled_at = now;
                            let judge = &mut |c: &C| idle(c, since);
                            self.replace_table(&mut shard, Some(judge), since);
                        })
                        .unwrap_or_else(|| self.replace_table(&mut shard, None, since));
                }
                // Absent under the lock, so `find` ends at an empty slot.
                match find(&shard.table, hash, key) {
                    Err(empty) => {
                        shard.used += 1;
                        // SAFETY: the shard lock is held, and `find` ended at this empty slot.
                        #[allow(unsafe_code)]
                        unsafe {
                            occupy(&shard.table, empty, hash, owned)
                        };
                        (empty, true, false)
                    }
                    Ok(at) => (at, false, false),
                }
            }
        };
        if inserted {
            shard.live += 1;
            if self.raise && returns::sampled(hash) {
                shard.returns.inserted(hash, revived);
            }
        }
        // Told before the decision runs: a clock that panics in it leaves `done` right.
        *done = Inserted {
            inserted,
            evicted: shard.take_evicted(),
        };
        let result = f(&shard.table[at].state);
        self.note_retired(index, &shard);
        let table = shard.table.clone();
        drop(shard);
        // This thread just paid for the lock: leave its cache current.
        self.cache
            .with(|cache| cache.tables[index].set(Some(table)));
        result
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn wordtable_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::store::word_table::WordTable;
        use crate::{clock::QuantaClock, Gcra, KeyedLimiter, Quota};
        let limiter: KeyedLimiter<u64, Gcra, QuantaClock, WordTable<u64, _>> =
            KeyedLimiter::new(Gcra::new(Quota::per_second(5)?)?);
        assert!(limiter.check(&1).unwrap().allowed());
        assert_eq!(limiter.len(), 1);
        Ok(())
    }
}
