//! The word table's parts: the store, its shards, the tables a shard drains, keeps or builds
//! ahead, each thread's cached tables, and the constants that bound a call's work.

use std::cell::Cell;
use std::hash::{BuildHasher, Hash};

use super::super::cell::TableCell;
use super::super::keyed_store::Carry;
use super::region::{Region, PAGE};
use super::returns::Returns;
use super::slots::*;
use super::texts::Texts;
use crate::clock::Nanos;
use crate::state::AtomicWord;
use crate::sync::{
    Arc, AtomicBool, AtomicU64, AtomicUsize, ModelSwitch, Mutex, OnceLock, PerThread, Tally,
    MODEL_CHECKED,
};

/// Slots of a replaced table that each insert into its shard visits (moves or evicts): the
/// most eviction and copying work any one call does, whatever the table's size. (A loom model
/// may take fewer: [`WordTable::set_drain_step_for_model`].)
///
/// Not smaller: the work of a drain is fixed (every slot visited once), and each call that
/// does a step also pays the lock and its own lookups, so a smaller step spreads the same work
/// over more calls and keeps the old table resident, and checks paying a step, for longer.
/// Not larger than [`CLEAR_STEP`], the slots of retired tables a call drops: drains that
/// retire tables faster than calls drop them pile the retired tables up. (The figures behind
/// both: benches/README.md, "The word table's constants".)
pub(crate) const DRAIN_STEP: usize = 64;
const _: () = assert!(DRAIN_STEP <= CLEAR_STEP);
/// At the `evict_above` share, the inserts a replaced table makes room for, twice (until its
/// drain ends, and after): one per this many slots of the old table, more than the drain's
/// own inserts. It sets how often a shard at the share replaces its table, and so moves every
/// key it keeps: less room replaces it more often, with the old and the next table resident
/// for more of the time (benches/README.md, "The word table's constants").
pub(crate) const SHARE_ROOM: usize = 16;
/// The most slots a check, peek, refund or insert visits (without `max_keys`): a drain step,
/// the key taken out of a drain, and the sample a table replaced at the `evict_above` share
/// judges. (Held to it by the tests; `KeyedLimiter`'s "Work per call" states it.)
#[allow(dead_code)] // read by the unit tests
pub(crate) const MOST_VISITED: usize = DRAIN_STEP + 1 + SAMPLE;
/// Runs of slots, spread evenly over a table, that a step of the eviction hand judges.
pub(crate) const HAND_RUNS: usize = 4;
/// A thread's lookups into a shard holding retired tables: one in `HELP_EVERY` drops
/// [`CLEAR_STEP`] of their slots (if the shard's lock is free), so that the tables go even
/// when no insert comes. (Every lookup under loom, whose models are a few calls long.)
pub(crate) const HELP_EVERY: u32 = if MODEL_CHECKED { 1 } else { 4 };
/// Slots of its next table that each insert into a growing shard builds: a page of them, so
/// that a table in mapped pages has one page touched per insert (a first touch is a fault, a
/// few microseconds), and a heap table 4 KiB initialised.
pub(super) const fn build_step<K, C: TableCell>() -> usize {
    let slot = std::mem::size_of::<Slot<K, C>>();
    if MODEL_CHECKED {
        // A model's tables are a few dozen slots: three a step builds them over several
        // inserts, in steps that end inside a word of tags, as a page of most slot sizes does.
        MODEL_BUILD_STEP
    } else if slot == 0 || slot >= PAGE {
        1
    } else {
        PAGE / slot
    }
}

/// Inserts left before its table is full when a shard starts building the next one, of
/// `next` slots: the steps it takes, and an eighth more, so that it is built before it is
/// needed. Late, because a table built ahead is resident until the shard moves to it: the
/// earlier the build starts, the more shards hold a next table at any time (benches/README.md,
/// "The word table's constants").
pub(super) const fn build_from<K, C: TableCell>(next: usize) -> usize {
    (next + next / 8).div_ceil(build_step::<K, C>())
}

