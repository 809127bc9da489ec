//! The criterion group `redis`: the Redis tier against one local `redis-server` that
//! the bench starts on a free loopback port (and stops afterwards).
//!
//! ```text
//! cargo bench --features redis --bench redis
//! ```
//! - `redis/evalsha_per_check`: the classic design, one `EVALSHA` of a GCRA script per check
//!   (32 checks in flight on the multiplexed connection);
//! - `redis/exact_batched`: the same checks, 64 to a script call (`check_batch`), 32 calls in
//!   flight;
//! - `redis/leased`: `LeasedLimiter::check`, local atomics refilled in the background;
//! - `redis/leased_many_keys`: the same over 10 000 keys in turn: the refills of keys due
//!   together share script calls (one per Cluster slot, per 256 keys on one server).
//!
//! - `redis_degraded/*`: with Redis killed, a leased node's degraded check (`FailurePolicy::Local`)
//!   next to an in-process `KeyedLimiter` check of the same rule and key type (GCRA 1000/s,
//!   burst 1000), on 1 key and on 64 keys in turn; then both timed
//!   check by check, alternately, from 2 threads and from 16 tokio tasks on 2 workers, with
//!   p50/p99 printed (`cargo bench --features redis --bench redis -- redis_degraded`).
//!
//! - `redis_coalesced`: exact checks from 1, 16 and 64 concurrent tasks on one connection, one
//!   `EVALSHA` per check against coalesced (checks arriving while the lane is busy share the
//!   next call), over 1024 keys in turn and on one hot key: checks per second and p50/p99 per
//!   check, printed (`cargo bench --features redis --bench redis -- redis_coalesced`).
//!
//! Every figure is time per check. Round trips per check for the leased tier are printed after
//! the group. Skipped with a message when `redis-server` is not installed.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate::redis::{
    FailureHandling, FailurePolicy, GuardMode, LeaseConfig, LeasedLimiter, RedisLimiter, RedisRule,
};
use tollgate::{Gcra, KeyedLimiter, Quota};

const IN_FLIGHT: u64 = 32;
const BATCH: u64 = 64;
const KEYS: u64 = 1024;

fn rule() -> RedisRule {
    // Far above what the bench can reach: every check is an admission, like for like.
    let quota = Quota::new(1_000_000_000, Duration::from_secs(1))
        .and_then(|q| q.with_burst(1 << 40))
        .expect("a valid quota");
    RedisRule::gcra(quota).expect("within the Redis tier's limits")
}

fn key(i: u64, keys: u64) -> String {
    format!("bench-{}", i % keys)
}

