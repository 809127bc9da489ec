//! The latency mode of issue 16's traffic matrix: every check timed on its own, the tails of
//! tollgate and governor side by side. criterion reports means, and a mean hides the one request
//! in a thousand that pays for eviction or a table resize.
//!
//! ```text
//! cargo bench --bench latency                              # every row, 8.4M checks a row
//! cargo bench --bench latency -- api/u64/1m flood          # rows whose ID contains a filter
//! cargo bench --bench latency -- --checks 1000000          # fewer checks a row
//! cargo bench --bench latency -- --retain                  # add governor with retain_recent()
//! cargo bench --bench latency -- --list                    # the row IDs
//! ```
//!
//! The rows are the `traffic` group's (`src/bin/tollgate/regime.rs`, plus `direct/precise`),
//! with the same IDs minus the `traffic/` prefix and the subject. Each row and subject gets a
//! fresh limiter, primed as in the criterion group; the row's threads then make `--checks`
//! checks in all (an equal share each), each timed with two quanta TSC reads into a per-thread
//! HDR histogram, merged at the end (`regime::run_timed`). The table prints, per subject, p50,
//! p99, p99.9, p99.99, max and the checks over 10 µs, then the share of allowed checks.

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use governor::clock::{Clock as GovernorClock, QuantaClock as GovernorQuantaClock};
use governor::RateLimiter;
use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::{Limiter, TextKey};

#[path = "../src/bin/tollgate/regime.rs"]
mod regime;
#[path = "limiters/subjects.rs"]
mod subjects;

use regime::{ClockKind, Flood, KeyType, Regime, Row, Source, Tails, TrafficKey};
use subjects::Retained;

/// Issue 16's tails were measured with 8.4M checks a row.
const DEFAULT_CHECKS: u64 = 8_400_000;

/// Checks a row when run without `--bench` (by `cargo test --benches`): enough to see every
/// row run, not to measure.
const TEST_CHECKS: u64 = 10_000;

struct Options {
    filters: Vec<String>,
    checks: u64,
    retain: bool,
    list: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        filters: Vec::new(),
        checks: DEFAULT_CHECKS,
        retain: false,
        list: false,
    };
    let mut args = std::env::args().skip(1);
    let (mut bench, mut checks_given) = (false, false);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            // cargo bench passes `--bench` to every bench binary; `cargo test --benches` does
            // not, and then (as criterion does) this only checks that every row runs.
            "--bench" => bench = true,
            "--checks" => {
                checks_given = true;
                let value = args.next().ok_or("--checks needs a number")?;
                options.checks = value
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--checks {value}: {e}"))?;
                if options.checks == 0 {
                    return Err("--checks must be at least 1".into());
                }
            }
            "--retain" => options.retain = true,
            "--list" => options.list = true,
            "-h" | "--help" => {
                return Err(
                    "usage: cargo bench --bench latency -- [FILTER…] [--checks N] \
                            [--retain] [--list]"
                        .into(),
                )
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            filter => options.filters.push(filter.to_string()),
        }
    }
    if !bench && !checks_given {
        options.checks = TEST_CHECKS;
    }
    Ok(options)
}

/// A row of this bench: a keyed row of the matrix, or the direct one.
enum Case {
    Keyed(Row),
    Direct,
}

impl Case {
    fn id(&self) -> String {
        match self {
            Case::Keyed(row) => row.id(),
            Case::Direct => regime::DIRECT_ID.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("latency: {message}");
            return ExitCode::from(2);
        }
    };
    let cases: Vec<Case> = regime::matrix()
        .into_iter()
        .map(Case::Keyed)
        .chain([Case::Direct])
        .filter(|case| {
            let id = case.id();
            options.filters.is_empty() || options.filters.iter().any(|f| id.contains(f))
        })
        .collect();
    if options.list {
        cases.iter().for_each(|case| println!("{}", case.id()));
        return ExitCode::SUCCESS;
    }
    if cases.is_empty() {
        eprintln!(
            "latency: no row matches {:?} (--list shows them)",
            options.filters
        );
        return ExitCode::from(2);
    }

