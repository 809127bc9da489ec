//! Failure handling against a real `redis-server` this test starts and then kills (`kill -9`),
//! hangs (`SIGSTOP`) and revives: no panic, each check is decided by the failure policy once
//! its call times out, the breaker opens ~300 ms into the outage, checks stay fast during it, and global mode is back within 2 s. A leased node's
//! background calls also meet failures planted one call at a time (a connection that fails
//! the call of a chosen grant, charge or return).
//!
//! Run with `cargo test --features redis --test redis_faults`.

#![cfg(feature = "redis")]

#[path = "support/redis_client.rs"]
mod redis_client;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_client::runtime;
use redis_server::RedisServer;
use tollgate::redis::{
    FailureHandling, FailurePolicy, GuardMode, GuardedLimiter, RedisLimiter, RedisRule, TierError,
};
use tollgate::Quota;

const TIMEOUT: Duration = Duration::from_millis(50);
/// `FailureHandling::open_after`'s default.
const OPEN_AFTER: Duration = Duration::from_millis(250);

/// The load tests keep both cores busy and the others time their checks: one test at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

async fn guarded(
    server: &RedisServer,
    rule: RedisRule,
    handling: FailureHandling,
) -> GuardedLimiter {
    RedisLimiter::builder(rule)
        .timeout(TIMEOUT)
        .connect(&server.url())
        .await
        .expect("connects")
        .guarded(handling)
        .await
}

/// One check as the load saw it: when it started, how long it took, and the mode after it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    start: Instant,
    latency: Duration,
    degraded: bool,
}

/// Tasks checking random keys until told to stop; every sample is recorded. A check that
/// returns an error fails the test (transient errors must be absorbed by the policy).
struct Load {
    stop: Arc<AtomicBool>,
    /// Checks made so far, per task.
    checks: Arc<Vec<AtomicU64>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Sample>>>,
}

impl Load {
    fn start(limiter: &GuardedLimiter, tasks: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let checks: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
        let counter = Arc::new(AtomicU64::new(0));
        let tasks = (0..tasks)
            .map(|task| {
                let (l, stop, checks, counter) = (
                    limiter.clone(),
                    stop.clone(),
                    checks.clone(),
                    counter.clone(),
                );
                tokio::spawn(async move {
                    let mut samples = Vec::new();
                    // Until told to stop, not for a number of checks: how many fit in a test's
                    // phases depends on the machine (a degraded check takes ~300 ns in
                    // release). The deadline only bounds the samples of a test gone wrong.
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let key = format!("user{}", counter.fetch_add(1, Ordering::Relaxed) % 64);
                        let start = Instant::now();
                        let result = l.check(&key).await;
                        let latency = start.elapsed();
                        if let Err(e) = result {
                            panic!("a check failed during the fault test: {e}");
                        }
                        let degraded = l.mode() != GuardMode::Global;
                        samples.push(Sample {
                            start,
                            latency,
                            degraded,
                        });
                        checks[task].fetch_add(1, Ordering::Relaxed);
                        // Yield so the load does not starve the runtime's other tasks.
                        tokio::task::yield_now().await;
                    }
                    samples
                })
            })
            .collect();
        Load {
            stop,
            checks,
            tasks,
        }
    }

    /// Checks made so far, per task.
    fn checks(&self) -> Vec<u64> {
        self.checks
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Waits until every task has made `n` checks more than `since` (a [`Load::checks`]
    /// reading) says; fails the test if one has not within `within`.
    async fn wait_for_checks(&self, since: &[u64], n: u64, within: Duration, what: &str) {
        let started = Instant::now();
        loop {
            let now = self.checks();
            if now.iter().zip(since).all(|(now, since)| now - since >= n) {
                return;
            }
            assert!(
                started.elapsed() < within,
                "{what}: not {n} checks per task within {within:?} ({since:?}, then {now:?})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the tasks; every sample, in no particular order.
    async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = Vec::new();
        for task in self.tasks {
            // A check is bounded by the limiter's timeout: a task that does not stop is stuck.
            let task = tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("every load task stops when told");
            samples.extend(task.expect("no load task panicked"));
        }
        samples
    }
}

/// Waits until `limiter` reports `mode`; how long that took.
async fn wait_for(limiter: &GuardedLimiter, mode: GuardMode, within: Duration) -> Duration {
    let started = Instant::now();
    while limiter.mode() != mode {
        assert!(
            started.elapsed() < within,
            "mode {:?} not reached within {within:?} (still {:?})",
            mode,
            limiter.mode()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    assert!(!latencies.is_empty());
    latencies.sort();
    latencies[(latencies.len() * 99).div_ceil(100) - 1]
}

/// The outage checks: samples started during the outage have a p99 latency of at most the
/// timeout more than the same load's p99 before the fault (so the bound is on the timeout,
/// relative to what this machine's scheduling costs, not on speed), and the first degraded
/// sample came within the breaker's opening time (and the same allowance) of the fault.
fn check_outage(samples: &[Sample], fault: Instant, healed: Instant, what: &str) -> Duration {
    let before: Vec<Duration> = samples
        .iter()
        .filter(|s| s.start < fault)
        .map(|s| s.latency)
        .collect();
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.start >= fault && s.start < healed)
        .collect();
    assert!(
        during.len() > 100,
        "{what}: too few checks during the outage ({})",
        during.len()
    );
    let baseline = p99(before);
    let p99 = p99(during.iter().map(|s| s.latency).collect());
    let takeover = during
        .iter()
        .filter(|s| s.degraded)
        .map(|s| s.start + s.latency - fault)
        .min()
        .expect("some check was decided by the policy");
    eprintln!(
        "{what}: {} checks during the outage, p99 latency {p99:?} ({baseline:?} before the fault), policy took over {takeover:?} after the fault",
        during.len()
    );
    // A check waits for its call at most the timeout, then the policy decides at once; the
    // 5 ms are for the timer's resolution.
    let slack = baseline + Duration::from_millis(5);
    assert!(
        p99 <= TIMEOUT + slack,
        "{what}: p99 {p99:?}, {baseline:?} before the fault"
    );
    assert!(
        // Each check falls back the moment its call times out; the breaker (the mode the
        // samples record) opens once the run of failures has lasted `open_after` (250 ms by
        // default), at the next failure after that (one timeout later at most). The margin
        // is for scheduling on a loaded 2-core machine.
        takeover <= TIMEOUT + OPEN_AFTER + TIMEOUT + Duration::from_millis(100) + slack,
        "{what}: the breaker opened {takeover:?} after the fault"
    );
    p99
}

#[test]
fn kill_9_then_restart_under_load_with_the_local_policy() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let rule = RedisRule::fixed_window(Quota::per_second(1_000_000).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::Local)
            .probe_interval(Duration::from_millis(100))
            .heartbeat_interval(Duration::from_millis(200));
        let limiter = guarded(&server, rule, handling).await;
        assert_eq!(limiter.mode(), GuardMode::Global);
        assert_eq!(limiter.live_nodes(), 1);
        let load = Load::start(&limiter, 4);
        tokio::time::sleep(Duration::from_millis(300)).await;

        let fault = Instant::now();
        server.signal("KILL");
        wait_for(
            &limiter,
            GuardMode::Degraded(FailurePolicy::Local),
            Duration::from_secs(1),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(700)).await;

        let healed = Instant::now();
        // The restart blocks (it waits for PING): keep it off the load's worker.
        tokio::task::block_in_place(|| server.restart());
        let back = wait_for(&limiter, GuardMode::Global, Duration::from_secs(2)).await;
        let recovered = Instant::now();
        let at_recovery = load.checks();
        eprintln!("kill -9: global again {back:?} after the restart");
        // The load stops once it has checked for a while after the recovery, however many
        // checks the outage took.
        tokio::time::sleep(Duration::from_millis(200)).await;
        const AFTER: u64 = 100;
        load.wait_for_checks(
            &at_recovery,
            AFTER,
            Duration::from_secs(5),
            "checks after the recovery",
        )
        .await;
        let samples = load.finish().await;
        check_outage(&samples, fault, healed, "kill -9");
        let after: Vec<&Sample> = samples.iter().filter(|s| s.start > recovered).collect();
        // One check per task may have begun just before the recovery was seen.
        assert!(
            after.len() as u64 >= 4 * (AFTER - 1),
            "checks went on after the recovery: {} began after it",
            after.len()
        );
        assert!(
            after.iter().any(|s| !s.degraded),
            "some check after the recovery found global mode"
        );
        drop(server);
    });
}

#[test]
fn sigstop_then_sigcont_under_load_with_fail_closed() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::FailClosed)
            .probe_interval(Duration::from_millis(100));
        let limiter = guarded(&server, rule, handling).await;
        let load = Load::start(&limiter, 4);
        tokio::time::sleep(Duration::from_millis(300)).await;

        let fault = Instant::now();
        server.signal("STOP");
        wait_for(
            &limiter,
            GuardMode::Degraded(FailurePolicy::FailClosed),
            Duration::from_secs(1),
        )
        .await;
        // Fail closed: every check is denied, with a retry hint.
        let d = limiter.check("probe").await.unwrap();
        assert!(!d.allowed() && d.retry_after() == Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(700)).await;

        let healed = Instant::now();
        server.signal("CONT");
        let back = wait_for(&limiter, GuardMode::Global, Duration::from_secs(2)).await;
        eprintln!("SIGSTOP: global again {back:?} after SIGCONT");
        assert!(limiter.check("probe").await.unwrap().allowed());
        let samples = load.finish().await;
        check_outage(&samples, fault, healed, "SIGSTOP");
    });
}

