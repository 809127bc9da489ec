//! The leased tier against a real `redis-server` that each test starts on a free loopback port:
//! the global limit with four leased nodes hammering one key (never above the limit, and at
//! most the documented bound below it), the typed error for algorithms that cannot be leased,
//! leases going back to Redis when a key goes idle, checks that never wait for a refill, and a
//! measurement of checks per second and round trips per check.
//!
//! Run with `cargo test --release --features redis --test redis_leased -- --nocapture` to see
//! the figures. Without `redis-server` installed the tests print SKIPPED and pass (outside CI).

#![cfg(feature = "redis")]

#[path = "support/redis_client.rs"]
mod redis_client;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis_client::{runtime, split_by_master};
use redis_server::RedisServer;
use tollgate::redis::{
    FailureHandling, FailurePolicy, GuardMode, LeaseConfig, LeaseError, LeasedLimiter,
    RedisLimiter, RedisRule,
};
use tollgate::Quota;

const SEC: u64 = 1_000_000_000;

/// The load tests use every core: run them one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What most tests start with: the turn to run, a server of their own, a runtime with
/// `workers` threads (`None`: no redis-server here, the test is skipped). Dropped in reverse:
/// the runtime, then the server, then the turn.
fn start(
    workers: usize,
) -> Option<(
    MutexGuard<'static, ()>,
    RedisServer,
    tokio::runtime::Runtime,
)> {
    let serial = serial();
    let server = RedisServer::start()?;
    Some((serial, server, runtime(workers)))
}

/// A leased node on its own connection. A generous timeout: these tests load both cores, and
/// are about decisions, not latency.
async fn node(
    server: &RedisServer,
    prefix: &str,
    rule: RedisRule,
    config: LeaseConfig,
) -> LeasedLimiter {
    RedisLimiter::builder(rule)
        .prefix(prefix)
        .timeout(Duration::from_millis(500))
        .connect(&server.url())
        .await
        .expect("connects")
        .leased(config, FailureHandling::new(FailurePolicy::FailClosed))
        .await
        .expect("a leasable rule")
}

fn wall_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What one hammering thread saw.
#[derive(Default)]
struct Tally {
    checks: u64,
    admitted: u64,
    /// Admissions per window index (by the wall clock, which is the server's `TIME` on this
    /// machine), for admissions whose whole check lay inside one window.
    per_window: HashMap<u64, u64>,
    /// Admissions whose check straddled a window boundary, by the window it ended in.
    straddling: HashMap<u64, u64>,
}

/// Four leased nodes, each on its own runtime, connection and hammering thread, check one key
/// for `run`. Returns the tallies, the stats of each node, and the (wall) times before the first grant,
/// when the hammering started and when it ended.
fn hammer(
    server: &RedisServer,
    prefix: &str,
    rule: RedisRule,
    config: LeaseConfig,
    window: u64,
    run: Duration,
) -> (Vec<Tally>, Vec<tollgate::redis::LeaseStats>, u64, u64, u64) {
    const NODES: usize = 4;
    // Before the first grant: the token bucket's interval starts here.
    let origin = wall_nanos();
    let runtimes: Vec<tokio::runtime::Runtime> = (0..NODES).map(|_| runtime(1)).collect();
    let nodes: Vec<LeasedLimiter> = runtimes
        .iter()
        .map(|rt| {
            rt.block_on(async {
                let node = node(server, prefix, rule, config).await;
                node.prefetch("k").await.expect("a first lease");
                node
            })
        })
        .collect();
    let barrier = Arc::new(Barrier::new(NODES + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, barrier, stop) = (node.clone(), barrier.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut tally = Tally::default();
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    let before = wall_nanos();
                    let decision = node.check("k").expect("no error while Redis answers");
                    let after = wall_nanos();
                    tally.checks += 1;
                    if decision.allowed() {
                        tally.admitted += 1;
                        let (a, b) = (before / window, after / window);
                        let map = if a == b {
                            &mut tally.per_window
                        } else {
                            &mut tally.straddling
                        };
                        *map.entry(b).or_default() += 1;
                    }
                }
                tally
            })
        })
        .collect();
    let start = wall_nanos();
    barrier.wait();
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let tallies: Vec<Tally> = threads
        .into_iter()
        .map(|t| t.join().expect("a hammering thread"))
        .collect();
    let end = wall_nanos();
    let stats = nodes.iter().map(LeasedLimiter::stats).collect();
    for node in &nodes {
        assert_eq!(node.mode(), GuardMode::Global, "Redis answered throughout");
    }
    drop(nodes);
    (tallies, stats, origin, start, end)
}

#[test]
fn four_leased_nodes_never_exceed_a_fixed_window_and_fall_short_by_at_most_the_bound() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    const L: u64 = 20_000;
    let window = SEC;
    let rule = RedisRule::fixed_window(Quota::per_second(L).unwrap()).unwrap();
    let config = LeaseConfig::new();
    let max_lease = config.max_lease_for(L);
    // SPEC-side bound (src/redis/lease.rs): L − admitted ≤ nodes × max_lease.
    let bound = 4 * max_lease;
    let (tallies, stats, _, start, end) = hammer(
        &server,
        "fixed",
        rule,
        config,
        window,
        Duration::from_millis(3_300),
    );
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    let mut straddling: HashMap<u64, u64> = HashMap::new();
    for t in &tallies {
        for (w, n) in &t.per_window {
            *per_window.entry(*w).or_default() += n;
        }
        for (w, n) in &t.straddling {
            *straddling.entry(*w).or_default() += n;
        }
    }
    let checks: u64 = tallies.iter().map(|t| t.checks).sum();
    let round_trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    let (first, last) = (start / window, end / window);
    // A straddling admission ending in window w was decided in w − 1 or w. The limit holds iff
    // some attribution keeps every window within L; the greedy one below (as much as fits to
    // the earlier window) finds one if any exists.
    let mut carried = 0; // straddling admissions attributed to the current window
    let mut full_windows = 0;
    for w in first..=last {
        let certain = per_window.get(&w).copied().unwrap_or(0);
        let next = straddling.get(&(w + 1)).copied().unwrap_or(0);
        let room = L.saturating_sub(certain + carried);
        let to_this = next.min(room);
        let total = certain + carried + to_this;
        println!("fixed window {w}: admitted {total} ({certain} certain) of L = {L}");
        assert!(
            certain + carried <= L,
            "window {w}: {} admitted > L = {L}",
            certain + carried
        );
        carried = next - to_this;
        if w > first && w < last {
            full_windows += 1;
            let short = L - certain;
            println!(
                "  short of L by at most {short}; documented bound nodes × max_lease = {bound}"
            );
            assert!(
                short <= bound,
                "window {w}: {certain} admitted, more than {bound} below L"
            );
        }
    }
    assert_eq!(carried, 0, "admissions after the last window");
    assert!(
        full_windows >= 2,
        "the run covered {full_windows} full windows"
    );
    println!(
        "{checks} checks, {round_trips} round trips ({:.4}% of checks)",
        100.0 * round_trips as f64 / checks as f64
    );
}

