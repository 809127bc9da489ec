//! Connections that heal: a node whose connection stops answering (a network black hole: the
//! socket stays open, nothing comes back) while a new connection would work is back to
//! `Global` within seconds, because the guarded tier's probes replace the connection.
//!
//! The test puts a small TCP relay of its own between the node and a real `redis-server`; on
//! a signal the relay stops forwarding on the connections it has (it keeps them open and drops
//! what arrives, both ways) while it accepts and forwards new ones.
//!
//! Run with `cargo test --features redis,tokio --test redis_heal`.

#![cfg(feature = "redis")]

#[path = "support/redis_client.rs"]
mod redis_client;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_client::runtime;
use redis_server::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::redis::{
    BreakerState, FailureHandling, FailurePolicy, GuardMode, LeaseConfig, RedisLimiter, RedisRule,
};
use tollgate::Quota;

const TIMEOUT: Duration = Duration::from_millis(50);

/// A relay on a loopback port of its own to `target`. Every connection remembers the epoch
/// it was accepted in and forwards only while the epoch is still that one.
struct Relay {
    port: u16,
    epoch: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    /// Where new connections are forwarded.
    target: Arc<AtomicU16>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let epoch = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let target = Arc::new(AtomicU16::new(target));
        let (e, a, t) = (epoch.clone(), accepted.clone(), target.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::Relaxed);
                let to = t.load(Ordering::Relaxed);
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let born = e.load(Ordering::Relaxed);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(client_read, server_write, e.clone(), born));
                tokio::spawn(forward(server_read, client_write, e.clone(), born));
            }
        });
        Relay {
            port,
            epoch,
            accepted,
            target,
        }
    }

    /// New connections go to `port` (the ones open stay where they are).
    fn point_to(&self, port: u16) {
        self.target.store(port, Ordering::Relaxed);
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The connections open now stop forwarding (for good); new ones are forwarded.
    fn black_hole(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// Copies `from` to `to` while `epoch` is `born`; after that reads and drops, keeping both open.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    epoch: Arc<AtomicU64>,
    born: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if epoch.load(Ordering::Relaxed) == born && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Polls `done` every 5 ms; fails the test after `within`. Returns how long it took.
async fn until(within: Duration, what: &str, done: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Black-holes the relay's open connections under a node whose breaker and mode `state`
/// reads: the breaker opens within `open_within`, and the node is `Global` again within
/// 15 s, over a new connection.
async fn black_hole_and_heal(
    relay: &Relay,
    tier: &str,
    open_within: Duration,
    state: impl Fn() -> (BreakerState, GuardMode),
) {
    let before = relay.accepted();
    relay.black_hole();
    let opened = until(open_within, "breaker open", || {
        state().0 != BreakerState::Closed
    })
    .await;
    let back = until(Duration::from_secs(15), "global again", || {
        state().1 == GuardMode::Global
    })
    .await;
    eprintln!(
        "black hole ({tier}): breaker open after {opened:?}, global again {back:?} later, \
         {} new connection(s)",
        relay.accepted() - before
    );
    assert!(relay.accepted() > before, "a new connection was made");
}

/// A guarded node under load whose connection is black-holed: the breaker opens, and the
/// probes replace the connection, so the node is `Global` again within seconds (the kernel
/// would keep the old socket for minutes: the relay acknowledges every byte).
#[test]
fn a_guarded_node_whose_connection_is_black_holed_is_global_again_within_seconds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let relay = Relay::start(server.port()).await;
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let limiter = RedisLimiter::builder(rule)
            .timeout(TIMEOUT)
            .connect(&relay.url())
            .await
            .expect("connects through the relay")
            .guarded(FailureHandling::new(FailurePolicy::Local))
            .await;
        let stop = Arc::new(AtomicBool::new(false));
        let load: Vec<_> = (0..4)
            .map(|task| {
                let (l, stop) = (limiter.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        l.check(format!("user{task}-{}", n % 16))
                            .await
                            .expect("transient failures are absorbed");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(limiter.mode(), GuardMode::Global, "global before the hole");
        black_hole_and_heal(&relay, "guarded", Duration::from_secs(5), || {
            (limiter.breaker(), limiter.mode())
        })
        .await;
        // The checks use the new connection too.
        let decision = limiter.exact().check("after").await.expect("Redis answers");
        assert!(decision.allowed());
        stop.store(true, Ordering::Relaxed);
        for task in load {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("every load task stops when told")
                .expect("no load task panicked");
        }
    });
}

/// The same for a leased node: its refills and heartbeats share the replaced connection.
#[test]
fn a_leased_node_whose_connection_is_black_holed_is_global_again_within_seconds() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let relay = Relay::start(server.port()).await;
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let limiter = RedisLimiter::builder(rule)
            .timeout(TIMEOUT)
            .connect(&relay.url())
            .await
            .expect("connects through the relay")
            .leased(
                LeaseConfig::new(),
                FailureHandling::new(FailurePolicy::Local),
            )
            .await
            .expect("a leased limiter");
        for n in 0..32 {
            limiter
                .check_waiting(format!("user-{n}"))
                .await
                .expect("answers");
        }
        assert_eq!(limiter.mode(), GuardMode::Global, "global before the hole");
        // The heartbeat (every second by default with `Local`) or a refill meets the hole.
        black_hole_and_heal(&relay, "leased", Duration::from_secs(10), || {
            (limiter.breaker(), limiter.mode())
        })
        .await;
        let decision = limiter.check_waiting("after").await.expect("Redis answers");
        assert!(decision.allowed());
    });
}

