//! The keyed store's insert / evict / lookup race: `store::KeyTable` (the key count, the
//! `max_keys` reservation and overflow policy, the amortised sweep, decide-existing-else-insert)
//! compiled from `src/store/table.rs`, over a store loom can see.
//!
//! Every model runs GCRA with `B = 2`, `T = 1 ms` at a frozen instant `NOW`, so that an
//! admission made during the race can never be evicted during it (a key admitted at `NOW` is
//! not fresh at `NOW`), while a key admitted before the race is fresh at `NOW`. Each allowed
//! decision must then be found exactly once, in the cell of a key still held or in the overflow
//! cell: none lost to a sweep, none counted twice.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher, Hash};
use std::time::Duration;

use loom::sync::{Arc, RwLock};
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::state::{AtomicWord, Retired};
use tollgate_loom_tests::store::{
    word_table, Check, Evictor, Inserted, KeyTable, OverflowPolicy, StoreProtocol, WordTable,
};
use tollgate_loom_tests::WordRule;
use tollgate_loom_tests::{Decision, Gcra, LimitError, Quota, Stored};

use crate::{explore, explore_reaching, At, MS};

/// The instant every request of the race is judged at (unless a model says otherwise).
const NOW: Nanos = 5 * MS;

/// A store loom can see: one reader-writer lock over a map, a dashmap with a single shard. As
/// the `StoreProtocol` contract asks, every closure runs while the lock is held (read for a lookup,
/// write for an insert or a sweep), so a sweep cannot remove a cell a decision is running on.
///
/// Cells sit behind an `Arc` only so that the contract can be broken in one line (run `f` on a
/// clone after the guard is dropped); the hasher is fixed because loom replays executions and
/// `retain` must visit the cells in the same order every time.
struct LockedStore<V>(RwLock<HashMap<u64, std::sync::Arc<V>, BuildHasherDefault<DefaultHasher>>>);

impl<V> LockedStore<V> {
    fn new() -> Self {
        LockedStore(RwLock::new(HashMap::default()))
    }
}

impl<V: Default + Send + Sync> StoreProtocol<u64, V> for LockedStore<V> {
    fn with_existing<Q, R>(
        &self,
        key: &Q,
        _era: u64,
        mut f: impl FnMut(&V) -> Option<R>,
    ) -> Option<R>
    where
        u64: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let map = self.0.read().unwrap();
        map.get(key).and_then(|cell| f(cell))
    }

    fn with_inserted<Q, R>(
        &self,
        key: &Q,
        _era: u64,
        f: impl FnOnce(&V) -> R,
        _evictor: &impl Evictor<V>,
        done: &mut Inserted,
    ) -> R
    where
        u64: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = u64> + ?Sized,
    {
        let mut map = self.0.write().unwrap();
        let mut inserted = false;
        let cell = map.entry(key.to_owned()).or_insert_with(|| {
            inserted = true;
            std::sync::Arc::default()
        });
        done.inserted = inserted;
        f(cell)
    }

    fn retain(&self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let mut map = self.0.write().unwrap();
        let before = map.len();
        map.retain(|_, cell| keep(cell));
        before - map.len()
    }

    fn len(&self) -> usize {
        self.0.read().unwrap().len()
    }
}

type Table = Keyed<LockedStore<AtomicWord>>;
/// A key table over any store (the models of the bound run over both).
type Keyed<S> = KeyTable<u64, AtomicWord, S>;

/// The lock-free word table, with GCRA's marks and a fixed hasher (loom replays executions).
fn word_store() -> WordTable<u64, BuildHasherDefault<DefaultHasher>> {
    word_table(
        Retired {
            tombstone: u64::MAX,
            moved: u64::MAX - 1,
        },
        BuildHasherDefault::default(),
    )
}

/// GCRA, 2 per 2 ms: `T = 1 ms`, `B = 2`.
fn rule() -> Gcra {
    Gcra::new(Quota::new(2, Duration::from_millis(2)).unwrap()).unwrap()
}

fn table(max_keys: Option<(usize, OverflowPolicy)>) -> Table {
    KeyTable::new(LockedStore::new(), max_keys)
}

/// A checked cost-1 request for `key`, judged at `at`.
fn admit_at<S: StoreProtocol<u64, AtomicWord>>(
    table: &Keyed<S>,
    key: u64,
    at: Nanos,
) -> Result<Decision, LimitError> {
    let rule = rule();
    let evictor = At { table, rule, at };
    table.check_key(&key, &rule, || at, 1, &evictor, Check)
}