#[test]
fn four_leased_nodes_hold_a_token_bucket() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    const L: u64 = 20_000;
    let quota = Quota::per_second(L).unwrap();
    let rule = RedisRule::gcra(quota).unwrap();
    let config = LeaseConfig::new();
    let max_lease = config.max_lease_for(L);
    let (tallies, stats, origin, _, end) = hammer(
        &server,
        "gcra",
        rule,
        config,
        SEC,
        Duration::from_millis(2_000),
    );
    let admitted: u64 = tallies.iter().map(|t| t.admitted).sum();
    // The run began before the nodes' first grants (a full bucket, B = L) and ended after
    // their last admission: the token bucket allows at most B + D/T in it.
    let elapsed = end - origin;
    let most = L + (elapsed as u128 * L as u128).div_ceil(SEC as u128) as u64;
    // Short by at most the outstanding leases, plus the tokens that accrued after the nodes
    // last asked (a node asks at least every `horizon` = 50 ms while starved; 100 ms margin).
    let bound = 4 * max_lease + L / 10;
    let round_trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    println!(
        "gcra: admitted {admitted} in {:.3} s, at most {most}; short by {} (bound {bound}); \
         {round_trips} round trips",
        elapsed as f64 / SEC as f64,
        most.saturating_sub(admitted),
    );
    assert!(admitted <= most, "{admitted} admitted > {most}");
    assert!(
        admitted + bound >= most,
        "{admitted} admitted, more than {bound} below {most}"
    );
}

/// GCRA leases expire. A burst spends half the bucket and leaves each node a lease; then a
/// trickle keeps those leases in use, never low enough for a refill, while the bucket refills
/// to full; then a second burst, over `[a, b]`. A unit a node kept from before the refill
/// comes on top of the full bucket: the fleet bound on `LeasedLimiter` allows
/// `B + 1 + (b − a + D)/T` (`D` the horizon), and no more.
#[test]
fn a_burst_after_a_trickle_stays_within_the_token_bucket() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    const L: u64 = 400;
    const T: u64 = SEC / L;
    let rule = RedisRule::gcra(Quota::per_second(L).unwrap()).unwrap();
    let config = LeaseConfig::new();
    let horizon = 50_000_000;
    let nodes: Vec<LeasedLimiter> = (0..4)
        .map(|_| {
            rt.block_on(async {
                let node = node(&server, "trickle", rule, config).await;
                node.prefetch("k").await.expect("a first lease");
                node
            })
        })
        .collect();
    // Round-robin over the nodes for `run`, one check per `gap`: the admissions.
    let burst = |run: Duration, gap: Duration| {
        let start = Instant::now();
        let mut admitted = 0;
        while start.elapsed() < run {
            for node in &nodes {
                admitted += node.check("k").expect("Redis answers").allowed() as u64;
            }
            std::thread::sleep(gap);
        }
        admitted
    };
    // 50 checks per node, at once: leases of `max_lease` (25) on each node.
    let mut spent = 0;
    for _ in 0..50 {
        for node in &nodes {
            spent += node.check("k").expect("Redis answers").allowed() as u64;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // One check per node every 250 ms for 1.5 s (16/s): the bucket is full again within 1 s.
    let trickled = burst(Duration::from_millis(1_500), Duration::from_millis(250));
    let held: u64 = nodes.iter().map(|n| n.held("k")).sum();
    let a = wall_nanos();
    let admitted = burst(Duration::from_millis(100), Duration::from_micros(100));
    let b = wall_nanos();
    let most = L + 1 + (b - a + horizon).div_ceil(T);
    println!(
        "gcra burst after a trickle: spent {spent}, trickled {trickled}, {held} held at the \
         burst, then {admitted} admitted in {:.1} ms, at most {most}",
        (b - a) as f64 / 1e6
    );
    assert!(admitted <= most, "{admitted} admitted > {most}");
    for node in &nodes {
        assert_eq!(node.mode(), GuardMode::Global, "Redis answered throughout");
    }
}

#[test]
fn four_leased_nodes_hold_a_sliding_window() {
    let _serial = serial();
    let Some(server) = RedisServer::start() else {
        return;
    };
    const L: u64 = 20_000;
    let window = SEC;
    let rule = RedisRule::sliding_window(Quota::per_second(L).unwrap()).unwrap();
    let config = LeaseConfig::new();
    let max_lease = config.max_lease_for(L);
    let (tallies, stats, _, start, end) = hammer(
        &server,
        "sliding",
        rule,
        config,
        window,
        Duration::from_millis(3_300),
    );
    let mut per_window: HashMap<u64, u64> = HashMap::new();
    for t in &tallies {
        for (w, n) in t.per_window.iter().chain(t.straddling.iter()) {
            *per_window.entry(*w).or_default() += n;
        }
    }
    let straddling: u64 = tallies.iter().flat_map(|t| t.straddling.values()).sum();
    let (first, last) = (start / window, end / window);
    // Every unit spent in window k was counted in window k's `cur`, which the SPEC rule keeps
    // at most L (straddling admissions counted against both windows they may belong to).
    for w in first..=last {
        let n = per_window.get(&w).copied().unwrap_or(0);
        println!("sliding window {w}: admitted at most {n} of L = {L}");
        assert!(n <= L + straddling, "window {w}: {n} admitted > L = {L}");
        if w > first + 1 && w < last {
            // Saturated since the window before: the estimate lets cur reach about L by the
            // window's end. Short by at most the leases outstanding, plus what the estimate
            // freed since the nodes last asked (a starved node asks every W/64).
            let bound = 4 * max_lease + L / 32;
            println!("  short of L by {}; bound {bound}", L.saturating_sub(n));
            assert!(
                n + bound >= L,
                "window {w}: {n} admitted, more than {bound} below L"
            );
        }
    }
    let round_trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    println!("{round_trips} round trips");
}

#[test]
fn a_leased_node_spends_its_lease_then_follows_the_policy_then_recovers() {
    let _serial = serial();
    for policy in [FailurePolicy::FailClosed, FailurePolicy::Local] {
        let Some(mut server) = RedisServer::start() else {
            return;
        };
        let rt = runtime(2);
        let rule = RedisRule::gcra(Quota::per_hour(1_000).unwrap()).unwrap();
        let handling = FailureHandling::new(policy).probe_interval(Duration::from_millis(50));
        let node = rt.block_on(async {
            let node = RedisLimiter::builder(rule)
                .timeout(Duration::from_millis(50))
                .connect(&server.url())
                .await
                .unwrap()
                .leased(LeaseConfig::new(), handling)
                .await
                .unwrap();
            node.prefetch("k").await.unwrap();
            node
        });
        let held = node.held("k");
        assert!(held > 0);
        server.signal("KILL");
        // What the node holds is still served, without the network.
        for _ in 0..held {
            assert!(node.check("k").unwrap().allowed());
        }
        // Then the refill fails and the policy decides, before the breaker opens (the key
        // whose refill failed) and after: no error, no panic.
        let deadline = Instant::now() + Duration::from_secs(2);
        while node.mode() == GuardMode::Global {
            assert!(Instant::now() < deadline, "the breaker did not open");
            let decision = node.check("k").expect("transient failures are absorbed");
            if policy == FailurePolicy::FailClosed {
                assert!(!decision.allowed(), "nothing left to spend, fail closed");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(node.mode(), GuardMode::Degraded(policy));
        let allowed = node.check("k").unwrap().allowed();
        match policy {
            FailurePolicy::FailClosed => assert!(!allowed, "fail closed"),
            // This node's in-process share of the quota (one live node: all of it).
            _ => assert!(allowed, "local share"),
        }
        server.restart();
        let healed = Instant::now();
        while node.mode() != GuardMode::Global {
            assert!(
                healed.elapsed() < Duration::from_secs(2),
                "not global again"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The next checks ask for a lease again (the restarted server has a full bucket).
        let before = node.stats().granted;
        while node.stats().granted == before || !node.check("k").unwrap().allowed() {
            assert!(
                healed.elapsed() < Duration::from_secs(3),
                "no lease after recovery"
            );
            node.check("k").unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        println!(
            "leased, {policy:?}: global again and granted {:?} after the restart",
            healed.elapsed()
        );
        drop(node);
        drop(rt);
    }
}

#[test]
fn the_shortfall_is_exactly_the_outstanding_leases() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    const L: u64 = 10_000;
    let day = Duration::from_secs(86_400);
    let rule = RedisRule::fixed_window(Quota::new(L, day).unwrap()).unwrap();
    let config = LeaseConfig::new().idle_timeout(Duration::from_secs(60));
    let nodes: Vec<LeasedLimiter> = rt.block_on(async {
        let mut nodes = Vec::new();
        for _ in 0..4 {
            let node = node(&server, "shortfall", rule, config).await;
            node.prefetch("k").await.unwrap();
            nodes.push(node);
        }
        nodes
    });
    // Three nodes hold leases and stop; one spends everything the budget still allows.
    let (busy, idle) = nodes.split_first().unwrap();
    let mut admitted = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "the budget was not spent");
        if busy.check("k").unwrap().allowed() {
            admitted += 1;
            continue;
        }
        // Denied: wait for the refill this denial asked for to land, without checking (a
        // check would ask for the next one). Once no refill is in flight, nothing changes the
        // busy node's lease or the global state until its next check.
        while busy.refilling("k") {
            assert!(Instant::now() < deadline, "the refill did not land");
            std::thread::sleep(Duration::from_micros(200));
        }
        let held = busy.held("k");
        let remaining = rt.block_on(busy.exact().peek("k", 0)).unwrap().remaining();
        if remaining == 0 && held == 0 {
            break;
        }
    }
    let held: u64 = idle.iter().map(|n| n.held("k")).sum();
    let bound = 4 * config.max_lease_for(L);
    println!("admitted {admitted} of L = {L}; {held} held by the idle nodes; bound {bound}");
    assert_eq!(
        L - admitted,
        held,
        "short by exactly the outstanding leases"
    );
    assert!(held <= bound);
    // Once they give their leases back, the busy node gets the rest.
    rt.block_on(async {
        for node in idle {
            node.release_all().await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while admitted < L {
        assert!(
            Instant::now() < deadline,
            "the returned units were not granted"
        );
        if busy.check("k").unwrap().allowed() {
            admitted += 1;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(admitted, L);
}

#[test]
fn algorithms_that_cannot_be_leased_are_a_typed_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let quota = Quota::per_second(10).unwrap();
        for (rule, name) in [
            (RedisRule::sliding_log(quota).unwrap(), "sliding-log"),
            (RedisRule::leaky_queue(quota).unwrap(), "leaky-queue"),
        ] {
            let exact = RedisLimiter::connect(&server.url(), rule).await.unwrap();
            let error = exact
                .leased(
                    LeaseConfig::new(),
                    FailureHandling::new(FailurePolicy::FailOpen),
                )
                .await
                .expect_err("not leasable");
            assert_eq!(error, LeaseError::Unsupported { algorithm: name });
            assert!(error.to_string().contains(name));
        }
        for name in [
            "gcra",
            "token-bucket",
            "leaky-bucket",
            "fixed-window",
            "sliding-window",
        ] {
            let rule = RedisRule::named(name, quota).unwrap();
            let exact = RedisLimiter::connect(&server.url(), rule).await.unwrap();
            let config = LeaseConfig::new();
            let handling = FailureHandling::new(FailurePolicy::FailOpen);
            assert!(exact.leased(config, handling).await.is_ok(), "{name}");
        }
    });
}

/// A node's background tasks (its refill task and its sweeper) end with the last clone of the
/// limiter: the refill task holds the node, and would keep it, its leases and its connection
/// for good.
#[test]
fn the_background_tasks_end_with_the_last_clone() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let alive = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let rule = RedisRule::gcra(Quota::per_second(10).unwrap()).unwrap();
        let limiter = node(&server, "tasks", rule, LeaseConfig::new()).await;
        let running = alive();
        let clone = limiter.clone();
        drop(limiter);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(alive(), running, "a clone keeps them");
        drop(clone);
        for _ in 0..200 {
            if alive() + 2 <= running {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{} of {running} tasks still alive after 1 s", alive());
    });
}

/// A lease given back while its first refill is still queued is not refilled: the refill
/// task asks nothing for it, and there is nothing to give back.
#[test]
fn a_lease_given_back_before_its_refill_is_not_refilled() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // One thread: the refill task runs only when the test awaits.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rule = RedisRule::fixed_window(Quota::per_hour(1_000).unwrap()).unwrap();
        let node = node(&server, "given-back", rule, LeaseConfig::new()).await;
        node.check("k").unwrap();
        assert!(node.refilling("k"), "the first touch queued a refill");
        node.release_all().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Nothing sent: no grant, and no return of the first touch's units (never granted).
        assert_eq!((node.stats().refills, node.stats().round_trips), (0, 0));
        assert_eq!(node.held("k"), 0);
    });
}

/// A key whose budget is spent asks Redis again only after its backoff: the checks refused
/// meanwhile send nothing. (An upper bound: a slow machine sends fewer refills, not more.)
#[test]
fn a_spent_key_asks_again_only_after_its_backoff() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let rule = RedisRule::fixed_window(Quota::per_hour(10).unwrap()).unwrap();
        let backoff = Duration::from_millis(20);
        let node = node(
            &server,
            "backoff",
            rule,
            LeaseConfig::new().backoff(backoff),
        )
        .await;
        let (mut admitted, mut refused) = (0, 0);
        let (start, run) = (Instant::now(), Duration::from_millis(400));
        while start.elapsed() < run {
            match node.check("k").unwrap().allowed() {
                true => admitted += 1,
                false => refused += 1,
            }
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        assert!(admitted <= 10 && refused > 0, "{admitted} admitted");
        // Each grant of the 10 units, then one ask a backoff.
        let most = 10 + (run.as_millis() / backoff.as_millis()) as u64 + 1;
        let refills = node.stats().refills;
        println!("{refills} refills, {admitted} admitted, {refused} refused");
        assert!(
            refills <= most,
            "{refills} refills in {run:?}, {refused} checks refused"
        );
    });
}

