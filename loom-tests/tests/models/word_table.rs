//! The lock-free word table (`src/store/word_table.rs`) under the key table: lock-free lookups
//! racing an eviction (tombstone), a revival of the same key, and a rebuild that moves every
//! live cell into a new table.
//!
//! As in `table.rs`, every model runs GCRA with `B = 2`, `T = 1 ms` at a frozen instant `NOW`:
//! a key admitted at 0 is fresh (evictable) at `NOW`, a key admitted at `NOW` is not. Every
//! allowed decision must be found exactly once in the key's state at the end.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::{AtomicWord, Retired};
use tollgate_loom_tests::store::{
    builds_abandoned, chain, retired_slots, spares_reused, with_drain_step, word_table,
    yielding_after_fetch, Check, Evictor, Inserted, KeyTable, StoreProtocol, WordTable,
};
use tollgate_loom_tests::{Gcra, Quota, Stored};

use crate::{explore_reaching, same_shard_keys, At, Copies, Hasher, MS};

/// The start of the String models' long keys: over 71 bytes, so they stay on the heap in the
/// table's own slots (a text of 24 to 71 bytes goes to a wider table, made in a `OnceLock`
/// loom does not see).
const LONG_TEXT: &str = "a-client-name-longer-than-the-71-bytes-that-a-string-table-keeps-inline-";

pub(crate) const NOW: Nanos = 5 * MS;

/// GCRA's marks (`TAT_MARKS` in `src/store/stored.rs`): a mismatch would show as lost admissions.
pub(crate) const MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX - 1,
};

type Table = KeyTable<u64, AtomicWord, WordTable<u64, Hasher>>;

pub(crate) fn rule() -> Gcra {
    Gcra::new(Quota::new(2, Duration::from_millis(2)).unwrap()).unwrap()
}

fn table() -> Table {
    KeyTable::new(word_table(MARKS, Hasher::default()), None)
}

/// A table whose shards evict as soon as they hold a key (`evict_above` below the shards).
fn evicting_table() -> Table {
    let mut store = word_table(MARKS, Hasher::default());
    store.set_evict_above(1);
    KeyTable::new(store, None)
}

fn admit_at(table: &Table, key: u64, at: Nanos) -> bool {
    let rule = rule();
    let evictor = At { table, rule, at };
    table
        .check_key(&key, &rule, || at, 1, &evictor, Check)
        .unwrap()
        .allowed()
}

/// Cost-1 admissions at `NOW` that `key`'s state holds (0 if absent or evicted).
fn held(table: &Table, key: u64) -> u64 {
    table
        .store()
        .with_existing(&key, 0, |cell| {
            rule()
                .acquire_live(cell, || NOW, 0, false)
                .map(|d| 2 - d.remaining())
        })
        .unwrap_or(0)
}

/// (a) Key 1 is fresh at `NOW`. One thread admits on it (a lock-free lookup) while another
/// evicts fresh keys (a CAS to the tombstone). Either the admission lands first and the key is
/// kept, or it meets the tombstone, looks again under the lock and revives the key in place:
/// the key ends holding exactly the one admission.
#[test]
fn eviction_races_a_lock_free_admission() {
    explore_reaching(
        "word table: eviction vs admission",
        &["kept", "evicted then revived"],
        |seen| {
            let table = Arc::new(table());
            assert!(admit_at(&table, 1, 0));
            let evictor = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.evict_fresh(&rule(), NOW))
            };
            let allowed = admit_at(&table, 1, NOW);
            let evicted = evictor.join().unwrap();
            assert!(allowed, "a fresh bucket admits");
            assert_eq!(held(&table, 1), 1, "the admission is in the key's state");
            assert_eq!((table.len(), table.store().len()), (1, 1));
            seen.saw(if evicted == 1 {
                "evicted then revived"
            } else {
                "kept"
            });
        },
    );
}

/// (b) Two threads admit on fresh key 1 while a third evicts: B = 2, so both are allowed and the
/// key ends holding 2 (never 1: an admission on a retired cell; never 3).
#[test]
fn two_admissions_and_an_eviction() {
    explore_reaching(
        "word table: two admissions vs eviction",
        &["kept", "evicted then revived"],
        |seen| {
            let table = Arc::new(table());
            assert!(admit_at(&table, 1, 0));
            let other = {
                let table = Arc::clone(&table);
                thread::spawn(move || admit_at(&table, 1, NOW))
            };
            let evictor = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.evict_fresh(&rule(), NOW))
            };
            let mine = admit_at(&table, 1, NOW);
            let theirs = other.join().unwrap();
            let evicted = evictor.join().unwrap();
            assert!(mine && theirs);
            assert_eq!(held(&table, 1), 2);
            assert_eq!(table.len(), 1);
            seen.saw(if evicted == 1 {
                "evicted then revived"
            } else {
                "kept"
            });
        },
    );
}