/// Tables up to this many slots are allocated when needed (64 KiB of `u64` slots: a few µs).
/// (Lower under Miri and in the loom models, so that their tests reach tables built a step at a
/// time with a few hundred keys, or a few: the same paths at this size are tested natively.)
pub(crate) const BUILD_ABOVE: usize = if MODEL_CHECKED {
    8
} else if cfg!(miri) {
    256
} else {
    4096
};
/// The loom models' [`build_step`].
const MODEL_BUILD_STEP: usize = 3;
/// Keys a store holds before it evicts fresh ones, by default (see
/// [`KeyedLimiterBuilder::evict_above`](crate::KeyedLimiterBuilder::evict_above)), until
/// a working set of returning clients raises it (up to 8 times): with `u64` keys, 32 MiB of
/// 16-byte slots at full load, more with the tables' headroom.
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
pub(crate) const SAMPLE: usize = 32;

pub(super) struct Shard<K, C: TableCell> {
    /// Where lookups and inserts go.
    pub(super) table: Arc<Table<K, C>>,
    /// Replaced tables being emptied into `table`, a few slots per call, the oldest first:
    /// none or one, but for the rare table that fills before the drain into it ends (then it
    /// joins the drains: [`WordTable::chain`]).
    pub(super) drains: Vec<Drain<K, C>>,
    /// Slots with a key (live or tombstoned) in `table`.
    pub(super) used: usize,
    /// Live keys: in `table`, and in the drains' slots not yet visited.
    pub(super) live: usize,
    /// Keys evicted that no call has reported yet ([`Shard::evict`]).
    pub(super) evicted: usize,
    /// Where `evict_some` goes on judging `table`.
    pub(super) hand: usize,
    /// When `table` last had to be replaced (it was full): a key unused since then may go at
    /// the next replacement, a key used since is kept.
    pub(super) filled_at: Nanos,
    /// At the `evict_above` share, the last drained table, kept to serve as the next one.
    pub(super) spare: Option<Spare<K, C>>,
    /// Below it, the next (larger) table, built a few slots per insert before it is needed.
    pub(super) next: Option<Building<K, C>>,
    /// Tables the shard no longer uses (a growing shard's drained tables, a spare or a table
    /// built ahead that did not fit), released [`CLEAR_STEP`] slots per insert (and lookups
    /// help: [`WordTable::help_release`]) once no thread caches them: dropping a table of keys
    /// with drop glue is a loop over its slots (a free per `String` key), which no call
    /// should pay at once.
    pub(super) retiring: Vec<Arc<Table<K, C>>>,
    /// Slots of retired tables being dropped, the last one first.
    pub(super) freeing: Vec<Freeing<K, C>>,
    /// Tables of more than [`BUILD_ABOVE`] slots made in one call, allocated or mapped, where
    /// none was built ahead or kept as a spare (for tests: growth builds them ahead and the
    /// bound reuses them, so only chained drains and era moves should).
    pub(super) allocated_large: Tally,
    /// Tables built ahead, or being built, that a replacement could not use (for tests).
    pub(super) built_unused: Tally,
    /// Spares reused as the next table (for the loom models, which must reach it).
    pub(super) spares_reused: Tally,
    /// Whether the keys it evicts come back, and how often its share was raised for it.
    pub(super) returns: Returns,
    /// The shard's index: which ladder of lengths its large tables take ([`staggered`]).
    pub(super) stagger: usize,
}

impl<K, C: TableCell> Shard<K, C> {
    /// The slots of a table this shard grows into for `keys` live keys: [`sized_for`] on the
    /// shard's ladder ([`staggered`]). One place, so that the table built ahead is the one the
    /// replacement asks for.
    pub(super) fn grown_for(&self, keys: usize) -> usize {
        staggered(sized_for(keys), self.stagger)
    }

    /// Counts `n` keys evicted. They are reported by the next call that reports evictions
    /// ([`Shard::take_evicted`]): a call that a key's code interrupts (a panic in its `Hash`,
    /// `Eq`, `Clone` or `Drop`) leaves them to the next, and the limiter's key count, which
    /// may then read high for a while, never reads below the keys held.
    pub(super) fn evict(&mut self, n: usize) {
        self.live -= n;
        self.evicted += n;
    }

    /// The keys evicted since the last call.
    pub(super) fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

/// Evictions a call over several shards ([`StoreProtocol::evict_some`], [`StoreProtocol::retain`])
/// has taken from their counts but not reported yet. If a key's code interrupts the call (a
/// panic in its `Hash`, `Eq` or `Clone` as a drain moves it), they are put back as it unwinds,
/// in shard 0's count, for a later call to report.
pub(super) struct Taken<'a, K, C: TableCell> {
    pub(super) shards: &'a [Mutex<Shard<K, C>>],
    pub(super) evicted: usize,
}

