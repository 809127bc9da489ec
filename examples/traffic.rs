//! One row of the benches' traffic matrix on tollgate alone (GCRA; the benches add governor):
//! the same quotas, key types, key sets and sequences as
//! `cargo bench --bench limiters -- traffic` and `cargo bench --bench latency`, all from the
//! `tollgate-traffic` dev crate (`benches/traffic/`). It prints ns per check and, with
//! `--latency`, the tails of every check timed on its own (p50, p99, p99.9, p99.99, max,
//! checks over 10 µs).
//!
//! ```text
//! cargo run --release --example traffic -- --regime returning
//! cargo run --release --example traffic -- --regime returning --latency [--checks N]
//!     [--key-type u64|ip|string|text] [--keys N] [--threads N] [--clock precise|coarse]
//!     [--distribution uniform|zipf] [--zipf-exponent S] [--duration DUR]
//! cargo run --release --example traffic -- --help
//! ```
//!
//! Exit status 2 on a bad option, with a message on standard error.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::replay::parse_duration;
use tollgate::{Gcra, KeyedLimiter};
use tollgate_traffic::{self as regime, KeyType, Regime, Source, TrafficKey};

#[derive(Parser)]
#[command(
    name = "traffic",
    about = "One row of the benches' traffic matrix on tollgate alone: ns per check, and with \
             --latency the tails of every check timed on its own"
)]
struct Args {
    /// The regime (GCRA): warm (every key charged so that it is never fresh), returning (the
    /// bucket full again at each visit), api (100/s, burst 1), deny (10/s, burst 1, keys
    /// exhausted first) or flood (a new key every check). Each regime has its quota.
    #[arg(long, value_parser = regime_parser())]
    regime: Regime,
    /// Also time every check on its own (a fresh limiter, `--checks` checks) and print p50,
    /// p99, p99.9, p99.99, max and the checks over 10 µs.
    #[arg(long)]
    latency: bool,
    /// u64, ip (IpAddr, 3 in 4 IPv4, 1 in 4 IPv6), string (the same addresses as text, looked
    /// up by &str) or uuid (`String` keys of 36 bytes, UUID texts).
    #[arg(long, value_parser = key_type_parser(), default_value = "u64")]
    key_type: KeyType,
    /// Distinct keys (below 2^32; ignored by the flood).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Threads checking at once.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// With `--latency`: checks timed, in all threads.
    #[arg(long, default_value_t = 8_400_000)]
    checks: u64,
    /// The clock: precise (quanta, default) or coarse (1 ms tick).
    #[arg(long, value_enum, default_value_t = ClockKind::Precise)]
    clock: ClockKind,
    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    distribution: Distribution,
    /// The Zipf exponent `s` (key k drawn with weight 1/k^s).
    #[arg(long, default_value_t = 1.0)]
    zipf_exponent: f64,
    /// Measuring time of the throughput run.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    duration: Duration,
}

/// `--regime`'s values are the crate's names (`Regime::as_str`), listed in `--help`.
fn regime_parser() -> impl TypedValueParser<Value = Regime> {
    PossibleValuesParser::new(Regime::ALL.map(Regime::as_str))
        .map(|name| name.parse().expect("a listed regime"))
}

/// `--key-type`'s values, as for `--regime`.
fn key_type_parser() -> impl TypedValueParser<Value = KeyType> {
    PossibleValuesParser::new(KeyType::ALL.map(KeyType::as_str))
        .map(|name| name.parse().expect("a listed key type"))
}

#[derive(Clone, Copy, ValueEnum)]
enum Distribution {
    Uniform,
    Zipf,
}

#[derive(Clone, Copy, ValueEnum)]
enum ClockKind {
    Precise,
    Coarse,
}

