//! One shard's table: open addressing over slots of a key and its state cell, a tag byte per
//! slot (eight to an `AtomicU64`, scanned as a group), the sizes tables grow by, and the
//! release of a dropped table's keys a step at a time.

use std::borrow::Borrow;
use std::mem::MaybeUninit;
use std::ops::Range;

use super::super::cell::TableCell;
use super::region::Region;
use super::text::{fits, inline_strings, query_text, Held, NewKey, INLINE, INLINE_BIT};
use crate::store::cell::ZeroedIsFresh;
use crate::sync::{Arc, AtomicU64, Ordering, UnsafeCell, MODEL_CHECKED};

/// Shards: inserts, evictions and rebuilds of different shards never wait for each other.
pub const SHARDS: usize = 64;
pub(super) const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Slots of a spare or retired table that each call clears or drops (a multiple of 8).
pub(crate) const CLEAR_STEP: usize = 64;
/// The smallest table a shard holds.
pub(super) const MIN_CAPACITY: usize = 8;
/// A large table is rebuilt before its used slots (live keys and tombstones) exceed 7/8 of it,
/// into a table whose capacity the live keys fill to 11/14 (11/16 of its slots) ...
pub(super) const FULL: (usize, usize) = (7, 8);
pub(super) const REFILL: (usize, usize) = (11, 14);
/// ... and a small table before they exceed half of it (refilled to 2/3 of that): its slots stay
/// in cache whatever their number, and a lookup's probe then nearly always ends at the home
/// slot, so the probe loop's exit is predicted. A large table's lookups are bound by the miss
/// on the slot, and a fuller table holds more keys per byte. Between the two, see
/// [`capacity`]. (Figures: benches/README.md, "The word table's constants".)
pub(super) const SMALL_FULL: (usize, usize) = (1, 2);
pub(super) const SMALL_REFILL: (usize, usize) = (2, 3);
/// The largest small table, in slots (64 shards of it: 1 MiB of 16-byte `u64` slots).
pub(super) const SMALL_SLOTS: usize = 1024;
/// Slots of capacity each slot past [`SMALL_SLOTS`] adds, until the capacity is [`FULL`] (from
/// 1,366 slots on).
const RAMP: usize = 2;

/// The used slots a table of `len` slots holds before it is rebuilt: half a small table; past
/// [`SMALL_SLOTS`], [`RAMP`] more for each slot more, up to [`FULL`]. So the capacity grows
/// with the length without a step: with a step, a table just larger than the small ones holds
/// far more keys than it was grown for, and at the `evict_above` bound a flooded shard's kept
/// keys keep it there, well above its share. A steeper ramp leaves mid-sized tables sparser.
pub(super) fn capacity(len: usize) -> usize {
    let small = len * SMALL_FULL.0 / SMALL_FULL.1;
    let ramp = (SMALL_CAPACITY + RAMP * len).saturating_sub(RAMP * SMALL_SLOTS);
    let large = (len * FULL.0 / FULL.1).min(ramp);
    small.max(large)
}

/// The capacity of the largest small table.
pub(super) const SMALL_CAPACITY: usize = SMALL_SLOTS * SMALL_FULL.0 / SMALL_FULL.1;

/// Whether a table of `len` slots must be rebuilt before it holds `used` used slots.
pub(super) fn over_full(used: usize, len: usize) -> bool {
    used > capacity(len)
}

/// The slots of the smallest table whose [`capacity`] is `keys`.
pub(super) fn holding(keys: usize) -> usize {
    let small_or_mid = (keys * SMALL_FULL.1 / SMALL_FULL.0)
        .min(SMALL_SLOTS + keys.saturating_sub(SMALL_CAPACITY).div_ceil(RAMP));
    small_or_mid.max((keys * FULL.1).div_ceil(FULL.0))
}

/// The slots of a table rebuilt for `keys` live keys: they fill its capacity to [`REFILL`]
/// (to [`SMALL_REFILL`] while that fits a small table), so that it takes inserts before it is
/// rebuilt again.
pub(super) fn sized_for(keys: usize) -> usize {
    let small = holding(keys * SMALL_REFILL.1 / SMALL_REFILL.0 + 1);
    if small <= SMALL_SLOTS {
        small
    } else {
        holding(keys * REFILL.1 / REFILL.0 + 1)
    }
}

