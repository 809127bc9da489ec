//! The lock-free keyed store: a lookup of an existing key takes no shared lock and writes
//! nothing but the key's own state. A cell is one word for GCRA, the leaky buckets and both
//! window counters (updated by a CAS), and the sliding log's ring under its own per-key lock
//! ([`TableCell`] says what the table needs of a cell).
//!
//! # Design
//! Keys are spread over [`SHARDS`] shards; each shard owns an open-addressing table (linear
//! probing) of slots `{ state word, key set once }`. Only inserts, evictions and rebuilds lock
//! their shard. Three rules make lock-free lookups safe without epochs:
//!
//! 1. **A slot's key never changes** within a shared table (written once under the lock, then
//!    published by the slot's tag: [`SlotKey`], the crate's one `unsafe`), so a reader that
//!    matched a key can never act on another key's state (no ABA through slot reuse).
//! 2. **A cell is retired by one CAS** from a live state (a log cell: under its lock):
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
//! next table [`BUILD_STEP`] slots per insert once its table is 27/28 of its capacity (the
//! first table at the bound too), and a shard at the bound reuses its spare (below); only a
//! chained table's replacement may be allocated in the call that needs it, as may a table
//! that moves to a new era (below). (`KeyedStore::retain`, an explicit sweep, visits every
//! slot.)
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
//! the rule's `carry` ([`KeyedStore::set_carry`]): a state too old to read in the new era is
//! fresh, and becomes 0. So moving the anchor costs the limiter one store of its rule, and no
//! call visits more slots than a drain step. A caller still holding the old rule may decide on
//! a table of the new era: the states there lie within both eras' ranges.
//!
//! - **Below** the store's share of [`KeyedStore::set_evict_above`] (by default
//!   [`DEFAULT_EVICT_ABOVE`] keys), the new table is larger, sized for every live key to fill
//!   it to 5/8, and the drain moves every key: the store grows as a hash map does, and keeps
//!   every client, fresh or not.
//! - **At or above it**, memory is what is needed: the drain evicts each key that is fresh *and
//!   was not used since the table was last replaced* (a second chance, in time) and moves the
//!   others (rule 2). The new table is sized for the keys the drain will keep (estimated by
//!   judging [`SAMPLE`] slots), and never below the share: a smaller table would fill again
//!   sooner, and its shorter cycles would evict clients that come back (tables sized for the
//!   kept keys alone collapsed so, to a few slots, with 1,500 keys a shard cycling through
//!   them). Under a
//!   flood of unique keys the store so holds about `evict_above` keys plus those holding state
//!   (measured: 1.15 to 1.4 × that, with the drains' keys not visited yet and their room).
//!   There a shard replaces its table every few thousand inserts by one of the same size: the
//!   drained table is kept as a spare and cleared a few slots per insert once no thread
//!   caches it, and serves as the next table, so the replacing call allocates and fills
//!   nothing. Memory at the bound is then two tables a shard.
//!
//! Nor does a call drop a whole table: a table the shard no longer needs (a growing shard's
//! drained one) is released [`CLEAR_STEP`] slots per insert once no thread caches it, and per
//! lookup too (one in [`HELP_EVERY`] of a thread's, if the shard's lock is free), so that
//! memory comes back when the key set stops growing and no insert comes. Dropping a table of
//! keys with drop glue loops over its slots (a free per `String` key), and a call that did it
//! at once was the flood's worst tail; keys without it (`u64`, `IpAddr`) need no loop since the
//! slots keep no `OnceLock` (its drop looped: 76 µs for 40k `u64` slots here).
//!
//! Evicting judges a state against the rule in force: the limiter lends the judge through
//! [`Evictor`], and withholds it while a quota change or a window re-anchoring runs (the drain
//! then moves every key, which is always safe). A judge reading a state of an older era can
//! only err towards keeping it: a state too old for the rule's era reads as ahead of the clock,
//! or as recent, never as fresh when it is not.
//!
//! A tombstoned key is revived in place if it comes back (a tombstone in the current table is
//! left by an explicit sweep, [`KeyedStore::retain`], which also reclaims tombstones once they
//! outnumber the live keys).
//!
//! # Caveats
//! - A thread that stops calling keeps the tables it cached alive until it calls again (an
//!   exited thread's cache passes to the next thread that gets its id): at most one replaced
//!   table per shard per thread, which its shard releases once the thread moves on.
//! - Keys are cloned when they move to a new table (`K: Clone`).
//! - A sliding log's check takes its key's lock (`LogCell`): two checks on one key wait for
//!   each other, checks on different keys do not.

