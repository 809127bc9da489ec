//! The `tollgate` command: replay a trace of requests through any algorithm, or through the
//! tower layer a configuration builds. (The algorithms' speed on this machine is the benches'
//! and the `traffic` example's job: `benches/README.md`.)
//!
//! ```text
//! tollgate replay --algorithm ALGO --limit L --window DUR [--burst B]
//!                 [--format auto|lines|summary|json] [--top N] [--summary] [FILE]
//! tollgate replay --compare --limit L --window DUR [--burst B] [FILE]
//! tollgate replay … --plot OUT.svg [--key K] [--bucket DUR]
//! tollgate replay --config policies.toml [--format …] [--top N] [FILE]
//! ```
//! `--format auto` (the default) prints the summary for a person when standard output is a
//! terminal and the stable one line per request (`allow` / `deny` / `error`) otherwise, so scripts
//! that pipe or redirect the output read exactly the stable format.
//!
//! Exit status 2 on bad input (a malformed line, time going backwards, a bad option), with a
//! message naming the line on standard error; decisions already printed stay valid.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod common;
mod config_replay;
mod in_flight;
mod plot;
mod report;

use clap::{Args, Parser, Subcommand};
use common::{parse_algorithm, Fatal, Format};
use in_flight::InFlightReplayer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use plot::{Chart, Timeline};
use report::{Report, Setting};
use tollgate::replay::{parse_duration, Replayer, Request, TraceOutcome, TraceReader};
use tollgate::AlgorithmName;

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
    /// Decide a trace (`t_ms,key[,cost[,method,path]]` per line): a summary on a terminal,
    /// allow / deny / error per request when piped (`--format` chooses).
    Replay(ReplayArgs),
}

#[derive(Args)]
struct ReplayArgs {
    /// gcra | token-bucket | leaky-bucket | leaky-queue | fixed-window | sliding-window | sliding-log
    #[arg(long, value_parser = parse_algorithm, required_unless_present_any = ["compare", "config", "in_flight"], requires_all = ["limit", "window"])]
    algorithm: Option<AlgorithmName>,
    /// L: units allowed per window.
    #[arg(long, required_unless_present_any = ["config", "in_flight"])]
    limit: Option<u64>,
    /// W: e.g. 250ms, 1s, 60s, 1m, 1h.
    #[arg(long, value_parser = parse_duration, required_unless_present_any = ["config", "in_flight"])]
    window: Option<Duration>,
    /// At most N requests (units) in flight per key, each line's place held from its time
    /// until its time plus its duration (`t_ms+duration_ms`; none: 0 ms). Alone, or checked
    /// before the rate of --algorithm (a request the rate refuses gives its place back).
    #[arg(long, value_name = "N", conflicts_with_all = ["config", "compare", "redis"])]
    in_flight: Option<u64>,
    /// Decide through the tower layer this configuration (TOML, or JSON by its `.json`
    /// extension) builds, as a server loading it would: the policy each line's method and path
    /// match, the key it reads (the trace's key is the client's IP address and the value of
    /// every header a policy keys by), tiers, costs, shadow and delay modes. Prints
    /// `OUTCOME [POLICY] [WAITED_MS]` per line (outcomes as the metrics name them).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["algorithm", "limit", "window", "burst", "compare", "summary", "redis", "plot"])]
    config: Option<PathBuf>,
    /// B / C: the burst (gcra, token-bucket) or capacity (leaky-bucket, leaky-queue).
    #[arg(long)]
    burst: Option<u64>,
    /// auto: `summary` when standard output is a terminal, else `lines`. lines: one
    /// `allow` / `deny` / `error` per request (the stable scripting format). summary: totals,
    /// the top keys by denials, the peak admitted in one window. json: that summary as one
    /// JSON object.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,
    /// How many keys the summary lists (most denials first); 0 for all.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print allowed and denied per key and in total as CSV instead of one line per request.
    #[arg(long, conflicts_with = "format")]
    summary: bool,
    /// Run every algorithm on the trace; print their totals side by side and how often each
    /// disagrees with the exact sliding log.
    #[arg(long, conflicts_with_all = ["algorithm", "summary"])]
    compare: bool,
    /// Decide through the Redis server at this URL (exact tier, the trace's own time injected)
    /// instead of in-process; prints exactly what the in-process replay prints. Needs a build
    /// with `-p tollgate-cli --features redis`.
    #[arg(long, value_name = "URL", conflicts_with_all = ["compare", "summary"])]
    redis: Option<String>,
    /// Also draw requests admitted and denied per time bucket, against the limit, as an SVG
    /// file (with --compare: one admitted series per algorithm).
    #[arg(long, value_name = "OUT.svg", conflicts_with = "redis")]
    plot: Option<PathBuf>,
    /// Plot only this key's requests (the summary still counts every key).
    #[arg(long, value_name = "K", requires = "plot")]
    key: Option<String>,
    /// The plot's time bucket (default: the window, at least 1 ms; wider buckets are merged
    /// past 1000 of them).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, requires = "plot")]
    bucket: Option<Duration>,
    /// The trace; standard input if absent.
    file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay(args),
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

/// Files shorter than this are replayed in well under a second: no bar flashes by.
const PROGRESS_FROM_BYTES: u64 = 4 << 20;
/// Standard input's length is unknown: its spinner appears after this many requests.
const PROGRESS_FROM_REQUESTS: u64 = 200_000;

/// Opens the trace like [`open`], with a progress bar on standard error when standard error is
/// a terminal (bytes of a file, requests of standard input); `None` otherwise, so nothing
/// but the report and errors ever reaches a pipe or a log.
fn open_with_progress(
    file: &Option<PathBuf>,
) -> Result<(Box<dyn BufRead>, Option<ProgressBar>), Fatal> {
    if !io::stderr().is_terminal() {
        return Ok((open(file)?, None));
    }
    let Some(path) = file else {
        // Hidden until PROGRESS_FROM_REQUESTS requests are in (a short input never shows it);
        // indicatif then redraws at most 20 times a second, and the bar is cleared before the
        // report is printed.
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()).with_style(
            ProgressStyle::with_template("{spinner} {human_pos} requests, {elapsed}")
                .map_err(|e| Fatal(e.to_string()))?,
        );
        return Ok((open(file)?, Some(bar)));
    };
    let file =
        File::open(path).map_err(|e| Fatal(format!("cannot open {}: {e}", path.display())))?;
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    if length < PROGRESS_FROM_BYTES {
        return Ok((Box::new(BufReader::with_capacity(1 << 16, file)), None));
    }
    let bar = ProgressBar::new(length).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec}, {eta} left")
            .map_err(|e| Fatal(e.to_string()))?,
    );
    let input = BufReader::with_capacity(1 << 16, bar.wrap_read(file));
    Ok((Box::new(input), Some(bar)))
}

