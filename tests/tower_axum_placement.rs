//! Where the layer sits in an axum application must not change which requests a policy
//! covers: policies name the paths clients send. axum's `nest` strips its prefix from the URI
//! the nested routes (and their layers) see, so the layer matches the `OriginalUri` extension
//! axum keeps; each placement below serves a real axum server on 127.0.0.1.

#![cfg(feature = "axum")]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::clock::ManualClock;
use tollgate::tower::{KeySource, Policy, RateLimitLayer};
use tollgate::Quota;
use tower_support::{client, gcra, serve, Http};

/// A layer with one policy: 2 POSTs a minute per client on `/api/login`, nothing else limited.
/// The clock never moves, so the 3rd and later POSTs are refused.
fn login_layer() -> RateLimitLayer {
    let clock = ManualClock::new();
    let login = Policy::new("login", gcra(&clock, Quota::per_minute(2).unwrap()))
        .path_prefix("/api/login")
        .methods([Method::POST]);
    RateLimitLayer::builder().policy(login).build().unwrap()
}

/// The router nested under `/api`: `/login`, and `/other`, which no policy covers.
fn api() -> Router {
    Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/other", post(|| async { "other" }))
}

async fn post_to(http: &Http, addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let request = Request::post(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = http.request(request).await.expect("the server answers");
    let status = response.status();
    let body = response.into_body().collect().await.expect("a body");
    (
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}

/// Five POSTs to `/api/login` and three to `/api/other` on `app`: their statuses.
async fn statuses(app: Router) -> (Vec<u16>, Vec<u16>) {
    let addr = serve(app).await;
    let http = client();
    let mut login = Vec::new();
    for _ in 0..5 {
        login.push(post_to(&http, addr, "/api/login").await.0.as_u16());
    }
    let mut other = Vec::new();
    for _ in 0..3 {
        other.push(post_to(&http, addr, "/api/other").await.0.as_u16());
    }
    (login, other)
}

#[tokio::test]
async fn a_login_policy_refuses_the_third_post_wherever_the_layer_sits() {
    let placements: [(&str, Router); 5] = [
        (
            "outer router",
            Router::new().nest("/api", api()).layer(login_layer()),
        ),
        (
            "nested router",
            Router::new().nest("/api", api().layer(login_layer())),
        ),
        (
            "nested route_layer",
            Router::new().nest("/api", api().route_layer(login_layer())),
        ),
        (
            "ServiceBuilder in the nested router",
            Router::new().nest(
                "/api",
                api().layer(tower::ServiceBuilder::new().layer(login_layer())),
            ),
        ),
        (
            "ServiceBuilder on the outer router",
            Router::new()
                .nest("/api", api())
                .layer(tower::ServiceBuilder::new().layer(login_layer())),
        ),
    ];
    let mut failures = Vec::new();
    for (placement, app) in placements {
        let (login, other) = statuses(app).await;
        if login != [200, 200, 429, 429, 429] || other != [200, 200, 200] {
            failures.push(format!(
                "{placement}: /api/login {login:?}, /api/other {other:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "expected /api/login [200, 200, 429, 429, 429] and /api/other [200, 200, 200]:\n{}",
        failures.join("\n")
    );
}

/// A path key is the path the client sent too: two nested routes keyed by path count apart,
/// under their full paths, whether the layer is outside or inside the nest.
#[tokio::test]
async fn a_path_key_is_the_client_path_under_nest() {
    for nested_layer in [false, true] {
        let clock = ManualClock::new();
        let per_path = Policy::new("per-path", gcra(&clock, Quota::per_minute(1).unwrap()))
            .path_prefix("/api")
            .key(KeySource::path());
        let layer = RateLimitLayer::builder().policy(per_path).build().unwrap();
        let app = if nested_layer {
            Router::new().nest("/api", api().layer(layer))
        } else {
            Router::new().nest("/api", api()).layer(layer)
        };
        let addr = serve(app).await;
        let http = client();
        let (first, _) = post_to(&http, addr, "/api/login").await;
        let (again, body) = post_to(&http, addr, "/api/login").await;
        let (other, _) = post_to(&http, addr, "/api/other").await;
        assert_eq!(
            (first, again, other),
            (
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::OK
            ),
            "nested layer: {nested_layer}"
        );
        assert!(body.contains("per-path"), "{body}");
    }
}

/// A configuration's `allow_paths` and `cost_by_path` name client paths too.
#[cfg(feature = "serde")]
#[tokio::test]
async fn configured_paths_are_client_paths_under_nest() {
    use tollgate::tower::config::LayerConfig;
    let config = r#"
        allow_paths = ["/api/health"]
        [[policy]]
        name = "api"
        quota = "4/1h"
        path = "/api"
        cost_by_path = { "/api/login" = 2 }
    "#;
    let nested = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/health", get(|| async { "ok" }).post(|| async { "ok" }));
    let config: LayerConfig = toml::from_str(config).unwrap();
    let app = Router::new().nest("/api", nested.layer(config.build().unwrap()));
    let addr = serve(app).await;
    let http = client();
    for _ in 0..5 {
        let (status, _) = post_to(&http, addr, "/api/health").await;
        assert_eq!(status, StatusCode::OK, "allow-listed");
    }
    let mut login = Vec::new();
    for _ in 0..3 {
        login.push(post_to(&http, addr, "/api/login").await.0.as_u16());
    }
    // 4 units an hour at 2 a login: two logins.
    assert_eq!(login, [200, 200, 429]);
}
