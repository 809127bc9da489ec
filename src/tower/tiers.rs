//! Tiers: one policy, a different limit per class of client (free 100/min, pro 1000/min).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use super::answers::ConfigError;
use super::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo, Verdict};
use super::key::Key;

type TierFn = dyn Fn(&Key) -> Option<Arc<str>> + Send + Sync;

/// A [`CheckBackend`] that sends each key to its tier's backend: a map from key to tier,
/// changeable at run time ([`Tiers::assign`]), and optionally a closure consulted for keys the
/// map does not hold; any other key is in the default tier.
///
/// Cloning it is one reference count: keep a clone (or ask the layer,
/// [`RateLimitLayer::tiers`](super::RateLimitLayer::tiers)) to move keys between tiers while
/// the server runs. A key keeps its state in each tier's own limiter: moved to another tier,
/// it starts there with that tier's state for it.
///
/// The `RateLimit-Policy` header lists every tier's quotas (`"name-1"`, `"name-2"`, … in the
/// order the tiers were added, the default tier first); `RateLimit` names the one decided.
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, KeySource, Policy, Tiers};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
///
/// let tiers = Tiers::builder("free", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(100)?)?))
///     .tier("pro", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1000)?)?))
///     .build()?;
/// tiers.assign(Key::from("key-of-a-customer"), "pro")?;
/// let policy = Policy::new("partner", tiers.clone())
///     .key(KeySource::header(http::HeaderName::from_static("x-api-key")));
/// assert_eq!(tiers.tier_of(&Key::from("key-of-a-customer")), "pro");
/// assert_eq!(tiers.tier_of(&Key::from("someone")), "free");
/// # let _ = policy;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Tiers {
    inner: Arc<Inner>,
}

struct Inner {
    /// The tiers in order, the default first: name, backend, and the index of its first quota.
    tiers: Vec<Tier>,
    assigned: RwLock<HashMap<Key, usize>>,
    classify: Option<Arc<TierFn>>,
}

struct Tier {
    name: Arc<str>,
    backend: Arc<dyn CheckBackend>,
    first_quota: usize,
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiers")
            .field(
                "tiers",
                &self
                    .inner
                    .tiers
                    .iter()
                    .map(|t| &*t.name)
                    .collect::<Vec<_>>(),
            )
            .field("assigned", &self.inner.assigned.read().len())
            .finish_non_exhaustive()
    }
}

/// Builds [`Tiers`] (see [`Tiers::builder`]).
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Tiers};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let q = |n| -> Result<_, tollgate::QuotaError> {
///     Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?))
/// };
/// let tiers = Tiers::builder("free", q(100)?).tier("pro", q(1000)?).tier("internal", q(100_000)?).build()?;
/// assert_eq!(tiers.names().count(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct TiersBuilder {
    tiers: Vec<(Arc<str>, Arc<dyn CheckBackend>)>,
    classify: Option<Arc<TierFn>>,
}

