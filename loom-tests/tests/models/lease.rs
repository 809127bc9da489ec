//! The leased tier's lease word and route (`src/redis/lease/word.rs`, `route.rs`).
//!
//! A lost update planted in `take` (its CAS replaced by a plain store) passed 21 of
//! the 22 leased integration tests. Here every transition of the word runs against the others,
//! and every execution must account for each unit exactly once: spent by a check, taken back,
//! emptied (given back or handed over), expired, or still held.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::lease_route::{Route, Way};
use tollgate_loom_tests::lease_word::{units_of, LeaseWord, MS};

use crate::explore;

/// Checks spend one unit at a time, twice each, while a grant deposits and the lease is
/// emptied: nothing is spent twice, nothing lost.
#[test]
fn takes_deposits_and_empty_account_for_every_unit() {
    explore("lease: take x take x deposit+empty", || {
        let word = Arc::new(LeaseWord::new(2, 1));
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let word = Arc::clone(&word);
                thread::spawn(move || {
                    (0..2)
                        .map(|_| word.take(1, 0, 0).map_or(0, |_| 1))
                        .sum::<u64>()
                })
            })
            .collect();
        let level = word.deposit(1, true, 1);
        assert!(level <= 3);
        let emptied = units_of(word.empty(0));
        let spent: u64 = checks.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(
            spent + emptied + units_of(word.load()),
            3,
            "2 held + 1 granted"
        );
    });
}

/// First-touch units taken back while checks spend them.
#[test]
fn take_up_to_races_checks_without_losing_a_unit() {
    explore("lease: take x take x take_up_to", || {
        let word = Arc::new(LeaseWord::new(3, 1));
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let word = Arc::clone(&word);
                thread::spawn(move || word.take(1, 0, 0).map_or(0, |_| 1))
            })
            .collect();
        let (before, taken) = word.take_up_to(2);
        assert!(taken <= 2 && taken <= before);
        let spent: u64 = checks.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(spent + taken + units_of(word.load()), 3);
    });
}

/// A parked GCRA grant takes the word over while checks spend what is left of the earlier
/// grant: each old unit is spent or void, each new one spent or still held, never both.
#[test]
fn a_parked_grant_replaces_the_word_while_checks_spend_it() {
    explore("lease: take x take x replace", || {
        let word = Arc::new(LeaseWord::new(2, 1));
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let word = Arc::clone(&word);
                thread::spawn(move || {
                    (0..2)
                        .map(|_| word.take(1, 0, 0).map_or(0, |_| 1))
                        .sum::<u64>()
                })
            })
            .collect();
        let void = units_of(word.replace(3, 2));
        let spent: u64 = checks.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(spent + void + units_of(word.load()), 2 + 3);
        assert!(void <= 2 && units_of(word.load()) <= 3);
    });
}

/// A GCRA grant whose slots follow the word's extends it while checks spend: every unit
/// spent once or still held.
#[test]
fn an_extending_grant_and_checks_account_for_every_unit() {
    explore("lease: take x take x extend", || {
        let word = Arc::new(LeaseWord::new(2, 1));
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let word = Arc::clone(&word);
                thread::spawn(move || {
                    (0..2)
                        .map(|_| word.take(1, 0, 0).map_or(0, |_| 1))
                        .sum::<u64>()
                })
            })
            .collect();
        let level = word.extend(2, 0, 0, 2);
        assert!(level <= 4);
        let spent: u64 = checks.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(spent + units_of(word.load()), 2 + 2);
    });
}

/// The sweeper voids an expired lease only if no check changed the word since it read
/// it; checks never spend an expired lease.
#[test]
fn expire_and_take_never_both_have_a_unit() {
    explore("lease: take x expire", || {
        // Deadline at 5 ms; the check runs at 4 ms (valid), the sweeper at 5 ms.
        let word = Arc::new(LeaseWord::new(2, 5));
        let check = {
            let word = Arc::clone(&word);
            thread::spawn(move || word.take(1, 4 * MS, 0).map_or(0, |_| 1))
        };
        let seen = word.load();
        let expired = if word.expire(seen) { units_of(seen) } else { 0 };
        let spent = check.join().unwrap();
        assert_eq!(spent + expired + units_of(word.load()), 2);
        assert_eq!(word.take(1, 5 * MS, 0), None, "expired at 5 ms");
    });
}

