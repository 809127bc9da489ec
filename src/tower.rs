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

mod addr;
mod backend;
mod builder;
mod cidr;
#[cfg(feature = "serde")]
pub mod config;
mod delay;
mod key;
mod path;
mod policy;
#[cfg(feature = "redis")]
mod redis_backend;
mod response;
mod service;
mod stats;
mod tiers;
#[cfg(feature = "tokio")]
mod waiters;

pub use self::addr::ProxyHeader;
pub use self::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo, Verdict};
pub use self::builder::RateLimitLayerBuilder;
use self::builder::DEFAULT_MAX_KEY_LEN;
pub use self::cidr::{Cidr, CidrError};
pub use self::key::{Key, KeySource, LongKey};
pub use self::path::normalized_path;
pub use self::policy::{Cost, Mode, Policy};
#[cfg(feature = "redis")]
pub use self::redis_backend::{redis_key, RedisBackend};
pub use self::response::{Denial, HeaderStyle, RateLimitBody};
use self::service::{next, outcome, Next, Plan};
pub use self::service::{RateLimit, ResponseFuture};
pub use self::stats::Outcome;
pub use self::tiers::{Tiers, TiersBuilder, UnknownTier};

use self::addr::{peer_addr, AddrConfig, Addrs};
use self::delay::policy_verdict;
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
        let decided = policy_verdict(policy, &key, cost).await;
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