use std::borrow::Borrow;
use std::cell::Cell;
use std::hash::{BuildHasher, Hash};

use super::cell::TableCell;
use super::keyed_store::{Carry, Evictor, Inserted, KeyedStore};
use crate::clock::Nanos;
use crate::state::AtomicWord;
use crate::sync::{
    Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, PerThread, MODEL_CHECKED,
};

// Explicit path: `loom-tests` includes this file with `#[path]` (see `algorithm.rs`).
#[path = "word_table/slots.rs"]
mod slots;

use self::slots::*;
pub(crate) use self::slots::{work, Slot, CLEAR_STEP, SHARDS};

/// Slots of a replaced table that each insert into its shard visits (moves or evicts): the
/// most eviction and copying work any one call does, whatever the table's size. (A loom model
/// may take fewer: [`WordTable::set_drain_step_for_model`].)
const DRAIN_STEP: usize = 16;
/// The most slots a check, peek, refund or insert visits (without `max_keys`): a drain step,
/// the key taken out of a drain, and the sample a table replaced at the `evict_above` share
/// judges. (Held to it by the tests; `KeyedLimiter`'s "Work per call" states it.)
#[allow(dead_code)] // read by the unit tests
pub(crate) const MOST_VISITED: usize = DRAIN_STEP + 1 + SAMPLE;
/// Runs of slots, spread evenly over a table, that a step of the eviction hand judges.
pub(crate) const HAND_RUNS: usize = 4;
/// A thread's lookups into a shard holding retired tables: one in `HELP_EVERY` drops
/// [`CLEAR_STEP`] of their slots (if the shard's lock is free), so that the tables go even
/// when no insert comes. (Every lookup under loom, whose models cache no table across calls
/// and so never count to more than one.)
const HELP_EVERY: u32 = if MODEL_CHECKED { 1 } else { 4 };
/// Slots of its next table that each insert into a growing shard builds, once the shard's
/// table is [`BUILD_FROM`] of its [`capacity`]: from there it takes `len / 32` inserts, and the
/// next table (about `1.27 len` slots) needs `1.27 len / BUILD_STEP` = `len / 50` of them, so it
/// is ready first. Late, so that both tables are held for a short while only (a growing shard
/// holds a next table over a sixth of its growth).
const BUILD_STEP: usize = 64;
const BUILD_FROM: (usize, usize) = (27, 28);
/// Tables up to this many slots are allocated when needed (64 KiB of `u64` slots: a few µs).
const BUILD_ABOVE: usize = 4096;
/// Keys a store holds before it evicts fresh ones, by default (see
/// [`KeyedLimiterBuilder::evict_above`](crate::KeyedLimiterBuilder::evict_above)): with `u64`
/// keys, 32 MiB of 16-byte slots at full load, more with the tables' headroom.
///
/// # Examples
/// ```
/// use tollgate::store::DEFAULT_EVICT_ABOVE;
/// // 2^21: about two million keys before fresh ones are evicted.
/// assert_eq!(DEFAULT_EVICT_ABOVE, 2_097_152);
/// ```
pub const DEFAULT_EVICT_ABOVE: usize = 1 << 21;
/// Slots judged to estimate how many keys of a full table are fresh, before sizing its
/// replacement.
const SAMPLE: usize = 32;

