//! An actix-web server whose rate limits come from `examples/policies.toml`: the file and the
//! answers of `examples/server.rs` (axum), on actix-web.
//!
//! ```sh
//! cargo run --example actix_server --features actix,serde,tokio,metrics
//! curl -i http://127.0.0.1:3000/api/hello
//! curl http://127.0.0.1:3000/metrics
//! ```
//!
//! It listens on `TOLLGATE_ADDR` (default `127.0.0.1:3000`) and reads the file named by its
//! first argument (default `examples/policies.toml` in this repository). `/metrics` shows the
//! layer's counters in Prometheus's text format. `tests/actix_server.rs` serves this `app`
//! beside the axum example's router and checks that both answer alike.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{web, App, HttpResponse, HttpServer};
use metrics_exporter_prometheus::PrometheusHandle;
use tollgate::actix::RateLimit;
use tollgate::tower::config::LayerConfig;
use tollgate::tower::RateLimitLayer;

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policies.toml").to_owned()
    });

    // Metrics go to a Prometheus recorder, rendered at /metrics (install it before serving).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;

    // The whole rate-limiting set-up: read the file, build the layer (as the axum example).
    let config: LayerConfig = toml::from_str(&std::fs::read_to_string(&path)?)?;
    let layer = config.build()?;
    let scrapes = scrape_limit();

    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    // Each worker builds its `App`; clones of the layer share its limiters.
    let server = HttpServer::new(move || app(layer.clone(), scrapes.clone(), prometheus.clone()))
        .bind(&addr)?;
    for bound in server.addrs() {
        println!("listening on http://{bound} (limits from {path})");
    }
    server.run().await?;
    Ok(())
}

/// The example's routes behind `layer`, and `/metrics` behind `scrapes` (a limit of its own)
/// rendering `prometheus` after refreshing the layer's gauges: the routes and answers of
/// `examples/server.rs`.
pub fn app(
    layer: RateLimitLayer,
    scrapes: RateLimitLayer,
    prometheus: PrometheusHandle,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let gauges = layer.clone(); // shares the layer's limiters: reports their key counts
    let metrics = web::resource("/metrics")
        .wrap(RateLimit::new(scrapes))
        .route(web::get().to(move || {
            gauges.record_gauges();
            let text = prometheus.render();
            async move { HttpResponse::Ok().body(text) }
        }));
    // `/metrics` first, outside the layer; every other path in the scope the layer wraps
    // (its 404s included).
    App::new().service(metrics).service(
        web::scope("")
            .wrap(RateLimit::new(layer))
            .route("/api/hello", web::get().to(|| async { "hello\n" }))
            .route("/api/export", web::get().to(|| async { "an export\n" }))
            .route("/partner/orders", web::get().to(|| async { "orders\n" }))
            .route("/beta/feature", web::get().to(|| async { "beta\n" }))
            .route("/upload", web::post().to(|| async { "stored\n" }))
            .route("/health", web::get().to(|| async { "ok\n" })),
    )
}

/// The limit on `/metrics`, per peer address: a burst of 10, then one every 10 s (as the axum
/// example's: a scrape refreshes every gauge, so no client may ask for it in a loop).
pub fn scrape_limit() -> RateLimitLayer {
    use tollgate::tower::{Key, KeySource, Policy};
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
