//! What every bench module shares: key sets and sequences, the quotas, the clocks of the floors,
//! the floors' per-check step, and the single- and two-thread drivers.

use std::cell::OnceCell;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, BenchmarkId, Throughput};
use tollgate::{Gcra, Quota};

/// The key counts of the keyed groups: (parameter, keys).
pub const SIZES: [(&str, usize); 3] = [("1k", 1_000), ("100k", 100_000), ("1m", 1_000_000)];

/// Short settings so that the whole suite stays under about ten minutes on two cores. A
/// setting given on the command line (`--warm-up-time`, `--measurement-time`, `--sample-size`)
/// wins: a group's own setting would otherwise override it, and a quick check of a group
/// (`-- traffic --warm-up-time 0.05 --measurement-time 0.1 --sample-size 10`) would take the
/// full time.
pub fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    let args: Vec<String> = std::env::args().collect();
    let given = |flag: &str| {
        args.iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    };
    if !given("--warm-up-time") {
        group.warm_up_time(Duration::from_millis(800));
    }
    if !given("--measurement-time") {
        group.measurement_time(Duration::from_secs(3));
    }
    if !given("--sample-size") {
        group.sample_size(30);
    }
    group.throughput(Throughput::Elements(1));
}

// ---------------------------------------------------------------------------------------------
// Keys

/// splitmix64: a bijection of its counter, so distinct counters give distinct keys.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` distinct uniformly random `u64` keys, and a precomputed sequence that draws from them
/// uniformly at random. The sequence is at least four times the key count (and a power of two),
/// so that at 1M keys the keys it touches do not fit in the cache.
pub struct Keys {
    /// Every key, in insertion order (used to warm the maps).
    pub keys: Vec<u64>,
    seq: Vec<u64>,
    mask: usize,
    /// Where the next sample starts in the sequence. It persists across samples and benches:
    /// restarting each sample at 0 would replay the same few keys, which then stay cached.
    cursor: AtomicUsize,
}

impl Keys {
    pub fn new(n: usize) -> Keys {
        let mut state = 0x5EED_0000_0000_0000 ^ n as u64;
        let keys: Vec<u64> = (0..n).map(|_| splitmix64(&mut state)).collect();
        let len = (4 * n).next_power_of_two().max(1 << 16);
        let seq = (0..len)
            .map(|_| {
                // Lemire's multiply-shift: a uniform index in 0..n.
                let index = ((splitmix64(&mut state) as u128 * n as u128) >> 64) as usize;
                keys[index]
            })
            .collect();
        Keys {
            keys,
            seq,
            mask: len - 1,
            cursor: AtomicUsize::new(0),
        }
    }

    /// The `i`-th key of the sequence (wrapping).
    #[inline(always)]
    pub fn at(&self, i: usize) -> u64 {
        self.seq[i & self.mask]
    }