#[test]
fn an_idle_key_gives_its_lease_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let day = Duration::from_secs(86_400);
        let rules = [
            RedisRule::gcra(Quota::per_hour(1_000).unwrap()).unwrap(),
            RedisRule::fixed_window(Quota::new(1_000, day).unwrap()).unwrap(),
            RedisRule::sliding_window(Quota::new(1_000, day).unwrap()).unwrap(),
        ];
        for rule in rules {
            let config = LeaseConfig::new().idle_timeout(Duration::from_millis(100));
            let node = node(&server, "idle", rule, config).await;
            let exact = node.exact().clone();
            node.prefetch("k").await.unwrap();
            let held = node.held("k");
            assert!(held >= 5, "{}: a first lease of {held}", rule.name());
            for _ in 0..5 {
                assert!(node.check("k").unwrap().allowed());
            }
            assert_eq!(node.held("k"), held - 5);
            // The global state counts the whole lease as admitted: an exact node sees it.
            let remaining = exact.peek("k", 0).await.unwrap().remaining();
            assert_eq!(remaining, 1_000 - held, "{}", rule.name());
            // Idle for well over the timeout: the unused units go back.
            let deadline = Instant::now() + Duration::from_secs(3);
            while node.stats().returned < held - 5 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(node.stats().returned, held - 5, "{}", rule.name());
            assert_eq!(node.held("k"), 0);
            let remaining = exact.peek("k", 0).await.unwrap().remaining();
            assert_eq!(
                remaining,
                1_000 - 5,
                "{}: only the spent units count",
                rule.name()
            );
            // release_all does the same at once.
            node.prefetch("k2").await.unwrap();
            let held = node.held("k2");
            assert!(node.check("k2").unwrap().allowed());
            node.release_all().await;
            let remaining = exact.peek("k2", 0).await.unwrap().remaining();
            assert_eq!(remaining, 1_000 - 1, "{}: after release_all", rule.name());
            assert!(held > 1);
        }
    });
}

