//! The Redis tier as a layer backend (features `tower` and `redis`): a policy's limit held
//! globally, across every server of a fleet.

use crate::redis::{
    GuardedLimiter, LeasedLimiter, RedisConnection, RedisLimiter, RedisMultiLimiter, RedisRule,
    TierError,
};
use crate::Decision;

use super::backend::{CheckBackend, CheckError, CheckFuture, QuotaInfo, Verdict};
use super::key::Key;

/// A Redis limiter as a [`CheckBackend`]: [`RedisLimiter`] (exact: one script call a
/// request), [`GuardedLimiter`] (exact behind a circuit breaker and a failure policy) or
/// [`LeasedLimiter`] (this node spends units leased from Redis; no network on the request
/// path).
///
/// Moving a policy from one node to the whole fleet changes only its backend:
/// `Policy::new("api", per_node)` becomes `Policy::new("api", RedisBackend::new(global))`.
/// The limit and window the rate-limit headers show are read from the limiter's
/// [`RedisRule`] (every rule of a [`RedisMultiLimiter`]), so they are always those it decides by.
///
/// Keys are sent to Redis in an injective text form (see [`redis_key`]): an IP key is its
/// address, so all nodes count one client under one Redis key. A [`LeasedLimiter`] keeps its
/// leases under the same bytes: `limiter.held(redis_key(&key))` reads the lease the layer
/// spends for `key`, and [`RedisBackend::prefetch`] fetches one. Two policies on the same keys
/// must not share state: give each its own limiter prefix
/// ([`RedisLimiterBuilder::prefix`](crate::redis::RedisLimiterBuilder::prefix)), as
/// `PolicyConfig::redis` does (`tollgate:NAME`).
///
/// Errors: a cost above the capacity is [`CheckError::Limit`] (a 429 that can never be
/// admitted), any other Redis error [`CheckError::Backend`] (the layer's
/// [`on_error`](super::RateLimitLayerBuilder::on_error) fallback). A [`GuardedLimiter`]
/// absorbs transient failures by its failure policy, so only fatal errors reach the layer.
///
/// # Examples
/// ```no_run
/// use tollgate::redis::{FailureHandling, FailurePolicy, RedisLimiter, RedisRule};
/// use tollgate::tower::{Policy, RateLimitLayer, RedisBackend};
/// use tollgate::Quota;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let quota = Quota::per_second(10)?.with_burst(20)?;
/// let global = RedisLimiter::connect("redis://127.0.0.1:6379", RedisRule::gcra(quota)?)
///     .await?
///     .guarded(FailureHandling::new(FailurePolicy::Local))
///     .await;
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", RedisBackend::new(global)).path_prefix("/api/"))
///     .build()?;
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisBackend<L> {
    limiter: L,
}

impl<L> RedisBackend<L> {
    /// `limiter` as a layer backend: a [`RedisLimiter`], [`RedisMultiLimiter`],
    /// [`GuardedLimiter`] or [`LeasedLimiter`] (each is a [`CheckBackend`] inside
    /// `RedisBackend`). The quotas the headers show are its rules'.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::redis::{RedisLimiter, RedisRule};
    /// use tollgate::tower::{CheckBackend, QuotaInfo, RedisBackend};
    /// use tollgate::Quota;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_minute(100)?)?;
    /// let exact = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
    /// let backend = RedisBackend::new(exact);
    /// // What `RateLimit-Policy` shows: the rule's limit and window.
    /// let window = std::time::Duration::from_secs(60);
    /// assert_eq!(backend.quota(0), Some(QuotaInfo { limit: 100, window }));
    /// # Ok(()) }
    /// ```
    pub fn new(limiter: L) -> Self {
        RedisBackend { limiter }
    }

