//! Two axum servers behind one global limit: the tower layer over the Redis tier (features
//! `tower`, `redis`, `axum`), against a `redis-server` this test starts on 127.0.0.1 (a free
//! port, no persistence; see `tests/support/redis_server.rs`).
//!
//! Run with `cargo test --features axum,redis --test tower_redis`.

#![cfg(all(feature = "axum", feature = "redis"))]

#[path = "support/redis_client.rs"]
mod redis_client;
#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/tower.rs"]
mod tower_support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use redis::aio::ConnectionManager;
use redis_client::runtime;
use redis_server::RedisServer;
use tollgate::redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule};
use tollgate::tower::{
    redis_key, CheckBackend, HeaderStyle, Key, Policy, QuotaInfo, RateLimitLayer, RedisBackend,
};
use tollgate::Quota;
use tower_support::{client, Http};

/// Serves a router limited by `backend` under policy "api" on 127.0.0.1:0.
async fn serve(backend: impl CheckBackend) -> SocketAddr {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("api", backend).path_prefix("/api"))
        .headers(HeaderStyle::Both)
        .build()
        .expect("a valid layer");
    serve_layer(layer).await
}

async fn serve_layer(layer: RateLimitLayer) -> SocketAddr {
    let app = Router::new()
        .route("/api/x", get(|| async { "ok" }))
        .route("/other", get(|| async { "ok" }))
        .layer(layer);
    tower_support::serve(app).await
}

struct Reply {
    status: StatusCode,
    policy: Option<String>,
    remaining: Option<String>,
    limit: Option<String>,
}

async fn get_api(http: &Http, addr: SocketAddr) -> Reply {
    get_path(http, addr, "/api/x").await
}

async fn get_path(http: &Http, addr: SocketAddr, path: &str) -> Reply {
    let request = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = http.request(request).await.expect("the server answers");
    let (parts, body) = response.into_parts();
    body.collect().await.expect("a body");
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII").to_owned())
    };
    Reply {
        status: parts.status,
        policy: header("ratelimit-policy"),
        remaining: header("x-ratelimit-remaining"),
        limit: header("x-ratelimit-limit"),
    }
}

/// A limiter on its own connection (as on another node), with a prefix unique to this test
/// run so that the two servers of one case share keys and no other case does.
async fn node(server: &RedisServer, quota: Quota, prefix: &str) -> RedisLimiter {
    let client = redis::Client::open(server.url()).expect("a valid URL");
    let conn = ConnectionManager::new(client).await.expect("connects");
    RedisLimiter::builder(RedisRule::gcra(quota).expect("a valid rule"))
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build(conn)
}

fn prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("tower{}", N.fetch_add(1, Ordering::Relaxed))
}

#[test]
fn two_servers_share_one_exact_global_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        // 5 an hour per client IP: nothing refills during the test.
        let quota = Quota::per_hour(5).unwrap();
        let prefix = prefix();
        let a = serve(RedisBackend::new(node(&server, quota, &prefix).await)).await;
        let b = serve(RedisBackend::new(node(&server, quota, &prefix).await)).await;
        let http = client();
        let mut statuses = Vec::new();
        for i in 0..8 {
            let reply = get_api(&http, if i % 2 == 0 { a } else { b }).await;
            assert_eq!(reply.policy.as_deref(), Some("\"api\";q=5;w=3600"));
            statuses.push((reply.status.as_u16(), reply.remaining));
        }
        let want: Vec<(u16, Option<String>)> = [
            (200, 4),
            (200, 3),
            (200, 2),
            (200, 1),
            (200, 0),
            (429, 0),
            (429, 0),
            (429, 0),
        ]
        .into_iter()
        .map(|(s, r)| (s, Some(r.to_string())))
        .collect();
        assert_eq!(statuses, want);
    });
}

/// What the rate-limit headers show is read from the limiter's rules, each in its order: the
/// backend is given no quota that could disagree with them.
#[test]
fn a_backend_shows_its_rules_quotas() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let fast = Quota::per_second(10).unwrap().with_burst(20).unwrap();
        let exact = node(&server, fast, &prefix()).await;
        let hourly = RedisRule::sliding_window(Quota::per_hour(1000).unwrap()).unwrap();
        let info = |limit, secs| QuotaInfo {
            limit,
            window: Duration::from_secs(secs),
        };
        let one = RedisBackend::new(exact.clone());
        assert_eq!((one.quota_count(), one.quota(0)), (1, Some(info(10, 1))));
        assert_eq!(one.quota(1), None);
        let gcra_hourly = RedisRule::gcra(Quota::per_hour(1000).unwrap()).unwrap();
        let both = RedisBackend::new(exact.with_rules([gcra_hourly]).unwrap());
        assert_eq!(both.quota_count(), 2);
        assert_eq!(both.quota(0), Some(info(10, 1)));
        assert_eq!(both.quota(1), Some(info(1000, 3600)));
        assert_eq!(both.quota(2), None);
        // Another algorithm, its own window.
        let client = redis::Client::open(server.url()).unwrap();
        let conn = ConnectionManager::new(client).await.unwrap();
        let window = RedisBackend::new(RedisLimiter::builder(hourly).build(conn));
        assert_eq!(window.quota(0), Some(info(1000, 3600)));
    });
}