/// A large table's length in shard `stagger` (of [`SHARDS`]): `len` rounded up to the shard's
/// ladder of lengths, [`STAGGER_FROM`]` × (14/11)^(k + stagger / SHARDS)`, the ratio a growing
/// large table's length is multiplied by ([`REFILL`] over [`FULL`]). Keys spread evenly over
/// the shards, so with one ladder for all they would grow at the same key counts, each holding
/// its old table beside the new one until its drain ended, and the store right after a growth
/// would hold nearly twice what it holds settled. Offset ladders spread the shards' growth
/// evenly over a growth's span of key counts. A length within 2 % above a rung takes that rung
/// (the sizes' rounding would otherwise skip one).
pub(crate) fn staggered(len: usize, stagger: usize) -> usize {
    if len <= STAGGER_FROM {
        return len;
    }
    let ratio = REFILL.1 as f64 / REFILL.0 as f64;
    let offset = (stagger % SHARDS) as f64 / SHARDS as f64;
    let rung = ((len as f64 / STAGGER_FROM as f64).ln() / ratio.ln() - offset - 0.08).ceil();
    let staggered = (STAGGER_FROM as f64 * ratio.powf(rung + offset)).ceil() as usize;
    staggered.max(STAGGER_FROM + 1)
}

/// Tables up to this length are not staggered: the rounding up to a rung leaves a short table
/// sparser, and short tables grow over few keys anyway.
const STAGGER_FROM: usize = 4096;

pub(crate) struct Slot<K, C: TableCell> {
    pub(super) state: C,
    pub(super) key: SlotKey<K>,
    /// Aligns the slot as the cell asks (a log's slot to a cache line).
    pub(super) _align: [C::Align; 0],
}

/// A slot's key: written once, under the shard lock, into an empty slot, then published by the
/// slot's tag (a Release store after the write; lookups load tags with Acquire). It keeps no
/// flag of its own: the table's tags say which keys are set, and the table drops those. A
/// `OnceLock` kept a word for its state, so a `u64` slot took 24 bytes; it takes 16, and at
/// 100k keys the table went from ~3.3 to ~2.2 MB, the difference between fitting the cache
/// this VM lends a process and missing it (benches/README.md, "The cliff").
pub(super) struct SlotKey<K>(UnsafeCell<MaybeUninit<K>>);

// SAFETY: a key is written once, before its tag is published, by the shard lock's holder, and
// after that only read (through `&K`) until the table is dropped or cleared by an owner that
// has it to itself; as `OnceLock<K>`, sharing it needs `K: Sync + Send` (a key set by one
// thread is read, and maybe dropped, by another), and sending it `K: Send`.
#[allow(unsafe_code)]
unsafe impl<K: Sync + Send> Sync for SlotKey<K> {}
// SAFETY: as above: the cell owns its `K`.
#[allow(unsafe_code)]
unsafe impl<K: Send> Send for SlotKey<K> {}

#[allow(unsafe_code)]
impl<K> SlotKey<K> {
    pub(super) fn empty() -> Self {
        SlotKey(UnsafeCell::new(MaybeUninit::uninit()))
    }

    /// Sets the key.
    ///
    /// # Safety
    /// The slot is empty (its tag is 0) and the caller holds its shard's lock, so that no
    /// thread reads or writes the key meanwhile; the caller publishes the tag after.
    pub(super) unsafe fn write(&self, key: K) {
        self.0.with_mut(|cell| {
            // SAFETY: by the contract, this is the only access to the cell now.
            unsafe { (*cell).write(key) };
        });
    }

    /// Sets the key of a table of `String` keys to `text`, inline: its length, then its bytes.
    ///
    /// # Safety
    /// As [`SlotKey::write`]; and `K` is `String` (24 bytes, room for a length byte and
    /// [`INLINE`] bytes) and `text` fits ([`fits`]).
    pub(super) unsafe fn write_text(&self, text: &str) {
        debug_assert!(inline_strings::<K>() && text.len() <= INLINE);
        self.0.with_mut(|cell| {
            let bytes = cell.cast::<u8>();
            // SAFETY: by the contract this is the only access to the cell, whose
            // `size_of::<K>()` = 1 + INLINE bytes a `MaybeUninit` lets hold any bytes; the
            // length fits a byte (at most INLINE).
            unsafe {
                bytes.write(text.len() as u8);
                std::ptr::copy_nonoverlapping(text.as_ptr(), bytes.add(1), text.len());
            }
        });
    }

