//! Unit tests of the word table (`word_table.rs`), kept apart so that `loom-tests`, which
//! compiles `word_table.rs` against loom, does not compile them.

use std::hash::Hash;

use super::cell::TableCell;
use super::keyed_store::{Evictor, Inserted, StoreProtocol};
use super::word_table::{staggered, WordTable, DRAIN_STEP, SHARDS, SHARE_ROOM};
use crate::clock::Nanos;
use crate::state::{AtomicWord, Retired};

const MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX - 1,
};

/// Seeded, so that each run places keys the same way: a test that needs a rare placement (a
/// drain that overfills its table) meets it on every run, not on most.
type Store = WordTable<u64, foldhash::fast::FixedState>;

fn store() -> Store {
    seeded_store(0xD1B5_4A32_D192_ED03)
}

fn seeded_store(seed: u64) -> Store {
    WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(seed))
}

/// A store whose shards evict fresh keys as soon as they fill (`evict_above` of one key each).
fn evicting_store(seed: u64) -> Store {
    let mut store = seeded_store(seed);
    store.set_evict_above(1);
    store
}

/// Adds `n` to a live cell, as a decision would (`None` if retired).
fn add(cell: &AtomicWord, n: u64) -> Option<u64> {
    cell.try_update(|| 0, |s, _| (s + n, s + n), |s| MARKS.any(s))
        .ok()
}

/// A limiter that lets its store evict every cell holding `fresh` (or none, for `None`).
struct Judge(Option<u64>);

impl Evictor<AtomicWord> for Judge {
    fn sweep(&self) -> usize {
        unreachable!("the word table evicts on its own")
    }

    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&AtomicWord, Nanos) -> bool) -> R,
    ) -> Option<R> {
        let fresh = self.0?;
        Some(f(0, &|cell, _since| {
            cell.retire_if(MARKS.tombstone, |s| s == fresh).is_some()
        }))
    }
}

const KEEP_ALL: Judge = Judge(None);
const EVICT_ZERO: Judge = Judge(Some(0));

fn insert(store: &Store, key: u64, n: u64, judge: &Judge) -> bool {
    inserting(store, &key, |cell| add(cell, n), judge)
        .1
        .inserted
}

/// [`StoreProtocol::with_inserted`], returning what it did.
fn inserting<K, Q, S, R>(
    store: &S,
    key: &Q,
    f: impl FnOnce(&AtomicWord) -> R,
    judge: &impl Evictor<AtomicWord>,
) -> (R, Inserted)
where
    K: Hash + Eq + Clone + std::borrow::Borrow<Q>,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    S: StoreProtocol<K, AtomicWord>,
{
    let mut done = Inserted::default();
    let result = store.with_inserted(key, 0, f, judge, &mut done);
    (result, done)
}

fn get(store: &Store, key: u64) -> Option<u64> {
    store.with_existing(&key, 0, |cell| add(cell, 0))
}

fn capacity(store: &Store) -> usize {
    store.capacity()
}

#[test]
fn states_survive_every_rebuild() {
    let store = store();
    for key in 0..20_000u64 {
        assert!(insert(&store, key, key + 1, &KEEP_ALL));
        if key % 1000 == 0 {
            store.audit(); // as tables fill and drain (a miscount would overfill one)
        }
    }
    assert_eq!(store.len(), 20_000);
    for key in 0..20_000u64 {
        assert_eq!(get(&store, key), Some(key + 1), "key {key}");
        assert_eq!(
            store.with_existing(&key, 0, |cell| add(cell, 1)),
            Some(key + 2)
        );
    }
    assert_eq!(get(&store, 20_000), None);
    // Used slots stay at or below 7/8 of each table.
    assert!(capacity(&store) * 7 / 8 >= 20_000);
    store.audit();
}

#[test]
fn an_evicted_key_is_absent_then_revived_in_place() {
    let store = store();
    insert(&store, 7, 0, &KEEP_ALL);
    insert(&store, 8, 5, &KEEP_ALL);
    // Evict what holds 0 ("fresh"), keep the rest.
    let fresh = |cell: &AtomicWord| cell.retire_if(MARKS.tombstone, |s| s == 0).is_none();
    assert_eq!(store.retain(fresh), 1);
    assert_eq!(store.len(), 1);
    assert_eq!(get(&store, 7), None);
    assert_eq!(get(&store, 8), Some(5));
    // A decision on the tombstone sees it and changes nothing.
    assert!(
        insert(&store, 7, 3, &KEEP_ALL),
        "a revived key counts as inserted"
    );
    assert_eq!(get(&store, 7), Some(3));
    assert_eq!(store.len(), 2);
    store.audit();
}

#[test]
fn tombstones_are_reclaimed_after_a_sweep() {
    let store = store();
    for key in 0..50_000u64 {
        insert(&store, key, u64::from(key % 100 == 0), &KEEP_ALL);
    }
    let grown = capacity(&store);
    store.retain(|cell| cell.retire_if(MARKS.tombstone, |s| s == 0).is_none());
    assert_eq!(store.len(), 500);
    assert!(
        capacity(&store) * 10 < grown,
        "{} of {grown}",
        capacity(&store)
    );
    for key in (0..50_000u64).step_by(100) {
        assert_eq!(get(&store, key), Some(1));
    }
    store.audit();
}

#[test]
fn a_stale_cached_table_is_refreshed_not_trusted() {
    let store = store();
    insert(&store, 1, 10, &KEEP_ALL);
    std::thread::scope(|scope| {
        let (to_main, from_reader) = std::sync::mpsc::channel();
        let (to_reader, from_main) = std::sync::mpsc::channel::<()>();
        let store = &store;
        let reader = scope.spawn(move || {
            // Caches the shard's table.
            assert_eq!(get(store, 1), Some(10));
            to_main.send(()).unwrap();
            from_main.recv().unwrap();
            // Its cached table is stale now: key 1 moved and counts on in the new one.
            assert_eq!(store.with_existing(&1, 0, |cell| add(cell, 1)), Some(11));
        });
        from_reader.recv().unwrap();
        // Rebuild every shard (many inserts), while the reader holds its old table.
        for key in 2..5_000u64 {
            insert(store, key, 0, &KEEP_ALL);
        }
        to_reader.send(()).unwrap();
        reader.join().unwrap();
    });
    assert_eq!(get(&store, 1), Some(11));
    store.audit();
}

/// Tables grow geometrically through the small sizes (kept at most half full) into the large
/// ones (7/8): a shard is rebuilt a few times per doubling, never on every insert (a first
/// version judged a table sized by the large rule as small, and rebuilt it on every insert of
/// shards holding 257 to 640 keys).
#[test]
fn tables_grow_geometrically_across_the_small_limit() {
    let store = store();
    let mut rebuilds = 0;
    let mut last = capacity(&store);
    for key in 0..40_000u64 {
        insert(&store, key, 1, &KEEP_ALL);
        let now = capacity(&store);
        if now != last {
            rebuilds += 1;
            last = now;
        }
    }
    // 625 keys per shard on average: about 9 rebuilds each up to the large sizes, a few more.
    assert!(
        rebuilds < 64 * 14,
        "{rebuilds} rebuilds for 40 000 keys in 64 shards"
    );
    assert!(rebuilds > 64 * 4, "{rebuilds}: the tables did grow");
    store.audit();
}

/// Keys that stay fresh (state 0) are evicted when their shard needs room, so a flood of them
/// does not grow the tables beyond a small multiple of the keys that hold state; those survive
/// every drain.
#[test]
fn a_full_table_evicts_fresh_keys_instead_of_growing() {
    let store = evicting_store(1);
    let keys = 400_000u64;
    for key in 0..keys {
        insert(&store, key, u64::from(key % 1000 == 0), &EVICT_ZERO);
    }
    let holding = (keys / 1000) as usize;
    assert!(
        capacity(&store) <= 16 * holding + 64 * 64,
        "{} slots for {holding} keys holding state",
        capacity(&store)
    );
    for key in (0..keys).step_by(1000) {
        assert_eq!(get(&store, key), Some(1), "key {key}");
    }
    assert!(store.len() <= capacity(&store), "{} keys held", store.len());
    store.audit();
}

/// While a shard drains, a key not yet moved is found by every path: a lookup from a thread
/// whose cached table is the new one, a decision, and the drain itself later.
#[test]
fn keys_still_in_a_drain_are_found() {
    let store = store();
    // Insert until a few shards are mid-drain (each insert visits only a few slots).
    let mut keys = 0u64;
    while keys < 1_000 || store.draining() < 4 {
        insert(&store, keys, keys + 1, &KEEP_ALL);
        keys += 1;
        assert!(keys < 1_000_000, "no shard stays draining");
    }
    // From another thread (its own cache) and from this one (cache = new tables).
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for key in 0..keys {
                assert_eq!(get(&store, key), Some(key + 1), "key {key}");
            }
        });
    });
    for key in 0..keys {
        assert_eq!(get(&store, key), Some(key + 1), "key {key}");
    }
    assert_eq!(store.len(), keys as usize);
    store.audit();
}

/// A table replaced on a low estimate (the sampled keys were fresh, the others turn out to hold
/// state) would overfill as its drain moves keys in: that table joins the drains, replaced by
/// one sized for every live key, and no key is lost (nor does a probe loop forever).
#[test]
fn a_drain_that_would_overfill_its_table_chains_it() {
    for seed in SEEDS_THAT_CHAIN {
        overfilling_drains_chain(seed);
    }
}

/// Seeds under which the keys fall so that the first replacement's table overfills (under
/// others, about one in ten, its estimate is high enough and nothing chains).
const SEEDS_THAT_CHAIN: [u64; 3] = [
    0xD1B5_4A32_D192_ED03,
    0x4F82_338B_AED8_9116,
    0xA968_ACD7_2CBB_1D57,
];