#[test]
fn an_expired_window_lease_gives_its_units_back_while_its_window_lasts() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let day = Duration::from_secs(86_400);
        for rule in [
            RedisRule::fixed_window(Quota::new(1_000, day).unwrap()).unwrap(),
            RedisRule::sliding_window(Quota::new(1_000, day).unwrap()).unwrap(),
        ] {
            // Leases expire by age long before the day ends; the key is not idle for long.
            let config = LeaseConfig::new()
                .max_age(Duration::from_millis(50))
                .idle_timeout(Duration::from_secs(60));
            let node = node(&server, "expiry", rule, config).await;
            let exact = node.exact().clone();
            node.prefetch("k").await.unwrap();
            let held = node.held("k");
            assert!(node.check("k").unwrap().allowed());
            let deadline = Instant::now() + Duration::from_secs(3);
            while node.stats().returned < held - 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(node.stats().returned, held - 1, "{}", rule.name());
            assert_eq!(node.held("k"), 0);
            let remaining = exact.peek("k", 0).await.unwrap().remaining();
            assert_eq!(remaining, 1_000 - 1, "{}", rule.name());
            // The next checks get a fresh lease.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !node.check("k").unwrap().allowed() {
                assert!(Instant::now() < deadline, "no new lease");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
}

#[test]
fn a_key_of_the_wrong_type_is_a_typed_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        let rule = RedisRule::gcra(Quota::per_second(100).unwrap()).unwrap();
        let node = node(&server, "typed", rule, LeaseConfig::new()).await;
        let key = node.exact().redis_key("bad");
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg(&key)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(
            node.prefetch("bad").await,
            Err(tollgate::redis::TierError::WrongType { .. })
        ));
        assert!(matches!(
            node.check("bad"),
            Err(tollgate::redis::TierError::WrongType { .. })
        ));
        assert_eq!(
            node.mode(),
            GuardMode::Global,
            "a fatal error is not an outage"
        );
        // Other keys are unaffected.
        node.prefetch("good").await.unwrap();
        assert!(node.check("good").unwrap().allowed());
    });
}

#[test]
fn many_keys_coming_and_going_lose_and_double_count_no_unit() {
    let Some((_serial, server, rt)) = start(1) else {
        return;
    };
    let day = Duration::from_secs(86_400);
    let rule = RedisRule::fixed_window(Quota::new(1_000_000, day).unwrap()).unwrap();
    // Short idle timeout: keys are retired and re-leased while checks go on.
    let config = LeaseConfig::new().idle_timeout(Duration::from_millis(20));
    let node = rt.block_on(node(&server, "many", rule, config));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let node = node.clone();
            std::thread::spawn(move || {
                let mut admitted = 0u64;
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(1_500) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Bursts on a few keys, then quiet: keys go idle and come back.
                    let phase = start.elapsed().as_millis() as u64 / 100;
                    let key = format!("k{}", (phase * 7 + x % 5) % 300);
                    if node.check(&key).unwrap().allowed() {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    // Let every key go idle and give its lease back.
    rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        node.release_all().await;
    });
    let stats = node.stats();
    println!("{admitted} admitted; {stats:?}");
    assert!(admitted > 0);
    // Every unit granted was either spent or given back, exactly once.
    assert_eq!(stats.granted - stats.returned, admitted);
    // And the global state agrees, key by key.
    let counted: u64 = rt.block_on(async {
        let mut counted = 0;
        for k in 0..300 {
            let d = node.exact().peek(format!("k{k}"), 0).await.unwrap();
            counted += 1_000_000 - d.remaining();
        }
        counted
    });
    assert_eq!(counted, admitted);
}

#[test]
fn a_sliding_lease_from_the_previous_window_goes_back_to_prev() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let rt = runtime(1);
    rt.block_on(async {
        const W: u64 = 2 * SEC;
        let rule =
            RedisRule::sliding_window(Quota::new(1_000, Duration::from_nanos(W)).unwrap()).unwrap();
        let config = LeaseConfig::new().idle_timeout(Duration::from_secs(60));
        let node = node(&server, "prev", rule, config).await;
        let exact = node.exact().clone();
        // Start early in a window (the wall clock is the server's TIME on this machine).
        let into = wall_nanos() % W;
        if into > W / 4 {
            tokio::time::sleep(Duration::from_nanos(W - into + 10_000_000)).await;
        }
        node.prefetch("k").await.unwrap();
        let held = node.held("k");
        assert!(held > 2);
        assert!(node.check("k").unwrap().allowed());
        // Into the next window; an exact check moves the stored state there, so the lease's
        // units are now the state's `prev`.
        let into = wall_nanos() % W;
        tokio::time::sleep(Duration::from_nanos(W - into + 10_000_000)).await;
        assert!(exact.check("k").await.unwrap().allowed());
        // The expired lease goes back (the sweeper), into `prev`.
        let deadline = Instant::now() + Duration::from_secs(3);
        while node.stats().returned < held - 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(node.stats().returned, held - 1);
        // Now prev = 1 and cur = 1: est = 1 + (W − e)/W < 2, so at least 998 remain; with the
        // lease still counted, prev would be `held` and fewer would.
        let remaining = exact.peek("k", 0).await.unwrap().remaining();
        assert!(remaining >= 998, "{remaining} remaining");
    });
}

#[test]
fn refills_never_make_a_check_wait() {
    let Some((_serial, server, rt)) = start(1) else {
        return;
    };
    // Far more budget than one thread can spend, in leases of a fraction of a second: many
    // refills, each asked for a horizon of demand ahead (a loaded machine may stall the
    // runtime's worker or Redis for a good part of it: at a load of 12-21 a 200 ms horizon saw
    // thousands of checks denied; the property under test is that checks do not wait for a
    // refill that arrives in time).
    let rule = RedisRule::gcra(Quota::per_second(1_000_000_000).unwrap()).unwrap();
    let config = LeaseConfig::new()
        .max_lease(8_000_000)
        .horizon(Duration::from_millis(400));
    let node = rt.block_on(async {
        let node = node(&server, "refill", rule, config).await;
        node.prefetch("k").await.unwrap();
        node
    });
    // For a time, not a number of checks: a lease lasts a horizon of the node's own demand,
    // so the refills a run sees follow its length, whatever the machine's speed.
    let run = Duration::from_millis(2_000);
    let before = node.stats().round_trips;
    let (mut checks, mut denied) = (0u64, 0u64);
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    while start.elapsed() < run {
        for i in 0..1024 {
            let t = (i == 0).then(Instant::now);
            if !node.check("k").unwrap().allowed() {
                denied += 1;
            }
            if let Some(t) = t {
                slowest = slowest.max(t.elapsed());
            }
        }
        checks += 1024;
    }
    let elapsed = start.elapsed();
    let stats = node.stats();
    println!(
        "{checks} checks in {elapsed:?}: {denied} denied, {} round trips, slowest sampled check \
         {slowest:?}",
        stats.round_trips
    );
    let refills = stats.round_trips - before;
    assert!(refills >= 2, "{refills} refills during the run");
    // A check that had to wait for a refill would be denied (a check never waits), and a
    // lease that ran dry before its refill denies every check until the grant lands: at
    // millions of checks a second, hundreds for each refill that comes late. A loaded machine
    // may starve the refill task for an instant (one denial in 4.6M checks was seen at a load
    // of 11), so a few in a million are let pass, printed above.
    assert!(
        denied * 1_000_000 <= checks,
        "{denied} checks of {checks} were denied while refills were in flight"
    );
}