    /// The text of an inline key.
    ///
    /// # Safety
    /// As [`SlotKey::get`], for a key set by [`SlotKey::write_text`] (its tag has
    /// [`INLINE_BIT`], in a table of `String` keys).
    pub(super) unsafe fn text(&self) -> &str {
        self.0.with(|cell| {
            let bytes = cell.cast::<u8>();
            // SAFETY: by the contract the cell holds a length byte and that many bytes copied
            // from a `str` (valid UTF-8), written before this read and never again while the
            // table is borrowed.
            unsafe {
                let len = usize::from(bytes.read());
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(bytes.add(1), len))
            }
        })
    }

    /// The key.
    ///
    /// # Safety
    /// The slot's tag was seen set: loaded with Acquire (pairing with the Release that
    /// published it), or read under the shard lock, so the write happened before this read;
    /// the table is shared (no one drops or clears its keys meanwhile); and the key is not
    /// an inline text ([`SlotKey::text`]).
    pub(super) unsafe fn get(&self) -> &K {
        self.0.with(|cell| {
            // SAFETY: by the contract the key is initialised, and no write follows while the
            // table is borrowed.
            unsafe { (*cell).assume_init_ref() }
        })
    }

    /// Drops the key.
    ///
    /// # Safety
    /// The key is set, the caller has the table to itself, and no one reads it again (the
    /// slot is cleared or freed next).
    pub(super) unsafe fn drop_key(&self) {
        self.0.with_mut(|cell| {
            // SAFETY: by the contract, the key is initialised and this is its last use.
            unsafe { (*cell).assume_init_drop() };
        });
    }
}

/// Whether slot `i`'s byte in its word of tags, `word`, is set: the slot holds a key.
#[inline]
pub(super) fn tag_set(word: u64, i: usize) -> bool {
    tag_byte(word, i) != 0
}

/// Slot `i`'s byte in its word of tags.
#[inline]
fn tag_byte(word: u64, i: usize) -> u8 {
    (word >> (i % 8 * 8)) as u8
}

/// Whether a key whose tag is `tag` is an inline text (in a table of `String` keys).
#[inline(always)]
fn is_text<K>(tag: u8) -> bool {
    inline_strings::<K>() && tag & INLINE_BIT != 0
}

/// Drops the keys set among `slots[range]`, clearing each one's tag before its drop: a key
/// whose `Drop` panics is not dropped again by a later call, and the keys after it in `range`
/// are dropped as the panic unwinds (a second panic aborts, as in a slice's drop). Nothing to
/// do, and no loop, for keys without drop glue (`u64`, `IpAddr`).
///
/// # Safety
/// `tags` are the tags of `slots`: a set tag means its slot's key is initialised.
#[allow(unsafe_code)]
pub(super) unsafe fn drop_keys<K, C: TableCell>(
    tags: &mut [AtomicU64],
    slots: &mut [Slot<K, C>],
    range: Range<usize>,
) {
    /// The keys of a range still to drop.
    struct Rest<'a, K, C: TableCell> {
        tags: &'a [AtomicU64],
        slots: &'a [Slot<K, C>],
        range: Range<usize>,
    }

    impl<K, C: TableCell> Rest<'_, K, C> {
        /// Drops the next slot's key, if it has one; false once the range is done.
        fn drop_next(&mut self) -> bool {
            let Some(i) = self.range.next() else {
                return false;
            };
            let word = &self.tags[i / 8];
            // Relaxed: the caller has the slots to itself (`&mut`), so no other thread reads.
            let bits = word.load(Ordering::Relaxed);
            let tag = tag_byte(bits, i);
            if tag != 0 {
                word.store(bits & !(0xff << (i % 8 * 8)), Ordering::Relaxed);
                // An inline text has nothing to drop.
                if !is_text::<K>(tag) {
                    // SAFETY: the tag was set, so the key is initialised (the contract of
                    // `drop_keys`) as a `K` (not a text), and the slots are the caller's
                    // alone; the tag is cleared first, so nothing drops or reads this key
                    // again, even if its drop panics.
                    unsafe { self.slots[i].key.drop_key() };
                }
            }
            true
        }
    }

    impl<K, C: TableCell> Drop for Rest<'_, K, C> {
        /// Runs only when a key's drop panicked: the rest of the range goes too.
        fn drop(&mut self) {
            while self.drop_next() {}
        }
    }

    if !std::mem::needs_drop::<K>() {
        return;
    }
    let mut rest = Rest { tags, slots, range };
    while rest.drop_next() {}
}

