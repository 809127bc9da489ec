//! Many threads on one key: the sliding log against GCRA, in one run. Both are keyed limiters
//! on the same quota (100 per 100 ms); the threads (16 by default, on however many cores the
//! machine has) check the same key as fast as they can, every check timed on its own. Prints
//! each round's throughput and tails, then the medians and the log's ratios to GCRA.
//!
//! A third row, `spin`, is the machine's own tail for a check as long as the log's: a wait that
//! touches nothing shared, sized so that it runs at the log's checks a second (measured in the
//! same round). Interrupts (on a VM, the host's) come at a rate per second, so a check as long
//! as another has the same share of them: where the log's p99.9 is the spin's, the machine sets
//! it, not the log. `>1 µs/s` counts the checks over 1 µs per second of the round.
//!
//! ```text
//! cargo run --release --example hot_key [-- THREADS [CHECKS [ROUNDS [LIMIT]]]]
//! ```
//!
//! `CHECKS` is the checks per limiter and round, across all threads (default 16M); rounds
//! alternate GCRA and the log (default 5). The quota is `LIMIT` per `LIMIT` ms (default 100,
//! so 1,000 a second whatever the limit): a log of up to 6 entries is kept in its cell, a
//! longer one in a ring on the heap, which each check reads under an epoch pin.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate::{Algorithm, Gcra, KeyedLimiter, Quota, SlidingLog};
use tollgate_traffic::{human_ns, run_timed, Source, Tails};

/// Every position is the same key.
struct OneKey(AtomicUsize);

impl Source<u64> for OneKey {
    fn advance(&self, n: usize) -> usize {
        // Relaxed: a position counter; nothing is published through it.
        self.0.fetch_add(n, Ordering::Relaxed)
    }

    fn visit<R>(&self, _: usize, f: impl FnOnce(&u64) -> R) -> R {
        f(&7)
    }
}

/// A round's figures: million checks a second, p50, p99, p99.9, p99.99, checks over 1 µs a
/// second, checks allowed.
fn figures(tails: &Tails) -> [f64; 7] {
    let over = tails.checks() - tails.histogram.count_between(0, 1_000);
    [
        tails.checks() as f64 / tails.seconds / 1e6,
        tails.quantile(0.5) as f64,
        tails.quantile(0.99) as f64,
        tails.quantile(0.999) as f64,
        tails.quantile(0.9999) as f64,
        over as f64 / tails.seconds,
        tails.allowed as f64,
    ]
}

/// A check that touches nothing shared: it waits until the CPU's time-stamp counter has moved
/// `ticks` on (a wall-time wait: a loop of arithmetic overlaps the timer's reads and does not
/// grow with its length).
#[inline(never)]
fn spin(clock: &quanta::Clock, ticks: u64) -> bool {
    let end = clock.raw().wrapping_add(ticks);
    while clock.raw() < end {
        std::hint::spin_loop();
    }
    true
}

/// The spin as a check: one function, so that calibrating it and timing it run the same code.
fn spinner(clock: &quanta::Clock, ticks: u64) -> impl Fn(&u64) -> bool + Sync + '_ {
    move |_| spin(clock, ticks)
}

/// The longest spin that runs at no fewer than `mops` million checks a second on `threads`
/// threads, as the log did: no more time per check (timer and loop included), so no larger a
/// share of checks interrupted.
fn spin_ticks_for(
    mops: f64,
    threads: usize,
    checks: u64,
    clock: &quanta::Clock,
    source: &OneKey,
) -> u64 {
    let rate = |ticks| {
        let tails = run_timed(threads, checks, source, spinner(clock, ticks));
        tails.checks() as f64 / tails.seconds / 1e6
    };
    let (mut low, mut high) = (0, 1);
    while rate(high) > mops && high < 1 << 20 {
        (low, high) = (high, high * 2);
    }
    while high - low > 1 {
        let mid = (low + high) / 2;
        if rate(mid) > mops {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
}

/// A fresh keyed limiter of `rule`, its checks timed on the one key.
fn run_keyed<A: Algorithm>(rule: A, threads: usize, checks: u64, source: &OneKey) -> Tails {
    let limiter = KeyedLimiter::<u64, _>::new(rule);
    run_timed(threads, checks, source, |key| {
        limiter.check(key).is_ok_and(|d| d.allowed())
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn arg(i: usize, default: u64) -> u64 {
    match std::env::args().nth(i) {
        None => default,
        Some(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("hot_key: argument {i} must be a whole number, got {text:?}");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let threads = arg(1, 16).max(1) as usize;
    let checks = arg(2, 16_000_000).max(1);
    let rounds = arg(3, 5).max(1) as usize;
    let limit = arg(4, 100).max(1);
    let Ok(quota) = Quota::new(limit, Duration::from_millis(limit)) else {
        eprintln!("hot_key: no quota of {limit} per {limit} ms");
        std::process::exit(2)
    };
    let source = OneKey(AtomicUsize::new(0));
    println!("{threads} threads on one key, {limit} per {limit} ms, {checks} checks a round");
    let (mut gcra, mut log, mut spun) = (Vec::new(), Vec::new(), Vec::new());
    let clock = quanta::Clock::new();
    let print = |label: String, row: &[f64; 7]| {
        let [mops, p50, p99, p999, p9999, over, allowed] = *row;
        println!(
            "{label:>20}: {mops:6.1} M checks/s  p50 {:>8}  p99 {:>8}  p99.9 {:>8}  p99.99 {:>8}  >1 µs/s {over:>7.0}  allowed {allowed:.0}",
            human_ns(p50 as u64),
            human_ns(p99 as u64),
            human_ns(p999 as u64),
            human_ns(p9999 as u64),
        );
    };
    for round in 0..rounds {
        gcra.push(figures(&run_keyed(
            Gcra::new(quota).expect("GCRA"),
            threads,
            checks,
            &source,
        )));
        log.push(figures(&run_keyed(
            SlidingLog::new(quota).expect("log"),
            threads,
            checks,
            &source,
        )));
        let ticks = spin_ticks_for(log[round][0], threads, checks.min(1 << 22), &clock, &source);
        let tails = run_timed(threads, checks, &source, spinner(&clock, ticks));
        spun.push(figures(&tails));
        for (name, runs) in [("gcra", &gcra), ("sliding-log", &log), ("spin", &spun)] {
            print(format!("round {round} {name}"), &runs[round]);
        }
    }
    let medians = |runs: &[[f64; 7]]| -> [f64; 7] {
        std::array::from_fn(|i| median(runs.iter().map(|r| r[i]).collect()))
    };
    let [gcra, log, spun] = [medians(&gcra), medians(&log), medians(&spun)];
    println!("medians of {rounds}:");
    for (name, row) in [("gcra", &gcra), ("sliding-log", &log), ("spin", &spun)] {
        print(name.to_string(), row);
    }
    println!(
        "sliding-log / gcra: throughput {:.2}x, p99.9 {:.2}x; sliding-log / spin: p99.9 {:.2}x",
        log[0] / gcra[0],
        log[3] / gcra[3],
        log[3] / spun[3]
    );
}