fn overfilling_drains_chain(seed: u64) {
    let store = evicting_store(seed);
    let mut key = 0u64;
    while key < 20_000 {
        insert(&store, key, 0, &KEEP_ALL);
        key += 1;
    }
    // End every drain (an explicit sweep that keeps every key).
    assert_eq!(store.len(), 20_000);
    assert_eq!(store.retain(|_| true), 0);
    assert_eq!(store.len(), 20_000);
    assert_eq!(store.draining(), 0);
    // The next inserts judge state 0 fresh: the first replacement's sample finds every key
    // fresh, so its new table is sized for few keys.
    while store.draining() == 0 {
        insert(&store, key, 0, &EVICT_ZERO);
        key += 1;
        assert!(key < 1_000_000, "no table replaced");
    }
    let before = capacity(&store);
    // Now every key holds state: moving them into the small table overfills it.
    for k in 0..key {
        store.with_existing(&k, 0, |cell| add(cell, 1));
        if k % 256 == 0 {
            store.audit(); // drains chained and running, too
        }
    }
    let held: Vec<u64> = (0..key).filter_map(|k| get(&store, k)).collect();
    assert_eq!(held.len(), store.len(), "the count matches the keys found");
    assert!(held.iter().all(|&s| s == 1), "{held:?}");
    assert!(
        held.len() as u64 > key - 100,
        "only {} of {key} keys left",
        held.len()
    );
    assert!(
        capacity(&store) > before,
        "the small table was chained, into a larger one"
    );
    assert_eq!(store.draining(), 0, "the lookups ended the drains");
    store.audit();
}

/// Below `evict_above` the tables grow as a hash map's: after a drain, between 11/16 and 7/8 of
/// each large table holds keys (at most 1.46 slots a key), but for a shard's first table past
/// 4,096 slots, rounded up to its ladder (`staggered`: up to 14/11 larger); and lookups alone
/// end the drains that inserts left running, freeing their tables.
#[test]
fn tables_stay_dense_and_lookups_end_drains() {
    let store = store();
    let mut next = 0u64;
    for keys in [100_000u64, 150_000, 230_000] {
        while next < keys {
            insert(&store, next, 1, &KEEP_ALL);
            next += 1;
        }
        for key in 0..keys {
            assert_eq!(get(&store, key), Some(1), "key {key}");
        }
        assert_eq!(
            store.draining(),
            0,
            "{keys} keys: a drain still holds its table"
        );
        let slots = capacity(&store);
        assert!(
            slots as u64 * 11 * 11 <= keys * 16 * 14 + 64 * 11 * 11,
            "{keys} keys in {slots} slots"
        );
        assert!(slots as u64 * 7 >= keys * 8, "{keys} keys in {slots} slots");
    }
}

/// A hasher whose hash of a `u64` is the key itself, to place keys by hand.
#[derive(Default)]
struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Keys that share a shard, a home slot (the table's last) and a tag: every probe wraps past the
/// table's end and meets matching tags of other keys; each key is still found, and a key never
/// inserted is not.
#[test]
fn probes_past_equal_tags_and_the_table_end() {
    let store: WordTable<u64, std::hash::BuildHasherDefault<Identity>> =
        WordTable::new(MARKS, Default::default());
    // Shard 0 (top bits 0), tag byte 0x2A, home = the last slot (low 32 bits all ones); the
    // bits between the tag and the shard tell the keys apart.
    let key = |i: u64| i << 40 | 0x2A << 32 | 0xFFFF_FFFF;
    let n = 300; // enough to replace the table a few times
    for i in 0..n {
        let (_, done) = inserting(&store, &key(i), |cell| add(cell, i + 1), &KEEP_ALL);
        assert!(done.inserted, "key {i}");
        for j in 0..=i {
            assert_eq!(
                store.with_existing(&key(j), 0, |cell| add(cell, 0)),
                Some(j + 1),
                "key {j} after {i} inserts"
            );
        }
        assert_eq!(
            store.with_existing(&key(n + i), 0, |cell| add(cell, 0)),
            None
        );
    }
    assert_eq!(store.len(), n as usize);
    store.audit();
}

/// A growing store builds each large table ahead, a page of slots per insert, so that the
/// insert that finds its table full takes it ready-made: up to 600k keys (tables of ~20k
/// slots a shard), no call allocates, maps or fills a large table. It builds late, since a
/// table built ahead is resident until used: over the growth, the tables being built or
/// built hold 3 % of the slots in use (started as many inserts before full as a table twice
/// the current one takes, 4.8 %; at 27/28 of the capacity, 64 slots an insert, 14 %).
#[test]
fn growth_builds_large_tables_ahead() {
    let store = store();
    let (mut built, mut used) = (0, 0);
    for key in 0..600_000u64 {
        assert!(insert(&store, key, 1, &KEEP_ALL));
        if key >= 300_000 && key % 1_000 == 0 {
            built += store.built_ahead();
            used += capacity(&store);
        }
    }
    assert!(
        built * 100 < used * 4,
        "tables built ahead: {built} slots against {used}"
    );
    assert!(capacity(&store) > 64 * 4096, "the tables did grow large");
    assert_eq!(store.allocated_large(), 0);
    assert_eq!(store.built_unused(), 0);
    for key in (0..600_000u64).step_by(997) {
        assert_eq!(get(&store, key), Some(1), "key {key}");
    }
    store.audit();
}

/// A table that moves to a new era (its limiter re-anchored the window indices) is replaced by
/// one sized for its keys, made in the first call into its shard that meets the era (unless
/// the table the shard built ahead for growth is complete and fits): besides a chained
/// drain's, the one large table not built ahead, and the count that the tests of growth and of
/// the bound hold at 0 sees each of them, as the count of tables built for nothing sees those
/// the move leaves unused.
#[test]
fn a_move_to_a_new_era_makes_one_large_table_a_shard_in_the_call() {
    use super::word_table::SHARDS;
    let store = store();
    for key in 0..400_000u64 {
        assert!(insert(&store, key, 1, &KEEP_ALL));
    }
    assert!(capacity(&store) > SHARDS * 4096, "the tables grew large");
    assert_eq!(store.allocated_large(), 0);
    let building = store.building();
    assert!(building > 0, "no shard building its next table");
    for key in 0..400_000u64 {
        let mut done = Inserted::default();
        store.with_inserted(&key, 1, |cell| add(cell, 0), &KEEP_ALL, &mut done);
    }
    // The tables being built were for growth, not this move: each is taken by the move (built
    // and of a size that fits) or dropped and counted; every other shard made its table.
    let unused = store.built_unused();
    assert!(
        unused <= building,
        "{unused} of {building} built tables unused"
    );
    assert_eq!(
        store.allocated_large() + (building - unused),
        SHARDS,
        "one table a shard: made in the call or built ahead"
    );
    for key in (0..400_000u64).step_by(997) {
        assert_eq!(store.with_existing(&key, 1, |cell| add(cell, 0)), Some(1));
    }
    store.audit();
}

thread_local! {
    /// Copies of `Counted` keys made and dropped on this thread.
    static COPIES: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// A key that counts its copies, to see when a store drops the keys of a table.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Counted(u64);

impl Counted {
    fn new(key: u64) -> Self {
        COPIES.with(|c| c.set((c.get().0 + 1, c.get().1)));
        Counted(key)
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::new(self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        COPIES.with(|c| c.set((c.get().0, c.get().1 + 1)));
    }
}

/// A shard's table grows into pages mapped for it alone: keys with drop glue are written into
/// it, read, moved out of it into the next mapped table, and every copy is dropped once when
/// the tables go (run under Miri too, `scripts/test.sh`: the mapped slots' keys).
#[test]
fn a_mapped_table_is_written_moved_and_freed() {
    let keys: u64 = if cfg!(miri) { 300 } else { 3000 };
    {
        let store: WordTable<Counted, std::hash::BuildHasherDefault<Identity>> =
            WordTable::new(MARKS, Default::default());
        // Shard 0 (top bits 0), homes and tags spread by the low bits.
        let key = |i: u64| Counted::new(i.wrapping_mul(0x9E37_79B9) & 0x00FF_FFFF_FFFF);
        for i in 0..keys {
            inserting(&store, &key(i), |cell| add(cell, 1), &KEEP_ALL);
        }
        assert_eq!(store.mapped_tables(), 1, "shard 0's table is mapped");
        for _ in 0..2 {
            for i in 0..keys {
                assert_eq!(
                    store.with_existing(&key(i), 0, |cell| add(cell, 0)),
                    Some(1)
                );
            }
        }
        assert_eq!(store.len(), keys as usize);
        store.audit();
    }
    let (made, gone) = COPIES.with(|c| c.get());
    assert_eq!(made, gone, "every copy of every key dropped once");
}

/// A growing store's replaced tables are dropped a few keys per call once drained, not all
/// in the call whose drain ends (a table of 40k `u64` slots took 76 µs to drop), and every
/// copy of a key a table held is dropped in the end.
#[test]
fn replaced_tables_are_dropped_a_few_keys_per_call() {
    let store: WordTable<Counted, foldhash::fast::RandomState> =
        WordTable::new(MARKS, foldhash::fast::RandomState::default());
    let dropped = || COPIES.with(|c| c.get().1);
    let mut most = 0;
    for key in 0..200_000u64 {
        let key = Counted::new(key);
        let before = dropped();
        let (_, inserted) = inserting(&store, &key, |cell| add(cell, 1), &KEEP_ALL);
        assert!(inserted.inserted);
        most = most.max(dropped() - before);
    }
    assert!(
        most <= crate::store::word_table::CLEAR_STEP,
        "a call dropped {most} keys"
    );
    // Calls on keys held go on draining and releasing what the last growth left: as many as
    // that takes (a shard whose table grew just before the last insert needs ~len/16 calls to
    // drain it and len/64 more to release it; 20,000 calls spread over 64 shards were not
    // always enough, by the hasher's seed), within a bound.
    for call in 0u64.. {
        if store.draining() == 0 && store.retired_slots() == 0 {
            break;
        }
        assert!(call < 400_000, "drains and releases never ended");
        let key = Counted::new(call % 200_000);
        let (_, inserted) = inserting(&store, &key, |cell| add(cell, 0), &KEEP_ALL);
        assert!(!inserted.inserted);
    }
    let (made, gone) = COPIES.with(|c| c.get());
    assert_eq!(
        made - gone,
        store.len(),
        "copies alive beyond the keys held"
    );
    store.audit();
}

/// A store whose keys stopped growing returns its retired tables through lookups alone:
/// before, they waited for an insert, and a server whose clients stayed the same kept its
/// last drained tables (twice the memory) for good.
#[test]
fn lookups_alone_release_retired_tables() {
    let store: WordTable<Counted, foldhash::fast::RandomState> =
        WordTable::new(MARKS, foldhash::fast::RandomState::default());
    // Inserts until most shards are draining (their tables just grew): the drains, then the
    // drained tables, are left to the lookups.
    let mut keys = 0;
    while keys < 20_000 || store.draining() < 32 {
        inserting(&store, &Counted::new(keys), |cell| add(cell, 1), &KEEP_ALL);
        keys += 1;
        assert!(keys < 1_000_000, "no growth left most shards draining");
    }
    for _ in 0..4 {
        for key in 0..keys {
            assert_eq!(
                store.with_existing(&Counted::new(key), 0, |cell| add(cell, 0)),
                Some(1)
            );
        }
    }
    assert_eq!((store.draining(), store.retired_slots()), (0, 0));
    let alive = COPIES.with(|c| c.get().0 - c.get().1);
    assert_eq!(alive, store.len(), "copies alive beyond the keys held");
    store.audit();
}

/// A shard reaching its `evict_above` share builds the table it then moves to ahead, as a
/// growing shard does, and so do its later replacements (a drained table in mapped pages is
/// released, not kept as a spare): a flood of fresh keys through the bound makes no call
/// allocate or map a large table, and no table is built for nothing.
#[test]
fn a_flood_through_the_bound_allocates_no_large_table_in_a_call() {
    let mut store = store();
    store.set_evict_above(64 * 10_000);
    for key in 0..3_000_000u64 {
        insert(&store, key, 0, &EVICT_ZERO);
    }
    assert_eq!(store.allocated_large(), 0);
    assert!(store.len() < 2 * 640_000, "held {}", store.len());
    assert_eq!(store.built_unused(), 0, "tables built and not used");
    assert_eq!(store.spares_reused(), 0, "mapped tables kept as spares");
    store.audit();
}

/// A `u64` key and its state fill 16 bytes: no flag beside the key (its tag says it is set).
#[test]
fn a_u64_slot_is_two_words() {
    assert_eq!(
        std::mem::size_of::<super::word_table::Slot<u64, AtomicWord>>(),
        16
    );
}

/// The keys' lifecycle on a small store, for Miri (`cargo +nightly miri test --lib
/// keys_are_written_read_moved_and_dropped_once`): `String` keys (with drop glue) inserted
/// through several growths and drains, found lock-free, moved, evicted at a small bound
/// (drained tables become spares, cleared and reused), swept by `retain`, and dropped with the
/// store; `Counted` keys check that every copy is dropped exactly once.
#[test]
fn keys_are_written_read_moved_and_dropped_once() {
    let keys: u64 = if cfg!(miri) { 400 } else { 20_000 };
    let store: WordTable<Counted, foldhash::fast::RandomState> =
        WordTable::new(MARKS, foldhash::fast::RandomState::default());
    for key in 0..keys {
        inserting(&store, &Counted::new(key), |cell| add(cell, 1), &KEEP_ALL);
    }
    for key in 0..keys {
        assert_eq!(
            store.with_existing(&Counted::new(key), 0, |cell| add(cell, 0)),
            Some(1)
        );
    }
    assert_eq!(store.retain(|_| true), 0);
    assert_eq!(store.len(), keys as usize);
    drop(store);
    let (made, gone) = COPIES.with(|c| c.get());
    assert_eq!(made, gone, "every copy of every key dropped once");

    let mut strings: WordTable<String, foldhash::fast::RandomState> =
        WordTable::new(MARKS, foldhash::fast::RandomState::default());
    strings.set_evict_above(64);
    let text = |key: u64| format!("key-{key}");
    for round in 0..3u64 {
        for key in 0..keys {
            let judge = if round == 0 { &KEEP_ALL } else { &EVICT_ZERO };
            strings.with_inserted(
                text(key + round * keys).as_str(),
                0,
                |cell| add(cell, 0),
                judge,
                &mut Inserted::default(),
            );
        }
    }
    // `keep` retires what it rejects, as a rule's judge does (never a mark): every key goes.
    let keep = |cell: &AtomicWord| cell.retire_if(MARKS.tombstone, |s| !MARKS.any(s)).is_none();
    assert!(strings.retain(keep) > 0);
    assert_eq!(strings.len(), 0);
}

/// Which trait call of [`Touchy`] panics, every how many calls (thread-local: tests run on
/// threads of their own).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Hash,
    Eq,
    Clone,
    Drop,
}

thread_local! {
    static PANICS: std::cell::Cell<Option<(Call, u64)>> = const { std::cell::Cell::new(None) };
    static CALLS: std::cell::Cell<[u64; 4]> = const { std::cell::Cell::new([0; 4]) };
    /// Keys made and dropped.
    static TOUCHY: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Leaves out the messages of the planted panics (others print as before).
fn quiet_planted_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planted = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|s| s.starts_with("planted panic"));
            if !planted {
                default(info);
            }
        }));
    });
}

