//! Hostile input: a flood of 10 million unique keys against `max_keys = 100_000`, and the same
//! flood against a limiter with every setting at its default.
//!
//! The table never holds more than the bound, under both overflow policies, and the memory the
//! process holds stays flat while the flood goes on (at defaults: the table stays at about its
//! soft bound, `evict_above`): the heap, measured by `stats_alloc`'s
//! counting allocator (no unsafe code of ours), and resident memory (Linux), which also counts
//! the large tables mapped outside the heap. Counts are process-wide, so this binary runs
//! without the test harness: one thread, nothing else allocating.

use std::alloc::System;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tollgate::clock::ManualClock;
use tollgate::store::DEFAULT_EVICT_ABOVE;
use tollgate::{Gcra, KeyedLimiter, LimitError, OverflowPolicy, Quota, SlidingLog};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const MAX_KEYS: usize = 100_000;

/// Resident memory in KiB (Linux: `VmRSS`): what the allocator's counts miss, the word table's
/// large tables in pages mapped for them alone. `None` elsewhere.
fn resident_kib() -> Option<i64> {
    use std::io::Read;
    // Room for the whole file: a buffer that grew by reallocation would count in `held`.
    let mut status = String::with_capacity(16 * 1024);
    let mut file = std::fs::File::open("/proc/self/status").ok()?;
    file.read_to_string(&mut status).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Bytes held now, relative to `region`'s start (stats_alloc counts a reallocation's growth in
/// `bytes_allocated` and its shrinking in `bytes_deallocated`; `bytes_reallocated` is the same
/// change again).
fn held(region: &Region<'_, System>) -> i64 {
    let c = region.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64
}

fn flood<A: tollgate::Algorithm>(rule: A, policy: OverflowPolicy, keys: u64) {
    let region = Region::new(GLOBAL);
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, A, _>::builder(rule)
        .clock(clock.clone())
        .max_keys(MAX_KEYS, policy)
        .build()
        .unwrap();
    // Room for every checkpoint first: the vectors' own growth is no table's.
    let (mut checkpoints, mut resident) = (Vec::with_capacity(16), Vec::with_capacity(16));
    let (mut allowed, mut refused) = (0u64, 0u64);
    for key in 0..keys {
        // 1 µs apart: the whole flood fits well inside one window, so no key turns fresh and the
        // bound, not eviction, is what holds the table down.
        clock.advance_nanos(1_000);
        match limiter.check(&key) {
            Ok(d) => allowed += u64::from(d.allowed()),
            Err(LimitError::KeyTableFull { max_keys }) => {
                assert_eq!(max_keys, MAX_KEYS);
                refused += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(limiter.len() <= MAX_KEYS, "{} keys held", limiter.len());
        if (key + 1) % (keys / 10) == 0 && key + 1 >= 2 * MAX_KEYS as u64 {
            resident.extend(resident_kib());
            checkpoints.push(held(&region));
        }
    }
    let first = checkpoints[0];
    let last = *checkpoints.last().unwrap();
    println!(
        "flood {} {policy:?}: {keys} keys, held {} (bound {MAX_KEYS}), allowed {allowed}, refused {refused}, bytes held once full: {first}, at the end: {last}; resident KiB: {resident:?}",
        A::NAME,
        limiter.len()
    );
    if let (Some(&first), Some(&last)) = (resident.first(), resident.last()) {
        assert!(
            last <= first + first / 10,
            "resident memory grew from {first} to {last} KiB: {resident:?}"
        );
    }
    // Flat: the table is full from the first checkpoint on; nothing may grow after it.
    assert!(
        last <= first + first / 50,
        "memory grew from {first} to {last} bytes: {checkpoints:?}"
    );
    match policy {
        OverflowPolicy::Deny => assert_eq!(refused, keys - MAX_KEYS as u64),
        // Overflow keys share one state: one key's quota in aggregate, within the window.
        OverflowPolicy::Shared => assert!(allowed <= MAX_KEYS as u64 + rule.capacity()),
    }
}

/// A limiter built with nothing but its clock, on an API quota (100 a second): the defaults a
/// user gets.
fn api_quota_at_defaults() -> (ManualClock, KeyedLimiter<u64, Gcra, ManualClock>) {
    let clock = ManualClock::new();
    let rule = Gcra::new(Quota::per_second(100).unwrap()).unwrap();
    let limiter = KeyedLimiter::<u64, Gcra, _>::builder(rule)
        .clock(clock.clone())
        .build()
        .unwrap();
    (clock, limiter)
}

/// A flood of one-time keys against a limiter built with nothing but its clock: an API quota
/// (100 a second), each key checked once, 1 µs apart, so each turns fresh 10 ms (10,000 keys)
/// after its check. Past `evict_above` (2^21) the shards evict fresh keys as their tables
/// fill: the table ends at about the soft bound, never the flood's size, and resident memory
/// is flat once the table has reached it.
fn flood_at_defaults(keys: u64) {
    let (clock, limiter) = api_quota_at_defaults();
    let mut resident = Vec::with_capacity(16);
    let (mut most, mut allowed) = (0, 0u64);
    for key in 0..keys {
        clock.advance_nanos(1_000);
        allowed += u64::from(limiter.check(&key).unwrap().allowed());
        if (key + 1) % (keys / 10) == 0 {
            most = most.max(limiter.len());
            if key + 1 >= 2 * DEFAULT_EVICT_ABOVE as u64 {
                resident.extend(resident_kib());
            }
        }
    }
    assert_eq!(allowed, keys, "every new key's first check is admitted");
    println!(
        "flood at defaults: {keys} keys, held {} at the end, at most {most} at a checkpoint (evict_above {DEFAULT_EVICT_ABOVE}); resident KiB: {resident:?}",
        limiter.len()
    );
    // About the soft bound: a shard keeps its share plus the room its next replacement makes
    // (`SHARE_ROOM`), and two tables' keys while a drain runs. A quarter over it is a table
    // that kept growing.
    let bound = DEFAULT_EVICT_ABOVE + DEFAULT_EVICT_ABOVE / 4;
    assert!(
        limiter.len() <= bound && most <= bound,
        "held {} (at most {most}) > {bound}",
        limiter.len()
    );
    if let (Some(&first), Some(&last)) = (resident.first(), resident.last()) {
        assert!(
            last <= first + first / 10,
            "resident memory grew from {first} to {last} KiB: {resident:?}"
        );
    }
}

/// Returning clients at defaults: a working set of `keys` (past `evict_above`), each key checked
/// once a round, 1 µs apart, so that each is back to a full bucket when it returns. The first
/// rounds evict keys as a flood's are; the shards see their evicted keys come back and raise
/// their shares, and from then on every key is kept: a round inserts no key and evicts none.
fn returning_at_defaults(keys: u64) {
    let (clock, limiter) = api_quota_at_defaults();
    let mut held = Vec::new();
    let mut kept_from = None;
    for round in 0..4 {
        for key in 0..keys {
            clock.advance_nanos(1_000);
            assert!(
                limiter.check(&key).unwrap().allowed(),
                "a full bucket admits"
            );
        }
        held.push(limiter.len());
        if limiter.len() as u64 == keys && kept_from.is_none() {
            kept_from = Some(round);
        }
    }
    println!(
        "returning at defaults: {keys} keys, held after each round {held:?} (evict_above {DEFAULT_EVICT_ABOVE})"
    );
    let from = kept_from.unwrap_or_else(|| panic!("never held every key: {held:?}"));
    assert!(from <= 2, "every key held only from round {from}: {held:?}");
    assert!(
        held[from..].iter().all(|&n| n as u64 == keys),
        "keys evicted after every key was held: {held:?}"
    );
}

fn main() {
    // 10M in release (scripts/test.sh runs this binary with --release); a tenth in debug.
    let keys: u64 = if cfg!(debug_assertions) {
        1_000_000
    } else {
        10_000_000
    };
    let hour = Duration::from_secs(3600);
    let gcra = Gcra::new(Quota::new(10, hour).unwrap()).unwrap();
    flood(gcra, OverflowPolicy::Deny, keys);
    flood(gcra, OverflowPolicy::Shared, keys);
    let log = SlidingLog::new(Quota::new(10, hour).unwrap()).unwrap();
    flood(log, OverflowPolicy::Deny, keys / 2);
    // In debug, a tenth of the keys would stay under `evict_above`: release only.
    if !cfg!(debug_assertions) {
        flood_at_defaults(keys);
        // Twice and four times the default bound.
        returning_at_defaults(2 * DEFAULT_EVICT_ABOVE as u64);
        returning_at_defaults(4 * DEFAULT_EVICT_ABOVE as u64);
    }
    println!("flood: 6 passed, 0 failed");
}