#[test]
fn fail_open_allows_and_fatal_errors_pass_through() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let rule = RedisRule::sliding_log(Quota::per_minute(2).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::FailOpen)
            .failure_threshold(1)
            .probe_interval(Duration::from_millis(50));
        let limiter = guarded(&server, rule, handling).await;
        // A fatal error is not an outage: returned as it is, the breaker stays closed.
        let key = limiter.exact().redis_key("list");
        let mut conn = limiter.exact().connection().clone();
        let _: () = redis::cmd("RPUSH")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        let e = limiter.check("list").await.unwrap_err();
        assert!(matches!(e, TierError::WrongType { .. }));
        assert_eq!(limiter.mode(), GuardMode::Global);
        // A cost above the capacity stays an error in every mode.
        assert!(matches!(
            limiter.check_n("k", 3).await,
            Err(TierError::Capacity { .. })
        ));
        for _ in 0..2 {
            assert!(limiter.check("k").await.unwrap().allowed());
        }
        assert!(!limiter.check("k").await.unwrap().allowed());
        server.signal("STOP");
        // The first check waits for the timeout, then the policy answers; later ones at once.
        for _ in 0..5 {
            assert!(limiter.check("k").await.unwrap().allowed());
        }
        assert_eq!(limiter.mode(), GuardMode::Degraded(FailurePolicy::FailOpen));
        assert!(matches!(
            limiter.check_n("k", 3).await,
            Err(TierError::Capacity { .. })
        ));
        server.signal("CONT");
        wait_for(&limiter, GuardMode::Global, Duration::from_secs(2)).await;
        assert!(
            !limiter.check("k").await.unwrap().allowed(),
            "the global state is intact"
        );
    });
}

#[test]
fn local_policy_gives_each_live_node_its_share() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let rule = RedisRule::fixed_window(Quota::per_hour(10).unwrap()).unwrap();
        // Heartbeats expire after three intervals: long enough here that a beat delayed by a
        // loaded machine does not make a live node look gone.
        let handling = FailureHandling::new(FailurePolicy::Local)
            .failure_threshold(1)
            .probe_interval(Duration::from_millis(50))
            .heartbeat_interval(Duration::from_millis(250));
        let a = guarded(&server, rule, handling).await;
        let b = guarded(&server, rule, handling).await;
        let c = guarded(&server, rule, handling).await;
        // Three nodes beat; then one leaves and the other two see it at their next beat.
        let started = Instant::now();
        while a.live_nodes() != 3 || b.live_nodes() != 3 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "heartbeats did not meet"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        c.leave().await;
        drop(c);
        let started = Instant::now();
        while a.live_nodes() != 2 || b.live_nodes() != 2 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the leaving node was counted"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.signal("STOP");
        // Each of the two nodes now admits its share, ⌊10 / 2⌋ = 5, of a fresh key.
        let _ = a.check("warm-up").await.unwrap();
        let _ = b.check("warm-up").await.unwrap();
        assert_eq!(a.mode(), GuardMode::Degraded(FailurePolicy::Local));
        assert_eq!(b.mode(), GuardMode::Degraded(FailurePolicy::Local));
        for node in [&a, &b] {
            let mut admitted = 0;
            for _ in 0..20 {
                admitted += node.check("shared").await.unwrap().allowed() as u32;
            }
            assert_eq!(admitted, 5);
        }
        server.signal("CONT");
        wait_for(&a, GuardMode::Global, Duration::from_secs(2)).await;
    });
}

/// Waits, if needed, until the wall clock (the server's on this machine) is at least `margin`
/// away from the end of its current window of `window`, so that a test's checks all land in one
/// epoch-aligned window.
fn away_from_a_window_end(window: Duration, margin: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let left = window.as_nanos() - now % window.as_nanos();
    if left < margin.as_nanos() {
        std::thread::sleep(Duration::from_nanos(left as u64) + Duration::from_millis(10));
    }
}

/// Waits for the charges of a recovery to land: global mode, and nothing left to reconcile.
/// `within` is a deadline against a recovery that never comes, tens of probe intervals long,
/// not a claim on speed.
async fn wait_reconciled(limiter: &GuardedLimiter, within: Duration) {
    let started = Instant::now();
    while limiter.mode() != GuardMode::Global || limiter.unreconciled() > 0 {
        assert!(
            started.elapsed() < within,
            "not reconciled within {within:?}: mode {:?}, {} units owed",
            limiter.mode(),
            limiter.unreconciled()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn units_admitted_locally_during_an_outage_are_charged_after_the_restart() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let quota = Quota::per_hour(100).unwrap();
        for rule in [
            RedisRule::fixed_window(quota).unwrap(),
            RedisRule::sliding_window(quota).unwrap(),
            RedisRule::gcra(quota).unwrap(),
            RedisRule::leaky_queue(quota).unwrap(),
            RedisRule::sliding_log(quota).unwrap(),
        ] {
            let name = rule.name();
            tokio::task::block_in_place(|| {
                away_from_a_window_end(Duration::from_secs(3600), Duration::from_secs(20))
            });
            let handling = FailureHandling::new(FailurePolicy::Local)
                .probe_interval(Duration::from_millis(20))
                .reconcile(true);
            let limiter = guarded(&server, rule, handling).await;
            for _ in 0..10 {
                assert!(limiter.check("k").await.unwrap().allowed());
            }
            assert_eq!(
                limiter.unreconciled(),
                0,
                "{name}: nothing owed while global"
            );

            server.signal("KILL");
            // The first check meets the outage (and is decided by the policy); all are local.
            let mut local = 0;
            for _ in 0..25 {
                local += limiter.check_n("k", 1).await.unwrap().allowed() as u64;
            }
            let _ = limiter.check("other").await.unwrap();
            assert_eq!(limiter.mode(), GuardMode::Degraded(FailurePolicy::Local));
            assert_eq!(
                local, 25,
                "{name}: the local share (one node: all of L) admits"
            );
            assert_eq!(limiter.unreconciled(), 26, "{name}");

            // The restarted server is empty: what it knows after the recovery is the charges.
            tokio::task::block_in_place(|| server.restart());
            wait_reconciled(&limiter, Duration::from_secs(5)).await;
            assert_eq!(limiter.reconciled(), 26, "{name}: every unit was charged");
            let remaining = limiter.exact().peek("k", 0).await.unwrap().remaining();
            assert_eq!(
                remaining,
                100 - 25,
                "{name}: the global state shows the charge"
            );
            assert_eq!(
                limiter.exact().peek("other", 0).await.unwrap().remaining(),
                99,
                "{name}"
            );
            eprintln!("{name}: 26 units admitted locally were charged after the restart");
        }
    });
}

#[test]
fn a_charge_is_never_denied_and_may_pass_the_limit() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let quota = Quota::per_hour(5).unwrap();
        for rule in [
            RedisRule::fixed_window(quota).unwrap(),
            RedisRule::sliding_log(quota).unwrap(),
        ] {
            let name = rule.name();
            tokio::task::block_in_place(|| {
                away_from_a_window_end(Duration::from_secs(3600), Duration::from_secs(20))
            });
            let handling = FailureHandling::new(FailurePolicy::FailOpen)
                .failure_threshold(1)
                .probe_interval(Duration::from_millis(20))
                .reconcile(true);
            let limiter = guarded(&server, rule, handling).await;
            for _ in 0..3 {
                assert!(limiter.check("k").await.unwrap().allowed());
            }
            // Hung, not killed: the state written before the outage stays.
            server.signal("STOP");
            for _ in 0..6 {
                assert!(limiter.check("k").await.unwrap().allowed(), "fail open");
            }
            assert_eq!(limiter.mode(), GuardMode::Degraded(FailurePolicy::FailOpen));
            server.signal("CONT");
            wait_reconciled(&limiter, Duration::from_secs(5)).await;
            assert_eq!(limiter.reconciled(), 6, "{name}");
            // 3 + 6 units for a limit of 5: the state passed the limit, and the key is denied,
            // with figures computed as ever. The check that met the outage timed out, but its
            // call was queued on the connection and the server ran it after SIGCONT: it may be
            // counted twice (never less than once).
            let mut conn = limiter.exact().connection().clone();
            let key = limiter.exact().redis_key("k");
            let count: u64 = if name == "fixed-window" {
                let state: String = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                state.rsplit(' ').next().unwrap().parse().unwrap()
            } else {
                // The newest entry's score is the number of units the log holds.
                let newest: Vec<String> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(-1)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                newest[0].split(':').next().unwrap().parse().unwrap()
            };
            assert!(
                (9..=10).contains(&count),
                "{name}: 9 or 10 units, not {count}"
            );
            let d = limiter.check("k").await.unwrap();
            assert!(!d.allowed() && d.remaining() == 0, "{name}: {d:?}");
            assert!(
                d.retry_after() <= Duration::from_secs(3600),
                "{name}: {d:?}"
            );
        }
    });
}

/// Every charge token on `server` (`…:charge:…` keys) with its PTTL in ms, read with a plain
/// connection of the test's own.
async fn charge_tokens(server: &RedisServer) -> Vec<(String, i64)> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:charge:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        tokens.push((key, pttl));
    }
    tokens
}

