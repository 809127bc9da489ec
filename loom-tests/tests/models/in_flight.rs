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
use std::task::{Context, Poll, Waker};

use tollgate_loom_tests::in_flight_waiters::{Enqueued, Places, Reserved, Ticket, Waiters};
use tollgate_loom_tests::state::{AtomicWord, Retired};
use tollgate_loom_tests::store::{Check, KeyTable, Reserve, Stored, WordTable};

use crate::{explore, explore_reaching, At, Hasher};

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

/// A limit of one key's count with `InFlight`'s waiter queue over it: the library's queue
/// (`src/limiter/in_flight/waiters.rs`) and the word table, with `InFlight`'s reservation and
/// release glue (`src/limiter/in_flight/wait.rs`, `InFlight::release`) in a few lines.
struct Waited<A, U> {
    table: Table,
    rule: A,
    unqueuing: U,
    waiters: Waiters<u64, (), ()>,
}

impl<A, U> Places<u64> for Waited<A, U>
where
    A: Stored<Cell = AtomicWord> + Copy,
    U: Stored<Cell = AtomicWord> + Copy,
{
    type Held = ();
    type Error = ();

    fn reserve(&self, key: &u64, cost: u64) -> Reserved<(), ()> {
        let evictor = At {
            table: &self.table,
            rule: self.rule,
            at: 0,
        };
        // As `InFlight`'s: a held key without the table's upkeep, else the full check.
        let decision = self
            .table
            .check_held(key, &self.rule, || 0, cost, Reserve)
            .unwrap_or_else(|| {
                self.table
                    .check_key(key, &self.rule, || 0, cost, &evictor, Reserve)
                    .unwrap()
            });
        if decision.allowed() {
            Reserved::Taken(())
        } else {
            Reserved::Queued
        }
    }

    fn unqueue(&self, key: &u64) {
        self.table.refund(key, &self.unqueuing, || 0, 0);
    }
}

impl<A, U> Waited<A, U>
where
    A: Stored<Cell = AtomicWord> + Copy,
    U: Stored<Cell = AtomicWord> + Copy,
{
    /// `try_acquire`: a check, refused while waiters are queued; refused by a mark with no
    /// waiter behind it (one a panic left), it clears the mark and checks again.
    fn check(&self, key: u64) -> bool {
        let evictor = At {
            table: &self.table,
            rule: self.rule,
            at: 0,
        };
        let check = || {
            self.table
                .check_key(&key, &self.rule, || 0, 1, &evictor, Check)
        };
        let decision = check().unwrap();
        if !decision.allowed() && decision.remaining() >= 1 && self.waiters.heal(self, &key) {
            return check().unwrap().allowed();
        }
        decision.allowed()
    }

    /// A waiter for a unit of `key`, after a refused check: how it ends up holding it (or is
    /// yet to), and its ticket if it waits.
    fn queue(&self, key: u64) -> (&'static str, Option<Ticket<u64, (), ()>>) {
        match self.waiters.enqueue(self, &key, 1) {
            Enqueued::Now(Ok(())) => ("reserved on queueing", None),
            Enqueued::Now(Err(_)) => panic!("refused for ever"),
            Enqueued::Waiting(ticket) => ("served by a release", Some(ticket)),
        }
    }

    /// Asserts that `ticket`'s waiter was served its unit.
    fn assert_served(&self, ticket: &Ticket<u64, (), ()>, message: &str) {
        let mut cx = Context::from_waker(Waker::noop());
        let served = self.waiters.poll(self, ticket, &mut cx);
        assert!(matches!(served, Poll::Ready(Ok(()))), "{message}");
    }

    /// A permit's drop: the unit back to the key's word, then the key's waiters served.
    fn release(&self, key: u64) {
        self.table.refund(&key, &self.rule, || 0, 1);
        self.waiters.released(self, &key);
    }
}

/// One key's limit of `N = 1` over the word table, with no waiter yet.
fn waited_one(
) -> Waited<impl Stored<Cell = AtomicWord> + Copy, impl Stored<Cell = AtomicWord> + Copy> {
    Waited {
        table: table(),
        rule: tollgate_loom_tests::in_flight_rule(1),
        unqueuing: tollgate_loom_tests::in_flight_unqueuing(1),
        waiters: Waiters::new(),
    }
}