/// A bad option or a limiter that could not be built: printed, exit status 2.
struct Fatal(String);

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fatal(message)) => {
            eprintln!("traffic: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<(), Fatal> {
    if args.threads == 0 || args.keys == 0 {
        return Err(Fatal("--threads and --keys must be at least 1".into()));
    }
    let keys = usize::try_from(args.keys)
        .ok()
        .filter(|&n| n < u32::MAX as usize)
        .ok_or_else(|| Fatal("--keys must be below 2^32".into()))?;
    if args.checks == 0 {
        return Err(Fatal("--checks must be at least 1".into()));
    }
    let row = regime::Row {
        regime: args.regime,
        key_type: args.key_type,
        keys,
        distribution: match args.distribution {
            Distribution::Uniform => regime::Distribution::Uniform,
            Distribution::Zipf => regime::Distribution::Zipf {
                exponent: args.zipf_exponent,
            },
        },
        threads: args.threads,
        clock: match args.clock {
            ClockKind::Precise => regime::ClockKind::Precise,
            ClockKind::Coarse => regime::ClockKind::Coarse,
        },
    };
    match row.key_type {
        KeyType::U64 => with_keys::<u64>(args, &row),
        KeyType::Ip => with_keys::<IpAddr>(args, &row),
        KeyType::String => with_keys::<String>(args, &row),
        KeyType::Uuid => with_keys::<String>(args, &row),
    }
}

fn with_keys<K: TrafficKey>(args: &Args, row: &regime::Row) -> Result<(), Fatal> {
    if row.regime == Regime::Flood {
        with_clock(args, row, || regime::Flood::<K>::new(row.key_type), &[])
    } else {
        let sequence = regime::Sequence::<K>::new(row.key_type, row.keys, row.distribution);
        with_clock(args, row, || &sequence, &sequence.keys)
    }
}

fn with_clock<K: TrafficKey, S: Source<K>>(
    args: &Args,
    row: &regime::Row,
    source: impl Fn() -> S,
    keys: &[K],
) -> Result<(), Fatal> {
    match row.clock {
        regime::ClockKind::Precise => measure(args, row, source, keys, QuantaClock::new),
        regime::ClockKind::Coarse => measure(args, row, source, keys, CoarseClock::new),
    }
}

/// A fresh limiter for the row, every key primed as the regime says.
fn limiter<K: TrafficKey, C: Clock>(
    row: &regime::Row,
    clock: C,
    keys: &[K],
) -> Result<KeyedLimiter<K, Gcra, C>, Fatal> {
    let limiter = KeyedLimiter::<K, Gcra>::builder(row.rate().gcra())
        .clock(clock)
        .build()
        .map_err(|e| Fatal(format!("{}: {e}", row.id())))?;
    regime::prime(keys, row.regime.prime_cost(), |key, cost| {
        let _ = limiter.check_n(key.lookup(), u64::from(cost));
    });
    Ok(limiter)
}

fn measure<K: TrafficKey, S: Source<K>, C: Clock>(
    args: &Args,
    row: &regime::Row,
    source: impl Fn() -> S,
    keys: &[K],
    clock: impl Fn() -> C,
) -> Result<(), Fatal> {
    let check = |limiter: &KeyedLimiter<K, Gcra, C>, key: &K| {
        limiter.check(key.lookup()).is_ok_and(|d| d.allowed())
    };
    let rate = row.rate();
    let primed = match row.regime.prime_cost() {
        Some(cost) => format!("every key checked once with cost {cost} before timing"),
        None => "every check a new key".into(),
    };
    println!(
        "traffic --regime {}: GCRA {}/s burst {} ({} clock), {}; {primed}",
        row.regime.as_str(),
        rate.per_second,
        rate.burst,
        row.clock.as_str(),
        match row.regime {
            Regime::Flood => format!("{} keys", row.key_type.as_str()),
            _ => format!(
                "{} distinct {} keys ({})",
                row.keys,
                row.key_type.as_str(),
                row.distribution.label()
            ),
        },
    );

    let throughput = {
        let limiter = limiter(row, clock(), keys)?;
        regime::run_for(row.threads, args.duration, &source(), |key| {
            check(&limiter, key)
        })
    };
    let id = row.id();
    let width = id.chars().count().max(3);
    println!(
        "{:<width$} {:>10} {:>10} {:>9}",
        "row", "ns/check", "Mops/s", "allowed"
    );
    println!(
        "{id:<width$} {:>10.1} {:>10.2} {:>8.1}%",
        throughput.ns_per_check(),
        throughput.mops(),
        throughput.allowed_share() * 100.0
    );
    println!(
        "ns/check is per thread (wall time x threads / checks, over {:?}); Mops/s is the aggregate.",
        args.duration
    );
    if let Err(e) = row.regime.plausible_share(throughput.allowed_share()) {
        eprintln!("traffic: warning: {e}");
    }

    if args.latency {
        let tails = {
            let limiter = limiter(row, clock(), keys)?;
            regime::run_timed(row.threads, args.checks, &source(), |key| {
                check(&limiter, key)
            })
        };
        println!();
        println!("{}", regime::timer_note(args.checks));
        print!(
            "{}",
            regime::tails_table(&["tollgate"], &[(id, vec![tails])])
        );
    }
    Ok(())
}
