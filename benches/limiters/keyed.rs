//! `keyed_gcra` (one thread) and `keyed_gcra_2t` (two threads, aggregate time per check):
//! GCRA per key at 1k, 100k and 1M uniformly random `u64` keys, every key in the map before
//! timing.
//!
//! Rows: `tollgate` / `governor` on their precise clocks (TSC via quanta), `tollgate_coarse` /
//! `governor_coarse` on their own 1 ms coarse clocks (`CoarseClock`, `QuantaUpkeepClock`),
//! `tollgate_dashmap_coarse` (tollgate on its dashmap store instead of the word table), and
//! the floors: `floor` (read-only foldhash `HashMap<u64, AtomicU64>` + quanta read + CAS),
//! `floor_coarse` (the same with a relaxed-load clock), `floor_dashmap_coarse` (a foldhash
//! `DashMap` read lock + relaxed-load clock + CAS). Deny rows at 100k: every key exhausted.

use std::num::NonZeroU32;

use criterion::{BenchmarkId, Criterion};
use governor::clock::{Clock as GovernorClock, QuantaClock as GovernorQuantaClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::RateLimiter;
use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::store::{CellOf, DashMapStore, KeyedStore};
use tollgate::{Gcra, KeyedLimiter};

use crate::common::{self, case, Driver, Keys, SIZES};

type Governor<C> =
    RateLimiter<u64, DashMapStateStore<u64>, C, NoOpMiddleware<<C as GovernorClock>::Instant>>;

pub fn bench_one_thread(c: &mut Criterion) {
    bench_group(c, "keyed_gcra", Driver::One);
}

pub fn bench_two_threads(c: &mut Criterion) {
    bench_group(c, "keyed_gcra_2t", Driver::Threads);
}

/// A tollgate keyed limiter (its default store, the lock-free word table) holding every key,
/// each charged `warm` units.
pub fn tollgate<C: Clock>(
    rule: Gcra,
    clock: C,
    keys: &Keys,
    warm: u64,
) -> KeyedLimiter<u64, Gcra, C> {
    let builder = KeyedLimiter::<u64, Gcra>::builder(rule).clock(clock);
    warmed(builder.build(), keys, warm)
}

/// The same on the dashmap store (shard read locks), the store tollgate used before.
fn tollgate_dashmap<C: Clock>(rule: Gcra, clock: C, keys: &Keys, warm: u64) -> Dashed<C> {
    let builder = KeyedLimiter::<u64, Gcra>::builder(rule).clock(clock);
    warmed(builder.build_with_store(DashMapStore::new()), keys, warm)
}

type Dashed<C> = KeyedLimiter<u64, Gcra, C, DashMapStore<u64, CellOf<Gcra>>>;

fn warmed<C: Clock, S: KeyedStore<u64, CellOf<Gcra>>>(
    limiter: Result<KeyedLimiter<u64, Gcra, C, S>, tollgate::QuotaError>,
    keys: &Keys,
    warm: u64,
) -> KeyedLimiter<u64, Gcra, C, S> {
    let limiter = limiter.expect("the clock suits the quota");
    for key in &keys.keys {
        let decision = limiter
            .check_n(key, warm)
            .expect("no key bound, cost ≤ burst");
        assert!(decision.allowed(), "warm-up is admitted");
    }
    assert_eq!(limiter.len(), keys.len(), "no key was swept during warm-up");
    limiter
}

/// A governor keyed limiter (its default DashMap store and hasher) holding every key, each
/// charged `warm` units.
pub fn governor<C: GovernorClock>(
    quota: governor::Quota,
    clock: C,
    keys: &Keys,
    warm: NonZeroU32,
) -> Governor<C> {
    let limiter = RateLimiter::dashmap_with_clock(quota, clock);
    for key in &keys.keys {
        let decision = limiter.check_key_n(key, warm).expect("cost ≤ burst");
        assert!(decision.is_ok(), "warm-up is admitted");
    }
    assert_eq!(limiter.len(), keys.len());
    limiter
}

fn verify_tollgate<C: Clock, S: KeyedStore<u64, CellOf<Gcra>>>(
    limiter: &KeyedLimiter<u64, Gcra, C, S>,
    keys: &Keys,
    allowed: bool,
) {
    assert_eq!(limiter.len(), keys.len(), "every key is still held");
    let decision = limiter.check(&keys.keys[0]).expect("no key bound");
    assert_eq!(
        decision.allowed(),
        allowed,
        "the bench measured the intended path"
    );
}

fn verify_governor<C: GovernorClock>(limiter: &Governor<C>, keys: &Keys, allowed: bool) {
    assert_eq!(limiter.len(), keys.len(), "every key is still held");
    assert_eq!(limiter.check_key(&keys.keys[0]).is_ok(), allowed);
}

fn bench_group(c: &mut Criterion, name: &str, driver: Driver) {
    common::start_coarse_floor_clock();
    let mut group = c.benchmark_group(name);
    common::configure(&mut group);
    let warm = u64::from(common::WARM_COST);
    let (t, span) = (common::ALLOW_T, common::ALLOW_SPAN);

    for (label, n) in SIZES {
        let keys = common::keys_for(n);
        case(
            &mut group,
            BenchmarkId::new("tollgate", label),
            driver,
            keys,
            || tollgate(common::tollgate_allow(), QuantaClock::new(), keys, warm),
            |limiter, key| common::admitted(limiter.check(&key)),
            |limiter| verify_tollgate(limiter, keys, true),
        );
        case(
            &mut group,
            BenchmarkId::new("tollgate_coarse", label),
            driver,
            keys,
            || tollgate(common::tollgate_allow(), CoarseClock::new(), keys, warm),
            |limiter, key| common::admitted(limiter.check(&key)),
            |limiter| verify_tollgate(limiter, keys, true),
        );
        case(
            &mut group,
            BenchmarkId::new("tollgate_dashmap_coarse", label),
            driver,
            keys,
            || tollgate_dashmap(common::tollgate_allow(), CoarseClock::new(), keys, warm),
            |limiter, key| common::admitted(limiter.check(&key)),
            |limiter| verify_tollgate(limiter, keys, true),
        );
        case(
            &mut group,
            BenchmarkId::new("governor", label),
            driver,
            keys,
            || {
                governor(
                    common::governor_allow(),
                    GovernorQuantaClock::default(),
                    keys,
                    common::nz_warm_cost(),
                )
            },
            |limiter, key| limiter.check_key(&key).is_ok(),
            |limiter| verify_governor(limiter, keys, true),
        );
        case(
            &mut group,
            BenchmarkId::new("governor_coarse", label),
            driver,
            keys,
            || {
                governor(
                    common::governor_allow(),
                    common::governor_coarse_clock(),
                    keys,
                    common::nz_warm_cost(),
                )
            },
            |limiter, key| limiter.check_key(&key).is_ok(),
            |limiter| verify_governor(limiter, keys, true),
        );
        case(
            &mut group,
            BenchmarkId::new("floor", label),
            driver,
            keys,
            || common::floor_map(keys, common::precise_now()),
            |map, key| {
                map.get(&key)
                    .is_some_and(|cell| common::floor_step(cell, common::precise_now, t, span))
            },
            |map| assert_eq!(map.len(), keys.len()),
        );
        case(
            &mut group,
            BenchmarkId::new("floor_coarse", label),
            driver,
            keys,
            || common::floor_map(keys, common::coarse_now()),
            |map, key| {
                map.get(&key)
                    .is_some_and(|cell| common::floor_step(cell, common::coarse_now, t, span))
            },
            |map| assert_eq!(map.len(), keys.len()),
        );
        case(
            &mut group,
            BenchmarkId::new("floor_dashmap_coarse", label),
            driver,
            keys,
            || common::floor_dashmap(keys, common::coarse_now()),
            |map, key| {
                map.get(&key).is_some_and(|cell| {
                    common::floor_step(cell.value(), common::coarse_now, t, span)
                })
            },
            |map| assert_eq!(map.len(), keys.len()),
        );
    }

    // Deny path at 100k: one per hour, spent by the warm-up check.
    let (label, keys) = ("100k", common::keys_for(100_000));
    case(
        &mut group,
        BenchmarkId::new("tollgate_deny", label),
        driver,
        keys,
        || tollgate(common::tollgate_deny(), QuantaClock::new(), keys, 1),
        |limiter, key| common::admitted(limiter.check(&key)),
        |limiter| verify_tollgate(limiter, keys, false),
    );
    case(
        &mut group,
        BenchmarkId::new("tollgate_coarse_deny", label),
        driver,
        keys,
        || tollgate(common::tollgate_deny(), CoarseClock::new(), keys, 1),
        |limiter, key| common::admitted(limiter.check(&key)),
        |limiter| verify_tollgate(limiter, keys, false),
    );
    case(
        &mut group,
        BenchmarkId::new("governor_deny", label),
        driver,
        keys,
        || {
            governor(
                common::governor_deny(),
                GovernorQuantaClock::default(),
                keys,
                NonZeroU32::MIN,
            )
        },
        |limiter, key| limiter.check_key(&key).is_ok(),
        |limiter| verify_governor(limiter, keys, false),
    );
    case(
        &mut group,
        BenchmarkId::new("governor_coarse_deny", label),
        driver,
        keys,
        || {
            governor(
                common::governor_deny(),
                common::governor_coarse_clock(),
                keys,
                NonZeroU32::MIN,
            )
        },
        |limiter, key| limiter.check_key(&key).is_ok(),
        |limiter| verify_governor(limiter, keys, false),
    );
    group.finish();
}
