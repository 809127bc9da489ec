//! The tower layer on a real axum server and a real HTTP client (hyper-util's), both on
//! 127.0.0.1 ephemeral ports. Limiters run on a `ManualClock`, so every decision, and so every
//! header, is known: a reference limiter on the same clock is asked the same questions.
//!
//! Run with `cargo test --features tower --test tower_http`: the layer then reads the peer from
//! a plain `SocketAddr` extension, which a small axum middleware copies out of `ConnectInfo`;
//! with `--features axum` it reads `ConnectInfo` itself, and the middleware is left out.

#![cfg(feature = "tower")]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{HeaderName, Method, Request, StatusCode};
use http_body_util::Full;
use tollgate::clock::ManualClock;
use tollgate::tower::{
    Cidr, Fallback, HeaderStyle, Key, KeySource, Mode, Policy, ProxyHeader, RateLimitLayer,
    RateLimitLayerBuilder,
};
use tollgate::{Decision, Gcra, MultiLimiter, Quota};
use tower_support::{ceil_secs, client, fetch, gcra, serve, Http, Reply};

fn app(layer: RateLimitLayer) -> Router {
    peer_extension(
        Router::new()
            .route(
                "/api/{*rest}",
                get(|| async { "api" }).post(|| async { "posted" }),
            )
            .route("/health", get(|| async { "ok" }))
            .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
            .route("/other", get(|| async { "other" }))
            .route("/grpc.Svc/Call", post(|| async { "grpc" }))
            .layer(layer),
    )
}

/// Without the `axum` feature the layer reads a plain `SocketAddr` extension: copy it out of
/// `ConnectInfo` in front of the layer (as a hyper-util server would insert it).
fn peer_extension(router: Router) -> Router {
    if cfg!(feature = "axum") {
        return router;
    }
    router.layer(axum::middleware::map_request(
        |mut request: Request<axum::body::Body>| async move {
            let peer = request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|info| info.0);
            if let Some(peer) = peer {
                request.extensions_mut().insert(peer);
            }
            request
        },
    ))
}

async fn get_with(http: &Http, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    fetch(http, addr, Method::GET, path, headers).await
}

/// Asserts that `reply` carries exactly `decision`'s figures in both header styles, for a
/// one-quota policy `name` of window `window_secs`.
fn assert_headers(reply: &Reply, decision: &Decision, name: &str, window_secs: u64) {
    let reset = ceil_secs(decision.reset_after());
    assert_eq!(
        reply.header("x-ratelimit-limit"),
        Some(&*decision.limit().to_string())
    );
    assert_eq!(
        reply.header("x-ratelimit-remaining"),
        Some(&*decision.remaining().to_string())
    );
    assert_eq!(reply.header("x-ratelimit-reset"), Some(&*reset.to_string()));
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(&*format!(
            "\"{name}\";q={};w={window_secs}",
            decision.limit()
        ))
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(&*format!("\"{name}\";r={};t={reset}", decision.remaining()))
    );
    if decision.allowed() {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("retry-after"), None);
    } else {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        let retry = ceil_secs(decision.retry_after());
        assert!(retry >= 1);
        assert_eq!(reply.header("retry-after"), Some(&*retry.to_string()));
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(
            reply.body,
            format!(
                r#"{{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit \"{name}\" exceeded: retry after {retry} s.","retry-after":{retry}}}"#
            )
        );
    }
}

fn loopback() -> Key {
    Key::Ip("127.0.0.1".parse().unwrap())
}

#[tokio::test]
async fn the_burst_then_an_exact_429_with_every_header_equal_to_the_decision() {
    let clock = ManualClock::new();
    // 2 per 3 s: T = 1.5 s, so waits are not whole seconds and must round up.
    let quota = Quota::new(2, Duration::from_secs(3))
        .unwrap()
        .with_burst(3)
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("api", gcra(&clock, quota)).path_prefix("/api"))
        .headers(HeaderStyle::Both)
        .build()
        .unwrap();
    let reference = gcra(&clock, quota);
    let addr = serve(app(layer)).await;
    let http = client();
    let mut statuses = Vec::new();
    for step in 0..8 {
        if step == 5 {
            clock.advance(Duration::from_millis(1_600));
        }
        let reply = get_with(&http, addr, "/api/x", &[]).await;
        let decision = reference.check(&loopback()).unwrap();
        assert_headers(&reply, &decision, "api", 3);
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 200, 429, 429]);
    // Outside every policy: no limit, no fields.
    let other = get_with(&http, addr, "/other", &[]).await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.header("ratelimit"), None);
}

