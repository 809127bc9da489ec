use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use http::HeaderName;
use tollgate::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let login = Policy::gcra("login", Quota::per_minute(5)?).path_prefix("/login");
    let api = Policy::gcra("api", Quota::per_second(50)?)
        .path_prefix("/api/")
        .key(KeySource::header(HeaderName::from_static("x-api-key")));
    let layer = RateLimitLayer::builder()
        .policy(login)
        .policy(api)
        .allow_paths(["/health"])
        .build()?;
    let app = Router::new()
        .route("/login", post(|| async { "welcome\n" }))
        .route("/api/items", get(|| async { "[]\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