fn bench_redis(c: &mut Criterion) {
    let Some(server) = redis_server::RedisServer::start() else {
        eprintln!(
            "redis bench skipped: redis-server is not installed (bash scripts/install-deps.sh)"
        );
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let exact = Arc::new(runtime.block_on(async {
        RedisLimiter::builder(rule())
            .timeout(Duration::from_secs(5))
            // The classic design: one EVALSHA per check (`redis_coalesced` compares).
            .coalesce(false)
            .connect(&server.url())
            .await
            .expect("connect")
    }));
    let mut group = c.benchmark_group("redis");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(20);

    group.bench_function("evalsha_per_check", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                let tasks: Vec<_> = (0..IN_FLIGHT)
                    .map(|task| {
                        let exact = exact.clone();
                        tokio::spawn(async move {
                            for i in (task..iters).step_by(IN_FLIGHT as usize) {
                                let d =
                                    exact.check_n(key(i, KEYS), 1).await.expect("redis answers");
                                assert!(d.allowed());
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("exact_batched", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let calls = iters.div_ceil(BATCH);
                let start = Instant::now();
                let tasks: Vec<_> = (0..IN_FLIGHT)
                    .map(|task| {
                        let exact = exact.clone();
                        tokio::spawn(async move {
                            for call in (task..calls).step_by(IN_FLIGHT as usize) {
                                let batch = (0..BATCH).map(|j| (key(call * BATCH + j, KEYS), 1));
                                for d in exact.check_batch(batch).await {
                                    assert!(d.expect("redis answers").allowed());
                                }
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                // Time per check: the last call may hold a few more than `iters`.
                start
                    .elapsed()
                    .mul_f64(iters as f64 / (calls * BATCH) as f64)
            })
        })
    });

    let leased = runtime.block_on(async {
        let exact = RedisLimiter::builder(rule())
            .connect(&server.url())
            .await
            .expect("connect");
        let leased = exact
            .leased(
                LeaseConfig::new(),
                FailureHandling::new(FailurePolicy::FailClosed),
            )
            .await
            .expect("gcra supports leases");
        leased.prefetch("leased").await.expect("redis answers");
        leased
    });
    let before = leased.stats().round_trips;
    let mut checks = 0u64;
    group.bench_function("leased", |b| {
        b.iter(|| {
            checks += 1;
            leased.check("leased").expect("no error")
        })
    });
    let mid = leased.stats();
    let round_trips = mid.round_trips - before;
    println!(
        "redis/leased: {round_trips} round trips for {checks} checks ({:.5}% of checks)",
        100.0 * round_trips as f64 / checks.max(1) as f64
    );

    const MANY: usize = 10_000;
    let keys: Vec<String> = (0..MANY).map(|i| format!("many-{i}")).collect();
    let (mut checks, mut i) = (0u64, 0usize);
    group.bench_function("leased_many_keys", |b| {
        b.iter(|| {
            checks += 1;
            i = (i + 1) % MANY;
            leased.check(&keys[i]).expect("no error")
        })
    });
    group.finish();
    let stats = leased.stats();
    let (refills, calls) = (
        stats.refills - mid.refills,
        stats.round_trips - mid.round_trips,
    );
    println!(
        "redis/leased_many_keys: {refills} refills of {MANY} keys in {calls} script calls ({:.1} per call) for {checks} checks",
        refills as f64 / calls.max(1) as f64,
    );
    runtime.block_on(leased.release_all());
    drop(server);
}

/// Per-check latencies (ns) of the in-process limiter and of the degraded leased node, timed
/// alternately on the same keys.
#[derive(Default)]
struct Pairs {
    local: Vec<u64>,
    degraded: Vec<u64>,
}

impl Pairs {
    fn time(
        &mut self,
        keys: &[Vec<u8>],
        local: &KeyedLimiter<Vec<u8>, Gcra>,
        node: &LeasedLimiter,
    ) {
        for key in keys {
            let t = Instant::now();
            std::hint::black_box(local.check(&key[..]).is_ok_and(|d| d.allowed()));
            let u = Instant::now();
            std::hint::black_box(node.check(key).is_ok_and(|d| d.allowed()));
            let v = Instant::now();
            self.local.push((u - t).as_nanos() as u64);
            self.degraded.push((v - u).as_nanos() as u64);
        }
    }

    fn merge(&mut self, other: Pairs) {
        self.local.extend(other.local);
        self.degraded.extend(other.degraded);
    }

    fn report(mut self, what: &str) {
        let pct = |v: &mut Vec<u64>| {
            v.sort_unstable();
            let at = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
            (at(50), at(99))
        };
        let (l50, l99) = pct(&mut self.local);
        let (d50, d99) = pct(&mut self.degraded);
        println!(
            "redis_degraded/{what}: in-process KeyedLimiter p50 {l50} ns p99 {l99} ns; degraded \
             p50 {d50} ns p99 {d99} ns ({:.2}x / {:.2}x)",
            d50 as f64 / l50.max(1) as f64,
            d99 as f64 / l99.max(1) as f64
        );
    }
}

/// A redis-server of the bench's own and a 2-worker runtime (`None`, with a message, when
/// redis-server is not installed).
fn server_and_runtime(what: &str) -> Option<(redis_server::RedisServer, tokio::runtime::Runtime)> {
    let Some(server) = redis_server::RedisServer::start() else {
        eprintln!("{what} skipped: redis-server is not installed (bash scripts/install-deps.sh)");
        return None;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    Some((server, runtime))
}

/// Runs 16 tasks made by `task` on `runtime` (two workers) and merges what they timed.
fn on_16_tasks<F>(runtime: &tokio::runtime::Runtime, task: impl Fn() -> F) -> Pairs
where
    F: std::future::Future<Output = Pairs> + Send + 'static,
{
    runtime.block_on(async {
        let tasks: Vec<_> = (0..16).map(|_| tokio::spawn(task())).collect();
        let mut all = Pairs::default();
        for t in tasks {
            all.merge(t.await.unwrap());
        }
        all
    })
}

fn bench_degraded(c: &mut Criterion) {
    let Some((server, runtime)) = server_and_runtime("redis_degraded") else {
        return;
    };
    let quota = Quota::per_second(1_000).expect("a valid quota");
    let rule = RedisRule::gcra(quota).expect("within the Redis tier's limits");
    let keys: Vec<Vec<u8>> = (0..64).map(|k| format!("key-{k}").into_bytes()).collect();
    let node = runtime.block_on(async {
        let node = RedisLimiter::builder(rule)
            .connect(&server.url())
            .await
            .expect("connect")
            .leased(
                LeaseConfig::new(),
                FailureHandling::new(FailurePolicy::Local)
                    .heartbeat_interval(Duration::from_millis(250)),
            )
            .await
            .expect("gcra supports leases");
        for key in &keys {
            node.prefetch(key).await.expect("redis answers");
        }
        node
    });
    let guarded = runtime.block_on(async {
        RedisLimiter::builder(rule)
            .prefix("guarded")
            .connect(&server.url())
            .await
            .expect("connect")
            .guarded(
                FailureHandling::new(FailurePolicy::Local)
                    .heartbeat_interval(Duration::from_millis(250)),
            )
            .await
    });
    server.signal("KILL");
    let degraded = Instant::now();
    while node.mode() == GuardMode::Global || guarded.mode() == GuardMode::Global {
        assert!(
            degraded.elapsed() < Duration::from_secs(5),
            "no outage seen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let local: KeyedLimiter<Vec<u8>, Gcra> = KeyedLimiter::new(Gcra::new(quota).expect("a rule"));
    for key in &keys {
        // The handover (first check), and both limiters' first touches.
        let _ = node.check(key);
        let _ = local.check(&key[..]);
    }
    let mut group = c.benchmark_group("redis_degraded");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(3));
    for (name, n) in [("1_key", 1usize), ("64_keys", 64)] {
        let mut i = 0usize;
        group.bench_function(format!("in_process_keyed/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                local.check(&keys[i][..]).is_ok_and(|d| d.allowed())
            })
        });
        group.bench_function(format!("degraded_leased/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % n;
                node.check(&keys[i]).is_ok_and(|d| d.allowed())
            })
        });
    }
    group.finish();
    assert_eq!(node.mode(), GuardMode::Degraded(FailurePolicy::Local));
    for key in &keys {
        let _ = runtime.block_on(guarded.check(key));
    }

    const ROUNDS: usize = 20_000;
    let (local, node) = (Arc::new(local), Arc::new(node));
    for (what, n) in [("1_key", 1usize), ("64_keys", 64)] {
        let keys = Arc::new(keys[..n].to_vec());
        let rounds = ROUNDS * 64 / n;
        // Two threads.
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (keys, local, node) = (keys.clone(), local.clone(), node.clone());
                std::thread::spawn(move || {
                    let mut pairs = Pairs::default();
                    for _ in 0..rounds {
                        pairs.time(&keys, &local, &node);
                    }
                    pairs
                })
            })
            .collect();
        let mut all = Pairs::default();
        for t in threads {
            all.merge(t.join().unwrap());
        }
        all.report(&format!("{what}/2_threads"));
        // Sixteen tokio tasks on two workers.
        let all = on_16_tasks(&runtime, || {
            let (keys, local, node) = (keys.clone(), local.clone(), node.clone());
            async move {
                let mut pairs = Pairs::default();
                for _ in 0..rounds / 8 {
                    pairs.time(&keys, &local, &node);
                    tokio::task::yield_now().await;
                }
                pairs
            }
        });
        all.report(&format!("{what}/16_tasks"));
        // The guarded (exact) limiter's degraded path: an `async fn` that never awaits.
        let all = on_16_tasks(&runtime, || {
            let (keys, local, guarded) = (keys.clone(), local.clone(), guarded.clone());
            async move {
                let mut pairs = Pairs::default();
                for _ in 0..rounds / 8 {
                    for key in keys.iter() {
                        let t = Instant::now();
                        std::hint::black_box(local.check(&key[..]).is_ok_and(|d| d.allowed()));
                        let u = Instant::now();
                        std::hint::black_box(guarded.check(key).await.is_ok_and(|d| d.allowed()));
                        let v = Instant::now();
                        pairs.local.push((u - t).as_nanos() as u64);
                        pairs.degraded.push((v - u).as_nanos() as u64);
                    }
                    tokio::task::yield_now().await;
                }
                pairs
            }
        });
        all.report(&format!("{what}/16_tasks_guarded"));
    }
    drop(node);
    drop(guarded);
    drop(server);
}

/// Exact checks from `tasks` concurrent tasks for `run`, coalesced or one call per check:
/// checks per second, p50 and p99 (ns).
fn exact_load(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    coalesce: bool,
    tasks: usize,
    keys: u64,
    run: Duration,
) -> (f64, u64, u64) {
    runtime.block_on(async {
        let exact = RedisLimiter::builder(rule())
            .prefix(format!("coalesce-{coalesce}-{tasks}-{keys}"))
            .timeout(Duration::from_secs(5))
            .coalesce(coalesce)
            .connect(url)
            .await
            .expect("connect");
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let exact = exact.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut i = task as u64;
                    while start.elapsed() < run {
                        let t = Instant::now();
                        let d = exact.check(key(i, keys)).await.expect("redis answers");
                        latencies.push(t.elapsed().as_nanos() as u64);
                        assert!(d.allowed());
                        i += tasks as u64;
                    }
                    latencies
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(h.await.unwrap());
        }
        let seconds = start.elapsed().as_secs_f64();
        all.sort_unstable();
        let at = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)];
        (all.len() as f64 / seconds, at(50), at(99))
    })
}

