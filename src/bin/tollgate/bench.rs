//! `tollgate bench`: this crate's algorithms on the user's own machine.
//!
//! Each algorithm runs in a keyed limiter over `--keys` u64 keys, after a warm-up that inserts
//! every key. Bytes/key is measured apart, on a limiter whose clock is frozen so that every key
//! keeps its state: what the table holds per key, allocator growth included. Threads then
//! check keys drawn uniformly or from a Zipf distribution for `--duration`. The floor is what no
//! keyed check can beat: one clock read and one compare-and-swap on the key's own word, found
//! by plain indexing (no hashing, no map).
//!
//! One row of the benches' traffic matrix on tollgate alone (a regime, its quota, key type and
//! key sequence, and the tails of every check timed on its own) is the `traffic` example's job:
//! `cargo run --release --example traffic -- --regime returning --latency`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use tollgate::clock::{Clock, CoarseClock, ManualClock, QuantaClock};
use tollgate::replay::parse_duration;
use tollgate::Algorithm;
use tollgate::AlgorithmName;
use tollgate::{FixedWindow, Gcra, KeyedLimiter, LeakyQueue, Quota, SlidingLog, SlidingWindow};

use crate::common::{Fatal, ALLOCATOR};

#[derive(Args)]
pub struct BenchArgs {
    /// Algorithms to measure, comma-separated (default: gcra, leaky-queue, fixed-window,
    /// sliding-window, sliding-log).
    #[arg(long, value_delimiter = ',', value_parser = crate::common::parse_algorithm)]
    pub(crate) algorithm: Vec<AlgorithmName>,
    /// Threads checking at once.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    distribution: Distribution,
    /// The Zipf exponent `s` (key k drawn with weight 1/k^s).
    #[arg(long, default_value_t = 1.0)]
    zipf_exponent: f64,
    /// L of the quota.
    #[arg(long, default_value_t = 64)]
    pub(crate) limit: u64,
    /// W of the quota.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) window: Duration,
    /// B / C for gcra and leaky-queue (default L).
    #[arg(long)]
    pub(crate) burst: Option<u64>,
    /// The clock: precise (quanta, default) or coarse (1 ms tick).
    #[arg(long, value_enum, default_value_t = ClockKind::Precise)]
    clock: ClockKind,
    /// Measuring time per algorithm.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Measure the Redis tier at this URL instead of in-process (needs `--features cli,redis`);
    /// uses the first `--algorithm` (default gcra) on one key.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// With `--redis`: exact (one script call per check), coalesced (exact checks sharing
    /// calls while one is in flight) or leased.
    #[cfg(feature = "redis")]
    #[arg(long, value_enum, default_value_t = Mode::Exact)]
    pub(crate) mode: Mode,
    /// With `--redis`: the key every process checks (several processes may share it).
    #[arg(long, default_value = "tollgate-bench")]
    pub(crate) key: String,
    /// With `--redis --mode exact|coalesced`: checks in flight at once on the shared connection.
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: usize,
    /// With `--redis`: print one JSON object (checks, admitted, round_trips, seconds).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Distribution {
    Uniform,
    Zipf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClockKind {
    Precise,
    Coarse,
}

/// Draws per thread come from a precomputed ring of this many keys.
const DRAWS: usize = 1 << 20;

struct Row {
    name: String,
    ns_per_op: f64,
    mops: f64,
    allowed: f64,
    bytes_per_key: Option<f64>,
}

pub fn bench(args: BenchArgs) -> Result<(), Fatal> {
    // `--redis` is dispatched by main.rs to bench_redis.rs, which reads these arguments: the
    // arrow points from bench_redis.rs to this file only.
    if args.threads == 0 || args.keys == 0 {
        return Err(Fatal("--threads and --keys must be at least 1".into()));
    }
    let algorithms = if args.algorithm.is_empty() {
        vec![
            AlgorithmName::Gcra,
            AlgorithmName::LeakyQueue,
            AlgorithmName::FixedWindow,
            AlgorithmName::SlidingWindow,
            AlgorithmName::SlidingLog,
        ]
    } else {
        args.algorithm.clone()
    };
    let draws = draws(&args);
    let mut rows = vec![floor(&args, &draws)];
    for algorithm in algorithms {
        let mut quota = Quota::new(args.limit, args.window)?;
        if let Some(burst) = args.burst.filter(|_| algorithm.has_burst()) {
            quota = quota.with_burst(burst)?;
        }
        let row = match algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                run(&args, &draws, algorithm, Gcra::new(quota)?)
            }
            AlgorithmName::LeakyQueue => run(&args, &draws, algorithm, LeakyQueue::new(quota)?),
            AlgorithmName::FixedWindow => run(&args, &draws, algorithm, FixedWindow::new(quota)?),
            AlgorithmName::SlidingWindow => {
                run(&args, &draws, algorithm, SlidingWindow::new(quota)?)
            }
            AlgorithmName::SlidingLog => run(&args, &draws, algorithm, SlidingLog::new(quota)?),
        }?;
        rows.push(row);
    }
    print(&args, &rows);
    Ok(())
}