/// A charge's token lives only as long as the same charge, sent again, could still count: to
/// the end of its units' window (the next one for the sliding window counter), a sliding
/// log's window from its units' time, a GCRA charge's debt. A charge that counted nothing
/// (its units' window over by the recovery) leaves no token.
#[test]
fn charge_tokens_live_no_longer_than_the_charge_could_count() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let hour = Quota::per_hour(100).unwrap();
        let second = Quota::per_second(5).unwrap();
        let h = Duration::from_secs(3_600);
        // The rule, and the longest its tokens may live (`None`: the units are over a window
        // old at the recovery, so no token may be left).
        let cases = [
            (RedisRule::fixed_window(hour).unwrap(), Some(h)),
            (RedisRule::sliding_window(hour).unwrap(), Some(2 * h)),
            // 10 units of 36 s each.
            (RedisRule::gcra(hour).unwrap(), Some(Duration::from_secs(360))),
            (RedisRule::sliding_log(hour).unwrap(), Some(h)),
            (RedisRule::fixed_window(second).unwrap(), None),
            (RedisRule::sliding_window(second).unwrap(), None),
            (RedisRule::sliding_log(second).unwrap(), None),
        ];
        for (rule, horizon) in cases {
            let name = rule.name();
            tokio::task::block_in_place(|| {
                away_from_a_window_end(Duration::from_secs(3_600), Duration::from_secs(20))
            });
            let handling = FailureHandling::new(FailurePolicy::Local)
                .probe_interval(Duration::from_millis(20))
                .reconcile(true);
            let limiter = guarded(&server, rule, handling).await;
            server.signal("KILL");
            let mut local = 0;
            for _ in 0..10 {
                local += limiter.check("k").await.unwrap().allowed() as u64;
            }
            assert!(local > 0, "{name}: the local share admits");
            if horizon.is_none() {
                // Two windows of a second and more: the units' windows are over.
                tokio::time::sleep(Duration::from_millis(2_500)).await;
            }
            tokio::task::block_in_place(|| server.restart());
            wait_reconciled(&limiter, Duration::from_secs(5)).await;
            let tokens = charge_tokens(&server).await;
            eprintln!(
                "{name}: {} units charged, tokens (key, PTTL ms): {tokens:?}",
                limiter.reconciled()
            );
            match horizon {
                None => {
                    assert_eq!(limiter.reconciled(), 0, "{name}: nothing left to count");
                    assert!(tokens.is_empty(), "{name}: a charge of no units left {tokens:?}");
                }
                Some(horizon) => {
                    assert_eq!(limiter.reconciled(), local, "{name}");
                    assert!(!tokens.is_empty(), "{name}: the charge keeps its token");
                    for (key, pttl) in &tokens {
                        assert!(
                            *pttl > 0 && *pttl as u128 <= horizon.as_millis(),
                            "{name}: {key} lives {pttl} ms, past the {horizon:?} a resend could count in"
                        );
                    }
                }
            }
        }
    });
}

/// The times of a sliding log's entries on `server` (ns since the epoch), oldest first by
/// score, and the units it holds (the newest entry's score).
async fn log_entries(server: &RedisServer, key: &[u8]) -> (Vec<u64>, u64) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |m: &String, i: usize| -> u64 { m.split(':').nth(i).unwrap().parse().unwrap() };
    let units = members.last().map_or(0, |m| field(m, 0));
    (members.iter().map(|m| field(m, 2)).collect(), units)
}

/// A sliding-log key admitted locally during an outage is admitted again by Redis once a
/// window has passed since those admissions, not a window after the recovery nor after the
/// outage's last admission: each part of the outage's units is charged at its own time (at
/// most a sixteenth of a window late), inserted before what Redis admitted meanwhile.
#[test]
fn a_sliding_log_charge_lands_where_its_units_were_admitted() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let window = Duration::from_secs(4);
        let rule = RedisRule::sliding_log(Quota::new(4, window).unwrap()).unwrap();
        // All the outage's admissions in one window of the node's (which the old ledger
        // lumped at the newest).
        tokio::task::block_in_place(|| away_from_a_window_end(window, Duration::from_secs(2)));
        let handling = FailureHandling::new(FailurePolicy::Local)
            .probe_interval(Duration::from_millis(400))
            .reconcile(true);
        let limiter = guarded(&server, rule, handling).await;
        let other = RedisLimiter::builder(rule)
            .timeout(Duration::from_secs(1))
            .connect(&server.url())
            .await
            .expect("connects");
        server.signal("KILL");
        for _ in 0..2 {
            assert!(limiter.check("k").await.unwrap().allowed(), "local");
        }
        let first = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..2 {
            assert!(limiter.check("k").await.unwrap().allowed(), "local");
        }
        assert_eq!(limiter.unreconciled(), 4);
        tokio::task::block_in_place(|| server.restart());
        // Another node admits the key through the restarted Redis before this one's probe
        // finds it: its entry is newer than the charges to come.
        let started = Instant::now();
        loop {
            match other.check("k").await {
                Ok(d) => {
                    assert!(d.allowed(), "{d:?}");
                    break;
                }
                Err(e) => assert!(started.elapsed() < Duration::from_secs(2), "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let charges_pending = limiter.unreconciled() > 0;
        wait_reconciled(&limiter, Duration::from_secs(3)).await;
        let (times, units) = log_entries(&server, &limiter.exact().redis_key("k")).await;
        eprintln!(
            "log after the charges ({} ms after the first local admissions): {times:?}, {units} \
             units; charged after the other node's admission: {charges_pending}",
            first.elapsed().as_millis()
        );
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");
        assert_eq!(units, 5, "4 charged, 1 admitted by the other node");
        // The other node's admission is the newest entry: the charges went in before it, at
        // their own times.
        assert!(times[0] < times[times.len() - 1], "{times:?}");
        // A window after the first local admissions (and a little: the charge is at most
        // W/16 late), they have expired: 3 units live of 4.
        let due = first + window + window / 16 + Duration::from_millis(100);
        tokio::time::sleep_until(due.into()).await;
        let d = limiter.check("k").await.unwrap();
        eprintln!(
            "checked {} ms after the first local admissions: {d:?}",
            first.elapsed().as_millis()
        );
        assert!(
            d.allowed(),
            "refused a window after the local admissions (charged too late): {d:?}"
        );
    });
}

