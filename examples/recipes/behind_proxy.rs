use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 100 requests a minute per client IP; the client is read from X-Forwarded-For as the
    // load balancer at 10.0.0.0/8 wrote it.
    let layer = RateLimitLayer::builder()
        .policy(Policy::gcra("per-ip", Quota::per_minute(100)?).key(KeySource::client_ip()))
        .trusted_proxies(["10.0.0.0/8".parse()?])
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