/// (c) A shard's first table (8 slots, a small table: replaced before it is more than half
/// full) holds 4 keys, so inserting a 5th replaces it, and inserting a 6th drains the old
/// table (every one of its 8 slots), moving every live cell (a CAS to the moved mark, then a
/// copy). Meanwhile another thread admits on a key being moved: lock-free on the old table
/// (its admission lands before the move and is copied, or meets the mark and goes to the new
/// table), or under the lock when the key is still in the drain. Every key ends with exactly
/// its admissions.
#[test]
fn a_drain_races_an_admission() {
    let keys = same_shard_keys(6);
    explore_reaching(
        "word table: drain vs admission",
        &["moved first", "admitted first"],
        move |seen| {
            let table = Arc::new(table());
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, NOW));
            }
            let first = keys[0];
            // The admitter counts its attempts: a second one means it met the moved mark.
            let admitter = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    let mut attempts = 0;
                    let decision = table.store().with_existing(&first, 0, |cell| {
                        attempts += 1;
                        rule().acquire_live(cell, || NOW, 1, true)
                    });
                    (decision.map(|d| d.allowed()), attempts)
                })
            };
            assert!(admit_at(&table, keys[4], NOW), "the 5th key, replacing");
            assert!(admit_at(&table, keys[5], NOW), "the 6th key, draining");
            let (allowed, attempts) = admitter.join().unwrap();
            assert_eq!(allowed, Some(true), "the second unit of a bucket of 2");
            assert_eq!(held(&table, first), 2, "no admission lost to the move");
            for &key in &keys[1..] {
                assert_eq!(held(&table, key), 1, "key {key}");
            }
            assert_eq!((table.len(), table.store().len()), (6, 6));
            assert!(!admit_at(&table, first, NOW), "the bucket is spent");
            seen.saw(if attempts > 1 {
                "moved first"
            } else {
                "admitted first"
            });
        },
    );
}

/// (d) Memory is needed: 4 keys admitted at 0 are fresh at `NOW`, and inserting a 5th and a
/// 6th key replaces and drains their table, evicting the fresh keys (the replacement judges a
/// sample of slots, the drain the rest). Meanwhile another thread admits on the first key at
/// `NOW`: either first (the key is not fresh any more and is moved with its admission) or
/// after its eviction (its CAS meets the tombstone and the key is inserted again, fresh).
/// Either way the key ends holding exactly that admission, and the other fresh keys are gone.
#[test]
fn a_drain_evicts_fresh_keys_racing_an_admission() {
    let keys = same_shard_keys(6);
    explore_reaching(
        "word table: evicting drain vs admission",
        &["kept", "evicted then inserted"],
        move |seen| {
            let table = Arc::new(evicting_table());
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, 0));
            }
            let first = keys[0];
            // The key table's decide, step by step, to see which path the admission took.
            let admitter = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    let rule = rule();
                    let live = |cell: &AtomicWord| rule.acquire_live(cell, || NOW, 1, true);
                    if let Some(decision) = table.store().try_existing(&first, 0, live) {
                        return (decision.allowed(), false);
                    }
                    let evictor = At {
                        table: &table,
                        rule,
                        at: NOW,
                    };
                    let admit = |cell: &AtomicWord| rule.acquire(cell, || NOW, 1, true);
                    let mut done = Inserted::default();
                    let decision = table
                        .store()
                        .with_inserted(&first, 0, admit, &evictor, &mut done);
                    (decision.allowed(), done.inserted)
                })
            };
            assert!(admit_at(&table, keys[4], NOW), "the 5th key, replacing");
            assert!(admit_at(&table, keys[5], NOW), "the 6th key, draining");
            let (allowed, inserted) = admitter.join().unwrap();
            assert!(allowed, "a full bucket admits");
            assert_eq!(held(&table, first), 1, "exactly the one admission at NOW");
            for &key in &keys[1..4] {
                assert_eq!(held(&table, key), 0, "fresh key {key} evicted");
            }
            assert_eq!(table.store().len(), 3, "the first key, the 5th and the 6th");
            seen.saw(if inserted {
                "evicted then inserted"
            } else {
                "kept"
            });
        },
    );
}