/// `FailOpen` admits without bound during an outage; the GCRA charge after it owes at most the
/// burst (`B·T` of debt), so the key is denied for at most about `B·T + T`, not until every
/// unit admitted has drained (here 1,000 units of 6 s: 100 minutes).
#[test]
fn a_fail_open_gcra_charge_owes_at_most_the_burst() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        // 10 a minute: T = 6 s, B·T = 60 s.
        let rule = RedisRule::gcra(Quota::per_minute(10).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::FailOpen)
            .failure_threshold(1)
            .probe_interval(Duration::from_millis(20))
            .reconcile(true);
        let limiter = guarded(&server, rule, handling).await;
        server.signal("STOP");
        for _ in 0..1_000 {
            assert!(limiter.check("k").await.unwrap().allowed(), "fail open");
        }
        server.signal("CONT");
        wait_reconciled(&limiter, Duration::from_secs(5)).await;
        let d = limiter.check("k").await.unwrap();
        eprintln!("{} units charged; then {d:?}", limiter.reconciled());
        assert!(
            limiter.reconciled() <= 10,
            "{} units charged",
            limiter.reconciled()
        );
        assert!(!d.allowed(), "{d:?}");
        // The charge's B·T on top of what Redis counted itself (the check that met the
        // outage, run once the server resumed): denied B·T + T at most.
        assert!(d.retry_after() <= Duration::from_secs(66), "{d:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// The leased tier's takeover: degraded checks go straight to the local share, which
// starts each key from what the node last knew; reconciliation charges each unit once.

use tollgate::redis::{LeaseConfig, LeasedLimiter};

/// A leased node with the `Local` policy on its own connection.
async fn leased_local(
    server: &RedisServer,
    rule: RedisRule,
    config: LeaseConfig,
    handling: FailureHandling,
) -> LeasedLimiter {
    RedisLimiter::builder(rule)
        .timeout(TIMEOUT)
        .connect(&server.url())
        .await
        .expect("connects")
        .leased(config, handling)
        .await
        .expect("a leasable rule")
}

/// Waits (without checking: a check would ask for refills) until `node` reports `mode`.
fn wait_mode(node: &LeasedLimiter, mode: GuardMode, within: Duration) {
    let start = Instant::now();
    while node.mode() != mode {
        assert!(start.elapsed() < within, "not {mode:?} within {within:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_leased_takeover_starts_from_what_the_node_knew_and_charges_each_unit_once() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(2);
    // Per day: nothing refills during the test, so every count below is exact.
    let rule = RedisRule::gcra(Quota::new(1_000, Duration::from_secs(86_400)).unwrap()).unwrap();
    let handling = FailureHandling::new(FailurePolicy::Local)
        .probe_interval(Duration::from_millis(20))
        .heartbeat_interval(Duration::from_millis(250))
        .reconcile(true);
    // Idle keys are not given back during the test (a given-back lease is no longer known).
    let config = LeaseConfig::new()
        .max_lease(100)
        .idle_timeout(Duration::from_secs(60));
    let node = rt.block_on(async {
        let node = leased_local(&server, rule, config, handling).await;
        // Another node spent 900 of the key's 1000 before this one asked.
        let spent = node.exact().check_n("k", 900).await.unwrap();
        assert!(spent.allowed());
        node.prefetch("k").await.unwrap();
        node
    });
    let held = node.held("k");
    assert!(held > 0 && held <= 100, "a first lease: {held}");
    // A few units spent while Redis answers.
    for _ in 0..3 {
        assert!(node.check("k").unwrap().allowed());
    }
    let held = held - 3;
    server.signal("KILL");
    // The heartbeat finds the server gone: the breaker opens without a check.
    wait_mode(
        &node,
        GuardMode::Degraded(FailurePolicy::Local),
        Duration::from_secs(2),
    );
    assert_eq!(node.held("k"), held, "no check spent the lease meanwhile");
    // The local share starts from what the node knew: the units it held, plus what the global
    // state could still grant at its last grant (100 − the lease), not from a full bucket.
    let mut local = 0;
    while node.check("k").unwrap().allowed() {
        local += 1;
        assert!(local <= 1_000, "the local share never ran out");
    }
    assert_eq!(local, 100 - 3, "what the global state still admitted");
    assert_eq!(node.held("k"), 0, "the lease was handed over");
    // A key the node never saw starts from the node's share (one live node: all of it).
    let mut fresh = 0;
    while node.check("fresh").unwrap().allowed() {
        fresh += 1;
        assert!(fresh <= 1_000);
    }
    assert_eq!(fresh, 1_000);
    // The handed-over units were granted before the outage: they are not owed again.
    assert_eq!(node.unreconciled(), (local - held) + fresh);
    server.restart();
    let healed = Instant::now();
    while node.mode() != GuardMode::Global || node.unreconciled() > 0 {
        assert!(healed.elapsed() < Duration::from_secs(2), "not reconciled");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(node.reconciled(), (local - held) + fresh, "each unit once");
    // The restarted server is empty: it holds exactly the charges.
    let left = rt
        .block_on(node.exact().peek("fresh", 0))
        .unwrap()
        .remaining();
    assert_eq!(left, 0);
    let left = rt.block_on(node.exact().peek("k", 0)).unwrap().remaining();
    assert_eq!(left, 1_000 - (local - held));
    println!(
        "takeover: held {held}, admitted {local} locally for a known key, {fresh} for a fresh \
         one; charged {} after {:?}",
        node.reconciled(),
        healed.elapsed()
    );
    drop(node);
    drop(rt);
}

/// `N` leased nodes (each its own runtime, connection and checking thread) keep every one of
/// 16 keys hot; Redis gets `signal`. The fleet's admissions per key in the outage's first
/// 250 ms stay within the bound documented on `LeasedLimiter` ("When Redis fails"), with the
/// handover delay and the age of the last grant measured here; then global mode is back.
/// The window of a window rule must not end during the test (see [`day_windows`]).
fn takeover_under_load(signal: &str, heal: &str, (rule, limit, window): Limit) {
    const NODES: usize = 2;
    const KEYS: usize = 16;
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let handling = FailureHandling::new(FailurePolicy::Local)
        .probe_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(250))
        .assumed_nodes(NODES as u64)
        .reconcile(true);
    let config = LeaseConfig::new();
    let runtimes: Vec<_> = (0..NODES).map(|_| runtime(2)).collect();
    let nodes: Vec<LeasedLimiter> = runtimes
        .iter()
        .map(|rt| rt.block_on(leased_local(&server, rule, config, handling)))
        .collect();
    let max_lease = nodes[0].max_lease();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, stop) = (node.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut admitted: Vec<(usize, Instant)> = Vec::new();
                let mut degraded: Option<Instant> = None;
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % KEYS;
                    i += 1;
                    let decision = node.check(format!("key-{key}")).expect("no error");
                    let at = Instant::now();
                    if decision.allowed() {
                        admitted.push((key, at));
                    }
                    if degraded.is_none() && node.mode() != GuardMode::Global {
                        degraded = Some(at);
                    }
                }
                (admitted, degraded)
            })
        })
        .collect();
    // Every key hot, and every node counted by the other's heartbeat.
    std::thread::sleep(Duration::from_millis(1_000));
    let fault = Instant::now();
    server.signal(signal);
    std::thread::sleep(Duration::from_millis(800));
    let healed = Instant::now();
    heal_with(&mut server, heal);
    for node in &nodes {
        wait_mode(node, GuardMode::Global, Duration::from_secs(2));
    }
    let back = healed.elapsed();
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Reconciliation: what the shares admitted beyond the handed-over leases is charged once
    // (never more than was admitted from the outage on), soon after the recovery.
    for node in &nodes {
        while node.unreconciled() > 0 {
            assert!(healed.elapsed() < Duration::from_secs(4), "not reconciled");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let charged: u64 = nodes.iter().map(LeasedLimiter::reconciled).sum();
    // The outage, for the nodes, began when one first left global mode: at the fault, or
    // before it if a call timed out on a loaded machine (CI runs these tests in debug builds
    // beside other jobs; one did, and its local admission was charged but not counted here).
    let began = seen
        .iter()
        .filter_map(|(_, degraded)| *degraded)
        .fold(fault, Instant::min);
    // Counted to the end, not to the recovery: after it, a first touch spends its provisional
    // allowance before its first grant, and a grant that fails (the restarted server slow to
    // answer on a loaded machine) leaves those units to be charged too (CI saw one unit so).
    let in_outage = seen
        .iter()
        .flat_map(|(admitted, _)| admitted)
        .filter(|(_, at)| *at >= began)
        .count() as u64;
    assert!(
        charged <= in_outage,
        "charged {charged} > {in_outage} admitted from the outage on"
    );

    let first = Duration::from_millis(250);
    // How long each node took to notice, and the age of its last grant at the fault (at most
    // a refill's backoff, the horizon, plus one timeout).
    let noticed = seen
        .iter()
        .map(|(_, degraded)| degraded.expect("the node degraded") - fault)
        .max()
        .unwrap();
    let last_grant = Duration::from_millis(50) + TIMEOUT;
    let per_ns = limit as f64 / window.as_nanos() as f64;
    let accrues = |d: Duration| (d.as_nanos() as f64 * per_ns).ceil() as u64;
    // H (≤ N·M held at the fault) + Σ ⌊v_i ÷ N⌋ (≤ what accrued since the last grant: the
    // keys are hot, the bucket is empty) + N·(1 + ⌊L/N⌋·Δ/W).
    let bound =
        NODES as u64 * max_lease + accrues(noticed + last_grant) + NODES as u64 + accrues(first);
    let mut per_key = [0u64; KEYS];
    for (admitted, _) in &seen {
        for &(key, at) in admitted {
            if at >= fault && at < fault + first {
                per_key[key] += 1;
            }
        }
    }
    let fresh_buckets = limit + accrues(first);
    println!(
        "leased {} {signal}: per key in the outage's first {first:?}: max {} (bound {bound}; a fresh \
         bucket per node would allow {fresh_buckets}); nodes degraded within {noticed:?}; \
         global again {back:?} after {heal}; {charged} of {in_outage} units admitted from \
         the outage on charged after it",
        rule.name(),
        per_key.iter().max().unwrap()
    );
    for (key, &admitted) in per_key.iter().enumerate() {
        assert!(
            admitted <= bound,
            "key-{key}: {admitted} admitted in the first {first:?} > bound {bound}"
        );
    }
    assert!(back < Duration::from_secs(2));
    drop(nodes);
    drop(runtimes);
}

/// Ends an outage: `restart` after `kill -9`, else the signal `heal` (`CONT` after `STOP`).
fn heal_with(server: &mut RedisServer, heal: &str) {
    if heal == "restart" {
        server.restart();
    } else {
        server.signal(heal);
    }
}

/// A rule of the takeover tests, with the `limit` it allows per `window`.
type Limit = (RedisRule, u64, Duration);

/// GCRA 1000/s, burst 1000.
fn per_second_gcra() -> Limit {
    let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
    (rule, 1_000, Duration::from_secs(1))
}

/// Fixed and sliding windows of 1000 a day: no window ends during a test (the share's windows
/// are the node's clock's, not the server's, so a shorter one could end inside the first 250
/// ms and start a fresh share the bounds do not count).
fn day_windows() -> [Limit; 2] {
    let window = Duration::from_secs(86_400);
    let quota = Quota::new(1_000, window).unwrap();
    [
        (RedisRule::fixed_window(quota).unwrap(), 1_000, window),
        (RedisRule::sliding_window(quota).unwrap(), 1_000, window),
    ]
}

#[test]
fn kill_9_under_load_leased_nodes_take_over_without_a_burst() {
    let _serial = serial();
    takeover_under_load("KILL", "restart", per_second_gcra());
}

#[test]
fn sigstop_under_load_leased_nodes_take_over_without_a_burst() {
    let _serial = serial();
    takeover_under_load("STOP", "CONT", per_second_gcra());
}

/// Leased window rules start their share's window from the same `s_i`.
#[test]
fn kill_9_under_load_leased_windows_take_over_without_a_burst() {
    let _serial = serial();
    for limit in day_windows() {
        takeover_under_load("KILL", "restart", limit);
    }
}

/// What one guarded node saw under load: its admissions (key, when), and per key the last
/// decision it had before the fault (units remaining, when its check was sent).
struct GuardedNode {
    admitted: Vec<(usize, Instant)>,
    last: Vec<Option<(u64, Instant)>>,
}

/// `N` guarded nodes (each its own runtime, connection and checking task) keep every one of
/// a few keys hot; Redis gets `signal`. Each node's share starts each key from `⌊r / n⌋` of
/// the last reply it had (`FailurePolicy::Local`), not from a full bucket, so the fleet's
/// admissions per key in the outage's first 250 ms stay within
/// `Σ_nodes (⌊r_i / n⌋ + ⌈(fault + 250 ms − t_i) · ⌊L/n⌋ / W⌉ + 2)`, with `r_i` the node's last
/// reply before the fault and `t_i` when its check was sent (the 2: the share's rounding, and a
/// reply that arrived as the server died); then global mode is back. The window of a window
/// rule must not end during the test (see [`day_windows`]).
fn guarded_takeover_under_load(signal: &str, heal: &str, (rule, limit, window): Limit) {
    const NODES: usize = 2;
    const KEYS: usize = 2;
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let handling = FailureHandling::new(FailurePolicy::Local)
        .probe_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(250));
    let runtimes: Vec<_> = (0..NODES).map(|_| runtime(2)).collect();
    let nodes: Vec<GuardedLimiter> = runtimes
        .iter()
        .map(|rt| rt.block_on(guarded(&server, rule, handling)))
        .collect();
    // Every bucket empty from the start: the keys stay hot (demand above the rate).
    runtimes[0].block_on(async {
        for key in 0..KEYS {
            assert!(nodes[0]
                .check_n(format!("key-{key}"), limit)
                .await
                .unwrap()
                .allowed());
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let fault_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let tasks: Vec<_> = nodes
        .iter()
        .zip(&runtimes)
        .map(|(node, rt)| {
            let (node, stop, fault_at) = (node.clone(), stop.clone(), fault_at.clone());
            rt.spawn(async move {
                let mut seen = GuardedNode {
                    admitted: Vec::new(),
                    last: vec![None; KEYS],
                };
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % KEYS;
                    i += 1;
                    // The reply's share accrues from when the node read it, between the send
                    // and `at`: a loaded runtime resumes this task tens of ms later, so the
                    // bound takes the send.
                    let sent = Instant::now();
                    let decision = node.check(format!("key-{key}")).await.expect("no error");
                    let at = Instant::now();
                    if decision.allowed() {
                        seen.admitted.push((key, at));
                    }
                    if fault_at.lock().unwrap().is_none_or(|fault| at < fault) {
                        seen.last[key] = Some((decision.remaining(), sent));
                    }
                    // Degraded checks never await: let the breaker's probe run.
                    tokio::task::yield_now().await;
                }
                seen
            })
        })
        .collect();
    // Every key hot, and every node counted by the others' heartbeats (waited for, not assumed
    // after the warm-up: a loaded machine may delay a beat).
    std::thread::sleep(Duration::from_millis(1_000));
    let started = Instant::now();
    loop {
        let live: Vec<u64> = nodes.iter().map(GuardedLimiter::live_nodes).collect();
        if live.iter().all(|&n| n == NODES as u64) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "live nodes {live:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let fault = Instant::now();
    *fault_at.lock().unwrap() = Some(fault);
    server.signal(signal);
    std::thread::sleep(Duration::from_millis(800));
    let healed = Instant::now();
    heal_with(&mut server, heal);
    for (node, rt) in nodes.iter().zip(&runtimes) {
        rt.block_on(wait_for(node, GuardMode::Global, Duration::from_secs(2)));
    }
    let back = healed.elapsed();
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<GuardedNode> = tasks
        .into_iter()
        .zip(&runtimes)
        .map(|(task, rt)| rt.block_on(task).expect("no node task panicked"))
        .collect();

    let first = Duration::from_millis(250);
    let share = limit / NODES as u64;
    let accrues =
        |d: Duration| (d.as_nanos() * u128::from(share)).div_ceil(window.as_nanos()) as u64;
    let mut per_key = Vec::new();
    for key in 0..KEYS {
        let admitted = seen
            .iter()
            .flat_map(|node| &node.admitted)
            .filter(|&&(k, at)| k == key && at >= fault && at < fault + first)
            .count() as u64;
        let bound: u64 = seen
            .iter()
            .map(|node| {
                let (remaining, at) = node.last[key].expect("the node checked every key");
                remaining / NODES as u64 + accrues(fault + first - at) + 2
            })
            .sum();
        assert!(
            admitted <= bound,
            "key-{key}: {admitted} admitted in the outage's first {first:?} > bound {bound}"
        );
        per_key.push((admitted, bound));
    }
    let worst = per_key.into_iter().max().expect("keys were checked");
    // What a full bucket per node would allow: the burst this test guards against.
    let fresh = NODES as u64 * (share + accrues(first));
    println!(
        "guarded {} {signal}: per key in the outage's first {first:?}: max {} (bound {}; a \
         fresh share per node would allow {fresh}); global again {back:?} after {heal}",
        rule.name(),
        worst.0,
        worst.1
    );
    assert!(back < Duration::from_secs(2));
    drop(nodes);
    drop(runtimes);
}

#[test]
fn kill_9_under_load_guarded_nodes_take_over_without_a_burst() {
    let _serial = serial();
    guarded_takeover_under_load("KILL", "restart", per_second_gcra());
}

#[test]
fn sigstop_under_load_guarded_nodes_take_over_without_a_burst() {
    let _serial = serial();
    guarded_takeover_under_load("STOP", "CONT", per_second_gcra());
}

/// The window rules take over the same way: each key's share starts from what the last reply
/// left of the window, not a fresh one.
#[test]
fn kill_9_under_load_guarded_windows_take_over_from_the_last_reply() {
    let _serial = serial();
    for limit in day_windows() {
        guarded_takeover_under_load("KILL", "restart", limit);
    }
}

/// The guarded limiter's degraded check goes straight to the local policy: a future that is
/// ready at its first poll (it never awaits), deciding as the policy's share does. (Its speed
/// against an in-process check is the `redis_degraded` bench's.)
#[test]
fn degraded_guarded_checks_are_ready_at_once() {
    let _serial = serial();
    const KEYS: usize = 64;
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let quota = Quota::per_second(1_000).unwrap();
        let rule = RedisRule::gcra(quota).unwrap();
        let handling = FailureHandling::new(FailurePolicy::Local)
            .probe_interval(Duration::from_millis(100))
            .heartbeat_interval(Duration::from_millis(250));
        let limiter = guarded(&server, rule, handling).await;
        let keys: Vec<Vec<u8>> = (0..KEYS).map(|k| format!("key-{k}").into_bytes()).collect();
        for key in &keys {
            limiter.check(key).await.unwrap();
        }
        server.signal("KILL");
        wait_for(
            &limiter,
            GuardMode::Degraded(FailurePolicy::Local),
            Duration::from_secs(2),
        )
        .await;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for _ in 0..100 {
            for key in &keys {
                let check = std::pin::pin!(limiter.check(key));
                assert!(
                    matches!(
                        std::future::Future::poll(check, &mut cx),
                        std::task::Poll::Ready(Ok(_))
                    ),
                    "a degraded check waited"
                );
            }
        }
        assert_eq!(limiter.mode(), GuardMode::Degraded(FailurePolicy::Local));
        drop(server);
    });
}

/// Degraded leased checks go straight to the local share: no lease, no refill, no round trip.
/// (Their speed against an in-process check is the `redis_degraded` bench's.)
#[test]
fn degraded_leased_checks_ask_nothing_of_redis() {
    let _serial = serial();
    const KEYS: usize = 64;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(2);
    let quota = Quota::per_second(1_000).unwrap();
    let rule = RedisRule::gcra(quota).unwrap();
    let handling = FailureHandling::new(FailurePolicy::Local)
        .probe_interval(Duration::from_millis(100))
        .heartbeat_interval(Duration::from_millis(250));
    let node = rt.block_on(leased_local(&server, rule, LeaseConfig::new(), handling));
    let keys: Vec<Vec<u8>> = (0..KEYS).map(|k| format!("key-{k}").into_bytes()).collect();
    for key in &keys {
        node.check(key).unwrap();
    }
    server.signal("KILL");
    wait_mode(
        &node,
        GuardMode::Degraded(FailurePolicy::Local),
        Duration::from_secs(2),
    );
    for key in &keys {
        // The handover, on the first check that meets the open breaker.
        node.check(key).unwrap();
    }
    let before = node.stats();
    let mut allowed = 0;
    for _ in 0..100 {
        for key in &keys {
            allowed += u64::from(node.check(key).unwrap().allowed());
        }
    }
    let after = node.stats();
    assert_eq!(
        (after.round_trips, after.refills),
        (before.round_trips, before.refills),
        "a degraded check asked Redis"
    );
    assert!(allowed > 0, "the local share admits");
    assert_eq!(node.mode(), GuardMode::Degraded(FailurePolicy::Local));
    drop(node);
    drop(rt);
}

/// The guarded limiter's takeover: each key's local share follows the global state's last
/// reply, so an outage starts from `⌊remaining / nodes⌋`, not from a full bucket; a key never
/// checked starts from the share.
#[test]
fn a_guarded_takeover_starts_from_the_last_reply() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        // Per day: nothing refills during the test, so every count is exact.
        let rule =
            RedisRule::gcra(Quota::new(1_000, Duration::from_secs(86_400)).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::Local)
            .probe_interval(Duration::from_millis(20))
            .heartbeat_interval(Duration::from_millis(250))
            .reconcile(true);
        let limiter = guarded(&server, rule, handling).await;
        assert!(limiter.check_n("k", 900).await.unwrap().allowed());
        assert_eq!(limiter.check("k").await.unwrap().remaining(), 99);
        server.signal("KILL");
        wait_for(
            &limiter,
            GuardMode::Degraded(FailurePolicy::Local),
            Duration::from_secs(2),
        )
        .await;
        let mut local = 0;
        while limiter.check("k").await.unwrap().allowed() {
            local += 1;
            assert!(local <= 1_000, "the local share never ran out");
        }
        assert_eq!(local, 99, "what the last reply said was left");
        let mut fresh = 0;
        while limiter.check("fresh").await.unwrap().allowed() {
            fresh += 1;
            assert!(fresh <= 1_000);
        }
        assert_eq!(fresh, 1_000, "one live node: the whole quota");
        assert_eq!(limiter.unreconciled(), local + fresh);
        println!("guarded takeover: {local} admitted for a known key, {fresh} for a fresh one");
        drop(server);
    });
}

