//! The Redis exact tier against a real `redis-server` that each test starts on a free loopback
//! port: SPEC worked examples, random traces decided identically to the in-process
//! `KeyedLimiter` (time injected on both sides), typed errors, TTLs, timeouts, replay, and a
//! global-limit test with four limiters hammering one key.
//!
//! A unit test, for the injected-time checks are the crate's own: run with
//! `cargo test --features redis --lib redis::exact_tests`. Without `redis-server` installed
//! the tests print SKIPPED and pass (outside CI; under CI they fail).

#[path = "../../tests/support/redis_client.rs"]
mod redis_client;
#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::clock::ManualClock;
use crate::redis::{
    replay, replay_trace, RedisConnection, RedisLimiter, RedisRule, ReplayError, TierError,
};
use crate::replay::{Replayer, TraceReader};
use crate::AlgorithmName;
use crate::{
    Decision, FixedWindow, Gcra, KeyedLimiter, LeakyQueue, MultiLimiter, Quota, SlidingLog,
    SlidingWindow,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::ConnectionManager;
use redis_client::{connect_cluster, master_of};
use redis_server::{RedisCluster, RedisServer};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// A realistic "now": 2023-11-14T22:13:20Z in ns since the epoch, a whole number of seconds.
const EPOCH_NOW: u64 = 1_700_000_000 * SEC;

const ALGORITHMS: [&str; 5] = [
    "gcra",
    "leaky-queue",
    "fixed-window",
    "sliding-window",
    "sliding-log",
];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A connection to `server` shared by the limiters of a test.
async fn connect(server: &RedisServer) -> ConnectionManager {
    let client = redis::Client::open(server.url()).expect("a valid URL");
    ConnectionManager::new(client).await.expect("connects")
}

/// A limiter with a prefix no other limiter of the process uses (fresh state), and a generous
/// timeout: these tests are about decisions, not latency.
fn limiter<C: RedisConnection>(conn: &C, rule: RedisRule) -> RedisLimiter<C> {
    static N: AtomicU64 = AtomicU64::new(0);
    RedisLimiter::builder(rule)
        .prefix(format!("test{}", N.fetch_add(1, Ordering::Relaxed)))
        .timeout(Duration::from_secs(5))
        .build(conn.clone())
}

/// Every figure of a decision, for comparison (`Decision`'s own `==` also compares how
/// `remaining` is represented, not only its value).
type Figures = (bool, u64, u64, u64, u64, u64);

fn figures(d: &Decision) -> Figures {
    (
        d.allowed(),
        d.limit(),
        d.remaining(),
        d.retry_after_nanos(),
        d.reset_after_nanos(),
        d.delay_nanos(),
    )
}

fn from_redis(r: Result<Decision, TierError>) -> Result<Figures, crate::LimitError> {
    match r {
        Ok(d) => Ok(figures(&d)),
        Err(e) => Err(e
            .as_capacity_exceeded()
            .unwrap_or_else(|| panic!("Redis failed: {e}"))),
    }
}

/// The in-process limiter for an algorithm, on a manual clock.
enum Reference {
    Gcra(KeyedLimiter<String, Gcra, ManualClock>),
    Queue(KeyedLimiter<String, LeakyQueue, ManualClock>),
    Fixed(KeyedLimiter<String, FixedWindow, ManualClock>),
    Sliding(KeyedLimiter<String, SlidingWindow, ManualClock>),
    Log(KeyedLimiter<String, SlidingLog, ManualClock>),
}

macro_rules! with_reference {
    ($reference:expr, $limiter:ident => $body:expr) => {
        match $reference {
            Reference::Gcra($limiter) => $body,
            Reference::Queue($limiter) => $body,
            Reference::Fixed($limiter) => $body,
            Reference::Sliding($limiter) => $body,
            Reference::Log($limiter) => $body,
        }
    };
}

impl Reference {
    fn new(name: &str, quota: Quota, clock: &ManualClock) -> Reference {
        let c = clock.clone();
        match name {
            "gcra" => {
                Reference::Gcra(KeyedLimiter::with_clock(Gcra::new(quota).unwrap(), c).unwrap())
            }
            "leaky-queue" => Reference::Queue(
                KeyedLimiter::with_clock(LeakyQueue::new(quota).unwrap(), c).unwrap(),
            ),
            "fixed-window" => Reference::Fixed(
                KeyedLimiter::with_clock(FixedWindow::new(quota).unwrap(), c).unwrap(),
            ),
            "sliding-window" => Reference::Sliding(
                KeyedLimiter::with_clock(SlidingWindow::new(quota).unwrap(), c).unwrap(),
            ),
            "sliding-log" => Reference::Log(
                KeyedLimiter::with_clock(SlidingLog::new(quota).unwrap(), c).unwrap(),
            ),
            other => panic!("unknown algorithm {other}"),
        }
    }

    fn decide(&self, key: &str, cost: u64, peek: bool) -> Result<Figures, crate::LimitError> {
        let decision =
            with_reference!(self, l => if peek { l.peek(key, cost) } else { l.check_n(key, cost) });
        decision.map(|d| figures(&d))
    }
}

/// One request of a trace.
#[derive(Debug, Clone)]
struct Request {
    t: u64,
    key: &'static str,
    cost: u64,
    peek: bool,
}

/// Decides `trace` in-process and through Redis, one call per request (`batched = false`) or in
/// batches of up to 16 (`batched`, peeks decided as checks), and returns both outcome lists.
async fn both<C: RedisConnection>(
    conn: &C,
    name: &str,
    quota: Quota,
    trace: &[Request],
    batched: bool,
) -> (
    Vec<Result<Figures, crate::LimitError>>,
    Vec<Result<Figures, crate::LimitError>>,
) {
    let clock = ManualClock::new();
    let reference = Reference::new(name, quota, &clock);
    let redis = limiter(conn, RedisRule::named(name, quota).unwrap());
    let mut expected = Vec::new();
    for r in trace {
        clock.set(r.t);
        expected.push(reference.decide(r.key, r.cost, r.peek && !batched));
    }
    let mut actual = Vec::new();
    if batched {
        for chunk in trace.chunks(16) {
            let results = redis
                .check_batch_at(chunk.iter().map(|r| (r.key, r.cost, r.t)))
                .await;
            actual.extend(results.into_iter().map(from_redis));
        }
    } else {
        for r in trace {
            let result = if r.peek {
                redis.peek_at(r.key, r.cost, r.t).await
            } else {
                redis.check_n_at(r.key, r.cost, r.t).await
            };
            actual.push(from_redis(result));
        }
    }
    (expected, actual)
}

/// Asserts that both sides agree on every request, naming the first difference.
fn assert_same(
    expected: &[Result<Figures, crate::LimitError>],
    actual: &[Result<Figures, crate::LimitError>],
    trace: &[Request],
    what: &str,
) {
    for (i, (e, a)) in expected.iter().zip(actual).enumerate() {
        assert_eq!(e, a, "{what}: request {i} {:?} differs", trace[i]);
    }
    assert_eq!(expected.len(), actual.len());
}

fn at_once(t: u64, key: &'static str, n: usize) -> Vec<Request> {
    (0..n)
        .map(|_| Request {
            t,
            key,
            cost: 1,
            peek: false,
        })
        .collect()
}

fn at(times_ms: &[u64], key: &'static str) -> Vec<Request> {
    times_ms
        .iter()
        .map(|&t| Request {
            t: t * MS,
            key,
            cost: 1,
            peek: false,
        })
        .collect()
}

fn allowed(outcomes: &[Result<Figures, crate::LimitError>]) -> Vec<bool> {
    outcomes.iter().map(|o| matches!(o, Ok(f) if f.0)).collect()
}

// ---------------------------------------------------------------------------------------------
// SPEC worked examples
// ---------------------------------------------------------------------------------------------

#[test]
fn spec_examples() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;

        // §1: capacity 100, refill 10/s → 100 at once, then 10 per second.
        let quota = Quota::per_second(10).unwrap().with_burst(100).unwrap();
        for base in [5 * SEC, EPOCH_NOW] {
            let mut trace = at_once(base, "k", 101);
            trace.push(Request {
                t: base + 99_999_999,
                ..trace[0].clone()
            });
            for k in 1..=10 {
                trace.push(Request {
                    t: base + k * 100 * MS,
                    ..trace[0].clone()
                });
            }
            for batched in [false, true] {
                let (expected, actual) = both(&conn, "gcra", quota, &trace, batched).await;
                assert_same(&expected, &actual, &trace, "gcra §1");
                let a = allowed(&actual);
                assert!(a[..100].iter().all(|&x| x));
                assert!(!a[100] && !a[101]);
                assert!(a[102..].iter().all(|&x| x));
                assert_eq!(actual[101].as_ref().unwrap().3, 1, "retry_after 1 ns");
            }
        }

        // §3: capacity 100, 10/s, 200 at once → delays 0, 0.1 s, …, 9.9 s, then 100 rejected.
        for base in [0, EPOCH_NOW + 123] {
            let trace = at_once(base, "q", 200);
            let (expected, actual) = both(&conn, "leaky-queue", quota, &trace, false).await;
            assert_same(&expected, &actual, &trace, "leaky-queue §3");
            let delays: Vec<u64> = actual
                .iter()
                .flatten()
                .filter(|f| f.0)
                .map(|f| f.5)
                .collect();
            assert_eq!(delays, (0..100).map(|i| i * 100 * MS).collect::<Vec<_>>());
            assert_eq!(allowed(&actual).iter().filter(|&&x| !x).count(), 100);
        }

        // §4: windows [k·W, (k+1)·W) aligned to the origin (the epoch in Redis).
        let fw = Quota::new(3, Duration::from_secs(1)).unwrap();
        let trace = at(&[0, 10, 999, 999, 1000, 1500, 1999, 1999, 2000], "f");
        let (expected, actual) = both(&conn, "fixed-window", fw, &trace, false).await;
        assert_same(&expected, &actual, &trace, "fixed-window §4");
        assert_eq!(
            allowed(&actual),
            [true, true, true, false, true, true, true, false, true]
        );

        // §5: 10 admitted at 500 ms; at 1250 ms est = 7.5, so 3 of 5 more pass.
        let sw = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut trace = at(&[500; 10], "s");
        trace.extend(at(&[1250; 5], "s"));
        let (expected, actual) = both(&conn, "sliding-window", sw, &trace, false).await;
        assert_same(&expected, &actual, &trace, "sliding-window §5");
        assert_eq!(allowed(&actual[10..]).iter().filter(|&&x| x).count(), 3);

        // §6: W = 60 ms, L = 2: at 121 the entry at 60 is gone, the one at 70 stays.
        let log = Quota::new(2, Duration::from_millis(60)).unwrap();
        let trace = at(&[60, 70, 119, 121, 121], "l");
        let (expected, actual) = both(&conn, "sliding-log", log, &trace, false).await;
        assert_same(&expected, &actual, &trace, "sliding-log §6");
        assert_eq!(allowed(&actual), [true, true, false, true, false]);
        assert_eq!(actual[4].as_ref().unwrap().3, 9 * MS, "retry_after 9 ms");
    });
}