impl<'a, K, C: TableCell> Taken<'a, K, C> {
    pub(super) fn new(shards: &'a [Mutex<Shard<K, C>>]) -> Self {
        Taken { shards, evicted: 0 }
    }

    /// The evictions taken, now reported.
    pub(super) fn report(mut self) -> usize {
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

/// A table being built [`build_step`] slots per insert (see [`WordTable::build_next`]): its
/// slots initialised on the heap, or, for a table in zeroed pages, those pages touched (written
/// once each), so that the calls that fill it meet no first touch of a page (a fault each: a
/// drain step moving keys into 16 untouched pages took over 10 µs).
pub(super) struct Building<K, C: TableCell> {
    /// The slots it will have (a multiple of 8).
    pub(super) len: usize,
    /// Slots built so far.
    built: usize,
    memory: Memory<K, C>,
}

enum Memory<K, C: TableCell> {
    Heap {
        tags: Vec<AtomicU64>,
        slots: Vec<Slot<K, C>>,
    },
    Mapped {
        tags: Region<AtomicU64>,
        slots: Region<Slot<K, C>>,
    },
}

impl<K, C: TableCell> Building<K, C> {
    /// A table of `len` slots to build.
    pub(super) fn new(len: usize) -> Self {
        let memory = match zeroed_regions(len) {
            Some((tags, slots)) => Memory::Mapped { tags, slots },
            None => Memory::Heap {
                tags: Vec::with_capacity(tag_words(len)),
                slots: Vec::with_capacity(len),
            },
        };
        Building {
            len,
            built: 0,
            memory,
        }
    }

    /// Builds [`build_step`] more slots.
    pub(super) fn step(&mut self) {
        let (from, end) = (self.built, self.len.min(self.built + build_step::<K, C>()));
        match &mut self.memory {
            Memory::Heap { tags, slots } => {
                slots.resize_with(end, Slot::empty);
                // Rounded up: the last word may tag fewer than eight built slots, and a build
                // abandoned here is freed through those tags ([`Building::into_freeing`]).
                tags.resize_with(tag_words(end), || AtomicU64::new(0));
            }
            Memory::Mapped { tags, slots } => {
                // A fresh value written over the zero one: the page is the table's from now.
                let stride = build_step::<K, C>();
                for i in (from..end).filter(|i| i % stride == 0) {
                    slots[i] = Slot::empty();
                }
                let stride = PAGE / std::mem::size_of::<AtomicU64>();
                for i in (tag_words(from)..tag_words(end)).filter(|i| i % stride == 0) {
                    tags[i] = AtomicU64::new(0);
                }
            }
        }
        self.built = end;
    }

    /// Whether every slot is built.
    pub(super) fn is_built(&self) -> bool {
        self.built == self.len
    }

    /// The table, once built.
    pub(super) fn into_table(self, era: u64) -> Table<K, C> {
        debug_assert!(self.is_built());
        let (tags, slots) = self.into_regions();
        Table {
            tags,
            slots,
            era: AtomicU64::new(era),
        }
    }

    /// What a table not used needs freed (its slots hold no key; the built ones are dropped a
    /// step at a time).
    pub(super) fn into_freeing(self) -> Freeing<K, C> {
        let built = self.built;
        let (tags, slots) = self.into_regions();
        // No key to drop, but the built cells go a step at a time too.
        Freeing::new(tags, slots, built)
    }

    fn into_regions(self) -> Regions<K, C> {
        match self.memory {
            // Both vectors are full to capacity once built: no copy, no reallocation.
            Memory::Heap { tags, slots } => (tags.into(), slots.into()),
            Memory::Mapped { tags, slots } => (tags, slots),
        }
    }
}

/// A drained table being cleared [`CLEAR_STEP`] slots per insert, once no thread caches it
/// (it is then reachable from its shard alone, under the lock). At the bound a shard replaces
/// its table every few thousand inserts, with one of the same size: taking a cleared spare,
/// that call neither allocates nor fills a table (up to ~1 MB at the default bound), and no
/// call drops a whole table's keys.
pub(super) struct Spare<K, C: TableCell> {
    pub(super) table: Arc<Table<K, C>>,
    pub(super) cleared: usize,
}

/// A replaced table whose slots before `next` are visited: each live key there has been moved
/// to the shard's table or, if fresh, evicted.
pub(super) struct Drain<K, C: TableCell> {
    pub(super) from: Arc<Table<K, C>>,
    /// Slots visited.
    pub(super) next: usize,
    /// Where the eviction hand stood in `from`: the drain goes on from there, as the hand
    /// would have, so it meets the keys judged longest ago first (the likeliest fresh), not
    /// the run the hand just swept.
    pub(super) start: usize,
    /// The drain evicts keys unused since this instant (the table's previous replacement);
    /// `None`: it moves every key (the table grew).
    pub(super) since: Option<Nanos>,
    /// Live keys not visited yet: the drain ends (and its table is freed) when none is left,
    /// even if no call visits the empty slots after the last one.
    pub(super) left: usize,
}

impl<K, C: TableCell> Drain<K, C> {
    /// The index of the `i`th slot the drain visits: the hand's way, down from `start`, round
    /// the table.
    pub(super) fn index(&self, i: usize) -> usize {
        // `i < len` and `start < len`; no division on the insert path.
        match self.start.checked_sub(i + 1) {
            Some(at) => at,
            None => self.start + self.from.len() - 1 - i,
        }
    }
}

/// Retires a cell whose key may go (a fresh one) and says whether it did.
pub(super) type Judge<'j, C> = dyn FnMut(&C) -> bool + 'j;

/// What a drain did with one slot.
pub(super) enum Visit {
    Empty,
    Moved,
    /// With the key's hash if it is sampled ([`super::returns`]).
    Evicted(Option<u64>),
}

/// Each thread's cached table per shard (see the module docs, rule 3). A lookup takes its
/// shard's table out of the cell and puts it back when done; a lookup nested in it (a clock
/// that calls its own limiter) finds the cell empty and fetches the table itself. `help`
/// counts the thread's lookups into shards with retired tables ([`HELP_EVERY`]).
pub(super) struct Cache<K, C: TableCell> {
    pub(super) tables: [Cell<Cached<K, C>>; SHARDS],
    pub(super) help: Cell<u32>,
}

/// One flag a shard, on cache lines of their own: every lookup reads its shard's flag, and a
/// neighbour written by inserts (a shard's lock) would take the line from the readers' caches.
#[repr(align(128))]
pub(super) struct Flags(pub(super) [AtomicBool; SHARDS]);

/// A thread's table of one shard, if it has fetched one.
pub(super) type Cached<K, C> = Option<Arc<Table<K, C>>>;

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
    pub(super) shards: Box<[Mutex<Shard<K, C>>]>,
    /// The shard where the next `evict_some` starts (modulo `SHARDS`).
    pub(super) hand: AtomicUsize,
    pub(super) hasher: H,
    pub(super) retired: C::Marks,
    pub(super) cache: PerThread<Cache<K, C>>,
    /// Per shard: whether it holds retired tables to release (a hint for lookups, kept by
    /// [`WordTable::note_retired`]).
    pub(super) releasing: Flags,
    /// Live keys a shard holds before it evicts fresh ones (its share of `evict_above`),
    /// unless its share was raised ([`WordTable::share`]).
    pub(super) base_share: usize,
    /// Whether a shard whose evicted keys come back raises its share (`returns.rs`): at the
    /// default bound, not at one the user chose.
    pub(super) raise: bool,
    /// Slots of a drain each call visits: [`DRAIN_STEP`] (fewer in some loom models).
    pub(super) drain_step: usize,
    /// Whether a lookup lets other threads run between fetching its table and probing it
    /// (`crate::sync::model_yield`): set by the loom models that need it; false otherwise.
    pub(super) yield_after_fetch: ModelSwitch,
    /// Carries a state moved out of a table of an older era into the newer one.
    pub(super) carry: Carry<C>,
    /// A table of `String` keys: its tables of texts too long for its own slots and short
    /// enough for theirs (`texts.rs`), made with the first such key.
    pub(super) texts: OnceLock<Box<Texts<H, C>>>,
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
    /// `Stored::new_store`). (The loom models reach it through `loom-tests`' `word_table`.)
    pub(crate) fn new(retired: C::Marks, hasher: H) -> Self {
        WordTable {
            shards: (0..SHARDS)
                .map(|stagger| {
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
                        allocated_large: Tally::default(),
                        spares_reused: Tally::default(),
                        built_unused: Tally::default(),
                        returns: Returns::default(),
                        stagger,
                    })
                })
                .collect(),
            hand: AtomicUsize::new(0),
            hasher,
            retired,
            cache: PerThread::new(),
            releasing: Flags(std::array::from_fn(|_| AtomicBool::new(false))),
            base_share: DEFAULT_EVICT_ABOVE / SHARDS,
            raise: true,
            drain_step: DRAIN_STEP,
            yield_after_fetch: ModelSwitch::OFF,
            carry: |_, _, _| {},
            texts: OnceLock::new(),
        }
    }

    /// The live keys of this table's shards (not its wider tables').
    pub(super) fn own_len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().live).sum()
    }

    /// The shard's current table (under its lock): off the fast path.
    #[cold]
    #[inline(never)]
    pub(super) fn current(&self, shard: usize) -> Arc<Table<K, C>> {
        self.shards[shard].lock().table.clone()
    }
}

