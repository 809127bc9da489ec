//! `traffic`: the workload matrix, tollgate against governor 0.10 like for like on the
//! traffic servers see, through both libraries' public APIs only.
//!
//! The rows (regime, key type, key count, distribution, threads, clock) are
//! `regime::matrix()`, shared with the latency bench and the `traffic` example: one axis
//! at a time around the base row `returning/u64/100k/uniform/1t/precise`, plus the rows of the
//! benchmark tables. IDs: `traffic/{regime}/{key}/{keys}/{distribution}/{threads}t/{clock}/{subject}`,
//! e.g. `traffic/returning/u64/100k/uniform/1t/precise/tollgate`; the one-key row is
//! `traffic/direct/precise/{subject}`.
//!
//! Subjects of each row: `tollgate` (and past the default `evict_above`, `tollgate_fixed`: that
//! bound fixed, as it was before it followed returning keys), `governor`, `governor_retain`
//! (`limiters/subjects.rs`)
//! and, for `u64` keys outside the flood, `floor`: the keyed groups' floor (a read-only foldhash
//! map of every key's `AtomicU64`, prepared as the limiters are primed, one clock read of the
//! row's kind, GCRA's arithmetic with the row's quota, one CAS). Every subject of a row gets a
//! fresh limiter, the same quota, the same kind of clock and the same key sequence (the flood:
//! the same counter-generated keys from the first). Two-thread rows report the aggregate time
//! per check (wall time / 2), as `keyed_gcra_2t` does.
//!
//! After its samples, each subject checks keys for another 250 ms and the bench panics if the
//! share of allowed checks does not fit the regime (`Regime::plausible_share`).

use std::cell::OnceCell;
use std::hint::black_box;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, Criterion};
use crossbeam_utils::CachePadded;
use governor::clock::{Clock as GovernorClock, QuantaClock as GovernorQuantaClock};
use governor::RateLimiter;
use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::Limiter;

use crate::common;
use crate::regime::{self, ClockKind, Flood, KeyType, Regime, Row, Source, TrafficKey};
use crate::subjects::{self, Retained};

pub fn bench_all(c: &mut Criterion) {
    common::start_coarse_floor_clock();
    let mut group = c.benchmark_group("traffic");
    common::configure(&mut group);
    for row in regime::matrix() {
        match row.key_type {
            KeyType::U64 => {
                keyed::<u64>(&mut group, &row);
                if row.regime != Regime::Flood {
                    floor(&mut group, &row);
                }
            }
            KeyType::Ip => keyed::<IpAddr>(&mut group, &row),
            KeyType::String => keyed::<String>(&mut group, &row),
            KeyType::Uuid => keyed::<String>(&mut group, &row),
        }
    }
    direct(&mut group);
    group.finish();
}

/// The limiters of one row, on the row's kind of clock.
fn keyed<K: TrafficKey>(group: &mut BenchmarkGroup<'_, WallTime>, row: &Row) {
    match row.clock {
        ClockKind::Precise => {
            limiters::<K, _, _>(group, row, QuantaClock::new, GovernorQuantaClock::default)
        }
        ClockKind::Coarse => {
            limiters::<K, _, _>(group, row, CoarseClock::new, common::governor_coarse_clock)
        }
    }
}

fn limiters<K: TrafficKey, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    row: &Row,
    clock: impl Fn() -> C + Copy,
    governor_clock: impl Fn() -> G + Copy,
) {
    if row.regime == Regime::Flood {
        // Nothing to prime: an empty `Vec` leaks no allocation.
        let none = || -> &'static [K] { Vec::new().leak() };
        let kind = row.key_type;
        let flood = move || Flood::<K>::new(kind);
        subjects_of::<K, _, _, _>(group, row, flood, none, clock, governor_clock);
    } else {
        let (kind, n, distribution) = (row.key_type, row.keys, row.distribution);
        subjects_of::<K, _, _, _>(
            group,
            row,
            move || regime::shared::<K>(kind, n, distribution),
            move || &regime::shared::<K>(kind, n, distribution).keys[..],
            clock,
            governor_clock,
        );
    }
}

/// `tollgate`, `governor` and `governor_retain` on one row. `source` gives each subject its
/// keys (a fresh `Flood`, or the shared sequence), `keys` what to prime.
fn subjects_of<K: TrafficKey, S: Source<K>, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    row: &Row,
    source: impl Fn() -> S + Copy,
    keys: impl Fn() -> &'static [K] + Copy,
    clock: impl Fn() -> C + Copy,
    governor_clock: impl Fn() -> G + Copy,
) {
    case(
        group,
        row,
        "tollgate",
        source,
        || subjects::tollgate(row, clock(), keys()),
        subjects::tollgate_check,
    );
    if row.keys > tollgate::store::DEFAULT_EVICT_ABOVE {
        case(
            group,
            row,
            "tollgate_fixed",
            source,
            || subjects::tollgate_fixed(row, clock(), keys()),
            subjects::tollgate_check,
        );
    }
    case(
        group,
        row,
        "governor",
        source,
        || subjects::governor(row, governor_clock(), keys()),
        subjects::governor_check,
    );
    case(
        group,
        row,
        "governor_retain",
        source,
        || Retained::new(subjects::governor(row, governor_clock(), keys())),
        |retained, key| subjects::governor_check(&retained.limiter, key),
    );
}