struct Shard<K, C: TableCell> {
    /// Where lookups and inserts go.
    table: Arc<Table<K, C>>,
    /// Replaced tables being emptied into `table`, a few slots per call, the oldest first:
    /// none or one, but for the rare table that fills before the drain into it ends (then it
    /// joins the drains: [`WordTable::chain`]).
    drains: Vec<Drain<K, C>>,
    /// Slots with a key (live or tombstoned) in `table`.
    used: usize,
    /// Live keys: in `table`, and in the drains' slots not yet visited.
    live: usize,
    /// Keys evicted that no call has reported yet ([`Shard::evict`]).
    evicted: usize,
    /// Where `evict_some` goes on judging `table`.
    hand: usize,
    /// When `table` last had to be replaced (it was full): a key unused since then may go at
    /// the next replacement, a key used since is kept.
    filled_at: Nanos,
    /// At the `evict_above` share, the last drained table, kept to serve as the next one.
    spare: Option<Spare<K, C>>,
    /// Below it, the next (larger) table, built a few slots per insert before it is needed.
    next: Option<Building<K, C>>,
    /// Tables the shard no longer uses (a growing shard's drained tables, a spare or a table
    /// built ahead that did not fit), released [`CLEAR_STEP`] slots per insert (and lookups
    /// help: [`WordTable::help_release`]) once no thread caches them: dropping a table of keys
    /// with drop glue is a loop over its slots (a free per `String` key), which no call
    /// should pay at once.
    retiring: Vec<Arc<Table<K, C>>>,
    /// Slots of retired tables being dropped, the last one first.
    freeing: Vec<Freeing<K, C>>,
    /// Tables of more than [`BUILD_ABOVE`] slots allocated in one call (for tests: growth
    /// builds them ahead, and the bound reuses them, so only chained drains should).
    allocated_large: usize,
    /// Spares reused as the next table (for the loom models, which must reach it).
    spares_reused: usize,
}

impl<K, C: TableCell> Shard<K, C> {
    /// Counts `n` keys evicted. They are reported by the next call that reports evictions
    /// ([`Shard::take_evicted`]): a call that a key's code interrupts (a panic in its `Hash`,
    /// `Eq`, `Clone` or `Drop`) leaves them to the next, and the limiter's key count, which
    /// may then read high for a while, never reads below the keys held.
    fn evict(&mut self, n: usize) {
        self.live -= n;
        self.evicted += n;
    }

    /// The keys evicted since the last call.
    fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

/// Evictions a call over several shards ([`KeyedStore::evict_some`], [`KeyedStore::retain`])
/// has taken from their counts but not reported yet. If a key's code interrupts the call (a
/// panic in its `Hash`, `Eq` or `Clone` as a drain moves it), they are put back as it unwinds,
/// in shard 0's count, for a later call to report.
struct Taken<'a, K, C: TableCell> {
    shards: &'a [Mutex<Shard<K, C>>],
    evicted: usize,
}

impl<'a, K, C: TableCell> Taken<'a, K, C> {
    fn new(shards: &'a [Mutex<Shard<K, C>>]) -> Self {
        Taken { shards, evicted: 0 }
    }

