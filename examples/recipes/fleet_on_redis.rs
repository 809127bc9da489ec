use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::prelude::*;
use tollgate::redis::{FailureHandling, FailurePolicy, RedisLimiter, RedisRule};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 10,000 requests a second across the fleet (8 nodes); each node takes its share
    // locally while Redis is down, and starts whether or not Redis is up.
    let fleet = RedisLimiter::builder(RedisRule::gcra(Quota::per_second(10_000)?)?)
        .connect_lazy("redis://127.0.0.1:6379")
        .await?
        .guarded(FailureHandling::new(FailurePolicy::Local).assumed_nodes(8))
        .await;
    let policy = Policy::new("fleet", RedisBackend::new(fleet)).key(KeySource::constant("all"));
    let layer = RateLimitLayer::builder().policy(policy).build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