// ---------------------------------------------------------------------------------------------
// Random traces: Redis and in-process decide identically
// ---------------------------------------------------------------------------------------------

/// A random quota for `algorithm`, in-process limits included.
fn quota_strategy(algorithm: usize) -> BoxedStrategy<Quota> {
    let limit = prop_oneof![3 => 1u64..=12, 1 => 13u64..=400];
    match algorithm {
        // GCRA and the queue: any window (odd nanoseconds included, for T's rounding), a burst.
        0 | 1 => (limit, 1u64..=4_000, 1u64..=3, any::<bool>())
            .prop_map(|(l, w_ms, burst_factor, odd)| {
                let w = w_ms * MS + if odd { 12_345 } else { 0 };
                let q = Quota::new(l, Duration::from_nanos(w.max(l))).unwrap();
                if burst_factor == 1 {
                    q
                } else {
                    q.with_burst(l * burst_factor / 2 + 1).unwrap()
                }
            })
            .boxed(),
        // Windows: 1 ms up to an hour, sometimes not a whole number of milliseconds.
        _ => (
            limit,
            prop_oneof![
                Just(1u64),
                2u64..=50,
                Just(1000),
                1001u64..=5000,
                Just(3_600_000)
            ],
            prop_oneof![3 => Just(0u64), 1 => 1u64..MS],
        )
            .prop_map(|(l, w_ms, extra)| {
                Quota::new(l, Duration::from_nanos(w_ms * MS + extra)).unwrap()
            })
            .boxed(),
    }
}

/// A random trace for a quota: 1–3 keys, non-decreasing times (bursts at one instant, small
/// and large steps), costs mostly 1 with zeros and over-capacity costs, some peeks. Times are
/// whole milliseconds for the sliding log (the in-process log rounds entry times to its tick,
/// at most 1 ms for these windows) and any nanosecond otherwise.
fn trace_strategy(algorithm: usize, quota: Quota) -> BoxedStrategy<Vec<Request>> {
    let window = quota.window_nanos();
    let capacity = if algorithm <= 1 {
        quota.burst()
    } else {
        quota.limit()
    };
    let step = prop_oneof![
        4 => Just(0u64),
        3 => 0u64..=window / 8 + 1,
        2 => 0u64..=window * 2,
        1 => 0u64..=window * 5,
    ];
    let cost = prop_oneof![
        10 => Just(1u64),
        2 => Just(0u64),
        3 => 1u64..=capacity,
        1 => Just(capacity + 1),
    ];
    let key = prop_oneof![4 => Just("a"), 2 => Just("b"), 1 => Just("c")];
    let request = (step, key, cost, prop::bool::weighted(0.15));
    let base = prop_oneof![
        Just(0u64),
        0u64..=1000 * SEC,
        Just(EPOCH_NOW),
        EPOCH_NOW..EPOCH_NOW + 100 * SEC
    ];
    (base, prop::collection::vec(request, 1..60))
        .prop_map(move |(base, steps)| {
            let ms_grain = algorithm == 4;
            let mut t = if ms_grain { base / MS * MS } else { base };
            steps
                .into_iter()
                .map(|(step, key, cost, peek)| {
                    t += if ms_grain { step / MS * MS } else { step };
                    Request { t, key, cost, peek }
                })
                .collect()
        })
        .boxed()
}