    /// Reserves `n` positions of the sequence; returns the first.
    pub fn advance(&self, n: u64) -> usize {
        // Relaxed: a position counter, no data is published through it.
        self.cursor.fetch_add(n as usize, Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

/// One lazily built key set per size, so that a filtered run builds only what it needs.
pub fn keys_for(n: usize) -> &'static Keys {
    static SETS: [OnceLock<Keys>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = SIZES
        .iter()
        .position(|(_, size)| *size == n)
        .expect("a size from SIZES");
    SETS[slot].get_or_init(|| Keys::new(n))
}

// ---------------------------------------------------------------------------------------------
// Quotas
//
// Allowed path: 1 000 000 per second (T = 1 µs), burst 10^9 (bucket span B·T = 1000 s). Before
// timing, every key is charged WARM_COST units (600 s of debt) so that no key is fresh: tollgate
// sweeps fresh keys when inserts double the table, and a swept key would turn the timed checks
// into inserts. The remaining 400 s of span are 4·10^8 further checks per key, far more than a
// bench makes, so every timed check is allowed. Governor gets the same quota and warm-up.
//
// The span is far above the coarse clocks' 1 ms tick (tollgate refuses a tick above B·T / 10).

pub const ALLOW_PER_SECOND: u32 = 1_000_000;
pub const ALLOW_BURST: u32 = 1_000_000_000;
pub const WARM_COST: u32 = 600_000_000;
/// T in nanoseconds, for the floors' arithmetic.
pub const ALLOW_T: u64 = 1_000_000_000 / ALLOW_PER_SECOND as u64;
/// B·T in nanoseconds.
pub const ALLOW_SPAN: u64 = ALLOW_T * ALLOW_BURST as u64;

/// Direct (unkeyed) allowed path: one state takes every check, so the rate must exceed the
/// bench's: 10^9 per second (T = 1 ns), burst 10^9 (span 1 s).
pub const DIRECT_PER_SECOND: u32 = 1_000_000_000;
pub const DIRECT_T: u64 = 1;
pub const DIRECT_SPAN: u64 = 1_000_000_000;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

pub fn tollgate_allow() -> Gcra {
    let quota = Quota::per_second(ALLOW_PER_SECOND as u64)
        .and_then(|q| q.with_burst(ALLOW_BURST as u64))
        .expect("valid quota");
    Gcra::new(quota).expect("valid GCRA")
}

pub fn governor_allow() -> governor::Quota {
    governor::Quota::per_second(nz(ALLOW_PER_SECOND)).allow_burst(nz(ALLOW_BURST))
}

pub fn tollgate_direct() -> Gcra {
    let quota = Quota::per_second(DIRECT_PER_SECOND as u64)
        .and_then(|q| q.with_burst(DIRECT_PER_SECOND as u64))
        .expect("valid quota");
    Gcra::new(quota).expect("valid GCRA")
}

pub fn governor_direct() -> governor::Quota {
    governor::Quota::per_second(nz(DIRECT_PER_SECOND)).allow_burst(nz(DIRECT_PER_SECOND))
}

/// Deny path: one per hour, burst 1; one check before timing exhausts it for an hour.
pub fn tollgate_deny() -> Gcra {
    Gcra::new(Quota::per_hour(1).expect("valid quota")).expect("valid GCRA")
}

pub fn governor_deny() -> governor::Quota {
    governor::Quota::per_hour(nz(1))
}

pub fn nz_warm_cost() -> NonZeroU32 {
    nz(WARM_COST)
}

// ---------------------------------------------------------------------------------------------
// Clocks

/// governor's coarse clock: `QuantaUpkeepClock` with a 1 ms upkeep. quanta allows one upkeep
/// thread per process, so every governor limiter shares clones of one clock.
pub fn governor_coarse_clock() -> governor::clock::QuantaUpkeepClock {
    static CLOCK: OnceLock<governor::clock::QuantaUpkeepClock> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .expect("one quanta upkeep thread")
        })
        .clone()
}

fn quanta_clock() -> &'static quanta::Clock {
    static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// The precise floor clock: one quanta TSC read scaled to nanoseconds, as both libraries do.
#[inline(always)]
pub fn precise_now() -> u64 {
    let clock = quanta_clock();
    clock.delta_as_nanos(0, clock.raw())
}

/// The coarse floor clock's time, refreshed every 1 ms by this harness's own thread.
static COARSE_NOW: AtomicU64 = AtomicU64::new(0);

/// Starts the floor's coarse clock thread (once).
pub fn start_coarse_floor_clock() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        COARSE_NOW.store(precise_now(), Ordering::Relaxed);
        std::thread::Builder::new()
            .name("floor-coarse-clock".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_millis(1));
                COARSE_NOW.store(precise_now(), Ordering::Relaxed);
            })
            .expect("spawning the floor's clock thread");
    });
}

