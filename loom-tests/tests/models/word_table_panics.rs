//! The word table (`src/store/word_table.rs`) when a key's own code panics under a shard's
//! lock while another thread admits: a drain that rehashes a key whose `Hash` panics, and a
//! drained table released while a key's `Drop` panics (CONTRIBUTING, "A key's own code runs
//! inside the table").
//!
//! What the library promises there: each such call runs before the step it serves changes
//! anything, so the call the panic comes out of (whichever thread's) changed nothing of what
//! it was asked and can simply be made again; the drain leaves the slot it was visiting in
//! place, to be visited again; a key whose `Drop` panicked is not dropped again, and the keys
//! after it in the step are dropped as the panic unwinds; the shard's lock is free and its
//! counts right after it. The store's locks here are the shim's `SpinLock`
//! (`loom-tests/src/sync.rs`), which a panic does not poison, as the library's parking_lot
//! mutex: loom's own mutex poisons, and every later `lock` would panic
//! (`locks_survive_panics`).

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::state::AtomicWord;
use tollgate_loom_tests::store::{
    audit, retired_slots, word_table, Check, KeyTable, OverflowPolicy, StoreProtocol, WordTable,
};
use tollgate_loom_tests::{locks_survive_panics, Stored};

use crate::word_table::{rule, KeepAll, MARKS, NOW};
use crate::{explore_reaching, same_shard_keys, Hasher, Seen};

/// The key call a model makes panic, once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Hash,
    Drop,
}

/// What every copy of a model's keys reports to (plain data behind a `std` mutex, which loom
/// does not see and which is never held across a loom operation or a panic). One an
/// execution, leaked: it outlives every copy, even one dropped twice (a reference count in
/// the keys would be decremented twice, and free the ledger under the model).
#[derive(Default)]
struct Ledger(std::sync::Mutex<Book>);

#[derive(Default)]
struct Book {
    /// The serial number of the next copy made.
    next: u64,
    /// The copies alive.
    live: BTreeSet<u64>,
    /// Copies (key, serial number) dropped when they were not alive: dropped twice.
    twice: Vec<(u64, u64)>,
    /// The call that panics next, in a copy of which key held by the table; once.
    trap: Option<(Call, u64)>,
    /// Planted panics that went off.
    fired: usize,
}

impl Ledger {
    fn new() -> &'static Ledger {
        Box::leak(Box::default())
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn arm(&self, call: Call, key: u64) {
        self.book().trap = Some((call, key));
    }

    /// A new copy's serial number.
    fn made(&self) -> u64 {
        let mut book = self.book();
        let serial = book.next;
        book.next += 1;
        book.live.insert(serial);
        serial
    }

    fn dropped(&self, key: u64, serial: u64) {
        let mut book = self.book();
        if !book.live.remove(&serial) {
            book.twice.push((key, serial));
        }
    }

    /// Panics if `call` of `key`'s copies in the table is the one armed (then disarmed).
    fn touch(&self, call: Call, key: u64) {
        if std::thread::panicking() {
            return; // a second panic while unwinding aborts, whatever the store does
        }
        let fire = {
            let mut book = self.book();
            let fire = book.trap == Some((call, key));
            if fire {
                book.trap = None;
                book.fired += 1;
            }
            fire
        };
        if fire {
            panic!("planted panic in the {call:?} of key {key}");
        }
    }
}

/// A key whose copies in the table (the clones the table makes: the model never clones a key)
/// may panic in `Hash` or `Drop` when its [`Ledger`] is armed; every copy is numbered, so a
/// copy dropped twice or never shows in the ledger. Hashes as its `u64` does, so that
/// `same_shard_keys` gives keys of one shard.
struct Trapped {
    id: u64,
    serial: u64,
    in_table: bool,
    ledger: &'static Ledger,
}

impl Trapped {
    fn new(id: u64, ledger: &'static Ledger) -> Self {
        Trapped {
            id,
            serial: ledger.made(),
            in_table: false,
            ledger,
        }
    }
}

impl Clone for Trapped {
    fn clone(&self) -> Self {
        let mut copy = Trapped::new(self.id, self.ledger);
        copy.in_table = true;
        copy
    }
}