#[test]
fn random_traces_match_in_process_for_every_algorithm() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let conn = rt.block_on(connect(&server));
    let strategy = (0usize..5, any::<bool>()).prop_flat_map(|(algorithm, batched)| {
        quota_strategy(algorithm).prop_flat_map(move |quota| {
            (
                Just(algorithm),
                Just(quota),
                trace_strategy(algorithm, quota),
                Just(batched),
            )
        })
    });
    let cases = std::env::var("TOLLGATE_REDIS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let started = Instant::now();
    let requests = AtomicU64::new(0);
    runner
        .run(&strategy, |(algorithm, quota, trace, batched)| {
            let name = ALGORITHMS[algorithm];
            requests.fetch_add(trace.len() as u64, Ordering::Relaxed);
            let (expected, actual) = rt.block_on(both(&conn, name, quota, &trace, batched));
            for (i, (e, a)) in expected.iter().zip(&actual).enumerate() {
                if e != a {
                    return Err(TestCaseError::fail(format!(
                        "{name} {quota:?} batched={batched}: request {i} {:?}: in-process {e:?}, redis {a:?}",
                        trace[i]
                    )));
                }
            }
            Ok(())
        })
        .unwrap();
    eprintln!(
        "{cases} random traces, {} requests, agreed in {:?}",
        requests.load(Ordering::Relaxed),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Several limits, all or nothing: one script call decides as the in-process MultiLimiter
// ---------------------------------------------------------------------------------------------

/// The in-process `MultiLimiter` for an algorithm, on a manual clock.
enum MultiReference {
    Gcra(MultiLimiter<String, Gcra, ManualClock>),
    Queue(MultiLimiter<String, LeakyQueue, ManualClock>),
    Fixed(MultiLimiter<String, FixedWindow, ManualClock>),
    Sliding(MultiLimiter<String, SlidingWindow, ManualClock>),
    Log(MultiLimiter<String, SlidingLog, ManualClock>),
}

impl MultiReference {
    fn new(name: &str, quotas: &[Quota], clock: &ManualClock) -> MultiReference {
        fn of<A: crate::Algorithm>(
            quotas: &[Quota],
            rule: impl Fn(Quota) -> A,
            clock: &ManualClock,
        ) -> MultiLimiter<String, A, ManualClock> {
            MultiLimiter::with_clock(quotas.iter().map(|&q| rule(q)), clock.clone()).unwrap()
        }
        match name {
            "gcra" => MultiReference::Gcra(of(quotas, |q| Gcra::new(q).unwrap(), clock)),
            "leaky-queue" => {
                MultiReference::Queue(of(quotas, |q| LeakyQueue::new(q).unwrap(), clock))
            }
            "fixed-window" => {
                MultiReference::Fixed(of(quotas, |q| FixedWindow::new(q).unwrap(), clock))
            }
            "sliding-window" => {
                MultiReference::Sliding(of(quotas, |q| SlidingWindow::new(q).unwrap(), clock))
            }
            "sliding-log" => {
                MultiReference::Log(of(quotas, |q| SlidingLog::new(q).unwrap(), clock))
            }
            other => panic!("unknown algorithm {other}"),
        }
    }

    fn decide(&self, key: &str, cost: u64) -> Result<Figures, crate::LimitError> {
        let decision = match self {
            MultiReference::Gcra(l) => l.check_n(key, cost),
            MultiReference::Queue(l) => l.check_n(key, cost),
            MultiReference::Fixed(l) => l.check_n(key, cost),
            MultiReference::Sliding(l) => l.check_n(key, cost),
            MultiReference::Log(l) => l.check_n(key, cost),
        };
        decision.map(|d| figures(&d))
    }
}

#[test]
fn several_limits_decide_as_the_in_process_multi_limiter() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let conn = rt.block_on(connect(&server));
    // Two or three quotas of one algorithm; the trace is drawn for the first (its costs
    // sometimes exceed another limit's capacity: both sides must refuse those alike).
    let strategy = (0usize..5).prop_flat_map(|algorithm| {
        prop::collection::vec(quota_strategy(algorithm), 2..=3).prop_flat_map(move |quotas| {
            (
                Just(algorithm),
                trace_strategy(algorithm, quotas[0]),
                Just(quotas),
            )
        })
    });
    let cases = std::env::var("TOLLGATE_REDIS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let (allowed_seen, denied_seen) = (AtomicU64::new(0), AtomicU64::new(0));
    runner
        .run(&strategy, |(algorithm, trace, quotas)| {
            let name = ALGORITHMS[algorithm];
            let clock = ManualClock::new();
            let reference = MultiReference::new(name, &quotas, &clock);
            let rules: Vec<RedisRule> = quotas
                .iter()
                .map(|&q| RedisRule::named(name, q).unwrap())
                .collect();
            let redis = limiter(&conn, rules[0])
                .with_rules(rules[1..].iter().copied())
                .unwrap();
            for (i, r) in trace.iter().enumerate() {
                clock.set(r.t);
                let expected = reference.decide(r.key, r.cost);
                let actual = from_redis(rt.block_on(redis.check_n_at(r.key, r.cost, r.t)));
                match &actual {
                    Ok(f) if f.0 => allowed_seen.fetch_add(1, Ordering::Relaxed),
                    Ok(_) => denied_seen.fetch_add(1, Ordering::Relaxed),
                    Err(_) => 0,
                };
                if expected != actual {
                    return Err(TestCaseError::fail(format!(
                        "{name} {quotas:?}: request {i} {r:?}: in-process {expected:?}, redis {actual:?}"
                    )));
                }
            }
            Ok(())
        })
        .unwrap();
    // The traces must exercise both outcomes, or the comparison proves little.
    let (allowed_seen, denied_seen) = (allowed_seen.into_inner(), denied_seen.into_inner());
    assert!(
        allowed_seen > 100 && denied_seen > 100,
        "{allowed_seen} allowed, {denied_seen} denied"
    );
}

#[test]
fn several_limits_refused_by_one_charge_none() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let mut conn = rt.block_on(connect(&server));
    rt.block_on(async {
        let wide = RedisRule::fixed_window(Quota::per_hour(10).unwrap()).unwrap();
        let narrow = RedisRule::fixed_window(Quota::per_hour(2).unwrap()).unwrap();
        let l = limiter(&conn, wide).with_rules([narrow]).unwrap();
        assert!(
            limiter(&conn, wide)
                .with_rules([RedisRule::gcra(Quota::per_hour(2).unwrap()).unwrap()])
                .is_err(),
            "one algorithm for every limit"
        );
        for expected in [true, true, false, false] {
            let d = l.check("k").await.unwrap();
            assert_eq!(d.allowed(), expected);
        }
        // The narrow limit refused the last two: the wide one was charged twice, not four times.
        let wide_state: String = redis::cmd("GET")
            .arg(l.redis_key(0, "k").unwrap())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(wide_state.ends_with(" 2"), "{wide_state}");
        assert_eq!(l.redis_key(2, "k"), None);
        // Over one limit's capacity: an error, nothing sent.
        let e = l.check_n("k", 3).await.unwrap_err();
        assert!(e.as_capacity_exceeded().is_some(), "{e}");
    });
}

/// `EVALSHA` calls the server has run so far.
async fn evalsha_calls(conn: &mut ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO answers");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Coalescing, differential: every check of a random trace is its own
/// concurrent task, spawned in trace order on one thread (so they arrive in that order), some
/// at once and some after a few yields or a millisecond (so that checks also arrive while a
/// lane's calls return and hand the lane on); the checks share script calls while others are
/// in flight, and every decision is the one the in-process reference (and so one call per
/// check) gives, for every algorithm.
#[test]
fn coalesced_concurrent_checks_decide_as_one_call_per_check() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let mut conn = rt.block_on(connect(&server));
    let strategy = (0usize..5).prop_flat_map(|algorithm| {
        quota_strategy(algorithm).prop_flat_map(move |quota| {
            (
                Just(algorithm),
                Just(quota),
                trace_strategy(algorithm, quota),
                // Before each spawn: 0 = none, 1-4 yields, 5 = a 1 ms sleep.
                prop::collection::vec(
                    prop_oneof![6 => Just(0u8), 3 => 1u8..=4, 1 => Just(5u8)],
                    60,
                ),
            )
        })
    });
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let before = rt.block_on(evalsha_calls(&mut conn));
    let checks = AtomicU64::new(0);
    runner
        .run(&strategy, |(algorithm, quota, trace, gaps)| {
            let name = ALGORITHMS[algorithm];
            let clock = ManualClock::new();
            let reference = Reference::new(name, quota, &clock);
            let expected: Vec<_> = trace
                .iter()
                .map(|r| {
                    clock.set(r.t);
                    reference.decide(r.key, r.cost, false)
                })
                .collect();
            let redis = limiter(&conn, RedisRule::named(name, quota).unwrap());
            let actual: Vec<_> = rt.block_on(async {
                let mut tasks = Vec::new();
                for (r, &gap) in trace.iter().zip(&gaps) {
                    match gap {
                        0 => {}
                        5 => tokio::time::sleep(Duration::from_millis(1)).await,
                        n => {
                            for _ in 0..n {
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                    let (redis, r) = (redis.clone(), r.clone());
                    tasks.push(tokio::spawn(async move {
                        redis.check_n_at(r.key, r.cost, r.t).await
                    }));
                }
                let mut actual = Vec::new();
                for task in tasks {
                    actual.push(from_redis(task.await.unwrap()));
                }
                actual
            });
            checks.fetch_add(
                expected.iter().filter(|e| e.is_ok()).count() as u64,
                Ordering::Relaxed,
            );
            for (i, (e, a)) in expected.iter().zip(&actual).enumerate() {
                if e != a {
                    return Err(TestCaseError::fail(format!(
                        "{name} {quota:?}: request {i} {:?}: in-process {e:?}, coalesced {a:?}",
                        trace[i]
                    )));
                }
            }
            Ok(())
        })
        .unwrap();
    let calls = rt.block_on(evalsha_calls(&mut conn)) - before;
    let checks = checks.load(Ordering::Relaxed);
    eprintln!("coalesced: {checks} checks in {calls} script calls");
    // About 2 checks a call with these gaps and two calls in flight a lane (one check a call
    // without coalescing).
    assert!(
        calls * 3 < checks * 2,
        "checks shared calls: {calls} calls for {checks} checks"
    );
}

/// Coalescing keeps each key's arrival order with several calls of a lane in flight, also
/// when the server loses its scripts (before and during each round): 400 checks of one key,
/// each its own task spawned in order with random gaps (none, yields, a millisecond), against
/// a GCRA bucket that never empties, at one injected instant. Each decision's `remaining`
/// tells where the server placed it: the i-th arrival must see `burst − 1 − i`.
#[test]
fn coalesced_checks_of_one_key_keep_their_arrival_order() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime();
    let conn = rt.block_on(connect(&server));
    let burst = 1_000_000;
    let quota = Quota::per_second(1).unwrap().with_burst(burst).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..20 {
        let redis = limiter(&conn, RedisRule::gcra(quota).unwrap());
        let gaps: Vec<u64> = (0..400).map(|_| next() % 10).collect();
        // The server loses its scripts before the round and once within it (calls in flight
        // then get NOSCRIPT and are sent again).
        let flush_at = (next() % 400) as usize;
        rt.block_on(async {
            let flush = || {
                let mut conn = conn.clone();
                async move {
                    let done: redis::RedisResult<()> = redis::cmd("SCRIPT")
                        .arg("FLUSH")
                        .query_async(&mut conn)
                        .await;
                    done.expect("SCRIPT FLUSH");
                }
            };
            flush().await;
            let mut flushed = None;
            let mut tasks = Vec::new();
            for (i, &gap) in gaps.iter().enumerate() {
                if i == flush_at {
                    flushed = Some(tokio::spawn(flush()));
                }
                match gap {
                    0..=5 => {}
                    9 => tokio::time::sleep(Duration::from_millis(1)).await,
                    n => {
                        for _ in 0..n - 5 {
                            tokio::task::yield_now().await;
                        }
                    }
                }
                let redis = redis.clone();
                tasks.push(tokio::spawn(async move {
                    redis.check_n_at("k", 1, EPOCH_NOW).await
                }));
            }
            in_arrival_order(tasks, burst, round).await;
            flushed.expect("flushed").await.unwrap();
        });
    }
}

/// Awaits one-key checks spawned in arrival order on a bucket of `burst` that never empties:
/// the i-th must see `burst − 1 − i` remaining (the server decided it i-th).
async fn in_arrival_order(
    tasks: Vec<tokio::task::JoinHandle<Result<Decision, crate::redis::TierError>>>,
    burst: u64,
    round: usize,
) {
    for (i, task) in tasks.into_iter().enumerate() {
        let remaining = task.await.unwrap().expect("redis answers").remaining();
        assert_eq!(
            remaining,
            burst - 1 - i as u64,
            "round {round}: arrival {i} was decided out of order"
        );
    }
}

/// The same order on a multi-thread runtime, where a check's arrival, the hand-over of its
/// lane and the sends run on different threads: 400 checks of one key, each its own task;
/// task i makes its check arrive (one poll of its future: the check joins its lane, or leads a
/// call) only once task i − 1's has, then lets task i + 1 go, and waits for its answer on
/// whichever worker wakes it. The i-th arrival must see `burst − 1 − i`. The server loses its
/// scripts before each round, so the first call comes back `NOSCRIPT` while later ones are
/// on their way: those must not overtake its reload.
#[test]
fn coalesced_checks_keep_their_arrival_order_across_threads() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = redis_client::runtime(4);
    let conn = rt.block_on(connect(&server));
    let burst = 1_000_000;
    let quota = Quota::per_second(1).unwrap().with_burst(burst).unwrap();
    for round in 0..40 {
        let redis = limiter(&conn, RedisRule::gcra(quota).unwrap());
        rt.block_on(async {
            let flushed: redis::RedisResult<()> = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn.clone())
                .await;
            flushed.expect("SCRIPT FLUSH");
            let mut turn: Option<tokio::sync::oneshot::Receiver<()>> = None;
            let mut tasks = Vec::new();
            for _ in 0..400 {
                let (arrived, next) = tokio::sync::oneshot::channel();
                let before = turn.replace(next);
                let redis = redis.clone();
                tasks.push(tokio::spawn(async move {
                    if let Some(before) = before {
                        before.await.expect("the previous check arrived");
                    }
                    let mut check = std::pin::pin!(redis.check_n_at("k", 1, EPOCH_NOW));
                    let first =
                        std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx))).await;
                    arrived.send(()).expect("the next task waits");
                    match first {
                        Poll::Ready(decision) => decision,
                        Poll::Pending => check.await,
                    }
                }));
            }
            in_arrival_order(tasks, burst, round).await;
        });
    }
}