    /// The limiter (to read its mode, its statistics, or to close it).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # use tollgate::tower::RedisBackend;
    /// # fn demo(backend: &RedisBackend<GuardedLimiter>) {
    /// println!("{:?}", backend.limiter().mode());
    /// # }
    /// ```
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

/// The bytes a [`Key`] is stored under in Redis, and the key a [`LeasedLimiter`] behind the
/// layer keeps its lease under: an injective, readable encoding, each part
/// written `TAG LEN:VALUE` (`i` an IP key as its address, `t` text, `b` bytes; `c` a composite,
/// `LEN` its number of parts, then the parts). For example `Key::Ip(203.0.113.7)` is
/// `i11:203.0.113.7`, and `[path, ip]` is `c2:t4:/api i9:192.0.2.1` without the space.
///
/// # Examples
/// ```
/// use tollgate::tower::{redis_key, Key};
/// let ip: std::net::IpAddr = "203.0.113.7".parse()?;
/// assert_eq!(redis_key(&Key::from(ip)), b"i11:203.0.113.7");
/// let both = Key::Composite(vec![Key::from("/api"), Key::from(ip)].into());
/// assert_eq!(redis_key(&both), b"c2:t4:/apii11:203.0.113.7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn redis_key(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    encode(key, &mut out);
    out
}

fn encode(key: &Key, out: &mut Vec<u8>) {
    let part = |tag: u8, bytes: &[u8], out: &mut Vec<u8>| {
        out.push(tag);
        out.extend_from_slice(bytes.len().to_string().as_bytes());
        out.push(b':');
        out.extend_from_slice(bytes);
    };
    match key {
        Key::Ip(ip) => part(b'i', ip.to_string().as_bytes(), out),
        Key::Text(text) => part(b't', text.as_bytes(), out),
        Key::Bytes(bytes) => part(b'b', bytes, out),
        Key::Composite(parts) => {
            out.push(b'c');
            out.extend_from_slice(parts.len().to_string().as_bytes());
            out.push(b':');
            for p in parts.iter() {
                encode(p, out);
            }
        }
    }
}

impl<C: RedisConnection> RedisBackend<LeasedLimiter<C>> {
    /// Makes sure this node holds a lease of the layer's key `key` (stored in Redis as
    /// [`redis_key`]`(key)`, the key the layer checks): [`LeasedLimiter::prefetch`] under the
    /// layer's encoding. For keys known before their first request (a tenant's, at start).
    ///
    /// # Errors
    /// As for [`LeasedLimiter::prefetch`].
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule};
    /// use tollgate::tower::{Key, RedisBackend};
    /// use tollgate::Quota;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_minute(100)?)?;
    /// let leased = RedisLimiter::connect("redis://127.0.0.1:6379", rule)
    ///     .await?
    ///     .leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local).assumed_nodes(3))
    ///     .await?;
    /// let backend = RedisBackend::new(leased);
    /// backend.prefetch(&Key::from("tenant-7")).await?;
    /// // The same lease as the limiter's own, under the layer's encoding of the key.
    /// let bytes = tollgate::tower::redis_key(&Key::from("tenant-7"));
    /// assert!(backend.limiter().held(bytes) > 0);
    /// # Ok(()) }
    /// ```
    pub async fn prefetch(&self, key: &Key) -> Result<(), TierError> {
        self.limiter.prefetch(redis_key(key)).await
    }
}

impl<C> RedisBackend<RedisMultiLimiter<C>> {
    /// A limiter of several limits (all or nothing) as a layer backend; the quotas the headers
    /// show are its rules'. The same as [`RedisBackend::new`], named for what it decides.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::redis::{RedisLimiter, RedisRule};
    /// use tollgate::tower::{Policy, RedisBackend};
    /// use tollgate::Quota;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", RedisRule::gcra(Quota::per_second(10)?)?)
    ///     .await?
    ///     .with_rules([RedisRule::gcra(Quota::per_hour(1000)?)?])?;
    /// let policy = Policy::new("api", RedisBackend::all_of(limiter));
    /// # let _ = policy;
    /// # Ok(()) }
    /// ```
    pub fn all_of(limiter: RedisMultiLimiter<C>) -> Self {
        Self::new(limiter)
    }
}

/// What the headers show of `rule`: its limit and window, read where it decides by them.
fn quota_of(rule: &RedisRule) -> QuotaInfo {
    QuotaInfo {
        limit: rule.limit(),
        window: rule.window(),
    }
}