#[test]
fn measure_leased_checks_per_second_and_round_trips() {
    let Some((_serial, server, rt)) = start(1) else {
        return;
    };
    for (label, limit) in [
        ("under the limit", 100_000_000u64),
        ("over the limit", 1_000_000),
    ] {
        let rule = RedisRule::gcra(Quota::per_second(limit).unwrap()).unwrap();
        let node = rt.block_on(async {
            let node = node(&server, label, rule, LeaseConfig::new()).await;
            node.prefetch("k").await.unwrap();
            node
        });
        let before = node.stats().round_trips;
        let admitted = AtomicU64::new(0);
        let start = Instant::now();
        let mut checks = 0u64;
        while start.elapsed() < Duration::from_secs(1) {
            for _ in 0..1024 {
                if node.check("k").unwrap().allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }
            checks += 1024;
        }
        let seconds = start.elapsed().as_secs_f64();
        let round_trips = node.stats().round_trips - before;
        let fraction = round_trips as f64 / checks as f64;
        println!(
            "leased, one node, one thread, {label} (L = {limit}/s): {:.2}M checks/s, {} \
             admitted, {round_trips} round trips = {:.5}% of checks",
            checks as f64 / seconds / 1e6,
            admitted.load(Ordering::Relaxed),
            100.0 * fraction
        );
        assert!(
            fraction <= 0.01,
            "{label}: {fraction} round trips per check"
        );
    }
}

#[test]
fn measure_two_threads_on_one_node() {
    let Some((_serial, server, rt)) = start(1) else {
        return;
    };
    let rule = RedisRule::gcra(Quota::per_second(1_000_000_000).unwrap()).unwrap();
    let node = rt.block_on(async {
        let node = node(&server, "two", rule, LeaseConfig::new()).await;
        node.prefetch("k").await.unwrap();
        node
    });
    let before = node.stats().round_trips;
    let start = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let node = node.clone();
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while start.elapsed() < Duration::from_secs(1) {
                    for _ in 0..1024 {
                        std::hint::black_box(node.check("k").unwrap());
                    }
                    checks += 1024;
                }
                checks
            })
        })
        .collect();
    let checks: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let seconds = start.elapsed().as_secs_f64();
    let round_trips = node.stats().round_trips - before;
    println!(
        "leased, one node, two threads on one key: {:.2}M checks/s, {round_trips} round trips = \
         {:.5}% of checks",
        checks as f64 / seconds / 1e6,
        100.0 * round_trips as f64 / checks as f64
    );
    assert!(round_trips as f64 <= 0.01 * checks as f64);
}

#[test]
fn exact_and_leased_nodes_share_one_budget() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    // One day's window: no boundary within the test (but for 1 run in ~20 000).
    const L: u64 = 10_000;
    let rule =
        RedisRule::fixed_window(Quota::new(L, Duration::from_secs(86_400)).unwrap()).unwrap();
    let (leased, exact) = rt.block_on(async {
        let leased = node(&server, "shared", rule, LeaseConfig::new()).await;
        let exact = RedisLimiter::builder(rule)
            .prefix("shared")
            .timeout(Duration::from_millis(500))
            .connect(&server.url())
            .await
            .unwrap();
        leased.prefetch("k").await.unwrap();
        (leased, exact)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = {
        let (leased, stop) = (leased.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut admitted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if leased.check("k").unwrap().allowed() {
                    admitted += 1;
                }
            }
            admitted
        })
    };
    let by_exact = rt.block_on(async {
        let mut admitted = 0u64;
        for _ in 0..2_000 {
            if exact.check("k").await.unwrap().allowed() {
                admitted += 1;
            }
        }
        admitted
    });
    // The leased node goes on until the global state, which counts both nodes, has nothing
    // left for anyone: a condition, not a time, as how long that takes depends on the machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(exact.peek("k", 0)).unwrap().remaining() > 0 {
        assert!(Instant::now() < deadline, "the budget was not spent");
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let by_leased = hammer.join().unwrap();
    let held = leased.held("k");
    println!("exact {by_exact} + leased {by_leased} admitted, {held} still leased, L = {L}");
    assert!(by_exact > 0, "the exact node got a share");
    assert!(by_exact + by_leased <= L);
    assert!(by_exact + by_leased + held + 4 * leased.max_lease() >= L);
}

