//! A check, repeated, for an instruction and cache-miss profile under valgrind: tollgate,
//! governor and the floor (a prepopulated foldhash map of `AtomicU64`, one clock read, one CAS)
//! on three rows of the `traffic` matrix. Only the function `measured` is profiled: priming and
//! key generation stay out of the counts.
//!
//! ```sh
//! cargo build --release --example check_profile
//! valgrind --tool=callgrind --cache-sim=yes --toggle-collect='*measured*' \
//!     target/release/examples/check_profile returning/tollgate 400000
//! ```
//!
//! Rows: `direct/{tollgate,governor,floor}` (one state, precise clock, every check allowed),
//! `returning/{…}` (100k `u64` keys, GCRA 1 000 000/s burst 1, precise clock: the bucket is
//! full again at each visit), `coarse/{…}` (the same keys, 1 000/s burst 10, tollgate's
//! `CoarseClock`, governor's `QuantaUpkeepClock`, the floor reading a relaxed atomic). Divide
//! callgrind's totals by the checks (the second argument). benches/README.md holds the figures.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::Algorithm;
use tollgate::{Gcra, KeyedLimiter, Limiter, Quota, SlidingWindow};

const KEYS: u64 = 100_000;
/// Checks before the profiled ones: every key is visited (and inserted) at least once.
const PRIME: usize = 400_000;

type FloorMap = HashMap<u64, AtomicU64, foldhash::fast::RandomState>;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(row), Some(checks)) = (args.next(), args.next()) else {
        eprintln!(
            "usage: check_profile <direct|returning|coarse>/<tollgate|governor|floor> <checks>, or sliding/tollgate"
        );
        std::process::exit(2);
    };
    let Ok(checks) = checks.parse::<usize>() else {
        eprintln!("checks: a count, not {checks:?}");
        std::process::exit(2);
    };
    let keys = sequence(PRIME + checks);
    let (prime, run) = keys.split_at(PRIME);
    let nz = |n| NonZeroU32::new(n).expect("non-zero");
    match row.as_str() {
        "direct/tollgate" => {
            let quota = Quota::per_second(1_000_000_000).and_then(|q| q.with_burst(1_000_000_000));
            let limiter = Limiter::new(Gcra::new(quota.expect("a quota")).expect("a rule"));
            measured(run, |_| limiter.check().allowed());
        }
        "direct/governor" => {
            let quota =
                governor::Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000_000));
            let limiter = governor::RateLimiter::direct(quota);
            measured(run, |_| limiter.check().is_ok());
        }
        "direct/floor" => {
            let clock = quanta::Clock::new();
            let cell = AtomicU64::new(0);
            let now = || clock.delta_as_nanos(0, clock.raw());
            measured(run, |_| floor_step(&cell, now(), 1, 1_000_000_000));
        }
        "returning/tollgate" => keyed(prime, run, 1_000_000, 1, QuantaClock::new()),
        "sliding/tollgate" => {
            let rule = SlidingWindow::new(Quota::per_second(1_000_000).expect("a quota"));
            keyed_on(rule.expect("a rule"), prime, run, QuantaClock::new())
        }
        "coarse/tollgate" => keyed(prime, run, 1_000, 10, CoarseClock::new()),
        "returning/governor" => {
            let quota = governor::Quota::per_second(nz(1_000_000));
            let limiter = governor::RateLimiter::keyed(quota);
            prime.iter().for_each(|k| {
                black_box(limiter.check_key(k)).ok();
            });
            measured(run, |k| limiter.check_key(k).is_ok());
        }
        "coarse/governor" => {
            let clock = governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .expect("one upkeep thread");
            let quota = governor::Quota::per_second(nz(1_000)).allow_burst(nz(10));
            let limiter = governor::RateLimiter::dashmap_with_clock(quota, clock);
            prime.iter().for_each(|k| {
                black_box(limiter.check_key(k)).ok();
            });
            measured(run, |k| limiter.check_key(k).is_ok());
        }
        "returning/floor" => {
            let (map, clock) = (floor_map(), quanta::Clock::new());
            measured(run, |k| {
                let now = clock.delta_as_nanos(0, clock.raw());
                map.get(k)
                    .is_some_and(|cell| floor_step(cell, now, 1_000, 1_000))
            });
        }
        "coarse/floor" => {
            // The harness's coarse clock: a relaxed load of a word another thread refreshes.
            static NOW: AtomicU64 = AtomicU64::new(0);
            let map = floor_map();
            measured(run, |k| {
                let now = NOW.load(Ordering::Relaxed);
                map.get(k)
                    .is_some_and(|cell| floor_step(cell, now, 1_000_000, 10_000_000))
            });
        }
        _ => {
            eprintln!("unknown row {row:?}");
            std::process::exit(2);
        }
    }
}

/// The profiled loop.
#[inline(never)]
fn measured(keys: &[u64], check: impl Fn(&u64) -> bool) {
    for key in keys {
        black_box(check(black_box(key)));
    }
}

fn keyed<C: Clock>(prime: &[u64], run: &[u64], per_second: u64, burst: u64, clock: C) {
    let quota = Quota::per_second(per_second).and_then(|q| q.with_burst(burst));
    keyed_on(
        Gcra::new(quota.expect("a quota")).expect("a rule"),
        prime,
        run,
        clock,
    )
}

fn keyed_on<A: Algorithm, C: Clock>(rule: A, prime: &[u64], run: &[u64], clock: C) {
    let limiter = KeyedLimiter::with_clock(rule, clock).expect("the clock fits the quota");
    prime.iter().for_each(|k| {
        black_box(limiter.check(k)).ok();
    });
    measured(run, |k| limiter.check(k).is_ok_and(|d| d.allowed()));
}

/// GCRA's least: a state load, the arithmetic, one CAS (not retried).
#[inline(always)]
fn floor_step(cell: &AtomicU64, now: u64, interval: u64, span: u64) -> bool {
    let tat = cell.load(Ordering::Acquire);
    let next = tat.max(now) + interval;
    next - now <= span
        && cell
            .compare_exchange(tat, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

fn floor_map() -> FloorMap {
    (0..KEYS).map(|i| (key(i), AtomicU64::new(0))).collect()
}

/// The `i`-th key: a bijective mix of the index, as the traffic rows' `u64` keys.
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `n` keys drawn uniformly (xorshift64) from the 100k.
fn sequence(n: usize) -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            key(x % KEYS)
        })
        .collect()
}