fn bench_coalesced(c: &mut Criterion) {
    // Printed figures only, when asked for by name (`-- redis_coalesced`).
    let _ = c;
    if !std::env::args().any(|a| a.contains("redis_coalesced")) {
        return;
    }
    let Some((server, runtime)) = server_and_runtime("redis_coalesced") else {
        return;
    };
    for (keys, name) in [(KEYS, "1024_keys"), (1, "1_key")] {
        for tasks in [1usize, 16, 64] {
            let run = Duration::from_secs(3);
            let url = server.url();
            let (one_rate, one_50, one_99) = exact_load(&runtime, &url, false, tasks, keys, run);
            let (co_rate, co_50, co_99) = exact_load(&runtime, &url, true, tasks, keys, run);
            println!(
                "redis_coalesced/{name}/{tasks}_tasks: one EVALSHA per check {:.1} k/s p50 {:.0} µs p99 \
                 {:.0} µs; coalesced {:.1} k/s p50 {:.0} µs p99 {:.0} µs ({:.2}x the checks/s)",
            one_rate / 1e3,
            one_50 as f64 / 1e3,
            one_99 as f64 / 1e3,
            co_rate / 1e3,
            co_50 as f64 / 1e3,
            co_99 as f64 / 1e3,
            co_rate / one_rate
            );
        }
    }
}

criterion_group!(benches, bench_redis, bench_degraded, bench_coalesced);
criterion_main!(benches);