/// Coalescing and cancellation: callers that give up (their futures dropped) while their
/// checks wait behind a hung call, or while leading one, never leave the lane stuck; each
/// check that is answered is answered once.
#[test]
fn coalesced_checks_whose_callers_give_up_leave_no_lane_stuck() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let l = RedisLimiter::builder(rule)
            .timeout(Duration::from_secs(5))
            .connect(&server.url())
            .await
            .unwrap();
        assert!(l.check("k").await.unwrap().allowed());
        server.signal("STOP");
        // A leader and 15 queued checks, all given up after 50 ms.
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_millis(50), l.check(format!("k{i}"))).await
                })
            })
            .collect();
        for task in tasks {
            // Given up (the calls still go out, on their own tasks), or answered by a timeout.
            match task.await.unwrap() {
                Err(_given_up) => {}
                Ok(result) => assert!(result.is_err_and(|e| e.is_transient())),
            }
        }
        server.signal("CONT");
        // The lane is idle again: new checks lead, share calls and are answered.
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move { l.check(format!("k{i}")).await })
            })
            .collect();
        for task in tasks {
            let d = tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("no lane stuck")
                .unwrap()
                .expect("redis answers");
            assert!(d.allowed());
        }
    });
}

/// The Redis tier accepts limits far beyond the in-process packed counters; decisions there are
/// checked against hand-computed SPEC values.
#[test]
fn large_limits_and_windows() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        let big = 1u64 << 40;
        let week = Duration::from_secs(7 * 86_400);
        let w = week.as_nanos() as u64;

        // Fixed window, L = 2^40: two halves pass, one more unit does not.
        let fw = limiter(
            &conn,
            RedisRule::fixed_window(Quota::new(big, week).unwrap()).unwrap(),
        );
        // 2023-11-14 lies `t mod W` into its week-long window (aligned to the epoch).
        let e = EPOCH_NOW % w;
        let d = fw.check_n_at("k", big / 2, EPOCH_NOW).await.unwrap();
        assert!(d.allowed());
        assert_eq!((d.remaining(), d.reset_after_nanos()), (big / 2, w - e));
        assert!(fw
            .check_n_at("k", big / 2, EPOCH_NOW + 1)
            .await
            .unwrap()
            .allowed());
        let d = fw.check_n_at("k", 1, EPOCH_NOW + 2).await.unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), w - e - 2);

        // Sliding window, L = 2^40 over a week: products L·W ≈ 6.6·10^26 are far past 2^53.
        let sw = limiter(
            &conn,
            RedisRule::sliding_window(Quota::new(big, week).unwrap()).unwrap(),
        );
        let start = EPOCH_NOW - e; // the start of the current window
        assert!(sw
            .check_n_at("k", big, start + w - 1)
            .await
            .unwrap()
            .allowed());
        // One window later, 1 ns in: est = 0 + 2^40·(W − 1)/W, just below L; 1 unit fits.
        let d = sw.check_n_at("k", 1, start + w + 1).await.unwrap();
        assert!(d.allowed(), "est + 1 − 1 < L");
        // 2 more units: (1 + 2 − 1)·W + 2^40·(W − 1) < 2^40·W ⟺ 2·W < 2^40, false for
        // W ≈ 6.05·10^14 ns: denied, though the products differ by far less than 2^53's ulp.
        let d = sw.check_n_at("k", 2, start + w + 1).await.unwrap();
        assert!(!d.allowed());

        // Sliding log with a 26-day window (the Redis maximum is 2^51 ns ≈ 26.06 days).
        let long = Duration::from_secs(26 * 86_400);
        let log = limiter(
            &conn,
            RedisRule::sliding_log(Quota::new(3, long).unwrap()).unwrap(),
        );
        for i in 0..3 {
            assert!(log
                .check_n_at("k", 1, EPOCH_NOW + i)
                .await
                .unwrap()
                .allowed());
        }
        let d = log.check_n_at("k", 1, EPOCH_NOW + 10).await.unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), long.as_nanos() as u64 - 10);
        let gone = EPOCH_NOW + long.as_nanos() as u64;
        assert!(
            log.check_n_at("k", 1, gone).await.unwrap().allowed(),
            "the entry at t − W expired"
        );
        assert!(!log.check_n_at("k", 1, gone).await.unwrap().allowed());
    });
}

/// SPEC: a time older than the newest one seen is treated as the newest. In Redis the newest
/// time is kept per key (the time of its newest admission), so a stale reading after an
/// admission decides as in-process, where the limiter clamps.
#[test]
fn time_going_backwards_is_clamped() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        for name in ALGORITHMS {
            let quota = Quota::new(4, Duration::from_secs(1)).unwrap();
            let t = |ms: u64| EPOCH_NOW + ms * MS;
            let trace = vec![
                Request {
                    t: t(900),
                    key: "k",
                    cost: 2,
                    peek: false,
                },
                Request {
                    t: t(300),
                    key: "k",
                    cost: 1,
                    peek: false,
                },
                Request {
                    t: t(1100),
                    key: "k",
                    cost: 1,
                    peek: false,
                },
                Request {
                    t: t(200),
                    key: "k",
                    cost: 1,
                    peek: true,
                },
                Request {
                    t: t(200),
                    key: "k",
                    cost: 4,
                    peek: false,
                },
                // Judged from 1100 ms, the newest time seen, not from 200.
                Request {
                    t: t(1150),
                    key: "k",
                    cost: 1,
                    peek: false,
                },
            ];
            let (expected, actual) = both(&conn, name, quota, &trace, false).await;
            assert_same(&expected, &actual, &trace, name);
            // One call: each item sees the state the items before it left (kept unformatted
            // for a key written twice in a call), clamped alike.
            let (expected, actual) = both(&conn, name, quota, &trace, true).await;
            assert_same(&expected, &actual, &trace, &format!("{name}, one call"));
            // An admission back in time on a key written twice already in the call, then one
            // judged from the newest time.
            let trace: Vec<Request> = [900, 950, 300, 1000]
                .into_iter()
                .map(|ms| Request {
                    t: t(ms),
                    key: "k",
                    cost: 1,
                    peek: false,
                })
                .collect();
            for batched in [false, true] {
                let (expected, actual) = both(&conn, name, quota, &trace, batched).await;
                assert_same(&expected, &actual, &trace, &format!("{name}, {batched}"));
            }
        }
    });
}