/// The coarse floor clock: one relaxed load.
#[inline(always)]
pub fn coarse_now() -> u64 {
    COARSE_NOW.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Floors

/// The least a lock-free GCRA check can do on a state it already holds: load the state, read the
/// clock, GCRA's arithmetic, one compare-and-swap (a single attempt; a failure is not retried).
/// Returns whether the request was admitted.
#[inline(always)]
pub fn floor_step(cell: &AtomicU64, now: impl Fn() -> u64, interval: u64, span: u64) -> bool {
    let tat = cell.load(Ordering::Acquire);
    let now = now();
    let next = tat.max(now) + interval;
    if next - now > span {
        return false;
    }
    cell.compare_exchange(tat, next, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// A read-only foldhash map of per-key atomics: the lock-free lookup of the floor rows.
pub type FloorMap = std::collections::HashMap<u64, AtomicU64, foldhash::fast::RandomState>;

/// Every key with the warm-up debt already charged, as for the limiters.
pub fn floor_map(keys: &Keys, now: u64) -> FloorMap {
    floor_map_from(&keys.keys, now + WARM_COST as u64 * ALLOW_T)
}

/// Every key of `keys` with its state (GCRA's TAT) set to `tat`.
pub fn floor_map_from(keys: &[u64], tat: u64) -> FloorMap {
    let mut map = FloorMap::with_capacity_and_hasher(keys.len(), Default::default());
    for &key in keys {
        map.insert(key, AtomicU64::new(tat));
    }
    map
}

/// The floor's store with dashmap's locked read path (foldhash): one shard read lock per check.
pub type FloorDashMap = dashmap::DashMap<u64, AtomicU64, foldhash::fast::RandomState>;

pub fn floor_dashmap(keys: &Keys, now: u64) -> FloorDashMap {
    let map = FloorDashMap::with_capacity_and_hasher(keys.len(), Default::default());
    for &key in &keys.keys {
        map.insert(key, AtomicU64::new(now + WARM_COST as u64 * ALLOW_T));
    }
    map
}

// ---------------------------------------------------------------------------------------------
// Drivers

/// One thread: `check` on successive keys of the sequence, one check per iteration.
#[inline(always)]
pub fn iter_keys<R>(b: &mut Bencher<'_>, keys: &Keys, check: impl Fn(u64) -> R) {
    b.iter_custom(|iters| {
        let offset = keys.advance(iters);
        let start = Instant::now();
        for i in 0..iters as usize {
            black_box(check(keys.at(offset.wrapping_add(i))));
        }
        start.elapsed()
    });
}

/// Threads of the `_2t` group.
pub const THREADS: usize = 2;

/// `THREADS` threads: each makes `iters` checks from its own place in the sequence. Returns the
/// wall time divided by `THREADS`, so that criterion's time per iteration is the aggregate time
/// per check (its reciprocal is the aggregate throughput).
///
/// The threads are spawned before the clock starts and released together by a barrier; each
/// times its own loop, and the slower one counts.
pub fn iter_keys_threads<R>(b: &mut Bencher<'_>, keys: &Keys, check: &(impl Fn(u64) -> R + Sync)) {
    b.iter_custom(|iters| {
        let base = keys.advance(iters * THREADS as u64);
        let barrier = Barrier::new(THREADS);
        let slowest = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let offset = base.wrapping_add(t * iters as usize);
                        barrier.wait();
                        let start = Instant::now();
                        for i in 0..iters as usize {
                            black_box(check(keys.at(offset.wrapping_add(i))));
                        }
                        start.elapsed()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("bench thread"))
                .max()
                .expect("at least one thread")
        });
        slowest / THREADS as u32
    });
}

/// How a keyed bench drives its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// One thread, criterion's own loop.
    One,
    /// `THREADS` threads, aggregate time per check.
    Threads,
}

/// Runs one case: builds its subject (only if the filter selects the case, and once for all
/// samples), measures `check`, then runs `verify` on the subject and drops it.
pub fn case<L: Sync, R>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    driver: Driver,
    keys: &Keys,
    build: impl FnOnce() -> L,
    check: impl Fn(&L, u64) -> R + Sync,
    verify: impl FnOnce(&L),
) {
    let built = OnceCell::new();
    let mut build = Some(build);
    group.bench_function(id, |b| {
        let subject = built.get_or_init(|| (build.take().expect("built once"))());
        let check = |key: u64| check(subject, key);
        match driver {
            Driver::One => iter_keys(b, keys, check),
            Driver::Threads => iter_keys_threads(b, keys, &check),
        }
    });
    if let Some(subject) = built.get() {
        verify(subject);
    }
}

/// What a server reads from a tollgate check: the verdict. Every row consumes its check this
/// way (governor's rows: `is_ok()`), so that no row pays for moving a whole decision through
/// `black_box` (see benches/README.md: a 72-byte copy right after the callee wrote it stalls
/// on store forwarding).
#[inline(always)]
pub fn admitted(check: Result<tollgate::Decision, tollgate::LimitError>) -> bool {
    check.is_ok_and(|decision| decision.allowed())
}