/// Which Redis tier `bench --redis` measures (bench_redis.rs runs it).
#[cfg(feature = "redis")]
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One atomic script call (EVALSHA) per check.
    Exact,
    /// Exact checks, coalesced: checks arriving while a call is in flight share the next one
    /// (round trips: the EVALSHA calls the server counted meanwhile, from every client).
    Coalesced,
    /// Local leases refilled in the background.
    Leased,
}

/// One key sequence per thread, so threads do not walk the same keys in step.
fn draws(args: &BenchArgs) -> Vec<Vec<u64>> {
    let cdf = matches!(args.distribution, Distribution::Zipf).then(|| {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=args.keys)
            .map(|k| {
                total += 1.0 / (k as f64).powf(args.zipf_exponent);
                total
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= total);
        cdf
    });
    (0..args.threads)
        .map(|thread| {
            let mut rng = SplitMix(0x9E37_79B9_7F4A_7C15 ^ thread as u64);
            (0..DRAWS)
                .map(|_| match &cdf {
                    None => rng.next() % args.keys,
                    Some(cdf) => {
                        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                        cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u64
                    }
                })
                .collect()
        })
        .collect()
}

/// A small, fast PRNG (SplitMix64); quality is ample for drawing keys.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Runs `op` on every thread for the duration; returns (total ops, total allowed, seconds).
fn drive(args: &BenchArgs, draws: &[Vec<u64>], op: impl Fn(u64) -> bool + Sync) -> (u64, u64, f64) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(args.threads + 1);
    let totals = AtomicU64::new(0);
    let allowed = AtomicU64::new(0);
    let mut seconds = 0.0;
    std::thread::scope(|scope| {
        for keys in draws {
            let (stop, barrier, totals, allowed, op) = (&stop, &barrier, &totals, &allowed, &op);
            scope.spawn(move || {
                barrier.wait();
                let (mut ops, mut ok) = (0u64, 0u64);
                'run: loop {
                    for chunk in keys.chunks(1024) {
                        for &key in chunk {
                            ok += u64::from(op(key));
                        }
                        ops += chunk.len() as u64;
                        // Relaxed: a stop flag; no data rides on it.
                        if stop.load(Ordering::Relaxed) {
                            break 'run;
                        }
                    }
                }
                totals.fetch_add(ops, Ordering::Relaxed);
                allowed.fetch_add(ok, Ordering::Relaxed);
            });
        }
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(args.duration);
        stop.store(true, Ordering::Relaxed);
        seconds = start.elapsed().as_secs_f64();
    });
    (totals.into_inner(), allowed.into_inner(), seconds)
}

fn row(
    args: &BenchArgs,
    name: String,
    (ops, ok, seconds): (u64, u64, f64),
    bytes: Option<f64>,
) -> Row {
    let ops = ops.max(1) as f64;
    Row {
        name,
        ns_per_op: seconds * 1e9 * args.threads as f64 / ops,
        mops: ops / seconds / 1e6,
        allowed: ok as f64 / ops,
        bytes_per_key: bytes,
    }
}