/// Sets each `(name, value)` with `CONFIG SET`.
async fn config_set(admin: &mut redis::aio::MultiplexedConnection, pairs: &[(&str, &str)]) {
    for (name, value) in pairs {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(admin)
            .await
            .expect("CONFIG SET");
    }
}

/// Waits (at most 5 s) for `limiter` to be back in `Global` mode.
async fn back_to_global(limiter: &GuardedLimiter, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while limiter.mode() != GuardMode::Global {
        assert!(Instant::now() < deadline, "{what}: back to Global");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Refusals Redis gives while it cannot write, but will again (`maxmemory` reached with no key
/// to evict: `OOM`; writes stopped after a failed snapshot: `MISCONF`), are transient: a
/// guarded limiter applies its policy (here: refuses) instead of returning an error, and is
/// back to `Global` once Redis writes again.
#[test]
fn a_redis_that_cannot_write_for_now_is_a_transient_failure() {
    let _serial = serial();
    // `dir` is a protected setting: the test sets it to make a snapshot fail.
    let Some(server) = RedisServer::start_with_args(&["--enable-protected-configs", "yes"]) else {
        return;
    };
    runtime(2).block_on(async {
        let client = redis::Client::open(server.url()).expect("a valid URL");
        let mut admin = client
            .get_multiplexed_async_connection()
            .await
            .expect("connects");
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let exact = RedisLimiter::builder(rule)
            .timeout(TIMEOUT)
            .connect(&server.url())
            .await
            .expect("connects");
        let handling = FailureHandling::new(FailurePolicy::FailClosed).failure_threshold(1);
        let limiter = guarded(&server, rule, handling).await;
        assert!(limiter.check("k").await.unwrap().allowed());
        type Set = (&'static str, &'static str);
        let cases: [(&str, &[Set], &[Set]); 2] = [
            ("OOM", &[("maxmemory", "1")], &[("maxmemory", "0")]),
            // A snapshot into a directory no file can be made in fails; until one succeeds,
            // writes are refused.
            // (Writes stop only where snapshots are configured: a save point.)
            (
                "MISCONF",
                &[("save", "3600 1"), ("dir", "/proc")],
                &[("dir", "/tmp"), ("save", "")],
            ),
        ];
        for (code, set, reset) in cases {
            config_set(&mut admin, set).await;
            if code == "MISCONF" {
                let _: Result<String, _> = redis::cmd("BGSAVE").query_async(&mut admin).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let e = exact.check("k").await.expect_err(code);
            assert!(e.is_transient(), "{code}: {e}");
            let d = limiter
                .check("k")
                .await
                .expect("the policy decides, not an error");
            assert!(!d.allowed(), "{code}: fail closed");
            assert_ne!(limiter.mode(), GuardMode::Global, "{code}");
            config_set(&mut admin, reset).await;
            if code == "MISCONF" {
                let _: String = redis::cmd("SAVE")
                    .query_async(&mut admin)
                    .await
                    .expect("a save");
            }
            back_to_global(&limiter, code).await;
            assert!(limiter.check("k").await.unwrap().allowed(), "{code}");
        }
    });
}

/// A server that answers but cannot take writes (here a master demoted to a replica: every
/// check gets `READONLY`) keeps the breaker open: the probe is a write, as checks are. Once it
/// takes writes again, the limiter is back to `Global`.
#[test]
fn a_server_that_answers_but_cannot_write_keeps_the_breaker_open() {
    let _serial = serial();
    let (Some(server), Some(master)) = (RedisServer::start(), RedisServer::start()) else {
        return;
    };
    runtime(2).block_on(async {
        let client = redis::Client::open(server.url()).expect("a valid URL");
        let mut admin = client
            .get_multiplexed_async_connection()
            .await
            .expect("connects");
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let handling = FailureHandling::new(FailurePolicy::FailClosed)
            .failure_threshold(1)
            .probe_interval(Duration::from_millis(10));
        let limiter = guarded(&server, rule, handling).await;
        assert!(limiter.check("k").await.unwrap().allowed());
        let () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port())
            .query_async(&mut admin)
            .await
            .expect("REPLICAOF");
        // Degraded at the first refused write, and never back while the server is a replica.
        let d = limiter.check("k").await.expect("the policy decides");
        assert!(!d.allowed());
        let mut global = 0;
        for _ in 0..50 {
            // Read after a few probes, before the next check (which would degrade it again).
            tokio::time::sleep(Duration::from_millis(30)).await;
            global += usize::from(limiter.mode() == GuardMode::Global);
            let _ = limiter.check("k").await;
        }
        assert_eq!(
            global, 0,
            "the breaker closed on a server that refuses writes"
        );
        let () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut admin)
            .await
            .expect("REPLICAOF NO ONE");
        back_to_global(&limiter, "after REPLICAOF NO ONE").await;
        assert!(limiter.check("k").await.unwrap().allowed());
    });
}

/// Nodes with different heartbeat intervals count each other: each heartbeat stops counting
/// by its own node's expiry, so a node beating every 50 ms does not prune one beating every
/// 600 ms between its beats.
#[test]
fn nodes_with_different_heartbeat_intervals_count_each_other() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let node = |ms| {
            let handling = FailureHandling::new(FailurePolicy::Local)
                .heartbeat_interval(Duration::from_millis(ms));
            guarded(&server, rule, handling)
        };
        let fast = node(50).await;
        let slow = node(600).await;
        let mut seen = Vec::new();
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen.push(fast.live_nodes());
        }
        // (From the fast node's first beats after the slow one joined: it beats at most
        // once a probe interval, 200 ms.)
        assert!(
            seen.iter().skip(8).all(|&n| n == 2),
            "the fast node saw {seen:?}"
        );
        drop(slow);
    });
}