#[test]
fn four_leased_nodes_on_a_cluster_never_exceed_the_limit() {
    let _serial = serial();
    let Some(cluster) = redis_server::RedisCluster::start(3) else {
        return;
    };
    const L: u64 = 20_000;
    let rule = RedisRule::fixed_window(Quota::per_second(L).unwrap()).unwrap();
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let runtimes: Vec<tokio::runtime::Runtime> = (0..4).map(|_| runtime(1)).collect();
    let nodes: Vec<_> = runtimes
        .iter()
        .map(|rt| {
            rt.block_on(async {
                let node = RedisLimiter::builder(rule)
                    .timeout(Duration::from_millis(500))
                    .connect_cluster(&urls)
                    .await
                    .expect("connects to the cluster")
                    .leased(
                        LeaseConfig::new(),
                        FailureHandling::new(FailurePolicy::FailClosed),
                    )
                    .await
                    .unwrap();
                for key in ["a", "b", "c"] {
                    node.prefetch(key).await.unwrap();
                }
                node
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, stop) = (node.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut per_window: HashMap<(u64, &str), u64> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    for key in ["a", "b", "c"] {
                        let before = wall_nanos() / SEC;
                        let allowed = node.check(key).unwrap().allowed();
                        let after = wall_nanos() / SEC;
                        if allowed && before == after {
                            *per_window.entry((after, key)).or_default() += 1;
                        }
                    }
                }
                per_window
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2_200));
    stop.store(true, Ordering::Relaxed);
    let mut total: HashMap<(u64, &str), u64> = HashMap::new();
    for t in threads {
        for (k, n) in t.join().unwrap() {
            *total.entry(k).or_default() += n;
        }
    }
    for ((w, key), n) in &total {
        println!("cluster: window {w}, key {key}: {n} admitted (certain) of L = {L}");
        // Straddling admissions are left out: this bound is on the certain ones only.
        assert!(*n <= L, "window {w}, key {key}: {n} > {L}");
    }
    assert!(
        total.values().any(|n| *n > L / 2),
        "the nodes were admitted"
    );
    drop(nodes);
}

/// The three leasable rules, `limit` per day (long windows: no boundary within a test).
fn leasable_per_day(limit: u64) -> [RedisRule; 3] {
    let quota = Quota::new(limit, Duration::from_secs(86_400)).unwrap();
    [
        RedisRule::fixed_window(quota).unwrap(),
        RedisRule::sliding_window(quota).unwrap(),
        RedisRule::gcra(quota).unwrap(),
    ]
}

/// Waits until no refill of `key` is queued or in flight on `node`: from then on its lease,
/// its stats and the global state change only with its next check.
fn quiescent<C: tollgate::redis::RedisConnection>(node: &LeasedLimiter<C>, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.refilling(key) {
        assert!(
            Instant::now() < deadline,
            "the refill of {key} did not land"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_first_touch_is_not_denied_and_the_grant_covers_it() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    for rule in leasable_per_day(1_000) {
        let name = rule.name();
        let config = LeaseConfig::new().max_lease(100).first_touch_share();
        let node = rt.block_on(node(&server, "first", rule, config));
        // No prefetch: the first checks of the key are served by the provisional allowance
        // (one node: min(1000 / 1, 100 / 4) = 25 units).
        assert_eq!(config.first_touch_for(1_000, 1), 25);
        let mut admitted = 0;
        for _ in 0..5 {
            admitted += node.check("k").unwrap().allowed() as u64;
        }
        assert_eq!(admitted, 5, "{name}: first touches are not denied");
        quiescent(&node, "k");
        let stats = node.stats();
        assert_eq!(stats.overdrawn, 0, "{name}: the grant covered them");
        // Counted when the grant lands: 0 if it landed before the first check took its unit
        // (the checking thread descheduled between asking and taking, on a loaded machine).
        assert!(stats.provisional <= 5, "{name}: {stats:?}");
        // The global state counts what was spent and what the node holds, nothing more.
        let held = node.held("k");
        let remaining = rt.block_on(node.exact().peek("k", 0)).unwrap().remaining();
        assert_eq!(remaining, 1_000 - 5 - held, "{name}");
        rt.block_on(node.release_all());
        let remaining = rt.block_on(node.exact().peek("k", 0)).unwrap().remaining();
        assert_eq!(
            remaining,
            1_000 - 5,
            "{name}: nothing provisional went back"
        );
        println!(
            "{name}: first touch admitted 5 ({} provisionally), all covered",
            stats.provisional
        );
    }
    // `first_touch(0)`: strict, the first check is denied until the first grant arrives.
    let [rule, ..] = leasable_per_day(1_000);
    let strict = rt.block_on(node(
        &server,
        "strict",
        rule,
        LeaseConfig::new().first_touch(0),
    ));
    // Denied, unless the grant landed between the check asking for it and taking its unit
    // (the checking thread descheduled on a loaded machine).
    let first = strict.check("k").unwrap().allowed();
    assert!(!first || strict.stats().granted > 0);
    quiescent(&strict, "k");
    assert!(strict.check("k").unwrap().allowed());
    assert_eq!(strict.stats().provisional, 0);
}

#[test]
fn a_first_touch_on_a_spent_key_is_charged_and_bounded_by_the_allowance() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    let day = Duration::from_secs(86_400);
    for rule in [
        RedisRule::fixed_window(Quota::new(100, day).unwrap()).unwrap(),
        RedisRule::gcra(Quota::new(100, day).unwrap()).unwrap(),
    ] {
        let name = rule.name();
        const A: u64 = 10;
        let node = rt.block_on(node(
            &server,
            "spent",
            rule,
            LeaseConfig::new().first_touch(A),
        ));
        // Another node (here the exact tier) spends the whole budget first.
        assert!(rt
            .block_on(node.exact().check_n("k", 100))
            .unwrap()
            .allowed());
        let mut admitted = 0;
        for _ in 0..2 * A {
            admitted += node.check("k").unwrap().allowed() as u64;
        }
        quiescent(&node, "k");
        let stats = node.stats();
        println!("{name}: spent key, first touch admitted {admitted}, stats {stats:?}");
        // Usually all A (the checks run before the empty grant returns); fewer if this thread
        // was descheduled long enough for the grant to void the unspent allowance first.
        assert!(admitted <= A, "{name}: bounded by the allowance");
        assert_eq!(stats.granted, 0, "{name}: nothing left to grant");
        assert_eq!(stats.provisional, admitted, "{name}");
        assert_eq!(stats.overdrawn, admitted, "{name}: none covered");
        assert_eq!(
            node.held("k"),
            0,
            "{name}: the uncovered units left were taken back"
        );
        assert!(
            !node.check("k").unwrap().allowed(),
            "{name}: denied from now on"
        );
        // Charged: the global state counts every unit admitted, past the limit.
        let d = rt.block_on(node.exact().peek("k", 1)).unwrap();
        assert!(!d.allowed() && d.remaining() == 0, "{name}");
        let mut conn = node.exact().connection().clone();
        let state: String = rt
            .block_on(
                redis::cmd("GET")
                    .arg(node.exact().redis_key("k"))
                    .query_async(&mut conn),
            )
            .unwrap();
        let counted: u64 = state.rsplit(' ').next().unwrap().parse().unwrap();
        let expected = match name {
            // Units: L + the overdraft.
            "fixed-window" => 100 + admitted,
            // GCRA stores its debt in ns: T = 864 s per unit, (L + overdraft)·T less the
            // little that has drained since.
            _ => (100 + admitted) * 864_000_000_000,
        };
        assert!(
            counted <= expected && counted + 10 * SEC > expected,
            "{name}: state {state}, expected about {expected}"
        );
    }
}

#[test]
fn leased_figures_report_the_global_state_of_the_last_grant() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    for rule in leasable_per_day(1_000) {
        let name = rule.name();
        let node = rt.block_on(async {
            let node = node(&server, "figures", rule, LeaseConfig::new().max_lease(100)).await;
            node.prefetch("k").await.unwrap();
            node
        });
        let held = node.held("k");
        assert!(held > 1);
        let d = node.check("k").unwrap();
        // One node: what it knows is the whole truth. 999 units left: 1 spent.
        assert!(d.allowed());
        assert_eq!(d.remaining(), 999, "{name}");
        let exact = rt.block_on(node.exact().peek("k", 0)).unwrap();
        // The exact tier counts the lease as spent; the leased figure adds it back.
        assert_eq!(exact.remaining() + held - 1, 999, "{name}");
        // reset_after: the state's own at the grant, less the time since (the grant's view
        // is a little older than the peek, and a fixed window's end is judged late by the
        // node, never early).
        let (leased, exact) = (d.reset_after(), exact.reset_after());
        assert!(
            leased + Duration::from_millis(10) >= exact && leased <= exact + Duration::from_secs(2),
            "{name}: leased {leased:?}, exact {exact:?}"
        );
        println!(
            "{name}: remaining {} reset {leased:?} (exact {exact:?})",
            d.remaining()
        );
        drop(node);
    }
}

#[test]
fn many_keys_refill_in_few_round_trips() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    const KEYS: u64 = 2_000;
    let day = Duration::from_secs(86_400);
    let rule = RedisRule::fixed_window(Quota::new(1_000, day).unwrap()).unwrap();
    let config = LeaseConfig::new().idle_timeout(Duration::from_secs(60));
    let node = rt.block_on(node(&server, "many", rule, config));
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key{i}")).collect();
    // Every key touched once, from one thread: their first grants are all due at once.
    for key in &keys {
        let _ = node.check(key).unwrap();
    }
    for key in &keys {
        quiescent(&node, key);
    }
    let granted = node.stats();
    rt.block_on(node.release_all());
    let released = node.stats();
    let (grants, returns) = (
        granted.round_trips,
        released.round_trips - granted.round_trips,
    );
    println!(
        "{KEYS} keys: first grants in {grants} script calls ({:.1} keys per call), returns in {returns} ({} units)",
        KEYS as f64 / grants as f64,
        released.returned
    );
    assert!(
        grants <= KEYS / 2,
        "refills of keys due together are batched"
    );
    assert!(returns <= KEYS.div_ceil(256), "one call per 256 returns");
}

#[test]
fn a_leased_node_charges_what_its_policy_admitted_during_an_outage() {
    let Some((_serial, mut server, rt)) = start(2) else {
        return;
    };
    let [rule, ..] = leasable_per_day(1_000);
    let handling = FailureHandling::new(FailurePolicy::Local)
        .probe_interval(Duration::from_millis(20))
        .reconcile(true);
    let node = rt.block_on(async {
        let node = RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(50))
            .connect(&server.url())
            .await
            .unwrap()
            .leased(LeaseConfig::new().max_lease(100), handling)
            .await
            .unwrap();
        node.prefetch("k").await.unwrap();
        node
    });
    let held = node.held("k");
    server.signal("KILL");
    // The lease's units were granted before the outage: spending them owes nothing.
    for _ in 0..held {
        assert!(node.check("k").unwrap().allowed());
    }
    assert_eq!(node.unreconciled(), 0);
    // Then the refill fails, and the local share admits: once that refill has failed while
    // the breaker is still closed, and once it is open. Those are owed.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut local = 0;
    while node.mode() == GuardMode::Global {
        assert!(Instant::now() < deadline, "the breaker did not open");
        local += node.check("k").unwrap().allowed() as u64;
        std::thread::sleep(Duration::from_millis(5));
    }
    let before_open = local;
    for _ in 0..30 {
        assert!(
            node.check("k").unwrap().allowed(),
            "one node's share is the whole quota"
        );
    }
    local += 30;
    assert_eq!(node.unreconciled(), local);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.mode() != GuardMode::Global || node.unreconciled() > 0 {
        assert!(Instant::now() < deadline, "not reconciled");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(node.reconciled(), local);
    // The restarted server is empty: it counts the charge (and whatever the node was granted
    // since the recovery, which it holds).
    quiescent(&node, "k");
    let remaining = rt.block_on(node.exact().peek("k", 0)).unwrap().remaining();
    assert_eq!(remaining + node.held("k"), 1_000 - local);
    println!(
        "leased: {held} units spent from the lease, {local} admitted locally ({before_open} \
         before the breaker opened) and charged after the restart"
    );
}

