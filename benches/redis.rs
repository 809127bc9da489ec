//! The criterion group `redis` of issue 5: the Redis tier against one local `redis-server` that
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
//! Every figure is time per check. Round trips per check for the leased tier are printed after
//! the group. Skipped with a message when `redis-server` is not installed.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate::redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule};
use tollgate::Quota;

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

fn key(i: u64) -> String {
    format!("bench-{}", i % KEYS)
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
                                let d = exact.check_n(key(i), 1).await.expect("redis answers");
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
                                let batch = (0..BATCH).map(|j| (key(call * BATCH + j), 1));
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

criterion_group!(benches, bench_redis);
criterion_main!(benches);