/// Charges are applied once. 20,000 keys are admitted by the policy during an outage; after
/// it, their charges go out in pipelined calls that queue on the server longer than the
/// limiter's 5 ms timeout, so some time out on the client after the server ran them (the
/// breaker opens again: seen below). Each charge is sent again, with its token, until Redis
/// answers it: every key's state shows its one unit, never two.
#[test]
fn charges_that_timed_out_but_ran_are_not_charged_twice() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        const KEYS: u64 = 20_000;
        // Per day: a charge sent again seconds later still owes its whole unit (what the
        // bucket refilled since it was formed is not charged).
        let rule =
            RedisRule::gcra(Quota::new(1_000, Duration::from_secs(86_400)).unwrap()).unwrap();
        let limiter = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(5))
            .connect(&server.url())
            .await
            .expect("connects")
            .guarded(
                FailureHandling::new(FailurePolicy::FailOpen)
                    .failure_threshold(1)
                    .probe_interval(Duration::from_millis(20))
                    .reconcile(true),
            )
            .await;
        server.signal("STOP");
        for i in 0..KEYS {
            assert!(limiter.check(format!("k{i}")).await.unwrap().allowed());
        }
        assert_eq!(limiter.unreconciled(), KEYS);
        server.signal("CONT");
        // Until every charge is answered; note whether the breaker opened again meanwhile (a
        // charge call timed out).
        let started = Instant::now();
        let mut global_once = false;
        let mut reopened = false;
        while limiter.mode() != GuardMode::Global || limiter.unreconciled() > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "not reconciled: {} units owed",
                limiter.unreconciled()
            );
            match limiter.mode() {
                GuardMode::Global => global_once = true,
                _ => reopened |= global_once,
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // (Not `k0`: its check timed out when the outage began, so the policy decided it, and
        // the server may have run it too once resumed.)
        // Read with a timeout of its own: the limiter's 5 ms is for the retries above.
        let reader = RedisLimiter::builder(rule)
            .timeout(Duration::from_secs(2))
            .connect(&server.url())
            .await
            .expect("connects");
        let mut twice = 0;
        for i in (1..KEYS).step_by(61) {
            let left = reader.peek(format!("k{i}"), 0).await.unwrap();
            twice += (left.remaining() < 999) as u64;
        }
        eprintln!(
            "{KEYS} keys charged in {:?}; breaker reopened by a timeout: {reopened}; keys \
             charged twice in the sample: {twice}",
            started.elapsed()
        );
        assert_eq!(twice, 0, "keys charged twice");
        assert_eq!(limiter.reconciled(), KEYS, "every unit charged, once");
        assert!(
            reopened,
            "no charge call timed out: the test did not test retries"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// A leased node's background calls failing one at a time: a connection that fails the first
// call carrying a chosen lease operation (a grant, a charge, a return), in a transient way (an
// I/O error) or a fatal one (a reply of the wrong type), and passes every other call to Redis.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tollgate::redis::RedisConnection;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Transient,
    Fatal,
    /// Answered by Redis, this long late.
    Slow(Duration),
}

/// A connection that fails (or delays) the next call of one lease operation (`g`rant,
/// `c`harge, `r`eturn).
#[derive(Clone)]
struct Planted {
    inner: ConnectionManager,
    plan: Arc<Mutex<Option<(u8, Fault)>>>,
    failed: Arc<AtomicU64>,
}

impl Planted {
    /// Fails the next call of `op` with `fault`; `failed` counts from 0 again.
    fn plant(&self, op: u8, fault: Fault) {
        self.failed.store(0, Ordering::Relaxed);
        *self.plan.lock().unwrap() = Some((op, fault));
    }

    /// The operation of a lease script call: `EVALSHA sha numkeys keys… 0 mode p1 p2 op …`.
    fn op(cmd: &Cmd) -> Option<u8> {
        let args: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|arg| match arg {
                Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        let keys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
        args.get(3 + keys + 4)?.first().copied()
    }

    /// The planted fault, once, if `cmd` carries its operation.
    fn fault(&self, cmd: &Cmd) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap();
        match *plan {
            Some((op, fault)) if Self::op(cmd) == Some(op) => {
                *plan = None;
                self.failed.fetch_add(1, Ordering::Relaxed);
                Some(fault)
            }
            _ => None,
        }
    }
}

impl ConnectionLike for Planted {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self.fault(cmd) {
            Some(Fault::Transient) => Box::pin(async {
                Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                )))
            }),
            Some(Fault::Fatal) => Box::pin(async {
                Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "planted",
                )))
            }),
            Some(Fault::Slow(delay)) => {
                let reply = self.inner.req_packed_command(cmd);
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    reply.await
                })
            }
            None => self.inner.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

