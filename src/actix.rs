//! An actix-web middleware (feature `actix`) on the tower layer's engine.
//!
//! [`RateLimit`] is what `App::wrap` takes; it runs a
//! [`RateLimitLayer`](crate::tower::RateLimitLayer) (built with
//! [`RateLimitLayer::builder`](crate::tower::RateLimitLayer::builder), or with feature `serde`
//! from a configuration file): the same
//! policies, client keys behind trusted proxies, rate-limit headers, `429` problem+json
//! denials, shadow and delay modes, in-flight bounds, allow-lists, refunds and metrics as the
//! tower layer, decided by the same code. Everything [`crate::tower`] says of what a request
//! gets holds here; a server moved from axum to actix-web (or serving both) keeps its
//! `policies.toml`, and its clients get the same answers.
//!
//! ```no_run
//! use actix_web::{web, App, HttpResponse, HttpServer};
//! use tollgate::actix::RateLimit;
//! use tollgate::prelude::*;
//!
//! #[actix_web::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Per client IP: 10 requests a second, bursts of 20, on /api/.
//!     let api = Policy::gcra("api", Quota::per_second(10)?.with_burst(20)?).path_prefix("/api/");
//!     let layer = RateLimitLayer::builder()
//!         .policy(api)
//!         .trusted_proxies(["127.0.0.1".parse()?]) // a reverse proxy on this host
//!         .headers(HeaderStyle::Both)
//!         .build()?;
//!     // Every worker's `App` shares the layer's limiters.
//!     HttpServer::new(move || {
//!         App::new()
//!             .wrap(RateLimit::new(layer.clone()))
//!             .route("/api/hello", web::get().to(|| async { HttpResponse::Ok().body("hello") }))
//!             .route("/health", web::get().to(HttpResponse::Ok)) // no policy: not limited
//!     })
//!     .bind(("127.0.0.1", 3000))?
//!     .run()
//!     .await?;
//!     Ok(())
//! }
//! ```
//!
//! From a configuration file (feature `serde`), as `examples/actix_server.rs` does:
//! `let layer = toml::from_str::<LayerConfig>(&text)?.build()?;` and `RateLimit::new(layer)`.
//!
//! # How a request reaches the layer
//! actix-web 4 has `http` 0.2 types; the layer has `http` 1's. The middleware hands the layer
//! a copy of each request's head, converted by bytes: its method, URI (path and query),
//! version and the header fields the layer reads, with the peer address from actix-web's
//! [`ServiceRequest::peer_addr`](actix_web::dev::ServiceRequest::peer_addr) (so
//! [`RateLimitLayerBuilder::trusted_proxies`](crate::tower::RateLimitLayerBuilder::trusted_proxies)
//! and the forwarding header work as in tower). Those fields are the policies' key headers,
//! the forwarding header when proxies are trusted, and `content-type` (gRPC); when a closure
//! may read the request (`KeySource::from_fn`, `Policy::cost_fn`, `allow_if`, `allow_paths`,
//! `peer_addr`) every field is copied, and the peer address is also a
//! [`SocketAddr`](std::net::SocketAddr) extension, as tower servers give it. The layer's answers and fields are copied
//! back into actix-web's response; the application's body passes through as it is, inside
//! [`RateLimitBody`](crate::tower::RateLimitBody), which holds the request's in-flight place
//! until the body ends.
//!
//! # Caveats
//! - Closures that read a request (`KeySource::from_fn`, `Policy::cost_fn`, `allow_if`,
//!   `peer_addr`) see that converted head: actix-web's request extensions (and anything a
//!   middleware before this one put there) are not carried over.
//! - Copying the head costs an allocation for the URI and one per header field copied (every
//!   field when a closure reads the request); `benches/README.md` has the cost per request
//!   next to actix-governor's.
//! - actix-web keeps the whole URI in nested scopes, so a policy names the path the client
//!   sent wherever `wrap` is put (the `App`, a `web::scope`, a resource).
//! - actix-web's `peer_addr()` is the TCP peer: behind a reverse proxy, list the proxy in
//!   `trusted_proxies` (actix-web's own `ConnectionInfo::realip_remote_addr` trusts any
//!   client's `Forwarded` header, so the middleware does not read it). Over a Unix socket
//!   there is no peer address: a policy keyed by IP answers `500` unless
//!   [`on_missing_key`](crate::tower::RateLimitLayerBuilder::on_missing_key) says otherwise.
//! - Delay mode (feature `tokio`) sleeps on tokio's timer, which actix-web's runtime runs.
//! - actix-web 4.18 needs Rust 1.89 or later, above this crate's own minimum.

mod convert;
mod middleware;

pub use self::middleware::{RateLimit, RateLimitService, ResponseFuture};