    /// The evictions taken, now reported.
    fn report(mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

impl<K, C: TableCell> Drop for Taken<'_, K, C> {
    fn drop(&mut self) {
        if self.evicted > 0 {
            // Unwinding: the shard locks of the interrupted call were released first.
            self.shards[0].lock().evicted += self.evicted;
        }
    }
}

/// A table being built [`BUILD_STEP`] slots per insert (see [`WordTable::build_next`]).
struct Building<K, C: TableCell> {
    tags: Vec<AtomicU64>,
    slots: Vec<Slot<K, C>>,
    /// The slots it will have (a multiple of 8).
    len: usize,
}

/// A drained table being cleared [`CLEAR_STEP`] slots per insert, once no thread caches it
/// (it is then reachable from its shard alone, under the lock). At the bound a shard replaces
/// its table every few thousand inserts, with one of the same size: taking a cleared spare,
/// that call neither allocates nor fills a table (up to ~1 MB at the default bound), and no
/// call drops a whole table's keys.
struct Spare<K, C: TableCell> {
    table: Arc<Table<K, C>>,
    cleared: usize,
}

/// A replaced table whose slots before `next` are visited: each live key there has been moved
/// to the shard's table or, if fresh, evicted.
struct Drain<K, C: TableCell> {
    from: Arc<Table<K, C>>,
    /// Slots visited.
    next: usize,
    /// Where the eviction hand stood in `from`: the drain goes on from there, as the hand
    /// would have, so it meets the keys judged longest ago first (the likeliest fresh), not
    /// the run the hand just swept.
    start: usize,
    /// The drain evicts keys unused since this instant (the table's previous replacement);
    /// `None`: it moves every key (the table grew).
    since: Option<Nanos>,
    /// Live keys not visited yet: the drain ends (and its table is freed) when none is left,
    /// even if no call visits the empty slots after the last one.
    left: usize,
}

impl<K, C: TableCell> Drain<K, C> {
    /// The index of the `i`th slot the drain visits: the hand's way, down from `start`, round
    /// the table.
    fn index(&self, i: usize) -> usize {
        // `i < len` and `start < len`; no division on the insert path.
        match self.start.checked_sub(i + 1) {
            Some(at) => at,
            None => self.start + self.from.len() - 1 - i,
        }
    }
}

/// A shard as the eviction hand finds it ([`WordTable::hand_view`], for tests): `None` for a
/// slot without a key.
#[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
#[derive(Debug, PartialEq)]
pub(crate) struct HandView<T> {
    pub(crate) hand: usize,
    pub(crate) table: Vec<Option<T>>,
    /// Each drain's unvisited slots, in the order it visits them.
    pub(crate) drains: Vec<Vec<Option<T>>>,
}

/// Retires a cell whose key may go (a fresh one) and says whether it did.
type Judge<'j, C> = dyn FnMut(&C) -> bool + 'j;

/// What a drain did with one slot.
enum Visit {
    Empty,
    Moved,
    Evicted,
}

/// Each thread's cached table per shard (see the module docs, rule 3). A lookup takes its
/// shard's table out of the cell and puts it back when done; a lookup nested in it (a clock
/// that calls its own limiter) finds the cell empty and fetches the table itself. `help`
/// counts the thread's lookups into shards with retired tables ([`HELP_EVERY`]).
struct Cache<K, C: TableCell> {
    tables: [Cell<Cached<K, C>>; SHARDS],
    help: Cell<u32>,
}

/// One flag a shard, on cache lines of their own: every lookup reads its shard's flag, and a
/// neighbour written by inserts (a shard's lock) would take the line from the readers' caches.
#[repr(align(128))]
struct Flags([AtomicBool; SHARDS]);

/// A thread's table of one shard, if it has fetched one.
type Cached<K, C> = Option<Arc<Table<K, C>>>;

impl<K, C: TableCell> Default for Cache<K, C> {
    fn default() -> Self {
        Cache {
            tables: std::array::from_fn(|_| Cell::new(None)),
            help: Cell::new(0),
        }
    }
}

/// The lock-free keyed store, for cells of one word (`C` = [`AtomicWord`]) or a sliding log's
/// ring. Built by [`KeyedLimiter`]'s builder; see the module documentation for the protocol.
///
/// # Examples
/// The store every keyed limiter uses unless told otherwise (its type is the limiter's fourth
/// parameter):
///
/// [`KeyedLimiter`]: crate::KeyedLimiter
pub struct WordTable<K: Send + Sync, H, C: TableCell = AtomicWord> {
    shards: Box<[Mutex<Shard<K, C>>]>,
    /// The shard where the next `evict_some` starts (modulo `SHARDS`).
    hand: AtomicUsize,
    hasher: H,
    retired: C::Marks,
    cache: PerThread<Cache<K, C>>,
    /// Per shard: whether it holds retired tables to release (a hint for lookups, kept by
    /// [`WordTable::note_retired`]).
    releasing: Flags,
    /// Live keys a shard holds before it evicts fresh ones (its share of `evict_above`).
    keep: usize,
    /// Slots of a drain each call visits: [`DRAIN_STEP`] (fewer in some loom models).
    drain_step: usize,
    /// Carries a state moved out of a table of an older era into the newer one.
    carry: Carry<C>,
}

impl<K: Send + Sync, H, C: TableCell> std::fmt::Debug for WordTable<K, H, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordTable")
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

impl<K: Send + Sync, H, C: TableCell> WordTable<K, H, C> {
    /// An empty store whose cells use `retired`'s marks, hashing with `hasher`. The marks must
    /// be those of the rule the store will serve (states that rule never produces), so build
    /// one through [`KeyedLimiterBuilder::build`](crate::KeyedLimiterBuilder::build) (or
    /// `Stored::new_store`); this constructor is public for the loom models.
    #[doc(hidden)]
    pub fn new(retired: C::Marks, hasher: H) -> Self {
        WordTable {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        table: new_table(MIN_CAPACITY, 0),
                        drains: Vec::new(),
                        used: 0,
                        live: 0,
                        evicted: 0,
                        hand: 0,
                        filled_at: 0,
                        spare: None,
                        next: None,
                        retiring: Vec::new(),
                        freeing: Vec::new(),
                        allocated_large: 0,
                        spares_reused: 0,
                    })
                })
                .collect(),
            hand: AtomicUsize::new(0),
            hasher,
            retired,
            cache: PerThread::new(),
            releasing: Flags(std::array::from_fn(|_| AtomicBool::new(false))),
            keep: DEFAULT_EVICT_ABOVE / SHARDS,
            drain_step: DRAIN_STEP,
            carry: |_, _, _| {},
        }
    }

    /// The shard's current table (under its lock): off the fast path.
    #[cold]
    #[inline(never)]
    fn current(&self, shard: usize) -> Arc<Table<K, C>> {
        self.shards[shard].lock().table.clone()
    }
}

