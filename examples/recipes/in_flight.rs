use std::net::SocketAddr;

use axum::{routing::post, Router};
use tollgate::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // At most 2 exports running per client IP, and 10 a minute.
    let exports = Policy::gcra("exports", Quota::per_minute(10)?)
        .path_prefix("/export")
        .max_in_flight(2);
    let layer = RateLimitLayer::builder().policy(exports).build()?;
    let app = Router::new()
        .route(
            "/export",
            post(|| async {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                "done\n"
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