fn admit<S: StoreProtocol<u64, AtomicWord>>(
    table: &Keyed<S>,
    key: u64,
) -> Result<Decision, LimitError> {
    admit_at(table, key, NOW)
}

/// How many cost-1 admissions at `NOW` `cell` holds (a state from before `NOW` holds none).
fn held(cell: &AtomicWord) -> u64 {
    2 - rule().acquire(cell, || NOW, 0, false).remaining()
}

/// `held` for `key`'s cell, 0 if the key is not in the table.
fn held_by<S: StoreProtocol<u64, AtomicWord>>(table: &Keyed<S>, key: u64) -> u64 {
    // A retired cell (the word table's tombstone) is absent, as the store's contract asks.
    let live = |cell: &AtomicWord| rule().acquire_live(cell, || NOW, 0, false);
    table
        .store()
        .with_existing(&key, 0, |cell| live(cell).map(|_| held(cell)))
        .unwrap_or(0)
}

/// A table holding key 1, admitted at 0, so fresh (evictable) at `NOW`.
fn with_fresh_key(max_keys: Option<(usize, OverflowPolicy)>) -> Table {
    with_fresh_key_in(LockedStore::new(), max_keys)
}

/// The same over `store`.
fn with_fresh_key_in<S: StoreProtocol<u64, AtomicWord>>(
    store: S,
    max_keys: Option<(usize, OverflowPolicy)>,
) -> Keyed<S> {
    let table = KeyTable::new(store, max_keys);
    assert!(admit_at(&table, 1, 0).unwrap().allowed());
    let fresh = table
        .store()
        .with_existing(&1, 0, |cell| Some(rule().is_fresh(cell.load(), NOW)));
    assert_eq!(fresh, Some(true));
    assert_eq!(held_by(&table, 1), 0);
    table
}

fn allowed(results: &[Result<Decision, LimitError>]) -> u64 {
    results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|d| d.allowed()))
        .count() as u64
}

/// Runs `job` on a new thread against `table`.
fn spawn<S: StoreProtocol<u64, AtomicWord> + 'static, R: Send + 'static>(
    table: &Arc<Keyed<S>>,
    job: impl FnOnce(&Keyed<S>) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let table = Arc::clone(table);
    thread::spawn(move || job(&table))
}

/// (a) Key 1 is fresh at `NOW`; two threads admit on it while a third evicts fresh keys. The
/// sweep either runs first (and the key is inserted again, fresh) or after an admission (and
/// keeps it): both requests are allowed (a fresh bucket holds 2) and the key ends holding
/// exactly 2, never 1 (an admission lost with an evicted cell) nor 3.
#[test]
fn evict_races_admissions() {
    explore_reaching(
        "evict_races_admissions",
        &["evicted 0", "evicted 1"],
        |seen| {
            let table = Arc::new(with_fresh_key(None));
            let admits = [
                spawn(&table, |t| admit(t, 1)),
                spawn(&table, |t| admit(t, 1)),
            ];
            let evicted = spawn(&table, |t| t.evict_fresh(&rule(), NOW))
                .join()
                .unwrap();
            let decisions = admits.map(|a| a.join().unwrap());
            seen.saw(format!("evicted {evicted}"));
            assert_eq!(allowed(&decisions), 2, "{decisions:?}, evicted {evicted}");
            assert_eq!(
                held_by(&table, 1),
                2,
                "admissions lost or doubled: {decisions:?}, evicted {evicted}"
            );
            assert!(evicted <= 1);
            assert_eq!((table.len(), table.store().len()), (1, 1));
        },
    );
}

/// Every allowed decision is recorded exactly once: in the cell of a key the table holds, or in
/// the overflow cell; and the count is exact.
fn assert_conserved<S: StoreProtocol<u64, AtomicWord>>(
    table: &Keyed<S>,
    keys: &[u64],
    decisions: &[Result<Decision, LimitError>],
) {
    let recorded: u64 =
        keys.iter().map(|&k| held_by(table, k)).sum::<u64>() + held(table.overflow());
    assert_eq!(
        recorded,
        allowed(decisions),
        "admissions lost or counted twice: {decisions:?}"
    );
    assert_eq!(table.len(), table.store().len(), "the key count is off");
}

/// A short name for an outcome, for `Seen`.
fn outcome(result: &Result<Decision, LimitError>) -> &'static str {
    match result {
        Ok(d) if d.allowed() => "allowed",
        Ok(_) => "denied",
        Err(LimitError::KeyTableFull { .. }) => "full",
        Err(_) => "error",
    }
}