/// A retired table's slots, dropped [`CLEAR_STEP`] at a time from the end (keys first), with
/// the tags that say which hold keys; the memory goes with the last step.
pub(super) struct Freeing<K, C: TableCell> {
    pub(super) tags: Region<AtomicU64>,
    pub(super) slots: Region<Slot<K, C>>,
    /// Slots from here on have no key left.
    pub(super) end: usize,
}

impl<K, C: TableCell> Freeing<K, C> {
    /// A table's slots and tags, to free (the first `end` slots may hold keys, and every slot
    /// past it is dropped already).
    pub(super) fn new(tags: Region<AtomicU64>, slots: Region<Slot<K, C>>, end: usize) -> Self {
        // Every slot that may hold a key has its tag: `drop_keys` reads them all.
        debug_assert!(end <= slots.len() && tags.len() >= tag_words(end));
        Freeing { tags, slots, end }
    }

    /// Drops the last [`CLEAR_STEP`] slots left (keys, then cells); whether none is left
    /// (then the memory can go).
    pub(super) fn step(&mut self) -> bool {
        let start = self.end.saturating_sub(CLEAR_STEP);
        // SAFETY: `tags` are the slots' own (taken from one table together).
        #[allow(unsafe_code)]
        unsafe {
            drop_keys(&mut self.tags, &mut self.slots, start..self.end)
        };
        self.slots.truncate(start);
        self.end = start;
        start == 0
    }
}

impl<K, C: TableCell> Drop for Freeing<K, C> {
    fn drop(&mut self) {
        let rest = 0..self.end;
        // SAFETY: `tags` are the slots' own (taken from one table together).
        #[allow(unsafe_code)]
        unsafe {
            drop_keys(&mut self.tags, &mut self.slots, rest)
        };
    }
}

/// What this thread's calls did to the tables, for the unit tests that hold each call to the
/// bound `KeyedLimiter` states ("Work per call"). Compiles to nothing outside them.
pub(crate) mod work {
    #[cfg(test)]
    thread_local! {
        static VISITED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        static ALLOCATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// `slots` slots visited: judged, moved or evicted.
    #[inline(always)]
    pub(crate) fn visited(_slots: usize) {
        #[cfg(test)]
        VISITED.with(|n| n.set(n.get() + _slots));
    }

    /// A table of `slots` slots allocated and initialised (a mapped one, zero pages, is not).
    #[inline(always)]
    pub(crate) fn allocated(_slots: usize) {
        #[cfg(test)]
        ALLOCATED.with(|n| n.set(n.get() + _slots));
    }

    /// Slots visited and allocated since the last call.
    #[cfg(test)]
    #[allow(dead_code)] // `loom-tests` compiles this file in its own tests
    pub(crate) fn take() -> (usize, usize) {
        (VISITED.with(|n| n.take()), ALLOCATED.with(|n| n.take()))
    }
}

/// One shard's table. Never shrinks or grows in place: a rebuild makes a new one.
pub(super) struct Table<K, C: TableCell> {
    /// A byte a slot, eight to a word: 0 until the slot's key is set, then [`tag`] of
    /// its hash. A probe reads a word of tags at a time and reads a slot only when its tag
    /// matches: a probe past other keys reads no slot (nor, for `String` keys, the heap), and
    /// a miss in a table 7/8 full, about 32 slots on average under linear probing, reads 4 or
    /// 5 words. (Eight bytes read as one word, without `unsafe`: the scan is a few integer
    /// operations, as in hashbrown's portable group.)
    pub(super) tags: Region<AtomicU64>,
    /// A multiple of 8 slots, so that the words of tags cover them exactly.
    pub(super) slots: Region<Slot<K, C>>,
    /// The era its states were written in (see "Re-anchoring" in the module docs). Set before
    /// the table is shared, or, on a table holding no live key, under its shard's lock.
    pub(super) era: AtomicU64,
}

impl<K, C: TableCell> std::ops::Deref for Table<K, C> {
    type Target = [Slot<K, C>];

