//! The layer's configuration as data (feature `serde`): policies, quotas, key sources, trusted
//! proxies, header style and modes, from TOML, JSON, YAML or any serde format.
//!
//! [`LayerConfig`] is what a file holds; [`LayerConfig::build`] turns it into a
//! [`RateLimitLayer`] with in-process limiters, [`LayerConfig::builder`] into a
//! [`RateLimitLayerBuilder`] to add what a file cannot say (closures: a computed cost, a custom
//! denial), and [`LayerConfig::builder_with`] lets you choose each policy's backend (for example
//! a Redis limiter for a global limit).
//!
//! Every value is checked: a bad value is an error naming it (serde adds where it was: TOML's
//! errors quote the line), never a panic. Unknown fields are errors too, so a misspelt
//! setting is not silently ignored.
//!
//! # The format (TOML shown)
//! ```toml
//! headers = "both"                 # none | legacy | draft (default) | both
//! trusted_proxies = ["127.0.0.1", "10.0.0.0/8"]
//! proxy_header = "x-forwarded-for" # or "forwarded" (RFC 7239)
//! ipv6_prefix = 56                 # IPv6 clients are keyed per /56 (default)
//! allow_cidrs = ["192.0.2.0/24"]   # these clients bypass every policy
//! allow_paths = ["/health"]        # these paths (whole segments, normalised) bypass
//!                                  # every policy
//! on_missing_key = 400             # a status (4xx/5xx) or "allow"; default 500
//! on_error = "allow"               # a status (4xx/5xx) or "allow"; default 503
//! on_table_full = 503              # a new key a full key table refuses; default 503
//! max_key_len = 256                # bytes of a key's text part (default 256); longer:
//! on_long_key = "digest"           # counted under its digest (default), or a 4xx/5xx
//!
//! [[policy]]                       # the first policy that matches a request applies
//! name = "api"
//! path = "/api/"                   # a prefix of whole segments; or path_pattern = "/users/*/x"
//! methods = ["GET", "POST"]        # default: every method; HEAD goes with GET
//!                                  # (head_as_get = false to leave it out)
//! key = "client-ip"                # client-ip (default) | peer-ip | path
//!                                  # | { header = "x-api-key" } | { constant = "all" }
//!                                  # | a list of these (a composite key)
//! algorithm = "gcra"               # any algorithm name; default gcra
//! quota = "10/1s burst 20"         # or { limit = 10, window = "1s", burst = 20 },
//!                                  # or a list of quotas, all or nothing
//! cost = 1                         # units per request; default 1
//! cost_by_path = { "/api/export" = 5 } # by path prefix within the policy (longest wins)
//! mode = "enforce"                 # enforce (default) | shadow | { delay = "500ms" }
//!                                  # (delay: wait up to 500 ms, then 429; at most 60 s;
//!                                  # feature tokio)
//! max_waiters = [1024, 16]         # delay mode: most waiting in all, and per key
//! on_redis_failure = "local"       # a global policy while Redis fails: fail-open |
//!                                  # fail-closed | local (default: unguarded, on_error)
//! on_missing_key = "allow"         # this policy's own missing-key answer (default the
//!                                  # layer's)
//! refund = [500]                   # give back units of requests answered 500 (not
//!                                  # "5xx": a timeout layer's 503/504 under overload)
//! tier = "free"                    # with tiers: the name of this quota's tier (default "default")
//! tiers.pro = { quota = "1000/1m", keys = ["k-1"] }  # more tiers, keys placed at start
//! max_keys = 100000                # optional bound on the keys held
//! overflow = "shared"              # past max_keys: shared (default) | deny
//!
//! [default_policy]                 # for requests no policy matches (optional)
//! name = "other"
//! quota = "100/1m"
//! ```
//!
//! Durations are written `250ms`, `1s`, `1m`, `1h` (also `ns`, `us`, `d`). A compact quota is
//! `LIMIT/WINDOW`, optionally followed by `burst B` (`10/s` means `10/1s`).
//!
//! # Examples
//! ```
//! use tollgate::tower::config::LayerConfig;
//!
//! let config: LayerConfig = toml::from_str(r#"
//!     trusted_proxies = ["127.0.0.1"]
//!     [[policy]]
//!     name = "api"
//!     path = "/api/"
//!     quota = "10/1s burst 20"
//! "#)?;
//! let layer = config.build()?;
//! # let _ = layer;
//!
//! // A bad value is an error, not a panic:
//! let bad = toml::from_str::<LayerConfig>(r#"
//!     [[policy]]
//!     name = "api"
//!     quota = "10/0s"
//! "#);
//! assert!(bad.unwrap_err().to_string().contains("the window must be longer than zero"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::policy::PathMatch;
use super::{
    CheckBackend, Cidr, ConfigError, Fallback, HeaderStyle, Key, KeySource, LongKey, Mode, Policy,
    ProxyHeader, RateLimitLayer, RateLimitLayerBuilder, RuleWindow, Tiers,
};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, QuantaClock};
use crate::replay::{parse_duration, AlgorithmName};
use crate::{
    FixedWindow, Gcra, KeyedLimiter, LeakyQueue, MultiLimiter, OverflowPolicy, Quota, QuotaError,
    SlidingLog, SlidingWindow,
};