/// The log's sorted-set scores count units since the log was last empty; before one would pass
/// 2^52 (where doubles stop being exact) the log is renumbered from 0.
#[test]
fn sliding_log_scores_are_renumbered_before_2_pow_52() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        let mut raw = conn.clone();
        let l = limiter(
            &conn,
            RedisRule::sliding_log(Quota::per_second(10).unwrap()).unwrap(),
        );
        let key = l.redis_key("k");
        let cum: u64 = (1 << 52) - 1;
        let member = format!("{cum}:5:{EPOCH_NOW}");
        let _: () = redis::cmd("ZADD")
            .arg(&key)
            .arg(cum)
            .arg(&member)
            .query_async(&mut raw)
            .await
            .unwrap();
        let d = l.check_n_at("k", 3, EPOCH_NOW + MS).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.remaining(), 2);
        let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut raw)
            .await
            .unwrap();
        let after = EPOCH_NOW + MS;
        assert_eq!(
            members,
            [(format!("5:5:{EPOCH_NOW}"), 5), (format!("8:3:{after}"), 8)]
        );
        // Decisions go on from the renumbered log: 2 more, then a denial until the first
        // entry (5 units at EPOCH_NOW) expires.
        assert!(l.check_n_at("k", 2, after).await.unwrap().allowed());
        let d = l.check_n_at("k", 1, after).await.unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), SEC - MS);
    });
}

// ---------------------------------------------------------------------------------------------
// Errors, TTLs, scripts, live time
// ---------------------------------------------------------------------------------------------

fn rule(name: &str) -> RedisRule {
    RedisRule::named(name, Quota::per_second(10).unwrap()).unwrap()
}

#[test]
fn foreign_values_give_typed_fatal_errors() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        let mut raw = conn.clone();
        for name in ALGORITHMS {
            let l = limiter(&conn, rule(name));
            // Another type: a list.
            let key = l.redis_key("list");
            let _: () = redis::cmd("RPUSH")
                .arg(&key)
                .arg("x")
                .query_async(&mut raw)
                .await
                .unwrap();
            let e = l.check("list").await.unwrap_err();
            assert!(matches!(e, TierError::WrongType { .. }), "{name}: {e:?}");
            assert!(e.is_fatal() && !e.is_transient());
            // The right type, but not our format.
            let key = l.redis_key("junk");
            if name == "sliding-log" {
                let _: () = redis::cmd("ZADD")
                    .arg(&key)
                    .arg(1)
                    .arg("junk")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            } else {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg("junk 12")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
            let e = l.check("junk").await.unwrap_err();
            assert!(matches!(e, TierError::CorruptState { .. }), "{name}: {e:?}");
            assert!(e.is_fatal());
            // In a batch, only the bad keys fail, and the others are decided.
            let results = l
                .check_batch([("list", 1), ("fine", 1), ("junk", 1), ("fine", 1)])
                .await;
            assert!(matches!(results[0], Err(TierError::WrongType { .. })));
            assert!(results[1].as_ref().unwrap().allowed());
            assert!(matches!(results[2], Err(TierError::CorruptState { .. })));
            assert_eq!(results[3].as_ref().unwrap().remaining(), 8, "{name}");
            // The foreign values are untouched.
            let kind: String = redis::cmd("TYPE")
                .arg(l.redis_key("list"))
                .query_async(&mut raw)
                .await
                .unwrap();
            assert_eq!(kind, "list");
        }
    });
}

#[test]
fn capacity_errors_send_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        for name in ALGORITHMS {
            let l = limiter(&conn, rule(name));
            let e = l.check_n("k", 11).await.unwrap_err();
            assert_eq!(
                e.as_capacity_exceeded(),
                Some(crate::LimitError::CapacityExceeded {
                    cost: 11,
                    capacity: 10
                })
            );
            assert_eq!(e.class(), crate::redis::ErrorClass::Request);
        }
        let mut raw = conn.clone();
        let keys: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
        assert_eq!(keys, 0);
    });
}

#[test]
fn ttls_end_when_the_state_is_fresh_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        let mut raw = conn.clone();
        async fn pttl(raw: &mut ConnectionManager, key: Vec<u8>) -> i64 {
            redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap()
        }
        // GCRA 10/s: one unit of debt is 100 ms.
        let l = limiter(&conn, rule("gcra"));
        assert!(l.check("k").await.unwrap().allowed());
        let ttl = pttl(&mut raw, l.redis_key("k")).await;
        assert!((1..=100).contains(&ttl), "gcra ttl {ttl}");
        // Fixed window of 1 s: until the window's end. Checked well before that end (the
        // server's clock is this machine's), or the key could expire before PTTL reads it.
        let into = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        if into > 800_000_000 {
            let left = u64::from(1_000_000_000 - into);
            tokio::time::sleep(Duration::from_nanos(left + 10 * MS)).await;
        }
        let l = limiter(&conn, rule("fixed-window"));
        let d = l.check("k").await.unwrap();
        let ttl = pttl(&mut raw, l.redis_key("k")).await as u64;
        assert!(
            ttl * MS <= d.reset_after_nanos() + MS && ttl >= 1,
            "fixed ttl {ttl}"
        );
        // Sliding window: until the end of the next window (when `cur` has slid out).
        let l = limiter(&conn, rule("sliding-window"));
        let d = l.check("k").await.unwrap();
        let ttl = pttl(&mut raw, l.redis_key("k")).await as u64;
        assert!(
            ttl * MS <= d.reset_after_nanos() + MS && ttl >= 500,
            "sliding ttl {ttl}"
        );
        // Log: W after the newest entry.
        let l = limiter(&conn, rule("sliding-log"));
        assert!(l.check("k").await.unwrap().allowed());
        let ttl = pttl(&mut raw, l.redis_key("k")).await;
        assert!((500..=1000).contains(&ttl), "log ttl {ttl}");
        // Denials and peeks write nothing.
        let l = limiter(
            &conn,
            RedisRule::named("fixed-window", Quota::per_hour(1).unwrap()).unwrap(),
        );
        assert!(l.peek("p", 1).await.unwrap().allowed());
        let exists: i64 = redis::cmd("EXISTS")
            .arg(l.redis_key("p"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(exists, 0);
        // Injected time: TTLs are floored, since the server cannot see that clock.
        let l = limiter(&conn, rule("gcra"));
        assert!(l.check_n_at("k", 1, 0).await.unwrap().allowed());
        let ttl = pttl(&mut raw, l.redis_key("k")).await;
        assert!(ttl > 3_500_000, "injected ttl floor {ttl}");
    });
}

#[test]
fn live_time_scripts_reload_and_keys() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // The default path: connect by URL (ConnectionManager), scripts preloaded.
        // 3 per 3601 s: no refill can sneak in between the checks, however slow the machine,
        // and T = 1200.333… s is not a whole number of microseconds.
        let rule = RedisRule::gcra(Quota::new(3, Duration::from_secs(3601)).unwrap()).unwrap();
        let l = RedisLimiter::connect(&server.url(), rule).await.unwrap();
        assert_eq!(l.redis_key("alice"), b"tollgate:gcra:{alice}".to_vec());
        let mut decisions = Vec::new();
        for _ in 0..4 {
            decisions.push(l.check("alice").await.unwrap());
        }
        assert_eq!(decisions.iter().filter(|d| d.allowed()).count(), 3);
        let denied = decisions[3];
        // Server time is in microseconds: durations are whole microseconds, rounded up.
        assert_eq!(denied.retry_after_nanos() % 1000, 0);
        assert_eq!(denied.reset_after_nanos() % 1000, 0);
        assert!(
            denied.retry_after() > Duration::ZERO
                && denied.retry_after() <= Duration::from_secs(1201)
        );
        // NOSCRIPT: the cache is flushed, the next call reloads transparently.
        let mut raw = l.connection().clone();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(l.check("bob").await.unwrap().allowed());
        // A batch in live time.
        let results = l.check_batch((0..5).map(|_| ("carol", 1))).await;
        let admitted = results
            .iter()
            .filter(|r| r.as_ref().unwrap().allowed())
            .count();
        assert_eq!(admitted, 3);
    });
}

#[test]
fn a_hung_server_times_out_then_recovers() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(1000).unwrap()).unwrap();
        let l = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(50))
            .connect(&server.url())
            .await
            .unwrap();
        assert!(l.check("k").await.unwrap().allowed());
        server.signal("STOP");
        let started = Instant::now();
        let e = l.check("k").await.unwrap_err();
        let took = started.elapsed();
        server.signal("CONT");
        assert!(matches!(e, TierError::Timeout { .. }), "{e:?}");
        assert!(e.is_transient());
        assert!(
            took < Duration::from_millis(250),
            "timed out after {took:?}"
        );
        // Back once the server answers again (the stale reply is discarded by the client).
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match l.check("k").await {
                Ok(d) => {
                    assert!(d.allowed());
                    break;
                }
                Err(e) if e.is_transient() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("did not recover: {e}"),
            }
        }
    });
}

#[test]
fn unreachable_server_is_a_transient_error() {
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    runtime().block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(10).unwrap()).unwrap();
        let e = RedisLimiter::builder(rule)
            .connect_timeout(Duration::from_millis(300))
            .connect(&format!("redis://127.0.0.1:{port}"))
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        let e = RedisLimiter::connect("not a url", rule).await.unwrap_err();
        assert!(e.is_fatal(), "{e:?}");
    });
}