/// Counts a call of `call` and panics if this is the one chosen.
fn touch(call: Call) {
    if std::thread::panicking() {
        return; // a panic while unwinding aborts, whatever the store does
    }
    let n = CALLS.with(|c| {
        let mut calls = c.get();
        calls[call as usize] += 1;
        c.set(calls);
        calls[call as usize]
    });
    if PANICS
        .with(|p| p.get())
        .is_some_and(|(which, every)| which == call && n % every == 0)
    {
        panic!("planted panic in {call:?}");
    }
}

/// A key with heap memory (a double drop is a double free, which Miri reports) whose `Hash`,
/// `Eq`, `Clone` and `Drop` panic when [`PANICS`] says so.
struct Touchy(Box<u64>);

impl Touchy {
    fn new(key: u64) -> Self {
        TOUCHY.with(|c| c.set((c.get().0 + 1, c.get().1)));
        Touchy(Box::new(key))
    }
}

impl std::hash::Hash for Touchy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        touch(Call::Hash);
        self.0.hash(state);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        touch(Call::Eq);
        self.0 == other.0
    }
}

impl Eq for Touchy {}

impl Clone for Touchy {
    fn clone(&self) -> Self {
        touch(Call::Clone);
        Touchy::new(*self.0)
    }
}

impl Drop for Touchy {
    fn drop(&mut self) {
        TOUCHY.with(|c| c.set((c.get().0, c.get().1 + 1)));
        touch(Call::Drop);
    }
}

/// Keys whose `Hash`, `Eq`, `Clone` or `Drop` panic every few calls, through growths, drains
/// (evicting ones too), spares cleared and tables released, each call's panic caught: no key
/// is dropped twice (Miri: `cargo +nightly miri test --lib keys_that_panic`), every key made is
/// dropped once the store is, every key inserted is found with its state, and `len()` counts
/// the keys held.
#[test]
fn keys_that_panic_are_never_dropped_twice_nor_lost() {
    quiet_planted_panics();
    let keys: u64 = if cfg!(miri) { 150 } else { 5_000 };
    for call in [Call::Hash, Call::Eq, Call::Clone, Call::Drop] {
        for evict_above in [usize::MAX, 64] {
            let every = if call == Call::Eq { 3 } else { 17 };
            let mut store: WordTable<Touchy, foldhash::fast::RandomState> =
                WordTable::new(MARKS, foldhash::fast::RandomState::default());
            store.set_evict_above(evict_above);
            let judge = if evict_above == 64 {
                &EVICT_ZERO
            } else {
                &KEEP_ALL
            };
            // Every key holds state 1 once its insert returned; one whose insert panicked
            // may or may not be held.
            let mut held = vec![false; keys as usize];
            PANICS.with(|p| p.set(Some((call, every))));
            for round in 0..2 {
                for key in 0..keys {
                    let touchy = Touchy::new(key);
                    let insert = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        inserting(&store, &touchy, |cell| add(cell, 0), judge)
                    }));
                    PANICS.with(|p| p.set(None));
                    drop(touchy);
                    PANICS.with(|p| p.set(Some((call, every))));
                    if insert.is_ok() && round == 0 && evict_above == usize::MAX {
                        held[key as usize] = true;
                    }
                }
            }
            PANICS.with(|p| p.set(None));
            store.audit();
            if evict_above == usize::MAX {
                for key in 0..keys {
                    let found = store.with_existing(&Touchy::new(key), 0, |cell| add(cell, 0));
                    if held[key as usize] {
                        assert_eq!(found, Some(0), "{call:?}: key {key} lost");
                    }
                }
                let len = store.len();
                let least = held.iter().filter(|&&h| h).count();
                assert!(least <= len && len <= keys as usize, "{call:?}: len {len}");
            }
            drop(store);
            let (made, gone) = TOUCHY.with(|c| c.get());
            assert_eq!(
                made, gone,
                "{call:?}, evict_above {evict_above}: keys made and dropped"
            );
        }
    }
}