/// A whole layer's configuration (see the [module docs](self) for the format).
///
/// # Examples
/// ```
/// use tollgate::tower::config::LayerConfig;
/// let config: LayerConfig = serde_json::from_str(
///     r#"{ "headers": "legacy", "policy": [ { "name": "api", "quota": "5/1s" } ] }"#,
/// )?;
/// assert_eq!(config.policies[0].name, "api");
/// let layer = config.build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LayerConfig {
    /// The rate-limit fields on responses (default `draft`).
    #[serde(default)]
    pub headers: HeaderStyle,
    /// Proxies whose forwarding header is believed (default none).
    #[serde(default)]
    pub trusted_proxies: Vec<Cidr>,
    /// The header the trusted proxies write (default `x-forwarded-for`).
    #[serde(default)]
    pub proxy_header: ProxyHeader,
    /// IPv6 client addresses are keyed by this many leading bits (default 56).
    #[serde(default = "default_ipv6_prefix")]
    pub ipv6_prefix: u8,
    /// Clients in these networks bypass every policy.
    #[serde(default)]
    pub allow_cidrs: Vec<Cidr>,
    /// Requests under these path prefixes (whole segments) bypass every policy.
    #[serde(default)]
    pub allow_paths: Vec<String>,
    /// What a request without a key gets (default a 500).
    #[serde(default)]
    pub on_missing_key: Option<Fallback>,
    /// What a request the backend could not decide gets (default a 503).
    #[serde(default)]
    pub on_error: Option<Fallback>,
    /// What a request of a new key gets when a full key table refuses it (default a 503).
    #[serde(default)]
    pub on_table_full: Option<Fallback>,
    /// The longest text or byte part a key may have, in bytes (default 256).
    #[serde(default)]
    pub max_key_len: Option<usize>,
    /// What a request with a longer key gets: `"digest"` (default: counted under a digest of
    /// it) or a 4xx/5xx status.
    #[serde(default)]
    pub on_long_key: Option<LongKey>,
    /// The policies, in order (`[[policy]]` in TOML, `"policy": [...]` in JSON).
    #[serde(default, rename = "policy")]
    pub policies: Vec<PolicyConfig>,
    /// The policy for requests no other policy matches.
    #[serde(default)]
    pub default_policy: Option<PolicyConfig>,
}

fn default_ipv6_prefix() -> u8 {
    56
}

/// One policy's configuration: what it matches, its key, its quotas and its mode.
///
/// # Examples
/// ```
/// use tollgate::tower::config::PolicyConfig;
/// let policy: PolicyConfig = toml::from_str(r#"
///     name = "export"
///     path = "/api/export"
///     key = ["path", { header = "x-api-key" }]
///     quota = ["10/1s", "1000/1h"]
///     cost = 5
/// "#)?;
/// assert_eq!(policy.quotas.len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The name (shown in headers, the 429 body and metrics).
    pub name: String,
    /// A path prefix of whole segments (`/api/` covers `/api/x`).
    #[serde(default)]
    pub path: Option<String>,
    /// A path pattern (`*` one segment, a final `**` any rest).
    #[serde(default)]
    pub path_pattern: Option<String>,
    /// The methods matched (default every method); HEAD matches where GET does, unless
    /// `head_as_get = false` (see [`Policy::head_as_get`]).
    #[serde(default)]
    pub methods: Option<Vec<MethodName>>,
    /// Whether HEAD matches a policy that lists GET (default `true`).
    #[serde(default = "default_true")]
    pub head_as_get: bool,
    /// What a request of this policy without a key gets (default: the layer's setting).
    #[serde(default)]
    pub on_missing_key: Option<Fallback>,
    /// On a global policy ([`PolicyConfig::redis`]), what it does while Redis fails:
    /// `"fail-open"`, `"fail-closed"` or `"local"` (this node's share of the quota); see
    /// [`FailurePolicy`](crate::redis::FailurePolicy). Unset, the policy is unguarded: a
    /// Redis failure is a backend error (`on_error`).
    #[serde(default)]
    pub on_redis_failure: Option<RedisFailure>,
    /// In delay mode, the most requests waiting at once, in all and per key (default
    /// `[1024, 16]`; see [`Policy::max_waiters`]).
    #[serde(default)]
    pub max_waiters: Option<[usize; 2]>,
    /// Where the key comes from (default the client IP).
    #[serde(default = "KeySource::client_ip")]
    pub key: KeySource,
    /// The algorithm, by its canonical name (default `gcra`).
    #[serde(default = "default_algorithm")]
    pub algorithm: AlgorithmName,
    /// The quotas, all or nothing (at least one).
    #[serde(rename = "quota", deserialize_with = "one_or_many")]
    pub quotas: Vec<Quota>,
    /// Units per request (default 1).
    #[serde(default = "default_cost")]
    pub cost: u64,
    /// Costs by path prefix (whole segments) within the policy, e.g. `{ "/api/export" = 5 }`:
    /// the longest matching prefix sets the cost, else `cost` does.
    #[serde(default)]
    pub cost_by_path: BTreeMap<String, u64>,
    /// Enforce (default), shadow, or delay (feature `tokio`).
    #[serde(default)]
    pub mode: Mode,
    /// Give an admitted request's units back when its response status matches one of these
    /// (`[500]`: the application's failures are not charged; `["2xx", "3xx"]`: only failures
    /// are, as a login throttle does). See [`Policy::refund_when`], and its warning about the
    /// 503/504 of inner timeout layers.
    #[serde(default)]
    pub refund: Vec<StatusMatch>,
    /// Other tiers than the policy's own quota (which is the default tier): each with its own
    /// quota and, optionally, the keys (text: header values) placed in it at start. Keys can
    /// be moved at run time through [`RateLimitLayer::tiers`].
    #[serde(default)]
    pub tiers: BTreeMap<String, TierConfig>,
    /// The name of the default tier (default `"default"`), when there are tiers.
    #[serde(default = "default_tier")]
    pub tier: String,
    /// At most this many keys held (single-quota policies).
    #[serde(default)]
    pub max_keys: Option<usize>,
    /// What happens to new keys past `max_keys` (default `shared`).
    #[serde(default)]
    pub overflow: Overflow,
}

