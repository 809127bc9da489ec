//! `InFlight`'s protocol: a concurrency count per key in the lock-free word table, acquired by
//! a check, released by a refund, evicted only while nothing is held.
//!
//! Two threads acquire a unit of one key (`N = 1`) and release it; a third evicts idle keys
//! meanwhile. In every execution at most one thread holds the unit at a time, no release is
//! lost (the count ends at 0, and a later acquire is admitted), and a key is never evicted
//! while its unit is held (the holder's release finds it: otherwise the count it later gives
//! back would be lost with the key, or land in a new cell as a negative).

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::state::{AtomicWord, Retired};
use tollgate_loom_tests::store::{Check, KeyTable, Stored, WordTable};

use crate::{explore, At, Hasher};

type Table = KeyTable<u64, AtomicWord, WordTable<u64, Hasher>>;

fn table() -> Table {
    let marks = Retired {
        tombstone: u64::MAX,
        moved: u64::MAX - 1,
    };
    KeyTable::new(WordTable::new(marks, Hasher::default()), None)
}

/// Acquires a unit of `key`; if admitted, counts itself a holder, checks it is alone, and
/// releases. Returns whether it was admitted.
fn hold_once<A>(table: &Table, rule: A, key: u64, holders: &AtomicUsize) -> bool
where
    A: Stored<Cell = AtomicWord> + Copy,
{
    let evictor = At { table, rule, at: 0 };
    let decision = table
        .check_key(&key, &rule, || 0, 1, &evictor, Check)
        .unwrap();
    if !decision.allowed() {
        return false;
    }
    // SeqCst: the models' own bookkeeping, ordered with everything else.
    let before = holders.fetch_add(1, Ordering::SeqCst);
    assert_eq!(before, 0, "two holders of a unit when N = 1");
    holders.fetch_sub(1, Ordering::SeqCst);
    table.refund(&key, &rule, || 0, 1);
    true
}

#[test]
fn in_flight_acquire_release_and_evict_race() {
    explore("in_flight_acquire_release_and_evict_race", || {
        let rule = tollgate_loom_tests::in_flight_rule(1);
        let table = Arc::new(table());
        let holders = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (table, holders) = (table.clone(), holders.clone());
                thread::spawn(move || hold_once(&table, rule, 1, &holders))
            })
            .collect();
        let sweeper = {
            let table = table.clone();
            thread::spawn(move || table.evict_fresh(&rule, 0))
        };
        let admitted: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        sweeper.join().unwrap();
        assert!(admitted.contains(&true), "the first to come is admitted");
        // Every unit given back: the key reads as holding nothing (or is gone), and a new
        // acquire is admitted.
        let held = 1 - table.peek(&1, &rule, || 0, 0).remaining();
        assert_eq!(held, 0, "a release lost");
        assert!(hold_once(&table, rule, 1, &holders));
    });
}
