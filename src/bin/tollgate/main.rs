//! The `tollgate` command: replay a trace of requests through any algorithm, or measure the
//! algorithms on this machine.
//!
//! ```text
//! tollgate replay --algorithm ALGO --limit L --window DUR [--burst B] [--summary] [FILE]
//! tollgate replay --compare --limit L --window DUR [--burst B] [FILE]
//! tollgate bench [--threads N] [--keys N] [--distribution uniform|zipf] [--clock precise|coarse]
//! tollgate bench --redis URL [--mode exact|leased] [--key K] [--json]
//! ```
//! Exit status 2 on bad input (a malformed line, time going backwards, a bad option), with a
//! message naming the line on standard error; decisions already printed stay valid.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod bench;
#[cfg(feature = "redis")]
mod bench_redis;

use clap::{Args, Parser, Subcommand};
use tollgate::replay::{parse_duration, AlgorithmName, Outcome, Replayer, Request, TraceReader};

/// Counts allocations, for `tollgate bench`'s bytes per key.
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Exact rate limiting: replay traces, compare algorithms"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decide a trace (`t_ms,key[,cost]` per line) and print allow / deny / error per request.
    Replay(ReplayArgs),
    /// Measure this crate's algorithms on this machine: ns/op, Mops/s, ratio to the floor
    /// (one clock read + one CAS), bytes per key.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct ReplayArgs {
    /// gcra | token-bucket | leaky-bucket | leaky-queue | fixed-window | sliding-window | sliding-log
    #[arg(long, value_parser = parse_algorithm, required_unless_present = "compare")]
    algorithm: Option<AlgorithmName>,
    /// L: units allowed per window.
    #[arg(long)]
    limit: u64,
    /// W: e.g. 250ms, 1s, 60s, 1m, 1h.
    #[arg(long, value_parser = parse_duration)]
    window: Duration,
    /// B / C: the burst (gcra, token-bucket) or capacity (leaky-bucket, leaky-queue).
    #[arg(long)]
    burst: Option<u64>,
    /// Print allowed and denied per key and in total instead of one line per request.
    #[arg(long)]
    summary: bool,
    /// Run every algorithm on the trace; print their totals side by side and how often each
    /// disagrees with the exact sliding log.
    #[arg(long, conflicts_with_all = ["algorithm", "summary"])]
    compare: bool,
    /// Decide through the Redis server at this URL (exact tier, the trace's own time injected)
    /// instead of in-process; prints exactly what the in-process replay prints. Needs a build
    /// with `--features cli,redis`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["compare", "summary"])]
    redis: Option<String>,
    /// The trace; standard input if absent.
    file: Option<PathBuf>,
}

pub(crate) fn parse_algorithm(text: &str) -> Result<AlgorithmName, String> {
    text.parse()
}

/// A failure that ends the run with exit status 2.
pub(crate) struct Fatal(String);

impl<E: std::fmt::Display> From<E> for Fatal {
    fn from(e: E) -> Self {
        Fatal(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay(args),
        Command::Bench(args) => bench::bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fatal(message)) => {
            eprintln!("tollgate: {message}");
            ExitCode::from(2)
        }
    }
}

fn open(file: &Option<PathBuf>) -> Result<Box<dyn BufRead>, Fatal> {
    Ok(match file {
        Some(path) => Box::new(BufReader::with_capacity(
            1 << 16,
            File::open(path).map_err(|e| Fatal(format!("cannot open {}: {e}", path.display())))?,
        )),
        None => Box::new(BufReader::with_capacity(1 << 16, io::stdin().lock())),
    })
}

fn replay(args: ReplayArgs) -> Result<(), Fatal> {
    if args.compare {
        return compare(&args);
    }
    let algorithm = args
        .algorithm
        .ok_or_else(|| Fatal("--algorithm is required".into()))?;
    if let Some(url) = &args.redis {
        return replay_redis(&args, algorithm, url);
    }
    let mut replayer = Replayer::new(algorithm, args.limit, args.window, args.burst)
        .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))?;
    let input = open(&args.file)?;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut summary = args.summary.then(Summary::default);
    let failure = each_request(input, |request| {
        let outcome = replayer.decide(&request);
        match &mut summary {
            Some(summary) => summary.add(&request, outcome),
            None => writeln!(out, "{outcome}")?,
        }
        Ok(())
    })?;
    if let Some(summary) = summary {
        summary.print(&mut out)?;
    }
    // Decisions already made are flushed before any error is reported.
    out.flush()?;
    failure.map_or(Ok(()), Err)
}

