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
//! on_missing_key = 400             # a status (4xx/5xx) or "allow"; default 400 for a key
//!                                  # the client did not send, 500 without a peer address
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
//! in_flight = 4                    # at most 4 requests running at once per key (alone,
//!                                  # without `quota`: a bound with no rate)
//! in_flight_status = 503           # the answer over it (default 429)
//! in_flight_scope = "key"          # key (default) | policy: one bound for all its requests
//! max_keys = 100000                # optional bound on the keys held
//! overflow = "shared"              # past max_keys: shared (default) | deny
//!
//! [default_policy]                 # for requests no policy matches (optional)
//! name = "other"
//! quota = "100/1m"
//! ```
//!
//! Every path (`path`, `path_pattern`, `allow_paths`, `cost_by_path`) is a path as clients send
//! it, normalised ([`client_path`](super::client_path)): the same under axum's `Router::nest`
//! wherever the layer sits, and the same paths `tollgate replay --config` reads from a trace.
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

use super::addr::ProxyHeader;
use super::answers::{ConfigError, Fallback};
use super::backend::CheckBackend;
use super::builder::RateLimitLayerBuilder;
use super::cidr::Cidr;
use super::key::{Key, KeySource, LongKey};
use super::layer::RateLimitLayer;
use super::path::PathMatch;
use super::policy::{InFlightScope, Mode, Policy};
use super::response::HeaderStyle;
use super::tiers::Tiers;
use crate::clock::{Clock, QuantaClock};
use crate::limiter::Algorithm;
use crate::replay::parse_duration;
use crate::AlgorithmName;
use crate::{
    FixedWindow, Gcra, KeyedLimiter, LeakyQueue, MultiLimiter, OverflowPolicy, Quota, QuotaError,
    SlidingLog, SlidingWindow,
};

mod build;
mod read;

pub use self::read::parse_quota;

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
    /// What a request without a key gets (default: 400 for a key the client did not send, 500
    /// for a missing peer address; see [`RateLimitLayerBuilder::on_missing_key`]).
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
    /// A path prefix of whole segments (`/api/` covers `/api/x`), of the path the client
    /// sent wherever the layer sits (see [`Policy::path_prefix`]).
    #[serde(default)]
    pub path: Option<String>,
    /// A path pattern (`*` one segment, a final `**` any rest), of the path the client sent.
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
    /// The quotas, all or nothing (at least one, unless `in_flight` is the policy's only
    /// bound: [`Policy::in_flight`], no rate and no rate-limit fields).
    #[serde(rename = "quota", default, deserialize_with = "read::one_or_many")]
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
    /// At most this many of the policy's requests in flight at once per client key (see
    /// [`Policy::max_in_flight`]).
    #[serde(default)]
    pub in_flight: Option<u64>,
    /// The status a request over `in_flight` gets: 429 (default), or another 4xx/5xx such as
    /// 503.
    #[serde(default)]
    pub in_flight_status: Option<u16>,
    /// Whose requests `in_flight` counts: `"key"` (each client key's, the default) or
    /// `"policy"` (all of the policy's).
    #[serde(default)]
    pub in_flight_scope: InFlightScope,
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
    #[serde(rename = "quota", deserialize_with = "read::one_or_many")]
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