/// A layer whose only policy allows one request per client IP (per hour, so nothing refills).
fn one_per_client(clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .default_policy(Policy::new("ip", gcra(clock, Quota::per_hour(1).unwrap())))
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    let clock = ManualClock::new();
    let addr = serve(app(one_per_client(&clock).build().unwrap())).await;
    let http = client();
    let first = get_with(&http, addr, "/other", &[("x-forwarded-for", "203.0.113.1")]).await;
    assert_eq!(first.status, StatusCode::OK);
    // Another claimed address does not buy a new bucket: the key is the peer, 127.0.0.1.
    for spoof in ["203.0.113.2", "198.51.100.7, 10.0.0.1", "garbage"] {
        let reply = get_with(&http, addr, "/other", &[("x-forwarded-for", spoof)]).await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{spoof}");
    }
    let reply = get_with(&http, addr, "/other", &[("forwarded", "for=192.0.2.9")]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_trusted_chain_is_honored() {
    let clock = ManualClock::new();
    let layer = one_per_client(&clock)
        .trusted_proxies(["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()])
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let get = |xff: &'static str| {
        let http = http.clone();
        async move {
            get_with(&http, addr, "/other", &[("x-forwarded-for", xff)])
                .await
                .status
        }
    };
    assert_eq!(get("203.0.113.1").await, StatusCode::OK);
    assert_eq!(get("203.0.113.2").await, StatusCode::OK);
    // The same client through another trusted hop, with a spoofed first entry: same key.
    assert_eq!(
        get("6.6.6.6, 203.0.113.1, 10.0.0.5").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Without the header the client is the proxy itself.
    assert_eq!(
        get_with(&http, addr, "/other", &[]).await.status,
        StatusCode::OK
    );

    // RFC 7239 Forwarded, when that is the configured header.
    let layer = one_per_client(&clock)
        .trusted_proxies(["127.0.0.1".parse().unwrap()])
        .proxy_header(ProxyHeader::Forwarded)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let fwd = |value: &'static str| {
        let http = http.clone();
        async move {
            get_with(&http, addr, "/other", &[("forwarded", value)])
                .await
                .status
        }
    };
    assert_eq!(
        fwd(r#"for="[2001:db8::1]:4711";proto=http"#).await,
        StatusCode::OK
    );
    assert_eq!(fwd("for=192.0.2.1").await, StatusCode::OK);
    assert_eq!(fwd("for=192.0.2.1").await, StatusCode::TOO_MANY_REQUESTS);
    // X-Forwarded-For is not the configured header: ignored, the key is 127.0.0.1.
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-forwarded-for", "192.0.2.77")])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-forwarded-for", "192.0.2.78")])
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn ipv6_clients_share_a_bucket_per_56_and_not_across() {
    let clock = ManualClock::new();
    let layer = one_per_client(&clock)
        .trusted_proxies(["127.0.0.1".parse().unwrap()])
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let get = |xff: &'static str| {
        let http = http.clone();
        async move {
            get_with(&http, addr, "/other", &[("x-forwarded-for", xff)])
                .await
                .status
        }
    };
    assert_eq!(get("2001:db8:0:1::1").await, StatusCode::OK);
    // 2001:db8:0:ff::/64 lies in the same /56 (2001:db8:0:0::/56): same bucket.
    assert_eq!(get("2001:db8:0:ff::2").await, StatusCode::TOO_MANY_REQUESTS);
    // 2001:db8:0:100:: is the next /56.
    assert_eq!(get("2001:db8:0:100::1").await, StatusCode::OK);
    assert_eq!(
        get("[2001:db8:0:1ff::9]:443").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // With /64 grouping the first two are apart.
    let layer = one_per_client(&clock)
        .trusted_proxies(["127.0.0.1".parse().unwrap()])
        .ipv6_prefix(64)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let get = |xff: &'static str| {
        let http = http.clone();
        async move {
            get_with(&http, addr, "/other", &[("x-forwarded-for", xff)])
                .await
                .status
        }
    };
    assert_eq!(get("2001:db8:0:1::1").await, StatusCode::OK);
    assert_eq!(get("2001:db8:0:ff::2").await, StatusCode::OK);
    assert_eq!(get("2001:db8:0:1::7").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn shadow_mode_never_rejects_but_decides_and_counts() {
    let clock = ManualClock::new();
    let quota = Quota::per_minute(2).unwrap();
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new("beta", gcra(&clock, quota))
                .path_prefix("/api")
                .mode(Mode::Shadow),
        )
        .build()
        .unwrap();
    let reference = gcra(&clock, quota);
    let addr = serve(app(layer)).await;
    let http = client();
    for _ in 0..6 {
        let reply = get_with(&http, addr, "/api/x", &[]).await;
        let decision = reference.check(&loopback()).unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "api");
        assert_eq!(reply.header("retry-after"), None);
        assert_eq!(
            reply.header("ratelimit"),
            Some(&*format!(
                "\"beta\";r={};t={}",
                decision.remaining(),
                ceil_secs(decision.reset_after())
            ))
        );
    }
    // The shadow policy counted: its limiter is as full as the reference.
    assert!(!reference.peek(&loopback(), 1).unwrap().allowed());
}

#[tokio::test]
async fn the_no_key_outcome_is_configured() {
    let clock = ManualClock::new();
    let api_key = HeaderName::from_static("x-api-key");
    let policy = Policy::new("keys", gcra(&clock, Quota::per_hour(1).unwrap()))
        .key(KeySource::header(api_key.clone()));
    let layer = RateLimitLayer::builder()
        .default_policy(policy.clone())
        .on_missing_key(Fallback::Reject(StatusCode::BAD_REQUEST))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let reply = get_with(&http, addr, "/other", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(reply.body.contains(r#""status":400"#), "{}", reply.body);
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-api-key", "")])
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-api-key", "a")])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-api-key", "a")])
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_with(&http, addr, "/other", &[("x-api-key", "b")])
            .await
            .status,
        StatusCode::OK
    );

    // Let through: never limited, no fields.
    let layer = RateLimitLayer::builder()
        .default_policy(policy)
        .on_missing_key(Fallback::Allow)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        let reply = get_with(&http, addr, "/other", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit"), None);
    }
}