/// `rule`'s quota at `index` for a backend of that one rule.
fn one_quota(rule: RedisRule, index: usize) -> Option<QuotaInfo> {
    (index == 0).then(|| quota_of(&rule))
}

fn verdict(result: Result<Decision, TierError>) -> Result<Verdict, CheckError> {
    indexed(result.map(|decision| (decision, 0)))
}

fn indexed(result: Result<(Decision, usize), TierError>) -> Result<Verdict, CheckError> {
    match result {
        Ok((decision, quota)) => Ok(Verdict { decision, quota }),
        Err(e) => Err(match e.as_capacity_exceeded() {
            Some(limit) => CheckError::Limit(limit),
            None => CheckError::Backend(Box::new(e)),
        }),
    }
}

/// Exact: one atomic script call on Redis a request.
impl<C: RedisConnection> CheckBackend for RedisBackend<RedisLimiter<C>> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckFuture::boxed(async move { verdict(self.limiter.check_n(redis_key(key), cost).await) })
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        one_quota(self.limiter.rule(), index)
    }
}

/// Exact, several limits all or nothing: one script call a request decides every limit.
impl<C: RedisConnection> CheckBackend for RedisBackend<RedisMultiLimiter<C>> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckFuture::boxed(async move {
            indexed(
                self.limiter
                    .check_indexed(&redis_key(key), cost, None)
                    .await,
            )
        })
    }

    fn quota_count(&self) -> usize {
        self.limiter.rules().len()
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        self.limiter.rules().get(index).map(quota_of)
    }
}

/// Exact behind a circuit breaker: while Redis fails, the limiter's failure policy decides.
impl<C: RedisConnection> CheckBackend for RedisBackend<GuardedLimiter<C>> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckFuture::boxed(async move { verdict(self.limiter.check_n(redis_key(key), cost).await) })
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        one_quota(self.limiter.exact().rule(), index)
    }

    fn degraded(&self) -> Option<bool> {
        Some(self.limiter.mode() != crate::redis::GuardMode::Global)
    }
}

/// Leased: decided at once from this node's lease, with no network call, while it holds
/// units; a request it cannot serve only for how leases are kept (the key's first request on
/// this node, after a deploy or once its lease went idle, or a lease emptied by a breaker
/// flap) waits for the grant, at most twice the limiter's call timeout
/// ([`LeasedLimiter::check_n_waiting`]). A key whose budget is spent is refused at once.
impl<C: RedisConnection> CheckBackend for RedisBackend<LeasedLimiter<C>> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        let bytes = redis_key(key);
        match self.limiter.check_n(&bytes, cost) {
            // The common case, without a boxed future.
            Ok(decision) if decision.allowed() => CheckFuture::ready(verdict(Ok(decision))),
            Err(error) => CheckFuture::ready(verdict(Err(error))),
            // Decided again by the waiting check: it asks the lease again before it waits.
            Ok(_) => CheckFuture::boxed(async move {
                verdict(self.limiter.check_n_waiting(&bytes, cost).await)
            }),
        }
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        one_quota(self.limiter.rule(), index)
    }

    fn degraded(&self) -> Option<bool> {
        Some(self.limiter.mode() != crate::redis::GuardMode::Global)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn keys_encode_injectively() {
        let ip: IpAddr = "2001:db8::".parse().unwrap();
        let keys = [
            Key::from(ip),
            Key::from("2001:db8::"),
            Key::Bytes(b"2001:db8::"[..].into()),
            Key::Composite(vec![Key::from("a"), Key::from("b")].into()),
            Key::Composite(vec![Key::from("ab")].into()),
            Key::Composite(vec![Key::from("a|b")].into()),
            Key::from("a|b"),
            Key::Composite(
                vec![Key::Composite(vec![Key::from("a")].into()), Key::from("b")].into(),
            ),
            Key::Composite(vec![].into()),
            Key::from(""),
        ];
        let encoded: std::collections::HashSet<Vec<u8>> = keys.iter().map(redis_key).collect();
        assert_eq!(encoded.len(), keys.len());
        assert_eq!(redis_key(&Key::from(ip)), b"i10:2001:db8::");
    }
}