impl<K: Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, (hash >> (64 - SHARD_BITS)) as usize)
    }
}

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// Replaces `shard`'s table by an empty one and starts draining the old one. Below the
    /// store's [`WordTable::evict_above`] share, the new table holds every live key, as a hash
    /// map grows. At or above it, fresh keys unused since `since` may go: the keys kept are
    /// estimated by judging [`SAMPLE`] slots spread over the old table (evicting the fresh ones
    /// at once), and the new table is sized for them and the inserts until the drain ends, or
    /// to hold the share if that is more (the store does not shrink below what it may hold: a
    /// smaller table's short cycles would evict clients that come back). With a drain still
    /// running (the estimate was low), the table joins it instead ([`WordTable::chain`]).
    fn replace_table(
        &self,
        shard: &mut Shard<K, C>,
        judge: Option<&mut Judge<'_, C>>,
        since: Nanos,
    ) {
        if !shard.drains.is_empty() {
            return self.chain(shard, since);
        }
        let (slots, since) = match judge {
            Some(fresh) if shard.live >= self.keep => {
                let kept = self.estimate_kept(shard, fresh);
                let room = self.drain_inserts(shard.table.len());
                (self.bound_slots(kept, room), Some(since))
            }
            // (No room for the drain's inserts here: the larger table takes a quarter of its
            // keys in inserts before it fills, and the drain ends after a sixteenth.)
            _ => (sized_for(shard.live), None),
        };
        let era = shard.table.era();
        let next = Self::fresh_table(shard, slots, era);
        self.start_drain(shard, next, since);
    }

    /// Makes `next` the shard's table and starts draining the one it replaces, whose live keys
    /// are the shard's not in a drain already.
    fn start_drain(&self, shard: &mut Shard<K, C>, next: Arc<Table<K, C>>, since: Option<Nanos>) {
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

    /// The slots of the table a shard at its `evict_above` share moves to when the drain will
    /// keep `kept` keys: room for the `room` inserts until the drain ends, and as many after
    /// it, and never less than the share (what [`WordTable::build_next`] builds ahead).
    fn bound_slots(&self, kept: usize, room: usize) -> usize {
        holding(kept.saturating_add(2 * room).max(self.keep))
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
    fn chain(&self, shard: &mut Shard<K, C>, since: Nanos) {
        let era = shard.table.era();
        self.chain_into(shard, since, era);
    }

    /// [`WordTable::chain`], into a table of era `era`.
    fn chain_into(&self, shard: &mut Shard<K, C>, since: Nanos, era: u64) {
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
        let next = Self::fresh_table(shard, sized_for(shard.live.saturating_add(room)), era);
        self.start_drain(shard, next, evicting.then_some(since));
    }

    /// Moves the shard into era `era` if its table is of an older one (see "Re-anchoring" in
    /// the module docs).
    #[inline]
    fn enter_era(&self, shard: &mut Shard<K, C>, era: u64) {
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
    fn forget(&self, shard: &mut Shard<K, C>, era: u64) {
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
    fn estimate_kept(&self, shard: &mut Shard<K, C>, fresh: &mut Judge<'_, C>) -> usize {
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
    fn drain(&self, shard: &mut Shard<K, C>, budget: usize, mut judge: Option<&mut Judge<'_, C>>) {
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
                Visit::Evicted => {
                    drain.left -= 1;
                    shard.evict(1);
                }
            }
        }
    }

    /// A drain ended. One that evicted (the shard is at its `evict_above` share, where a
    /// table is replaced by one of about its size) leaves its table as the shard's spare; a
    /// growing shard's old table (it will not be wanted again) is retired, to be released a
    /// few slots per insert.
    fn drained(shard: &mut Shard<K, C>, drain: Drain<K, C>) {
        if drain.since.is_some() {
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

    /// Tells lookups whether shard `index` (locked: `shard`) holds retired tables. Called
    /// before each unlock that may have retired or released one; it writes only on a change,
    /// so the flags stay in every core's cache, shared, for the lookups that read them.
    fn note_retired(&self, index: usize, shard: &Shard<K, C>) {
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
    fn help_release(&self, index: usize, help: &Cell<u32>) {
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
    fn release(shard: &mut Shard<K, C>) {
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
                shard.freeing.push(Freeing {
                    tags: std::mem::take(&mut table.tags),
                    slots: std::mem::take(&mut table.slots).into_vec(),
                });
            }
            // `table` (two empty slices) is freed here: no loop.
        }
        if let Some(freeing) = shard.freeing.last_mut() {
            if freeing.step() {
                shard.freeing.pop();
            }
        }
    }

    /// Clears the next [`CLEAR_STEP`] slots of the shard's spare, if no thread caches it.
    fn clear_spare(shard: &mut Shard<K, C>) {
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
        let tags = &mut table.tags[start / 8..end / 8];
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

    /// An empty table of at least `slots` slots: the spare if it is cleared, or the table
    /// built ahead if it is complete, and not more than half as large again; else a new one
    /// (and the spare or the table built ahead is freed).
    fn fresh_table(shard: &mut Shard<K, C>, slots: usize, era: u64) -> Arc<Table<K, C>> {
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
                shard.spares_reused += 1;
                return spare.table;
            }
            shard.retiring.push(spare.table);
        }
        if let Some(next) = shard.next.take() {
            if next.slots.len() == next.len && fits(next.len) {
                // Both vectors are full to capacity: no copy, no reallocation.
                return Arc::new(Table {
                    tags: next.tags.into_boxed_slice(),
                    slots: next.slots.into_boxed_slice(),
                    era: AtomicU64::new(era),
                });
            }
            shard.freeing.push(Freeing {
                tags: next.tags.into_boxed_slice(),
                slots: next.slots,
            });
        }
        shard.allocated_large += usize::from(len > BUILD_ABOVE);
        new_table(slots, era)
    }

    /// Builds [`BUILD_STEP`] more slots of the table the shard will move to, once its table is
    /// [`BUILD_FROM`] (27/28) of its capacity, so that the insert that finds it full allocates
    /// and fills nothing (a large table is up to ~1 MB at the default bound: hundreds of µs in
    /// one call otherwise). The table [`WordTable::replace_table`] will want: below the
    /// `evict_above` share, one for the live keys the shard will hold when full; at it, one for
    /// the share and the drain's inserts, unless the shard has a spare of that size to reuse
    /// (then nothing is built: a table built there was never used, and held ~1 MB a shard).
    fn build_next(&self, shard: &mut Shard<K, C>) {
        let len = shard.table.len();
        if shard.next.is_none() {
            if !shard.drains.is_empty() || shard.used * BUILD_FROM.1 <= capacity(len) * BUILD_FROM.0
            {
                return;
            }
            let at_full = shard.live + capacity(len).saturating_sub(shard.used);
            let target = if at_full < self.keep {
                table_len(sized_for(at_full))
            } else if shard.spare.is_none() {
                table_len(self.bound_slots(self.keep, self.drain_inserts(len)))
            } else {
                return;
            };
            if target <= BUILD_ABOVE {
                return;
            }
            shard.next = Some(Building {
                tags: Vec::with_capacity(target / 8),
                slots: Vec::with_capacity(target),
                len: target,
            });
        }
        if let Some(next) = &mut shard.next {
            let end = next.len.min(next.slots.len() + BUILD_STEP);
            next.slots.resize_with(end, Slot::empty);
            next.tags.resize_with(end / 8, || AtomicU64::new(0));
        }
    }

    /// Evicts or moves the key of slot `at` of `from` (a drained table) into `to`, which must
    /// have room for it (not `over_full` with one more key: `find` then ends at an empty slot).
    fn visit<'j>(
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
        // A judge retires the cell itself (one CAS to the tombstone), so an admission racing
        // it either lands first, and the key is not fresh any more, or sees the tombstone.
        if judge.is_some_and(|fresh| fresh(&slot.state)) {
            return Visit::Evicted;
        }
        if !slot.state.is_live(retired) {
            return Visit::Empty; // a tombstone (dropped with its table), or moved already
        }
        // The key's own code first (hash, compare, clone): if it panics, the cell is still live
        // here, and nothing was written to `to`. (Under the shard lock a live cell stays live:
        // only the lock's holder retires cells.)
        let (hash, _) = self.hash(key);
        let place = find(to, hash, key);
        let key = key.clone();
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
    fn take_from_drain<Q>(&self, shard: &mut Shard<K, C>, hash: u64, key: &Q)
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

    /// The authoritative lookup after a miss on the lock-free path: under the shard lock, in
    /// the drain as well as the table.
    #[cold]
    #[inline(never)]
    fn existing_locked<Q, R>(
        &self,
        index: usize,
        hash: u64,
        key: &Q,
        era: u64,
        f: impl FnMut(&C) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut shard = self.shards[index].lock();
        self.enter_era(&mut shard, era);
        // Lookups drain too (moving keys only: no judge here), so that a drain ends, and its
        // table is freed, even when no insert comes. Before the key is taken from the drains:
        // a step may chain the table, and the key must be in the table that is looked in.
        self.drain(&mut shard, self.drain_step, None);
        self.take_from_drain(&mut shard, hash, key);
        Self::release(&mut shard);
        self.note_retired(index, &shard);
        let at = find(&shard.table, hash, key).ok()?;
        // Under the lock the cell is neither moved nor evicted: `f` sees a live state or a
        // tombstone (absent).
        let mut f = f;
        f(&shard.table[at].state)
    }

    /// The lock-free lookup. `Err` when the key is not in this thread's cached table of the
    /// shard, or is tombstoned there.
    #[inline]
    fn existing_fast<Q, R>(
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
            // panics as a table is released then interrupts a call that decided nothing.
            if self.releasing.0[shard].load(Ordering::Relaxed) {
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
            };
            cached.set(table);
            result
        })
    }
}

impl<K, H, C> KeyedStore<K, C> for WordTable<K, H, C>
where
    C: TableCell,
    K: Clone + Hash + Eq + Send + Sync,
    H: BuildHasher + Send + Sync,
{
    const EVICTS_ON_INSERT: bool = true;
    const RE_ANCHORS: bool = true;

    fn with_existing<Q, R>(
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
        if let Some(result) = self.existing_fast(hash, shard, key, era, &mut f) {
            return Some(result);
        }
        // Absent from this thread's table, or tombstoned there: perhaps still in a drain.
        self.existing_locked(shard, hash, key, era, f)
    }

    #[inline]
    fn try_existing<Q, R>(&self, key: &Q, era: u64, f: impl FnMut(&C) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.hash(key);
        self.existing_fast(hash, shard, key, era, f)
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
        let (at, inserted) = match find(&shard.table, hash, key) {
            // A tombstoned key comes back in place, fresh (rule 1: same key).
            Ok(at) => (at, shard.table[at].state.revive(self.retired)),
            Err(_) => {
                // The key's clone first: if it panics, the shard is as it was.
                let owned = key.to_owned();
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
                        (empty, true)
                    }
                    Ok(at) => (at, false),
                }
            }
        };
        if inserted {
            shard.live += 1;
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

    /// Judges about `budget` keys, shard after shard from where the last call stopped: first
    /// those of a shard's drain, then `HAND_RUNS` runs spread over its table. At most one
    /// round of the shards and `32 × budget` slots (tombstones and empty slots cost a visit
    /// too): a fixed amount of work, about `budget` slots in a dense table.
    fn evict_some(&self, evictor: &impl Evictor<C>, budget: usize) -> usize {
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
                let hand = shard.hand % len;
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
                shard.hand = (hand + len - run % len) % len;
                shard.evict(gone);
                self.note_retired(index, &shard);
                slots += visited;
                taken.evicted += shard.take_evicted();
            }
        });
        taken.report()
    }

    /// Keeps every key, fresh or not, until the store holds about `keys` keys (each shard its
    /// share): below that, a full table grows, as a hash map's does; above it, a full table is
    /// replaced by one of the same size and evicts keys that are fresh and were not used since
    /// it last filled. Memory under a flood of unique keys is then bounded by about `keys`
    /// keys plus those holding state. The default is [`DEFAULT_EVICT_ABOVE`].
    fn set_evict_above(&mut self, keys: usize) {
        self.keep = keys.div_ceil(SHARDS).max(1);
    }

    fn set_carry(&mut self, carry: Carry<C>) {
        self.carry = carry;
    }

    fn retain(&self, mut keep: impl FnMut(&C) -> bool) -> usize {
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

    fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().live).sum()
    }
}

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// The calls into a shard until a drain of a table of `len` slots ends (each visits
    /// `drain_step` slots).
    fn drain_inserts(&self, len: usize) -> usize {
        len / self.drain_step + 1
    }

    /// Visits `slots` slots of a drain per call instead of [`DRAIN_STEP`]: for the loom models,
    /// whose 8-slot tables a step of 16 drains in one call.
    #[allow(dead_code)] // called by the loom models
    pub(crate) fn set_drain_step_for_model(&mut self, slots: usize) {
        self.drain_step = slots.max(1);
    }

    /// Chains the table of `key`'s shard if a drain runs there, as an insert does when the
    /// table fills before its drain ends; returns the drains the shard then has. For the loom
    /// models: their tables are too small for a sizing estimate to fall short.
    #[allow(dead_code)] // called by the loom models
    pub(crate) fn chain_for_model(&self, key: &K) -> usize {
        let (_, index) = self.hash(key);
        let mut shard = self.shards[index].lock();
        if !shard.drains.is_empty() {
            let since = shard.filled_at;
            self.chain(&mut shard, since);
        }
        shard.drains.len()
    }
}

