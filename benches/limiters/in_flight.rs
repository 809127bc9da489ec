//! `in_flight`: a request's acquire and release of one unit of its key's concurrency limit
//! (N = 4, every acquire admitted), at 1k and 100k uniformly random `u64` keys:
//! - `tollgate`: `InFlight::try_acquire` and the permit's drop, exact per key;
//! - `pingora`: pingora-limits' `Inflight::incr` and its guard's drop, an approximate count
//!   per key (a count-min sketch: keys that collide in every row share a count), compared with
//!   N as a server would;
//! - `semaphore`: tokio's `Semaphore::try_acquire` and the permit's drop, one count for all
//!   (what tower's `ConcurrencyLimit` holds): not per key, the price of the bare operation.

use criterion::{BenchmarkId, Criterion};
use tollgate::InFlight;

use crate::common::{self, case, Driver, Keys};

const N: u64 = 4;

fn rows(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    label: &str,
    keys: &Keys,
    driver: Driver,
) {
    case(
        group,
        BenchmarkId::new("tollgate", label),
        driver,
        keys,
        || {
            let limit = InFlight::<u64>::new(N).expect("a valid bound");
            for key in &keys.keys {
                drop(limit.try_acquire(key).expect("no key bound"));
            }
            limit
        },
        |limit, key| limit.try_acquire(&key).is_ok_and(|permit| permit.is_some()),
        |limit| {
            assert_eq!(limit.len(), keys.len(), "every key held");
            assert!(keys.keys.iter().all(|key| limit.in_flight(key) == 0));
        },
    );
    case(
        group,
        BenchmarkId::new("pingora", label),
        driver,
        keys,
        pingora_limits::inflight::Inflight::new,
        |limit, key| {
            let (guard, count) = limit.incr(key, 1);
            let admitted = count <= N as isize;
            drop(guard);
            admitted
        },
        |_| {},
    );
    case(
        group,
        BenchmarkId::new("semaphore", label),
        driver,
        keys,
        || tokio::sync::Semaphore::new(N as usize),
        |semaphore, _key| semaphore.try_acquire().is_ok(),
        |semaphore| assert_eq!(semaphore.available_permits(), N as usize),
    );
}

pub fn bench_all(c: &mut Criterion) {
    let mut group = c.benchmark_group("in_flight");
    common::configure(&mut group);
    rows(&mut group, "1k", common::keys_for(1_000), Driver::One);
    rows(&mut group, "100k", common::keys_for(100_000), Driver::One);
    rows(
        &mut group,
        "100k_2t",
        common::keys_for(100_000),
        Driver::Threads,
    );
    group.finish();
}
