//! The latency mode of the traffic matrix: every check timed on its own, the tails of
//! tollgate and governor side by side. criterion reports means, and a mean hides the one request
//! in a thousand that pays for eviction or a table resize.
//!
//! ```text
//! cargo bench --bench latency                              # every row, 8.4M checks a row
//! cargo bench --bench latency -- api/u64/1m flood          # rows whose ID contains a filter
//! cargo bench --bench latency -- --checks 1000000          # fewer checks a row
//! cargo bench --bench latency -- --retain                  # add governor with retain_recent()
//! cargo bench --bench latency -- --rounds 10               # subjects alternate, 10 slices each
//! cargo bench --bench latency -- --warm-up 8400000         # untimed checks first, each subject
//! cargo bench --bench latency -- api/u64/1m --unprimed     # keys first seen while timed
//! cargo bench --bench latency -- --list                    # the row IDs
//! ```
//!
//! The rows are the `traffic` group's (`benches/traffic/`, plus `direct/precise`),
//! with the same IDs minus the `traffic/` prefix and the subject. Each row and subject gets a
//! fresh limiter, primed as in the criterion group; the row's threads then make `--checks`
//! checks in all (an equal share each), each timed with two quanta TSC reads into a per-thread
//! HDR histogram, merged at the end (`regime::run_timed`). The table prints, per subject, p50,
//! p99, p99.9, p99.99, max and the checks over 10 µs, then the share of allowed checks.
//!
//! `--warm-up N` runs N checks per subject on its own key source after priming, before the
//! timed slices, and discards their times: priming visits each key once, so without it a row
//! whose first rounds change the table (the default bound raising its share at millions of
//! returning keys) times that change rather than the steady state.
//!
//! `--unprimed` skips the priming: each key's first check is timed, an insert into a table that
//! grows from empty while timed (with 1M keys and `--checks 2500000`, 92 % of the keys are
//! seen and 37 % of the checks are first sightings): the tails of a server's first minutes
//! after a deploy, or of new clients arriving.
//!
//! `--rounds R` splits each subject's checks into R slices and runs the subjects' slices in
//! turn (tollgate, governor, tollgate, …, every limiter built and primed first), then prints
//! each subject's mean per check (the median of its slices) and the median of the per-slice
//! ratios governor / tollgate (means of the timed checks). On a machine whose speed drifts over seconds (this VM's moved
//! 2-3x between criterion runs), a drift then slows both subjects' neighbouring slices alike,
//! where criterion times one subject's seconds after the other's. The means include the
//! per-check timer (~10 ns, the same for both), so ratios lean towards 1.

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use governor::clock::{Clock as GovernorClock, QuantaClock as GovernorQuantaClock};
use governor::RateLimiter;
use tollgate::clock::{Clock, CoarseClock, QuantaClock};
use tollgate::Limiter;

// The traffic rows (the `tollgate-traffic` dev crate, `benches/traffic/`).
use tollgate_traffic as regime;
#[path = "limiters/subjects.rs"]
mod subjects;

use regime::{ClockKind, Flood, KeyType, Regime, Row, Source, Tails, TrafficKey};
use subjects::Retained;

/// The tails in benches/README.md were measured with 8.4M checks a row.
const DEFAULT_CHECKS: u64 = 8_400_000;

/// Checks a row when run without `--bench` (by `cargo test --benches`): enough to see every
/// row run, not to measure.
const TEST_CHECKS: u64 = 10_000;

