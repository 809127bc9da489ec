//! A tower layer for HTTP servers (feature `tower`; add `axum` to read axum's `ConnectInfo`).
//!
//! [`RateLimitLayer`] wraps any tower [`Service`] over [`http::Request`]: axum routers,
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
//! - **No key** (no peer address, a missing header, a closure's `None`):
//!   [`RateLimitLayerBuilder::on_missing_key`] says: reject it with a status (default 500: a
//!   missing peer address is a server set-up error; choose 400 for a missing API key), or let it
//!   through uncounted ([`Fallback::Allow`]).
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
//! use tollgate::tower::{HeaderStyle, Key, Policy, RateLimitLayer};
//! use tollgate::{Gcra, KeyedLimiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Per client IP: 10 requests a second, bursts of 20, on /api/.
//! let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?.with_burst(20)?)?);
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::new("api", per_ip).path_prefix("/api/"))
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
//! A policy checks one [`CheckBackend`]: an in-process [`KeyedLimiter`](crate::KeyedLimiter)
//! or [`MultiLimiter`](crate::MultiLimiter) keyed by [`Key`], or (feature `redis`) the Redis
//! tier through `RedisBackend` (exact, guarded or leased): a limit held across a fleet. Moving
//! a policy from one node to the fleet changes only the backend argument of [`Policy::new`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

mod backend;
mod cidr;
#[cfg(feature = "serde")]
pub mod config;
mod key;
mod path;
mod policy;
#[cfg(feature = "redis")]
mod redis_backend;
mod response;
mod stats;
mod tiers;
#[cfg(feature = "tokio")]
mod waiters;

pub use self::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo, RuleWindow, Verdict};
pub use self::cidr::{Cidr, CidrError};
pub use self::key::{Key, KeySource, LongKey, ProxyHeader};
pub use self::path::normalized_path;
pub use self::policy::{Cost, Mode, Policy};
#[cfg(feature = "redis")]
pub use self::redis_backend::{redis_key, RedisBackend};
pub use self::response::{Denial, HeaderStyle, RateLimitBody};
pub use self::stats::Outcome;
pub use self::tiers::{Tiers, TiersBuilder, UnknownTier};

use self::key::{peer_addr, AddrConfig, Addrs};
use self::response::{
    add_headers, grpc_code, grpc_response, is_grpc, problem, problem_response, retry_after_secs,
    set_retry_after, GRPC_RESOURCE_EXHAUSTED,
};
use crate::Error;

/// What the layer does with a request it cannot decide (no key, or a backend error).
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::{Fallback, RateLimitLayer};
/// // No client key (no peer address, no API key header): a 400 says "your request is wrong".
/// let layer = RateLimitLayer::builder()
///     .on_missing_key(Fallback::Reject(StatusCode::BAD_REQUEST))
///     .on_error(Fallback::Allow) // fail open while a backend cannot decide
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Answer with this status (a problem+json body, or the matching gRPC status).
    Reject(StatusCode),
    /// Pass the request on, uncounted and without rate-limit fields.
    Allow,
}

/// Why a layer's configuration was refused.
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::{ConfigError, Fallback, RateLimitLayer};
/// // A fallback "rejection" with 200 would pass the request while claiming to refuse it.
/// let err = RateLimitLayer::builder().on_error(Fallback::Reject(StatusCode::OK)).build();
/// assert_eq!(err.err(), Some(ConfigError::FallbackStatus(StatusCode::OK)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A policy name must be 1–64 printable ASCII characters (it goes into headers).
    #[error("policy name {0:?} must be 1-64 printable ASCII characters")]
    PolicyName(String),
    /// The IPv6 grouping prefix must lie in /32 ..= /64: a shorter one puts whole providers
    /// in one bucket, a longer one gives a host that owns a /64 as many buckets as addresses.
    #[error("IPv6 prefix /{0} is outside /32 ..= /64")]
    Ipv6Prefix(u8),
    /// A [`Fallback::Reject`] status must be a client or server error (4xx or 5xx).
    #[error("fallback status {0} is not a 4xx or 5xx status")]
    FallbackStatus(StatusCode),
    /// A policy's algorithm refused one of its quotas, or its clock (a configured policy).
    #[error("policy {policy:?}: {error}")]
    Quota {
        /// The policy's name.
        policy: String,
        /// What the algorithm refused.
        error: crate::QuotaError,
    },
    /// An allow-listed path (`allow_paths` of a configuration) must start with `/`: any other
    /// can never match, or (empty) would match every path.
    #[error("allow path {0:?} must start with `/`")]
    AllowPath(String),
    /// A configured policy is incomplete or contradictory.
    #[error("policy {policy:?}: {problem}")]
    Policy {
        /// The policy's name.
        policy: String,
        /// What is wrong.
        problem: String,
    },
}

type Predicate = dyn Fn(&Parts) -> bool + Send + Sync;
type PeerFn = dyn Fn(&Parts) -> Option<std::net::IpAddr> + Send + Sync;
type DenyFn = dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync;