fn default_tier() -> String {
    "default".to_owned()
}

/// One tier of a policy: its quota and the keys placed in it at start.
///
/// # Examples
/// ```
/// use tollgate::tower::config::TierConfig;
/// let tier: TierConfig = toml::from_str("quota = \"1000/1m\"\nkeys = [\"k1\", \"k2\"]")?;
/// assert_eq!(tier.keys.len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// The tier's quotas (one or a list, all or nothing).
    #[serde(rename = "quota", deserialize_with = "one_or_many")]
    pub quotas: Vec<Quota>,
    /// Keys (as text) in this tier from the start.
    #[serde(default)]
    pub keys: Vec<String>,
}

fn default_algorithm() -> AlgorithmName {
    AlgorithmName::Gcra
}

fn default_true() -> bool {
    true
}

fn default_cost() -> u64 {
    1
}

/// An HTTP method, parsed: a standard one (`GET`, `POST`, ...) in any case, or any other
/// valid token as written (an extension method such as `PURGE`; methods are case-sensitive,
/// so `"get"` would otherwise be an extension method that no request uses).
///
/// # Examples
/// ```
/// use tollgate::tower::config::MethodName;
/// let m: Vec<MethodName> = serde_json::from_str(r#"["GET", "post", "PURGE"]"#)?;
/// assert_eq!(m[0].0, http::Method::GET);
/// assert_eq!(m[1].0, http::Method::POST);
/// assert!(serde_json::from_str::<MethodName>(r#""GE T""#).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodName(pub Method);

/// A response status (`404`) or a class of them (`"5xx"`), as in `refund = ["5xx"]`.
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::config::StatusMatch;
/// let m: Vec<StatusMatch> = serde_json::from_str(r#"["5xx", 404, "429"]"#)?;
/// assert!(m[0].matches(StatusCode::BAD_GATEWAY));
/// assert!(m[1].matches(StatusCode::NOT_FOUND));
/// assert!(!m[0].matches(StatusCode::NOT_FOUND));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    /// This status.
    Exact(StatusCode),
    /// Every status of this class (1 to 5, for `1xx` to `5xx`).
    Class(u8),
}

impl StatusMatch {
    /// Whether `status` matches.
    ///
    /// # Examples
    /// ```
    /// use http::StatusCode;
    /// use tollgate::tower::config::StatusMatch;
    /// // `"5xx"`: every server error.
    /// assert!(StatusMatch::Class(5).matches(StatusCode::SERVICE_UNAVAILABLE));
    /// assert!(!StatusMatch::Class(5).matches(StatusCode::TOO_MANY_REQUESTS));
    /// assert!(StatusMatch::Exact(StatusCode::CONFLICT).matches(StatusCode::CONFLICT));
    /// ```
    pub fn matches(&self, status: StatusCode) -> bool {
        match *self {
            StatusMatch::Exact(s) => s == status,
            StatusMatch::Class(c) => status.as_u16() / 100 == u16::from(c),
        }
    }
}

impl<'de> Deserialize<'de> for StatusMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct StatusVisitor;
        impl Visitor<'_> for StatusVisitor {
            type Value = StatusMatch;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status (404) or a class (\"5xx\")")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusMatch, E> {
                u16::try_from(v)
                    .ok()
                    .filter(|v| (100..600).contains(v))
                    .and_then(|v| StatusCode::from_u16(v).ok())
                    .map(StatusMatch::Exact)
                    .ok_or_else(|| E::custom(format!("invalid status {v}")))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusMatch, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("invalid status {v}"))),
                }
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusMatch, E> {
                let b = v.as_bytes();
                if b.len() == 3
                    && (b'1'..=b'5').contains(&b[0])
                    && b[1..].eq_ignore_ascii_case(b"xx")
                {
                    return Ok(StatusMatch::Class(b[0] - b'0'));
                }
                match v.parse::<u64>() {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "invalid status {v:?} (expected e.g. 404 or \"5xx\")"
                    ))),
                }
            }
        }
        d.deserialize_any(StatusVisitor)
    }
}