// ---------------------------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------------------------

/// The in-process replay's printed lines for `text`.
fn in_process_lines(algorithm: AlgorithmName, burst: Option<u64>, text: &str) -> Vec<String> {
    let mut replayer = Replayer::new(algorithm, 3, Duration::from_secs(1), burst).unwrap();
    let mut reader = TraceReader::new(text.as_bytes());
    let mut lines = Vec::new();
    while let Some(Ok(request)) = reader.next_request() {
        lines.push(replayer.decide(&request).to_string());
    }
    lines
}

/// A long random trace in the SPEC text format: many keys, bursts, costs up to 4 and an
/// occasional cost too large to parse as `u64`.
fn random_trace_text(seed: u64, lines: usize) -> String {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut t = 0;
    let mut text = String::from("# generated\n");
    for _ in 0..lines {
        t += [0, 0, 1, 7, 100, 333, 1000][(next() % 7) as usize];
        let key = next() % 40;
        match next() % 10 {
            0 => text.push_str(&format!("{t},k{key},99999999999999999999999\n")),
            1..=3 => text.push_str(&format!("{t},k{key},{}\n", next() % 5)),
            _ => text.push_str(&format!("{t},k{key}\n")),
        }
    }
    text
}

#[test]
fn replay_prints_what_the_in_process_replay_prints() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    let short = "# a trace\n0,a\n0,a\n0,b,3\n10,a\n250,a,0\n\n999,b,9\n1000,a,2\n1000,b,1\n\
                 1000,c,99999999999999999999999\n1500,a\n2600,a\n2600,a\n2600,a\n";
    let long = random_trace_text(7, 1500);
    for algorithm in AlgorithmName::ALL {
        let bursts: &[Option<u64>] = if algorithm.has_burst() {
            &[None, Some(5)]
        } else {
            &[None]
        };
        for &burst in bursts {
            for text in [short, long.as_str()] {
                let expected = in_process_lines(algorithm, burst, text);
                let mut quota = Quota::new(3, Duration::from_secs(1)).unwrap();
                if let Some(b) = burst {
                    quota = quota.with_burst(b).unwrap();
                }
                let rule = RedisRule::for_algorithm(algorithm, quota).unwrap();
                let mut reader = TraceReader::new(text.as_bytes());
                let mut actual = Vec::new();
                let decided =
                    replay_trace(&url, rule, &mut reader, |o| actual.push(o.to_string())).unwrap();
                assert_eq!(decided as usize, expected.len());
                for (i, (e, a)) in expected.iter().zip(&actual).enumerate() {
                    assert_eq!(e, a, "{algorithm} burst {burst:?}: request {i}");
                }
                assert_eq!(expected.len(), actual.len());
            }
        }
    }

    // A bad line: the outcomes before it are emitted, then the error names the line.
    let rule =
        RedisRule::for_algorithm(AlgorithmName::Gcra, Quota::per_second(3).unwrap()).unwrap();
    let mut reader = TraceReader::new("0,a\n5,a\n3,a\n9,a\n".as_bytes());
    let mut lines = Vec::new();
    let e = replay_trace(&url, rule, &mut reader, |o| lines.push(o.to_string())).unwrap_err();
    assert!(matches!(&e, ReplayError::Trace(t) if t.line == 3), "{e:?}");
    assert_eq!(lines, ["allow", "allow"]);

    runtime().block_on(async {
        // The async form returns full decisions, equal to the in-process limiter's.
        let trace: Vec<(u64, &str, u64)> = vec![
            (0, "a", 1),
            (0, "a", 2),
            (0, "a", 1),
            (400, "a", 1),
            (400, "a", 9),
        ];
        for name in ALGORITHMS {
            let quota = Quota::new(3, Duration::from_secs(1)).unwrap();
            let outcomes = replay(&url, RedisRule::named(name, quota).unwrap(), trace.clone())
                .await
                .unwrap();
            let clock = ManualClock::new();
            let reference = Reference::new(name, quota, &clock);
            for (&(t_ms, key, cost), outcome) in trace.iter().zip(outcomes) {
                clock.set(t_ms * MS);
                assert_eq!(
                    reference.decide(key, cost, false),
                    outcome.map(|d| figures(&d)),
                    "{name}"
                );
            }
        }
        // Replays clean up after themselves.
        let mut conn = connect(&server).await;
        let keys: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        assert_eq!(keys, 0);
    });
}

// ---------------------------------------------------------------------------------------------
// Global limit: four limiters, each with its own connection and threads, on one key
// ---------------------------------------------------------------------------------------------

/// The server's clock, in ns since the epoch.
async fn server_time(conn: &mut ConnectionManager) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * SEC + us * 1000
}

/// How the hammering instances reach Redis.
#[derive(Clone)]
enum Target {
    Server(String),
    Cluster(Vec<String>),
}

