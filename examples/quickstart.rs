use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Per client IP: 10 requests a second, bursts of 20, on /api/ (429 beyond).
    let api = Policy::gcra("api", Quota::per_second(10)?.with_burst(20)?).path_prefix("/api/");
    let layer = RateLimitLayer::builder()
        .policy(api)
        .headers(HeaderStyle::Both)
        .build()?;

    let app = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .route("/health", get(|| async { "ok\n" })) // no policy matches: never limited
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    // The layer keys clients by their address: serve with it.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
