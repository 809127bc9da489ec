//! The layer itself: its shared configuration, what it answers a request it cannot decide,
//! and why a configuration is refused.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::Response;

use super::addr::AddrConfig;
use super::answers::Fallback;
use super::cidr::Cidr;
use super::key::{Key, LongKey};
use super::outcome::Outcome;
use super::policy::Policy;
use super::response::{Denial, HeaderStyle};
use super::stats;
use super::tiers::Tiers;

pub(super) type Predicate = dyn Fn(&Parts) -> bool + Send + Sync;
pub(super) type PeerFn = dyn Fn(&Parts) -> Option<std::net::IpAddr> + Send + Sync;
pub(super) type DenyFn = dyn Fn(&Denial<'_>) -> Response<Bytes> + Send + Sync;

/// The layer's configuration, shared by every clone.
pub(crate) struct Shared {
    /// The policies in order, then the default policy (if any) last.
    pub(super) policies: Vec<Policy>,
    pub(super) has_default: bool,
    pub(super) addrs: AddrConfig,
    /// Where the peer's address comes from, if not from the request's extensions.
    pub(super) peer: Option<Arc<PeerFn>>,
    pub(super) allow_cidrs: Vec<Cidr>,
    pub(super) allow_if: Option<Arc<Predicate>>,
    pub(super) headers: HeaderStyle,
    /// What a request without a key gets, if not its policy's setting; unset, it depends on
    /// why the key is missing (`Missing::default_fallback`).
    pub(super) on_missing_key: Option<Fallback>,
    pub(super) on_error: Fallback,
    pub(super) on_table_full: Fallback,
    pub(super) max_key_len: usize,
    pub(super) on_long_key: LongKey,
    pub(super) deny_with: Option<Arc<DenyFn>>,
}

/// A tower [`Layer`](tower_layer::Layer) that rate-limits HTTP requests by policy (see the
/// [module docs](crate::tower)).
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
    pub(crate) shared: Arc<Shared>,
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