/// What a global policy does while Redis fails (`on_redis_failure`): `"fail-open"`,
/// `"fail-closed"` or `"local"`, as [`FailurePolicy`](crate::redis::FailurePolicy) says.
///
/// # Examples
/// ```
/// use tollgate::tower::config::{PolicyConfig, RedisFailure};
/// let p: PolicyConfig = toml::from_str("name = \"p\"\nquota = \"1/1s\"\non_redis_failure = \"local\"")?;
/// assert_eq!(p.on_redis_failure, Some(RedisFailure::Local));
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedisFailure {
    /// Allow every request while Redis fails.
    FailOpen,
    /// Deny every request while Redis fails.
    FailClosed,
    /// Decide with this node's share of the quota while Redis fails.
    Local,
}

/// What happens to new keys past `max_keys` (see [`OverflowPolicy`]).
///
/// # Examples
/// ```
/// use tollgate::tower::config::{Overflow, PolicyConfig};
/// let p: PolicyConfig = toml::from_str("name = \"p\"\nquota = \"1/1s\"\nmax_keys = 10\noverflow = \"deny\"")?;
/// assert_eq!(p.overflow, Overflow::Deny);
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overflow {
    /// Every key that did not fit shares one state ([`OverflowPolicy::Shared`]).
    #[default]
    Shared,
    /// New keys are refused: a backend error ([`OverflowPolicy::Deny`]).
    Deny,
}

impl LayerConfig {
    /// The layer, with in-process limiters on the precise default clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the policy and what its algorithm refused (a window algorithm's
    /// window under 1 ms, a burst on a window algorithm, a limit too large, …).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str(r#"
    ///     [[policy]]
    ///     name = "api"
    ///     algorithm = "fixed-window"
    ///     quota = "10/1s burst 20"
    /// "#)?;
    /// // A window algorithm takes no burst.
    /// assert!(config.build().unwrap_err().to_string().contains("\"api\""));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        self.builder()?.build()
    }

    /// A builder with every setting of the file, in-process limiters on the precise default
    /// clock: add closures (a computed cost, a custom denial) before building.
    ///
    /// # Errors
    /// As for [`LayerConfig::build`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config
    ///     .builder()?
    ///     .allow_if(|parts| parts.headers.contains_key("x-internal"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(self) -> Result<RateLimitLayerBuilder, ConfigError> {
        self.builder_with_clock(QuantaClock::default())
    }

    /// As [`LayerConfig::builder`], every in-process limiter reading `clock` (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests).
    ///
    /// # Errors
    /// As for [`LayerConfig::build`], and [`QuotaError::ClockTooCoarse`] (named with its
    /// policy) if the clock cannot serve a quota.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::tower::config::LayerConfig;
    /// let clock = ManualClock::new();
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config.builder_with_clock(clock.clone())?.build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with_clock<C>(self, clock: C) -> Result<RateLimitLayerBuilder, ConfigError>
    where
        C: Clock + Clone + 'static,
    {
        self.builder_with(|policy| policy.in_process(clock.clone()))
    }

    /// A builder whose policies check the backends `backend` makes from their configuration:
    /// for example a Redis limiter for some policies and an in-process one
    /// ([`PolicyConfig::in_process`]) for the others.
    ///
    /// # Errors
    /// The first error `backend` returns, else as for [`LayerConfig::build`].
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::clock::QuantaClock;
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config
    ///     .builder_with(|policy| {
    ///         println!("policy {} on {}", policy.name, policy.algorithm);
    ///         policy.in_process(QuantaClock::default())
    ///     })?
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with(
        self,
        mut backend: impl FnMut(&PolicyConfig) -> Result<Arc<dyn CheckBackend>, ConfigError>,
    ) -> Result<RateLimitLayerBuilder, ConfigError> {
        let mut names = std::collections::HashSet::new();
        for policy in self.policies.iter().chain(&self.default_policy) {
            if !names.insert(policy.name.as_str()) {
                return Err(policy.problem("the name is used by another policy"));
            }
        }
        let mut builder = RateLimitLayer::builder()
            .headers(self.headers)
            .trusted_proxies(self.trusted_proxies)
            .proxy_header(self.proxy_header)
            .ipv6_prefix(self.ipv6_prefix)
            .allow_cidrs(self.allow_cidrs);
        if let Some(path) = self.allow_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(ConfigError::AllowPath(path.clone()));
        }
        if !self.allow_paths.is_empty() {
            let paths: Vec<PathMatch> = self
                .allow_paths
                .into_iter()
                .map(PathMatch::Prefix)
                .collect();
            builder = builder.allow_if(move |parts| {
                let path = super::normalized_path(parts.uri.path());
                paths.iter().any(|p| p.matches(&path))
            });
        }
        if let Some(fallback) = self.on_missing_key {
            builder = builder.on_missing_key(fallback);
        }
        if let Some(fallback) = self.on_error {
            builder = builder.on_error(fallback);
        }
        if let Some(fallback) = self.on_table_full {
            builder = builder.on_table_full(fallback);
        }
        if let Some(bytes) = self.max_key_len {
            builder = builder.max_key_len(bytes);
        }
        if let Some(long_key) = self.on_long_key {
            builder = builder.on_long_key(long_key);
        }
        for config in &self.policies {
            builder = builder.policy(config.build_policy(&mut backend)?);
        }
        if let Some(config) = &self.default_policy {
            builder = builder.default_policy(config.build_policy(&mut backend)?);
        }
        Ok(builder)
    }
}