#[test]
fn guarded_and_leased_nodes_hold_the_limit_too() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let quota = Quota::per_hour(6).unwrap();
        let prefix = prefix();
        let handling = || FailureHandling::new(FailurePolicy::FailClosed);
        // One guarded node (exact while Redis answers) and one leased node share a budget.
        let guarded = node(&server, quota, &prefix)
            .await
            .guarded(handling())
            .await;
        let leased = node(&server, quota, &prefix)
            .await
            .leased(LeaseConfig::new().max_lease(2), handling())
            .await
            .expect("GCRA can be leased");
        // The client's key as the layer sends it: 127.0.0.1 (the servers see the loopback).
        let key = redis_key(&Key::Ip("127.0.0.1".parse().unwrap()));
        leased.prefetch(&key).await.expect("a first grant");
        let (guarded, leased) = (RedisBackend::new(guarded), RedisBackend::new(leased));
        // The headers' quota is the rule's, read through the guard and the lease.
        let info = QuotaInfo {
            limit: 6,
            window: Duration::from_secs(3600),
        };
        for backend in [&guarded as &dyn CheckBackend, &leased] {
            assert_eq!((backend.quota_count(), backend.quota(0)), (1, Some(info)));
            assert_eq!(backend.quota(1), None);
        }
        // Redis answers: neither is degraded (the layer's `tollgate_backend_degraded` gauge).
        assert_eq!(
            (guarded.degraded(), leased.degraded()),
            (Some(false), Some(false))
        );
        let a = serve(guarded).await;
        let b = serve(leased).await;
        let http = client();
        let mut admitted = 0;
        let mut from_leased = 0;
        for i in 0..16 {
            let on_b = i % 2 == 1;
            let reply = get_api(&http, if on_b { b } else { a }).await;
            if reply.status == StatusCode::OK {
                admitted += 1;
                from_leased += usize::from(on_b);
            } else {
                assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
            }
        }
        // Never more than the global limit; the leased node spent at least its first grant.
        assert!(admitted <= 6, "admitted {admitted}");
        assert!(from_leased >= 1, "the leased node admitted nothing");
    });
}

/// A leased node behind the layer answers a key's first request (no prefetch: a deploy) with
/// the grant it waits for, not a 429; the layer's own `Key` prefetches the lease the layer
/// spends (`redis_key`).
#[test]
fn a_leased_node_serves_a_keys_first_request_and_prefetches_by_the_layers_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        let quota = Quota::per_hour(100).unwrap();
        let handling = FailureHandling::new(FailurePolicy::Local).assumed_nodes(2);
        let leased = node(&server, quota, &prefix())
            .await
            .leased(LeaseConfig::new(), handling)
            .await
            .expect("GCRA can be leased");
        let backend = RedisBackend::new(leased.clone());
        let tenant = Key::from("tenant-7");
        backend.prefetch(&tenant).await.expect("a first grant");
        assert!(
            leased.held(redis_key(&tenant)) > 0,
            "the layer's key is leased"
        );
        let addr = serve(backend).await;
        // The client's key as the layer sends it, never seen by this node.
        let client_key = redis_key(&Key::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(leased.held(&client_key), 0);
        let reply = get_api(&client(), addr).await;
        assert_eq!(reply.status, StatusCode::OK, "a key's first request");
    });
}

/// Two servers (each its own connection, as two nodes) of the layer that `text` configures,
/// every policy on Redis.
#[cfg(feature = "serde")]
async fn configured_nodes(server: &RedisServer, text: &str) -> Vec<SocketAddr> {
    use tollgate::tower::config::LayerConfig;
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let client = redis::Client::open(server.url()).expect("a valid URL");
        let conn = ConnectionManager::new(client).await.expect("connects");
        let config: LayerConfig = toml::from_str(text).expect("parses");
        let layer = config
            .builder_with(|policy| policy.redis(conn.clone()))
            .expect("valid policies")
            .build()
            .expect("a valid layer");
        nodes.push(serve_layer(layer).await);
    }
    nodes
}

