//! `tollgate bench --redis URL --mode exact|coalesced|leased`: the Redis tier on the user's own
//! Redis.
//!
//! Several processes may run it at once against one key (`--key`); `--json` prints one object
//! per process with `checks`, `admitted`, `round_trips` and `seconds`, so a fleet's totals can
//! be added up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tollgate::redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule};
use tollgate::AlgorithmName;
use tollgate::Quota;

use crate::bench::{BenchArgs, Mode};
use crate::common::Fatal;

struct Tally {
    checks: AtomicU64,
    admitted: AtomicU64,
}

pub fn bench(args: &BenchArgs, url: &str) -> Result<(), Fatal> {
    let algorithm = args
        .algorithm
        .first()
        .copied()
        .unwrap_or(AlgorithmName::Gcra);
    let mut quota = Quota::new(args.limit, args.window)?;
    if let Some(burst) = args.burst.filter(|_| algorithm.has_burst()) {
        quota = quota.with_burst(burst)?;
    }
    let rule = RedisRule::for_algorithm(algorithm, quota)
        .map_err(|e| Fatal(format!("invalid quota for {algorithm}: {e}")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tally = Arc::new(Tally {
        checks: AtomicU64::new(0),
        admitted: AtomicU64::new(0),
    });
    let (seconds, round_trips) = runtime.block_on(async {
        let exact = RedisLimiter::builder(rule)
            .coalesce(args.mode == Mode::Coalesced)
            .connect(url)
            .await
            .map_err(|e| Fatal(format!("redis: {e}")))?;
        match args.mode {
            Mode::Exact => exact_mode(args, exact, &tally).await,
            Mode::Coalesced => {
                let before = evalsha_calls(&exact).await?;
                let (seconds, _) = exact_mode(args, exact.clone(), &tally).await?;
                Ok((seconds, evalsha_calls(&exact).await?.saturating_sub(before)))
            }
            Mode::Leased => leased_mode(args, exact, &tally).await,
        }
    })?;
    let checks = tally.checks.load(Ordering::Relaxed);
    let admitted = tally.admitted.load(Ordering::Relaxed);
    let mode = match args.mode {
        Mode::Exact => "exact",
        Mode::Coalesced => "coalesced",
        Mode::Leased => "leased",
    };
    if args.json {
        println!(
            "{{\"mode\":\"{mode}\",\"algorithm\":\"{algorithm}\",\"key\":{:?},\"checks\":{checks},\"admitted\":{admitted},\"round_trips\":{round_trips},\"seconds\":{seconds:.6}}}",
            args.key
        );
    } else {
        println!(
            "tollgate bench --redis ({mode}, {algorithm}, key {:?}, quota {}/{:?})",
            args.key, args.limit, args.window
        );
        println!(
            "checks {checks}  admitted {admitted}  round trips {round_trips} ({:.4}% of checks)  {seconds:.2} s  {:.0} checks/s",
            100.0 * round_trips as f64 / checks.max(1) as f64,
            checks as f64 / seconds
        );
    }
    Ok(())
}

/// The `EVALSHA` calls the server has counted (`INFO commandstats`), from every client.
async fn evalsha_calls(exact: &RedisLimiter) -> Result<u64, Fatal> {
    let mut conn = exact.connection().clone();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(|e| Fatal(format!("redis INFO: {e}")))?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// `--concurrency` tasks, each awaiting its checks' script calls on the shared connection (one
/// per check, or shared when coalesced).
async fn exact_mode(
    args: &BenchArgs,
    exact: RedisLimiter,
    tally: &Arc<Tally>,
) -> Result<(f64, u64), Fatal> {
    let exact = Arc::new(exact);
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (exact, tally, key) = (exact.clone(), tally.clone(), args.key.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let decision = exact.check_n(&key, 1).await;
                // Relaxed: counters read after every task has been joined.
                tally.checks.fetch_add(1, Ordering::Relaxed);
                if decision.is_ok_and(|d| d.allowed()) {
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Fatal(format!("a bench task failed: {e}")))?;
    }
    let checks = tally.checks.load(Ordering::Relaxed);
    Ok((start.elapsed().as_secs_f64(), checks))
}

/// `--threads` threads checking synchronously against local leases while the runtime refills.
async fn leased_mode(
    args: &BenchArgs,
    exact: RedisLimiter,
    tally: &Arc<Tally>,
) -> Result<(f64, u64), Fatal> {
    let leased = exact
        .leased(
            LeaseConfig::new(),
            FailureHandling::new(FailurePolicy::FailClosed),
        )
        .await
        .map_err(|e| Fatal(format!("leased tier: {e}")))?;
    let leased = Arc::new(leased);
    leased
        .prefetch(&args.key)
        .await
        .map_err(|e| Fatal(format!("redis: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..args.threads.max(1) {
        let (leased, tally, stop, key) = (
            leased.clone(),
            tally.clone(),
            stop.clone(),
            args.key.clone(),
        );
        threads.push(tokio::task::spawn_blocking(move || {
            let (mut checks, mut admitted) = (0u64, 0u64);
            // Relaxed: a stop flag; no data rides on it.
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1024 {
                    checks += 1;
                    admitted += u64::from(leased.check(&key).is_ok_and(|d| d.allowed()));
                }
            }
            tally.checks.fetch_add(checks, Ordering::Relaxed);
            tally.admitted.fetch_add(admitted, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep(args.duration).await;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread
            .await
            .map_err(|e| Fatal(format!("a bench thread failed: {e}")))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    leased.release_all().await;
    Ok((seconds, leased.stats().round_trips))
}