/// One instance: its own runtime (on the calling thread plus one worker), connection and
/// `TASKS` tasks checking `key` until the deadline.
fn hammer_instance(
    target: Target,
    name: &str,
    quota: Quota,
    key: &str,
    counters: Arc<[AtomicU64; 2]>,
) {
    const TASKS: usize = 6;
    // 4 × the largest limit below.
    const ENOUGH_CHECKS: u64 = 1200;
    async fn run<C: RedisConnection>(
        l: RedisLimiter<C>,
        key: String,
        counters: Arc<[AtomicU64; 2]>,
    ) {
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (l, key, counters) = (l.clone(), key.clone(), counters.clone());
                tokio::spawn(async move {
                    // At least 600 ms, and until the fleet has made 4·L checks (so the limit is
                    // surely exhausted), but never past 10 s or 20 000 checks per task.
                    let started = Instant::now();
                    for _ in 0..20_000 {
                        let elapsed = started.elapsed();
                        let enough = counters[0].load(Ordering::Relaxed) >= ENOUGH_CHECKS;
                        if elapsed > Duration::from_secs(10)
                            || (elapsed > Duration::from_millis(600) && enough)
                        {
                            break;
                        }
                        let d = l.check(&key).await.unwrap();
                        counters[0].fetch_add(1, Ordering::Relaxed);
                        if d.allowed() {
                            counters[1].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
    let rt = redis_client::runtime(2);
    rt.block_on(async {
        let builder = RedisLimiter::builder(RedisRule::named(name, quota).unwrap())
            .prefix("hammer")
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(5));
        match target {
            Target::Server(url) => {
                run(builder.connect(&url).await.unwrap(), key.into(), counters).await
            }
            Target::Cluster(urls) => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                run(
                    builder.connect_cluster(&urls).await.unwrap(),
                    key.into(),
                    counters,
                )
                .await
            }
        }
    });
}

/// Four limiter instances, each with its own connection, thread and tasks, hammer one key per
/// algorithm; the fleet must admit exactly the limit (at most twice it if a window boundary,
/// aligned to the epoch, passes during the run: once a day at most for these windows).
fn global_limit(target: Target, time_url: &str) {
    const INSTANCES: usize = 4;
    let hour = Duration::from_secs(3600);
    let day = Duration::from_secs(86_400);
    let cases = [
        (
            "gcra",
            Quota::new(1, hour).unwrap().with_burst(200).unwrap(),
            200,
        ),
        (
            "leaky-queue",
            Quota::new(1, hour).unwrap().with_burst(150).unwrap(),
            150,
        ),
        ("fixed-window", Quota::new(250, day).unwrap(), 250),
        ("sliding-window", Quota::new(220, day).unwrap(), 220),
        ("sliding-log", Quota::new(300, hour).unwrap(), 300),
    ];
    let rt = runtime();
    let mut raw = rt.block_on(async {
        let client = redis::Client::open(time_url).unwrap();
        ConnectionManager::new(client).await.unwrap()
    });
    for (name, quota, limit) in cases {
        let key = format!("hammer-{name}");
        let counters = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let before = rt.block_on(server_time(&mut raw));
        let started = Instant::now();
        let threads: Vec<_> = (0..INSTANCES)
            .map(|_| {
                let (target, key, counters) = (target.clone(), key.clone(), counters.clone());
                std::thread::spawn(move || hammer_instance(target, name, quota, &key, counters))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let after = rt.block_on(server_time(&mut raw));
        let checks = counters[0].load(Ordering::Relaxed);
        let admitted = counters[1].load(Ordering::Relaxed);
        eprintln!(
            "{name}: {checks} checks from {INSTANCES} instances in {:?}, {admitted} admitted (limit {limit})",
            started.elapsed()
        );
        assert!(
            checks >= 4 * limit,
            "{name}: too few checks ({checks}) to test the limit"
        );
        let w = quota.window_nanos();
        let crossed = matches!(name, "fixed-window" | "sliding-window") && before / w != after / w;
        if crossed {
            assert!(
                admitted <= 2 * limit,
                "{name}: {admitted} > 2 × {limit} across a boundary"
            );
        } else {
            assert_eq!(
                admitted, limit,
                "{name}: the fleet must admit exactly the limit"
            );
        }
    }
}

#[test]
fn four_limiters_hammering_one_key_never_exceed_the_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    global_limit(Target::Server(server.url()), &server.url());
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster: three masters created by the test
// ---------------------------------------------------------------------------------------------

/// A trace over `keys` keys (spread over the cluster's slots and nodes), in random order with
/// random small time steps and costs up to one over the capacity.
fn many_keys_trace(seed: u64, len: usize, keys: usize, capacity: u64) -> Vec<Request> {
    let names: Vec<&'static str> = (0..keys)
        .map(|i| &*Box::leak(format!("user:{i}").into_boxed_str()))
        .collect();
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut t = EPOCH_NOW + next() % SEC;
    (0..len)
        .map(|_| {
            t += [0, 0, 1, 777, MS, 7 * MS, 50 * MS][(next() % 7) as usize];
            let cost = if next() % 4 == 0 {
                next() % (capacity + 2)
            } else {
                1
            };
            Request {
                t,
                key: names[(next() % keys as u64) as usize],
                cost,
                peek: false,
            }
        })
        .collect()
}

#[test]
fn cluster_batches_per_slot_and_holds_the_global_limit() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let urls = cluster.urls();
    runtime().block_on(async {
        let conn = connect_cluster(&urls).await;
        // The keys of the trace live on every node.
        let mut owners = std::collections::HashSet::new();
        let mut raw = conn.clone();
        for i in 0..64 {
            let l = limiter(
                &conn,
                RedisRule::gcra(Quota::per_second(1).unwrap()).unwrap(),
            );
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(l.redis_key(format!("user:{i}")))
                .query_async(&mut raw)
                .await
                .unwrap();
            owners.insert(slot / 5462); // `--cluster create` splits 16384 slots in thirds
        }
        assert_eq!(
            owners.len(),
            3,
            "the trace's keys should cover every master"
        );
        // Batched traces over 64 keys (16 checks per batch, several slots per batch) decide
        // exactly as in-process.
        for (i, name) in ALGORITHMS.into_iter().enumerate() {
            let quota = Quota::new(5, Duration::from_millis(100)).unwrap();
            let trace = many_keys_trace(i as u64 + 1, 600, 64, 5);
            let (expected, actual) = both(&conn, name, quota, &trace, true).await;
            assert_same(&expected, &actual, &trace, &format!("cluster {name}"));
        }
        // Live time through the cluster, one batch across many slots.
        let l = limiter(
            &conn,
            RedisRule::fixed_window(Quota::per_hour(2).unwrap()).unwrap(),
        );
        let keys: Vec<String> = (0..40).map(|i| format!("k{}", i % 20)).collect();
        let results = l.check_batch(keys.iter().map(|k| (k, 1))).await;
        assert!(results.iter().all(|r| r.as_ref().unwrap().allowed()));
        let results = l.check_batch(keys.iter().map(|k| (k, 1))).await;
        assert!(results.iter().all(|r| !r.as_ref().unwrap().allowed()));
        // Several limits on a key share its slot (one script call), on every master, whatever
        // the key's text (a `}` is escaped, so it cannot end the tag and choose the slot); the
        // empty key, without a hash tag of its own, cannot, and is refused before anything is
        // sent.
        let per_hour = RedisRule::fixed_window(Quota::per_hour(3).unwrap()).unwrap();
        let two = limiter(&conn, l.rule()).with_rules([per_hour]).unwrap();
        for i in 0..30 {
            let key = format!("user:{i}");
            let outcomes = [
                two.check(&key).await.unwrap().allowed(),
                two.check(&key).await.unwrap().allowed(),
                two.check(&key).await.unwrap().allowed(),
            ];
            assert_eq!(outcomes, [true, true, false], "{key}");
        }
        for key in ["}x", "a}b", "%7Dx"] {
            let outcomes = [
                two.check(key).await.unwrap().allowed(),
                two.check(key).await.unwrap().allowed(),
                two.check(key).await.unwrap().allowed(),
            ];
            assert_eq!(outcomes, [true, true, false], "{key}");
        }
        let e = two.check("").await.unwrap_err();
        assert!(matches!(e, TierError::NoHashTag { .. }), "{e}");
    });
    global_limit(Target::Cluster(urls.clone()), &urls[0]);
}

/// A sliding log whose entries all but the newest expire at once is cleaned a bounded number
/// of entries per call (64), the rest in the next calls, and decides as if they were gone.
#[test]
fn a_log_cleans_expired_entries_a_bounded_number_per_call() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        // One batch call writes 5,000 entries: timeouts long enough for a loaded machine (the
        // test is about what each call cleans, not about speed; the connection's own default
        // is 500 ms).
        let client = redis::Client::open(server.url()).expect("a valid URL");
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_secs(60)));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .expect("connects");
        let window = Duration::from_secs(1);
        let log = RedisLimiter::builder(
            RedisRule::sliding_log(Quota::new(10_000, window).unwrap()).unwrap(),
        )
        .prefix("cleanup")
        .timeout(Duration::from_secs(60))
        .build(conn.clone());
        let t0 = EPOCH_NOW;
        // 5,000 entries of one unit in the window's first 500 ms, then one at 900 ms.
        let batch: Vec<(&str, u64, u64)> = (0..5_000).map(|i| ("k", 1, t0 + i * 100_000)).collect();
        for result in log.check_batch_at(batch).await {
            assert!(result.unwrap().allowed());
        }
        assert!(log
            .check_n_at("k", 1, t0 + 900 * 1_000_000)
            .await
            .unwrap()
            .allowed());
        let key = log.redis_key("k");
        let c = conn.clone();
        let card = |mut c: ConnectionManager, key: Vec<u8>| async move {
            redis::cmd("ZCARD")
                .arg(key)
                .query_async::<u64>(&mut c)
                .await
                .unwrap()
        };
        assert_eq!(card(c.clone(), key.clone()).await, 5_001);
        // At 1.6 s, only the entry of 900 ms lives: 2 units counted, each call drops 64.
        let at = t0 + 1_600 * 1_000_000;
        let d = log.check_n_at("k", 1, at).await.unwrap();
        assert!(d.allowed());
        assert_eq!(
            d.remaining(),
            10_000 - 2,
            "the expired entries do not count"
        );
        assert_eq!(card(c.clone(), key.clone()).await, 5_002 - 64);
        for n in 1..=10 {
            let d = log.check_n_at("k", 1, at + n).await.unwrap();
            assert_eq!(d.remaining(), 10_000 - 2 - n, "call {n}");
        }
        assert_eq!(card(c.clone(), key.clone()).await, 5_002 + 10 - 11 * 64);
        // Once every entry expired, the log is unlinked whole.
        assert!(log
            .check_n_at("k", 1, at + 2 * SEC)
            .await
            .unwrap()
            .allowed());
        assert_eq!(card(c, key).await, 1);
    });
}

/// Callers that give up (their futures dropped at random points, as a tower timeout drops
/// them) harm no other check. On a healthy server, 32 tasks check 16 keys for 2 s through a
/// guarded limiter that fails closed, a quarter of the checks given up after 20-200 µs: every
/// other check is answered and admitted, the limiter never leaves `Global`, and each key is
/// charged at least its answered checks and at most those and its given-up ones.
#[test]
fn callers_that_give_up_harm_no_other_check() {
    use crate::redis::{FailureHandling, FailurePolicy, GuardMode};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = redis_client::runtime(2);
    rt.block_on(async {
        const KEYS: usize = 16;
        let limit = 1u64 << 30;
        let rule = RedisRule::fixed_window(Quota::per_hour(limit).unwrap()).unwrap();
        // A timeout far above any call's time, loaded machine included: a call that timed out
        // would open the breaker, and the test is about callers that give up, not about speed.
        let exact = RedisLimiter::builder(rule)
            .prefix(format!("give-up-{}", std::process::id()))
            .timeout(Duration::from_secs(1))
            .connect(&server.url())
            .await
            .unwrap();
        let guarded = exact
            .clone()
            .guarded(FailureHandling::new(FailurePolicy::FailClosed))
            .await;
        let stop = Instant::now() + Duration::from_secs(2);
        let tasks: Vec<_> = (0..32u64)
            .map(|t| {
                let guarded = guarded.clone();
                tokio::spawn(async move {
                    // Per key: answered and admitted, given up; then errors, denials, and
                    // readings of a mode other than Global.
                    let mut tally = [[0u64; 2]; KEYS];
                    let mut wrong = [0u64; 3];
                    let mut n = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                    while Instant::now() < stop {
                        n = n
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        let key = ((n >> 33) % KEYS as u64) as usize;
                        let check = guarded.check(format!("k{key}"));
                        let result = if (n >> 20) % 4 == 0 {
                            let after = Duration::from_micros(20 + (n >> 40) % 180);
                            match tokio::time::timeout(after, check).await {
                                Ok(result) => result,
                                Err(_gave_up) => {
                                    tally[key][1] += 1;
                                    continue;
                                }
                            }
                        } else {
                            check.await
                        };
                        match result {
                            Ok(d) if d.allowed() => tally[key][0] += 1,
                            Ok(_) => wrong[1] += 1,
                            Err(_) => wrong[0] += 1,
                        }
                        if guarded.mode() != GuardMode::Global {
                            wrong[2] += 1;
                        }
                        tokio::task::yield_now().await;
                    }
                    (tally, wrong)
                })
            })
            .collect();
        let mut tally = [[0u64; 2]; KEYS];
        let mut wrong = [0u64; 3];
        for task in tasks {
            let (t, w) = task.await.unwrap();
            for key in 0..KEYS {
                tally[key][0] += t[key][0];
                tally[key][1] += t[key][1];
            }
            for i in 0..3 {
                wrong[i] += w[i];
            }
        }
        let answered: u64 = tally.iter().map(|t| t[0]).sum();
        let gave_up: u64 = tally.iter().map(|t| t[1]).sum();
        eprintln!("{answered} checks answered, {gave_up} given up; errors, denials, mode changes: {wrong:?}");
        assert!(gave_up > 0 && answered > 0);
        assert_eq!(wrong, [0, 0, 0], "errors, denials, readings off Global");
        // Calls of given-up checks still in flight finish within the timeout.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (key, [answered, gave_up]) in tally.iter().enumerate() {
            let left = exact.peek(format!("k{key}"), 0).await.unwrap().remaining();
            let charged = limit - left;
            assert!(
                (*answered..=answered + gave_up).contains(&charged),
                "k{key}: charged {charged}, answered {answered}, given up {gave_up}"
            );
        }
    });
}

