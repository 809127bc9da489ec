//! An axum server whose rate limits come from `examples/policies.toml`.
//!
//! ```sh
//! cargo run --example server --features axum,serde,tokio
//! curl -i http://127.0.0.1:3000/api/hello
//! ```
//!
//! It listens on `TOLLGATE_ADDR` (default `127.0.0.1:3000`) and reads the file named by its
//! first argument (default `examples/policies.toml` in this repository).

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tollgate::tower::config::LayerConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policies.toml").to_owned()
    });
    // The whole rate-limiting set-up: read the file, build the layer.
    let config: LayerConfig = toml::from_str(&std::fs::read_to_string(&path)?)?;
    let layer = config.build()?;

    let app = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .route("/api/export", get(|| async { "an export\n" }))
        .route("/partner/orders", get(|| async { "orders\n" }))
        .route("/beta/feature", get(|| async { "beta\n" }))
        .route("/upload", axum::routing::post(|| async { "stored\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer);

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