impl std::hash::Hash for Trapped {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.in_table {
            self.ledger.touch(Call::Hash, self.id);
        }
        self.id.hash(state);
    }
}

impl PartialEq for Trapped {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Trapped {}

impl Drop for Trapped {
    fn drop(&mut self) {
        self.ledger.dropped(self.id, self.serial);
        if self.in_table {
            self.ledger.touch(Call::Drop, self.id);
        }
    }
}

impl std::fmt::Debug for Trapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key {}", self.id)
    }
}

type Table = KeyTable<Trapped, AtomicWord, WordTable<Trapped, Hasher>>;

/// Leaves out the messages of the planted panics (others print as before).
fn quiet_planted_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !planted(info.payload()) {
                default(info);
            }
        }));
    });
}

fn planted(payload: &(dyn std::any::Any + Send)) -> bool {
    payload
        .downcast_ref::<String>()
        .is_some_and(|s| s.starts_with("planted panic"))
}

/// Runs `f`; if the planted panic comes out of it, runs it once more (that call must not
/// panic: the panic was planted once). Whether the first call was interrupted.
fn again_if_interrupted<R>(mut f: impl FnMut() -> R) -> (R, bool) {
    match catch_unwind(AssertUnwindSafe(&mut f)) {
        Ok(result) => (result, false),
        Err(payload) => {
            assert!(planted(&*payload), "a panic not planted");
            (f(), true)
        }
    }
}

/// A cost-1 check of `key` at `NOW` through the key table (a key absent is inserted).
fn admit(table: &Table, key: &Trapped) -> bool {
    table
        .check_key(key, &rule(), || NOW, 1, &KeepAll, Check)
        .unwrap()
        .allowed()
}

/// Units `key`'s state holds at `NOW` (`None`: absent).
fn held(table: &Table, key: &Trapped) -> Option<u64> {
    table.store().with_existing(key, 0, |cell| {
        rule()
            .acquire_live(cell, || NOW, 0, false)
            .map(|d| 2 - d.remaining())
    })
}

/// The key of the 7 (of one shard) whose copies in the table panic.
const PANICKING: usize = 1;