impl PolicyConfig {
    /// An error about this policy.
    fn problem(&self, problem: &str) -> ConfigError {
        ConfigError::Policy {
            policy: self.name.clone(),
            problem: problem.to_owned(),
        }
    }

    /// The policy over the backends `backend` makes: one, or one per tier.
    fn build_policy(
        &self,
        backend: &mut impl FnMut(&PolicyConfig) -> Result<Arc<dyn CheckBackend>, ConfigError>,
    ) -> Result<Policy, ConfigError> {
        if self.tiers.is_empty() {
            return self.policy(backend(self)?);
        }
        let mut builder = Tiers::builder(self.tier.clone(), backend(self)?);
        for (name, tier) in &self.tiers {
            let config = PolicyConfig {
                name: format!("{}/{name}", self.name),
                quotas: tier.quotas.clone(),
                tiers: BTreeMap::new(),
                ..self.clone()
            };
            builder = builder.tier(name.clone(), backend(&config)?);
        }
        let tiers = builder
            .build()
            .map_err(|_| self.problem("a tier is named twice"))?;
        for (name, tier) in &self.tiers {
            for key in &tier.keys {
                tiers
                    .assign(Key::from(key.as_str()), name)
                    .map_err(|e| self.problem(&e.to_string()))?;
            }
        }
        self.policy(tiers)
    }

    /// The policy (matching, key, cost, mode) over `backend`.
    fn policy(&self, backend: impl CheckBackend) -> Result<Policy, ConfigError> {
        let mut policy = Policy::new(self.name.clone(), backend)
            .key(self.key.clone())
            .cost(self.cost)
            .mode(self.mode);
        match (&self.path, &self.path_pattern) {
            (Some(_), Some(_)) => {
                return Err(self.problem("set `path` or `path_pattern`, not both"))
            }
            (Some(prefix), None) => policy = policy.path_prefix(prefix.clone()),
            (None, Some(pattern)) => policy = policy.path_pattern(pattern),
            (None, None) => {}
        }
        if let Some(methods) = &self.methods {
            policy = policy.methods(methods.iter().map(|m| m.0.clone()));
        }
        policy = policy.head_as_get(self.head_as_get);
        if let Some(fallback) = self.on_missing_key {
            policy = policy.on_missing_key(fallback);
        }
        if let Some([_total, _per_key]) = self.max_waiters {
            #[cfg(feature = "tokio")]
            {
                policy = policy.max_waiters(_total, _per_key);
            }
            #[cfg(not(feature = "tokio"))]
            return Err(
                self.problem("max_waiters is for delay mode, which needs the `tokio` feature")
            );
        }
        if !self.refund.is_empty() {
            let statuses = self.refund.clone();
            policy = policy.refund_when(move |status| statuses.iter().any(|m| m.matches(status)));
        }
        if !self.cost_by_path.is_empty() {
            // Longest prefix first: the first match is the most specific.
            let mut costs: Vec<(PathMatch, usize, u64)> = self
                .cost_by_path
                .iter()
                .map(|(path, &cost)| (PathMatch::Prefix(path.clone()), path.len(), cost))
                .collect();
            costs.sort_by_key(|c| std::cmp::Reverse(c.1));
            let default = self.cost;
            if let Some((path, _)) = self.cost_by_path.iter().find(|(p, _)| !p.starts_with('/')) {
                return Err(self.problem(&format!("cost_by_path {path:?} must start with `/`")));
            }
            policy = policy.cost_fn(move |parts| {
                let path = super::normalized_path(parts.uri.path());
                costs
                    .iter()
                    .find(|(prefix, _, _)| prefix.matches(&path))
                    .map_or(default, |&(_, _, cost)| cost)
            });
        }
        Ok(policy)
    }

