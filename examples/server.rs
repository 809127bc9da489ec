//! An axum server whose rate limits come from `examples/policies.toml`.
//!
//! ```sh
//! cargo run --example server --features axum,serde,tokio,metrics
//! curl -i http://127.0.0.1:3000/api/hello
//! curl http://127.0.0.1:3000/metrics
//! ```
//!
//! It listens on `TOLLGATE_ADDR` (default `127.0.0.1:3000`) and reads the file named by its
//! first argument (default `examples/policies.toml` in this repository). With
//! `--redis URL` (built with the `redis` feature too) every single-quota policy is held on
//! Redis, globally across every server started the same way. `/metrics` shows the layer's
//! counters in Prometheus's text format.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use tollgate::tower::config::LayerConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policies.toml").to_owned();
    let mut redis_url = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => redis_url = Some(args.next().ok_or("--redis needs a URL")?),
            _ => path = arg,
        }
    }

    // Metrics go to a Prometheus recorder, rendered at /metrics (install it before serving).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;

    // The whole rate-limiting set-up: read the file, build the layer.
    let config: LayerConfig = toml::from_str(&std::fs::read_to_string(&path)?)?;
    let layer = match redis_url {
        None => config.build()?,
        Some(url) => global(config, &url).await?,
    };

    let app = app(layer, prometheus);

    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{} (limits from {path})",
        listener.local_addr()?
    );
    // The layer reads each client's address from `ConnectInfo`.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The example's routes behind `layer`; `/metrics` (outside the layer, behind a limit of its
/// own) renders `prometheus` after refreshing the layer's gauges. `tests/example_server.rs`
/// serves this very router.
pub fn app(
    layer: tollgate::tower::RateLimitLayer,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> Router {
    let gauges = layer.clone(); // shares the layer's limiters: reports their key counts
    Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .route("/api/export", get(|| async { "an export\n" }))
        .route("/partner/orders", get(|| async { "orders\n" }))
        .route("/beta/feature", get(|| async { "beta\n" }))
        .route("/upload", post(|| async { "stored\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer)
        .route(
            "/metrics",
            get(move || {
                gauges.record_gauges();
                let prometheus = prometheus.clone();
                async move { prometheus.render() }
            })
            .layer(scrape_limit()),
        )
}

/// The limit on `/metrics`, per peer address: a burst of 10, then one every 10 s (a
/// Prometheus server scrapes every 15 s or so). A scrape
/// refreshes every gauge (each store's shards locked in turn), so no client may ask for it
/// in a loop.
fn scrape_limit() -> tollgate::tower::RateLimitLayer {
    use tollgate::tower::{Key, KeySource, Policy, RateLimitLayer};
    use tollgate::{Gcra, KeyedLimiter, Quota};
    let quota = Quota::per_minute(6).and_then(|q| q.with_burst(10));
    let rule = Gcra::new(quota.expect("a valid constant quota")).expect("a valid GCRA quota");
    let policy =
        Policy::new("metrics", KeyedLimiter::<Key, _>::new(rule)).key(KeySource::peer_ip());
    RateLimitLayer::builder()
        .default_policy(policy)
        .build()
        .expect("a valid constant layer")
}

/// Every single-quota policy on Redis (exact tier); the others stay in process.
#[cfg(feature = "redis")]
async fn global(
    config: LayerConfig,
    url: &str,
) -> Result<tollgate::tower::RateLimitLayer, Box<dyn std::error::Error>> {
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url)?).await?;
    let clock = tollgate::clock::QuantaClock::default();
    Ok(config
        .builder_with(|policy| match policy.quotas.len() {
            1 => policy.redis(conn.clone()),
            _ => policy.in_process(clock.clone()),
        })?
        .build()?)
}

#[cfg(not(feature = "redis"))]
async fn global(
    _: LayerConfig,
    _: &str,
) -> Result<tollgate::tower::RateLimitLayer, Box<dyn std::error::Error>> {
    Err("--redis needs the example built with the `redis` feature".into())
}