    let mut subjects = vec!["tollgate", "governor"];
    if options.retain {
        subjects.push("governor_retain");
    }
    let ids: Vec<String> = cases.iter().map(Case::id).collect();
    let width = regime::id_width(ids.iter().map(String::as_str));
    println!("{}", regime::timer_note(options.checks));
    print!("{}", regime::tails_header(&subjects, width));
    for (case, id) in cases.iter().zip(&ids) {
        eprintln!("latency: {id} …");
        let tails = match case {
            Case::Keyed(row) => keyed_row(row, options.checks, options.retain),
            Case::Direct => direct_row(options.checks),
        };
        if let Case::Keyed(row) = case {
            for (subject, t) in subjects.iter().zip(&tails) {
                if let Err(e) = row.regime.plausible_share(t.allowed_share()) {
                    eprintln!("latency: warning: {id} {subject}: {e}");
                }
            }
        }
        print!("{}", regime::tails_line(id, &tails, width, subjects.len()));
        let _ = std::io::stdout().flush();
    }
    ExitCode::SUCCESS
}

fn keyed_row(row: &Row, checks: u64, retain: bool) -> Vec<Tails> {
    match row.key_type {
        KeyType::U64 => on_clock::<u64>(row, checks, retain),
        KeyType::Ip => on_clock::<IpAddr>(row, checks, retain),
        KeyType::String => on_clock::<String>(row, checks, retain),
        KeyType::Text => on_clock::<TextKey>(row, checks, retain),
    }
}

/// governor's coarse clock: `QuantaUpkeepClock` with a 1 ms upkeep, one per process (quanta
/// allows one upkeep thread), shared by clones.
fn governor_coarse_clock() -> governor::clock::QuantaUpkeepClock {
    static CLOCK: OnceLock<governor::clock::QuantaUpkeepClock> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            governor::clock::QuantaUpkeepClock::from_interval(Duration::from_millis(1))
                .expect("one quanta upkeep thread")
        })
        .clone()
}

fn on_clock<K: TrafficKey>(row: &Row, checks: u64, retain: bool) -> Vec<Tails> {
    match row.clock {
        ClockKind::Precise => on_source::<K, _, _>(
            row,
            checks,
            retain,
            QuantaClock::new,
            GovernorQuantaClock::default,
        ),
        ClockKind::Coarse => {
            on_source::<K, _, _>(row, checks, retain, CoarseClock::new, governor_coarse_clock)
        }
    }
}

fn on_source<K: TrafficKey, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    row: &Row,
    checks: u64,
    retain: bool,
    clock: impl Fn() -> C + Copy,
    governor_clock: impl Fn() -> G + Copy,
) -> Vec<Tails> {
    if row.regime == Regime::Flood {
        let none = || -> &'static [K] { Vec::new().leak() };
        timed(
            row,
            checks,
            retain,
            Flood::<K>::new,
            none,
            clock,
            governor_clock,
        )
    } else {
        let (n, distribution) = (row.keys, row.distribution);
        timed(
            row,
            checks,
            retain,
            move || regime::shared::<K>(n, distribution),
            move || &regime::shared::<K>(n, distribution).keys[..],
            clock,
            governor_clock,
        )
    }
}

/// Each subject in turn, on a fresh limiter (dropped before the next is built).
fn timed<K: TrafficKey, S: Source<K>, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    row: &Row,
    checks: u64,
    retain: bool,
    source: impl Fn() -> S,
    keys: impl Fn() -> &'static [K],
    clock: impl Fn() -> C,
    governor_clock: impl Fn() -> G,
) -> Vec<Tails> {
    let mut tails = Vec::new();
    {
        let limiter = subjects::tollgate(row, clock(), keys());
        tails.push(regime::run_timed(row.threads, checks, &source(), |key| {
            subjects::tollgate_check(&limiter, key)
        }));
    }
    {
        let limiter = subjects::governor(row, governor_clock(), keys());
        tails.push(regime::run_timed(row.threads, checks, &source(), |key| {
            subjects::governor_check(&limiter, key)
        }));
    }
    if retain {
        let retained = Retained::new(subjects::governor(row, governor_clock(), keys()));
        tails.push(regime::run_timed(row.threads, checks, &source(), |key| {
            subjects::governor_check(&retained.limiter, key)
        }));
    }
    tails
}

/// One key, one thread, precise clocks, the direct quota (every check allowed). No
/// `governor_retain` (a direct limiter holds no keys).
fn direct_row(checks: u64) -> Vec<Tails> {
    let rate = regime::DIRECT;
    // The direct checks ignore the key; a flood source only paces the loop.
    let source = Flood::<u64>::new;
    let limiter = Limiter::with_clock(rate.gcra(), QuantaClock::new()).expect("fits");
    let tollgate = regime::run_timed(1, checks, &source(), |_| limiter.check().allowed());
    let limiter = RateLimiter::direct(subjects::governor_quota(rate));
    let governor = regime::run_timed(1, checks, &source(), |_| limiter.check().is_ok());
    vec![tollgate, governor]
}