#[cfg(feature = "serde")]
#[test]
fn a_configured_layer_goes_global_with_one_closure() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    runtime(2).block_on(async {
        // Two policies on the same client keys: each keeps its own state on Redis. The
        // sliding window shows the configured algorithm reaches Redis too.
        let text = "headers = \"legacy\"\n\
            [[policy]]\nname = \"api\"\npath = \"/api\"\nquota = \"2/1h\"\n\
            [[policy]]\nname = \"other\"\npath = \"/other\"\nalgorithm = \"sliding-window\"\nquota = \"2/1h\"\n";
        let nodes = configured_nodes(&server, text).await;
        let http = client();
        let mut statuses = Vec::new();
        for path in ["/api/x", "/other"] {
            for i in 0..3 {
                statuses.push(get_path(&http, nodes[i % 2], path).await.status.as_u16());
            }
        }
        assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);
        // Several quotas, all or nothing in one script call: the tighter limit (2 an hour)
        // refuses the third request on either node and its headers name it; the looser one
        // (3 an hour) was charged only for the two admitted, so it still admits alone.
        let text = "headers = \"legacy\"\n\
            [[policy]]\nname = \"two\"\nquota = [\"3/1h\", \"2/1h\"]\n";
        let nodes = configured_nodes(&server, text).await;
        let mut seen = Vec::new();
        for i in 0..4 {
            let reply = get_path(&http, nodes[i % 2], "/other").await;
            seen.push((reply.status.as_u16(), reply.limit, reply.remaining));
        }
        let both = |status: u16, limit: &str, remaining: &str| {
            (status, Some(limit.to_owned()), Some(remaining.to_owned()))
        };
        assert_eq!(
            seen,
            [
                both(200, "2", "1"),
                both(200, "2", "0"),
                both(429, "2", "0"),
                both(429, "2", "0"),
            ]
        );
        let client = redis::Client::open(server.url()).expect("a valid URL");
        let conn = ConnectionManager::new(client).await.expect("connects");
        let peer = redis_key(&Key::from(std::net::IpAddr::from([127, 0, 0, 1])));
        let looser = RedisLimiter::builder(RedisRule::gcra(Quota::per_hour(3).unwrap()).unwrap())
            .prefix("tollgate:two")
            .build(conn.clone());
        assert!(looser.check(&peer).await.unwrap().allowed());
        assert!(!looser.check(&peer).await.unwrap().allowed());
    });
}

/// A configured global policy can be guarded from the file: with `on_redis_failure =
/// "fail-closed"` a stopped Redis refuses by the failure policy (a 429 with its retry), not
/// with `on_error`'s answer (set to let requests through here), and an unguarded policy
/// answers `on_error`. Refused outside a tokio runtime, and on several quotas.
#[cfg(feature = "serde")]
#[test]
fn a_configured_global_policy_is_guarded_from_the_file() {
    use tollgate::tower::config::LayerConfig;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let text = |guard: &str| {
        format!("on_error = \"allow\"\n[[policy]]\nname = \"g\"\nquota = \"100/1s\"\n{guard}")
    };
    let layer = |conn: ConnectionManager, guard: &str| {
        let config: LayerConfig = toml::from_str(&text(guard)).expect("parses");
        let builder = config.builder_with(|policy| policy.redis(conn.clone()));
        builder
            .expect("valid policies")
            .build()
            .expect("a valid layer")
    };
    runtime(2).block_on(async {
        let redis = redis::Client::open(server.url()).expect("a valid URL");
        let conn = ConnectionManager::new(redis).await.expect("connects");
        let guarded = serve_layer(layer(conn.clone(), "on_redis_failure = \"fail-closed\"")).await;
        let unguarded = serve_layer(layer(conn, "")).await;
        let http = client();
        assert_eq!(
            get_path(&http, guarded, "/other").await.status,
            StatusCode::OK
        );
        server.signal("STOP");
        let mut statuses = Vec::new();
        for addr in [guarded, unguarded] {
            statuses.push(get_path(&http, addr, "/other").await.status.as_u16());
        }
        server.signal("CONT");
        assert_eq!(statuses, [429, 200]);
    });
    // Outside a runtime, and on several quotas: refused with a message.
    let redis = redis::Client::open(server.url()).expect("a valid URL");
    let conn = runtime(2)
        .block_on(ConnectionManager::new(redis))
        .expect("connects");
    let config: LayerConfig =
        toml::from_str(&text("on_redis_failure = \"local\"")).expect("parses");
    let e = config.builder_with(|p| p.redis(conn.clone())).unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    let config: LayerConfig = toml::from_str(
        "[[policy]]\nname = \"g\"\nquota = [\"1/1s\", \"9/1m\"]\non_redis_failure = \"local\"",
    )
    .expect("parses");
    let e = runtime(2)
        .block_on(async { config.builder_with(|p| p.redis(conn.clone())).map(|_| ()) })
        .unwrap_err();
    assert!(e.to_string().contains("single-quota"), "{e}");
}