impl RedisConnection for Planted {}

/// A leased node on a [`Planted`] connection: one failure opens the breaker, which then stays
/// open (no probe within the test), and what the node admitted without Redis is recorded.
async fn planted_node(
    server: &RedisServer,
    config: LeaseConfig,
) -> (LeasedLimiter<Planted>, Planted) {
    planted_node_with(server, config, planted_handling(FailurePolicy::FailOpen)).await
}

fn planted_handling(policy: FailurePolicy) -> FailureHandling {
    FailureHandling::new(policy)
        .failure_threshold(1)
        .probe_interval(Duration::from_secs(3_600))
        .reconcile(true)
}

/// A leased node on a [`Planted`] connection, with a timeout of 500 ms.
async fn planted_node_with(
    server: &RedisServer,
    config: LeaseConfig,
    handling: FailureHandling,
) -> (LeasedLimiter<Planted>, Planted) {
    let client = redis::Client::open(server.url()).expect("a URL");
    let conn = Planted {
        inner: ConnectionManager::new(client).await.expect("connects"),
        plan: Arc::default(),
        failed: Arc::default(),
    };
    let day = Quota::new(100, Duration::from_secs(86_400)).unwrap();
    let node = RedisLimiter::builder(RedisRule::gcra(day).unwrap())
        .timeout(Duration::from_millis(500))
        .build(conn.clone())
        .leased(config, handling)
        .await
        .expect("a leasable rule");
    (node, conn)
}

/// The breaker is open: the `FailOpen` policy decides.
const DEGRADED: GuardMode = GuardMode::Degraded(FailurePolicy::FailOpen);

/// What each test below starts with: the turn to run, a server of its own, and a runtime
/// whose tasks run only inside `block_on`, so that checks made outside it all run before the
/// refill they ask for (`None`: no redis-server here, the test is skipped). Dropped in
/// reverse: the runtime, then the server, then the turn.
fn start_one_thread() -> Option<(
    std::sync::MutexGuard<'static, ()>,
    RedisServer,
    tokio::runtime::Runtime,
)> {
    let serial = serial();
    let server = RedisServer::start()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    Some((serial, server, rt))
}

/// `checks` checks of `key`, before any refill runs: how many were admitted.
fn admitted(node: &LeasedLimiter<Planted>, key: &str, checks: usize) -> u64 {
    (0..checks)
        .filter(|_| node.check(key).unwrap().allowed())
        .count() as u64
}

/// Runs the node's tasks until `done` holds (within 5 s).
async fn until(node: &LeasedLimiter<Planted>, done: impl Fn(&LeasedLimiter<Planted>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(node) {
        assert!(Instant::now() < deadline, "not within 5 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs the node's tasks until the planted fault has fired and the refill of `key` is over.
async fn until_failed(node: &LeasedLimiter<Planted>, conn: &Planted, key: &str) {
    until(node, |node| {
        conn.failed.load(Ordering::Relaxed) > 0 && !node.refilling(key)
    })
    .await;
}

#[test]
fn first_touch_units_spent_before_a_failed_first_grant_are_recorded() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let (node, conn) = rt.block_on(planted_node(&server, LeaseConfig::new().first_touch(10)));
    conn.plant(b'g', Fault::Transient);
    assert_eq!(
        admitted(&node, "k", 20),
        10,
        "the allowance, while the grant is asked for"
    );
    rt.block_on(until_failed(&node, &conn, "k"));
    assert_eq!(node.mode(), DEGRADED, "a transient failure counts");
    assert_eq!(
        node.unreconciled(),
        10,
        "every unit admitted without Redis is owed"
    );
    assert_eq!(node.stats().provisional, 10);
    assert_eq!(node.held("k"), 0);
}

/// A spent key's first touch: the grant is empty, so the 10 units admitted from the allowance
/// are charged; the charge's call fails with `fault`.
fn a_failed_overdraft_charge(
    server: &RedisServer,
    rt: &tokio::runtime::Runtime,
    fault: Fault,
) -> LeasedLimiter<Planted> {
    let (node, conn) = rt.block_on(planted_node(server, LeaseConfig::new().first_touch(10)));
    // Another node (here the exact tier) spends the whole budget first.
    let spent = rt.block_on(node.exact().check_n("k", 100)).unwrap();
    assert!(spent.allowed());
    conn.plant(b'c', fault);
    assert_eq!(admitted(&node, "k", 20), 10);
    rt.block_on(until_failed(&node, &conn, "k"));
    assert_eq!(node.stats().overdrawn, 10, "none covered");
    node
}

#[test]
fn an_overdraft_charge_that_failed_in_a_transient_way_is_sent_again_later() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let node = a_failed_overdraft_charge(&server, &rt, Fault::Transient);
    assert_eq!(node.mode(), DEGRADED, "a transient failure counts");
    assert_eq!(
        node.unreconciled(),
        10,
        "owed: the charge may have run or not"
    );
}

#[test]
fn an_overdraft_charge_that_failed_for_good_is_not_sent_again() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let node = a_failed_overdraft_charge(&server, &rt, Fault::Fatal);
    assert_eq!(
        node.mode(),
        GuardMode::Global,
        "a fatal error does not open the breaker"
    );
    assert_eq!(
        node.unreconciled(),
        0,
        "sending it again would fail the same way"
    );
}

#[test]
fn only_a_transient_failure_of_a_return_counts_toward_the_breaker() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    for (fault, mode) in [
        (Fault::Fatal, GuardMode::Global),
        (Fault::Transient, DEGRADED),
    ] {
        let (node, conn) = rt.block_on(planted_node(&server, LeaseConfig::new().max_lease(10)));
        rt.block_on(node.prefetch("k")).unwrap();
        assert!(node.held("k") > 0);
        conn.plant(b'r', fault);
        rt.block_on(node.release_all());
        assert_eq!(
            conn.failed.load(Ordering::Relaxed),
            1,
            "{fault:?}: the return failed"
        );
        assert_eq!(node.stats().returned, 0, "{fault:?}");
        assert_eq!(node.mode(), mode, "{fault:?}");
    }
}

#[test]
fn with_fail_closed_a_node_spends_what_its_leases_hold_once_the_breaker_opens() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let config = LeaseConfig::new().max_lease(10);
    let (node, conn) = rt.block_on(planted_node_with(
        &server,
        config,
        planted_handling(FailurePolicy::FailClosed),
    ));
    assert_eq!(node.max_lease(), 10);
    rt.block_on(node.prefetch("a")).unwrap();
    let held = node.held("a");
    assert!(held > 0);
    // The first grant of another key fails: the breaker opens.
    conn.plant(b'g', Fault::Transient);
    assert!(
        !node.check("b").unwrap().allowed(),
        "no first-touch allowance"
    );
    rt.block_on(until_failed(&node, &conn, "b"));
    assert_eq!(node.mode(), GuardMode::Degraded(FailurePolicy::FailClosed));
    // Granted units are no over-admission: spent first, then the policy denies.
    assert_eq!(admitted(&node, "a", 2 * held as usize), held);
    assert_eq!(admitted(&node, "b", 1), 0);
    let debug = format!("{node:?}");
    assert!(
        debug.starts_with("LeasedLimiter {")
            && debug.contains("mode: Degraded(FailClosed)")
            && debug.contains("keys: 2"),
        "{debug}"
    );
}