/// (e) Two drains, two slots visited a call: a shard's first table holds 4 keys; a 5th key
/// replaces it (drain `D0`); a lookup takes the first key out of `D0` into the new table; then
/// that table fills before `D0` ends and joins the drains (`D1`: the first key is *live* there
/// and still has its moved slot in `D0`). Meanwhile another thread admits on the first key,
/// while the main thread looks it up (moving it from `D1` into the current table) and inserts
/// two more keys (each a drain step). The admission must be decided in the key's one live
/// cell, wherever the drains have carried it: the key ends holding exactly its two
/// admissions, every other key its one, and `len()` counts 7 keys.
#[test]
fn a_chained_drain_races_an_admission() {
    let keys = same_shard_keys(7);
    explore_reaching(
        "word table: chained drains vs admission",
        &["lock-free", "under the lock"],
        move |seen| {
            let store = with_drain_step(word_table(MARKS, Hasher::default()), 2);
            let table = Arc::new(KeyTable::new(store, None));
            for &key in &keys[..5] {
                assert!(admit_at(&table, key, NOW));
            }
            let first = keys[0];
            assert_eq!(held(&table, first), 1, "taken out of the first drain");
            assert_eq!(
                chain(table.store(), &first),
                2,
                "the table joined the drains"
            );
            let admitter = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    let rule = rule();
                    let live = |cell: &AtomicWord| rule.acquire_live(cell, || NOW, 1, true);
                    match table.store().try_existing(&first, 0, live) {
                        Some(decision) => (decision.allowed(), "lock-free"),
                        None => {
                            let decision = table.store().with_existing(&first, 0, live);
                            (decision.is_some_and(|d| d.allowed()), "under the lock")
                        }
                    }
                })
            };
            held(&table, first);
            assert!(admit_at(&table, keys[5], NOW));
            assert!(admit_at(&table, keys[6], NOW));
            let (allowed, path) = admitter.join().unwrap();
            assert!(allowed, "the second unit of a bucket of 2");
            assert_eq!(held(&table, first), 2, "no admission lost or decided twice");
            for &key in &keys[1..] {
                assert_eq!(held(&table, key), 1, "key {key}");
            }
            assert_eq!((table.len(), table.store().len()), (7, 7));
            seen.saw(path);
        },
    );
}

/// (g) The window counters' re-anchoring: the rule's era moves from 0 to 1 while key 1 (state
/// 1, written in era 0) is held in an 8-slot table with a second key. A check under the new
/// rule (era 1) and one under the old (an attempt that loaded the rule before it moved) race.
/// The new one must never decide on a state of era 0: it forgets the shard's table (which joins
/// the drains) and carries its states into a table of era 1 (here, the carry adds 100). The
/// old one decides either in the old table (before the carry, which then carries its unit) or
/// in the new one. Either way each unit is counted once and the state is carried once: 103.
#[test]
fn an_era_change_races_an_old_attempt() {
    let keys = same_shard_keys(2);
    explore_reaching(
        "word table: era change vs an old attempt",
        &[
            "old attempt before the carry",
            "old attempt after the carry",
        ],
        move |seen| {
            let mut store = with_drain_step(word_table(MARKS, Hasher::default()), 1);
            store.set_carry(|cell: &AtomicWord, _from, _to| {
                let _ = cell.try_update(|| 0, |s, _| ((), s + 100), |_| false);
            });
            let table = Arc::new(KeyTable::new(store, None));
            let add = |cell: &AtomicWord| {
                cell.try_update(|| 0, |s, _| (s, s + 1), |s| MARKS.any(s))
                    .ok()
            };
            let evictor = At {
                table: &table,
                rule: rule(),
                at: NOW,
            };
            for &key in &keys {
                let mut done = Inserted::default();
                table
                    .store()
                    .with_inserted(&key, 0, |cell| add(cell), &evictor, &mut done);
            }
            let first = keys[0];
            let old = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.store().with_existing(&first, 0, add))
            };
            let new = table.store().with_existing(&first, 1, add);
            assert!(
                new.unwrap() >= 101,
                "the new era decided on a carried state: {new:?}"
            );
            let old = old.join().unwrap().unwrap();
            let end = table
                .store()
                .with_existing(&first, 1, |cell| Some(cell.load()));
            assert_eq!(end, Some(103), "each unit once, carried once");
            let second = table
                .store()
                .with_existing(&keys[1], 1, |cell| Some(cell.load()));
            assert_eq!(second, Some(101), "the other key carried too");
            seen.saw(if old < 100 {
                "old attempt before the carry"
            } else {
                "old attempt after the carry"
            });
        },
    );
}