fn source_name(file: &Option<PathBuf>) -> String {
    file.as_ref()
        .map_or_else(|| "stdin".to_owned(), |p| p.display().to_string())
}

impl ReplayArgs {
    /// L and W: clap requires both unless `--config` is given, which returns before either is read.
    fn limit(&self) -> u64 {
        self.limit.unwrap_or_default()
    }

    fn window(&self) -> Duration {
        self.window.unwrap_or_default()
    }
}

fn replay(args: ReplayArgs) -> Result<(), Fatal> {
    if let Some(config) = &args.config {
        let options = config_replay::Options {
            config,
            source: source_name(&args.file),
            format: args.format.resolve(),
            top: args.top,
        };
        let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
        let result = config_replay::replay(&options, open(&args.file)?, &mut out);
        // Decisions already made are flushed before any error is reported.
        out.flush()?;
        return result;
    }
    if args.compare {
        return compare(&args);
    }
    if args.algorithm.is_none() && args.in_flight.is_none() {
        return Err(Fatal("--algorithm or --in-flight is required".into()));
    }
    if args.algorithm.is_none() && args.plot.is_some() {
        return Err(Fatal(
            "--plot draws a rate's windows: give --algorithm (and --in-flight if wanted)".into(),
        ));
    }
    if args.redis.is_some() && matches!(args.format, Format::Summary | Format::Json) {
        return Err(Fatal(
            "--redis prints one line per request: --format summary and json are in-process only"
                .into(),
        ));
    }
    if let (Some(url), Some(algorithm)) = (&args.redis, args.algorithm) {
        return replay_redis(&args, algorithm, url);
    }
    let mut replayer = args
        .algorithm
        .map(|algorithm| {
            Replayer::new(algorithm, args.limit(), args.window(), args.burst)
                .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))
        })
        .transpose()?;
    let mut in_flight = args
        .in_flight
        .map(|n| {
            InFlightReplayer::new(n).map_err(|e| Fatal(format!("invalid --in-flight {n}: {e}")))
        })
        .transpose()?;
    let format = args.format.resolve();
    let (input, bar) = open_with_progress(&args.file)?;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut summary = args.summary.then(Summary::default);
    let mut report =
        (!args.summary && matches!(format, Format::Summary | Format::Json)).then(|| {
            Report::new(Setting {
                algorithm: args.algorithm,
                in_flight: args.in_flight,
                limit: args.limit(),
                window: args.window(),
                burst: args.burst,
                source: source_name(&args.file),
                top: args.top,
            })
        });
    let mut timeline = args.plot.as_ref().map(|_| timeline(&args, 1));
    let stdin_bar = bar.as_ref().filter(|_| args.file.is_none());
    let failure = each_request(input, |request| {
        let outcome = match (&mut in_flight, &mut replayer) {
            (Some(in_flight), Some(rate)) => {
                in_flight.decide_then(&request, || rate.decide(&request))
            }
            (Some(in_flight), None) => in_flight.decide(&request),
            (None, Some(rate)) => rate.decide(&request),
            (None, None) => unreachable!("checked above"),
        };
        if let Some(bar) = stdin_bar {
            bar.inc(1);
            if bar.position() == PROGRESS_FROM_REQUESTS {
                bar.set_draw_target(ProgressDrawTarget::stderr());
            }
        }
        if let Some(timeline) = &mut timeline {
            if args.key.as_deref().is_none_or(|k| k == request.key) {
                timeline.add(0, request.t_ms, outcome);
            } else {
                timeline.reach(request.t_ms);
            }
        }
        if let Some(summary) = &mut summary {
            summary.add(&request, outcome);
        } else if let Some(report) = &mut report {
            report.add(&request, outcome);
        } else {
            writeln!(out, "{outcome}")?;
        }
        Ok(())
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(summary) = summary {
        summary.print(&mut out)?;
    }
    if let Some(report) = report {
        match format {
            Format::Json => report.print_json(&mut out)?,
            _ => report.print_text(&mut out)?,
        }
    }
    // Decisions already made are flushed (and plotted) before any error is reported.
    out.flush()?;
    if let (Some(path), Some(timeline), Some(algorithm)) = (&args.plot, &timeline, args.algorithm) {
        plot::draw(path, timeline, &chart(&args, &[algorithm.as_str()], true))?;
    }
    failure.map_or(Ok(()), Err)
}

fn timeline(args: &ReplayArgs, series: usize) -> Timeline {
    Timeline::new(series, args.bucket.unwrap_or(args.window()))
}

fn chart<'a>(args: &ReplayArgs, names: &'a [&'a str], denied: bool) -> Chart<'a> {
    let what = if names.len() == 1 {
        names[0].to_owned()
    } else {
        "every algorithm".to_owned()
    };
    let mut title = format!(
        "{what}, {} per {}",
        args.limit(),
        report::duration_text(args.window())
    );
    if let Some(burst) = args.burst {
        title.push_str(&format!(", burst {burst}"));
    }
    title.push_str(&format!(": {}", source_name(&args.file)));
    if let Some(key) = &args.key {
        title.push_str(&format!(", key {key}"));
    }
    Chart {
        title,
        names,
        denied,
        limit: args.limit(),
        window: args.window(),
        one_key: args.key.is_some(),
    }
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
    let mut quota = tollgate::Quota::new(args.limit(), args.window())?;
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
        "--redis needs a build with the redis feature: cargo build --release -p tollgate-cli --features redis"
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
    fn add(&mut self, outcome: TraceOutcome) {
        match outcome {
            TraceOutcome::Allow { .. } => self.allowed += 1,
            TraceOutcome::Deny => self.denied += 1,
            TraceOutcome::Error => self.errors += 1,
        }
    }
}

#[derive(Default)]
struct Summary {
    keys: HashMap<String, Tally>,
    total: Tally,
}

impl Summary {
    fn add(&mut self, request: &Request, outcome: TraceOutcome) {
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
    if args.format != Format::Auto {
        return Err(Fatal(
            "--compare prints its own table: --format applies to one --algorithm".into(),
        ));
    }
    let mut replayers = Vec::new();
    for algorithm in COMPARED {
        let burst = args.burst.filter(|_| algorithm.has_burst());
        let replayer = Replayer::new(algorithm, args.limit(), args.window(), burst)
            .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))?;
        replayers.push(replayer);
    }
    let mut tallies: Vec<Tally> = COMPARED.iter().map(|_| Tally::default()).collect();
    let mut disagreements = [0u64; COMPARED.len()];
    let mut requests = 0u64;
    let mut timeline = args.plot.as_ref().map(|_| timeline(args, COMPARED.len()));
    let failure = each_request(open(&args.file)?, |request| {
        requests += 1;
        let outcomes: Vec<TraceOutcome> =
            replayers.iter_mut().map(|r| r.decide(&request)).collect();
        let reference = outcomes[outcomes.len() - 1].is_allow();
        let plotted = args.key.as_deref().is_none_or(|k| k == request.key);
        for (i, outcome) in outcomes.into_iter().enumerate() {
            tallies[i].add(outcome);
            disagreements[i] += u64::from(outcome.is_allow() != reference);
            match &mut timeline {
                Some(timeline) if plotted => timeline.add(i, request.t_ms, outcome),
                Some(timeline) => timeline.reach(request.t_ms),
                None => {}
            }
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
    if let (Some(path), Some(timeline)) = (&args.plot, &timeline) {
        let names = COMPARED.map(AlgorithmName::as_str);
        plot::draw(path, timeline, &chart(args, &names, false))?;
    }
    failure.map_or(Ok(()), Err)
}