/// Each call's work, through a keyed limiter, as its window indices are re-anchored and as its
/// tables grow: no call visits more than `MOST_VISITED` slots (a re-anchoring carries each
/// shard's keys into the new era a drain step at a time), and no call allocates more than one
/// table, sized for its shard's keys. Decisions stay exact across it: each is the one a twin
/// limiter on the dashmap store (swept whole at each re-anchoring) makes.
#[test]
fn no_call_does_more_than_its_bound_across_a_re_anchoring_and_a_growth() {
    use super::word_table::{work, MOST_VISITED, SHARDS};
    use crate::clock::ManualClock;
    use crate::store::DashMapStore;
    use crate::{KeyedLimiter, Quota, SlidingWindow};
    use std::time::Duration;

    const KEYS: u64 = 200_000;
    let clock = ManualClock::new();
    // Window 10: the limiters anchor their indices at window 8, and re-anchor from window
    // 8 + 2^22 on.
    clock.set(10_000_000_000);
    let rule = SlidingWindow::new(Quota::per_second(3).unwrap()).unwrap();
    let limiter: KeyedLimiter<u64, _, _> = KeyedLimiter::with_clock(rule, clock.clone()).unwrap();
    let twin = KeyedLimiter::<u64, _, _>::builder(rule)
        .clock(clock.clone())
        .build_with_store(DashMapStore::new())
        .unwrap();
    let most_allocated = 4 * (KEYS as usize / SHARDS) + 4096;
    let (mut calls, mut allocated_in_all) = (0, 0);
    let mut check = |key: u64| {
        let decision = limiter.check(&key).unwrap();
        let (visited, allocated) = work::take();
        allocated_in_all += allocated;
        let expected = twin.check(&key).unwrap();
        assert_eq!(
            (decision.allowed(), decision.remaining()),
            (expected.allowed(), expected.remaining()),
            "call {calls}, key {key}"
        );
        assert!(
            visited <= MOST_VISITED,
            "call {calls} visited {visited} slots"
        );
        assert!(
            allocated <= most_allocated,
            "call {calls} allocated {allocated} slots"
        );
        calls += 1;
    };
    for key in 0..KEYS {
        check(key);
    }
    // Into the last window before the re-anchoring: keys 0..KEYS/2 check twice there, and
    // hold state across it.
    clock.advance(Duration::from_secs((1 << 22) - 3));
    for key in 0..KEYS / 2 {
        check(key);
        check(key);
    }
    // Into the next: the first call re-anchors; every key is checked, the busy ones (their
    // previous window weighs) and the idle ones (fresh: their state is 2^22 windows old).
    clock.advance(Duration::from_millis(1_000) + Duration::from_nanos(1));
    for key in 0..KEYS {
        check(key);
    }
    // And as many new keys again: every shard grows, and drains keys of both eras.
    clock.advance(Duration::from_millis(400));
    for key in KEYS..3 * KEYS {
        check(key);
    }
    for key in 0..KEYS {
        check(key);
    }
    assert_eq!(limiter.len(), 3 * KEYS as usize);
    // The bound above is held to a count that sees the tables made (the small ones, on the
    // heap, are initialised where they are allocated).
    assert!(allocated_in_all > 0, "no table counted");
}

/// At `max_keys`, a new key may add up to 4 steps of the eviction hand, each at most 1,024
/// slots (`KeyedLimiter`'s "Work per call"): a flood of new keys through the bound, half of
/// them holding state and half fresh, never takes a call past that.
#[test]
fn no_call_at_max_keys_does_more_than_its_bound() {
    use super::word_table::{work, MOST_VISITED};
    use crate::clock::ManualClock;
    use crate::{Gcra, KeyedLimiter, OverflowPolicy, Quota};
    use std::time::Duration;

    let clock = ManualClock::new();
    let rule = Gcra::new(Quota::per_second(10).unwrap()).unwrap();
    let limiter = KeyedLimiter::<u64, _>::builder(rule)
        .clock(clock.clone())
        .max_keys(20_000, OverflowPolicy::Shared)
        .build()
        .unwrap();
    let bound = MOST_VISITED + 4 * 1024;
    let mut most = 0;
    for key in 0..200_000u64 {
        // Every other key spends its whole burst (not fresh for a second), the others one
        // unit (fresh 100 ms later).
        let cost = if key % 2 == 0 { 10 } else { 1 };
        limiter.check_n(&key, cost).unwrap();
        let (visited, _) = work::take();
        most = most.max(visited);
        assert!(visited <= bound, "key {key}: {visited} slots visited");
        if key % 1000 == 999 {
            clock.advance(Duration::from_millis(50));
        }
    }
    assert!(limiter.len() <= 20_000);
    assert!(most > MOST_VISITED, "the hand ran ({most} slots at most)");
}

/// Evictions an interrupted call had taken from their shards are put back for a later call
/// to report (`Taken`): the eviction hand runs over shards whose drains clone keys that panic
/// every few clones, and every eviction is reported exactly once in the end.
#[test]
fn evictions_taken_by_an_interrupted_hand_are_reported_later() {
    quiet_planted_panics();
    let mut store: WordTable<Touchy, foldhash::fast::FixedState> =
        WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(7));
    store.set_evict_above(64);
    // Even keys fresh (state 0), odd ones holding state, all kept: the inserts judge nothing.
    // They stop while many shards still drain a replaced table, for the hand to drain: it
    // evicts the fresh keys and moves the others (clones, some of which panic).
    let mut keys = 0;
    while keys < 100_000 && (keys < 2_000 || store.draining() < 24) {
        inserting(
            &store,
            &Touchy::new(keys),
            |cell| add(cell, keys % 2),
            &KEEP_ALL,
        );
        keys += 1;
    }
    assert!(store.draining() >= 24, "drains left running for the hand");
    let mut reported = 0;
    let mut interrupted = 0;
    PANICS.with(|p| p.set(Some((Call::Clone, 5))));
    for _ in 0..200 {
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.evict_some(&EVICT_ZERO, 32)
        }));
        match step {
            Ok(evicted) => reported += evicted,
            Err(_) => interrupted += 1,
        }
    }
    PANICS.with(|p| p.set(None));
    // The rest, without panics, until the hand finds nothing more.
    for calls in 1.. {
        let evicted = store.evict_some(&EVICT_ZERO, 1 << 20);
        reported += evicted;
        if evicted == 0 && store.draining() == 0 {
            break;
        }
        assert!(calls < 1_000, "the hand still evicts or drains");
    }
    assert!(interrupted > 0, "no hand step was interrupted");
    store.audit();
    assert_eq!(
        store.len() as u64,
        keys / 2,
        "every fresh key evicted, the others kept"
    );
    assert_eq!(reported as u64, keys - keys / 2, "evictions reported");
}

/// A limiter of sliding logs that lets its store evict every empty ring, judged at a time of
/// its own (logs whose entries have expired by then are empty).
struct EmptyLogs(crate::SlidingLog, Nanos);

impl Evictor<crate::state::LogCell> for EmptyLogs {
    fn sweep(&self) -> usize {
        unreachable!("the word table evicts on its own")
    }

    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&crate::state::LogCell, Nanos) -> bool) -> R,
    ) -> Option<R> {
        let Self(rule, at) = *self;
        Some(f(at, &|cell, _since| cell.evict_if_empty(&rule, at)))
    }
}

/// The table on log cells: tombstones (evicted empty logs) are neither live nor counted,
/// through drains and replacements at the bound; every key that holds entries is found with
/// them, and the shards' counts match their slots (`audit`).
#[test]
fn log_cells_evicted_in_a_full_table_are_neither_found_nor_counted() {
    use crate::state::LogCell;
    use crate::{Quota, SlidingLog};
    let rule = SlidingLog::new(Quota::per_second(1_000).unwrap()).unwrap();
    let mut store: WordTable<u64, foldhash::fast::FixedState, LogCell> = WordTable::new(
        (),
        foldhash::fast::FixedState::with_seed(0xD1B5_4A32_D192_ED03),
    );
    store.set_evict_above(1);
    // Even keys log an entry; odd keys stay empty, so the tables fill with keys to evict.
    for key in 0..20_000u64 {
        let mut done = Inserted::default();
        store.with_inserted(
            &key,
            0,
            |cell: &LogCell| {
                if key % 2 == 0 {
                    cell.decide(&rule, || 0, 1, true);
                }
            },
            &EmptyLogs(rule, 0),
            &mut done,
        );
        if key % 1_024 == 0 {
            store.audit();
        }
    }
    store.audit();
    for key in (0..20_000u64).step_by(2) {
        let entries = store.with_existing(&key, 0, |cell: &LogCell| {
            cell.retired().is_none().then(|| cell.entries())
        });
        assert_eq!(entries, Some(1), "key {key} keeps its entry");
    }
    assert!(
        store.len() >= 10_000 && store.len() < 20_000,
        "{}",
        store.len()
    );
}

/// A table of log cells (on the heap: a zero `LogCell` is not a fresh one) at its
/// `evict_above` share keeps each drained table as a spare, cleared a few slots per insert, and
/// takes it as the next one: a flood of keys with empty logs through the bound reuses spares,
/// and no call allocates a large table. (A table in mapped pages releases its drained one:
/// `a_flood_through_the_bound_allocates_no_large_table_in_a_call`.)
#[test]
fn a_heap_table_at_the_bound_reuses_its_drained_tables() {
    use crate::state::LogCell;
    use crate::{Quota, SlidingLog};
    let rule = SlidingLog::new(Quota::per_second(1_000).unwrap()).unwrap();
    let mut store: WordTable<u64, foldhash::fast::FixedState, LogCell> = WordTable::new(
        (),
        foldhash::fast::FixedState::with_seed(0xD1B5_4A32_D192_ED03),
    );
    store.set_evict_above(64 * 1_000);
    for key in 0..300_000u64 {
        let mut done = Inserted::default();
        store.with_inserted(&key, 0, |_: &LogCell| (), &EmptyLogs(rule, 0), &mut done);
    }
    assert!(
        store.spares_reused() > 64,
        "spares reused: {}",
        store.spares_reused()
    );
    assert_eq!(store.allocated_large(), 0);
    assert_eq!(store.built_unused(), 0);
    assert!(store.len() < 2 * 64_000, "held {}", store.len());
    store.audit();
}

/// A judge that evicts the cells holding 0, as [`EVICT_ZERO`] does, and counts the cells it
/// is asked about: the keys a step judges.
#[derive(Default)]
struct CountingJudge(std::cell::Cell<usize>);

impl Evictor<AtomicWord> for CountingJudge {
    fn sweep(&self) -> usize {
        unreachable!("the word table evicts on its own")
    }

    fn judging<R>(
        &self,
        f: impl FnOnce(Nanos, &dyn Fn(&AtomicWord, Nanos) -> bool) -> R,
    ) -> Option<R> {
        Some(f(0, &|cell, _since| {
            self.0.set(self.0.get() + 1);
            cell.retire_if(MARKS.tombstone, |s| s == 0).is_some()
        }))
    }
}

