//! The sliding log on the lock-free table (`src/store/word_table.rs` over `LogCell`): a
//! lock-free lookup's admission racing an eviction, a drain that moves every live log into a
//! new table, and a drain that evicts empty logs. The same protocol as the word cells
//! (`word_table.rs`), with the retirement taken under the key's lock instead of one CAS.
//!
//! Every model runs a log of `L = 2` per 2 ms at a frozen instant `NOW`: a key admitted at 0 is
//! empty (evictable) at `NOW`, a key admitted at `NOW` is not. Every allowed decision must be
//! found exactly once in the key's log at the end.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::LogCell;
use tollgate_loom_tests::store::{word_table, Check, Inserted, KeyTable, StoreProtocol, WordTable};
use tollgate_loom_tests::{Quota, SlidingLog, Stored};

use crate::{explore_reaching, same_shard_keys, At, Hasher, MS};

const NOW: Nanos = 5 * MS;

type Table = KeyTable<u64, LogCell, WordTable<u64, Hasher, LogCell>>;

fn rule() -> SlidingLog {
    SlidingLog::new(Quota::new(2, Duration::from_millis(2)).unwrap()).unwrap()
}

fn table() -> Table {
    KeyTable::new(word_table((), Hasher::default()), None)
}

/// A table whose shards evict as soon as they hold a key (`evict_above` below the shards).
fn evicting_table() -> Table {
    let mut store = word_table((), Hasher::default());
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

/// Entries of `key`'s log live at `NOW` (0 if absent or evicted).
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

/// (a) Key 1's log is empty at `NOW`. One thread admits on it (a lock-free lookup, then the
/// key's lock) while another evicts empty logs (the tombstone, under the same lock). Either
/// the admission lands first and the key is kept, or it meets the tombstone, looks again under
/// the shard lock and revives the key in place: the log ends holding exactly the one entry.
#[test]
fn log_eviction_races_a_lock_free_admission() {
    explore_reaching(
        "log table: eviction vs admission",
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
            assert!(allowed, "an empty log admits");
            assert_eq!(held(&table, 1), 1, "the admission is in the key's log");
            assert_eq!((table.len(), table.store().len()), (1, 1));
            seen.saw(if evicted == 1 {
                "evicted then revived"
            } else {
                "kept"
            });
        },
    );
}

/// (c) Four keys of one shard hold an entry each; inserting a 5th replaces the shard's table
/// and a 6th drains the old one, moving every log (marked moved under its lock, its ring
/// carried over). Meanwhile another thread admits on the first key: before the move (its entry
/// is carried), or after it (it meets the mark and goes to the new table). Every key ends with
/// exactly its entries.
#[test]
fn a_drain_moves_a_log_racing_an_admission() {
    let keys = same_shard_keys(6);
    explore_reaching(
        "log table: drain vs admission",
        &["moved first", "admitted first"],
        move |seen| {
            let table = Arc::new(table());
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, NOW));
            }
            let first = keys[0];
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
            assert_eq!(allowed, Some(true), "the second of a log of 2");
            assert_eq!(held(&table, first), 2, "no entry lost to the move");
            for &key in &keys[1..] {
                assert_eq!(held(&table, key), 1, "key {key}");
            }
            assert_eq!((table.len(), table.store().len()), (6, 6));
            assert!(!admit_at(&table, first, NOW), "the log is full");
            seen.saw(if attempts > 1 {
                "moved first"
            } else {
                "admitted first"
            });
        },
    );
}

/// (d) Memory is needed: four logs written at 0 are empty at `NOW`, and inserting a 5th and a
/// 6th key replaces and drains their table, evicting the empty logs. Meanwhile another thread
/// admits on the first key at `NOW`: first (its log is not empty any more and is moved with
/// the entry) or after its eviction (it meets the tombstone and the key is inserted again).
/// Either way the key ends holding exactly that entry, and the other empty logs are gone.
#[test]
fn a_drain_evicts_empty_logs_racing_an_admission() {
    let keys = same_shard_keys(6);
    explore_reaching(
        "log table: evicting drain vs admission",
        &["kept", "evicted then inserted"],
        move |seen| {
            let table = Arc::new(evicting_table());
            for &key in &keys[..4] {
                assert!(admit_at(&table, key, 0));
            }
            let first = keys[0];
            let admitter = {
                let table = Arc::clone(&table);
                thread::spawn(move || {
                    let rule = rule();
                    let live = |cell: &LogCell| rule.acquire_live(cell, || NOW, 1, true);
                    if let Some(decision) = table.store().try_existing(&first, 0, live) {
                        return (decision.allowed(), false);
                    }
                    let evictor = At {
                        table: &table,
                        rule,
                        at: NOW,
                    };
                    let admit = |cell: &LogCell| rule.acquire(cell, || NOW, 1, true);
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
            assert!(allowed, "an empty log admits");
            assert_eq!(held(&table, first), 1, "exactly the one entry at NOW");
            for &key in &keys[1..4] {
                assert_eq!(held(&table, key), 0, "empty log {key} evicted");
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