#[test]
fn a_prefetch_waits_for_a_slow_grant_and_out_a_failed_ones_backoff() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    // A failure backs the key off for the probe interval, and does not open the breaker.
    let handling = FailureHandling::new(FailurePolicy::FailOpen)
        .failure_threshold(2)
        .probe_interval(Duration::from_secs(1));
    let (node, conn) = rt.block_on(planted_node_with(&server, LeaseConfig::new(), handling));
    // Slower than half the call's timeout (500 ms), within the prefetch's twice the timeout.
    conn.plant(b'g', Fault::Slow(Duration::from_millis(350)));
    rt.block_on(node.prefetch("a"))
        .expect("the grant came within the wait");
    assert!(node.held("a") > 0);
    assert_eq!(
        node.stats().refills,
        1,
        "the first grant brought units: asked once"
    );
    // The first grant fails: the prefetch asks again once the key's backoff is over.
    conn.plant(b'g', Fault::Transient);
    let started = Instant::now();
    rt.block_on(node.prefetch("b"))
        .expect("the second grant came within the wait");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "after the backoff"
    );
    assert!(node.held("b") > 0, "granted by the second ask");
    assert_eq!(
        node.stats().refills,
        3,
        "a's, then b's failed ask and its second"
    );
    assert_eq!(node.mode(), GuardMode::Global);
}

#[test]
fn a_leased_cost_above_the_capacity_is_an_error_and_the_capacity_is_not() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let (node, _conn) = rt.block_on(planted_node(&server, LeaseConfig::new()));
    assert!(matches!(
        node.check_n("k", 101),
        Err(TierError::Capacity {
            cost: 101,
            capacity: 100
        })
    ));
    // The whole capacity is a request like any other: denied here (no lease yet), not an error.
    assert!(!node.check_n("k", 100).unwrap().allowed());
}

#[test]
fn a_gcra_grant_parked_behind_the_last_one_counts_as_held() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let (node, _conn) = rt.block_on(planted_node(&server, LeaseConfig::new().max_lease(10)));
    rt.block_on(node.prefetch("k")).unwrap();
    let first = node.held("k");
    assert!(first > 0);
    // Another node takes a unit: the next grant's slots do not follow this lease's, so the
    // grant is parked until the lease's units are spent.
    assert!(rt.block_on(node.exact().check("k")).unwrap().allowed());
    rt.block_on(node.prefetch("k")).unwrap();
    let granted = node.stats().granted;
    assert!(granted > first, "a second grant");
    assert_eq!(
        node.held("k"),
        granted,
        "the lease's units and the parked grant's"
    );
}

#[test]
fn every_outage_hands_the_leases_over_again() {
    let Some((_serial, server, rt)) = start_one_thread() else {
        return;
    };
    let handling = FailureHandling::new(FailurePolicy::Local)
        .failure_threshold(1)
        .probe_interval(Duration::from_millis(200))
        .reconcile(true);
    let config = LeaseConfig::new().max_lease(10);
    let (node, conn) = rt.block_on(planted_node_with(&server, config, handling));
    for outage in 0..2 {
        rt.block_on(node.prefetch("k")).unwrap();
        let held = node.held("k");
        assert!(held > 0);
        // The first grant of a new key fails: the breaker opens.
        let new = format!("new{outage}");
        conn.plant(b'g', Fault::Transient);
        assert!(!node.check(&new).unwrap().allowed());
        rt.block_on(until_failed(&node, &conn, &new));
        assert_eq!(node.mode(), GuardMode::Degraded(FailurePolicy::Local));
        // The next check hands the leases over: the local share starts from what "k" held,
        // and those units, granted already, are not charged again.
        assert_eq!(admitted(&node, "k", held as usize), held, "outage {outage}");
        assert_eq!(
            node.unreconciled(),
            0,
            "outage {outage}: granted units are not owed"
        );
        // The probe finds Redis; a check goes back to the leases.
        rt.block_on(until(&node, |node| node.mode() == GuardMode::Global));
        let _ = node.check("k");
    }
}

/// A node started while `redis-server` is stopped: the limiter is built at once
/// (`connect_lazy`), serves by `Local` with the share of the fleet size it was told (a third
/// of a GCRA bucket of 100 here: 33 per key), and is global again within a second of Redis
/// starting; a node told no fleet size denies until a heartbeat counts the fleet, rather than
/// take the whole quota. Both tiers (guarded and leased).
#[test]
fn a_node_started_while_redis_is_down_serves_its_share_then_goes_global() {
    let _serial = serial();
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    server.signal("KILL");
    let rt = runtime(2);
    let url = server.url();
    let rule = RedisRule::gcra(Quota::new(100, Duration::from_secs(86_400)).unwrap()).unwrap();
    let handling = FailureHandling::new(FailurePolicy::Local)
        .heartbeat_interval(Duration::from_millis(250))
        .assumed_nodes(3);
    let lazy = || async {
        RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(100))
            .connect_lazy(&url)
            .await
            .expect("built while Redis is down")
    };
    let (guarded, leased, uncounted) = rt.block_on(async {
        let guarded = lazy().await.guarded(handling).await;
        let leased = lazy()
            .await
            .leased(LeaseConfig::new(), handling)
            .await
            .expect("a leasable rule");
        let uncounted = lazy()
            .await
            .guarded(FailureHandling::new(FailurePolicy::Local))
            .await;
        (guarded, leased, uncounted)
    });
    let degraded = GuardMode::Degraded(FailurePolicy::Local);
    assert_eq!(guarded.mode(), degraded);
    assert_eq!(leased.mode(), degraded);
    assert_eq!(uncounted.mode(), degraded);
    rt.block_on(async {
        let (mut by_guarded, mut by_leased, mut by_uncounted) = (0, 0, 0);
        for _ in 0..40 {
            by_guarded += guarded.check("k").await.unwrap().allowed() as u64;
            by_leased += leased.check_waiting("k").await.unwrap().allowed() as u64;
            by_uncounted += uncounted.check("k").await.unwrap().allowed() as u64;
        }
        println!(
            "Redis down at start: guarded {by_guarded}, leased {by_leased}, told no fleet size \
             {by_uncounted} of 40 admitted"
        );
        assert_eq!(by_guarded, 33, "a third of the bucket");
        assert_eq!(by_leased, 33, "a third of the bucket");
        assert_eq!(by_uncounted, 0, "never the whole quota as if alone");
    });
    server.restart();
    let started = Instant::now();
    let before = [guarded.mode(), leased.mode(), uncounted.mode()];
    while [guarded.mode(), leased.mode(), uncounted.mode()]
        .iter()
        .any(|mode| *mode != GuardMode::Global)
    {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "not global within a second of Redis starting: {:?}",
            [guarded.mode(), leased.mode(), uncounted.mode()]
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "global {:?} after Redis started (modes before: {before:?})",
        started.elapsed()
    );
    rt.block_on(async {
        // The restarted server's bucket is full: decided globally now.
        assert!(guarded.check("k").await.unwrap().allowed());
        assert!(leased.check_waiting("k").await.unwrap().allowed());
        let global = guarded.exact().peek("k", 0).await.unwrap().remaining();
        assert!(global < 100, "the checks reached Redis: {global} left");
        // A lazy limiter whose Redis is up is global from the start.
        let up = lazy().await.guarded(handling).await;
        assert_eq!(up.mode(), GuardMode::Global);
        assert!(up.check("k").await.unwrap().allowed());
    });
}

/// The same on a Redis Cluster whose nodes are all stopped (SIGSTOP) when the node starts
/// (`connect_cluster_lazy`): the policy serves the told share, and the limiter is global once
/// the nodes resume. The deadline only bounds the wait.
#[test]
fn a_node_started_while_the_cluster_is_down_serves_its_share_then_goes_global() {
    let _serial = serial();
    let Some(cluster) = redis_server::RedisCluster::start(3) else {
        return;
    };
    let rt = runtime(2);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let rule = RedisRule::gcra(Quota::new(100, Duration::from_secs(86_400)).unwrap()).unwrap();
    let handling = FailureHandling::new(FailurePolicy::Local)
        .heartbeat_interval(Duration::from_millis(250))
        .assumed_nodes(3);
    for node in cluster.nodes() {
        node.signal("STOP");
    }
    let limiter = rt.block_on(async {
        RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(100))
            .connect_cluster_lazy(&urls)
            .expect("built while the Cluster is down")
            .guarded(handling)
            .await
    });
    assert_eq!(limiter.mode(), GuardMode::Degraded(FailurePolicy::Local));
    let admitted: u64 = rt.block_on(async {
        let mut admitted = 0;
        for _ in 0..40 {
            admitted += limiter.check("k").await.unwrap().allowed() as u64;
        }
        admitted
    });
    assert_eq!(admitted, 33, "a third of the bucket");
    for node in cluster.nodes() {
        node.signal("CONT");
    }
    let started = Instant::now();
    while limiter.mode() != GuardMode::Global {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not global after the Cluster resumed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "Cluster down at start: {admitted} of 40 admitted; global {:?} after it resumed",
        started.elapsed()
    );
    rt.block_on(async {
        assert!(limiter.check("k").await.unwrap().allowed());
        let global = limiter.exact().peek("k", 0).await.unwrap().remaining();
        assert_eq!(global, 99, "decided on the Cluster");
    });
}