impl fmt::Debug for TiersBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TiersBuilder")
            .field(
                "tiers",
                &self.tiers.iter().map(|t| &*t.0).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl TiersBuilder {
    /// Adds tier `name` over `backend` (see also the [builder's example](TiersBuilder)).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Tiers};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let free = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10)?)?);
    /// let pro = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1_000)?)?);
    /// let tiers = Tiers::builder("free", free).tier("pro", pro).build()?;
    /// // A key nobody placed is in the first tier, the default.
    /// assert_eq!(tiers.tier_of(&Key::from("new-customer")), "free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tier(mut self, name: impl Into<String>, backend: impl CheckBackend) -> Self {
        self.tiers.push((name.into().into(), Arc::new(backend)));
        self
    }

    /// Consults `f` for keys the map does not hold: the name of their tier, or `None` for the
    /// default tier (a name that is no tier also means the default). Another example:
    /// [`Tiers::tier_of`].
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::tower::{Key, Tiers};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let q = |n| -> Result<_, tollgate::QuotaError> { Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?)) };
    /// // Internal callers come from 10.x addresses; everyone else is free until placed.
    /// let tiers = Tiers::builder("free", q(10)?)
    ///     .tier("internal", q(100_000)?)
    ///     .classify(|key| match key {
    ///         Key::Ip(std::net::IpAddr::V4(ip)) if ip.octets()[0] == 10 => Some(Arc::from("internal")),
    ///         _ => None,
    ///     })
    ///     .build()?;
    /// assert_eq!(tiers.tier_of(&Key::Ip("10.1.2.3".parse()?)), "internal");
    /// assert_eq!(tiers.tier_of(&Key::Ip("192.0.2.1".parse()?)), "free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn classify(
        mut self,
        f: impl Fn(&Key) -> Option<Arc<str>> + Send + Sync + 'static,
    ) -> Self {
        self.classify = Some(Arc::new(f));
        self
    }

    /// The tiers.
    ///
    /// # Errors
    /// [`ConfigError::Policy`] naming a tier given twice.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Tiers};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let q = || KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1).unwrap()).unwrap());
    /// assert!(Tiers::builder("a", q()).tier("a", q()).build().is_err());
    /// ```
    pub fn build(self) -> Result<Tiers, ConfigError> {
        let mut tiers: Vec<Tier> = Vec::with_capacity(self.tiers.len());
        let mut first_quota = 0;
        for (name, backend) in self.tiers {
            if tiers.iter().any(|t| t.name == name) {
                return Err(ConfigError::Policy {
                    policy: name.to_string(),
                    problem: "this tier is given twice".to_owned(),
                });
            }
            let count = backend.quota_count();
            tiers.push(Tier {
                name,
                backend,
                first_quota,
            });
            first_quota += count;
        }
        Ok(Tiers {
            inner: Arc::new(Inner {
                tiers,
                assigned: RwLock::new(HashMap::new()),
                classify: self.classify,
            }),
        })
    }
}

/// A tier name that no tier has (from [`Tiers::assign`]).
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Tiers, UnknownTier};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let tiers = Tiers::builder("free", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1)?)?)).build()?;
/// assert_eq!(tiers.assign(Key::from("k"), "gold"), Err(UnknownTier("gold".into())));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no tier is named {0:?}")]
pub struct UnknownTier(pub String);