/// (a, through the amortised sweep) `max_keys = 1` holds key 1, fresh at `NOW`. One thread
/// admits on it while another asks for new key 2, which finds the table full and sweeps (a miss
/// at the bound makes a sweep due). Either the admission comes first and key 2 does not fit, or
/// the sweep evicts key 1 and the two race for the one place. Whatever the order, every allowed
/// request is recorded once, the table holds exactly one key, and only a request for a key the
/// table does not hold is refused (Deny) or sent to the overflow cell (Shared).
#[test]
fn sweep_in_decide_races_admission() {
    race_at_the_bound("sweep_in_decide_races_admission", LockedStore::new);
}

/// (a, through the word table's eviction hand) The same race on the lock-free word table:
/// there key 2, finding the table at its bound, lets the table's hand judge a few cells (here
/// every shard) instead of sweeping; the outcomes and invariants are the same.
#[test]
fn eviction_hand_races_admission() {
    race_at_the_bound("eviction_hand_races_admission", word_store);
}

fn race_at_the_bound<S: StoreProtocol<u64, AtomicWord> + 'static>(name: &str, store: fn() -> S) {
    for policy in [OverflowPolicy::Deny, OverflowPolicy::Shared] {
        let expected: &[&str] = match policy {
            OverflowPolicy::Deny => &["key 1 full", "key 2 full", "key 1 in", "key 2 in"],
            OverflowPolicy::Shared => &["key 1 overflow", "key 2 overflow", "key 1 in", "key 2 in"],
        };
        explore_reaching(&format!("{name}({policy:?})"), expected, move |seen| {
            let table = Arc::new(with_fresh_key_in(store(), Some((1, policy))));
            let old = spawn(&table, |t| admit(t, 1));
            let new = spawn(&table, |t| admit(t, 2));
            let decisions = [old.join().unwrap(), new.join().unwrap()];
            assert_conserved(&table, &[1, 2], &decisions);
            assert_eq!((table.len(), table.store().len()), (1, 1));
            for (key, decision) in [1, 2].into_iter().zip(&decisions) {
                let live = |cell: &AtomicWord| rule().acquire_live(cell, || NOW, 0, false);
                let held = table.store().with_existing(&key, 0, live).is_some();
                if held {
                    seen.saw(format!("key {key} in"));
                }
                match (policy, outcome(decision)) {
                    (_, "allowed") if held => {}
                    (OverflowPolicy::Shared, "allowed") => seen.saw(format!("key {key} overflow")),
                    (OverflowPolicy::Deny, "full") if !held => seen.saw(format!("key {key} full")),
                    _ => panic!("key {key} (held: {held}): {decision:?}; all: {decisions:?}"),
                }
            }
        });
    }
}

/// (a, two sweepers) As above with a third thread: `max_keys = 1` holds key 1, fresh at `NOW`;
/// one thread admits on it while two others ask for new keys 2 and 3, both finding the table
/// full and sweeping (one at a time: the second finds the flag taken). Exactly one key ends in
/// the table, every allowed request is recorded once, nothing is refused (Shared).
#[test]
fn two_sweepers_race_admission() {
    explore_reaching(
        "two_sweepers_race_admission",
        &["key 1 in", "key 2 in", "key 3 in"],
        |seen| {
            let table = Arc::new(with_fresh_key(Some((1, OverflowPolicy::Shared))));
            let racers = [1, 2, 3].map(|key| spawn(&table, move |t| admit(t, key)));
            let decisions = racers.map(|r| r.join().unwrap());
            assert_eq!(allowed(&decisions), 3, "{decisions:?}");
            assert_conserved(&table, &[1, 2, 3], &decisions);
            assert_eq!((table.len(), table.store().len()), (1, 1));
            for key in [1, 2, 3] {
                if table.store().with_existing(&key, 0, |_| Some(())).is_some() {
                    seen.saw(format!("key {key} in"));
                }
            }
        },
    );
}