/// A release races a waiter queueing for the unit it frees (`N = 1`), and a newcomer checks
/// meanwhile. Whatever the interleaving, the waiter ends with the unit (served by the release,
/// or reserving it itself): the release's write of the word and the waiter's count are never
/// both missed. At most one holder at a time; afterwards the key holds exactly the waiter's
/// unit, then nothing and no mark (a check admits).
#[test]
fn a_release_and_a_waiter_never_miss_each_other() {
    explore_reaching(
        "in_flight: release vs waiter vs newcomer",
        &[
            "checked after the release",
            "reserved on queueing",
            "served by a release",
        ],
        |seen| {
            let limit = Arc::new(waited_one());
            assert!(limit.check(1), "the unit the release gives back");
            let holders = Arc::new(AtomicUsize::new(1));
            let releaser = {
                let (limit, holders) = (limit.clone(), holders.clone());
                thread::spawn(move || {
                    holders.fetch_sub(1, Ordering::SeqCst);
                    limit.release(1);
                })
            };
            let newcomer = {
                let (limit, holders) = (limit.clone(), holders.clone());
                thread::spawn(move || {
                    if limit.check(1) {
                        // SeqCst: the models' own bookkeeping.
                        let before = holders.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(before, 0, "two holders of a unit when N = 1");
                        holders.fetch_sub(1, Ordering::SeqCst);
                        limit.release(1);
                    }
                })
            };
            let (how, ticket) = if limit.check(1) {
                ("checked after the release", None)
            } else {
                limit.queue(1)
            };
            releaser.join().unwrap();
            newcomer.join().unwrap();
            if let Some(ticket) = ticket {
                limit.assert_served(&ticket, "a waiter left waiting once every unit is free");
            }
            seen.saw(how);
            let held = 1 - limit.table.peek(&1, &limit.rule, || 0, 0).remaining();
            assert_eq!(held, 1, "the waiter's unit, and only it");
            limit.release(1);
            assert!(limit.check(1), "nothing held and no mark left");
        },
    );
}

/// The same race on a key whose mark a panic left behind (a reservation marked the key, then
/// its waiter's key panicked before it was queued): the waiter's refused reservation finds the
/// mark already set, and must still write the word (the rule flips a bit) for the release to
/// see its count.
#[test]
fn a_release_and_a_waiter_on_a_left_mark_never_miss_each_other() {
    explore_reaching(
        "in_flight: release vs waiter, mark left",
        &["reserved on queueing", "served by a release"],
        |seen| {
            let limit = Arc::new(waited_one());
            assert!(limit.check(1));
            assert!(
                matches!(limit.reserve(&1, 1), Reserved::Queued),
                "the mark left"
            );
            let releaser = {
                let limit = limit.clone();
                thread::spawn(move || limit.release(1))
            };
            let (how, ticket) = limit.queue(1);
            releaser.join().unwrap();
            if let Some(ticket) = ticket {
                limit.assert_served(&ticket, "a waiter left waiting once every unit is free");
            }
            seen.saw(how);
            limit.release(1);
            assert!(limit.check(1), "nothing held and no mark left");
        },
    );
}

/// A queued waiter gives up while a release serves it: the unit is either never reserved for it
/// or handed back by the waiter, and goes to the waiter behind it; none is lost or doubled.
#[test]
fn a_waiter_giving_up_races_the_release_that_serves_it() {
    explore_reaching(
        "in_flight: cancel vs serve",
        &["left unserved", "served, handed back"],
        |seen| {
            let limit = Arc::new(waited_one());
            assert!(limit.check(1));
            let Enqueued::Waiting(first) = limit.waiters.enqueue(&*limit, &1, 1) else {
                panic!("the unit is held")
            };
            let Enqueued::Waiting(second) = limit.waiters.enqueue(&*limit, &1, 1) else {
                panic!("behind the first")
            };
            let releaser = {
                let limit = limit.clone();
                thread::spawn(move || limit.release(1))
            };
            let handed_back = limit.waiters.cancel(&*limit, &first);
            if handed_back.is_some() {
                limit.release(1);
            }
            releaser.join().unwrap();
            seen.saw(if handed_back.is_some() {
                "served, handed back"
            } else {
                "left unserved"
            });
            limit.assert_served(&second, "the waiter behind is served with the unit");
            let held = 1 - limit.table.peek(&1, &limit.rule, || 0, 0).remaining();
            assert_eq!(held, 1, "the second waiter's unit, and only it");
            limit.release(1);
            assert!(limit.check(1), "nothing held and no mark left");
        },
    );
}