/// A master demoted without its clients being cut (`REPLICAOF` keeps them), while the
/// address the node uses now leads to the new master: the node's writes meet `READONLY`, the
/// breaker opens, the probe that meets `READONLY` replaces the connection, and the node is
/// `Global` again, on the new master.
#[test]
fn a_guarded_node_on_a_demoted_master_is_global_again_on_the_new_one() {
    let Some(old) = RedisServer::start() else {
        return;
    };
    let Some(new) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let relay = Relay::start(old.port()).await;
        let rule = RedisRule::gcra(Quota::per_second(1_000_000).unwrap()).unwrap();
        let limiter = RedisLimiter::builder(rule)
            .timeout(TIMEOUT)
            .connect(&relay.url())
            .await
            .expect("connects through the relay")
            .guarded(FailureHandling::new(FailurePolicy::FailOpen))
            .await;
        for n in 0..16 {
            limiter.check(format!("user-{n}")).await.expect("answers");
        }
        assert_eq!(
            limiter.mode(),
            GuardMode::Global,
            "global before the failover"
        );

        // The failover: the address leads to the new master, the old one becomes its replica.
        relay.point_to(new.port());
        let mut admin = redis::Client::open(old.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connects to the old master");
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(new.port())
            .query_async(&mut admin)
            .await
            .expect("REPLICAOF");
        let demoted = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let load = {
            let (l, stop) = (limiter.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    l.check(format!("user-{}", n % 16))
                        .await
                        .expect("READONLY is absorbed");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        let opened = until(Duration::from_secs(10), "breaker open", || {
            limiter.breaker() != BreakerState::Closed
        })
        .await;
        let back = until(Duration::from_secs(15), "global again", || {
            limiter.mode() == GuardMode::Global
        })
        .await;
        eprintln!(
            "demoted master: breaker open after {opened:?}, global again {back:?} later \
             ({:?} after REPLICAOF)",
            demoted.elapsed()
        );
        stop.store(true, Ordering::Relaxed);
        tokio::time::timeout(Duration::from_secs(5), load)
            .await
            .expect("the load stops when told")
            .expect("the load did not panic");
        // The exact tier underneath, so that a failed call is seen, not absorbed by the policy
        // (the new master forks for its replica's first sync: a call may meet the pause). The
        // whole burst, so that the key's state lives a second (a unit of this quota is 1 µs:
        // its state would expire before the EXISTS below).
        let mut answered = false;
        for _ in 0..50 {
            if limiter.exact().check_n("after", 1_000_000).await.is_ok() {
                answered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(answered, "a check after the failover is answered");
        let mut on_new = redis::Client::open(new.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connects to the new master");
        let exists: bool = redis::cmd("EXISTS")
            .arg(limiter.exact().redis_key("after"))
            .query_async(&mut on_new)
            .await
            .expect("EXISTS");
        assert!(
            exists,
            "the check after the failover was decided by the new master"
        );
    });
}
