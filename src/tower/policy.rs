//! Policies: which requests a limit applies to, the key and cost it counts, and its mode.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{Method, StatusCode};

use super::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo};
use super::cost::Cost;
use super::key::{Key, KeySource};
use super::path::PathMatch;
use super::tiers::Tiers;
use crate::limiter::{Algorithm, InFlight};
use crate::{Gcra, KeyedLimiter, Quota, QuotaError};

/// What a policy does with a request its limit refuses.
///
/// # Examples
/// ```
/// use tollgate::tower::Mode;
/// assert_eq!(Mode::default(), Mode::Enforce);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Refuse it (429, or the gRPC status).
    #[default]
    Enforce,
    /// Dry run: decide and count as `Enforce` does, send the rate-limit headers, but pass
    /// every request on. This is how a new limit is tried in production.
    Shadow,
    /// Shaping (feature `tokio`): wait for the slot, then pass the request on; refuse it as
    /// `Enforce` does when admission would take longer than `max_wait` from its arrival (at
    /// most 60 s), or when the policy has as many waiting as [`Policy::max_waiters`] allows.
    ///
    /// A refused check changes nothing, so a waiting request is charged once, when admitted,
    /// and a client that hangs up while it waits has cost nothing. Waiters re-check at their
    /// `retry_after`: they are not served in arrival order (several may wake for one unit;
    /// the others wait again within their `max_wait`). A leaky-queue policy's admitted
    /// delay ([`Decision::delay`](crate::Decision::delay)) is waited in full (the queue's
    /// capacity bounds it), in arrival order; a request dropped before its slot gives the
    /// slot back when the backend can refund (the in-process limiters can). The waits use
    /// tokio's timer: serve the layer on a tokio runtime with time enabled (axum and
    /// hyper-util servers on tokio have it).
    #[cfg(feature = "tokio")]
    Delay {
        /// The longest a request may wait.
        max_wait: std::time::Duration,
    },
}

/// The longest `max_wait` a delay-mode policy accepts: a request held longer is better
/// refused, and the bound keeps every deadline within the clock's range.
#[cfg(feature = "tokio")]
pub(crate) const MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

/// The default bounds on a delay-mode policy's waiters (see [`Policy::max_waiters`]).
#[cfg(feature = "tokio")]
const DEFAULT_MAX_WAITERS: usize = 1024;
#[cfg(feature = "tokio")]
const DEFAULT_MAX_WAITERS_PER_KEY: usize = 16;

/// Whose requests a policy's in-flight bound counts ([`Policy::in_flight_scope`]).
///
/// # Examples
/// ```
/// use tollgate::tower::InFlightScope;
/// assert_eq!(InFlightScope::default(), InFlightScope::Key);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
#[non_exhaustive]
pub enum InFlightScope {
    /// Each client key has its own bound (the default): nginx's `limit_conn` per client.
    #[default]
    Key,
    /// The policy's requests share one bound, whatever their key: a cap on what an endpoint
    /// runs at once.
    Policy,
}

type RefundFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// One limit and the requests it applies to.
///
/// A policy matches a request by path (a prefix of whole segments, or a pattern, of the path
/// the client sent: [`client_path`](super::client_path)) and method;
/// the layer applies the first policy that matches, else its default policy, else no limit.
/// It counts each request under its [`KeySource`]'s key (default: the client IP), at its
/// [`Cost`] (default 1), in its [`Mode`] (default enforce).
///
/// # Examples
/// ```
/// use http::{Method, StatusCode};
/// use tollgate::tower::{Key, KeySource, Mode, Policy};
/// use tollgate::{Gcra, KeyedLimiter, MultiLimiter, Quota};
///
/// // Per client IP, 10/s with bursts of 20, on /api/.
/// let api = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?.with_burst(20)?)?))
///     .path_prefix("/api/");
/// // Exports cost 5; both 10/s and 1000/h, all or nothing, per API key.
/// let export = Policy::new(
///     "export",
///     MultiLimiter::<Key, _>::new([Gcra::new(Quota::per_second(10)?)?, Gcra::new(Quota::per_hour(1000)?)?]),
/// )
/// .path_pattern("/api/*/export")
/// .methods([Method::POST])
/// .key(KeySource::header(http::HeaderName::from_static("x-api-key")))
/// .cost(5)
/// .mode(Mode::Shadow);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone)]
pub struct Policy {
    pub(crate) name: Arc<str>,
    path: PathMatch,
    methods: Option<Vec<Method>>,
    /// Whether HEAD matches where GET does.
    head_as_get: bool,
    pub(crate) backend: Arc<dyn CheckBackend>,
    pub(crate) key: KeySource,
    pub(crate) cost: Cost,
    pub(crate) mode: Mode,
    /// What a request without a key gets, if not the layer's setting.
    pub(crate) on_missing_key: Option<super::answers::Fallback>,
    /// The requests waiting in delay mode, and their bounds.
    #[cfg(feature = "tokio")]
    pub(crate) waiters: Arc<super::waiters::Waiters>,
    pub(crate) refund: Option<Arc<RefundFn>>,
    /// At most this many requests in flight per client key ([`Policy::max_in_flight`]): the
    /// bound as given, and its limit (`None` if the bound is not valid: the builder says so).
    pub(crate) in_flight: Option<(u64, Option<Arc<InFlight<Key>>>)>,
    /// The answer to a request over the in-flight bound.
    pub(crate) in_flight_status: StatusCode,
    /// The key the bound counts under [`InFlightScope::Policy`] (every request's).
    pub(crate) in_flight_key: Option<Key>,
    /// The backend, when it is [`Tiers`]: a handle to move keys between tiers.
    pub(crate) tiers: Option<Tiers>,
    /// The last `RateLimit-Policy` value and the quotas it was built from.
    pub(crate) policy_header: Arc<PolicyHeaderCache>,
    /// This policy's metric keys, built once (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) metric_keys: Arc<super::outcome::MetricKeys>,
    /// What the rule of a shortcut ([`Policy::gcra`]) refused: the layer's builder reports it,
    /// so that building a policy needs no `?` of its own.
    pub(crate) quota_error: Option<QuotaError>,
    /// Whether the policy checks a rate: `false` for an in-flight bound alone
    /// ([`Policy::in_flight`]), whose requests the layer never takes to the backend, and so
    /// answers without rate-limit fields.
    pub(crate) rate: bool,
}

/// The backend of a policy that has no rate to check (an in-flight bound alone, or a rule that
/// was refused): the layer never asks it, and it has no quota to show.
struct NoRate;

impl CheckBackend for NoRate {
    fn check<'a>(&'a self, _key: &'a Key, _cost: u64) -> CheckFuture<'a> {
        CheckFuture::ready(Err(CheckError::Backend(
            "this policy has no rate limit to check".into(),
        )))
    }

    fn quota_count(&self) -> usize {
        0
    }

    fn quota(&self, _index: usize) -> Option<QuotaInfo> {
        None
    }
}