/// A shard as the model of the hand sees it: each slot's key state (`Some(None)`: retired).
type ShardView = super::word_table::HandView<Option<u64>>;

/// What one step of the eviction hand does, as `evict_some` states it, on plain vectors:
/// shard after shard from the store's hand, while fewer than `budget` keys are judged and
/// fewer than `32 × budget` slots visited; a shard's drains first (`budget − judged` slots a
/// call, every key in them judged), then `HAND_RUNS` runs down the table from the shard's
/// hand and from each further quarter of it: the first judges `⌈left / HAND_RUNS⌉` live keys
/// within its share of the slots, the others walk as many slots as it did, and the shard's
/// hand moves back past the first. Returns the keys judged, evicted and the slots visited.
fn model_step(shards: &mut [ShardView], hand: &mut usize, budget: usize) -> [usize; 3] {
    use super::word_table::{HAND_RUNS, SHARDS};
    let live =
        |slots: &[Option<Option<u64>>]| slots.iter().filter(|s| matches!(s, Some(Some(_)))).count();
    let (mut judged, mut slots, mut asked, mut evicted, mut visited) = (0, 0, 0, 0, 0);
    for _ in 0..SHARDS {
        if judged >= budget || slots >= 32 * budget {
            break;
        }
        let shard = &mut shards[*hand % SHARDS];
        *hand += 1;
        if live(&shard.table) + shard.drains.iter().map(|d| live(d)).sum::<usize>() == 0 {
            continue;
        }
        while !shard.drains.is_empty() && judged < budget && slots < 32 * budget {
            let left = |d: &[Vec<Option<Option<u64>>>]| {
                (
                    d.iter().map(|d| live(d)).sum::<usize>(),
                    d.iter().map(Vec::len).sum::<usize>(),
                )
            };
            let ((keys, unvisited), chunk) = (left(&shard.drains), budget - judged);
            let mut step = 0;
            while let Some(drain) = shard.drains.first_mut() {
                if live(drain) == 0 {
                    shard.drains.remove(0);
                    break;
                }
                if step == chunk {
                    break;
                }
                step += 1;
                visited += 1;
                if let Some(state) = drain.remove(0) {
                    asked += 1;
                    assert_eq!(state, Some(0), "the model's drains hold fresh keys only");
                    evicted += 1;
                }
            }
            let (keys_now, unvisited_now) = left(&shard.drains);
            judged += keys - keys_now;
            slots += chunk.min(unvisited - unvisited_now).max(1);
        }
        let len = shard.table.len();
        let from = shard.hand % len;
        let share = len.min((32 * budget).saturating_sub(slots)) / HAND_RUNS;
        let mut run = share.max(1);
        for i in 0..HAND_RUNS {
            let keys = if i == 0 {
                budget.saturating_sub(judged).div_ceil(HAND_RUNS)
            } else {
                usize::MAX
            };
            let (mut at, mut walked, mut found) = (from + i * (len / HAND_RUNS), 0, 0);
            while walked < run && found < keys {
                walked += 1;
                at = (at + len - 1) % len;
                if let Some(Some(state)) = shard.table[at] {
                    (found, asked) = (found + 1, asked + 1);
                    if state == 0 {
                        shard.table[at] = Some(None);
                        evicted += 1;
                    }
                }
            }
            if i == 0 {
                run = walked;
            }
            (judged, visited, slots) = (judged + found, visited + walked, slots + walked);
        }
        shard.hand = (from + len - run % len) % len;
    }
    [asked, evicted, visited]
}

/// The eviction hand's steps, slot for slot, against [`model_step`]: which keys each step
/// judges and evicts, how many slots it visits, where each shard's hand ends. Shards with
/// drains of fresh keys and tables of fresh keys and keys holding state, tombstones left by
/// earlier steps, budgets from 1 to 48.
#[test]
fn the_eviction_hand_judges_what_it_states() {
    use super::word_table::work;
    type Placed = WordTable<u64, std::hash::BuildHasherDefault<Identity>>;
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let read = |cell: &AtomicWord| add(cell, 0);
    let (mut drained_steps, mut capped_steps) = (0, 0);
    for case in 0..24u64 {
        let store = Placed::new(MARKS, Default::default());
        // Keys of shards 0 to 5 (the top 6 bits), a distinct middle, a random tag and home.
        let mut made = 0u64;
        let mut key = |shard: u64, r: u64| {
            made += 1;
            shard << 58 | made << 40 | r & 0xFF_FFFF_FFFF
        };
        let sizes: Vec<u64> = (0..6).map(|_| next(400)).collect();
        // Fresh keys, round the shards, so that some stop with a growth's drain running.
        for round in 0..400 {
            for (shard, &size) in sizes.iter().enumerate() {
                if round < size {
                    inserting(
                        &store,
                        &key(shard as u64, next(u64::MAX)),
                        |c| add(c, 0),
                        &KEEP_ALL,
                    );
                }
            }
        }
        // Keys holding state, into tables with room (no growth: the drains stay fresh).
        for shard in 0..6 {
            for _ in 0..next(24) {
                let view = store.hand_view(shard, read);
                let used = view.table.iter().flatten().count();
                if (used + 1) * 16 <= view.table.len() * 7 {
                    let (k, n) = (key(shard as u64, next(u64::MAX)), 1 + next(2));
                    inserting(&store, &k, |c| add(c, n), &KEEP_ALL);
                }
            }
        }
        let mut model: Vec<ShardView> = (0..SHARDS).map(|i| store.hand_view(i, read)).collect();
        let mut hand = 0;
        for step in 0..40 {
            let budget = 1 + next(48) as usize;
            let judge = CountingJudge::default();
            let draining = model.iter().any(|s| !s.drains.is_empty());
            work::take();
            let evicted = store.evict_some(&judge, budget);
            let (visited, _) = work::take();
            let expected = model_step(&mut model, &mut hand, budget);
            let what = format!("case {case}, step {step}, budget {budget}");
            assert_eq!(
                [judge.0.get(), evicted, visited],
                expected,
                "judged, evicted, visited: {what}"
            );
            for (i, shard) in model.iter().enumerate() {
                assert_eq!(&store.hand_view(i, read), shard, "shard {i}: {what}");
            }
            drained_steps += usize::from(draining);
            capped_steps += usize::from(visited >= 32 * budget);
        }
        store.audit();
    }
    // A drain whose next slots hold no key: a step of budget 1 spends its 32 slots there, one
    // a call, stops the drain at exactly 32, and each run of the table walks its one slot
    // (keys homed in the lower half of every table leave the upper half of a small table
    // empty, and the drain visits it first).
    let store = Placed::new(MARKS, Default::default());
    let mut key = 0u64;
    let empty_run = |view: &ShardView| {
        let first = view.drains.first().map_or(&[][..], Vec::as_slice);
        first.iter().take_while(|slot| slot.is_none()).count()
    };
    while empty_run(&store.hand_view(0, read)) < 40 {
        key += 1;
        assert!(key < 10_000, "no drain with an empty run");
        let k = key << 40 | 0x2A << 32 | next(1 << 31);
        inserting(&store, &k, |c| add(c, 0), &KEEP_ALL);
    }
    let mut model: Vec<ShardView> = (0..SHARDS).map(|i| store.hand_view(i, read)).collect();
    let judge = CountingJudge::default();
    work::take();
    let evicted = store.evict_some(&judge, 1);
    let (visited, _) = work::take();
    let expected = model_step(&mut model, &mut 0, 1);
    assert_eq!(
        [judge.0.get(), evicted, visited],
        expected,
        "the empty drain"
    );
    let runs = super::word_table::HAND_RUNS;
    assert_eq!(
        expected,
        [0, 0, 32 + runs],
        "32 empty slots, then a slot a run"
    );
    assert_eq!(store.hand_view(0, read), model[0]);
    assert!(drained_steps > 20, "steps over drains: {drained_steps}");
    assert!(
        capped_steps > 20,
        "steps stopped by their slots: {capped_steps}"
    );
}

/// A retired table that another thread still caches waits in the shard, and lookups alone
/// release it once that thread has let go: the shard tells lookups it holds retired tables
/// whether or not one could be taken apart yet.
#[test]
fn a_table_another_thread_cached_is_released_by_lookups_once_it_lets_go() {
    let store = store();
    let look_all = |keys: u64| {
        for key in 0..keys {
            assert_eq!(get(&store, key), Some(1), "key {key}");
        }
    };
    let first = 20_000;
    for key in 0..first {
        insert(&store, key, 1, &KEEP_ALL);
    }
    let look_all = &look_all;
    std::thread::scope(|scope| {
        // Made in the scope: a failed assertion below drops `go`, and the other thread's wait
        // ends (the scope would wait for that thread forever).
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (cached, ready) = std::sync::mpsc::channel::<()>();
        let other = scope.spawn(move || {
            look_all(first); // caches every shard's table
            cached.send(()).unwrap();
            wait.recv().unwrap();
            look_all(first); // lets them go, for the shards' new tables
        });
        ready.recv().unwrap();
        let mut keys = first;
        // (The shards grow at staggered key counts: a few drain at a time.)
        while keys < 2 * first || store.draining() < 8 {
            insert(&store, keys, 1, &KEEP_ALL);
            keys += 1;
            assert!(keys < 20 * first, "shards drain as they grow");
        }
        for passes in 1.. {
            if store.draining() == 0 {
                break;
            }
            assert!(passes < 1_000, "lookups do not end the drains");
            look_all(keys);
        }
        assert!(
            store.retired_slots() > 0,
            "tables the other thread caches are kept"
        );
        go.send(()).unwrap();
        other.join().unwrap();
        for _ in 0..4 {
            look_all(keys);
        }
        assert_eq!(store.retired_slots(), 0, "released by lookups alone");
    });
    store.audit();
}

/// A store whose `u64` keys hash to themselves: a key's top bits pick its shard (the tests of
/// one shard's sizes put every key in shard 0).
type OneShard = WordTable<u64, std::hash::BuildHasherDefault<Identity>>;