#[test]
fn refills_and_returns_of_many_keys_on_a_cluster_go_per_slot() {
    let _serial = serial();
    let Some(cluster) = redis_server::RedisCluster::start(3) else {
        return;
    };
    let rt = runtime(2);
    const KEYS: u64 = 500;
    let [rule, ..] = leasable_per_day(1_000);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let node = rt.block_on(async {
        RedisLimiter::builder(rule)
            .timeout(Duration::from_millis(500))
            .connect_cluster(&urls)
            .await
            .expect("connects to the cluster")
            .leased(
                LeaseConfig::new()
                    .idle_timeout(Duration::from_secs(60))
                    .first_touch_share(),
                FailureHandling::new(FailurePolicy::FailClosed),
            )
            .await
            .unwrap()
    });
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key{i}")).collect();
    for key in &keys {
        assert!(node.check(key).unwrap().allowed(), "first touch of {key}");
    }
    for key in &keys {
        quiescent(&node, key);
    }
    // Every key's grant landed (a call mixing slots would have failed with CROSSSLOT).
    let stats = node.stats();
    assert_eq!(stats.refills, KEYS);
    assert_eq!((stats.provisional, stats.overdrawn), (KEYS, 0));
    let held: u64 = keys.iter().map(|key| node.held(key)).sum();
    assert_eq!(
        stats.granted,
        held + KEYS,
        "each key spent one unit of its grant"
    );
    rt.block_on(node.release_all());
    let released = node.stats();
    assert_eq!(released.returned, held);
    for key in keys.iter().step_by(50) {
        let remaining = rt.block_on(node.exact().peek(key, 0)).unwrap().remaining();
        assert_eq!(remaining, 999, "{key}");
    }
    println!(
        "cluster, {KEYS} keys: {} grant calls, {} return calls (one per slot)",
        stats.round_trips,
        released.round_trips - stats.round_trips
    );
}

/// The fleet of the slow-client tests: three leased nodes on their own connections, with the
/// defaults of a deployment (`LeaseConfig::new()`, `Local` told the fleet's size, the
/// breaker's defaults), a 250 ms call timeout (generous: the machine is loaded, and a check
/// waits at most that long).
async fn fleet(server: &RedisServer, prefix: &str, rule: RedisRule) -> Vec<LeasedLimiter> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let handling = FailureHandling::new(FailurePolicy::Local).assumed_nodes(3);
        let node = RedisLimiter::builder(rule)
            .prefix(prefix)
            .timeout(Duration::from_millis(250))
            .connect(&server.url())
            .await
            .expect("connects")
            .leased(LeaseConfig::new(), handling)
            .await
            .expect("a leasable rule");
        nodes.push(node);
    }
    nodes
}

/// One client's check, as a server on a leased node makes it.
async fn ask(node: &LeasedLimiter, key: &str) -> bool {
    node.check_waiting(key).await.expect("no error").allowed()
}

/// The scaled rule of the slow-client tests: GCRA, 100 per 24 s (burst 100), so `T` = 240 ms.
/// It stands for 100 a minute with requests 1.5 s apart, scaled by 2.5 in time: a client at
/// 40 % of it sends every 600 ms, and to the three nodes in turn each node sees it every 1.8 s,
/// past the default idle timeout (1 s, unscaled) and the sweep that follows it (at most
/// 250 ms later): every visit meets a lease the node has retired, as every visit does at
/// 1.5 s apart (4.5 s a node). The rule's decisions depend only on the ratios, which the
/// scaling keeps.
const SLOW_T: Duration = Duration::from_millis(240);

fn slow_rule() -> RedisRule {
    RedisRule::gcra(Quota::new(100, SLOW_T * 100).unwrap()).unwrap()
}

/// A client at 40 % of its limit, `requests` requests 600 ms apart to the nodes in turn:
/// how many were refused. With `flap`, that server is stopped (SIGSTOP) in the middle, long
/// enough for the breakers to open (600 ms against a 250 ms timeout), then resumed; the
/// second figure says whether a node's breaker was seen open then.
async fn slow_client(
    nodes: &[LeasedLimiter],
    key: &str,
    requests: usize,
    flap: Option<&RedisServer>,
) -> (usize, bool) {
    let (mut refused, mut opened) = (0, false);
    for i in 0..requests {
        match flap {
            Some(server) if i == requests / 2 => server.signal("STOP"),
            Some(server) if i == requests / 2 + 1 => {
                opened = nodes.iter().any(|node| node.mode() != GuardMode::Global);
                server.signal("CONT");
            }
            _ => {}
        }
        let node = &nodes[i % nodes.len()];
        if !ask(node, key).await {
            println!("request {i} refused, node {:?}", node.mode());
            refused += 1;
        }
        tokio::time::sleep(SLOW_T * 100 / 40).await;
    }
    (refused, opened)
}

/// A client at 100 % of its limit: `requests` requests one `T` apart to the nodes in turn
/// (none may be refused: the bucket never runs low), then a burst of 150 at once. Each
/// refusal must come past the limit: when the token bucket of what the fleet admitted holds
/// fewer units than the nodes' leases may (3 × the largest lease, the under-admission bound
/// on `LeasedLimiter`). Returns the refusals at the rate, and checks the burst's.
async fn full_client(nodes: &[LeasedLimiter], key: &str, requests: usize) -> usize {
    let t = SLOW_T.as_nanos() as u64;
    let (capacity, slack) = (100, 3 * nodes[0].max_lease() + 1);
    let start = Instant::now();
    // The token bucket of the admissions: its theoretical arrival time, ns since `start`.
    let mut tat = 0u64;
    let admit = |tat: &mut u64, at: u64| *tat = (*tat).max(at) + t;
    let mut refused = 0;
    for i in 0..requests {
        if ask(&nodes[i % nodes.len()], key).await {
            admit(&mut tat, start.elapsed().as_nanos() as u64);
        } else {
            refused += 1;
        }
        tokio::time::sleep(SLOW_T).await;
    }
    let mut admitted_in_burst = 0;
    for i in 0..150 {
        let now = start.elapsed().as_nanos() as u64;
        if ask(&nodes[i % nodes.len()], key).await {
            admit(&mut tat, now);
            admitted_in_burst += 1;
        } else {
            let left = (now + capacity * t).saturating_sub(tat.max(now)) / t;
            assert!(
                left < slack,
                "refused at burst request {i} with {left} units left in the bucket"
            );
        }
    }
    let elapsed = start.elapsed().as_nanos() as u64;
    let horizon = 50_000_000;
    // The fleet bound over the client's whole run.
    let bound = capacity + 1 + (elapsed + horizon) / t;
    let admitted = (requests - refused) as u64 + admitted_in_burst;
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    println!(
        "full client: {refused} of {requests} refused at the rate, {admitted_in_burst} of 150 \
         admitted in the burst, {admitted} in all (bound {bound})"
    );
    refused
}

