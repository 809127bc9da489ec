//! Keys with drop glue and large slots (`[String; 4]`: 96 bytes) through a keyed limiter grown
//! to 40k-400k keys, where some of the 64 shards are part-way through building their next
//! table, then all evicted as fresh, all evicted again after regrowth, and the limiter
//! dropped: every key goes, the process does not abort, and the heap is back where it started
//! (every key's text freed once). The sliding log's tables are on the heap; GCRA's are mapped
//! (its heap tables, as when mapping fails, are the word table's unit tests'). Heap counts are
//! process-wide, so this binary runs without the test harness: one thread, nothing else
//! allocating. Run in release by `scripts/test.sh`; `cargo test` runs two of the sizes.

use std::alloc::System;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tollgate::clock::ManualClock;
use tollgate::{Algorithm, Gcra, KeyedLimiter, Quota, SlidingLog};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes held now, relative to `region`'s start (a reallocation counts its growth in
/// `bytes_allocated`, its shrinking in `bytes_deallocated`).
fn held(region: &Region<'_, System>) -> i64 {
    let c = region.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64
}

fn key(i: u64) -> [String; 4] {
    [
        format!("tenant-{i}"),
        format!("user-{}", i * 7),
        "route".to_string(),
        format!("{i:x}"),
    ]
}

fn grow_evict_drop<A: Algorithm>(name: &str, rule: A, keys: u64) {
    let region = Region::new(GLOBAL);
    {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<[String; 4], A, ManualClock> =
            KeyedLimiter::with_clock(rule, clock.clone()).expect("a valid rule");
        for round in 0..2u64 {
            for i in 0..keys {
                let key = key(round * keys + i);
                assert!(limiter.check(&key).expect("a check").allowed());
            }
            assert_eq!(limiter.len(), keys as usize, "{name}, {keys} keys: held");
            clock.advance(Duration::from_secs(3_600));
            assert_eq!(
                limiter.evict_fresh(),
                keys as usize,
                "{name}, {keys}: evicted"
            );
            assert!(limiter.is_empty(), "{name}, {keys}: emptied");
        }
    }
    assert_eq!(held(&region), 0, "{name}, {keys} keys: bytes still held");
}

fn main() {
    let keys: Vec<u64> = match std::env::args().nth(1).and_then(|n| n.parse().ok()) {
        Some(n) => vec![n],
        // Every 40k in release (scripts/test.sh runs this binary with --release); in debug
        // one size without large tables and one where shards are mid-build.
        None if cfg!(debug_assertions) => vec![40_000, 280_000],
        None => (1..=10).map(|k| k * 40_000).collect(),
    };
    let per_second = Quota::per_second(10).expect("a quota");
    for &n in &keys {
        grow_evict_drop("gcra", Gcra::new(per_second).expect("a rule"), n);
        grow_evict_drop(
            "sliding log",
            SlidingLog::new(per_second).expect("a rule"),
            n,
        );
        println!("{n} keys: every key evicted and dropped, sliding log and GCRA");
    }
}