/// (b) Two threads ask for the same new key at once: it is inserted once, both requests are
/// allowed and its cell holds exactly 2. Unbounded, and with `max_keys = 2`, where both threads
/// reserve a place and the one whose insert finds the key gives its place back.
#[test]
fn same_new_key_inserted_once() {
    for max_keys in [None, Some((2, OverflowPolicy::Deny))] {
        explore(
            &format!("same_new_key_inserted_once({max_keys:?})"),
            move || {
                let table = Arc::new(table(max_keys));
                let racers = [
                    spawn(&table, |t| admit(t, 7)),
                    spawn(&table, |t| admit(t, 7)),
                ];
                let decisions = racers.map(|r| r.join().unwrap());
                assert_eq!(allowed(&decisions), 2, "{decisions:?}");
                assert_eq!(held_by(&table, 7), 2, "{decisions:?}");
                assert_eq!((table.len(), table.store().len()), (1, 1), "{decisions:?}");
            },
        );
    }
}

/// (b, at the bound) The same race with `max_keys = 1`: the second thread's reservation fails
/// while the first holds the place, and if the first has not inserted the key yet when the
/// second looks again, the second is refused although the key is about to exist. A transient,
/// conservative refusal; what must hold is that nothing is lost or doubled and the key is
/// inserted once.
#[test]
fn same_new_key_at_the_bound() {
    explore_reaching(
        "same_new_key_at_the_bound",
        &["both allowed", "one full"],
        |seen| {
            let table = Arc::new(table(Some((1, OverflowPolicy::Deny))));
            let racers = [
                spawn(&table, |t| admit(t, 7)),
                spawn(&table, |t| admit(t, 7)),
            ];
            let decisions = racers.map(|r| r.join().unwrap());
            assert_conserved(&table, &[7], &decisions);
            assert_eq!((table.len(), table.store().len()), (1, 1), "{decisions:?}");
            match decisions.map(|d| outcome(&d)) {
                ["allowed", "allowed"] => seen.saw("both allowed"),
                ["allowed", "full"] | ["full", "allowed"] => seen.saw("one full"),
                _ => panic!("{decisions:?}"),
            }
        },
    );
}

/// (c) `max_keys = 1`, two new keys at once. The count never reads above the bound (each thread
/// checks it after its call), exactly one key gets in, the other request is refused (Deny) or
/// counted in the overflow cell (Shared), and `len()` is exact afterwards.
#[test]
fn bound_holds_for_two_new_keys() {
    for policy in [OverflowPolicy::Deny, OverflowPolicy::Shared] {
        explore(
            &format!("bound_holds_for_two_new_keys({policy:?})"),
            move || {
                let table = Arc::new(table(Some((1, policy))));
                let racers = [2, 3].map(|key| {
                    spawn(&table, move |t| {
                        let decision = admit(t, key);
                        assert!(t.len() <= 1, "{} keys counted with max_keys = 1", t.len());
                        decision
                    })
                });
                let decisions = racers.map(|r| r.join().unwrap());
                assert_conserved(&table, &[2, 3], &decisions);
                assert_eq!((table.len(), table.store().len()), (1, 1), "{decisions:?}");
                let outcomes = decisions.map(|d| outcome(&d));
                let (in_table, overflow) = (
                    held_by(&table, 2) + held_by(&table, 3),
                    held(table.overflow()),
                );
                match policy {
                    OverflowPolicy::Deny => {
                        assert!(
                            outcomes.contains(&"allowed") && outcomes.contains(&"full"),
                            "{decisions:?}"
                        );
                        assert_eq!((in_table, overflow), (1, 0));
                    }
                    OverflowPolicy::Shared => {
                        assert_eq!(outcomes, ["allowed", "allowed"]);
                        assert_eq!((in_table, overflow), (1, 1));
                    }
                }
            },
        );
    }
}

/// (d) A key evicted before it was counted. Unbounded; a thread judged at 0 (say, preempted
/// since it read the clock) inserts key 9, which is fresh again at `NOW`, while a sweep at `NOW`
/// runs. If the sweep removes the key before the inserting thread counts it, the count must not
/// wrap below zero: `len()` never reads more keys than could exist.
#[test]
fn key_evicted_before_it_is_counted() {
    explore_reaching(
        "key_evicted_before_it_is_counted",
        &["evicted 0", "evicted 1"],
        |seen| {
            let table = Arc::new(table(None));
            let late = spawn(&table, |t| admit_at(t, 9, 0));
            let sweep = spawn(&table, |t| {
                let evicted = t.evict_fresh(&rule(), NOW);
                assert!(t.len() <= 1, "len() = {} with at most 1 key", t.len());
                evicted
            });
            assert!(late.join().unwrap().unwrap().allowed());
            let evicted = sweep.join().unwrap();
            seen.saw(format!("evicted {evicted}"));
            assert_eq!(table.len(), table.store().len());
            assert_eq!(table.len(), 1 - evicted);
        },
    );
}
