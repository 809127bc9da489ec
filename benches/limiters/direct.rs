//! `direct_gcra`: one unkeyed GCRA state, one thread.
//!
//! Rows: `tollgate` / `governor` on their precise clocks, `tollgate_coarse` / `governor_coarse`
//! on their 1 ms coarse clocks, `floor` (one quanta read + one CAS on an `AtomicU64`, with GCRA's
//! arithmetic between) and `floor_coarse` (the same with a relaxed-load clock). Deny rows: a
//! quota of one per hour, spent before timing.

use std::hint::black_box;
use std::sync::atomic::AtomicU64;

use criterion::Criterion;
use crossbeam_utils::CachePadded;
use governor::RateLimiter;
use tollgate::clock::{CoarseClock, QuantaClock};
use tollgate::Limiter;

use crate::common;

pub fn bench_all(c: &mut Criterion) {
    common::start_coarse_floor_clock();
    let mut group = c.benchmark_group("direct_gcra");
    common::configure(&mut group);

    let limiter = Limiter::with_clock(common::tollgate_direct(), QuantaClock::new()).expect("fits");
    group.bench_function("tollgate", |b| {
        b.iter(|| black_box(limiter.check().allowed()))
    });
    assert!(limiter.check().allowed());

    let limiter = Limiter::with_clock(common::tollgate_direct(), CoarseClock::new()).expect("fits");
    group.bench_function("tollgate_coarse", |b| {
        b.iter(|| black_box(limiter.check().allowed()))
    });
    assert!(limiter.check().allowed());

    let limiter = RateLimiter::direct(common::governor_direct());
    group.bench_function("governor", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    assert!(limiter.check().is_ok());

    let limiter =
        RateLimiter::direct_with_clock(common::governor_direct(), common::governor_coarse_clock());
    group.bench_function("governor_coarse", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    assert!(limiter.check().is_ok());

    let (t, span) = (common::DIRECT_T, common::DIRECT_SPAN);
    let cell = CachePadded::new(AtomicU64::new(0));
    group.bench_function("floor", |b| {
        b.iter(|| black_box(common::floor_step(&cell, common::precise_now, t, span)))
    });
    assert!(common::floor_step(&cell, common::precise_now, t, span));

    let cell = CachePadded::new(AtomicU64::new(0));
    group.bench_function("floor_coarse", |b| {
        b.iter(|| black_box(common::floor_step(&cell, common::coarse_now, t, span)))
    });
    assert!(common::floor_step(&cell, common::coarse_now, t, span));

    // Deny path: one per hour, spent here.
    let limiter = Limiter::with_clock(common::tollgate_deny(), QuantaClock::new()).expect("fits");
    assert!(limiter.check().allowed());
    group.bench_function("tollgate_deny", |b| {
        b.iter(|| black_box(limiter.check().allowed()))
    });
    assert!(!limiter.check().allowed());

    let limiter = Limiter::with_clock(common::tollgate_deny(), CoarseClock::new()).expect("fits");
    assert!(limiter.check().allowed());
    group.bench_function("tollgate_coarse_deny", |b| {
        b.iter(|| black_box(limiter.check().allowed()))
    });
    assert!(!limiter.check().allowed());

    let limiter = RateLimiter::direct(common::governor_deny());
    assert!(limiter.check().is_ok());
    group.bench_function("governor_deny", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    assert!(limiter.check().is_err());

    let limiter =
        RateLimiter::direct_with_clock(common::governor_deny(), common::governor_coarse_clock());
    assert!(limiter.check().is_ok());
    group.bench_function("governor_coarse_deny", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    assert!(limiter.check().is_err());

    group.finish();
}