fn floor(args: &BenchArgs, draws: &[Vec<u64>]) -> Row {
    let words: Vec<AtomicU64> = (0..args.keys).map(|_| AtomicU64::new(0)).collect();
    let op = |now: u64, key: u64| {
        let word = &words[key as usize];
        // Relaxed: the floor measures the cost of the instructions, not a protocol.
        let seen = word.load(Ordering::Relaxed);
        word.compare_exchange(seen, seen.max(now) + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    };
    let result = match args.clock {
        ClockKind::Precise => {
            let clock = QuantaClock::new();
            drive(args, draws, |key| op(clock.now(), key))
        }
        ClockKind::Coarse => {
            let clock = CoarseClock::new();
            drive(args, draws, |key| op(clock.now(), key))
        }
    };
    row(args, "floor (clock + CAS)".into(), result, Some(8.0))
}

fn run<A: Algorithm>(
    args: &BenchArgs,
    draws: &[Vec<u64>],
    name: AlgorithmName,
    rule: A,
) -> Result<Row, Fatal> {
    match args.clock {
        ClockKind::Precise => run_on(args, draws, name, rule, QuantaClock::new()),
        ClockKind::Coarse => run_on(args, draws, name, rule, CoarseClock::new()),
    }
}

fn run_on<A: Algorithm, C: Clock>(
    args: &BenchArgs,
    draws: &[Vec<u64>],
    name: AlgorithmName,
    rule: A,
    clock: C,
) -> Result<Row, Fatal> {
    let bytes_per_key = bytes_per_key(args, rule);
    let limiter = KeyedLimiter::<u64, A, C>::with_clock(rule, clock)
        .map_err(|e| Fatal(format!("{name}: {e}")))?;
    for key in 0..args.keys {
        let _ = limiter.check(&key);
    }
    let result = drive(args, draws, |key| {
        limiter.check(&key).is_ok_and(|d| d.allowed())
    });
    Ok(row(args, name.to_string(), result, Some(bytes_per_key)))
}

/// Bytes a limiter holds per key once every key has state: measured on a frozen manual clock,
/// so no key turns fresh and gets evicted while the table fills.
fn bytes_per_key<A: Algorithm>(args: &BenchArgs, rule: A) -> f64 {
    let region = stats_alloc::Region::new(ALLOCATOR);
    let limiter = KeyedLimiter::<u64, A, ManualClock>::with_clock(rule, ManualClock::new())
        .expect("the manual clock resolves 1 ns");
    for key in 0..args.keys {
        let _ = limiter.check(&key);
    }
    let stats = region.change();
    drop(limiter);
    // A reallocation's growth is in `bytes_allocated`, its shrinking in `bytes_deallocated`.
    (stats.bytes_allocated as f64 - stats.bytes_deallocated as f64) / args.keys as f64
}

fn print(args: &BenchArgs, rows: &[Row]) {
    let floor = rows[0].ns_per_op;
    let clock = match args.clock {
        ClockKind::Precise => "precise (quanta)",
        ClockKind::Coarse => "coarse (1 ms tick)",
    };
    let distribution = match args.distribution {
        Distribution::Uniform => "uniform".to_string(),
        Distribution::Zipf => format!("zipf s={}", args.zipf_exponent),
    };
    println!(
        "tollgate bench: {} thread(s), {} keys ({distribution}), {clock} clock, quota {}/{:?}, {:?} per row",
        args.threads, args.keys, args.limit, args.window, args.duration
    );
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>9} {:>10}",
        "algorithm", "ns/op", "Mops/s", "x floor", "allowed", "bytes/key"
    );
    for r in rows {
        let bytes = r.bytes_per_key.map_or("-".into(), |b| format!("{b:.1}"));
        println!(
            "{:<22} {:>10.1} {:>10.2} {:>9.2} {:>8.1}% {:>10}",
            r.name,
            r.ns_per_op,
            r.mops,
            r.ns_per_op / floor,
            r.allowed * 100.0,
            bytes
        );
    }
    println!("ns/op is per thread (wall time x threads / ops); Mops/s is the aggregate.");
}