/// The layer's configuration, shared by every clone.
struct Shared {
    /// The policies in order, then the default policy (if any) last.
    policies: Vec<Policy>,
    has_default: bool,
    addrs: AddrConfig,
    /// Where the peer's address comes from, if not from the request's extensions.
    peer: Option<Arc<PeerFn>>,
    allow_cidrs: Vec<Cidr>,
    allow_if: Option<Arc<Predicate>>,
    headers: HeaderStyle,
    on_missing_key: Fallback,
    on_error: Fallback,
    on_table_full: Fallback,
    max_key_len: usize,
    on_long_key: LongKey,
    deny_with: Option<Arc<DenyFn>>,
}

/// The default bound on a key part's bytes: a few hundred, room for any address, API key or
/// route, and a bearer token up to a modest size.
const DEFAULT_MAX_KEY_LEN: usize = 256;

/// The IPv6 grouping prefixes accepted (see [`RateLimitLayerBuilder::ipv6_prefix`]).
const IPV6_PREFIXES: std::ops::RangeInclusive<u8> = 32..=64;

/// Builds a [`RateLimitLayer`].
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", per_ip).path_prefix("/api/"))
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct RateLimitLayerBuilder {
    policies: Vec<Policy>,
    default: Option<Policy>,
    addrs: AddrConfig,
    /// Where the peer's address comes from, if not from the request's extensions.
    peer: Option<Arc<PeerFn>>,
    allow_cidrs: Vec<Cidr>,
    allow_if: Option<Arc<Predicate>>,
    headers: HeaderStyle,
    on_missing_key: Fallback,
    on_error: Fallback,
    on_table_full: Fallback,
    max_key_len: usize,
    on_long_key: LongKey,
    deny_with: Option<Arc<DenyFn>>,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("policies", &self.policies)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Adds a policy; the first policy that matches a request applies.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let uploads = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(5)?)?);
    /// // Order matters: `/api/upload` must come before the `/api/` catch-all.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("upload", uploads).path_prefix("/api/upload"))
    ///     .policy(Policy::new("api", per_ip).path_prefix("/api/"))
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// The policy for requests no other policy matches (its own path and method filters are
    /// ignored). Without one, such requests are not limited.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// // Everything not matched by another policy, instead of not limiting it at all.
    /// let layer = RateLimitLayer::builder().default_policy(Policy::new("site", per_ip)).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn default_policy(mut self, policy: Policy) -> Self {
        self.default = Some(policy);
        self
    }

    /// The proxies whose forwarding headers are believed (default: none, so client addresses
    /// are peer addresses). List every proxy between the internet and this server.
    ///
    /// The header is read right to left from a trusted peer, and the first hop that is not a
    /// trusted proxy is the client. A hop that is not an address (bytes a client wrote, that a
    /// proxy passed on without appending the address it saw) leaves the client unknown: the
    /// request has no key, and [`on_missing_key`](Self::on_missing_key) answers it, rather
    /// than counting it as the proxy, or letting it through an allow-listed proxy network.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// // Behind one load balancer: read X-Forwarded-For only when the peer is that balancer, so
    /// // clients cannot choose their own key by sending the header themselves.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     .trusted_proxies(["10.0.0.0/8".parse()?])
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trusted_proxies(mut self, proxies: impl IntoIterator<Item = Cidr>) -> Self {
        self.addrs.trusted = proxies.into_iter().collect();
        self
    }

    /// The header the trusted proxies write (default `X-Forwarded-For`). Only this one is
    /// read: a header the proxies do not write would be the client's to choose.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{ProxyHeader, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .trusted_proxies(["192.0.2.10".parse()?])
    ///     .proxy_header(ProxyHeader::Forwarded) // the proxy writes RFC 7239 `Forwarded`
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn proxy_header(mut self, header: ProxyHeader) -> Self {
        self.addrs.header = header;
        self
    }

    /// IPv6 client addresses are keyed by their first `prefix` bits, 32 to 64 (default 56: a
    /// site; 64 for one subnet, the smallest block a host is given, so a longer prefix would
    /// let it rotate addresses into new buckets). IPv4 addresses are keyed whole.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{ConfigError, RateLimitLayer};
    /// // One key per /64: a host that owns a /64 cannot multiply its limit by rotating addresses.
    /// let layer = RateLimitLayer::builder().ipv6_prefix(64).build()?;
    /// assert_eq!(RateLimitLayer::builder().ipv6_prefix(128).build().err(), Some(ConfigError::Ipv6Prefix(128)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.addrs.ipv6_prefix = prefix;
        self
    }

    /// Requests whose client IP lies in one of `networks` bypass every policy.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// // Internal services and monitoring are never limited.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     .allow_cidrs(["10.0.0.0/8".parse()?, "fd00::/8".parse()?])
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_cidrs(mut self, networks: impl IntoIterator<Item = Cidr>) -> Self {
        self.allow_cidrs.extend(networks);
        self
    }

    /// Requests for which `predicate` holds bypass every policy (e.g. `/health`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{normalized_path, Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     // Probes must never see a 429; compare normalised paths, as the policies do.
    ///     .allow_if(|req| normalized_path(req.uri.path()) == "/health")
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_if(mut self, predicate: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.allow_if = Some(Arc::new(predicate));
        self
    }

    /// Where the peer's address comes from, for a server that does not put it where the layer
    /// looks by default (axum's `ConnectInfo<SocketAddr>`, or a `SocketAddr` request
    /// extension). The address then goes through the trusted proxies and the IPv6 grouping as
    /// any peer address does.
    ///
    /// # Examples
    /// tonic puts a `TcpConnectInfo` in each request's extensions (its `transport` feature):
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// use tonic::transport::server::TcpConnectInfo;
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("grpc", per_ip))
    ///     .peer_addr(|parts| parts.extensions.get::<TcpConnectInfo>()?.remote_addr().map(|a| a.ip()))
    ///     .build()?;
    /// // tonic::transport::Server::builder().layer(layer).add_service(…)
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer_addr(
        mut self,
        peer: impl Fn(&Parts) -> Option<std::net::IpAddr> + Send + Sync + 'static,
    ) -> Self {
        self.peer = Some(Arc::new(peer));
        self
    }

    /// The rate-limit fields on responses (default [`HeaderStyle::Draft`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{HeaderStyle, RateLimitLayer};
    /// // Clients written for `X-RateLimit-*` and for the IETF draft fields both find theirs.
    /// let layer = RateLimitLayer::builder().headers(HeaderStyle::Both).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.headers = style;
        self
    }

    /// The longest text or byte part a key may have, in bytes (default 256): a header value
    /// or path longer than this is handled by [`on_long_key`](Self::on_long_key), so that a
    /// client cannot make the server hold (or send to Redis) keys of the length it likes.
    /// Stores bound keys by count (`max_keys`); this bounds each key's bytes.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::RateLimitLayer;
    /// // Keys by a bearer token of up to 2 KiB: digested beyond that.
    /// let layer = RateLimitLayer::builder().max_key_len(2048).build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// What happens to a request whose key has a part longer than
    /// [`max_key_len`](Self::max_key_len): counted under a digest of it (default), or
    /// refused with a status (see [`LongKey`]).
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::{LongKey, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .on_long_key(LongKey::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_long_key(mut self, long_key: LongKey) -> Self {
        self.on_long_key = long_key;
        self
    }

    /// What happens to a request whose key cannot be extracted (default
    /// `Reject(500 Internal Server Error)`), under a policy that does not set its own
    /// ([`Policy::on_missing_key`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Fallback, RateLimitLayer};
    /// // A public page keyed by an optional header: requests without it pass, uncounted.
    /// let layer = RateLimitLayer::builder().on_missing_key(Fallback::Allow).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_missing_key(mut self, fallback: Fallback) -> Self {
        self.on_missing_key = fallback;
        self
    }

    /// What happens to a request of a new key that a full key table refuses (default
    /// `Reject(503 Service Unavailable)`): a limiter built with
    /// [`max_keys`](crate::KeyedLimiterBuilder::max_keys) and [`OverflowPolicy::Deny`](crate::OverflowPolicy::Deny).
    /// Not [`on_error`](Self::on_error): an outage of a network backend may well be let through,
    /// a full table must not be.
    ///
    /// An attacker who rotates keys (IPv6 addresses within the grouping prefix's reach, API
    /// key values) fills the table with keys that then stay until they are fresh. With
    /// `Fallback::Allow` here every new key would then pass uncounted; with the default, new
    /// clients are refused until the table has room again, and the clients it holds are
    /// unaffected. (`OverflowPolicy::Shared` instead puts new keys in one state they share,
    /// which such an attacker empties as well: counted, never uncounted.) Shadow policies
    /// pass such requests.
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::{Fallback, RateLimitLayer};
    /// let layer = RateLimitLayer::builder()
    ///     .on_table_full(Fallback::Reject(StatusCode::TOO_MANY_REQUESTS))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_table_full(mut self, fallback: Fallback) -> Self {
        self.on_table_full = fallback;
        self
    }

    /// What happens to a request whose backend could not decide (default
    /// `Reject(503 Service Unavailable)`). Shadow policies always pass such requests. A full
    /// key table has its own setting, [`on_table_full`](Self::on_table_full).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Fallback, RateLimitLayer};
    /// // Fail open: a Redis outage should not take the API down with it.
    /// let layer = RateLimitLayer::builder().on_error(Fallback::Allow).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_error(mut self, fallback: Fallback) -> Self {
        self.on_error = fallback;
        self
    }

    /// Builds denials with `f` instead of the problem+json / gRPC answers. The layer then sets
    /// `Retry-After` and the rate-limit fields on what `f` returns.
    ///
    /// # Examples
    /// ```
    /// use bytes::Bytes;
    /// use http::{Response, StatusCode};
    /// use tollgate::tower::RateLimitLayer;
    /// // A plain-text 429 for a client that cannot read problem+json.
    /// let layer = RateLimitLayer::builder()
    ///     .deny_with(|denial| {
    ///         Response::builder()
    ///             .status(StatusCode::TOO_MANY_REQUESTS)
    ///             .body(Bytes::from(format!("slow down: retry in {} s\n", denial.retry_after_secs)))
    ///             .unwrap()
    ///     })
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn deny_with(
        mut self,
        f: impl Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.deny_with = Some(Arc::new(f));
        self
    }

    /// The layer.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first setting that is refused.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// use tollgate::tower::ConfigError;
    /// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
    /// // Policy names go into `RateLimit-Policy` headers: refused if they could not.
    /// let other = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let bad = RateLimitLayer::builder().policy(Policy::new("a\nb", other)).build();
    /// assert!(matches!(bad, Err(ConfigError::PolicyName(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        if !IPV6_PREFIXES.contains(&self.addrs.ipv6_prefix) {
            return Err(ConfigError::Ipv6Prefix(self.addrs.ipv6_prefix));
        }
        let long_key = match self.on_long_key {
            LongKey::Reject(status) => Fallback::Reject(status),
            LongKey::Digest => Fallback::Allow,
        };
        let policy_fallbacks = self.policies.iter().chain(&self.default);
        let policy_fallbacks = policy_fallbacks.filter_map(|p| p.on_missing_key);
        let fallbacks = [
            self.on_missing_key,
            self.on_error,
            self.on_table_full,
            long_key,
        ];
        for fallback in fallbacks.into_iter().chain(policy_fallbacks) {
            if let Fallback::Reject(status) = fallback {
                if !(status.is_client_error() || status.is_server_error()) {
                    return Err(ConfigError::FallbackStatus(status));
                }
            }
        }
        let has_default = self.default.is_some();
        let mut policies = self.policies;
        policies.extend(self.default);
        for policy in &policies {
            let name = policy.name();
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| (0x20..0x7f).contains(&b))
            {
                return Err(ConfigError::PolicyName(name.to_string()));
            }
            if let Some(problem) = policy.path_problem().or_else(|| policy.delay_problem()) {
                return Err(ConfigError::Policy {
                    policy: name.to_string(),
                    problem,
                });
            }
            if policy.refund.is_some() && !policy.backend.can_refund() {
                return Err(ConfigError::Policy {
                    policy: name.to_string(),
                    problem: "refunds by status need a backend that can refund".to_owned(),
                });
            }
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                policies,
                has_default,
                addrs: self.addrs,
                peer: self.peer,
                allow_cidrs: self.allow_cidrs,
                allow_if: self.allow_if,
                headers: self.headers,
                on_missing_key: self.on_missing_key,
                on_error: self.on_error,
                on_table_full: self.on_table_full,
                max_key_len: self.max_key_len,
                on_long_key: self.on_long_key,
                deny_with: self.deny_with,
            }),
        })
    }
}