/// Runs `f` on every request of `input` in order. A bad line stops the reading and is returned
/// (to be reported after what was decided is flushed); an error of `f` is returned at once.
fn each_request(
    input: Box<dyn BufRead>,
    mut f: impl FnMut(Request<'_>) -> Result<(), Fatal>,
) -> Result<Option<Fatal>, Fatal> {
    let mut reader = TraceReader::new(input);
    while let Some(request) = reader.next_request() {
        match request {
            Ok(request) => f(request)?,
            Err(e) => return Ok(Some(Fatal(e.to_string()))),
        }
    }
    Ok(None)
}

#[cfg(feature = "redis")]
fn replay_redis(args: &ReplayArgs, algorithm: AlgorithmName, url: &str) -> Result<(), Fatal> {
    use tollgate::redis::{replay_trace, RedisRule, ReplayError};
    let mut quota = tollgate::Quota::new(args.limit, args.window)?;
    if let Some(burst) = args.burst {
        quota = quota.with_burst(burst)?;
    }
    let rule = RedisRule::for_algorithm(algorithm, quota)
        .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))?;
    let mut reader = TraceReader::new(open(&args.file)?);
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let mut written = Ok(());
    let result = replay_trace(url, rule, &mut reader, |outcome| {
        if written.is_ok() {
            written = writeln!(out, "{outcome}");
        }
    });
    // Decisions already made are flushed before any error is reported.
    out.flush()?;
    written?;
    match result {
        Ok(_) => Ok(()),
        Err(ReplayError::Trace(e)) => Err(Fatal(e.to_string())),
        Err(e) => Err(Fatal(format!("redis: {e}"))),
    }
}

#[cfg(not(feature = "redis"))]
fn replay_redis(_: &ReplayArgs, _: AlgorithmName, _: &str) -> Result<(), Fatal> {
    Err(Fatal(
        "--redis needs a build with the redis feature: cargo build --release --features cli,redis"
            .into(),
    ))
}

#[derive(Default)]
struct Tally {
    allowed: u64,
    denied: u64,
    errors: u64,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Allow { .. } => self.allowed += 1,
            Outcome::Deny => self.denied += 1,
            Outcome::Error => self.errors += 1,
        }
    }
}

#[derive(Default)]
struct Summary {
    keys: HashMap<String, Tally>,
    total: Tally,
}

impl Summary {
    fn add(&mut self, request: &Request, outcome: Outcome) {
        self.total.add(outcome);
        match self.keys.get_mut(request.key) {
            Some(tally) => tally.add(outcome),
            None => {
                let mut tally = Tally::default();
                tally.add(outcome);
                self.keys.insert(request.key.to_owned(), tally);
            }
        }
    }

    fn print(self, out: &mut impl Write) -> io::Result<()> {
        let mut keys: Vec<_> = self.keys.into_iter().collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        writeln!(out, "key,allowed,denied,errors")?;
        for (key, t) in &keys {
            writeln!(out, "{key},{},{},{}", t.allowed, t.denied, t.errors)?;
        }
        let t = &self.total;
        writeln!(out, "TOTAL,{},{},{}", t.allowed, t.denied, t.errors)
    }
}

/// The algorithms `--compare` runs, the exact reference (sliding log) last.
const COMPARED: [AlgorithmName; 5] = [
    AlgorithmName::Gcra,
    AlgorithmName::LeakyQueue,
    AlgorithmName::FixedWindow,
    AlgorithmName::SlidingWindow,
    AlgorithmName::SlidingLog,
];

fn compare(args: &ReplayArgs) -> Result<(), Fatal> {
    let mut replayers = Vec::new();
    for algorithm in COMPARED {
        let burst = args.burst.filter(|_| algorithm.has_burst());
        let replayer = Replayer::new(algorithm, args.limit, args.window, burst)
            .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))?;
        replayers.push(replayer);
    }
    let mut tallies: Vec<Tally> = COMPARED.iter().map(|_| Tally::default()).collect();
    let mut disagreements = [0u64; COMPARED.len()];
    let mut requests = 0u64;
    let failure = each_request(open(&args.file)?, |request| {
        requests += 1;
        let outcomes: Vec<Outcome> = replayers.iter_mut().map(|r| r.decide(&request)).collect();
        let reference = outcomes[outcomes.len() - 1].is_allow();
        for (i, outcome) in outcomes.into_iter().enumerate() {
            tallies[i].add(outcome);
            disagreements[i] += u64::from(outcome.is_allow() != reference);
        }
        Ok(())
    })?;
    let mut out = BufWriter::new(io::stdout().lock());
    writeln!(
        out,
        "{:<16} {:>12} {:>12} {:>8} {:>22}",
        "algorithm", "allowed", "denied", "errors", "vs sliding-log"
    )?;
    for (i, algorithm) in COMPARED.iter().enumerate() {
        let t = &tallies[i];
        let share = if requests == 0 {
            0.0
        } else {
            100.0 * disagreements[i] as f64 / requests as f64
        };
        writeln!(
            out,
            "{:<16} {:>12} {:>12} {:>8} {:>12} ({:>6.2}%)",
            algorithm.as_str(),
            t.allowed,
            t.denied,
            t.errors,
            disagreements[i],
            share
        )?;
    }
    writeln!(
        out,
        "{requests} requests; gcra, token-bucket and leaky-bucket decide alike"
    )?;
    out.flush()?;
    failure.map_or(Ok(()), Err)
}