/// Lends no judge: drains move every key.
pub(crate) struct KeepAll;

impl Evictor<AtomicWord> for KeepAll {
    fn sweep(&self) -> usize {
        0
    }

    fn judging<R>(
        &self,
        _: impl FnOnce(Nanos, &dyn Fn(&AtomicWord, Nanos) -> bool) -> R,
    ) -> Option<R> {
        None
    }
}

/// `n` names that fall in one shard (as `same_shard_keys`).
fn same_shard_names(n: usize) -> Vec<String> {
    same_shard_texts("client-", n)
}

/// `n` texts `{prefix}{i:04}` that fall in shard 0 (of one length: only their bytes tell them
/// apart).
fn same_shard_texts(prefix: &str, n: usize) -> Vec<String> {
    use std::hash::BuildHasher;
    let shard = |name: &String| Hasher::default().hash_one(name) >> 58;
    let names = (0..).map(|i| format!("{prefix}{i:04}"));
    names.filter(|name| shard(name) == 0).take(n).collect()
}

/// (h) Keys with drop glue: 4 named keys fill a shard's table (while the next one is built
/// ahead, three slots an insert); a 5th and 6th replace it, free that build part-built, and
/// drain it (each move clones a key, and the drained table drops its copies as it is
/// released, here when the store is), while another thread admits on the first key lock-free, reading its
/// name in a slot. loom checks each read of a key against its write and its drop (the slots'
/// cells); every admission is counted once, and once the store is dropped no copy of a key
/// is left, none dropped twice.
#[test]
fn keys_with_drop_glue_move_and_drop_once_racing_an_admission() {
    let names = same_shard_names(6);
    explore_reaching(
        "word table: String-like keys drained vs admission",
        &["moved first", "admitted first"],
        move |seen| {
            // A key with drop glue: its name on the heap, its live copies counted.
            let copies = Copies::new();
            let keys: Vec<_> = names.iter().map(|n| copies.key(n.clone())).collect();
            drain_races_an_admission(keys, seen);
            copies.assert_all_dropped();
        },
    );
}

/// (h') `String` keys, the word table's own case: short ones kept inline in their slot (a
/// length and bytes, written before the tag is published), long ones (over 71 bytes) as
/// `String`s. 4 keys,
/// short and long alternating, fill a shard's table; a 5th and 6th replace it and drain it
/// (an inline key is copied, a long one cloned) while another thread admits on the first,
/// short key lock-free, reading its text in a slot of either table. loom checks each read of
/// a slot's bytes against their write; every admission is counted once.
#[test]
fn string_keys_inline_and_on_the_heap_move_racing_an_admission() {
    let short = same_shard_texts("c-", 3);
    let long = same_shard_texts(LONG_TEXT, 3);
    let keys: Vec<String> = short
        .into_iter()
        .zip(long)
        .flat_map(|(s, l)| [s, l])
        .collect();
    // (A text of 24 to 71 bytes would go to a wider table, made in a `OnceLock` loom does
    // not see: those tables are word tables of a fixed key, the other models' case.)
    assert!(keys[0].len() <= 23 && keys[1].len() > 71);
    explore_reaching(
        "word table: String keys drained vs admission",
        &["moved first", "admitted first"],
        move |seen| drain_races_an_admission(keys.clone(), seen),
    );
}