/// A tower [`Layer`] that rate-limits HTTP requests by policy (see the [module docs](self)).
///
/// Cloning it is one reference count; clones share their limiters.
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// use axum::{routing::get, Router};
/// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
/// // Clones share the limiters: one layer can serve several routers.
/// let app: Router = Router::new().route("/api/hello", get(|| async { "hello" })).layer(layer.clone());
/// let admin: Router = Router::new().route("/admin", get(|| async { "ok" })).layer(layer);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", &self.shared.policies)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// The tiers of policy `policy` (when its backend is [`Tiers`]): a handle to move keys
    /// between tiers while the server runs. `None` for another backend or an unknown name.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer, Tiers};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let q = |n| -> Result<_, tollgate::QuotaError> {
    ///     Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?))
    /// };
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", Tiers::builder("free", q(100)?).tier("pro", q(1000)?).build()?))
    ///     .build()?;
    /// layer.tiers("api").expect("a tiered policy").assign(Key::from("k"), "pro")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tiers(&self, policy: &str) -> Option<Tiers> {
        self.shared
            .policies
            .iter()
            .find(|p| p.name() == policy)
            .and_then(|p| p.tiers.clone())
    }

    /// Sets the layer's gauges (feature `metrics`; without it, does nothing):
    /// `tollgate_keys{policy}`, the keys each policy's backend holds (where it knows), and
    /// `tollgate_backend_degraded{policy}`, 1 while a Redis backend decides by its failure
    /// policy. They are read here, not on every request (the request path stays as cheap):
    /// call it before each scrape, or from a periodic task.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
    /// layer.record_gauges(); // e.g. in the /metrics handler, before rendering
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn record_gauges(&self) {
        for policy in &self.shared.policies {
            stats::record_gauges(policy);
        }
    }

    /// Decides `parts` as the layer's service would, without a service: the policy that
    /// applies, the key it derives, its check (in delay mode, the wait for the slot) and
    /// whether the request would reach the inner service. It charges the backend and counts the
    /// metrics exactly as a request would; with no response, a refund by status does not apply.
    /// `cost` replaces the policy's cost when given (a cost the server computes by other means).
    /// This is what `tollgate replay --config` runs for every line of a trace.
    ///
    /// # Examples
    /// ```
    /// use http::Request;
    /// use tollgate::tower::{Key, Outcome, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
    /// let mut request = Request::get("/api/x").body(())?;
    /// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
    /// let (parts, ()) = request.into_parts();
    /// let first = layer.evaluate(&parts, None).await;
    /// assert_eq!((first.outcome, first.passes), (Outcome::Allowed, true));
    /// assert_eq!(first.key.unwrap().to_string(), "192.0.2.1");
    /// let second = layer.evaluate(&parts, None).await;
    /// assert_eq!((second.outcome, second.passes), (Outcome::Denied, false));
    /// assert_eq!(second.policy.as_deref(), Some("api"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn evaluate(&self, parts: &Parts, cost: Option<u64>) -> Evaluation {
        let shared = &self.shared;
        let unchecked = |policy: Option<usize>, outcome, passes| Evaluation {
            policy: policy.map(|i| Arc::clone(&shared.policies[i].name)),
            key: None,
            cost: 0,
            outcome,
            decision: None,
            waited: std::time::Duration::ZERO,
            passes,
        };
        let (index, key, policy_cost) = match shared.plan(parts) {
            Plan::Pass => return unchecked(None, Outcome::Passed, true),
            Plan::Unchecked {
                policy,
                outcome,
                fallback,
            } => return unchecked(Some(policy), outcome, fallback == Fallback::Allow),
            Plan::Check { policy, key, cost } => (policy, key, cost),
        };
        let cost = cost.unwrap_or(policy_cost);
        let policy = &shared.policies[index];
        let decided = decide(policy, &key, cost).await;
        let outcome = outcome(policy, &decided);
        let (decision, waited) = match &decided {
            Ok((verdict, waited)) => (Some(verdict.decision), *waited),
            Err(_) => (None, std::time::Duration::ZERO),
        };
        let next = next::<()>(
            shared,
            index,
            key.clone(),
            cost,
            decided,
            is_grpc(&parts.method, &parts.headers),
        );
        Evaluation {
            policy: Some(Arc::clone(&policy.name)),
            key: Some(key),
            cost,
            outcome,
            decision,
            waited,
            passes: matches!(next, Next::Call(_)),
        }
    }

    /// A builder with no policy, no trusted proxy, IPv6 grouped per /56, draft headers.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::RateLimitLayer;
    /// // With no policy nothing is limited: the layer then only sets no headers and passes through.
    /// let layer = RateLimitLayer::builder().build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            policies: Vec::new(),
            default: None,
            addrs: AddrConfig {
                trusted: Vec::new(),
                header: ProxyHeader::default(),
                ipv6_prefix: 56,
            },
            peer: None,
            allow_cidrs: Vec::new(),
            allow_if: None,
            headers: HeaderStyle::default(),
            on_missing_key: Fallback::Reject(StatusCode::INTERNAL_SERVER_ERROR),
            on_error: Fallback::Reject(StatusCode::SERVICE_UNAVAILABLE),
            on_table_full: Fallback::Reject(StatusCode::SERVICE_UNAVAILABLE),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            on_long_key: LongKey::Digest,
            deny_with: None,
        }
    }
}