    fn deref(&self) -> &[Slot<K, C>] {
        &self.slots
    }
}

impl<K, C: TableCell> Table<K, C> {
    /// Slot `i`'s key, if it has one.
    /// Whether slot `i` holds a key sampled for the shard's memory of evicted keys
    /// (`returns.rs`). Under the shard's lock (Relaxed: the lock orders the tag's store).
    pub(super) fn sampled(&self, i: usize) -> bool {
        let tag = tag_byte(self.tags[i / 8].load(Ordering::Relaxed), i);
        tag != 0 && super::returns::sampled_tag(tag)
    }

    pub(super) fn key(&self, i: usize) -> Option<Held<'_, K>> {
        // Acquire: pairs with `occupy`'s Release, so that the key's write is seen.
        let tag = tag_byte(self.tags[i / 8].load(Ordering::Acquire), i);
        // SAFETY: the tag, loaded with Acquire, is `tag`, and the table is borrowed: shared.
        #[allow(unsafe_code)]
        (tag != 0).then(|| unsafe { self.held(i, tag) })
    }

    /// Slot `i`'s key, as its tag `tag` says it is held.
    ///
    /// # Safety
    /// As [`SlotKey::get`]: `tag` is the slot's tag, set, and seen as that says.
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn held(&self, i: usize, tag: u8) -> Held<'_, K> {
        let key = &self.slots[i].key;
        if is_text::<K>(tag) {
            // SAFETY: by the contract; the tag says the key is an inline text.
            Held::Text(unsafe { key.text() })
        } else {
            // SAFETY: by the contract; the tag says the key is a `K`.
            Held::Key(unsafe { key.get() })
        }
    }
}

/// Which slots of a table hold keys, for a caller holding the shard lock or the table to
/// itself (either orders the tags' writes before it): each word of tags is loaded once for
/// its eight slots, where a load per slot would be eight (and, in the loom models, eight
/// scheduling points).
pub(super) struct TagWords<'t> {
    pub(super) tags: &'t [AtomicU64],
    /// The last word loaded, and its index.
    pub(super) word: Option<(usize, u64)>,
}

impl<'t> TagWords<'t> {
    pub(super) fn new(tags: &'t [AtomicU64]) -> Self {
        TagWords { tags, word: None }
    }

    pub(super) fn is_set(&mut self, i: usize) -> bool {
        let bits = match self.word {
            Some((at, bits)) if at == i / 8 => bits,
            _ => {
                // Relaxed: the shard lock, or the caller's owning the table, orders every tag
                // write before this load.
                let bits = self.tags[i / 8].load(Ordering::Relaxed);
                self.word = Some((i / 8, bits));
                bits
            }
        };
        tag_set(bits, i)
    }
}

impl<K, C: TableCell> Drop for Table<K, C> {
    fn drop(&mut self) {
        let all = 0..self.slots.len();
        // SAFETY: a table's tags are its slots' (set by `occupy` once the key is written).
        #[allow(unsafe_code)]
        unsafe {
            drop_keys(&mut self.tags, &mut self.slots, all)
        };
    }
}

/// A byte of each tag of a word.
pub(super) const LOW_BITS: u64 = 0x0101_0101_0101_0101;
/// The high bit of each tag of a word: set in every tag but [`EMPTY`].
pub(super) const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// A slot's tag: 7 bits of the hash that neither the shard (the top 6) nor the home slot (the
/// low 32, scaled) depend on, and the high bit: an empty slot's byte is the only one with it
/// clear. In a table of `String` keys, 6 bits of the hash and [`INLINE_BIT`] for a key kept
/// inline (`text.rs`).
#[inline(always)]
pub(super) fn tag<K>(hash: u64, text: bool) -> u8 {
    let hash = (hash >> 32) as u8 | 0x80;
    if inline_strings::<K>() {
        hash & !INLINE_BIT | if text { INLINE_BIT } else { 0 }
    } else {
        hash
    }
}