/// The models' body: keys 0-3 (one shard's) fill its first table, `T0` (8 slots), with a unit
/// each; then `call` of key [`PANICKING`]'s copy in the table is armed. The main thread
/// checks key 4 (its insert replaces `T0`, which from then on is drained) and key 5 (its
/// insert drains `T0`, rehashing each live key into the new table: key 1's `Hash` may panic
/// there), while another thread checks key `admitted` (lock-free in `T0` or in the new table,
/// or under the lock, where its lookup drains too and takes its key out of the drain, or
/// helps release `T0`: key 1's `Drop` may panic there). Whichever call the panic comes out of
/// is made again. Then the main thread looks the keys up until `T0` is released (a lookup
/// helps: its `Drop` panic may come out of one of those), and checks a new key 6.
///
/// Asserted in every execution: the planted panic went off exactly once; every check was
/// allowed, the interrupted one on its second call (the interrupted call counted nothing);
/// each key holds exactly its units (`admitted` 2, the others 1: no key lost, no admission
/// lost or counted twice); the shard takes a new key after the panic; the key table's count
/// (under a bound of 16 keys, never reached, so that it counts) and the store's agree (7),
/// and the shard's counts agree with its tables (`audit`); once the store is dropped, every
/// copy of a key is dropped, none twice. loom checks each key's reads in the table against
/// its write and its drop.
fn a_key_panics_under_the_shard_lock(call: Call, admitted: usize, seen: &Seen) {
    quiet_planted_panics();
    let ids = same_shard_keys(7);
    let ledger = Ledger::new();
    let key = |i: usize| Trapped::new(ids[i], ledger);
    locks_survive_panics(true);
    let store = word_table(MARKS, Hasher::default());
    locks_survive_panics(false);
    // A bound the model never reaches, so that the key table counts its keys (an unbounded
    // word table's are the store's own count): an insert the panic interrupts gives back
    // the place it counted.
    let table = Arc::new(KeyTable::new(store, Some((16, OverflowPolicy::Deny))));
    for i in 0..4 {
        assert!(admit(&table, &key(i)));
    }
    ledger.arm(call, ids[PANICKING]);
    let admitter = {
        let (table, key) = (Arc::clone(&table), key(admitted));
        thread::spawn(move || again_if_interrupted(|| admit(&table, &key)))
    };
    let (fifth, fifth_interrupted) = again_if_interrupted(|| admit(&table, &key(4)));
    let (sixth, sixth_interrupted) = again_if_interrupted(|| admit(&table, &key(5)));
    let (theirs, theirs_interrupted) = admitter.join().unwrap();
    // Lookups help release the drained table (a step a lookup here): a key's `Drop` may
    // panic in one of them.
    let mut later_interrupted = false;
    for lookups in 0.. {
        if retired_slots(table.store()) == 0 {
            break;
        }
        assert!(
            lookups < 8,
            "a drained table no thread holds is never released"
        );
        later_interrupted |= again_if_interrupted(|| held(&table, &key(0))).1;
    }
    assert_eq!(ledger.book().fired, 1, "the planted panic went off once");
    assert!(fifth && sixth && theirs, "every check allowed");
    for i in 0..6 {
        let units = if i == admitted { 2 } else { 1 };
        assert_eq!(held(&table, &key(i)), Some(units), "key {i}'s units");
    }
    assert!(
        admit(&table, &key(6)),
        "the shard takes a new key after the panic"
    );
    assert_eq!((table.len(), table.store().len()), (7, 7), "keys counted");
    audit(table.store());
    drop(table);
    let book = ledger.book();
    assert!(
        book.twice.is_empty(),
        "copies (key, serial number) dropped twice: {:?}",
        book.twice
    );
    assert!(
        book.live.is_empty(),
        "copies never dropped: {:?}",
        book.live
    );
    let interrupted = [
        (fifth_interrupted, "the panic in the 5th key's check"),
        (sixth_interrupted, "the panic in the 6th key's check"),
        (theirs_interrupted, "the panic in the other thread's check"),
        (later_interrupted, "the panic in a later lookup"),
    ];
    let (_, place) = interrupted
        .iter()
        .copied()
        .find(|(interrupted, _)| *interrupted)
        .expect("the planted panic came out of some call");
    assert_eq!(
        interrupted.iter().filter(|(i, _)| *i).count(),
        1,
        "one call interrupted"
    );
    seen.saw(place);
}

/// (a) A drain meets a key whose `Hash` panics (key 1: the drain visits keys 3 and 2 before
/// it, key 0 after), while another thread checks a key of the same table: key 0, which the
/// drain visits after the panic, and then the panicking key itself (whose own lookup may take
/// it out of the drain, rehashing it): two runs.
#[test]
fn a_key_whose_hash_panics_in_a_drain_racing_an_admission() {
    explore_reaching(
        "word table: a Hash panics in a drain vs an admission on another key",
        &[
            "the panic in the 6th key's check",
            "the panic in the other thread's check",
        ],
        |seen| a_key_panics_under_the_shard_lock(Call::Hash, 0, seen),
    );
    explore_reaching(
        "word table: a Hash panics in a drain vs an admission on that key",
        &[
            "the panic in the 6th key's check",
            "the panic in the other thread's check",
        ],
        |seen| a_key_panics_under_the_shard_lock(Call::Hash, PANICKING, seen),
    );
}

/// (b) A drained table is released (its keys dropped, a step at a time, under the shard's
/// lock) and a key's `Drop` panics (key 1's: the step drops key 0's copy before it, keys 2
/// and 3's as the panic unwinds), while another thread checks key 0.
#[test]
fn a_key_whose_drop_panics_as_a_drained_table_is_released_racing_an_admission() {
    explore_reaching(
        "word table: a Drop panics as a drained table is released vs an admission",
        &[
            "the panic in the 6th key's check",
            "the panic in the other thread's check",
            "the panic in a later lookup",
        ],
        |seen| a_key_panics_under_the_shard_lock(Call::Drop, 0, seen),
    );
}