/// What [`RateLimitLayer::evaluate`] decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evaluation {
    /// The policy that applied; `None` when none does, or the request is allow-listed.
    pub policy: Option<Arc<str>>,
    /// The client key the policy derived (its IPv6 prefix, its composite); `None` without a
    /// check.
    pub key: Option<Key>,
    /// The cost checked; 0 without a check.
    pub cost: u64,
    /// What happened, as the metrics count it ([`Outcome::Passed`] when no policy applies).
    pub outcome: Outcome,
    /// The backend's decision; `None` without a check, or when the backend failed.
    pub decision: Option<crate::Decision>,
    /// How long the request waited for its slot (delay mode); zero otherwise.
    pub waited: std::time::Duration,
    /// Whether the request reaches the inner service: a shadow denial does; a denial, and a
    /// request a fallback rejects, does not.
    pub passes: bool,
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S`.
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// use tollgate::tower::RateLimit;
/// use tower_layer::Layer;
/// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
/// // The service type users name when they store the wrapped service.
/// let service: RateLimit<()> = layer.layer(());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What to do with a request, decided before any await.
enum Plan {
    /// Pass it on, uncounted.
    Pass,
    /// Policy `policy` applies but the request is answered unchecked: it has no client key
    /// (`outcome` `NoKey`), or its key is too long and refused (`KeyTooLong`); `fallback`
    /// decides.
    Unchecked {
        policy: usize,
        outcome: Outcome,
        fallback: Fallback,
    },
    /// Check `cost` for `key` against policy `policy`.
    Check { policy: usize, key: Key, cost: u64 },
}

impl Shared {
    fn plan(&self, parts: &Parts) -> Plan {
        let last = self.policies.len();
        let path = path::normalized_path(parts.uri.path());
        let index = match (self.policies.iter()).position(|p| p.matches(&parts.method, &path)) {
            Some(i) if !(self.has_default && i + 1 == last) => i,
            _ if self.has_default => last - 1,
            _ => return Plan::Pass,
        };
        let policy = &self.policies[index];
        let peer = match &self.peer {
            Some(peer) => peer(parts),
            None => peer_addr(parts),
        };
        let mut addrs = Addrs::new(&self.addrs).with_peer(peer);
        if !self.allow_cidrs.is_empty() {
            if let Some(ip) = addrs.client(parts) {
                if self.allow_cidrs.iter().any(|net| net.contains(ip)) {
                    return Plan::Pass;
                }
            }
        }
        if self.allow_if.as_ref().is_some_and(|allow| allow(parts)) {
            return Plan::Pass;
        }
        let Some(mut key) = policy.key.extract(parts, &path, &mut addrs) else {
            stats::record(policy, Outcome::NoKey);
            stats::trace_no_key(policy);
            return Plan::Unchecked {
                policy: index,
                outcome: Outcome::NoKey,
                fallback: policy.on_missing_key.unwrap_or(self.on_missing_key),
            };
        };
        if key.longest_part() > self.max_key_len {
            match self.on_long_key {
                LongKey::Digest => key = key.digested(self.max_key_len),
                LongKey::Reject(status) => {
                    stats::record(policy, Outcome::KeyTooLong);
                    return Plan::Unchecked {
                        policy: index,
                        outcome: Outcome::KeyTooLong,
                        fallback: Fallback::Reject(status),
                    };
                }
            }
        }
        Plan::Check {
            policy: index,
            key,
            cost: policy.cost.of(parts),
        }
    }

    /// The fallback answer `status` to a request.
    fn reject<B>(
        &self,
        status: StatusCode,
        detail: &str,
        grpc: bool,
    ) -> Response<RateLimitBody<B>> {
        if grpc {
            grpc_response(grpc_code(status), detail)
        } else {
            problem_response(status, problem(status, detail, None))
        }
    }

    /// The answer to a request `policy` refused with `verdict`.
    fn deny<B>(
        &self,
        policy: &Policy,
        verdict: &Verdict,
        grpc: bool,
    ) -> Response<RateLimitBody<B>> {
        let secs = retry_after_secs(&verdict.decision);
        let mut response = match &self.deny_with {
            Some(f) => f(&Denial {
                policy: policy.name(),
                decision: &verdict.decision,
                retry_after_secs: secs,
                grpc,
            })
            .map(RateLimitBody::full),
            None => {
                if grpc {
                    let detail = response::denial_detail(policy.name(), secs);
                    grpc_response(GRPC_RESOURCE_EXHAUSTED, &detail)
                } else {
                    let body = response::denial_problem(policy.name(), secs);
                    problem_response(StatusCode::TOO_MANY_REQUESTS, body)
                }
            }
        };
        set_retry_after(response.headers_mut(), secs);
        response::never_cached(response.headers_mut());
        add_headers(response.headers_mut(), self.headers, policy, verdict);
        response
    }
}

/// The policy's verdict on `key`, and how long the request waited for it: one check, or in
/// delay mode the decision that admits the request within `max_wait` (else a refusal).
///
/// Delay mode checks first (most requests pass at once, and a refusal says how long the wait
/// would be, charging nothing). A refusal within `max_wait` takes a place in the queue where
/// the backend keeps one ([`CheckBackend::reserve`]: GCRA, the leaky queue), so waiters are
/// served first come, first served and charged once; a backend without reservations sleeps for
/// the refusal's `retry_after` and checks again.
async fn decide(
    policy: &Policy,
    key: &Key,
    cost: u64,
) -> Result<(Verdict, std::time::Duration), CheckError> {
    let verdict = policy.backend.check(key, cost).await?;
    #[cfg(feature = "tokio")]
    if let Mode::Delay { max_wait } = policy.mode {
        return delay(policy, key, cost, max_wait, verdict).await;
    }
    Ok((verdict, std::time::Duration::ZERO))
}

/// Delay mode after the first check's `verdict` (see [`decide`]).
#[cfg(feature = "tokio")]
async fn delay(
    policy: &Policy,
    key: &Key,
    cost: u64,
    max_wait: std::time::Duration,
    mut verdict: Verdict,
) -> Result<(Verdict, std::time::Duration), CheckError> {
    let start = tokio::time::Instant::now();
    // A bound too far away to represent is no bound.
    let deadline = start.checked_add(max_wait);
    // (`checked_add`: an instant past the clock's range is past any deadline.)
    let too_long = |wait: std::time::Duration| {
        let wake = tokio::time::Instant::now().checked_add(wait);
        deadline.is_some_and(|d| wake.is_none_or(|wake| wake > d))
    };
    // Zero unless the request slept: only then was it delayed.
    let waited = |slept: bool| {
        if slept {
            start.elapsed()
        } else {
            std::time::Duration::ZERO
        }
    };
    let mut slept = false;
    // A place among the policy's waiters, taken before the first sleep.
    let mut place = None;
    let mut room = || {
        place.is_some() || {
            place = policy.waiters.enter(key);
            place.is_some()
        }
    };
    loop {
        let decision = verdict.decision;
        if decision.allowed() {
            // A reservation: its slot is `delay` away. A client that hangs up before it gives
            // the slot back (where the backend can refund).
            let waits = !decision.delay().is_zero();
            if waits && (too_long(decision.delay()) || !room()) {
                // A queue deeper than `max_wait` (a leaky queue's check reserves), others took
                // the places up to the deadline since the check, or too many wait already:
                // give it back, refuse.
                policy.backend.refund_decided(key, cost, &decision);
                let decision = decision.too_late();
                return Ok((
                    Verdict {
                        decision,
                        ..verdict
                    },
                    waited(slept),
                ));
            }
            if waits {
                let mut guard = RefundOnDrop {
                    policy,
                    key,
                    cost,
                    decided: decision,
                    armed: policy.backend.can_refund(),
                };
                tokio::time::sleep(decision.delay()).await;
                guard.armed = false;
                slept = true;
            }
            return Ok((verdict, waited(slept)));
        }
        if too_long(retry(&verdict)) {
            return Ok((verdict, waited(slept)));
        }
        // Within reach: take a place in the queue where the backend keeps one.
        let refused = match policy.backend.reserve(key, cost).transpose()? {
            Some(reserved) if reserved.decision.allowed() => {
                verdict = reserved; // slept for (or given back) above
                continue;
            }
            // A rule that does not reserve refused again.
            Some(refused) => refused,
            None => verdict,
        };
        let wait = retry(&refused);
        if too_long(wait) || !room() {
            return Ok((refused, waited(slept)));
        }
        // Waiters that recheck spread their wake-ups (up to a quarter more, within the
        // deadline), so that those refused together do not all call the backend together.
        let spread = policy.waiters.spread(wait / 4);
        tokio::time::sleep(if too_long(wait + spread) {
            wait
        } else {
            wait + spread
        })
        .await;
        slept = true;
        verdict = policy.backend.check(key, cost).await?;
    }
}

/// How long a refusal says to wait, at least [`crate::wait::MIN_SLEEP`].
#[cfg(feature = "tokio")]
fn retry(verdict: &Verdict) -> std::time::Duration {
    verdict.decision.retry_after().max(crate::wait::MIN_SLEEP)
}

/// Gives a reservation back if the request waiting for it is dropped (delay mode).
#[cfg(feature = "tokio")]
struct RefundOnDrop<'a> {
    policy: &'a Policy,
    key: &'a Key,
    cost: u64,
    /// The reservation's decision: it names the state the units were charged to.
    decided: crate::Decision,
    armed: bool,
}

#[cfg(feature = "tokio")]
impl Drop for RefundOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            (self.policy.backend).refund_decided(self.key, self.cost, &self.decided);
        }
    }
}

/// The detail of the answer to a request without a client key.
const NO_KEY_DETAIL: &str = "The request carries no client key for rate limiting.";
const LONG_KEY_DETAIL: &str = "The request's client key for rate limiting is too long.";

/// What `decided` means for a request of `policy`.
fn outcome(
    policy: &Policy,
    decided: &Result<(Verdict, std::time::Duration), CheckError>,
) -> Outcome {
    match decided {
        Err(CheckError::Limit(Error::KeyTableFull { .. })) => Outcome::TableFull,
        Err(_) => Outcome::Error,
        Ok((verdict, waited)) => match (verdict.decision.allowed(), policy.mode) {
            (true, _) if waited.is_zero() => Outcome::Allowed,
            (true, _) => Outcome::Delayed,
            (false, Mode::Shadow) => Outcome::ShadowDenied,
            (false, _) => Outcome::Denied,
        },
    }
}

/// Counts what `decided` means for a request of `policy` (feature `metrics`).
fn record_outcome(
    policy: &Policy,
    key: &Key,
    decided: &Result<(Verdict, std::time::Duration), CheckError>,
) {
    stats::trace(policy, key, decided);
    let outcome = outcome(policy, decided);
    if let (Outcome::Delayed, Ok((_, waited))) = (outcome, decided) {
        stats::record_wait(policy, *waited);
    }
    stats::record(policy, outcome);
}

type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

/// What an admitted request's response still needs once the inner service answered: the
/// headers, and a refund by status.
struct Admitted {
    shared: Arc<Shared>,
    policy: usize,
    key: Key,
    cost: u64,
    verdict: Verdict,
}

impl Admitted {
    /// The inner service's `response`, with what `admitted` adds to it (nothing for `None`).
    fn finish<B>(admitted: Option<Admitted>, response: Response<B>) -> Response<RateLimitBody<B>> {
        let mut response = response.map(RateLimitBody::inner);
        let Some(this) = admitted else {
            return response;
        };
        let policy = &this.shared.policies[this.policy];
        let mut verdict = this.verdict;
        if verdict.decision.allowed()
            && policy
                .refund
                .as_ref()
                .is_some_and(|refund| refund(response.status()))
        {
            // The headers then say what the client has once the units are back.
            let refunded = (policy.backend).refund_decided(&this.key, this.cost, &verdict.decision);
            if let Some(after) = refunded {
                verdict = after;
            }
            stats::record(policy, Outcome::Refunded);
        }
        add_headers(
            response.headers_mut(),
            this.shared.headers,
            policy,
            &verdict,
        );
        response
    }
}

/// What becomes of a checked request.
enum Next<B> {
    /// This answer, without calling the inner service (a denial, a rejection).
    Respond(Response<RateLimitBody<B>>),
    /// The inner service's answer, finished by `Admitted` when there is anything to add.
    Call(Option<Admitted>),
}

/// Counts what policy `index` `decided` for `key`, and what the request (with `headers`) gets
/// for it. Whether it is a gRPC request is read only when the layer answers it itself.
fn next<B>(
    shared: &Arc<Shared>,
    index: usize,
    key: Key,
    cost: u64,
    decided: Result<(Verdict, std::time::Duration), CheckError>,
    grpc: bool,
) -> Next<B> {
    let policy = &shared.policies[index];
    record_outcome(policy, &key, &decided);
    let verdict = match decided {
        Ok((verdict, _)) => verdict,
        Err(_) if policy.mode == Mode::Shadow => return Next::Call(None),
        Err(CheckError::Limit(Error::CapacityExceeded { cost, capacity })) => {
            let detail = format!(
                "Rate limit \"{}\": a cost of {cost} exceeds the capacity {capacity}; this request can never be admitted.",
                policy.name()
            );
            return Next::Respond(if grpc {
                grpc_response(GRPC_RESOURCE_EXHAUSTED, &detail)
            } else {
                let status = StatusCode::TOO_MANY_REQUESTS;
                problem_response(status, problem(status, &detail, None))
            });
        }
        Err(error) => {
            let (fallback, detail) = match error {
                CheckError::Limit(Error::KeyTableFull { .. }) => (
                    shared.on_table_full,
                    "The rate limiter holds as many clients as it may; try again later.",
                ),
                _ => (
                    shared.on_error,
                    "The rate limiter could not decide this request.",
                ),
            };
            return match fallback {
                Fallback::Allow => Next::Call(None),
                Fallback::Reject(status) => Next::Respond(shared.reject(status, detail, grpc)),
            };
        }
    };
    if !verdict.decision.allowed() && policy.mode != Mode::Shadow {
        return Next::Respond(shared.deny(policy, &verdict, grpc));
    }
    if shared.headers == HeaderStyle::None && policy.refund.is_none() {
        // Nothing to add to the response: it passes as it is.
        return Next::Call(None);
    }
    Next::Call(Some(Admitted {
        shared: Arc::clone(shared),
        policy: index,
        key,
        cost,
        verdict,
    }))
}

pin_project_lite::pin_project! {
    /// The future of [`RateLimit`]'s responses: no allocation when the policy's backend decides
    /// at once ([`CheckBackend::check_now`]: the in-process limiters); a boxed future when it
    /// must wait (a network backend, delay mode).
    ///
    /// # Examples
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let mut app = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     .build()?
    ///     .layer(Router::new().route("/", get(|| async { "ok" })));
    /// let mut statuses = Vec::new();
    /// for _ in 0..2 {
    ///     let mut request = Request::get("/").body(Body::empty())?;
    ///     request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
    ///     std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx)).await?;
    ///     let future: tollgate::tower::ResponseFuture<_, _, _> = app.call(request);
    ///     statuses.push(future.await?.status());
    /// }
    /// // One an hour: the second is refused.
    /// assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        stage: Stage<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = StageProj]
    enum Stage<F, B, E> {
        /// Answered without the inner service.
        Ready { response: Option<Response<RateLimitBody<B>>> },
        /// The inner service's future, and what its response still needs.
        Inner {
            #[pin]
            future: F,
            admitted: Option<Admitted>,
        },
        /// A decision that waits, and then the inner service.
        Boxed { future: BoxedResponse<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn stage(stage: Stage<F, B, E>) -> Self {
        ResponseFuture { stage }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().stage.project() {
            StageProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completion: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
            StageProj::Inner { future, admitted } => {
                let response = std::task::ready!(future.poll(cx))?;
                Poll::Ready(Ok(Admitted::finish(admitted.take(), response)))
            }
            StageProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqBody: Send + 'static,
    ResBody: 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let plan = self.shared.plan(&parts);
        let request = Request::from_parts(parts, body);
        let (index, key, cost) = match plan {
            Plan::Pass => {
                return ResponseFuture::stage(Stage::Inner {
                    future: self.inner.call(request),
                    admitted: None,
                })
            }
            Plan::Unchecked {
                outcome, fallback, ..
            } => {
                return ResponseFuture::stage(match fallback {
                    Fallback::Allow => Stage::Inner {
                        future: self.inner.call(request),
                        admitted: None,
                    },
                    Fallback::Reject(status) => Stage::Ready {
                        response: Some(self.shared.reject(
                            status,
                            if outcome == Outcome::KeyTooLong {
                                LONG_KEY_DETAIL
                            } else {
                                NO_KEY_DETAIL
                            },
                            is_grpc(request.method(), request.headers()),
                        )),
                    },
                })
            }
            Plan::Check { policy, key, cost } => (policy, key, cost),
        };
        let policy = &self.shared.policies[index];
        // Delay mode may sleep: it always takes the boxed path.
        let decided = match policy.mode {
            #[cfg(feature = "tokio")]
            Mode::Delay { .. } => None,
            _ => policy.backend.check_now(&key, cost),
        };
        if let Some(decided) = decided {
            let decided = decided.map(|verdict| (verdict, std::time::Duration::ZERO));
            return ResponseFuture::stage(
                match next(
                    &self.shared,
                    index,
                    key,
                    cost,
                    decided,
                    is_grpc(request.method(), request.headers()),
                ) {
                    Next::Respond(response) => Stage::Ready {
                        response: Some(response),
                    },
                    Next::Call(admitted) => Stage::Inner {
                        future: self.inner.call(request),
                        admitted,
                    },
                },
            );
        }
        // The inner service is called later, from the future: the one polled ready goes with
        // it, and a fresh clone stays behind (called at once above, it needs no clone: an
        // axum route's clone is an allocation).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let future = Box::pin(async move {
            let decided = decide(&shared.policies[index], &key, cost).await;
            // (Bound before the await: a `Next` holds a response body, which need not be `Send`.)
            let admitted = match next(
                &shared,
                index,
                key,
                cost,
                decided,
                is_grpc(request.method(), request.headers()),
            ) {
                Next::Respond(response) => return Ok(response),
                Next::Call(admitted) => admitted,
            };
            let response = inner.call(request).await?;
            Ok(Admitted::finish(admitted, response))
        });
        ResponseFuture::stage(Stage::Boxed { future })
    }
}