/// The body of (h) and (h'): 4 of `keys` (of one shard) fill its table; a 5th and 6th replace
/// it and drain it, while another thread admits on the first lock-free. Every admission is
/// counted once; the store (and every copy of a key it made) is dropped before it returns.
fn drain_races_an_admission<K>(keys: Vec<K>, seen: &crate::Seen)
where
    K: Clone + std::hash::Hash + Eq + Send + Sync + std::fmt::Debug + 'static,
{
    let store = word_table(MARKS, Hasher::default());
    let table = Arc::new(KeyTable::new(store, None));
    let rule = rule();
    let admit = |table: &KeyTable<K, AtomicWord, _>, key: &K| {
        table
            .check_key(key, &rule, || NOW, 1, &KeepAll, Check)
            .unwrap()
            .allowed()
    };
    for key in &keys[..4] {
        assert!(admit(&table, key));
    }
    let admitter = {
        let (table, first) = (Arc::clone(&table), keys[0].clone());
        thread::spawn(move || {
            let mut attempts = 0;
            let decision = table.store().with_existing(&first, 0, |cell| {
                attempts += 1;
                rule.acquire_live(cell, || NOW, 1, true)
            });
            (decision.map(|d| d.allowed()), attempts)
        })
    };
    assert!(admit(&table, &keys[4]), "the 5th key, replacing");
    assert!(admit(&table, &keys[5]), "the 6th key, draining");
    let (allowed, attempts) = admitter.join().unwrap();
    assert_eq!(allowed, Some(true), "the second unit of a bucket of 2");
    let held = |key: &K| {
        table.store().with_existing(key, 0, |cell| {
            rule.acquire_live(cell, || NOW, 0, false)
                .map(|d| 2 - d.remaining())
        })
    };
    assert_eq!(held(&keys[0]), Some(2), "no admission lost to the move");
    for key in &keys[1..] {
        assert_eq!(held(key), Some(1), "{key:?}");
    }
    assert_eq!(table.len(), 6);
    // The 8-slot table filled before the 16-slot one built ahead for it (three slots a step
    // in the models) was complete: that build was freed part-built, through its tags.
    assert_eq!(
        builds_abandoned(table.store()),
        1,
        "a part-built table freed"
    );
    seen.saw(if attempts > 1 {
        "moved first"
    } else {
        "admitted first"
    });
}

/// (h'') A `String` key published while another thread looks it up lock-free (`try_existing`:
/// the fast path only): with the shard's table made, one thread inserts a short key (kept inline: its length and bytes) and a long one (a `String`), the
/// other looks each up without the lock. A lookup that sees a tag reads the bytes the insert
/// wrote before it (the tag's Release store, the probe's Acquire load: loom checks the read
/// against the write); one that sees no tag finds the key absent, or under the lock.
#[test]
fn a_string_key_is_read_only_once_published() {
    let mut short = same_shard_texts("c-", 2);
    let keys = [short.remove(1), same_shard_texts(LONG_TEXT, 1).remove(0)];
    let first = short.remove(0);
    explore_reaching(
        "word table: String key published vs lock-free lookup",
        &["found", "absent"],
        move |seen| {
            // Each lookup yields between fetching its table and probing it, so that the
            // inserts run in between (see `yielding_after_fetch`).
            let store = yielding_after_fetch(word_table(MARKS, Hasher::default()));
            let table = Arc::new(KeyTable::new(store, None));
            let rule = rule();
            // The shard's table exists, holding a first key, and the reader's lookups of the
            // two keys probe it without the lock.
            assert!(table
                .check_key(first.as_str(), &rule, || NOW, 1, &KeepAll, Check)
                .unwrap()
                .allowed());
            let reader = {
                let (table, keys, first) = (Arc::clone(&table), keys.clone(), first.clone());
                thread::spawn(move || {
                    let cached = table.store().with_existing(first.as_str(), 0, |_| Some(()));
                    assert!(cached.is_some());
                    keys.map(|key| {
                        table.store().try_existing(key.as_str(), 0, |cell| {
                            rule.acquire_live(cell, || NOW, 0, false)
                                .map(|d| d.remaining())
                        })
                    })
                })
            };
            for key in &keys {
                let admitted = table
                    .check_key(key.as_str(), &rule, || NOW, 1, &KeepAll, Check)
                    .unwrap();
                assert!(admitted.allowed());
            }
            for found in reader.join().unwrap() {
                // Found before its admission (2 left) or after it (1).
                assert!(matches!(found, None | Some(1..=2)), "{found:?}");
                seen.saw(if found.is_some() { "found" } else { "absent" });
            }
            assert_eq!(table.len(), 3, "three keys, each its own");
        },
    );
}