/// The floor of a `u64` row: every key's GCRA state in a read-only foldhash map, set as the
/// limiters' priming leaves it (`now + prime cost · T`), then one clock read of the row's kind
/// and one CAS a check.
fn floor(group: &mut BenchmarkGroup<'_, WallTime>, row: &Row) {
    let rate = row.rate();
    let (t, span) = (rate.interval_ns(), rate.span_ns());
    let primed = u64::from(row.regime.prime_cost().unwrap_or(0)) * t;
    let (n, distribution) = (row.keys, row.distribution);
    let now: fn() -> u64 = match row.clock {
        ClockKind::Precise => common::precise_now,
        ClockKind::Coarse => common::coarse_now,
    };
    case(
        group,
        row,
        "floor",
        move || regime::shared::<u64>(KeyType::U64, n, distribution),
        || {
            let keys = &regime::shared::<u64>(KeyType::U64, n, distribution).keys;
            common::floor_map_from(keys, now() + primed)
        },
        |map, key| {
            map.get(key)
                .is_some_and(|cell| common::floor_step(cell, now, t, span))
        },
    );
}

/// How long each subject checks keys after its samples, to judge the row's share of allowed
/// checks. Long enough for the steady state to return after criterion's analysis pause: a
/// `deny` key refills 100 ms after its last allowed check, so a short burst right after the
/// pause would find most keys allowed again.
const VERIFY_FOR: Duration = Duration::from_millis(250);

/// One subject of a row: builds its source and limiter only if the filter selects it (once for
/// all samples), measures `check` on the row's threads, checks the share of allowed checks,
/// then drops the limiter.
fn case<K: TrafficKey, S: Source<K>, L: Sync>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    row: &Row,
    subject: &str,
    source: impl FnOnce() -> S,
    build: impl FnOnce() -> L,
    check: impl Fn(&L, &K) -> bool + Sync,
) {
    let id = format!("{}/{subject}", row.id());
    let built: OnceCell<(S, L)> = OnceCell::new();
    let mut make = Some((source, build));
    group.bench_function(&id, |b| {
        let (source, limiter) = built.get_or_init(|| {
            let (source, build) = make.take().expect("built once");
            let source = source();
            (source, build())
        });
        let check = |key: &K| check(limiter, key);
        match row.threads {
            1 => iter_one(b, source, check),
            threads => iter_threads(b, threads, source, &check),
        }
    });
    if let Some((source, limiter)) = built.get() {
        let (mut checks, mut allowed) = (0usize, 0usize);
        let deadline = Instant::now() + VERIFY_FOR;
        while Instant::now() < deadline {
            let first = source.advance(1024);
            allowed += (0..1024)
                .filter(|&i| source.visit(first.wrapping_add(i), |key| check(limiter, key)))
                .count();
            checks += 1024;
        }
        if let Err(e) = row.regime.plausible_share(allowed as f64 / checks as f64) {
            panic!("{id}: {e}");
        }
    }
}

/// One thread: successive keys of the source, one check per iteration.
fn iter_one<K, S: Source<K>>(b: &mut Bencher<'_>, source: &S, check: impl Fn(&K) -> bool) {
    b.iter_custom(|iters| {
        let first = source.advance(iters as usize);
        let start = Instant::now();
        for i in 0..iters as usize {
            black_box(source.visit(first.wrapping_add(i), &check));
        }
        start.elapsed()
    });
}

/// `threads` threads, each making `iters` checks from its own place in the source; returns the
/// wall time divided by `threads` (the aggregate time per check), as `common::iter_keys_threads`.
fn iter_threads<K, S: Source<K>>(
    b: &mut Bencher<'_>,
    threads: usize,
    source: &S,
    check: &(impl Fn(&K) -> bool + Sync),
) {
    b.iter_custom(|iters| {
        let iters = iters as usize;
        let base = source.advance(iters * threads);
        let barrier = Barrier::new(threads);
        let slowest = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        let start = Instant::now();
                        // Interleaved through one stretch (see `regime::run_timed`).
                        for i in 0..iters {
                            let at = base.wrapping_add(i * threads + t);
                            black_box(source.visit(at, check));
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
        slowest / threads as u32
    });
}

/// One key, one thread, precise clocks: `tollgate::Limiter` against governor's
/// `RateLimiter::direct` and the direct floor (one `AtomicU64`, one clock read, one CAS), on the
/// direct quota (`regime::DIRECT`, every check allowed).
fn direct(group: &mut BenchmarkGroup<'_, WallTime>) {
    let rate = regime::DIRECT;
    let id = |subject: &str| format!("{}/{subject}", regime::DIRECT_ID);
    let selected = OnceCell::new();

    group.bench_function(id("tollgate"), |b| {
        let limiter = selected.get_or_init(|| {
            Limiter::with_clock(rate.gcra(), QuantaClock::new()).expect("the precise clock fits")
        });
        b.iter(|| black_box(limiter.check().allowed()))
    });
    if let Some(limiter) = selected.get() {
        assert!(limiter.check().allowed(), "the direct row stays allowed");
    }

    let selected = OnceCell::new();
    group.bench_function(id("governor"), |b| {
        let limiter = selected.get_or_init(|| RateLimiter::direct(subjects::governor_quota(rate)));
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    if let Some(limiter) = selected.get() {
        assert!(limiter.check().is_ok(), "the direct row stays allowed");
    }

    let (t, span) = (rate.interval_ns(), rate.span_ns());
    let cell = CachePadded::new(AtomicU64::new(0));
    group.bench_function(id("floor"), |b| {
        b.iter(|| black_box(common::floor_step(&cell, common::precise_now, t, span)))
    });
}