/// The handover: one thread empties the lease into the policy's state and ends it; checks
/// spend from the lease until they read `Policy`, then from the policy's state, which they
/// must find seeded (the Release/Acquire pair of the route). Every unit once.
#[test]
fn a_check_routed_to_the_policy_sees_the_handed_over_units() {
    const UNSEEDED: u64 = u64::MAX;
    explore("lease: route handover x check x check", || {
        let word = Arc::new(LeaseWord::new(2, 1));
        let route = Arc::new(Route::default());
        // The policy's state for the key (units), unseeded until the handover writes it.
        let local = Arc::new(AtomicU64::new(UNSEEDED));
        let checks: Vec<_> = (0..2)
            .map(|_| {
                let (word, route, local) = (word.clone(), route.clone(), local.clone());
                thread::spawn(move || {
                    let (mut from_lease, mut from_local) = (0, 0);
                    for _ in 0..2 {
                        match route.way() {
                            Way::Leases | Way::Handing => {
                                from_lease += word.take(1, 0, 0).map_or(0, |_| 1);
                            }
                            Way::Policy => {
                                // Relaxed: the model's stand-in for the local limiter's own
                                // state; what makes the seed visible is the route's Acquire.
                                let units = local.load(Ordering::Relaxed);
                                assert_ne!(units, UNSEEDED, "routed to an unseeded policy");
                                if units > 0
                                    && local
                                        .compare_exchange(
                                            units,
                                            units - 1,
                                            Ordering::Relaxed,
                                            Ordering::Relaxed,
                                        )
                                        .is_ok()
                                {
                                    from_local += 1;
                                }
                            }
                        }
                    }
                    (from_lease, from_local)
                })
            })
            .collect();
        assert!(route.begin(), "the only handover");
        assert!(!route.begin(), "elected once");
        let handed = units_of(word.empty(0));
        // Relaxed: published by `finish`'s Release.
        local.store(handed, Ordering::Relaxed);
        route.finish();
        let (mut lease, mut policy) = (0, 0);
        for check in checks {
            let (a, b) = check.join().unwrap();
            lease += a;
            policy += b;
        }
        assert_eq!(
            lease + handed,
            2,
            "each unit spent from the lease or handed over"
        );
        assert_eq!(policy + local.load(Ordering::Relaxed), handed);
        assert!(route.back());
        assert_eq!(route.way(), Way::Leases);
    });
}

/// Two callers find the breaker open at once and race `begin`, while the breaker closes again
/// (`back`) on the main thread: one handover per move out of `Leases`, never two running at
/// once, each finished before the route can go back; the route ends where the last move left
/// it. (With a load-then-store `begin`, both callers run a handover.)
#[test]
fn two_callers_race_the_handover_and_the_way_back() {
    use loom::sync::atomic::AtomicUsize;
    explore("lease: begin x begin x back", || {
        let route = Arc::new(Route::default());
        let running = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (route, running) = (Arc::clone(&route), Arc::clone(&running));
                thread::spawn(move || {
                    if !route.begin() {
                        return false;
                    }
                    // Relaxed: a tally the model reads; the route orders the handovers.
                    assert_eq!(running.fetch_add(1, Ordering::Relaxed), 0, "two handovers");
                    assert_eq!(route.way(), Way::Handing);
                    running.fetch_sub(1, Ordering::Relaxed);
                    route.finish();
                    true
                })
            })
            .collect();
        let backs = usize::from(route.back());
        let won: usize = callers
            .into_iter()
            .map(|caller| usize::from(caller.join().unwrap()))
            .sum();
        assert!(won >= 1, "the breaker opened: someone hands over");
        assert!(backs <= won && won <= backs + 1, "won {won}, backs {backs}");
        let end = if won > backs {
            Way::Policy
        } else {
            Way::Leases
        };
        assert_eq!(route.way(), end);
    });
}

/// A refill in flight (its grant deposits 2 units, then it ends with `finish`) races a
/// retirement (`release_all`: `retire`, then every unit taken back) and a check asking for a
/// refill (`claim`). Whichever comes first, the grant's units are given back exactly once
/// (by the retirement, or by the refill that finds the lease retired), the lease ends retired
/// and empty, and no refill can be claimed after. (With a plain store in `finish`, the refill
/// clears the retirement and its units stay on a forgotten lease.)
#[test]
fn a_refill_ending_races_a_retirement_and_a_claim() {
    use tollgate_loom_tests::lease_refill::Refill;
    explore("lease: refill finish x retire x claim", || {
        let refill = Arc::new(Refill::default());
        let word = Arc::new(AtomicU64::new(0));
        assert!(refill.claim(), "the refill in flight");
        let finishing = {
            let (refill, word) = (Arc::clone(&refill), Arc::clone(&word));
            thread::spawn(move || {
                // Relaxed: the model's lease word, changed only by RMWs.
                word.fetch_add(2, Ordering::Relaxed);
                if refill.finish() {
                    0
                } else {
                    word.swap(0, Ordering::Relaxed)
                }
            })
        };
        let claiming = {
            let refill = Arc::clone(&refill);
            thread::spawn(move || refill.claim())
        };
        refill.retire();
        let retired_took = word.swap(0, Ordering::Relaxed);
        let refill_took = finishing.join().unwrap();
        claiming.join().unwrap();
        assert_eq!(retired_took + refill_took, 2, "the grant given back once");
        assert_eq!(word.load(Ordering::Relaxed), 0);
        assert!(refill.in_flight(), "retired for good");
        assert!(!refill.claim(), "no refill after the retirement");
    });
}