/// The slots of shard 0's table: the other 63 shards keep their first table of 8 slots.
fn shard_zero_len(store: &OneShard) -> usize {
    store.capacity() - 63 * 8
}

/// The `i`th key of shard 0 (a distinct middle, any tag and home), `x` a xorshift state.
fn shard_zero_key(i: u64, x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    i << 40 | (*x & 0xFF_FFFF_FFFF)
}

/// The capacity `slots.rs` states for a table of `len` slots: half a small table of up to
/// 1,024 slots; two more for each slot past that, up to 7/8 of a larger one.
fn stated_capacity(len: usize) -> usize {
    let small = len / 2;
    if len <= 1024 {
        small
    } else {
        small.max((len * 7 / 8).min(512 + 2 * (len - 1024)))
    }
}

/// The smallest table (a multiple of 8 slots) whose capacity holds `keys`.
fn smallest_holding(keys: usize) -> Option<usize> {
    (8..).step_by(8).find(|&len| stated_capacity(len) >= keys)
}

/// The table a shard of up to 4,096 slots grows to for `keys` keys, as `slots.rs` states it:
/// the smallest holding 3/2 of them while that is a small table (up to 1,024 slots), else
/// 14/11 of them.
fn stated_growth(keys: usize) -> usize {
    smallest_holding(keys * 3 / 2 + 1)
        .filter(|&len| len <= 1024)
        .or_else(|| smallest_holding(keys * 14 / 11 + 1))
        .expect("a size")
}

/// A new era (the rule re-anchored its window indices) moves a shard's keys into a table of
/// the new era as a full table does: a table grown for the live keys and the inserts until
/// every drain ends, one per drain step of each drain's unvisited slots and of the table it
/// replaces, and one more each. Seen exactly on one shard below 4,096 slots, twice: from a
/// settled table, then again while that first drain has visited two steps.
#[test]
fn a_new_era_moves_the_keys_to_a_table_with_room_for_every_drains_inserts() {
    let store = OneShard::new(MARKS, Default::default());
    let len = || shard_zero_len(&store);
    // Shard 0, a distinct middle, any tag and home (the same for each `i`: looked up again).
    let key = |i: u64| i << 40 | (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xFF_FFFF_FFFF);
    let insert_in = |i: u64, era: u64| {
        let mut done = Inserted::default();
        store.with_inserted(&key(i), era, |cell| add(cell, 1), &KEEP_ALL, &mut done);
        assert!(done.inserted, "key {i}");
    };
    for i in 1..=300 {
        insert_in(i, 0);
    }
    assert_eq!(store.retain(|_| true), 0);
    assert_eq!(store.draining(), 0);
    let settled = len();
    // Era 1: the settled table joins the drains (its first step runs in the same call), and
    // one more call visits one more step.
    assert!(
        settled > 2 * DRAIN_STEP,
        "{settled} slots: a drain of more than two steps"
    );
    insert_in(301, 1);
    let first = len();
    assert_eq!(first, stated_growth(300 + (settled / DRAIN_STEP + 1)));
    insert_in(302, 1);
    assert_eq!((len(), store.draining()), (first, 1), "shard 0 draining");
    // Era 2, with the first drain two steps in: its unvisited slots count, and the table of
    // era 1 it drains into joins them.
    insert_in(303, 2);
    let room = (settled - 2 * DRAIN_STEP) / DRAIN_STEP + 1 + (first / DRAIN_STEP + 1);
    assert_eq!(len(), stated_growth(302 + room));
    assert!(
        len() <= 4096,
        "sized where nothing is staggered or built ahead"
    );
    for i in 1..=303 {
        assert_eq!(
            store.with_existing(&key(i), 2, |cell| add(cell, 0)),
            Some(1),
            "key {i} kept"
        );
    }
}

/// The fill bounds `slots.rs` states, seen from outside on one shard: a table is replaced on
/// the insert that would take it past its capacity (half a small table of up to 1,024 slots;
/// two more for each slot past that, up to 7/8 of a larger one), and a growing
/// shard's next table is the smallest (a multiple of 8 slots) whose capacity holds its keys
/// with room to grow: 3/2 of them while that fits a small table, 14/11 after.
#[test]
fn tables_fill_to_their_stated_bound_and_grow_to_the_stated_size() {
    let store = OneShard::new(MARKS, Default::default());
    let len = || shard_zero_len(&store);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let (mut replaced, mut small, mut large) = (0, 0, 0);
    for i in 1..=8_000u64 {
        // Judged only from a settled table: a drain's moves fill the table too.
        let (settled, before) = (store.draining() == 0, len());
        let key = shard_zero_key(i, &mut x);
        inserting(&store, &key, |cell| add(cell, 1), &KEEP_ALL);
        if !settled {
            continue;
        }
        // Every key inserted so far is live, and all are in the settled table.
        let used = i as usize - 1;
        if len() == before {
            assert!(
                used < stated_capacity(before),
                "key {i}: {used} keys in {before} slots, not replaced"
            );
            continue;
        }
        assert_eq!(
            used,
            stated_capacity(before),
            "key {i}: replaced with {used} keys in {before} slots"
        );
        if before < 2048 {
            // Small and mid tables are allocated when needed (larger ones may be built
            // ahead, a little larger).
            assert_eq!(
                len(),
                stated_growth(used),
                "key {i}: the table after {before} slots"
            );
        }
        replaced += 1;
        if before <= 1024 {
            small += 1;
        } else {
            large += 1;
        }
    }
    assert!(
        small >= 5 && large >= 2,
        "{replaced} replacements: {small} small, {large} large"
    );
}

/// A shard at its `evict_above` share moves to a table sized for the keys it keeps, the
/// drain's inserts with room to spare (one per `SHARE_ROOM` slots of the old table, and one
/// more) and as many again after the drain, and never smaller than one holding the share: the
/// smallest table holding `max(kept + 2 × (old slots / SHARE_ROOM + 1), share)`. Below 4,096
/// slots nothing is built ahead, so the sizing is seen exactly. Returns how many replacements
/// at the share it saw.
fn replacements_at_the_share(state: u64, expected: impl Fn(usize, usize) -> usize) -> usize {
    let mut store = OneShard::new(MARKS, Default::default());
    store.set_evict_above(SHARDS * SHARE);
    let len = || shard_zero_len(&store);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut at_the_share = 0;
    for i in 1..=3_000u64 {
        let (settled, before, live) = (store.draining() == 0, len(), store.len());
        // Judged at the share, where a state of 0 is fresh (evicted) and any other kept.
        let key = shard_zero_key(i, &mut x);
        inserting(&store, &key, |cell| add(cell, state), &EVICT_ZERO);
        // Replaced: a table of another size, or of the same size with a drain begun.
        let replaced = len() != before || store.draining() > 0;
        if !settled || !replaced || live < SHARE {
            continue;
        }
        let room = before / SHARE_ROOM + 1;
        assert_eq!(
            Some(len()),
            smallest_holding(expected(live, room).max(SHARE)),
            "key {i}: {live} keys live in {before} slots"
        );
        assert!(len() <= 4096, "sized where nothing is built ahead");
        at_the_share += 1;
    }
    at_the_share
}

/// The share of shard 0 in [`replacements_at_the_share`].
const SHARE: usize = 600;

/// Every key kept: the table holds them and twice the drain's inserts.
#[test]
fn a_shard_at_its_share_moves_to_a_table_with_room_for_twice_the_drains_inserts() {
    let seen = replacements_at_the_share(1, |live, room| live + 2 * room);
    assert!(seen >= 2, "{seen} replacements at the share");
}

/// Every key fresh: the estimate keeps few (it counts the sampled keys it evicts as gone, with
/// a margin), and the table still holds the share, as a hash map does not shrink below what
/// it may hold.
#[test]
fn a_shard_of_fresh_keys_at_its_share_keeps_a_table_holding_the_share() {
    let seen = replacements_at_the_share(0, |_, _| 0);
    assert!(seen >= 2, "{seen} replacements at the share");
}

/// A table of log cells (a heap table: a zero `LogCell` is not a fresh one) grows past
/// 4,096 slots (the size from which tables are built ahead) in one shard: each large table is
/// built ahead a step per insert, slot by slot, so no call allocates one whole, and every key
/// keeps its entry through the moves.
#[test]
fn a_heap_table_of_logs_is_built_ahead_slot_by_slot() {
    use crate::state::LogCell;
    use crate::{Quota, SlidingLog};
    let rule = SlidingLog::new(Quota::per_second(1_000).unwrap()).unwrap();
    let store: WordTable<u64, std::hash::BuildHasherDefault<Identity>, LogCell> =
        WordTable::new((), Default::default());
    // Shard 0 (top bits 0), homes and tags spread by the low bits.
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9) & 0x00FF_FFFF_FFFF;
    let keys = 12_000u64;
    for i in 0..keys {
        let mut done = Inserted::default();
        store.with_inserted(
            &key(i),
            0,
            |cell: &LogCell| cell.decide(&rule, || 0, 1, true),
            &EmptyLogs(rule, 0),
            &mut done,
        );
    }
    assert!(
        store.capacity() > 2 * 4096,
        "shard 0's table grew past two large sizes"
    );
    assert_eq!(store.mapped_tables(), 0, "log cells live on the heap");
    assert_eq!(store.allocated_large(), 0, "large tables built ahead");
    for i in 0..keys {
        let entries = store.with_existing(&key(i), 0, |cell: &LogCell| {
            cell.retired().is_none().then(|| cell.entries())
        });
        assert_eq!(entries, Some(1), "key {i} keeps its entry");
    }
    assert_eq!(store.len(), keys as usize);
    store.audit();
}

/// A text key for the `String` tests, of each class (`texts.rs`): every 5th one longer than
/// 71 bytes (on the heap), every 5th of 36 bytes (a UUID's length), every 5th of 40 to 71,
/// the others of up to 23 bytes (inline in the table's own slots).
fn text(i: u64) -> String {
    match i % 5 {
        0 => format!("{}-a-long-key-held-on-the-heap-{i}", "k".repeat(50)),
        1 => format!(
            "{:08x}-10b1-426f-9247-{:012x}",
            i >> 32,
            i & 0xffff_ffff_ffff
        ),
        2 => format!("an-api-key-of-forty-to-seventy-one-bytes-{i}"),
        _ => format!("198.51.{i}"),
    }
}