/// Three leased nodes with the defaults: a client at 40 % of its limit whose requests reach
/// each node less often than the idle timeout is never refused (each of its checks meets a
/// retired lease); one at 100 % is refused only past the limit.
#[test]
fn a_client_under_its_limit_is_never_refused_by_three_leased_nodes() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    rt.block_on(async {
        let nodes = fleet(&server, "slow", slow_rule()).await;
        let ((refused_slow, _), refused_full) = tokio::join!(
            slow_client(&nodes, "slow", 16, None),
            full_client(&nodes, "full", 24),
        );
        println!("slow client: {refused_slow} of 16 refused");
        assert_eq!(refused_slow, 0, "a client at 40 % was refused");
        assert_eq!(refused_full, 0, "a client at 100 % was refused at the rate");
    });
}

/// The same with a breaker flap in the middle: Redis stopped (SIGSTOP) long enough for the
/// breakers to open, then resumed, while both clients send; the nodes serve by their `Local`
/// shares meanwhile (told the fleet's size) and go back to their leases after, the hot key's
/// emptied by the handover. The burst comes after the recovery.
#[test]
fn a_client_under_its_limit_is_never_refused_across_a_breaker_flap() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    rt.block_on(async {
        let nodes = fleet(&server, "flap", slow_rule()).await;
        let ((refused_slow, opened), refused_full) = tokio::join!(
            slow_client(&nodes, "slow", 16, Some(&server)),
            full_client(&nodes, "full", 48),
        );
        println!("slow client across a flap: {refused_slow} of 16 refused");
        assert!(opened, "no breaker opened: no flap");
        assert_eq!(refused_slow, 0, "a client at 40 % was refused");
        assert_eq!(refused_full, 0, "a client at 100 % was refused at the rate");
        for node in &nodes {
            assert_eq!(node.mode(), GuardMode::Global, "back to global");
        }
    });
}

/// A first-touch allowance comes once per key and node while the key's budget is spent, not
/// once per idle period: a client on a spent key who lets the node's lease go idle (and be
/// given back) before each request gets no allowance again. The waits only give the sweeper
/// time to retire the lease; a lease still held would pass the test as well.
#[test]
fn a_spent_key_farms_no_first_touch_allowance_across_idle_periods() {
    let Some((_serial, server, rt)) = start(2) else {
        return;
    };
    let day = Duration::from_secs(86_400);
    for rule in [
        RedisRule::fixed_window(Quota::new(1_000, day).unwrap()).unwrap(),
        RedisRule::gcra(Quota::new(1_000, day).unwrap()).unwrap(),
    ] {
        let name = rule.name();
        let config = LeaseConfig::new()
            .first_touch_share()
            .idle_timeout(Duration::from_millis(50));
        let node = rt.block_on(node(&server, name, rule, config));
        // One node: min(1000 / 1, 62 / 4) = 15 units a first touch.
        let allowance = config.first_touch_for(1_000, 1);
        assert_eq!(allowance, 15);
        // Another node (here the exact tier) spends the whole budget first.
        assert!(rt
            .block_on(node.exact().check_n("k", 1_000))
            .unwrap()
            .allowed());
        let mut admitted = Vec::new();
        for _ in 0..5 {
            let mut now = 0;
            for _ in 0..2 * allowance {
                now += node.check("k").unwrap().allowed() as u64;
            }
            admitted.push(now);
            quiescent(&node, "k");
            // Past the idle timeout and the sweep after it (period 12.5 ms, floored at 5).
            std::thread::sleep(Duration::from_millis(300));
        }
        let stats = node.stats();
        println!("{name}: admitted per idle period {admitted:?}, stats {stats:?}");
        let total: u64 = admitted.iter().sum();
        assert!(
            total <= allowance,
            "{name}: {admitted:?} farmed across idle periods"
        );
        assert_eq!(stats.overdrawn, total, "{name}");
    }
}

/// On a 3-master Cluster, one master stopped (`SIGSTOP`): a leased node hands over to its
/// `Local` policy only the leases of that master's keys (emptied); the other masters' keys
/// keep their leases and stay `Global`. After `SIGCONT` the stopped master's keys are global
/// again. The Cluster does not require full coverage, so the other masters serve past the
/// node timeout; deadlines only catch a hang.
#[test]
fn a_stopped_cluster_master_hands_over_only_the_leases_of_its_keys() {
    let _serial = serial();
    let Some(cluster) =
        redis_server::RedisCluster::start_with(3, &["--cluster-require-full-coverage", "no"])
    else {
        return;
    };
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    runtime(2).block_on(async {
        let rule =
            RedisRule::gcra(Quota::new(1_000_000, Duration::from_secs(86_400)).unwrap()).unwrap();
        let policy = FailurePolicy::Local;
        let exact = RedisLimiter::builder(rule)
            .prefix("lease-owners")
            .timeout(Duration::from_millis(250))
            .connect_cluster(&urls)
            .await
            .expect("connects");
        let raw = exact.connection();
        let keys: Vec<String> = (0..48).map(|i| format!("user:{i}")).collect();
        let stopped_port = cluster.nodes()[1].port();
        let (down, up) = split_by_master(&raw, &keys, |k| exact.redis_key(k), stopped_port).await;
        let leased = exact
            .leased(
                LeaseConfig::new(),
                FailureHandling::new(policy).assumed_nodes(1),
            )
            .await
            .expect("a leasable rule");
        for key in &keys {
            leased.prefetch(key).await.unwrap();
            assert!(leased.held(key) > 0, "{key}: a lease");
        }
        assert_eq!(leased.mode(), GuardMode::Global);

        let node = &cluster.nodes()[1];
        tokio::task::block_in_place(|| node.signal("STOP"));
        let stopped = Instant::now();
        // The stopped master's keys spend their leases and ask for refills, which time out
        // and open its breaker; the other keys are checked too, from their leases.
        loop {
            assert!(
                stopped.elapsed() < Duration::from_secs(30),
                "the stopped master's keys not degraded: {:?}",
                down.iter().map(|k| leased.mode_of(k)).collect::<Vec<_>>()
            );
            for key in &down {
                for _ in 0..200 {
                    leased.check(key).unwrap();
                }
            }
            for key in &up {
                assert!(leased.check(key).unwrap().allowed(), "{key}");
            }
            let all_down = down
                .iter()
                .all(|k| leased.mode_of(k) == GuardMode::Degraded(policy));
            if all_down {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // One more check each: the first after the opening hands the leases over.
        for key in &down {
            leased.check(key).unwrap();
        }
        let degraded_after = stopped.elapsed();
        assert_eq!(leased.mode(), GuardMode::Degraded(policy));
        for key in &down {
            assert_eq!(leased.held(key), 0, "{key}: handed over to the policy");
        }
        for key in &up {
            assert_eq!(leased.mode_of(key), GuardMode::Global, "{key}");
            assert!(leased.held(key) > 0, "{key}: its lease is kept");
            assert!(leased.check(key).unwrap().allowed(), "{key}");
        }

        tokio::task::block_in_place(|| node.signal("CONT"));
        let resumed = Instant::now();
        while leased.mode() != GuardMode::Global {
            assert!(
                resumed.elapsed() < Duration::from_secs(30),
                "not global after SIGCONT: breaker {:?}",
                leased.breaker()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let global_after = resumed.elapsed();
        for key in &down {
            assert!(leased.check_waiting(key).await.unwrap().allowed(), "{key}");
            assert_eq!(leased.mode_of(key), GuardMode::Global, "{key}");
        }
        eprintln!(
            "{} keys on the stopped master handed over {degraded_after:?} after SIGSTOP, {} \
             kept their leases; global {global_after:?} after SIGCONT",
            down.len(),
            up.len()
        );
    });
}