impl Tiers {
    /// A builder whose default tier is `name` over `backend`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, Tiers};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let tiers = Tiers::builder("free", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10)?)?))
    ///     .build()?;
    /// assert_eq!(tiers.tier_of(&Key::from("anyone")), "free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(name: impl Into<String>, backend: impl CheckBackend) -> TiersBuilder {
        TiersBuilder {
            tiers: vec![(name.into().into(), Arc::new(backend))],
            classify: None,
        }
    }

    /// Puts `key` in tier `tier` from now on.
    ///
    /// # Errors
    /// [`UnknownTier`] if no tier has that name (nothing changes).
    ///
    /// # Examples
    /// ```
    /// # use tollgate::tower::{Key, Tiers};
    /// # use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # let tiers = Tiers::builder("free", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10)?)?)).build()?;
    /// assert!(tiers.assign(Key::from("k"), "gold").is_err());
    /// tiers.assign(Key::from("k"), "free")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn assign(&self, key: Key, tier: &str) -> Result<(), UnknownTier> {
        let index = self
            .index(tier)
            .ok_or_else(|| UnknownTier(tier.to_owned()))?;
        self.inner.assigned.write().insert(key, index);
        Ok(())
    }

    /// Takes `key` out of the map: the closure, else the default tier, decides again.
    ///
    /// # Examples
    /// ```
    /// # use tollgate::tower::{Key, Tiers};
    /// # use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # let q = |n| -> Result<_, tollgate::QuotaError> { Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?)) };
    /// let tiers = Tiers::builder("free", q(10)?).tier("pro", q(100)?).build()?;
    /// tiers.assign(Key::from("k"), "pro")?;
    /// tiers.unassign(&Key::from("k"));
    /// assert_eq!(tiers.tier_of(&Key::from("k")), "free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unassign(&self, key: &Key) {
        self.inner.assigned.write().remove(key);
    }

    /// The name of `key`'s tier now.
    ///
    /// # Examples
    /// ```
    /// # use std::sync::Arc;
    /// # use tollgate::tower::{Key, Tiers};
    /// # use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # let q = |n| -> Result<_, tollgate::QuotaError> { Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?)) };
    /// let tiers = Tiers::builder("free", q(10)?)
    ///     .tier("pro", q(100)?)
    ///     .classify(|key| key.to_string().starts_with("pro_").then(|| Arc::from("pro")))
    ///     .build()?;
    /// assert_eq!(tiers.tier_of(&Key::from("pro_123")), "pro");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tier_of(&self, key: &Key) -> &str {
        &self.inner.tiers[self.find(key)].name
    }

    /// The tier names, the default first.
    ///
    /// # Examples
    /// ```
    /// # use tollgate::tower::{Key, Tiers};
    /// # use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # let q = |n| -> Result<_, tollgate::QuotaError> { Ok(KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(n)?)?)) };
    /// let tiers = Tiers::builder("free", q(10)?).tier("pro", q(100)?).build()?;
    /// assert_eq!(tiers.names().collect::<Vec<_>>(), ["free", "pro"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.tiers.iter().map(|t| &*t.name)
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.inner.tiers.iter().position(|t| &*t.name == name)
    }

    /// The index of `key`'s tier (the default, 0, when nothing says otherwise).
    fn find(&self, key: &Key) -> usize {
        if let Some(&index) = self.inner.assigned.read().get(key) {
            return index;
        }
        self.inner
            .classify
            .as_ref()
            .and_then(|f| f(key))
            .and_then(|name| self.index(&name))
            .unwrap_or(0)
    }
}

impl CheckBackend for Tiers {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        let tier = &self.inner.tiers[self.find(key)];
        tier.backend.check(key, cost).offset_quota(tier.first_quota)
    }

    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let tier = &self.inner.tiers[self.find(key)];
        let decided = tier.backend.check_now(key, cost)?;
        Some(decided.map(|v| v.offset_quota(tier.first_quota)))
    }

    fn reserve(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        let tier = &self.inner.tiers[self.find(key)];
        let reserved = tier.backend.reserve(key, cost)?;
        Some(reserved.map(|v| v.offset_quota(tier.first_quota)))
    }

    fn quota_count(&self) -> usize {
        self.inner
            .tiers
            .last()
            .map_or(0, |t| t.first_quota + t.backend.quota_count())
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        let tier = self
            .inner
            .tiers
            .iter()
            .rev()
            .find(|t| t.first_quota <= index)?;
        tier.backend.quota(index - tier.first_quota)
    }

    fn can_refund(&self) -> bool {
        self.inner.tiers.iter().all(|t| t.backend.can_refund())
    }

    /// The keys held by every tier together (`None` if a tier does not know).
    fn keys_held(&self) -> Option<usize> {
        self.inner.tiers.iter().map(|t| t.backend.keys_held()).sum()
    }

    /// Degraded if any tier is.
    fn degraded(&self) -> Option<bool> {
        self.inner
            .tiers
            .iter()
            .filter_map(|t| t.backend.degraded())
            .reduce(|a, b| a || b)
    }

    /// Refunds in the key's tier now (a key moved between its check and its refund is
    /// refunded in its new tier).
    fn refund(&self, key: &Key, cost: u64) -> Option<Verdict> {
        self.inner.tiers[self.find(key)].backend.refund(key, cost)
    }

    /// [`Tiers::refund`], in the key's tier now, with what its decision charged.
    fn refund_decided(&self, key: &Key, cost: u64, decided: &crate::Decision) -> Option<Verdict> {
        let tier = &self.inner.tiers[self.find(key)];
        tier.backend.refund_decided(key, cost, decided)
    }
}