/// The slots of a table made for `capacity`: a multiple of 8 (whole words of tags).
pub(super) fn table_len(capacity: usize) -> usize {
    capacity.max(MIN_CAPACITY).next_multiple_of(8)
}

impl<K, C: TableCell> Slot<K, C> {
    pub(super) fn empty() -> Self {
        Slot {
            state: C::default(),
            key: SlotKey::empty(),
            _align: [],
        }
    }
}

/// Words of tags that `slots` slots have, eight tags a word, rounded up: the one count of a
/// table's tags, whole or part-built (a build step is a page of slots, often not a multiple of
/// eight), that every path making, reading or freeing tags uses.
#[inline]
pub(super) const fn tag_words(slots: usize) -> usize {
    slots.div_ceil(8)
}

pub(super) fn new_table<K, C: TableCell>(capacity: usize, era: u64) -> Arc<Table<K, C>> {
    let len = table_len(capacity);
    let (tags, slots) = zeroed_regions(len).unwrap_or_else(|| {
        work::allocated(len);
        let tags = (0..tag_words(len))
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>();
        let slots = (0..len).map(|_| Slot::empty()).collect::<Vec<_>>();
        (tags.into(), slots.into())
    });
    Arc::new(Table {
        tags,
        slots,
        era: AtomicU64::new(era),
    })
}

/// A table's tags and slots.
pub(super) type Regions<K, C> = (Region<AtomicU64>, Region<Slot<K, C>>);

/// The tags and slots of a table of `len` slots in zeroed pages, if its cells may start as zero
/// bytes and the table is large enough to map (see `region.rs`).
pub(super) fn zeroed_regions<K, C: TableCell>(len: usize) -> Option<Regions<K, C>> {
    // SAFETY: a slot's fields are its cell, zero a fresh one by `C::ZEROED`'s promise (as
    // `Slot::empty` makes it, with no drop glue), its key, a `MaybeUninit` (any bytes, never
    // read while its tag is 0, no drop glue), and a zero-sized alignment.
    #[allow(unsafe_code)]
    let slots = Region::zeroed(len, C::ZEROED.map(|_| unsafe { ZeroedIsFresh::promise() })?)?;
    // SAFETY: a zero `AtomicU64` is 0, no tag, as a new table's tags are; no drop glue.
    #[allow(unsafe_code)]
    let tags =
        Region::zeroed(tag_words(len), unsafe { ZeroedIsFresh::promise() }).unwrap_or_else(|| {
            (0..tag_words(len))
                .map(|_| AtomicU64::new(0))
                .collect::<Vec<_>>()
                .into()
        });
    Some((tags, slots))
}

impl<K, C: TableCell> Table<K, C> {
    /// Relaxed: the era is set before the table is published (through the shard lock, or a
    /// thread's own cache), or, in place, only on a table with no live cell (`forget`), whose
    /// readers find nothing to decide on whichever era they read.
    #[inline]
    pub(super) fn era(&self) -> u64 {
        self.era.load(Ordering::Relaxed)
    }
}

/// Sets the key of slot `index`, then publishes its tag.
///
/// # Safety
/// The caller holds the table's shard lock, and `find`, under it, ended at this slot: it is
/// empty (its tag is 0), so no key is overwritten and no thread reads this one until the tag
/// below is stored.
/// A `String` key that fits is written inline whichever way it comes (`text.rs`).
#[allow(unsafe_code)]
pub(super) unsafe fn occupy<K, C: TableCell>(
    table: &Table<K, C>,
    index: usize,
    hash: u64,
    key: NewKey<'_, K>,
) {
    let slot = &table.slots[index];
    let text = match key {
        NewKey::Text(text) => {
            // SAFETY: by the contract, the slot is empty and no thread reads or writes its
            // key now; a `NewKey::Text` is made for a table of `String` keys, and fits.
            unsafe { slot.key.write_text(text) };
            true
        }
        // (`query_text` reads a `K` only when it is `String`.)
        NewKey::Key(key) => match query_text(&key).and_then(fits) {
            Some(text) => {
                // SAFETY: as above; `K` is `String` and the text fits.
                unsafe { slot.key.write_text(text) };
                true
            }
            _ => {
                // SAFETY: by the contract, as above.
                unsafe { slot.key.write(key) };
                false
            }
        },
    };
    let word = &table.tags[index / 8];
    // Relaxed: only the shard lock's holder writes tags, and it holds the lock.
    let tags = word.load(Ordering::Relaxed) | u64::from(tag::<K>(hash, text)) << (index % 8 * 8);
    // Release: the key is set before a lock-free probe can see the tag (pairs with `find`).
    word.store(tags, Ordering::Release);
}

