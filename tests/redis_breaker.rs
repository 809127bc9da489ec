//! The guarded limiter's breaker with its defaults against a real `redis-server` this test
//! stops (`SIGSTOP`) under load: a short stall leaves it closed, a long stop opens it, and it
//! closes only after the half-open run of probes.
//!
//! Run with `cargo test --features redis,tokio --test redis_breaker`.

#![cfg(feature = "redis")]

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use tollgate::redis::{
    BreakerState, FailureHandling, FailurePolicy, GuardMode, GuardedLimiter, RedisLimiter,
    RedisRule,
};
use tollgate::Quota;

const TIMEOUT: Duration = Duration::from_millis(50);

/// Checks from `tasks` tasks until `stop`; the longest check, and whether any check saw the
/// limiter degraded or the breaker other than closed.
struct Load {
    stop: Arc<AtomicBool>,
    left_closed: Arc<AtomicBool>,
    slowest_us: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(limiter: &GuardedLimiter, tasks: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let left_closed = Arc::new(AtomicBool::new(false));
        let slowest_us = Arc::new(AtomicU64::new(0));
        let tasks = (0..tasks)
            .map(|task| {
                let (l, stop, left, slowest) = (
                    limiter.clone(),
                    stop.clone(),
                    left_closed.clone(),
                    slowest_us.clone(),
                );
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let key = format!("user{task}-{}", n % 16);
                        let start = Instant::now();
                        l.check(&key)
                            .await
                            .expect("transient failures are absorbed");
                        let took = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
                        slowest.fetch_max(took, Ordering::Relaxed);
                        if l.mode() != GuardMode::Global || l.breaker() != BreakerState::Closed {
                            left.store(true, Ordering::Relaxed);
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            left_closed,
            slowest_us,
            tasks,
        }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("every load task stops when told")
                .expect("no load task panicked");
        }
    }
}

/// Polls `limiter` every 2 ms until `done` holds; fails the test after `within`.
async fn until(
    limiter: &GuardedLimiter,
    within: Duration,
    what: &str,
    done: impl Fn(&GuardedLimiter) -> bool,
) -> Instant {
    let started = Instant::now();
    while !done(limiter) {
        assert!(
            started.elapsed() < within,
            "{what}: not within {within:?} (breaker {:?}, mode {:?})",
            limiter.breaker(),
            limiter.mode()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Instant::now()
}

/// With the default `FailureHandling`: a server stopped for 60 ms under load never takes the
/// node out of `Global` (checks that met the stall were decided by the policy one by one); one
/// stopped for 2 s opens the breaker, and after `SIGCONT` the node stays degraded, half-open,
/// until three probes a quarter of the probe interval apart were answered, then is `Global`.
#[test]
fn a_60_ms_stop_leaves_the_breaker_closed_and_a_2_s_stop_opens_it_until_the_half_open_probes() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::Local);
        let limiter = RedisLimiter::builder(rule)
            .timeout(TIMEOUT)
            .connect(&server.url())
            .await
            .expect("connects")
            .guarded(handling)
            .await;
        assert_eq!(limiter.breaker(), BreakerState::Closed);
        let load = Load::start(&limiter, 4);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !load.left_closed.load(Ordering::Relaxed),
            "closed before the stall"
        );

        // The short stall. `signal` waits for `kill`, so the server is stopped when it returns.
        let stopped = Instant::now();
        tokio::task::block_in_place(|| server.signal("STOP"));
        tokio::time::sleep(Duration::from_millis(60)).await;
        tokio::task::block_in_place(|| server.signal("CONT"));
        let stall = stopped.elapsed();
        // Long enough after it for the breaker to have opened, had the stall opened it.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let slowest = Duration::from_micros(load.slowest_us.load(Ordering::Relaxed));
        eprintln!("60 ms stop: stopped for {stall:?} in all, slowest check {slowest:?}");
        assert!(
            slowest >= TIMEOUT - Duration::from_millis(5),
            "some check met the stall and timed out ({slowest:?})"
        );
        if stall < Duration::from_millis(200) {
            assert!(
                !load.left_closed.load(Ordering::Relaxed),
                "a {stall:?} stall took the node out of Global"
            );
        } else {
            // `open_after` (250 ms) measures the run of failures, about the stall less the
            // timeout: a machine so loaded that `kill` took this long proves nothing here.
            eprintln!("SKIPPED the short-stall assertion: the stall lasted {stall:?}");
        }
        assert_eq!(limiter.mode(), GuardMode::Global);

        // The long stop.
        let stopped = Instant::now();
        tokio::task::block_in_place(|| server.signal("STOP"));
        until(&limiter, Duration::from_secs(2), "open", |l| {
            l.mode() == GuardMode::Degraded(FailurePolicy::Local)
        })
        .await;
        let opened = stopped.elapsed();
        assert_eq!(limiter.breaker(), BreakerState::Open);
        let rest = Duration::from_secs(2).saturating_sub(stopped.elapsed());
        tokio::time::sleep(rest).await;
        assert_eq!(limiter.breaker(), BreakerState::Open, "no probe answered");
        tokio::task::block_in_place(|| server.signal("CONT"));
        let resumed = Instant::now();
        let half_open = until(&limiter, Duration::from_secs(3), "half-open", |l| {
            l.breaker() != BreakerState::Open
        })
        .await;
        let seen = limiter.breaker();
        let closed = until(&limiter, Duration::from_secs(3), "closed", |l| {
            l.breaker() == BreakerState::Closed
        })
        .await;
        eprintln!(
            "2 s stop: opened {opened:?} after the stop; after SIGCONT half-open at {:?}, \
             closed at {:?}",
            half_open - resumed,
            closed - resumed
        );
        assert_eq!(seen, BreakerState::HalfOpen, "half-open before closed");
        // The first probe answered came after SIGCONT, and the next two each a quarter of
        // the probe interval (50 ms) after the one before.
        assert!(
            closed - resumed >= Duration::from_millis(100),
            "closed {:?} after SIGCONT: before three probes could be answered",
            closed - resumed
        );
        assert_eq!(limiter.mode(), GuardMode::Global);
        assert!(limiter.check("after").await.unwrap().allowed());
        load.finish().await;
    });
}