    /// This policy's limiter in process, reading `clock`: a [`KeyedLimiter`] for one quota, a
    /// [`MultiLimiter`] for several, of the configured algorithm.
    ///
    /// # Errors
    /// [`ConfigError::Quota`] if the algorithm refuses a quota or the clock.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::QuantaClock;
    /// use tollgate::tower::config::PolicyConfig;
    /// let policy: PolicyConfig = toml::from_str("name = \"api\"\nquota = \"5/1s\"")?;
    /// let backend = policy.in_process(QuantaClock::default())?;
    /// assert_eq!(backend.quota(0).map(|q| q.limit), Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_process<C>(&self, clock: C) -> Result<Arc<dyn CheckBackend>, ConfigError>
    where
        C: Clock + Clone + 'static,
    {
        match self.algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                self.limiter(Gcra::new, clock)
            }
            AlgorithmName::LeakyQueue => self.limiter(LeakyQueue::new, clock),
            AlgorithmName::FixedWindow => self.limiter(FixedWindow::new, clock),
            AlgorithmName::SlidingWindow => self.limiter(SlidingWindow::new, clock),
            AlgorithmName::SlidingLog => self.limiter(SlidingLog::new, clock),
        }
    }

    /// This policy's limit held globally on Redis (feature `redis`): the exact tier
    /// ([`RedisLimiter`](crate::redis::RedisLimiter), or for several quotas a
    /// [`RedisMultiLimiter`](crate::redis::RedisMultiLimiter), all or nothing in one script call)
    /// over `conn`, with the configured algorithm, under the Redis key prefix `tollgate:NAME`
    /// (each policy its own state).
    /// Use it in [`LayerConfig::builder_with`] to make policies global.
    ///
    /// With `on_redis_failure`, the policy is a [`GuardedLimiter`](crate::redis::GuardedLimiter)
    /// over the exact limiter (its background task spawned on the current tokio runtime).
    ///
    /// # Errors
    /// [`ConfigError::Quota`] if the Redis tier refuses the quota;
    /// [`ConfigError::Policy`] for `max_keys` (it bounds in-process limiters only), and for
    /// `on_redis_failure` on several quotas or outside a tokio runtime.
    ///
    /// # Examples
    /// ```no_run
    /// use redis::aio::ConnectionManager;
    /// use tollgate::tower::config::LayerConfig;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = ConnectionManager::new(redis::Client::open("redis://127.0.0.1:6379")?).await?;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config.builder_with(|policy| policy.redis(conn.clone()))?.build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis<Conn: crate::redis::RedisConnection>(
        &self,
        conn: Conn,
    ) -> Result<Arc<dyn CheckBackend>, ConfigError> {
        if self.max_keys.is_some() {
            return Err(self.problem("`max_keys` bounds in-process limiters only"));
        }
        let rules = self
            .quotas
            .iter()
            .map(|&quota| crate::redis::RedisRule::for_algorithm(self.algorithm, quota))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ConfigError::Quota {
                policy: self.name.clone(),
                error,
            })?;
        let Some((&first, more)) = rules.split_first() else {
            return Err(self.problem("no quota"));
        };
        let limiter = crate::redis::RedisLimiter::builder(first)
            .prefix(format!("tollgate:{}", self.name))
            .build(conn);
        if let Some(failure) = self.on_redis_failure {
            use crate::redis::{FailureHandling, FailurePolicy};
            if !more.is_empty() {
                return Err(self.problem("`on_redis_failure` guards single-quota policies only"));
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return Err(self.problem(
                    "`on_redis_failure` needs the configuration built inside a tokio runtime",
                ));
            };
            let policy = match failure {
                RedisFailure::FailOpen => FailurePolicy::FailOpen,
                RedisFailure::FailClosed => FailurePolicy::FailClosed,
                RedisFailure::Local => FailurePolicy::Local,
            };
            let guarded = limiter.guarded_on(FailureHandling::new(policy), &runtime);
            return Ok(Arc::new(super::RedisBackend::new(guarded, self.quotas[0])));
        }
        if more.is_empty() {
            return Ok(Arc::new(super::RedisBackend::new(limiter, self.quotas[0])));
        }
        // One algorithm for every rule: `with_rules` cannot refuse them.
        let all = limiter
            .with_rules(more.iter().copied())
            .map_err(|error| self.problem(&error.to_string()))?;
        Ok(Arc::new(super::RedisBackend::all_of(all)))
    }

    fn limiter<A, C>(
        &self,
        rule: impl Fn(Quota) -> Result<A, QuotaError>,
        clock: C,
    ) -> Result<Arc<dyn CheckBackend>, ConfigError>
    where
        A: Algorithm + RuleWindow,
        C: Clock + Clone + 'static,
    {
        let quota_error = |error| ConfigError::Quota {
            policy: self.name.clone(),
            error,
        };
        let rules = self
            .quotas
            .iter()
            .map(|&q| rule(q))
            .collect::<Result<Vec<A>, _>>()
            .map_err(quota_error)?;
        let limiter = |rule: A| {
            let mut builder = KeyedLimiter::<Key, A>::builder(rule).clock(clock.clone());
            if let Some(max) = self.max_keys {
                let overflow = match self.overflow {
                    Overflow::Shared => OverflowPolicy::Shared,
                    Overflow::Deny => OverflowPolicy::Deny,
                };
                builder = builder.max_keys(max, overflow);
            }
            builder.build().map_err(quota_error)
        };
        match rules.as_slice() {
            [] => Err(self.problem("no quota")),
            [rule] => Ok(Arc::new(limiter(*rule)?)),
            _ => {
                let limits = rules.into_iter().map(limiter);
                Ok(Arc::new(MultiLimiter::from_limits(
                    limits.collect::<Result<Vec<_>, _>>()?,
                )))
            }
        }
    }
}