struct Options {
    filters: Vec<String>,
    checks: u64,
    rounds: u64,
    warm_up: u64,
    unprimed: bool,
    retain: bool,
    list: bool,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        filters: Vec::new(),
        checks: DEFAULT_CHECKS,
        rounds: 1,
        warm_up: 0,
        unprimed: false,
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
            "--rounds" => {
                let value = args.next().ok_or("--rounds needs a number")?;
                options.rounds = value
                    .parse()
                    .map_err(|e| format!("--rounds {value}: {e}"))?;
                if options.rounds == 0 {
                    return Err("--rounds must be at least 1".into());
                }
            }
            "--warm-up" => {
                let value = args.next().ok_or("--warm-up needs a number")?;
                options.warm_up = value
                    .replace('_', "")
                    .parse()
                    .map_err(|e| format!("--warm-up {value}: {e}"))?;
            }
            "--retain" => options.retain = true,
            "--unprimed" => options.unprimed = true,
            "--list" => options.list = true,
            "-h" | "--help" => {
                return Err(
                    "usage: cargo bench --bench latency -- [FILTER…] [--checks N] \
                            [--rounds R] [--warm-up N] [--unprimed] [--retain] [--list]"
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
        let rounds = Rounds {
            count: options.rounds,
            checks: (options.checks / options.rounds).max(1),
            warm_up: options.warm_up,
            primed: !options.unprimed,
        };
        let runs = match case {
            Case::Keyed(row) => keyed_row(row, rounds, options.retain),
            Case::Direct => direct_row(rounds),
        };
        let means = (options.rounds > 1).then(|| means_line(&subjects, &runs));
        let tails: Vec<Tails> = runs.into_iter().map(Slices::merged).collect();
        if let Case::Keyed(row) = case {
            for (subject, t) in subjects.iter().zip(&tails) {
                if let Err(e) = row.regime.plausible_share(t.allowed_share()) {
                    eprintln!("latency: warning: {id} {subject}: {e}");
                }
            }
        }
        print!("{}", regime::tails_line(id, &tails, width, subjects.len()));
        if let Some(means) = means {
            println!("{means}");
        }
        let _ = std::io::stdout().flush();
    }
    ExitCode::SUCCESS
}

/// How each subject's checks are split: `warm_up` untimed checks, then `count` slices of
/// `checks`, run in turn; `primed`: every key checked once before (else none is).
#[derive(Clone, Copy)]
struct Rounds {
    count: u64,
    checks: u64,
    warm_up: u64,
    primed: bool,
}

/// One subject's slices, in the order they ran.
#[derive(Default)]
struct Slices(Vec<Tails>);

impl Slices {
    /// The mean timed check of each slice (the timer's ~10 ns included; not the loop's
    /// recording of each check, which the slice's wall time would add).
    fn means(&self) -> Vec<f64> {
        self.0.iter().map(|t| t.histogram.mean()).collect()
    }

