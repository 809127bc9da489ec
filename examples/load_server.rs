//! The servers of the load test (`scripts/load.sh`, figures in benches/README.md): the
//! example's router (`examples/server.rs`) with its tollgate layer, with no layer, or with
//! tower-governor at the same quota.
//!
//! ```sh
//! cargo run --release --example load_server --features axum,serde,tokio,metrics -- tollgate
//! ```
//!
//! The first argument picks the server:
//! - `tollgate`: exactly `examples/server.rs` (the layer from `examples/policies.toml`: per
//!   client IP 10 a second, bursts of 20, on `/api/`; the client IP read from
//!   `X-Forwarded-For` when the peer is the trusted 127.0.0.1; Prometheus metrics counted);
//! - `tollgate-no-headers`: the same with `headers = "none"` (what the rate-limit fields cost
//!   under load, apart from the decision);
//! - `none`: the same routes, no layer;
//! - `governor`: the same routes behind tower-governor 0.8 at 10 a second, bursts of 20, keyed
//!   by its `SmartIpKeyExtractor` (`X-Forwarded-For`, then `X-Real-Ip`, `Forwarded`, the peer).
//! - `none-draft`, `none-both`: no layer; the handler adds the draft's two rate-limit fields
//!   (or the `both` style's five) itself, static names and values: what the fields cost
//!   without any limiter (`scripts/load-profile.sh none none-draft`).
//!
//! It listens on `TOLLGATE_ADDR` (default `127.0.0.1:3000`).

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::SmartIpKeyExtractor;
use tower_governor::GovernorLayer;

#[path = "server.rs"]
#[allow(dead_code)] // its `main`: this file serves its router
mod server;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tollgate".to_owned());
    let hello = || Router::new().route("/api/hello", get(|| async { "hello\n" }));
    let app = match mode.as_str() {
        "tollgate" | "tollgate-no-headers" => {
            let prometheus =
                metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
            // `TOLLGATE_POLICIES` names another configuration.
            let path = std::env::var("TOLLGATE_POLICIES").unwrap_or_else(|_| {
                concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policies.toml").to_owned()
            });
            let mut config: tollgate::tower::config::LayerConfig =
                toml::from_str(&std::fs::read_to_string(path)?)?;
            if mode == "tollgate-no-headers" {
                // What the fields cost apart from what the decision costs.
                config.headers = tollgate::tower::HeaderStyle::None;
            }
            server::app(config.build()?, prometheus)
        }
        "none" => hello(),
        // What the rate-limit fields cost without any limiter: the handler adds them itself,
        // names and values static (the cheapest way to put them on a response).
        "none-draft" => Router::new().route(
            "/api/hello",
            get(|| async { (fields(&DRAFT_FIELDS), "hello\n") }),
        ),
        "none-both" => Router::new().route(
            "/api/hello",
            get(|| async { (fields(&BOTH_FIELDS), "hello\n") }),
        ),
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_millisecond(100)
                .burst_size(20)
                .key_extractor(SmartIpKeyExtractor)
                .finish()
                .ok_or("an invalid governor config")?;
            hello().layer(GovernorLayer::new(config))
        }
        other => {
            return Err(format!(
                "unknown server {other:?}: tollgate, tollgate-no-headers, none, none-draft, none-both or governor"
            )
            .into())
        }
    };
    let addr = std::env::var("TOLLGATE_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("{mode}: listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// The draft's two fields as the example's `/api/` policy sends them (values of a typical
/// response).
const DRAFT_FIELDS: [(&str, &str); 2] = [
    ("ratelimit-policy", "\"api\";q=10;w=1"),
    ("ratelimit", "\"api\";r=19;t=1"),
];

/// The `both` style's five fields.
const BOTH_FIELDS: [(&str, &str); 5] = [
    ("x-ratelimit-limit", "10"),
    ("x-ratelimit-remaining", "19"),
    ("x-ratelimit-reset", "1"),
    ("ratelimit-policy", "\"api\";q=10;w=1"),
    ("ratelimit", "\"api\";r=19;t=1"),
];

/// `fields` as static header names and values (no parsing, no allocation), each inserted
/// into the response's header map by axum.
fn fields<const N: usize>(
    fields: &'static [(&'static str, &'static str); N],
) -> [(axum::http::HeaderName, axum::http::HeaderValue); N] {
    fields.map(|(name, value)| {
        (
            axum::http::HeaderName::from_static(name),
            axum::http::HeaderValue::from_static(value),
        )
    })
}