/// Parses a compact quota: `LIMIT/WINDOW`, optionally followed by `burst B`; the window is a
/// duration (`250ms`, `1s`, `1m`, `1h`), or a bare unit (`10/s` is `10/1s`).
///
/// # Errors
/// A message naming the value and what is wrong.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::tower::config::parse_quota;
/// let q = parse_quota("100/1m burst 20")?;
/// assert_eq!((q.limit(), q.window(), q.burst()), (100, Duration::from_secs(60), 20));
/// assert_eq!(parse_quota("10/s")?.window(), Duration::from_secs(1));
/// assert!(parse_quota("10/0s").is_err());
/// assert!(parse_quota("ten per second").is_err());
/// # Ok::<(), String>(())
/// ```
pub fn parse_quota(text: &str) -> Result<Quota, String> {
    let bad =
        |why: &str| format!("invalid quota {text:?}: {why} (expected e.g. \"100/1m burst 20\")");
    let (limit, rest) = text
        .split_once('/')
        .ok_or_else(|| bad("no `/` between limit and window"))?;
    let limit = limit.trim();
    if limit.is_empty() || !limit.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the limit is not a whole number"));
    }
    let limit: u64 = limit.parse().map_err(|_| bad("the limit is too large"))?;
    let mut words = rest.split_whitespace();
    let window = words.next().ok_or_else(|| bad("no window"))?;
    let window = if window.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(window)
    } else {
        parse_duration(&format!("1{window}"))
    }
    .map_err(|e| bad(&e))?;
    let mut quota = Quota::new(limit, window).map_err(|e| bad(&e.to_string()))?;
    match (words.next(), words.next(), words.next()) {
        (None, _, _) => {}
        (Some("burst"), Some(burst), None) => {
            let burst: u64 = burst
                .parse()
                .map_err(|_| bad("the burst is not a whole number"))?;
            quota = quota.with_burst(burst).map_err(|e| bad(&e.to_string()))?;
        }
        _ => return Err(bad("only `burst B` may follow the window")),
    }
    Ok(quota)
}

/// A quota as a table: `{ limit = 10, window = "1s", burst = 20 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaTable {
    limit: u64,
    window: DurationText,
    #[serde(default)]
    burst: Option<u64>,
}

/// A duration written as text (`250ms`).
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(DurationText)
            .map_err(de::Error::custom)
    }
}

/// A quota: compact text (`"100/1m burst 20"`, see [`parse_quota`]) or a table
/// (`{ limit = 100, window = "1m", burst = 20 }`).
impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuotaVisitor)
    }
}

struct QuotaVisitor;

impl<'de> Visitor<'de> for QuotaVisitor {
    type Value = Quota;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a quota such as \"100/1m burst 20\" or { limit = 100, window = \"1m\" }")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quota, E> {
        parse_quota(v).map_err(E::custom)
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Quota, M::Error> {
        let table = QuotaTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let fail = |e: QuotaError| {
            de::Error::custom(format!(
                "invalid quota {{ limit = {}, window = {:?} }}: {e}",
                table.limit, table.window.0
            ))
        };
        let quota = Quota::new(table.limit, table.window.0).map_err(fail)?;
        match table.burst {
            Some(burst) => quota.with_burst(burst).map_err(fail),
            None => Ok(quota),
        }
    }
}

/// One quota or a list of them.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Quota>, D::Error> {
    struct Many;
    impl<'de> Visitor<'de> for Many {
        type Value = Vec<Quota>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a quota or a list of quotas")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<Quota>, E> {
            QuotaVisitor.visit_str(v).map(|q| vec![q])
        }

        fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Vec<Quota>, M::Error> {
            QuotaVisitor.visit_map(map).map(|q| vec![q])
        }

        fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<Quota>, S::Error> {
            let mut quotas = Vec::new();
            while let Some(q) = seq.next_element::<Quota>()? {
                quotas.push(q);
            }
            if quotas.is_empty() {
                return Err(de::Error::custom("an empty list of quotas"));
            }
            Ok(quotas)
        }
    }
    d.deserialize_any(Many)
}

/// An algorithm by its canonical name (`gcra`, `fixed-window`, …).
impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(de::Error::custom)
    }
}

/// A network (`10.0.0.0/8`) or a single address (`127.0.0.1`).
impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| de::Error::custom(format!("invalid network {text:?}: {e}")))
    }
}

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let standard = [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::CONNECT,
            Method::OPTIONS,
            Method::TRACE,
            Method::PATCH,
        ];
        if let Some(method) = standard
            .iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(&text))
        {
            return Ok(MethodName(method.clone()));
        }
        Method::from_bytes(text.as_bytes())
            .map(MethodName)
            .map_err(|_| de::Error::custom(format!("invalid HTTP method {text:?}")))
    }
}

/// `none`, `legacy`, `draft` or `both`.
impl<'de> Deserialize<'de> for HeaderStyle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "none" => Ok(HeaderStyle::None),
            "legacy" => Ok(HeaderStyle::Legacy),
            "draft" => Ok(HeaderStyle::Draft),
            "both" => Ok(HeaderStyle::Both),
            _ => Err(de::Error::custom(format!(
                "unknown header style {text:?} (expected none, legacy, draft or both)"
            ))),
        }
    }
}

/// `x-forwarded-for` or `forwarded`.
impl<'de> Deserialize<'de> for ProxyHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ProxyHeader::XForwardedFor),
            "forwarded" => Ok(ProxyHeader::Forwarded),
            _ => Err(de::Error::custom(format!(
                "unknown proxy header {text:?} (expected x-forwarded-for or forwarded)"
            ))),
        }
    }
}

/// `"enforce"`, `"shadow"`, or `{ delay = "500ms" }` (feature `tokio`).
impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ModeVisitor)
    }
}