/// (i) A spare reused while a lookup may still read it. At the bound (`evict_above` of one key
/// a shard), 4 keys admitted at 0 (fresh at `NOW`) fill a shard's table; more keys that hold
/// nothing replace it: its drain evicts the fresh keys, the drained table becomes the shard's
/// spare, is cleared once no thread holds it, and serves as the next table when the new one
/// fills. Meanwhile another thread admits on the first key lock-free, holding the table it
/// found for the length of its call. The spare is never cleared under it (loom checks each
/// key's read against its drop), and the key ends holding exactly that admission (kept, or
/// evicted then inserted again).
#[test]
fn a_spare_is_cleared_and_reused_while_a_lookup_may_hold_it() {
    let keys = same_shard_keys(14);
    explore_reaching(
        "word table: spare reuse vs admission",
        &["spare reused"],
        move |seen| {
            let table = Arc::new(evicting_table());
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, 0));
            }
            let first = keys[0];
            let admitter = {
                let table = Arc::clone(&table);
                thread::spawn(move || admit_at(&table, first, NOW))
            };
            // Keys that hold nothing (cost 0): fresh, so each replacement evicts them and the
            // shard's tables stay one size, the size of its spare.
            let rule = rule();
            let evictor = At {
                table: &table,
                rule,
                at: NOW,
            };
            let mut added = 4;
            while spares_reused(table.store()) == 0 && added < keys.len() {
                let key = keys[added];
                table
                    .check_key(&key, &rule, || NOW, 0, &evictor, Check)
                    .unwrap();
                added += 1;
            }
            assert!(admitter.join().unwrap(), "a fresh key's first unit");
            assert_eq!(held(&table, first), 1, "the admission, once");
            if spares_reused(table.store()) > 0 {
                seen.saw("spare reused");
            }
        },
    );
}

/// (i) A table cached across calls (the only model whose threads keep their per-thread values,
/// as the library's do): the main thread's lookups leave the shard's first table `T0` (4 keys)
/// in its cache; another thread then inserts 4 more keys, which replace `T0` and drain it
/// two slots a call to its end, so `T0` is retired while the main thread still caches it.
/// Meanwhile the main thread admits on the first key through its cached `T0`: in `T0` (before
/// the drain moved the key; the move then carries the admission) or, finding the key moved,
/// in the current table it fetches. The key ends holding exactly its two
/// admissions, every other key its one; `T0` is not released while cached, and once the main
/// thread's next lookup has let go of it, a few lookups release it.
#[test]
fn a_table_cached_across_calls_is_replaced_drained_and_freed() {
    let keys = same_shard_keys(8);
    explore_reaching(
        "word table: a cached table replaced and freed",
        &[
            "in the cached T0",
            "moved: in the current table",
            "T0 kept while cached",
        ],
        move |seen| {
            tollgate_loom_tests::keep_per_thread_values(true);
            let store = with_drain_step(word_table(MARKS, Hasher::default()), 2);
            tollgate_loom_tests::keep_per_thread_values(false);
            let table = Arc::new(KeyTable::new(store, None));
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, NOW));
            }
            assert_eq!(held(&table, keys[0]), 1, "T0 cached by this thread");
            let inserter = {
                let (table, keys) = (Arc::clone(&table), keys.clone());
                thread::spawn(move || {
                    for &key in &keys[4..] {
                        assert!(admit_at(&table, key, NOW));
                    }
                })
            };
            let rule = rule();
            // Cells the lookup decided on or found moved: one in the cached `T0`, then the
            // current table's if the key had moved.
            let visited = std::cell::Cell::new(0);
            let live = |cell: &AtomicWord| {
                visited.set(visited.get() + 1);
                rule.acquire_live(cell, || NOW, 1, true)
            };
            let first = keys[0];
            let (allowed, path) = match table.store().try_existing(&first, 0, live) {
                Some(decision) if visited.get() == 1 => (decision.allowed(), "in the cached T0"),
                Some(decision) => (decision.allowed(), "moved: in the current table"),
                None => {
                    let decision = table.store().with_existing(&first, 0, live);
                    (decision.is_some_and(|d| d.allowed()), "under the lock")
                }
            };
            inserter.join().unwrap();
            if retired_slots(table.store()) > 0 {
                // Drained to its end, and still cached here.
                seen.saw("T0 kept while cached");
            }
            assert!(allowed, "the second unit of a bucket of 2");
            assert_eq!(held(&table, first), 2, "no admission lost or decided twice");
            for &key in &keys[1..] {
                assert_eq!(held(&table, key), 1, "key {key}");
            }
            assert_eq!((table.len(), table.store().len()), (8, 8));
            // This thread's lookups now cache the current table: `T0` goes within a few.
            let mut lookups = 0;
            while retired_slots(table.store()) > 0 {
                lookups += 1;
                assert!(
                    lookups <= 8,
                    "a retired table no thread caches is never released"
                );
                held(&table, keys[lookups % 8]);
            }
            seen.saw(path);
        },
    );
}