/// `String` keys: short ones kept inline, long ones as `String`s, through every rebuild, found
/// by `&str` and by `&String`, inserted either way; each long key's `String` dropped once (the
/// leak check of Miri, which runs it too: `scripts/test.sh`).
#[test]
fn string_keys_short_inline_and_long_on_the_heap_survive_every_rebuild() {
    let keys: u64 = if cfg!(miri) { 400 } else { 20_000 };
    let store: WordTable<String, foldhash::fast::FixedState, AtomicWord> =
        WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(7));
    for i in 0..keys {
        let key = text(i);
        let (_, done) = if i % 2 == 0 {
            inserting(&store, key.as_str(), |cell| add(cell, i + 1), &KEEP_ALL)
        } else {
            inserting(&store, &key, |cell| add(cell, i + 1), &KEEP_ALL)
        };
        assert!(done.inserted, "key {i}");
    }
    for i in 0..keys {
        let key = text(i);
        assert_eq!(
            store.with_existing(key.as_str(), 0, |c| add(c, 0)),
            Some(i + 1)
        );
        assert_eq!(store.with_existing(&key, 0, |c| add(c, 0)), Some(i + 1));
        let (_, done) = inserting(&store, key.as_str(), |c| add(c, 0), &KEEP_ALL);
        assert!(!done.inserted, "key {i} is found, not inserted again");
    }
    assert_eq!(store.with_existing("198.51.x", 0, |c| add(c, 0)), None);
    assert_eq!(store.len(), keys as usize);
    store.audit();
    // Drained tables released: every key is in a shard's table, 4 in 5 of them inline.
    for calls in 1.. {
        if store.retired_slots() == 0 {
            break;
        }
        assert!(calls < 1_000_000, "drained tables not released");
        inserting(&store, "198.51.x", |c| add(c, 0), &KEEP_ALL);
    }
    let fifth = |class: u64| (0..keys).filter(|i| i % 5 == class).count();
    assert_eq!(store.inline_texts(), fifth(3) + fifth(4));
    assert_eq!(store.wider_texts(), (fifth(1), fifth(2)));
}

/// The classes' bounds: 23 bytes inline in the table's own slots, 24 to 39 and 40 to 71 in
/// the wider tables, 72 on the heap, and texts of every length up to 90 (among them the empty
/// one) are told apart from each other.
#[test]
fn string_keys_of_every_length_around_the_inline_bounds_are_told_apart() {
    let store: WordTable<String, foldhash::fast::FixedState, AtomicWord> =
        WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(11));
    let keys: Vec<String> = (0..=90).map(|n| "x".repeat(n)).collect();
    for (i, key) in keys.iter().enumerate() {
        inserting(&store, key.as_str(), |c| add(c, i as u64 + 1), &KEEP_ALL);
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            store.with_existing(key.as_str(), 0, |c| add(c, 0)),
            Some(i as u64 + 1)
        );
    }
    assert_eq!(store.len(), keys.len());
    assert_eq!(store.inline_texts(), 24);
    assert_eq!(store.wider_texts(), (16, 32));
    store.audit();
}

/// Every text hashes alike: one home slot and one tag for all, so each probe walks past keys
/// of both classes (the inline and the heap tag differ in one bit) and wraps the table; each
/// key is still found, by its own class, through the rebuilds.
#[test]
fn string_keys_of_both_classes_sharing_a_hash_are_told_apart() {
    #[derive(Default)]
    struct Same;
    impl std::hash::Hasher for Same {
        fn finish(&self) -> u64 {
            0x0000_00FF_FFFF_FFFF
        }
        fn write(&mut self, _: &[u8]) {}
    }
    let store: WordTable<String, std::hash::BuildHasherDefault<Same>, AtomicWord> =
        WordTable::new(MARKS, Default::default());
    let keys = if cfg!(miri) { 40 } else { 300 };
    for i in 0..keys {
        inserting(&store, text(i).as_str(), |c| add(c, i + 1), &KEEP_ALL);
    }
    for i in 0..keys {
        assert_eq!(
            store.with_existing(text(i).as_str(), 0, |c| add(c, 0)),
            Some(i + 1)
        );
    }
    assert_eq!(store.with_existing("absent", 0, |c| add(c, 0)), None);
    assert_eq!(store.len(), keys as usize);
    store.audit();
}

/// The wider tables evict as the table's own does: a bound set before their first key holds
/// in each (a flood of fresh keys of every class leaves the ones holding state, and each
/// table near its share), `evict_some` goes on into them, and `retain` sweeps them.
#[test]
fn string_keys_of_every_class_are_evicted_at_the_bound_and_swept() {
    let keys: u64 = if cfg!(miri) { 300 } else { 40_000 };
    let mut store: WordTable<String, foldhash::fast::FixedState, AtomicWord> =
        WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(5));
    store.set_evict_above(SHARDS);
    // Every 97th key holds state (of every class: 97 is prime to 5); the others are fresh
    // (0) and may go.
    for i in 0..keys {
        inserting(
            &store,
            text(i).as_str(),
            |c| add(c, u64::from(i % 97 == 0)),
            &EVICT_ZERO,
        );
    }
    for i in (0..keys).step_by(97) {
        assert_eq!(
            store.with_existing(text(i).as_str(), 0, |c| add(c, 0)),
            Some(1)
        );
    }
    let (mid, long) = store.wider_texts();
    assert!(mid > 0 && long > 0, "{mid}, {long}");
    // (Miri's few keys fill no table past its smallest size: nothing to evict yet.)
    if !cfg!(miri) {
        assert!(store.len() < keys as usize / 4, "{} keys held", store.len());
        assert!(mid < keys as usize / 20, "{mid}");
    }
    store.audit();
    // The hand evicts the fresh keys of every table (a step may find none where it looks).
    for _ in 0..if cfg!(miri) { 100 } else { 10_000 } {
        store.evict_some(&EVICT_ZERO, 64);
    }
    assert_eq!(store.len(), (0..keys).step_by(97).count());
    assert!(store.wider_texts().0 > 0, "keys holding state are kept");
    // A sweep empties them all.
    let held = store.len();
    assert_eq!(
        store.retain(|c| c.retire_if(MARKS.tombstone, |_| true).is_none()),
        held
    );
    assert_eq!((store.len(), store.wider_texts()), (0, (0, 0)));
    store.audit();
}

/// A caller's own type that a `String` borrows as: its text is not known to the table, which
/// looks in every class (and makes a `String` to compare an inline key with); keys inserted
/// through it are kept inline when they fit, in the table of their class, and found by `&str`
/// after. Each new key costs one `to_owned`.
#[test]
fn string_keys_looked_up_through_a_callers_own_borrow_type() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static OWNED: AtomicUsize = AtomicUsize::new(0);
    #[derive(PartialEq, Eq, Hash)]
    #[repr(transparent)]
    struct Name(String);
    impl std::borrow::Borrow<Name> for String {
        fn borrow(&self) -> &Name {
            // SAFETY: `Name` is a `#[repr(transparent)]` `String`.
            #[allow(unsafe_code)]
            unsafe {
                &*(self as *const String).cast::<Name>()
            }
        }
    }
    impl ToOwned for Name {
        type Owned = String;
        fn to_owned(&self) -> String {
            OWNED.fetch_add(1, Ordering::Relaxed);
            self.0.clone()
        }
    }
    let store: WordTable<String, foldhash::fast::FixedState, AtomicWord> =
        WordTable::new(MARKS, foldhash::fast::FixedState::with_seed(3));
    for i in 0..50 {
        inserting(&store, &Name(text(i)), |c| add(c, i + 1), &KEEP_ALL);
    }
    assert_eq!(OWNED.load(Ordering::Relaxed), 50, "one String a new key");
    for i in 0..50 {
        assert_eq!(
            store.with_existing(&Name(text(i)), 0, |c| add(c, 0)),
            Some(i + 1)
        );
        assert_eq!(
            store.with_existing(text(i).as_str(), 0, |c| add(c, 0)),
            Some(i + 1)
        );
    }
    assert_eq!(
        store.with_existing(&Name("absent".into()), 0, |c| add(c, 0)),
        None
    );
    assert_eq!(store.len(), 50);
}

/// The shards' large tables grow at staggered key counts: each shard's lengths follow its own
/// ladder (`staggered`), so a growing store has a few shards draining at a time, not most of
/// them (each holds its old table beside the new one until its drain ends). On one ladder, 48
/// of the 64 shards drained at once.
#[test]
fn shards_grow_at_staggered_key_counts() {
    // The ladders: a rung is itself, the next is 14/11 of it, and the shards' rungs interleave.
    for stagger in [0, 17, 63] {
        let rung = staggered(5_000, stagger);
        assert!((5_000..=5_000 * 14 / 11 + 1).contains(&rung), "{rung}");
        assert_eq!(staggered(rung, stagger), rung);
        let next = staggered(rung * 14 / 11 + 2, stagger);
        assert!(
            (next as f64 / rung as f64 - 14.0 / 11.0).abs() < 0.01,
            "{rung} -> {next}"
        );
    }
    assert_eq!(
        staggered(4_096, 5),
        4_096,
        "tables up to 4,096 slots are not staggered"
    );
    let rungs: Vec<usize> = (0..SHARDS).map(|s| staggered(5_000, s)).collect();
    let distinct: std::collections::HashSet<_> = rungs.iter().collect();
    assert!(distinct.len() > SHARDS / 2, "{rungs:?}");

    let store = store();
    let mut most = 0;
    for key in 0..400_000u64 {
        insert(&store, key, 1, &KEEP_ALL);
        if key >= 300_000 && key % 64 == 0 {
            most = most.max(store.draining());
        }
    }
    assert!(most <= SHARDS / 3, "{most} shards drained at once");
    store.audit();
}

