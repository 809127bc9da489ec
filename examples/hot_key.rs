//! Many threads on one key: the sliding log against GCRA, in one run. Both are keyed limiters
//! on the same quota (100 per 100 ms); the threads (16 by default, on however many cores the
//! machine has) check the same key as fast as they can, every check timed on its own. Prints
//! each round's throughput and tails, then the medians and the log's ratios to GCRA.
//!
//! ```text
//! cargo run --release --example hot_key [-- THREADS [CHECKS [ROUNDS]]]
//! ```
//!
//! `CHECKS` is the checks per limiter and round, across all threads (default 16M); rounds
//! alternate GCRA and the log (default 5).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tollgate::{Gcra, KeyedLimiter, Quota, SlidingLog};
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

/// A round's figures: million checks a second, p50, p99, p99.9.
fn figures(tails: &Tails) -> [f64; 4] {
    [
        tails.checks() as f64 / tails.seconds / 1e6,
        tails.quantile(0.5) as f64,
        tails.quantile(0.99) as f64,
        tails.quantile(0.999) as f64,
    ]
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
    let quota = Quota::new(100, Duration::from_millis(100)).expect("a valid quota");
    let source = OneKey(AtomicUsize::new(0));
    println!("{threads} threads on one key, 100 per 100 ms, {checks} checks a round");
    let (mut gcra, mut log) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (name, runs) in [("gcra", &mut gcra), ("sliding-log", &mut log)] {
            let tails = if name == "gcra" {
                let limiter = KeyedLimiter::<u64, _>::new(Gcra::new(quota).expect("GCRA"));
                run_timed(threads, checks, &source, |key| {
                    limiter.check(key).is_ok_and(|d| d.allowed())
                })
            } else {
                let limiter = KeyedLimiter::<u64, _>::new(SlidingLog::new(quota).expect("log"));
                run_timed(threads, checks, &source, |key| {
                    limiter.check(key).is_ok_and(|d| d.allowed())
                })
            };
            let [mops, p50, p99, p999] = figures(&tails);
            println!(
                "round {round} {name:>12}: {mops:6.1} M checks/s  p50 {:>8}  p99 {:>8}  p99.9 {:>8}  allowed {}",
                human_ns(p50 as u64),
                human_ns(p99 as u64),
                human_ns(p999 as u64),
                tails.allowed
            );
            runs.push(figures(&tails));
        }
    }
    let column = |runs: &[[f64; 4]], i: usize| median(runs.iter().map(|r| r[i]).collect());
    println!("medians of {rounds}:");
    for (name, runs) in [("gcra", &gcra), ("sliding-log", &log)] {
        println!(
            "{name:>12}: {:6.1} M checks/s  p50 {:>8}  p99 {:>8}  p99.9 {:>8}",
            column(runs, 0),
            human_ns(column(runs, 1) as u64),
            human_ns(column(runs, 2) as u64),
            human_ns(column(runs, 3) as u64)
        );
    }
    println!(
        "sliding-log / gcra: throughput {:.2}x, p99.9 {:.2}x",
        column(&log, 0) / column(&gcra, 0),
        column(&log, 3) / column(&gcra, 3)
    );
}