impl<K: Send + Sync, H, C: TableCell> WordTable<K, H, C> {
    /// Shards with a table being drained (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn draining(&self) -> usize {
        self.shards
            .iter()
            .filter(|shard| !shard.lock().drains.is_empty())
            .count()
    }

    /// Tables of more than [`BUILD_ABOVE`] slots allocated in one call (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn allocated_large(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().allocated_large)
            .sum()
    }

    /// Spares reused as a shard's next table (for the loom models).
    #[allow(dead_code)] // read by the loom models
    pub(crate) fn spares_reused(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().spares_reused)
            .sum()
    }

    /// Slots of tables being built ahead, or built and not used yet (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn built_ahead(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().next.as_ref().map_or(0, |next| next.len))
            .sum()
    }

    /// Slots of retired tables not released yet (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn retired_slots(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard.lock();
                let retiring: usize = shard.retiring.iter().map(|table| table.len()).sum();
                let freeing = shard.freeing.iter().map(|f| f.slots.capacity());
                retiring + freeing.sum::<usize>()
            })
            .sum()
    }

    /// Shard `index` as the eviction hand finds it (for tests, with no call running): where its
    /// hand stands, what `f` reads of each slot of its table that holds a key, and the same of
    /// each drain's unvisited slots in the order the drain visits them.
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn hand_view<T>(&self, index: usize, f: impl Fn(&C) -> T) -> HandView<T> {
        let shard = self.shards[index].lock();
        let read = |table: &Table<K, C>, i: usize| table.key(i).map(|_| f(&table[i].state));
        let table = &shard.table;
        HandView {
            hand: shard.hand,
            table: (0..table.len()).map(|i| read(table, i)).collect(),
            drains: (shard.drains.iter())
                .map(|d| (d.next..d.from.len()).map(|i| read(&d.from, d.index(i))))
                .map(Iterator::collect)
                .collect(),
        }
    }

    /// Checks each shard's counts against its tables (for tests, with no call running): `used`
    /// is the keys set in its table, within its fill bound; each drain's `left` the live keys it
    /// has not visited; and `live` those of the table and of the drains. Panics on a mismatch, naming the shard.
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn audit(&self) {
        let retired = self.retired;
        for (index, shard) in self.shards.iter().enumerate() {
            let shard = shard.lock();
            let (mut tagged, mut live) = (0, 0);
            let mut set = TagWords::new(&shard.table.tags);
            for (i, slot) in shard.table.iter().enumerate() {
                if set.is_set(i) {
                    tagged += 1;
                    live += usize::from(slot.state.is_live(retired));
                }
            }
            assert_eq!(shard.used, tagged, "shard {index}: used");
            let len = shard.table.len();
            assert!(
                !over_full(shard.used, len),
                "shard {index}: {tagged} keys in {len} slots"
            );
            for (d, drain) in shard.drains.iter().enumerate() {
                let mut set = TagWords::new(&drain.from.tags);
                let unvisited = (drain.next..drain.from.len())
                    .map(|i| drain.index(i))
                    .filter(|&at| set.is_set(at) && drain.from[at].state.is_live(retired))
                    .count();
                assert_eq!(drain.left, unvisited, "shard {index}, drain {d}: left");
                live += drain.left;
            }
            assert_eq!(shard.live, live, "shard {index}: live");
        }
    }

    /// Slots in all current tables (for tests of the sizing).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().table.len())
            .sum()
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
