//! `tollgate::prelude` is enough for a server: a layer of shortcut policies built with its
//! names alone limits a real axum server, and a rule the shortcut refuses is named by the
//! layer's builder.

#![cfg(feature = "axum")]

use std::net::SocketAddr;

use axum::{routing::get, Router};
use bytes::Bytes;
use http_body_util::Full;
// The one tollgate import a server needs.
use tollgate::prelude::*;

#[path = "support/tower.rs"]
mod tower_support;
use tower_support::{client, serve, Http};

/// The status and `RateLimit-Policy` field of a GET of `path` (with `x-api-key: key` if any).
async fn fetch(
    http: &Http,
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> (u16, Option<String>) {
    let mut request = http::Request::get(format!("http://{addr}{path}"));
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = http
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("the server answers");
    let policy = response.headers().get("ratelimit-policy");
    let policy = policy.map(|v| v.to_str().unwrap().to_owned());
    (response.status().as_u16(), policy)
}

#[tokio::test]
async fn a_server_built_from_the_prelude_limits_its_policies() {
    let api_key = KeySource::header(http::HeaderName::from_static("x-api-key"));
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("login", Quota::per_minute(2).unwrap()).path_prefix("/login"))
        .policy(
            Policy::keyed(
                "reports",
                FixedWindow::new(Quota::per_hour(1).unwrap()).unwrap(),
            )
            .path_prefix("/reports")
            .key(api_key),
        )
        .headers(HeaderStyle::Draft)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "welcome" }))
        .route("/reports", get(|| async { "report" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve(app).await;
    let http = client();

    let login: Vec<_> = in_order(&http, addr, "/login", None, 3).await;
    assert_eq!(login, [200, 200, 429], "two a minute per client IP");
    let (_, policy) = fetch(&http, addr, "/login", None).await;
    assert_eq!(policy.as_deref(), Some("\"login\";q=2;w=60"));

    // Keyed by the header, whatever the key's type: each API key has its own hour.
    assert_eq!(fetch(&http, addr, "/reports", Some("a")).await.0, 200);
    assert_eq!(fetch(&http, addr, "/reports", Some("a")).await.0, 429);
    assert_eq!(fetch(&http, addr, "/reports", Some("b")).await.0, 200);
    // Without the header: the client's mistake.
    assert_eq!(fetch(&http, addr, "/reports", None).await.0, 400);
    // No policy: never limited, no fields.
    for _ in 0..5 {
        assert_eq!(fetch(&http, addr, "/health", None).await, (200, None));
    }
}

/// `n` GETs of `path` one after another; their statuses.
async fn in_order(
    http: &Http,
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
    n: usize,
) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(fetch(http, addr, path, key).await.0);
    }
    statuses
}

#[test]
fn a_rule_the_shortcut_refuses_is_named_when_the_layer_is_built() {
    // Two a nanosecond: no GCRA interval can space them.
    let absurd = Quota::new(2, std::time::Duration::from_nanos(1)).unwrap();
    let built = RateLimitLayer::builder()
        .policy(Policy::gcra("api", Quota::per_second(10).unwrap()))
        .policy(Policy::gcra("absurd", absurd))
        .build();
    match built {
        Err(ConfigError::Quota { policy, error }) => {
            assert_eq!(policy, "absurd");
            assert_eq!(Err(error), Gcra::new(absurd).map(|_| ()));
        }
        other => panic!("not refused as a quota: {other:?}"),
    }
    // The same policy, as `Policy::new` builds it, is accepted with the same quotas.
    let quota = Quota::per_minute(5).unwrap();
    let short = Policy::gcra("login", quota);
    let long = Policy::new(
        "login",
        KeyedLimiter::<Key, _>::new(Gcra::new(quota).unwrap()),
    );
    assert_eq!(short.backend().quota(0), long.backend().quota(0));
    assert_eq!(short.backend().quota_count(), 1);
}