    /// Every slice's checks in one set of tails.
    fn merged(self) -> Tails {
        let mut slices = self.0.into_iter();
        let mut all = slices.next().expect("at least one round");
        slices.for_each(|slice| all.merge(slice));
        all
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Each subject's median slice mean, and the median per-slice ratio of every other subject to
/// tollgate (the first).
fn means_line(subjects: &[&str], runs: &[Slices]) -> String {
    let means: Vec<Vec<f64>> = runs.iter().map(Slices::means).collect();
    let mut out = String::from("  means, ns a check (median of the slices):");
    for (subject, m) in subjects.iter().zip(&means) {
        out.push_str(&format!(" {subject} {:.1};", median(m.clone())));
    }
    for (subject, m) in subjects.iter().zip(&means).skip(1) {
        let ratios: Vec<f64> = m.iter().zip(&means[0]).map(|(s, t)| s / t).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        out.push_str(&format!(
            " {subject} / tollgate {:.2} [{lo:.2}-{hi:.2}]",
            median(ratios.clone())
        ));
    }
    out
}

fn keyed_row(row: &Row, rounds: Rounds, retain: bool) -> Vec<Slices> {
    match row.key_type {
        KeyType::U64 => on_clock::<u64>(row, rounds, retain),
        KeyType::Ip => on_clock::<IpAddr>(row, rounds, retain),
        KeyType::String => on_clock::<String>(row, rounds, retain),
        KeyType::Uuid => on_clock::<String>(row, rounds, retain),
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

fn on_clock<K: TrafficKey>(row: &Row, rounds: Rounds, retain: bool) -> Vec<Slices> {
    match row.clock {
        ClockKind::Precise => on_source::<K, _, _>(
            row,
            rounds,
            retain,
            QuantaClock::new,
            GovernorQuantaClock::default,
        ),
        ClockKind::Coarse => {
            on_source::<K, _, _>(row, rounds, retain, CoarseClock::new, governor_coarse_clock)
        }
    }
}

fn on_source<K: TrafficKey, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    row: &Row,
    rounds: Rounds,
    retain: bool,
    clock: impl Fn() -> C + Copy,
    governor_clock: impl Fn() -> G + Copy,
) -> Vec<Slices> {
    let kind = row.key_type;
    if row.regime == Regime::Flood {
        let none = || -> &'static [K] { Vec::new().leak() };
        timed(
            row,
            rounds,
            retain,
            move || Flood::<K>::new(kind),
            none,
            clock,
            governor_clock,
        )
    } else {
        let (n, distribution) = (row.keys, row.distribution);
        timed(
            row,
            rounds,
            retain,
            move || regime::shared::<K>(kind, n, distribution),
            move || &regime::shared::<K>(kind, n, distribution).keys[..],
            clock,
            governor_clock,
        )
    }
}

/// Every subject's limiter, built and primed first; then each round runs a slice of each
/// subject's checks in turn, each subject on its own key source.
fn timed<K: TrafficKey, S: Source<K>, C: Clock, G: GovernorClock + Send + Sync + 'static>(
    row: &Row,
    rounds: Rounds,
    retain: bool,
    source: impl Fn() -> S,
    keys: impl Fn() -> &'static [K],
    clock: impl Fn() -> C,
    governor_clock: impl Fn() -> G,
) -> Vec<Slices> {
    let keys = || if rounds.primed { keys() } else { &[] };
    let tollgate = subjects::tollgate(row, clock(), keys());
    let governor = subjects::governor(row, governor_clock(), keys());
    let retained = retain.then(|| Retained::new(subjects::governor(row, governor_clock(), keys())));
    let sources = [source(), source(), source()];
    let mut runs: Vec<Slices> = (0..2 + usize::from(retain))
        .map(|_| Slices::default())
        .collect();
    let slice = |source: &S, check: &(dyn Fn(&K) -> bool + Sync)| {
        regime::run_timed(row.threads, rounds.checks, source, check)
    };
    if rounds.warm_up > 0 {
        regime::run_timed(row.threads, rounds.warm_up, &sources[0], |key| {
            subjects::tollgate_check(&tollgate, key)
        });
        regime::run_timed(row.threads, rounds.warm_up, &sources[1], |key| {
            subjects::governor_check(&governor, key)
        });
        if let Some(retained) = &retained {
            regime::run_timed(row.threads, rounds.warm_up, &sources[2], |key| {
                subjects::governor_check(&retained.limiter, key)
            });
        }
    }
    for _ in 0..rounds.count {
        runs[0].0.push(slice(&sources[0], &|key| {
            subjects::tollgate_check(&tollgate, key)
        }));
        runs[1].0.push(slice(&sources[1], &|key| {
            subjects::governor_check(&governor, key)
        }));
        if let Some(retained) = &retained {
            runs[2].0.push(slice(&sources[2], &|key| {
                subjects::governor_check(&retained.limiter, key)
            }));
        }
    }
    runs
}

/// One key, one thread, precise clocks, the direct quota (every check allowed). No
/// `governor_retain` (a direct limiter holds no keys).
fn direct_row(rounds: Rounds) -> Vec<Slices> {
    let rate = regime::DIRECT;
    // The direct checks ignore the key; a flood source only paces the loop.
    let source = Flood::<u64>::new(KeyType::U64);
    let tollgate = Limiter::with_clock(rate.gcra(), QuantaClock::new()).expect("fits");
    let governor = RateLimiter::direct(subjects::governor_quota(rate));
    let mut runs = [Slices::default(), Slices::default()];
    for _ in 0..rounds.count {
        runs[0]
            .0
            .push(regime::run_timed(1, rounds.checks, &source, |_| {
                tollgate.check().allowed()
            }));
        runs[1]
            .0
            .push(regime::run_timed(1, rounds.checks, &source, |_| {
                governor.check().is_ok()
            }));
    }
    runs.into()
}