/// A request without the API key its policy is keyed by is the client's mistake: a 400 with
/// a problem+json body, with nothing configured; a request with it is counted.
#[tokio::test]
async fn a_missing_api_key_gets_a_400_by_default() {
    let clock = ManualClock::new();
    let api_key = HeaderName::from_static("x-api-key");
    let policy = Policy::new("keys", gcra(&clock, Quota::per_hour(1).unwrap()))
        .key(KeySource::header(api_key));
    let layer = RateLimitLayer::builder()
        .default_policy(policy)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    for headers in [&[][..], &[("x-api-key", "")]] {
        let reply = get_with(&http, addr, "/other", headers).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{headers:?}");
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert!(reply.body.contains(r#""status":400"#), "{}", reply.body);
    }
    let with_key = get_with(&http, addr, "/other", &[("x-api-key", "a")]).await;
    assert_eq!(with_key.status, StatusCode::OK);
}

/// A server that gives the layer no peer address (axum served without
/// `into_make_service_with_connect_info`) is misconfigured: a 500, whose body names the fix,
/// on IP-keyed policies; a policy keyed by a header still answers a missing header with 400.
#[tokio::test]
async fn a_server_without_peer_addresses_answers_500_naming_the_fix() {
    let clock = ManualClock::new();
    let one = || gcra(&clock, Quota::per_hour(1).unwrap());
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new("keys", one())
                .path_prefix("/health")
                .key(KeySource::header(HeaderName::from_static("x-api-key"))),
        )
        .default_policy(Policy::new("per-ip", one()))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = app(layer).into_make_service();
    tokio::spawn(async move { axum::serve(listener, served).await.unwrap() });
    let http = client();
    let reply = get_with(&http, addr, "/other", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        reply.body.contains("into_make_service_with_connect_info"),
        "{}",
        reply.body
    );
    let reply = get_with(&http, addr, "/health", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
}

#[tokio::test]
async fn costs_fixed_and_computed() {
    let clock = ManualClock::new();
    let quota = Quota::per_hour(5).unwrap();
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new("export", gcra(&clock, quota))
                .path_prefix("/api/export")
                .cost(2),
        )
        .policy(
            Policy::new("weighted", gcra(&clock, quota))
                .path_prefix("/api")
                .cost_fn(|parts| {
                    parts
                        .headers
                        .get("x-weight")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                }),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let export: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(
                get_with(&http, addr, "/api/export", &[])
                    .await
                    .status
                    .as_u16(),
            );
        }
        s
    };
    assert_eq!(export, [200, 200, 429]); // 2 + 2, then 1 left < 2
    let w = |weight: &'static str| {
        let http = http.clone();
        async move { get_with(&http, addr, "/api/x", &[("x-weight", weight)]).await }
    };
    assert_eq!(w("4").await.status, StatusCode::OK);
    let denied = w("2").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(w("1").await.status, StatusCode::OK);
    // A cost above the capacity can never be admitted: 429, no Retry-After.
    let never = w("6").await;
    assert_eq!(never.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(never.header("retry-after"), None);
    assert!(
        never.body.contains("can never be admitted"),
        "{}",
        never.body
    );
    // Cost 0 always passes.
    assert_eq!(w("0").await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_allow_list_bypasses_every_policy() {
    let clock = ManualClock::new();
    let by_cidr = one_per_client(&clock)
        .allow_cidrs(["127.0.0.0/8".parse::<Cidr>().unwrap()])
        .build()
        .unwrap();
    let addr = serve(app(by_cidr)).await;
    let http = client();
    for _ in 0..3 {
        let reply = get_with(&http, addr, "/other", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit"), None);
    }
    let by_path = one_per_client(&clock)
        .allow_if(|parts| parts.uri.path() == "/health")
        .build()
        .unwrap();
    let addr = serve(app(by_path)).await;
    for _ in 0..3 {
        assert_eq!(
            get_with(&http, addr, "/health", &[]).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        get_with(&http, addr, "/other", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&http, addr, "/other", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A GET with one header of any bytes (`\x80` is no `&str`).
async fn get_raw(http: &Http, addr: SocketAddr, name: &str, value: &[u8]) -> StatusCode {
    let request = Request::get(format!("http://{addr}/other"))
        .header(
            name,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        )
        .body(Full::new(Bytes::new()))
        .expect("a request");
    http.request(request)
        .await
        .expect("the server answers")
        .status()
}

/// Behind a trusted proxy that passes the client's forwarding line on untouched, a malformed
/// line leaves the client unknown (the missing-key fallback answers), even where the proxy's
/// network is allow-listed; behind one that appends the address it saw, that hop is the key.
#[tokio::test]
async fn a_malformed_forwarding_header_never_passes_as_the_proxy() {
    /// (header read, its name, two malformed lines, a malformed line with a hop appended)
    type Case = (ProxyHeader, &'static str, [&'static [u8]; 2], &'static [u8]);
    let cases: [Case; 2] = [
        (
            ProxyHeader::XForwardedFor,
            "x-forwarded-for",
            [b"\x80", b"unknown"],
            b"\x80, 203.0.113.7",
        ),
        (
            ProxyHeader::Forwarded,
            "forwarded",
            [b"for=\"", b"for=\xff"],
            b"for=\", for=203.0.113.7",
        ),
    ];
    for (header, name, malformed, appended) in cases {
        let clock = ManualClock::new();
        let layer = one_per_client(&clock)
            .trusted_proxies(["127.0.0.1".parse().unwrap()])
            .proxy_header(header)
            .allow_cidrs(["127.0.0.0/8".parse::<Cidr>().unwrap()])
            .on_missing_key(Fallback::Reject(StatusCode::BAD_REQUEST))
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let http = client();
        for value in malformed.iter().chain(&malformed) {
            let status = get_raw(&http, addr, name, value).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {value:?}");
        }
        // The proxy's own requests (no header) are allow-listed.
        let own = get_with(&http, addr, "/other", &[]).await;
        assert_eq!(own.status, StatusCode::OK);
        // An appended hop keys the client, whatever it wrote before it.
        assert_eq!(get_raw(&http, addr, name, appended).await, StatusCode::OK);
        let again = get_raw(&http, addr, name, appended).await;
        assert_eq!(again, StatusCode::TOO_MANY_REQUESTS, "{name}: {appended:?}");
    }
}

/// HEAD is limited with GET, and a path spelled another way (`//`, `.`, `..`, escapes) is
/// limited as the path it names; an allow-listed path does not cover `/health/../api`.
#[cfg(feature = "serde")]
#[tokio::test]
async fn matching_cannot_be_dodged_by_method_or_spelling() {
    let clock = ManualClock::new();
    let config: tollgate::tower::config::LayerConfig = toml::from_str(
        r#"
        allow_paths = ["/health"]
        [[policy]]
        name = "reads"
        path = "/api"
        methods = ["get"]
        quota = "1/1h"
        "#,
    )
    .unwrap();
    let layer = config
        .builder_with_clock(clock.clone())
        .unwrap()
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let status = |method: Method, path: &'static str| {
        let http = http.clone();
        async move { fetch(&http, addr, method, path, &[]).await.status }
    };
    assert_eq!(status(Method::GET, "/api/a").await, StatusCode::OK);
    for path in [
        "/api/a",
        "//api/a",
        "/api//a",
        "/./api/a",
        "/other/../api/a",
        "/health/../api/a",
        "/api%2Fa",
        "/%61pi/a",
        "/api/x/../a",
    ] {
        assert_eq!(
            status(Method::GET, path).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{path}"
        );
    }
    assert_eq!(
        status(Method::HEAD, "/api/a").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Not a read: another method passes.
    assert_eq!(status(Method::POST, "/api/a").await, StatusCode::OK);
}

#[tokio::test]
async fn clones_and_routers_share_state() {
    let clock = ManualClock::new();
    let layer = RateLimitLayer::builder()
        .default_policy(Policy::new(
            "shared",
            gcra(&clock, Quota::per_hour(3).unwrap()),
        ))
        .build()
        .unwrap();
    let one = serve(app(layer.clone())).await;
    let two = serve(peer_extension(
        Router::new()
            .route("/x", get(|| async { "x" }))
            .layer(layer),
    ))
    .await;
    let http = client();
    assert_eq!(
        get_with(&http, one, "/other", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(get_with(&http, two, "/x", &[]).await.status, StatusCode::OK);
    assert_eq!(
        get_with(&http, one, "/api/y", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_with(&http, two, "/x", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_with(&http, one, "/other", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn grpc_requests_get_resource_exhausted() {
    let clock = ManualClock::new();
    let addr = serve(app(one_per_client(&clock).build().unwrap())).await;
    let http = client();
    let grpc = [("content-type", "application/grpc+proto")];
    let ok = fetch(&http, addr, Method::POST, "/grpc.Svc/Call", &grpc).await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.header("grpc-status"), None);
    let denied = fetch(&http, addr, Method::POST, "/grpc.Svc/Call", &grpc).await;
    assert_eq!(denied.status, StatusCode::OK);
    assert_eq!(denied.header("grpc-status"), Some("8"));
    assert_eq!(denied.header("content-type"), Some("application/grpc"));
    let message = denied.header("grpc-message").expect("a grpc-message");
    assert!(message.contains("Rate limit"), "{message}");
    assert_eq!(denied.header("retry-after"), Some("3600"));
    assert_eq!(denied.header("cache-control"), Some("no-store"));
    assert!(denied.body.is_empty());
    // A GET of that content type is no gRPC call: a plain 429, which caches and monitors see.
    let get = fetch(&http, addr, Method::GET, "/other", &grpc).await;
    assert_eq!(get.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get.header("grpc-status"), None);
    assert_eq!(get.header("cache-control"), Some("no-store"));
}

#[tokio::test]
async fn policies_match_in_order_by_path_and_method_with_several_quotas() {
    let clock = ManualClock::new();
    let multi = MultiLimiter::<Key, _, _>::with_clock(
        [
            Gcra::new(Quota::per_second(10).unwrap()).unwrap(),
            Gcra::new(Quota::per_hour(2).unwrap()).unwrap(),
        ],
        clock.clone(),
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new("writes", gcra(&clock, Quota::per_hour(1).unwrap()))
                .path_prefix("/api")
                .methods([Method::POST]),
        )
        .policy(Policy::new("reads", multi).path_pattern("/api/*"))
        .headers(HeaderStyle::Draft)
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    let post = fetch(&http, addr, Method::POST, "/api/a", &[]).await;
    assert_eq!(post.status, StatusCode::OK);
    assert_eq!(
        post.header("ratelimit-policy"),
        Some(r#""writes";q=1;w=3600"#)
    );
    assert_eq!(
        fetch(&http, addr, Method::POST, "/api/a", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // GETs fall to the two-quota policy: both listed, the hourly one binds.
    let first = get_with(&http, addr, "/api/a", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""reads-1";q=10;w=1, "reads-2";q=2;w=3600"#)
    );
    assert_eq!(first.header("ratelimit"), Some(r#""reads-2";r=1;t=1800"#));
    assert_eq!(first.header("x-ratelimit-limit"), None); // draft style only
    assert_eq!(
        get_with(&http, addr, "/api/b", &[]).await.status,
        StatusCode::OK
    );
    let denied = get_with(&http, addr, "/api/c", &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("ratelimit"), Some(r#""reads-2";r=0;t=3600"#));
    assert_eq!(denied.header("retry-after"), Some("1800"));
    // Two segments: neither policy (no default): not limited.
    assert_eq!(
        get_with(&http, addr, "/api/a/b", &[]).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_custom_denial_gets_the_fields_too() {
    let clock = ManualClock::new();
    let layer = one_per_client(&clock)
        .headers(HeaderStyle::Legacy)
        .deny_with(|denial| {
            http::Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(Bytes::from(format!("slow down ({})", denial.policy)))
                .unwrap()
        })
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let http = client();
    assert_eq!(
        get_with(&http, addr, "/other", &[]).await.status,
        StatusCode::OK
    );
    let denied = get_with(&http, addr, "/other", &[]).await;
    assert_eq!(denied.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(denied.body, "slow down (ip)");
    assert_eq!(denied.header("retry-after"), Some("3600"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("ratelimit"), None);
}

#[tokio::test]
async fn refunds_by_status_and_tiers_on_a_real_server() {
    let clock = ManualClock::new();
    // Per API key, in tiers: free 1/h, pro 3/h; server errors are not charged.
    let tiers = tollgate::tower::Tiers::builder("free", gcra(&clock, Quota::per_hour(1).unwrap()))
        .tier("pro", gcra(&clock, Quota::per_hour(3).unwrap()))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .default_policy(
            Policy::new("keyed", tiers)
                .key(KeySource::header(HeaderName::from_static("x-api-key")))
                .refund_when(|status| status.is_server_error()),
        )
        .headers(HeaderStyle::Both)
        .build()
        .unwrap();
    let addr = serve(app(layer.clone())).await;
    let http = client();
    let get = |path: &'static str, key: &'static str| {
        let http = http.clone();
        async move {
            get_with(&http, addr, path, &[("x-api-key", key)])
                .await
                .status
                .as_u16()
        }
    };
    // Failures are refunded: the free key still has its one unit after three 500s.
    for _ in 0..3 {
        assert_eq!(get("/fail", "k").await, 500);
    }
    assert_eq!(get("/other", "k").await, 200);
    assert_eq!(get("/other", "k").await, 429);
    // Upgraded while serving: the pro tier's three units.
    layer
        .tiers("keyed")
        .expect("a tiered policy")
        .assign(Key::from("k"), "pro")
        .unwrap();
    let statuses = [
        get("/other", "k").await,
        get("/other", "k").await,
        get("/other", "k").await,
        get("/other", "k").await,
    ];
    assert_eq!(statuses, [200, 200, 200, 429]);
    let denied = get_with(&http, addr, "/other", &[("x-api-key", "k")]).await;
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"keyed-1\";q=1;w=3600, \"keyed-2\";q=3;w=3600")
    );
    assert!(denied
        .header("ratelimit")
        .unwrap()
        .starts_with("\"keyed-2\";r=0;"));
}