impl<K: Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    #[inline]
    pub(super) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, (hash >> (64 - SHARD_BITS)) as usize)
    }
}

impl<K: Send + Sync, H, C: TableCell> WordTable<K, H, C> {
    /// The live keys `shard` holds before it evicts fresh ones: the store's share of
    /// `evict_above`, doubled for each time the shard's evicted keys came back (`returns.rs`).
    pub(super) fn share(&self, shard: &Shard<K, C>) -> usize {
        self.base_share.saturating_mul(1 << shard.returns.raises)
    }

    /// Whether `shard`, full at its share, raises it rather than evict: its evicted keys come
    /// back, and the share is the default one.
    pub(super) fn raises(&self, shard: &Shard<K, C>) -> bool {
        self.raise && shard.returns.returning()
    }
}

#[cfg(test)]
mod tests {
    use super::{build_from, build_step, PAGE};
    use crate::state::{AtomicWord, LogCell};

    /// A build step is a page of slots, so that a call touches at most one page of a mapped
    /// table (or initialises 4 KiB of a heap one): 256 16-byte `u64` slots, 64 log slots (a
    /// cache line each); and building starts as many inserts before the table is full as the
    /// next table takes, and an eighth more.
    #[test]
    fn a_build_step_is_a_page_of_slots() {
        assert_eq!(build_step::<u64, AtomicWord>(), PAGE / 16);
        assert_eq!(build_step::<u64, LogCell>(), PAGE / 64);
        assert_eq!(build_step::<String, AtomicWord>(), PAGE / 32);
        assert_eq!(build_from::<u64, AtomicWord>(2_048), 9);
        assert_eq!(build_from::<u64, AtomicWord>(2_049), 10);
    }

    /// The work constants as `docs/design.md` (published as the rustdoc's design page) and
    /// CONTRIBUTING quote them: changing one without its prose fails here.
    #[test]
    fn the_docs_quote_the_work_constants() {
        use super::{BUILD_ABOVE, CLEAR_STEP, DRAIN_STEP, HELP_EVERY};
        // Line breaks and indentation as spaces, so that a rewrap changes nothing.
        let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
        let design = words(include_str!("../../../docs/design.md"));
        let contributing = words(include_str!("../../../CONTRIBUTING.md"));
        let in_one_of_four = match HELP_EVERY {
            4 => "one in four",
            _ => panic!("docs/design.md says \"one in four\" lookups help: HELP_EVERY changed"),
        };
        for (text, quoted) in [
            (&design, format!("emptied {DRAIN_STEP} slots per call")),
            (&design, format!("dropped {CLEAR_STEP} slots per insert")),
            (&design, format!("{in_one_of_four} of a thread's")),
            (&design, format!("tables of up to {BUILD_ABOVE} slots")),
            (
                &contributing,
                format!("*drained* {DRAIN_STEP} slots per insert"),
            ),
        ] {
            assert!(text.contains(&quoted), "the docs no longer say {quoted:?}");
        }
    }
}