struct ModeVisitor;

impl<'de> Visitor<'de> for ModeVisitor {
    type Value = Mode;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"enforce\", \"shadow\" or { delay = MAX_WAIT }")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Mode, E> {
        match v {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            "delay" => Err(E::custom(
                "delay mode needs its longest wait: mode = { delay = \"500ms\" }",
            )),
            _ => Err(E::custom(format!(
                "unknown mode {v:?} (expected enforce, shadow or {{ delay = MAX_WAIT }})"
            ))),
        }
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Mode, M::Error> {
        let Some((kind, value)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom("an empty mode"));
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("a mode table has one entry"));
        }
        if kind != "delay" {
            return Err(de::Error::custom(format!(
                "unknown mode {kind:?} (expected enforce, shadow or {{ delay = MAX_WAIT }})"
            )));
        }
        let max_wait = parse_duration(&value).map_err(de::Error::custom)?;
        #[cfg(feature = "tokio")]
        let mode = {
            let most = crate::tower::policy::MAX_DELAY;
            if max_wait > most {
                return Err(de::Error::custom(format!(
                    "a delay of {max_wait:?} is longer than the most a request may wait, {most:?}"
                )));
            }
            Ok(Mode::Delay { max_wait })
        };
        #[cfg(not(feature = "tokio"))]
        let mode = Err(de::Error::custom(format!(
            "delay mode (max wait {max_wait:?}) needs tollgate's `tokio` feature"
        )));
        mode
    }
}

/// `v` as a client or server error status (what a configured refusal may answer).
fn error_status<E: de::Error>(v: impl TryInto<u16> + fmt::Display + Copy) -> Result<StatusCode, E> {
    v.try_into()
        .ok()
        .and_then(|v| StatusCode::from_u16(v).ok())
        .filter(|s| s.is_client_error() || s.is_server_error())
        .ok_or_else(|| E::custom(format!("status {v} is not a 4xx or 5xx status")))
}

/// `"digest"` or a 4xx/5xx status.
impl<'de> Deserialize<'de> for LongKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct LongKeyVisitor;
        impl Visitor<'_> for LongKeyVisitor {
            type Value = LongKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"digest\" or a 4xx/5xx status")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LongKey, E> {
                match v {
                    "digest" => Ok(LongKey::Digest),
                    _ => Err(E::custom(format!(
                        "unknown long-key answer {v:?} (expected \"digest\" or a 4xx/5xx status)"
                    ))),
                }
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LongKey, E> {
                error_status(v).map(LongKey::Reject)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LongKey, E> {
                error_status(v).map(LongKey::Reject)
            }
        }
        d.deserialize_any(LongKeyVisitor)
    }
}

/// `"allow"`, or a 4xx/5xx status number to reject with.
impl<'de> Deserialize<'de> for Fallback {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FallbackVisitor;
        impl Visitor<'_> for FallbackVisitor {
            type Value = Fallback;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"allow\" or a 4xx/5xx status")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Fallback, E> {
                match v {
                    "allow" => Ok(Fallback::Allow),
                    _ => Err(E::custom(format!(
                        "unknown fallback {v:?} (expected \"allow\" or a 4xx/5xx status)"
                    ))),
                }
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fallback, E> {
                error_status(v).map(Fallback::Reject)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fallback, E> {
                error_status(v).map(Fallback::Reject)
            }
        }
        d.deserialize_any(FallbackVisitor)
    }
}

/// `"client-ip"`, `"peer-ip"`, `"path"`, `{ header = "x-api-key" }`, `{ constant = "all" }`, or
/// a list of these (a composite key).
impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeySourceVisitor)
    }
}

struct KeySourceVisitor;

impl<'de> Visitor<'de> for KeySourceVisitor {
    type Value = KeySource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a key source: \"client-ip\", \"peer-ip\", \"path\", { header = NAME }, \
             { constant = TEXT }, or a list of these",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeySource, E> {
        match v {
            "client-ip" => Ok(KeySource::client_ip()),
            "peer-ip" => Ok(KeySource::peer_ip()),
            "path" => Ok(KeySource::path()),
            _ => Err(E::custom(format!(
                "unknown key source {v:?} (expected client-ip, peer-ip, path, \
                 {{ header = NAME }} or {{ constant = TEXT }})"
            ))),
        }
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<KeySource, M::Error> {
        let Some((kind, value)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom("an empty key source"));
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "a key source table has one entry (use a list for a composite key)",
            ));
        }
        match kind.as_str() {
            "header" => HeaderName::from_bytes(value.as_bytes())
                .map(KeySource::header)
                .map_err(|_| de::Error::custom(format!("invalid header name {value:?}"))),
            "constant" => Ok(KeySource::constant(value)),
            _ => Err(de::Error::custom(format!(
                "unknown key source {kind:?} (expected header or constant)"
            ))),
        }
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<KeySource, S::Error> {
        let mut parts = Vec::new();
        while let Some(part) = seq.next_element::<KeySource>()? {
            parts.push(part);
        }
        if parts.is_empty() {
            return Err(de::Error::custom("an empty composite key"));
        }
        Ok(KeySource::composite(parts))
    }
}