/// Checks polled once and then neither polled again nor dropped (the losers of a `select!`,
/// kept aside) hold nothing of the lane: a later check is answered within its deadline.
#[test]
fn checks_polled_once_and_left_aside_block_no_other() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let l = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap())
            .connect(&server.url())
            .await
            .unwrap();
        // More than the lane keeps in flight (2), each polled once.
        let mut aside: Vec<_> = (0..4).map(|i| Box::pin(l.check(format!("a{i}")))).collect();
        for check in &mut aside {
            std::future::poll_fn(|cx| {
                let _ = check.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
        }
        let b = tokio::time::timeout(Duration::from_secs(2), l.check("b")).await;
        assert!(
            b.as_ref()
                .is_ok_and(|r| r.as_ref().is_ok_and(Decision::allowed)),
            "{b:?}"
        );
        drop(aside);
    });
}

/// After the server's clock stepped back (here: a state written at an injected time 10 s
/// ahead of it), a live check decides at the state's own time, and the key lives as long as
/// that time calls for, not from the server's earlier clock: it must not expire early and
/// reset the limit.
#[test]
fn a_state_ahead_of_the_server_clock_keeps_its_whole_ttl() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime().block_on(async {
        let conn = connect(&server).await;
        let quota = Quota::per_second(10).unwrap();
        for rule in [
            RedisRule::gcra(quota).unwrap(),
            RedisRule::fixed_window(quota).unwrap(),
            RedisRule::sliding_window(quota).unwrap(),
            RedisRule::sliding_log(quota).unwrap(),
        ] {
            let l = limiter(&conn, rule);
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            assert!(l
                .check_n_at("ahead", 1, wall + 10 * SEC)
                .await
                .unwrap()
                .allowed());
            // Live: the server's clock is 10 s behind the state's.
            assert!(l.check("ahead").await.unwrap().allowed());
            let ttl: i64 = redis::cmd("PTTL")
                .arg(l.redis_key("ahead"))
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            assert!(ttl > 9_000, "{}: the key expires in {ttl} ms", rule.name());
        }
    });
}

/// A guarded limiter's probe writes on the Cluster slot of the check that failed: while that
/// slot's master is stopped, the breaker stays open, though the master of the limiter's own
/// probe key answers; once it resumes, the breaker closes.
#[test]
fn the_probe_tests_the_slot_that_failed() {
    use crate::redis::{FailureHandling, FailurePolicy, GuardMode};
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let urls = cluster.urls();
    runtime().block_on(async {
        let conn = connect_cluster(&urls).await;
        let raw = conn.clone();
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let exact = RedisLimiter::builder(rule)
            .prefix("probe")
            .timeout(Duration::from_millis(100))
            .build(conn.clone());
        // `<prefix>:<algorithm>:{x}` → the limiter's own probe key, `<prefix>:<algorithm>:probe`.
        let mut own = exact.redis_key("x");
        own.truncate(own.len() - 3);
        own.extend_from_slice(b"probe");
        let own_master = master_of(&raw, &own).await;
        let mut i = 0;
        let key = loop {
            let key = format!("user:{i}");
            if master_of(&raw, &exact.redis_key(&key)).await != own_master {
                break key;
            }
            i += 1;
        };
        let stopped = master_of(&raw, &exact.redis_key(&key)).await;
        let node = cluster
            .nodes()
            .iter()
            .find(|n| n.port() == stopped)
            .expect("a node of the cluster");
        let guarded = exact
            .guarded(
                // Opened by the first failure: this test is about where the probe goes.
                FailureHandling::new(FailurePolicy::FailClosed)
                    .failure_threshold(1)
                    .probe_interval(Duration::from_millis(30)),
            )
            .await;
        assert!(guarded.check(&key).await.unwrap().allowed());
        node.signal("STOP");
        // The check times out: the breaker opens and the policy decides.
        assert!(!guarded.check(&key).await.unwrap().allowed());
        assert_ne!(guarded.mode(), GuardMode::Global);
        // Ten probe intervals and more, well under the cluster's node timeout (5 s).
        let until = Instant::now() + Duration::from_millis(600);
        while Instant::now() < until {
            assert_ne!(
                guarded.mode(),
                GuardMode::Global,
                "the breaker closed while the failed slot's master was stopped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        node.signal("CONT");
        let until = Instant::now() + Duration::from_secs(3);
        while guarded.mode() != GuardMode::Global && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            guarded.mode(),
            GuardMode::Global,
            "closed once the master resumed"
        );
        assert!(guarded.check(&key).await.unwrap().allowed());
    });
}

/// A Cluster node that lost its scripts (`SCRIPT FLUSH` there, as a restart or a promoted
/// replica would) gets the script again from the first check of a key of its slots, on that
/// node alone: another node stopped (`SIGSTOP`) does not keep the check from being decided,
/// nor `connect_cluster` from starting.
#[test]
fn a_lost_script_is_reloaded_on_its_node_while_another_node_is_stopped() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let urls = cluster.urls();
    let url_refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    runtime().block_on(async {
        let raw = connect_cluster(&urls).await;
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let limiter = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(500))
            .connect_cluster(&url_refs)
            .await
            .expect("connects");
        let key = "user:1";
        assert!(limiter.check(key).await.unwrap().allowed());
        let flushed = master_of(&raw, &limiter.redis_key(key)).await;
        let nodes = cluster.nodes();
        let node = |port: u16| nodes.iter().find(|n| n.port() == port).unwrap();
        let stopped = nodes.iter().find(|n| n.port() != flushed).unwrap();
        let mut plain = redis::Client::open(node(flushed).url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut plain)
            .await
            .unwrap();
        stopped.signal("STOP");
        let outcome = limiter.check(key).await;
        // A limiter started while the node is stopped (given only the flushed node's address:
        // the client finds the others).
        let started = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(500))
            .prefix("started")
            .connect_cluster(&[node(flushed).url().as_str()])
            .await;
        let started_check = match &started {
            Ok(limiter) => Some(limiter.check(key).await),
            Err(_) => None,
        };
        stopped.signal("CONT");
        let decision = outcome.expect("decided with the script reloaded on its node alone");
        assert!(decision.allowed(), "{decision:?}");
        let started = started.expect("connect_cluster starts while a node is stopped");
        let decision = started_check.unwrap().expect("its check loads the script");
        assert!(decision.allowed(), "{decision:?}");
        let started_key = started.redis_key(key);
        assert_eq!(master_of(&raw, &started_key).await, flushed);
    });
}

/// A plain connection (`connect`, not `connect_cluster`) to a Cluster node, asked for a key of
/// another node's slots, is redirected (`MOVED`) on every call: a fatal configuration error
/// that says what to do, not a transient one that a failure policy would wait out for ever.
#[test]
fn a_plain_connection_to_a_cluster_node_is_a_configuration_error() {
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let urls = cluster.urls();
    runtime().block_on(async {
        let raw = connect_cluster(&urls).await;
        let rule = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let node = &cluster.nodes()[0];
        let plain = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(500))
            .connect(&node.url())
            .await
            .expect("connects to the node");
        let mut i = 0;
        let key = loop {
            let key = format!("user:{i}");
            if master_of(&raw, &plain.redis_key(&key)).await != node.port() {
                break key;
            }
            i += 1;
        };
        let e = plain.check(&key).await.unwrap_err();
        assert!(e.is_fatal(), "{e:?}");
        assert!(e.to_string().contains("connect_cluster"), "{e}");
    });
}
