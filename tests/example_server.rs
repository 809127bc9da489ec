//! The example server's own router (`examples/server.rs`, included here) with the layer built
//! from `examples/policies.toml`, served on 127.0.0.1:0 and driven by a real HTTP client.
//! Limiters run on a `ManualClock`: nothing refills during the test.
//!
//! Run with `cargo test --features axum,serde,tokio,metrics --test example_server`.

#![cfg(all(
    feature = "axum",
    feature = "serde",
    feature = "tokio",
    feature = "metrics"
))]

#[allow(dead_code)]
#[path = "../examples/server.rs"]
mod server;
#[path = "support/tower.rs"]
mod tower_support;

use http::{Method, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::tower::config::LayerConfig;
use tower_support::{client, fetch, serve, Reply};

#[tokio::test]
async fn the_example_router_limits_as_its_file_says() {
    let config: LayerConfig =
        toml::from_str(include_str!("../examples/policies.toml")).expect("the file parses");
    let layer = config
        .builder_with_clock(ManualClock::new())
        .expect("valid policies")
        .build()
        .expect("a valid layer");
    // A recorder of its own (not installed globally): /metrics renders, the layer's counters
    // go to whatever global recorder the test process has (none).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let addr = serve(server::app(layer, prometheus)).await;
    let http = client();

    // /api/: 10/s, bursts of 20, per client IP (the test's 127.0.0.1).
    for i in 0..20 {
        let Reply {
            status,
            headers,
            body,
        } = fetch(&http, addr, Method::GET, "/api/hello", &[]).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "hello\n"),
            "request {i}"
        );
        assert_eq!(
            headers["x-ratelimit-remaining"],
            (19 - i).to_string().as_str()
        );
    }
    let Reply {
        status,
        headers,
        body,
    } = fetch(&http, addr, Method::GET, "/api/export", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(headers["ratelimit-policy"], "\"api\";q=10;w=1");
    assert!(body.contains("\"status\":429"), "{body}");
    // 127.0.0.1 is the trusted proxy: the client behind it has its own bucket.
    let behind = [("x-forwarded-for", "203.0.113.5")];
    let status = fetch(&http, addr, Method::GET, "/api/export", &behind)
        .await
        .status;
    assert_eq!(status, StatusCode::OK);
    // Shadow never refuses; /partner/ needs its key; /health is never limited, /metrics has a
    // limit of its own (a burst of 10 a client).
    for _ in 0..5 {
        let status = fetch(&http, addr, Method::GET, "/beta/feature", &[])
            .await
            .status;
        assert_eq!(status, StatusCode::OK);
    }
    let status = fetch(&http, addr, Method::GET, "/partner/orders", &[])
        .await
        .status;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let key = [("x-api-key", "pro-key-1")];
    let Reply {
        status, headers, ..
    } = fetch(&http, addr, Method::GET, "/partner/orders", &key).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"partner-3\";r=999;"));
    for _ in 0..30 {
        let status = fetch(&http, addr, Method::GET, "/health", &[]).await.status;
        assert_eq!(status, StatusCode::OK);
    }
    let mut scrapes = Vec::new();
    for _ in 0..12 {
        scrapes.push(
            fetch(&http, addr, Method::GET, "/metrics", &[])
                .await
                .status,
        );
    }
    assert!(
        scrapes[..10].iter().all(|s| *s == StatusCode::OK),
        "{scrapes:?}"
    );
    assert_eq!(scrapes[11], StatusCode::TOO_MANY_REQUESTS);
    // Uploads within their burst pass at once.
    let Reply { status, body, .. } = fetch(&http, addr, Method::POST, "/upload", &[]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "stored\n"));
}
