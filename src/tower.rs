//! A tower layer for HTTP servers (feature `tower`; add `axum` to read axum's `ConnectInfo`).
//!
//! [`RateLimitLayer`] wraps any tower [`Service`](tower_service::Service) over [`http::Request`]: axum routers,
//! hyper-util servers, tonic. For each request it picks the first [`Policy`] that matches (by
//! path and method; else the default policy; else no limit), works out the client key
//! ([`KeySource`]) and the cost, asks the policy's [`CheckBackend`] and then either passes the
//! request on or answers for the inner service:
//!
//! - **Allowed**: the inner service's response, with the rate-limit fields ([`HeaderStyle`]).
//! - **Denied** (mode [`Mode::Enforce`]): `429 Too Many Requests`, an RFC 9457
//!   `application/problem+json` body (`type`, `title`, `status`, `detail` and `retry-after`),
//!   `Retry-After` in whole seconds rounded up and never 0, and the rate-limit fields. A gRPC
//!   request (`content-type: application/grpc…`) gets HTTP 200 with `grpc-status: 8`
//!   (RESOURCE_EXHAUSTED) and a `grpc-message` instead. Or a response of your own
//!   ([`RateLimitLayerBuilder::deny_with`]).
//! - **Denied in [`Mode::Shadow`]**: passed on, with the rate-limit fields (no `Retry-After`).
//! - **Denied in `Mode::Delay`** (feature `tokio`): the request waits for its slot, then is
//!   passed on; if admission would take longer than the policy's `max_wait`, it is denied as
//!   in `Enforce`. On a backend that reserves ([`CheckBackend::reserve`]: GCRA and the leaky
//!   queue in process) waiters are served first come, first served, each charged once, and one
//!   that hangs up gives its slot back; on others (the windows, the log, Redis) a waiter checks
//!   again after each refusal's `retry_after`.
//! - **No key** (a missing header, a closure's `None`, no peer address):
//!   [`Policy::on_missing_key`] or [`RateLimitLayerBuilder::on_missing_key`] says: reject it
//!   with a status, or let it through uncounted ([`Fallback::Allow`]). Unset, a key the client
//!   did not send is its mistake, `400 Bad Request`; a missing peer address is the server's
//!   set-up error, `500 Internal Server Error`, whose body says to serve with
//!   `into_make_service_with_connect_info::<SocketAddr>()` (axum).
//! - **Backend error** (a full key table, a failed network backend):
//!   [`RateLimitLayerBuilder::on_error`], the same choices (default 503). A cost above the
//!   quota's capacity can never be admitted: a 429 without `Retry-After`.
//! - **Allow-listed** (a client IP in [`RateLimitLayerBuilder::allow_cidrs`], or
//!   [`RateLimitLayerBuilder::allow_if`]): passed on, not counted, no fields.
//!
//! The layer keeps its whole configuration behind one `Arc`: cloning it, or the service, is
//! one reference count, and every clone (every router it is attached to) shares the same
//! limiters. Nothing in it panics on any header content.
//!
//! # Client addresses
//! The peer address comes from axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`) or from a plain
//! [`SocketAddr`](std::net::SocketAddr) request extension; another server says where it keeps
//! it with [`RateLimitLayerBuilder::peer_addr`] (tonic: its `TcpConnectInfo`). Behind proxies, list them with [`RateLimitLayerBuilder::trusted_proxies`]: only
//! when the peer is one of them is the forwarding header ([`ProxyHeader`]: `X-Forwarded-For`
//! by default, or RFC 7239 `Forwarded`) read, right to left, skipping trusted hops; the first
//! untrusted hop is the client. A client talking to the server directly cannot choose its key.
//! IPv4 clients are keyed per address, IPv6 clients per /56 by default (one site usually owns
//! a whole /56 or /48; see [`RateLimitLayerBuilder::ipv6_prefix`]).
//!
//! # Example (axum)
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Per client IP: 10 requests a second, bursts of 20, on /api/.
//! let api = Policy::gcra("api", Quota::per_second(10)?.with_burst(20)?).path_prefix("/api/");
//! let layer = RateLimitLayer::builder()
//!     .policy(api)
//!     .trusted_proxies(["127.0.0.1".parse()?]) // a reverse proxy on this host
//!     .headers(HeaderStyle::Both)
//!     .build()?;
//!
//! let app = Router::new()
//!     .route("/api/hello", get(|| async { "hello" }))
//!     .route("/health", get(|| async { "ok" })) // no policy matches: not limited
//!     .layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Where the layer sits (axum)
//! Policies name the paths clients send ([`client_path`]), wherever the layer is put: axum's
//! `Router::nest("/api", api)` strips `/api` from the URI that `api`'s routes and layers see,
//! and with feature `axum` the layer reads the path from axum's `OriginalUri` instead. A
//! policy on `/api/login` covers `POST /api/login` in each of these placements:
//! ```
//! use axum::{routing::post, Router};
//! use tollgate::tower::{Key, Policy, RateLimitLayer};
//! use tollgate::{Gcra, KeyedLimiter, Quota};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let login = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(2)?)?);
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("login", login).path_prefix("/api/login"))
//!     .build()?;
//! let api = || Router::new().route("/login", post(|| async { "welcome" }));
//! // On the outer router: every route, and the fallback.
//! let outer: Router = Router::new().nest("/api", api()).layer(layer.clone());
//! // On the nested router only.
//! let nested: Router = Router::new().nest("/api", api().layer(layer.clone()));
//! // On the nested router's routes only: a path without a route gets its 404 unchecked.
//! let routes: Router = Router::new().nest("/api", api().route_layer(layer.clone()));
//! // In a stack of layers.
//! let stack = tower::ServiceBuilder::new().layer(layer);
//! let stacked: Router = Router::new().nest("/api", api().layer(stack));
//! # let _ = (outer, nested, routes, stacked);
//! # Ok(())
//! # }
//! ```
//! A router's `.layer(…)` wraps the routes added before it, not those added after (a
//! `/metrics` route added after the layer is never limited). Without feature `axum` the layer
//! matches the request's URI: put it outside any router that strips a prefix, or name the
//! paths as the routes see them.
//!
//! # Metrics
//! With feature `metrics`, the layer counts through the `metrics` crate's
//! facade (install any recorder: Prometheus, StatsD, …):
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_requests_total` | counter | `policy`; `outcome`: `allowed`, `denied`, `shadow_denied`, `delayed`, `no_key`, `error`, and `refunded` (also counted as allowed) |
//! | `tollgate_delay_seconds` | histogram | `policy`: how long each delayed request waited |
//! | `tollgate_keys` | gauge | `policy`: keys held (set by [`RateLimitLayer::record_gauges`]) |
//! | `tollgate_backend_degraded` | gauge | `policy`: 1 while a Redis backend is degraded |
//!
//! Allow-listed requests and requests no policy matches are not counted. Each policy keeps its
//! counters once registered with the recorder in place at their first count, and uses them
//! while that recorder is the one in place (told by its address); under another recorder a
//! count is one lookup in that recorder's registry. So install the recorder before serving,
//! as the `metrics` crate advises. (A test that swaps local recorders builds a layer per
//! recorder: a recorder dropped while a layer lives, then another of the same type at the
//! same address, would get the first one's counters.) The same
//! feature emits `tracing` events at debug level (target `tollgate::tower`) for denials, shadow
//! denials, requests without a key and backend errors, with the policy and the client key.
//!
//! # From a configuration file
//! With feature `serde`, [`config::LayerConfig`] reads the whole layer (policies, quotas, key
//! sources, trusted proxies, header style, modes, allow-lists) from TOML, JSON or YAML; see
//! `examples/policies.toml` and `examples/server.rs`.
//!
//! # Backends
//! [`Policy::gcra`] and [`Policy::keyed`] build a policy's in-process limiter from a quota or
//! a rule. Otherwise a policy checks the [`CheckBackend`] [`Policy::new`] is given: an
//! in-process [`KeyedLimiter`](crate::KeyedLimiter)
//! or [`MultiLimiter`](crate::MultiLimiter) keyed by [`Key`], or (feature `redis`) the Redis
//! tier through `RedisBackend` (exact, guarded or leased): a limit held across a fleet. Moving
//! a policy from one node to the fleet changes only the backend argument of [`Policy::new`].

mod addr;
mod answers;
mod backend;
mod body;
mod builder;
mod cidr;
#[cfg(feature = "serde")]
pub mod config;
mod cost;
mod delay;
mod future;
mod key;
mod layer;
mod outcome;
mod path;
mod policy;
#[cfg(feature = "redis")]
mod redis_backend;
mod response;
pub(crate) mod service;
mod stats;
mod tiers;
#[cfg(feature = "tokio")]
mod waiters;

pub use self::addr::ProxyHeader;
pub use self::answers::{ConfigError, Fallback};
pub use self::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo, Verdict};
pub use self::body::RateLimitBody;
pub use self::builder::RateLimitLayerBuilder;
pub use self::cidr::{Cidr, CidrError};
pub use self::cost::Cost;
pub use self::future::ResponseFuture;
pub use self::key::{Key, KeySource, LongKey};
pub use self::layer::{Evaluation, RateLimitLayer};
pub use self::outcome::Outcome;
pub use self::path::{client_path, normalized_path};
pub use self::policy::{InFlightScope, Mode, Policy};
#[cfg(feature = "redis")]
pub use self::redis_backend::{redis_key, RedisBackend};
pub use self::response::{Denial, HeaderStyle};
pub use self::service::RateLimit;
pub use self::tiers::{Tiers, TiersBuilder, UnknownTier};