/// Where a hash's probe starts: the low 32 bits scaled to the table (any length).
#[inline]
pub(super) fn home<K, C: TableCell>(table: &Table<K, C>, hash: u64) -> usize {
    ((hash as u32 as u64 * table.len() as u64) >> 32) as usize
}

/// The index of the slot holding `key`, or of the first empty slot of its probe (`Err`). A
/// table always has
/// an empty slot (rebuilds keep used slots below 7/8), so the probe ends. Without the shard
/// lock, a key being inserted may read as absent (its tag not stored yet): lock-free callers
/// then look again under the lock.
#[inline]
pub(super) fn find<K, C: TableCell, Q>(
    table: &Table<K, C>,
    hash: u64,
    key: &Q,
) -> Result<usize, usize>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let is_key = |held: Held<'_, K>| matches!(held, Held::Key(held) if held.borrow() == key);
    if !inline_strings::<K>() {
        return probe(table, hash, tag::<K>(hash, false), is_key);
    }
    match query_text(key) {
        Some(text) if fits(text).is_some() => find_text(table, hash, text),
        Some(_) => probe(table, hash, tag::<K>(hash, false), is_key),
        // A caller's own `Borrow` type: its text is not known, so either class.
        None => probe(table, hash, tag::<K>(hash, false), is_key).or_else(|_| {
            probe(table, hash, tag::<K>(hash, true), |held| match held {
                Held::Text(text) => owned_string::<K>(text).borrow() == key,
                Held::Key(_) => false,
            })
        }),
    }
}

/// [`find`] for a text kept inline, in a table of `String` keys.
#[inline]
pub(super) fn find_text<K, C: TableCell>(
    table: &Table<K, C>,
    hash: u64,
    text: &str,
) -> Result<usize, usize> {
    probe(
        table,
        hash,
        tag::<K>(hash, true),
        |held| matches!(held, Held::Text(held) if held == text),
    )
}

/// `text` as a `K` (which is `String`), for a caller's own `Borrow` type to compare with.
pub(super) fn owned_string<K>(text: &str) -> K {
    assert!(inline_strings::<K>());
    let owned = String::from(text);
    // SAFETY: `K` is `String` (asserted), so this moves a `String` into a `String`.
    #[allow(unsafe_code)]
    unsafe {
        let key = std::mem::transmute_copy::<String, K>(&owned);
        std::mem::forget(owned);
        key
    }
}

/// A cache line's bytes.
const LINE: usize = 64;

/// Starts loading the cache line of `value`'s last byte (see `TableCell::touch`).
#[inline(always)]
fn touch_end<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the intrinsic needs SSE, part of every x86_64 CPU (a baseline target feature); a
    // prefetch reads no memory and never faults, and the address is inside `value`.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let last = std::ptr::from_ref(value)
            .cast::<i8>()
            .add(std::mem::size_of::<T>() - 1);
        _mm_prefetch::<_MM_HINT_T0>(last);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// The probe of [`find`]: the slots whose tag is `tag` until `is_key` says one holds the key,
