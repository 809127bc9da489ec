//! The layer's builder: policies, client addresses, allow-lists, headers, fallbacks and
//! bounds, checked once when the layer is built.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};

use super::addr::{AddrConfig, ProxyHeader};
use super::answers::{ConfigError, Fallback};
use super::backend::CheckBackend;
use super::cidr::Cidr;
use super::key::LongKey;
use super::layer::{DenyFn, PeerFn, Predicate, RateLimitLayer, Shared};
use super::path::{client_path, PathMatch};
use super::policy::Policy;
use super::response::{Denial, HeaderStyle};

/// The default bound on a key part's bytes: a few hundred, room for any address, API key or
/// route, and a bearer token up to a modest size.
pub(super) const DEFAULT_MAX_KEY_LEN: usize = 256;

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
    pub(super) policies: Vec<Policy>,
    pub(super) default: Option<Policy>,
    pub(super) addrs: AddrConfig,
    /// Where the peer's address comes from, if not from the request's extensions.
    pub(super) peer: Option<Arc<PeerFn>>,
    pub(super) allow_cidrs: Vec<Cidr>,
    pub(super) allow_if: Option<Arc<Predicate>>,
    /// Paths that bypass every policy (whole segments, matched on the client's path,
    /// normalised), checked when the layer is built.
    pub(super) allow_paths: Vec<String>,
    pub(super) headers: HeaderStyle,
    pub(super) on_missing_key: Option<Fallback>,
    pub(super) on_error: Fallback,
    pub(super) on_table_full: Fallback,
    pub(super) max_key_len: usize,
    pub(super) on_long_key: LongKey,
    pub(super) deny_with: Option<Arc<DenyFn>>,
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
    /// The predicate sees the request as the layer does: under axum's `Router::nest`, its
    /// `uri` lacks the nest's prefix; [`client_path`](super::client_path) is the path the
    /// client sent, normalised, as the policies match it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{client_path, Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     // Probes must never see a 429; compare the path the policies match.
    ///     .allow_if(|req| client_path(req) == "/health")
    ///     .build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_if(mut self, predicate: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.allow_if = Some(Arc::new(predicate));
        self
    }

    /// Requests for these paths bypass every policy: the builder's form of a configuration's
    /// `allow_paths`, with the same semantics. Each path covers whole segments (`/health`
    /// covers `/health` and `/health/live`, not `/healthz`) of the path the client sent,
    /// normalised ([`client_path`](super::client_path)), so `//health` is covered too and
    /// `/health/../api` is not. Calls add to the list; [`allow_if`](Self::allow_if) and
    /// [`allow_cidrs`](Self::allow_cidrs) allow requests besides these.
    ///
    /// # Errors
    /// [`build`](Self::build) refuses a path that does not start with `/`
    /// ([`ConfigError::AllowPath`]): it would match no request.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{ConfigError, Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     // Probes and metrics scrapes must never see a 429.
    ///     .allow_paths(["/health", "/metrics"])
    ///     .build()?;
    /// let bad = RateLimitLayer::builder().allow_paths(["health"]).build();
    /// assert_eq!(bad.err(), Some(ConfigError::AllowPath("health".into())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_paths(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allow_paths.extend(paths.into_iter().map(Into::into));
        self
    }

    /// The bypass predicate: the allow-listed paths, then `allow_if`.
    fn allow(
        paths: Vec<String>,
        allow_if: Option<Arc<Predicate>>,
    ) -> Result<Option<Arc<Predicate>>, ConfigError> {
        if let Some(path) = paths.iter().find(|p| !p.starts_with('/')) {
            return Err(ConfigError::AllowPath(path.clone()));
        }
        if paths.is_empty() {
            return Ok(allow_if);
        }
        let paths: Vec<PathMatch> = paths.into_iter().map(PathMatch::Prefix).collect();
        Ok(Some(Arc::new(move |parts: &Parts| {
            let path = client_path(parts);
            paths.iter().any(|p| p.matches(&path)) || allow_if.as_ref().is_some_and(|f| f(parts))
        })))
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

    /// What happens to a request whose key cannot be extracted, under a policy that does not
    /// set its own ([`Policy::on_missing_key`]), whatever the key is missing for.
    ///
    /// Unset (the default), the answer depends on why it is missing: a key the client sends
    /// (a header, what a [`KeySource::from_fn`](super::KeySource::from_fn) closure reads, a
    /// forwarding hop that is not an address) is the client's mistake, `Reject(400 Bad
    /// Request)`; a missing peer address is the server's, `Reject(500 Internal Server Error)`,
    /// with a problem detail that names the fix (with axum, serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`). Setting it answers both alike:
    /// prefer [`Policy::on_missing_key`] on the policies whose key is optional, so that a
    /// server that lost its peer addresses still says so on the others.
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::{Fallback, RateLimitLayer};
    /// // Every request without a key is refused with a 401, peer address or not.
    /// let layer = RateLimitLayer::builder()
    ///     .on_missing_key(Fallback::Reject(StatusCode::UNAUTHORIZED))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_missing_key(mut self, fallback: Fallback) -> Self {
        self.on_missing_key = Some(fallback);
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
        let fallbacks = [self.on_error, self.on_table_full, long_key];
        let fallbacks = fallbacks.into_iter().chain(self.on_missing_key);
        for fallback in fallbacks.chain(policy_fallbacks) {
            if let Fallback::Reject(status) = fallback {
                if !(status.is_client_error() || status.is_server_error()) {
                    return Err(ConfigError::FallbackStatus(status));
                }
            }
        }
        let allow_if = Self::allow(self.allow_paths, self.allow_if)?;
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
            if let Some(error) = policy.quota_error {
                return Err(ConfigError::Quota {
                    policy: name.to_string(),
                    error,
                });
            }
            let problem = (policy.path_problem())
                .or_else(|| policy.delay_problem())
                .or_else(|| policy.in_flight_problem());
            if let Some(problem) = problem {
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
                allow_if,
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

impl RateLimitLayer {
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
            allow_paths: Vec::new(),
            headers: HeaderStyle::default(),
            on_missing_key: None,
            on_error: Fallback::Reject(StatusCode::SERVICE_UNAVAILABLE),
            on_table_full: Fallback::Reject(StatusCode::SERVICE_UNAVAILABLE),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            on_long_key: LongKey::Digest,
            deny_with: None,
        }
    }
}