/// The `RateLimit-Policy` field of a policy: the same on every response while its quotas stay
/// the same, so it is built once and reused (checked against the backend's quotas on each
/// use: a quota changed at run time rebuilds it).
///
/// A sharded lock: every response reads it, and a reader locks only its own thread's shard,
/// so the workers of a server never write one shared lock word (a plain read-write lock's
/// reader count is written by every reader).
#[derive(Debug, Default)]
pub(crate) struct PolicyHeaderCache {
    pub(crate) value:
        crossbeam_utils::sync::ShardedLock<Option<(Vec<QuotaInfo>, http::HeaderValue)>>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("methods", &self.methods)
            .field("head_as_get", &self.head_as_get)
            .field("key", &self.key)
            .field("cost", &self.cost)
            .field("mode", &self.mode)
            .field("refunds", &self.refund.is_some())
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// A policy named `name` (shown in the headers and the 429 body; printable ASCII) checking
    /// `backend`, matching every request, keyed by client IP, cost 1, enforced.
    ///
    /// To put a policy on another backend (say, a global one), change this argument only.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let policy = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?));
    /// assert_eq!(policy.name(), "api");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(name: impl Into<String>, backend: impl CheckBackend) -> Self {
        let tiers = (&backend as &dyn std::any::Any)
            .downcast_ref::<Tiers>()
            .cloned();
        let name: Arc<str> = name.into().into();
        Policy {
            tiers,
            policy_header: Arc::default(),
            #[cfg(feature = "metrics")]
            metric_keys: Arc::new(super::outcome::MetricKeys::new(&name)),
            name,
            path: PathMatch::Any,
            methods: None,
            head_as_get: true,
            backend: Arc::new(backend),
            key: KeySource::client_ip(),
            cost: Cost::Fixed(1),
            mode: Mode::Enforce,
            on_missing_key: None,
            #[cfg(feature = "tokio")]
            waiters: Arc::new(super::waiters::Waiters::new(
                DEFAULT_MAX_WAITERS,
                DEFAULT_MAX_WAITERS_PER_KEY,
            )),
            refund: None,
            in_flight: None,
            in_flight_status: StatusCode::TOO_MANY_REQUESTS,
            in_flight_key: None,
            quota_error: None,
            rate: true,
        }
    }

    /// A policy named `name` with no rate at all: at most `max` of its requests in flight at
    /// once per client key ([`Policy::max_in_flight`]; [`Policy::in_flight_scope`] makes it
    /// one bound for all of them), and nothing else. A request over it is refused at once
    /// (429, or [`Policy::in_flight_status`]); the others pass, each holding its place until
    /// its response body ends or is dropped. With no rate there is no quota to show: its
    /// responses carry no `RateLimit-Policy`, `RateLimit` or `X-RateLimit-*` field, whatever
    /// the layer's [`HeaderStyle`](super::HeaderStyle), and no `Retry-After` (no wait is
    /// known to free a place). [`Mode::Shadow`] counts a request over the bound and lets it
    /// through; delay mode and [`Policy::refund_when`], which work on a rate, are refused by
    /// the layer's builder.
    ///
    /// # Examples
    /// ```
    /// use tollgate::prelude::*;
    /// // Each client runs at most 2 exports at once, as often as it likes.
    /// let exports = Policy::in_flight("exports", 2).path_prefix("/export");
    /// assert_eq!(exports.backend().quota_count(), 0); // no rate: no quota in any header
    /// assert!(RateLimitLayer::builder().policy(exports).headers(HeaderStyle::Both).build().is_ok());
    /// // A bound of 0 is refused when the layer is built.
    /// assert!(RateLimitLayer::builder().policy(Policy::in_flight("none", 0)).build().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight(name: impl Into<String>, max: u64) -> Self {
        Policy {
            rate: false,
            ..Policy::new(name, NoRate)
        }
        .max_in_flight(max)
    }

    /// A policy named `name` limiting each client key by GCRA (the token bucket) to `quota`:
    /// `L` a window with bursts of up to the quota's burst (`L` unless
    /// [`Quota::with_burst`] says otherwise), on an in-process [`KeyedLimiter`] of [`Key`]s.
    /// The same policy as `Policy::new(name, KeyedLimiter::<Key, _>::new(Gcra::new(quota)?))`,
    /// whatever [`KeySource`] it is then given: the key type is the layer's. A quota GCRA
    /// refuses is reported by
    /// [`RateLimitLayerBuilder::build`](super::RateLimitLayerBuilder::build) as
    /// [`ConfigError::Quota`](super::ConfigError::Quota), naming the policy.
    ///
    /// # Examples
    /// ```
    /// use tollgate::prelude::*;
    /// // Five login attempts a minute per client IP.
    /// let login = Policy::gcra("login", Quota::per_minute(5)?).path_prefix("/login");
    /// // 100 a minute, bursts of 20, per API key.
    /// let partners = Policy::gcra("partners", Quota::per_minute(100)?.with_burst(20)?)
    ///     .key(KeySource::header(http::HeaderName::from_static("x-api-key")));
    /// let layer = RateLimitLayer::builder().policy(login).policy(partners).build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gcra(name: impl Into<String>, quota: Quota) -> Self {
        match Gcra::new(quota) {
            Ok(rule) => Policy::keyed(name, rule),
            Err(error) => Policy {
                quota_error: Some(error),
                ..Policy::new(name, NoRate)
            },
        }
    }

    /// A policy named `name` limiting each client key by `rule` (any algorithm: a
    /// [`FixedWindow`](crate::FixedWindow), a [`SlidingLog`](crate::SlidingLog), …) on an
    /// in-process [`KeyedLimiter`] of [`Key`]s: `Policy::new(name, KeyedLimiter::<Key,
    /// _>::new(rule))` without naming the key type.
    ///
    /// # Examples
    /// ```
    /// use tollgate::prelude::*;
    /// // At most 1000 an hour per client, in windows that reset on the hour.
    /// let hourly = Policy::keyed("hourly", FixedWindow::new(Quota::per_hour(1000)?)?);
    /// assert!(RateLimitLayer::builder().policy(hourly).build().is_ok());
    /// // `Policy::gcra` leaves a refused quota to the builder, which names the policy.
    /// let absurd = Quota::new(2, std::time::Duration::from_nanos(1))?; // two a nanosecond
    /// let refused = RateLimitLayer::builder().policy(Policy::gcra("absurd", absurd)).build();
    /// assert!(matches!(refused, Err(ConfigError::Quota { policy, .. }) if policy == "absurd"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyed<A: Algorithm>(name: impl Into<String>, rule: A) -> Self {
        Policy::new(name, KeyedLimiter::<Key, A>::new(rule))
    }

    /// At most `max` requests of this policy in flight at once per client key (as nginx's
    /// `limit_conn`), on top of the rate: a request over it is refused at once with
    /// [`Policy::in_flight_status`] (default 429) and a problem+json body, and counted as
    /// [`Outcome::InFlight`](super::Outcome::InFlight). An admitted request holds its place
    /// until its response body ends or is dropped (a client that hangs up frees it). A request
    /// the rate refuses takes no place; a [`Mode::Shadow`] policy counts a request over the
    /// bound and lets it through. [`RateLimitLayer::evaluate_held`](super::RateLimitLayer::evaluate_held)
    /// hands the place to its caller (`tollgate replay --config` holds it for the line's
    /// duration, `t_ms+duration_ms`). For a bound with no rate, [`Policy::in_flight`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let uploads = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(60)?)?);
    /// // 60 a minute, and at most 2 running at once, per client.
    /// let policy = Policy::new("uploads", uploads).path_prefix("/upload").max_in_flight(2);
    /// assert!(RateLimitLayer::builder().policy(policy).build().is_ok());
    /// // A bound of 0 is refused when the layer is built.
    /// let none = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(60)?)?);
    /// let zero = Policy::new("none", none).max_in_flight(0);
    /// assert!(RateLimitLayer::builder().policy(zero).build().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_in_flight(mut self, max: u64) -> Self {
        self.in_flight = Some((max, InFlight::new(max).ok().map(Arc::new)));
        self
    }

    /// The status a request over [`Policy::max_in_flight`] gets: 429 (the default), or 503
    /// for servers that say "busy" rather than "too many".
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let searches = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(5)?)?);
    /// let policy = Policy::new("search", searches)
    ///     .max_in_flight(4)
    ///     .in_flight_status(StatusCode::SERVICE_UNAVAILABLE);
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight_status(mut self, status: StatusCode) -> Self {
        self.in_flight_status = status;
        self
    }

    /// Whose requests [`Policy::max_in_flight`] counts: each client key's (the default), or
    /// the whole policy's.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{InFlightScope, Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let reports = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10)?)?);
    /// // At most 8 report builds running at once on this server, whoever asks.
    /// let policy = Policy::new("reports", reports)
    ///     .max_in_flight(8)
    ///     .in_flight_scope(InFlightScope::Policy);
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_flight_scope(mut self, scope: InFlightScope) -> Self {
        self.in_flight_key = match scope {
            InFlightScope::Key => None,
            InFlightScope::Policy => Some(Key::from("")),
        };
        self
    }

    /// The policy's in-flight limit, if it has one.
    pub(crate) fn in_flight_limit(&self) -> Option<&Arc<InFlight<Key>>> {
        self.in_flight
            .as_ref()
            .and_then(|(_, limit)| limit.as_ref())
    }

    /// Why the policy's in-flight settings are refused, if they are.
    pub(crate) fn in_flight_problem(&self) -> Option<String> {
        if let Some((max, None)) = self.in_flight {
            // The limiter's own reason: zero, or above the largest bound a count holds.
            return Some(match InFlight::<Key>::new(max) {
                Err(error) => format!("max_in_flight {max}: {error}"),
                Ok(_) => format!("max_in_flight {max} refused"),
            });
        }
        if !self.rate {
            #[cfg(feature = "tokio")]
            if matches!(self.mode, Mode::Delay { .. }) {
                return Some(
                    "delay mode waits for a rate's slot; an in-flight bound alone has none"
                        .to_owned(),
                );
            }
            if self.refund.is_some() {
                return Some(
                    "refunds by status give a rate's units back; an in-flight bound alone has none"
                        .to_owned(),
                );
            }
        }
        let status = self.in_flight_status;
        (!(status.is_client_error() || status.is_server_error()))
            .then(|| format!("in_flight_status {status} must be a 4xx or 5xx status"))
    }

    /// Matches paths starting with `prefix` in whole segments: `/api` covers `/api`, `/api/`
    /// and `/api/users`, not `/apis`; `/api/` covers `/api/` and below, not `/api`.
    ///
    /// The path is the one the client sent, normalised ([`client_path`](super::client_path)),
    /// wherever the layer sits: under axum's `Router::nest("/api", api)`, a policy on
    /// `/api/login` covers `POST /api/login` whether the layer is on the outer router, on
    /// `api` (`.layer`, `.route_layer`, or inside a `tower::ServiceBuilder`), although the
    /// nested routes see `/login` (feature `axum`: the layer reads axum's `OriginalUri`). So a
    /// policy never names a path relative to a nest, and a configuration shared with
    /// `tollgate replay --config` means the paths of the trace.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // `/v1/users` and `/v1`, not `/v1beta`.
    /// let policy = Policy::new("v1", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).path_prefix("/v1");
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    /// The same policy on a nested router still names the full path:
    /// ```
    /// # #[cfg(feature = "axum")] {
    /// use axum::{routing::post, Router};
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let login = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(2).unwrap()).unwrap());
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("login", login).path_prefix("/api/login")) // not "/login"
    ///     .build()
    ///     .unwrap();
    /// let api: Router = Router::new().route("/login", post(|| async { "welcome" }));
    /// let app: Router = Router::new().nest("/api", api.route_layer(layer));
    /// # let _ = app;
    /// # }
    /// ```
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.path = PathMatch::Prefix(prefix.into());
        self
    }

    /// Matches paths segment by segment: `*` stands for any one segment and a final `**` for
    /// any rest, e.g. `/users/*/posts` or `/static/**`. The path is the one the client sent,
    /// wherever the layer sits, as for [`path_prefix`](Self::path_prefix).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // `/users/7/posts`, not `/users/7/posts/1` nor `/users/posts`.
    /// let posts = Policy::new("posts", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).path_pattern("/users/*/posts");
    /// // `/static`, `/static/app.js`, `/static/img/logo.svg`.
    /// let assets = Policy::new("assets", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).path_pattern("/static/**");
    /// # let _ = (posts, assets);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn path_pattern(mut self, pattern: &str) -> Self {
        self.path = PathMatch::Pattern(pattern.split('/').map(str::to_owned).collect());
        self
    }

    /// Matches only these methods (default: every method). HEAD matches where GET does (a
    /// server answers HEAD with its GET handler, as axum does), unless
    /// [`head_as_get`](Self::head_as_get) is off.
    ///
    /// # Examples
    /// ```
    /// use http::Method;
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Writes only: reads of the same paths are not limited by this policy.
    /// let writes = Policy::new("writes", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .methods([Method::POST, Method::PUT, Method::PATCH, Method::DELETE]);
    /// # let _ = writes;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// Whether a HEAD request matches a policy whose [`methods`](Self::methods) list GET
    /// (default `true`: HEAD runs the GET handler, so leaving it out would let a client run
    /// that handler unlimited). Turn it off only if HEAD is served without that work.
    ///
    /// # Examples
    /// ```
    /// use http::Method;
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Reads, HEAD included; `.head_as_get(false)` would leave HEAD unlimited.
    /// let reads = Policy::new("reads", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .methods([Method::GET]);
    /// # let _ = reads;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn head_as_get(mut self, on: bool) -> Self {
        self.head_as_get = on;
        self
    }

    /// Counts requests under this key (default [`KeySource::client_ip`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // One budget per customer: the API key header.
    /// let policy = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .key(KeySource::header(http::HeaderName::from_static("x-api-key")));
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn key(mut self, key: KeySource) -> Self {
        self.key = key;
        self
    }

    /// Every request costs `cost` units (default 1). A cost of 0 is always admitted; a cost
    /// above the quota's capacity never is (a 429 without `Retry-After`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // An export weighs as much as 10 ordinary calls: 10 per second, or 1 export.
    /// let export = Policy::new("export", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).path_prefix("/export").cost(10);
    /// # let _ = export;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// Each request costs what `f` computes from its head.
    ///
    /// # Examples
    /// ```
    /// use http::request::Parts;
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Uploads cost one unit per started MiB (at least 1), from `content-length`.
    /// fn mib(parts: &Parts) -> u64 {
    ///     let bytes = parts.headers.get(http::header::CONTENT_LENGTH)
    ///         .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    ///         .unwrap_or(0);
    ///     bytes.div_ceil(1 << 20).max(1)
    /// }
    /// let (parts, ()) = http::Request::post("/upload").header("content-length", "3000000").body(())?.into_parts();
    /// assert_eq!(mib(&parts), 3); // 2.86 MiB, three started
    /// let uploads = Policy::new("uploads", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(100)?)?))
    ///     .path_prefix("/upload")
    ///     .cost_fn(mib);
    /// # let _ = uploads;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost_fn(mut self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Cost::Fn(Arc::new(f));
        self
    }

    /// What happens to a request of this policy whose key cannot be extracted, instead of the
    /// layer's [`on_missing_key`](super::RateLimitLayerBuilder::on_missing_key) (whose default
    /// is 400 for a key the client did not send, 500 for a missing peer address): a policy
    /// keyed by an optional header may let requests without it pass, while the layer's
    /// IP-keyed policies still refuse a request without a peer address.
    ///
    /// # Examples
    /// ```
    /// use http::HeaderName;
    /// use tollgate::tower::{Fallback, Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Signed-in users are limited by their API key; anonymous requests pass this policy.
    /// let users = Policy::new("users", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .key(KeySource::header(HeaderName::from_static("x-api-key")))
    ///     .on_missing_key(Fallback::Allow);
    /// # let _ = users;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn on_missing_key(mut self, fallback: super::answers::Fallback) -> Self {
        self.on_missing_key = Some(fallback);
        self
    }

    /// At most `total` requests of this policy wait in delay mode at once, and at most
    /// `per_key` of one key (defaults 1,024 and 16); a request beyond either is refused at
    /// once, as one that would wait past `max_wait` is. Each waiter holds its connection (and
    /// on the window, log and Redis backends wakes to check again), so a client sending
    /// faster than its rate must not fill the server with sleepers. Both must be at least 1.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::tower::{Key, Mode, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Uploads wait up to 2 s for their slot; at most 4 per client, 256 in all.
    /// let uploads = Policy::new("uploads", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(2)?)?))
    ///     .mode(Mode::Delay { max_wait: Duration::from_secs(2) })
    ///     .max_waiters(256, 4);
    /// # let _ = uploads;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    #[cfg(feature = "tokio")]
    pub fn max_waiters(mut self, total: usize, per_key: usize) -> Self {
        self.waiters = Arc::new(super::waiters::Waiters::new(total, per_key));
        self
    }

    /// Enforce (default), shadow, or delay (feature `tokio`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Mode, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Try a new, tighter limit in production: count and report, refuse nothing yet.
    /// let trial = Policy::new("trial", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).mode(Mode::Shadow);
    /// # let _ = trial;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Gives an admitted request's units back when `f` holds for its response status: do not
    /// charge failures (`|s| s.is_server_error()`), or charge only failures, as a login
    /// throttle does (`|s| s.is_success()`). The response's rate-limit fields still show the
    /// decision made before the request was served. The backend must be able to refund
    /// ([`CheckBackend::can_refund`]: the in-process limiters can), or the layer is refused.
    ///
    /// Mind which layer answers: the status is the one this layer sees from the service it
    /// wraps. A timeout or load-shedding layer inside it answers 503/504 exactly when the
    /// server is overloaded, and refunding those would weaken the limit under load. Refund
    /// only what the application itself answers (say, 500), or put such layers outside this
    /// one.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Five failed logins per client an hour; successful ones are not counted.
    /// let login = Policy::new("login", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(5)?)?))
    ///     .path_prefix("/login")
    ///     .refund_when(|status| status.is_success());
    /// # let _ = login;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn refund_when(mut self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.refund = Some(Arc::new(f));
        self
    }

    /// The policy's name.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // The name is what the `RateLimit` headers and the 429 body show.
    /// assert_eq!(Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?)).name(), "api");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend this policy checks.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{CheckBackend, Key, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let policy = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?));
    /// // The quota its `RateLimit-Policy` header shows.
    /// let quota = policy.backend().quota(0).unwrap();
    /// assert_eq!(quota.limit, 10);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn backend(&self) -> &Arc<dyn CheckBackend> {
        &self.backend
    }

    /// Whether the policy applies to a request of `method` on normalised `path`.
    pub(crate) fn matches(&self, method: &Method, path: &str) -> bool {
        self.methods.as_ref().is_none_or(|methods| {
            methods.contains(method)
                || (self.head_as_get && method == Method::HEAD && methods.contains(&Method::GET))
        }) && self.path.matches(path)
    }

    /// Why the policy's delay-mode settings are refused, if they are.
    pub(crate) fn delay_problem(&self) -> Option<String> {
        #[cfg(feature = "tokio")]
        {
            if let Mode::Delay { max_wait } = self.mode {
                if max_wait > MAX_DELAY {
                    return Some(format!("max_wait {max_wait:?} is over {MAX_DELAY:?}"));
                }
            }
            if self.waiters.max_total == 0 || self.waiters.max_per_key == 0 {
                return Some("max_waiters must allow at least 1 in all and per key".to_owned());
            }
        }
        None
    }

    /// Why the policy's path setting can never match a normalised path, if it cannot: it is
    /// empty, or does not start with `/`.
    pub(crate) fn path_problem(&self) -> Option<String> {
        let (what, text) = match &self.path {
            PathMatch::Any => return None,
            PathMatch::Prefix(prefix) => ("path prefix", prefix.clone()),
            PathMatch::Pattern(pattern) => ("path pattern", pattern.join("/")),
        };
        (!text.starts_with('/')).then(|| format!("{what} {text:?} must start with `/`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_goes_with_get_unless_turned_off() {
        use crate::{Gcra, KeyedLimiter, Quota};
        let policy = || {
            let limiter = KeyedLimiter::<super::super::Key, _>::new(
                Gcra::new(Quota::per_second(1).unwrap()).unwrap(),
            );
            Policy::new("p", limiter).methods([Method::GET])
        };
        assert!(policy().matches(&Method::HEAD, "/"));
        assert!(!policy().matches(&Method::POST, "/"));
        assert!(!policy().head_as_get(false).matches(&Method::HEAD, "/"));
        let posts = policy().methods([Method::POST]);
        assert!(!posts.matches(&Method::HEAD, "/"));
    }

    #[test]
    fn prefixes_match_whole_segments() {
        let p = PathMatch::Prefix("/api".into());
        for (path, want) in [
            ("/api", true),
            ("/api/", true),
            ("/api/x", true),
            ("/apix", false),
            ("/", false),
        ] {
            assert_eq!(p.matches(path), want, "{path}");
        }
        let p = PathMatch::Prefix("/api/".into());
        assert!(p.matches("/api/x"));
        assert!(p.matches("/api/"));
        assert!(!p.matches("/api"));
        assert!(PathMatch::Prefix("/".into()).matches("/anything"));
    }

    #[test]
    fn patterns_match_segments() {
        let pat = |s: &str| PathMatch::Pattern(s.split('/').map(str::to_owned).collect());
        let p = pat("/users/*/posts");
        assert!(p.matches("/users/7/posts"));
        assert!(!p.matches("/users/7/posts/1"));
        assert!(!p.matches("/users/posts"));
        assert!(!p.matches("/users//x"));
        let p = pat("/static/**");
        assert!(p.matches("/static"));
        assert!(p.matches("/static/a/b/c"));
        assert!(!p.matches("/stat"));
        assert!(pat("/").matches("/"));
        assert!(!pat("/").matches("/x"));
    }
}