/// else the first empty slot.
#[inline(always)]
fn probe<K, C: TableCell>(
    table: &Table<K, C>,
    hash: u64,
    tag: u8,
    mut is_key: impl FnMut(Held<'_, K>) -> bool,
) -> Result<usize, usize> {
    let wanted = LOW_BITS * u64::from(tag);
    let mut i = home(table, hash);
    // The home slot's miss starts now, beside the tag word's, where it would start only once
    // the tags matched: a hit sits there or a slot or two on (a 16-byte slot: four a line).
    // At 1M keys, 1.4x the checks a second (benches/README.md). Not under loom: a scheduling
    // point per lookup that decides nothing.
    if !MODEL_CHECKED {
        table.slots[i].state.touch();
        // A slot that may cross a cache line (one 48-byte slot in two does, an 80-byte one
        // always) has its last line loaded too: its key's end, compared once the tags match,
        // would otherwise be a second miss after theirs.
        if LINE % std::mem::size_of::<Slot<K, C>>() != 0 {
            touch_end(&table.slots[i]);
        }
    }
    // A table is never full, so a probe ends within a round of it: every group once, its first
    // twice, at most 8 candidate slots each. Checked in debug builds, where a broken probe then
    // fails instead of hanging (release builds compile the count away).
    let most = (table.len() / 8 + 1) * 9;
    let mut steps = 0;
    loop {
        steps += 1;
        debug_assert!(steps <= most, "a probe went round its whole table");
        let group = i & !7;
        // Acquire: pairs with the Release in `occupy`; a tag seen means its key is set.
        let tags = table.tags[group / 8].load(Ordering::Acquire);
        // The bytes of slots `i..group + 8`: the probe started at `i`.
        let ahead = !0u64 << (i % 8 * 8);
        let empty = !tags & HIGH_BITS & ahead;
        // Bytes equal to the tag (and, rarely, the byte above one: a key check rejects it).
        let same = tags ^ wanted;
        let mut matches = same.wrapping_sub(LOW_BITS) & !same & HIGH_BITS & ahead;
        // Only slots before the first empty one are in the probe.
        if empty != 0 {
            matches &= (empty & empty.wrapping_neg()) - 1;
        }
        while matches != 0 {
            steps += 1;
            debug_assert!(steps <= most, "a probe went round its whole table");
            let at = group + matches.trailing_zeros() as usize / 8;
            // SAFETY: the slot's tag byte is set (a match, or a byte above one, is never an
            // empty slot's 0) in a word loaded with Acquire above, and read from that word
            // (not from `tag`: a byte above a match may be of the other class); the table is
            // borrowed.
            #[allow(unsafe_code)]
            let held = unsafe { table.held(at, tag_byte(tags, at)) };
            if is_key(held) {
                return Ok(at);
            }
            matches &= matches - 1;
        }
        if empty != 0 {
            return Err(group + empty.trailing_zeros() as usize / 8);
        }
        i = group + 8;
        if i == table.len() {
            i = 0;
        }
    }
}

/// Linux on x86_64 (its prefetch; procfs), outside Miri (no procfs).
#[cfg(all(test, target_arch = "x86_64", target_os = "linux", not(miri)))]
mod tests {
    use super::super::region::PAGE;
    use super::{find, new_table};
    use crate::state::AtomicWord;

    /// Minor page faults of this thread so far (`/proc/thread-self/stat`, field 10).
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
        // The fields after the command's name, which ends at the last ')': state is field 3.
        let after_name = stat.rsplit(')').next().expect("a name in parentheses");
        let field = after_name.split_whitespace().nth(10 - 3).expect("field 10");
        field.parse().expect("a count")
    }

    /// A lookup's early touch of its home slot (`TableCell::touch`) is a prefetch on x86_64,
    /// which never faults: lookups of absent keys in a fresh table in mapped pages fault in
    /// none of its slots' pages, so that the write putting a key in a page is that page's one
    /// first touch. (With a load there, the lookup mapped the zero page and the insert's write
    /// then faulted again: two faults a page on the flood's checks.)
    #[test]
    fn lookups_in_a_fresh_mapped_table_fault_in_none_of_its_slots() {
        let lookups = |len: usize| {
            let table = new_table::<u64, AtomicWord>(len, 0);
            let hashes = (0..len as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for (key, hash) in hashes.enumerate() {
                assert!(find(&table, hash, &(key as u64)).is_err(), "an empty table");
            }
            table.slots.is_mapped()
        };
        // The same lookups first in a heap table: the code's own first touches.
        assert!(!lookups(64));
        let len = 64 * 1024;
        let pages = (len * std::mem::size_of::<super::Slot<u64, AtomicWord>>() / PAGE) as u64;
        let before = minor_faults();
        assert!(lookups(len), "a table of {len} slots is mapped");
        let faults = minor_faults() - before;
        // Its tags' pages (read: the zero page mapped), the mapping code's first run, the heap.
        assert!(
            faults < pages / 4,
            "{faults} faults for lookups in a table of {pages} pages"
        );
    }
}