/// A key of `8 + P` bytes with drop glue, counted as [`Counted`] keys are: aligned to 4, so
/// that the sizes below are exact (a slot is its cell and the key, rounded to the cell's
/// alignment). Its hash is its id, so the ids of [`wide_key`] all land in shard 0.
#[derive(Debug)]
struct Wide<const P: usize> {
    id: [u32; 2],
    _pad: [u8; P],
}

impl<const P: usize> Wide<P> {
    fn new(id: u64) -> Self {
        COPIES.with(|c| c.set((c.get().0 + 1, c.get().1)));
        Wide {
            id: [id as u32, (id >> 32) as u32],
            _pad: [id as u8; P],
        }
    }

    fn id(&self) -> u64 {
        u64::from(self.id[0]) | u64::from(self.id[1]) << 32
    }
}

impl<const P: usize> Hash for Wide<P> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.id());
    }
}

impl<const P: usize> PartialEq for Wide<P> {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl<const P: usize> Eq for Wide<P> {}

impl<const P: usize> Clone for Wide<P> {
    fn clone(&self) -> Self {
        Wide::new(self.id())
    }
}

impl<const P: usize> Drop for Wide<P> {
    fn drop(&mut self) {
        COPIES.with(|c| c.set((c.get().0, c.get().1 + 1)));
    }
}

/// The `i`th key of shard 0 (top bits 0; homes and tags spread by the low bits).
fn wide_key<const P: usize>(i: u64) -> Wide<P> {
    Wide::new(i.wrapping_mul(0x9E37_79B9) & 0x00FF_FFFF_FFFF)
}

type WideTable<const P: usize, C> = WordTable<Wide<P>, std::hash::BuildHasherDefault<Identity>, C>;

/// An evictor that evicts nothing (a store below its share never asks).
struct KeepEvery;

impl<C> Evictor<C> for KeepEvery {
    fn sweep(&self) -> usize {
        unreachable!("the word table evicts on its own")
    }

    fn judging<R>(&self, _: impl FnOnce(Nanos, &dyn Fn(&C, Nanos) -> bool) -> R) -> Option<R> {
        None
    }
}

/// Inserts key `key` of `store`, running `f` on its cell, `judge` judging what to evict.
fn insert_wide<const P: usize, C: TableCell>(
    store: &WideTable<P, C>,
    key: &Wide<P>,
    f: &impl Fn(&C),
    judge: &impl Evictor<C>,
) {
    let mut done = Inserted::default();
    store.with_inserted(key, 0, f, judge, &mut done);
}

/// Inserts keys from `*next` on until shard 0 is part-way through building its next table for
/// the `builds`-th time, and a few inserts (build steps) into it; counts them in `inserted`.
/// Under Miri only shard 0's keys are inserted: the same builds for a 64th of the inserts.
fn grow_to_a_part_built_table<const P: usize, C: TableCell>(
    store: &WideTable<P, C>,
    next: &mut u64,
    inserted: &mut usize,
    builds: usize,
    f: &impl Fn(&C),
) {
    let (mut seen, mut was, mut into) = (0, false, 0);
    let most = *next + 200_000 * if cfg!(miri) { SHARDS as u64 } else { 1 };
    // Stopped one to five steps into the build, by where the keys stand.
    let steps = 1 + (*next % 5) as usize;
    loop {
        let key = wide_key(*next);
        *next += 1;
        assert!(*next < most, "no build after {most} keys");
        if cfg!(miri) && store.shard_of(&key) != 0 {
            continue;
        }
        insert_wide(store, &key, f, &KeepEvery);
        *inserted += 1;
        let building = store.part_built() > 0;
        seen += usize::from(building && !was);
        was = building;
        into += usize::from(seen == builds && building);
        if into == steps {
            return;
        }
    }
}

/// One key size and cell through every path that frees keys of part-built and built tables:
/// growth through a built table and into a part-built one, every key evicted (the build is
/// abandoned: its slots freed through its tags), growth again and the store dropped mid-build;
/// then a store at its `evict_above` share, whose replaced tables are kept as spares and
/// cleared a step at a time, dropped mid-clear. Every copy of every key is dropped once.
fn keys_of_every_path<const P: usize, C: TableCell>(
    what: &str,
    new: impl Fn() -> WideTable<P, C>,
    f: impl Fn(&C),
    fresh: &impl Evictor<C>,
) {
    COPIES.with(|c| c.set((0, 0)));
    let size = std::mem::size_of::<Wide<P>>();
    {
        let store = new();
        let (mut next, mut inserted) = (0, 0);
        grow_to_a_part_built_table(&store, &mut next, &mut inserted, 2, &f);
        store.audit();
        assert_eq!(store.retain(|_| false), inserted, "{what}, {size} bytes");
        assert_eq!(store.len(), 0);
        assert_eq!(
            store.part_built(),
            0,
            "{what}, {size} bytes: the build abandoned"
        );
        store.audit();
        grow_to_a_part_built_table(&store, &mut next, &mut inserted, 1, &f);
        store.audit();
    }
    let (made, gone) = COPIES.with(|c| c.get());
    assert_eq!(made, gone, "{what}, {size}-byte keys: made and dropped");
    if cfg!(miri) {
        return; // (the share's spares are cleared by `drop_keys` too, over whole tables)
    }
    {
        let mut store = new();
        // A share of a few tables' worth for shard 0, each replaced table a spare to clear.
        let share = 5_000;
        store.set_evict_above(share * SHARDS);
        for i in 0..4 * share as u64 {
            insert_wide(&store, &wide_key(i), &f, fresh);
        }
        store.audit();
        assert!(
            store.len() < 2 * share,
            "{what}, {size} bytes: held {}",
            store.len()
        );
        // (Mapped tables are unmapped once drained; heap ones are kept and cleared.)
        if store.mapped_tables() == 0 {
            assert!(
                store.spares_reused() > 0,
                "{what}, {size} bytes: spares reused"
            );
        }
    }
    let (made, gone) = COPIES.with(|c| c.get());
    assert_eq!(
        made, gone,
        "{what}, {size}-byte keys at the share: made and dropped"
    );
}

/// Keys with drop glue of 8, 24, 40, 72, 100 and 192 bytes (build steps of a page of slots:
/// 256, 128, 85, 51, 36 and 20 word slots; 64, 32, 32, 32, 21 and 16 log slots, a cache line
/// each or more: not all a multiple of the eight tags a word holds),
/// in tables of word cells (every rule but the sliding log: mapped, and on the heap as when
/// mapping fails) and of log cells (on the heap), through [`keys_of_every_path`]. Run under
/// Miri too (`scripts/test.sh`), where tables are built ahead from 256 slots.
#[test]
fn keys_of_every_size_and_cell_are_dropped_once_on_every_path() {
    fn sizes<const P: usize>() {
        let word = |heap: bool| {
            move || {
                super::word_table::HEAP_ONLY.with(|h| h.set(heap));
                WideTable::<P, AtomicWord>::new(MARKS, Default::default())
            }
        };
        let count = |cell: &AtomicWord| {
            add(cell, 0);
        };
        if !cfg!(miri) {
            keys_of_every_path::<P, _>("word cells, mapped", word(false), count, &EVICT_ZERO);
        }
        keys_of_every_path::<P, _>("word cells, heap", word(true), count, &EVICT_ZERO);
        super::word_table::HEAP_ONLY.with(|h| h.set(false));
        let rule = crate::SlidingLog::new(crate::Quota::per_second(1_000).unwrap()).unwrap();
        let logs = || WideTable::<P, crate::state::LogCell>::new((), Default::default());
        let entry = |cell: &crate::state::LogCell| {
            cell.decide(&rule, || 0, 1, true);
        };
        keys_of_every_path::<P, _>("log cells", logs, entry, &EmptyLogs(rule, 10_000_000_000));
    }
    // (Miri takes the first: build steps of 36 word slots and 21 log slots.)
    sizes::<92>();
    if !cfg!(miri) {
        sizes::<0>();
        sizes::<16>();
        sizes::<32>();
        sizes::<64>();
        sizes::<184>();
    }
}

/// `docs/design.md` (published as rustdoc) and CONTRIBUTING.md quote the table's constants:
/// a change to one fails here until the docs give the new figure.
#[test]
fn the_docs_quote_the_tables_constants() {
    use super::word_table::{BUILD_ABOVE, HELP_EVERY, MOST_RAISES, MOST_VISITED, SAMPLE};
    use super::word_table::{CLEAR_STEP, DEFAULT_EVICT_ABOVE};
    // Line breaks and indentation fall where they do: compare words.
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let design = words(include_str!("../../docs/design.md"));
    let contributing = words(include_str!("../../CONTRIBUTING.md"));
    let quotes = [
        (&design, format!("one drain step ({DRAIN_STEP} slots moved or evicted)")),
        (&design, format!("a sample of {SAMPLE} slots judged ({MOST_VISITED} slots visited at most)")),
        (&design, format!("up to {CLEAR_STEP} slots of a spare cleared, {CLEAR_STEP} of retired tables released")),
        (&design, format!("is dropped {CLEAR_STEP} slots per insert into its shard")),
        (&design, format!("also drops up to {CLEAR_STEP} of their slots")),
        (&design, format!("tables of up to {BUILD_ABOVE} slots")),
        (&contributing, format!("*drained* {DRAIN_STEP} slots per insert or missed lookup")),
    ];
    for (doc, quote) in quotes {
        assert!(doc.contains(&quote), "the docs no longer say {quote:?}");
    }
    // Figures written out in words or powers.
    assert_eq!(
        HELP_EVERY, 4,
        "design.md: one in four of a thread's lookups"
    );
    assert!(design.contains("one in four of a thread's"));
    assert_eq!(
        DEFAULT_EVICT_ABOVE,
        1 << 21,
        "design.md, CONTRIBUTING: default 2^21"
    );
    assert_eq!(
        DEFAULT_EVICT_ABOVE << MOST_RAISES,
        1 << 24,
        "design.md: 2^24 keys in all"
    );
    assert!(design.contains("2^21") && design.contains("2^24 keys in all"));
}
