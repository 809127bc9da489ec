//! Several limits on one key, on Redis, all or nothing: one script call decides them together.

use std::sync::Arc;

use redis::cluster_routing::Slot;

use super::{clock_unit, ours, rows, RedisConnection, RedisLimiter};
use crate::decision::Decision;
use crate::redis::error::TierError;
use crate::redis::rule::{RedisRule, RuleError};
use crate::redis::scripts::ScriptCall;

/// Several limits on every key, held on Redis, all or nothing: a request is admitted only if
/// every limit admits it, and a request one limit refuses is charged to none (for example 10 a
/// second and 1,000 an hour). The Redis counterpart of [`MultiLimiter`](crate::MultiLimiter),
/// and it decides as it does: the same requests at the same times get the same decisions.
///
/// Each check is **one** atomic script call that decides every limit and writes only if all
/// admit, so no concurrent check, on any node, can slip between the limits: unlike
/// `MultiLimiter` (peek, then charge, then refund on a race) there is no window where one limit
/// is charged and another is not.
///
/// The decision reported is the first refusing limit's (in the order of the rules), or when
/// all admit, the one with the least remaining (the first of those on a tie).
///
/// Built from a [`RedisLimiter`] by [`RedisLimiter::with_rules`]: its connection, prefix and
/// timeout serve every limit, its rule is the first limit. The rules must be of one algorithm
/// (one script decides them). The first limit's state is the limiter's own key
/// (`<prefix>:<algorithm>:{<key>}`), so a limiter that gains rules keeps its state; limit `i ≥ 1`
/// is kept under that key followed by `:<i>`, in the same Cluster slot. Checks are not
/// coalesced.
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let per_second = RedisRule::gcra(Quota::per_second(10)?)?;
/// let per_hour = RedisRule::gcra(Quota::per_hour(1000)?)?;
/// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", per_second)
///     .await?
///     .with_rules([per_hour])?;
/// if !limiter.check("tenant-42").await?.allowed() {
///     // 429: one of the two limits refused, and neither was charged.
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisMultiLimiter<C = redis::aio::ConnectionManager> {
    /// The connection, prefix and timeout; its rule is `rules[0]`.
    limiter: RedisLimiter<C>,
    rules: Arc<[RedisRule]>,
}

impl<C> std::fmt::Debug for RedisMultiLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisMultiLimiter")
            .field("rules", &self.rules)
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<C> RedisLimiter<C> {
    /// This limiter with `more` limits on every key, all or nothing: see
    /// [`RedisMultiLimiter`]. Its own rule stays the first limit, and keeps its state.
    ///
    /// # Errors
    /// [`RuleError::MixedAlgorithms`] if a rule is of another algorithm than this limiter's.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     RedisRule::fixed_window(Quota::per_minute(100)?)?,
    /// )
    /// .await?
    /// .with_rules([RedisRule::fixed_window(Quota::per_hour(1000)?)?])?;
    /// assert_eq!(limiter.rules().len(), 2);
    /// // One algorithm for all: a GCRA rule beside fixed windows is refused.
    /// # Ok(()) }
    /// ```
    pub fn with_rules(
        self,
        more: impl IntoIterator<Item = RedisRule>,
    ) -> Result<RedisMultiLimiter<C>, RuleError> {
        let first = self.rule;
        let rules: Vec<RedisRule> = std::iter::once(first).chain(more).collect();
        if let Some(other) = rules.iter().find(|r| r.name() != first.name()) {
            return Err(RuleError::MixedAlgorithms {
                first: first.name(),
                other: other.name(),
            });
        }
        Ok(RedisMultiLimiter {
            limiter: self,
            rules: rules.into(),
        })
    }
}

impl<C> RedisMultiLimiter<C> {
    /// The limits, in the order they are decided.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisMultiLimiter;
    /// # fn demo(limiter: RedisMultiLimiter) {
    /// for rule in limiter.rules() {
    ///     println!("{} per window", rule.limit());
    /// }
    /// # }
    /// ```
    pub fn rules(&self) -> &[RedisRule] {
        &self.rules
    }

    /// The limiter whose connection, prefix and timeout this one uses (its rule is the first).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisMultiLimiter;
    /// # fn demo(limiter: RedisMultiLimiter) {
    /// println!("{:?}", limiter.limiter().timeout());
    /// # }
    /// ```
    pub fn limiter(&self) -> &RedisLimiter<C> {
        &self.limiter
    }

    /// The Redis key holding limit `index`'s state for `key` (see [`RedisMultiLimiter`]), or
    /// `None` past the last limit.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisMultiLimiter;
    /// # fn demo(limiter: RedisMultiLimiter) {
    /// assert_eq!(limiter.redis_key(0, "alice"), Some(b"tollgate:gcra:{alice}".to_vec()));
    /// assert_eq!(limiter.redis_key(1, "alice"), Some(b"tollgate:gcra:{alice}:1".to_vec()));
    /// # }
    /// ```
    pub fn redis_key(&self, index: usize, key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        (index < self.rules.len()).then(|| limit_key(self.limiter.redis_key(key), index))
    }
}

impl<C: RedisConnection> RedisMultiLimiter<C> {
    /// Decides a request of cost 1 for `key` now against every limit; counts it in all of
    /// them if all admit, in none otherwise.
    ///
    /// # Errors
    /// As for [`RedisMultiLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisMultiLimiter;
    /// # async fn demo(limiter: RedisMultiLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let d = limiter.check("203.0.113.7").await?;
    /// println!("allowed={} remaining={}", d.allowed(), d.remaining());
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, TierError> {
        self.check_n(key, 1).await
    }

    /// Decides a request of cost `cost` for `key` now against every limit; counts it in all of
    /// them if all admit, in none otherwise.
    ///
    /// # Errors
    /// [`TierError::Capacity`] when a limit can never admit the cost (nothing is sent);
    /// [`TierError::NoHashTag`] on a Cluster for an empty key (its
    /// limits' states would not share a slot); otherwise a transient or fatal [`TierError`].
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::RedisMultiLimiter;
    /// # async fn demo(limiter: RedisMultiLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let export = limiter.check_n("tenant-7", 5).await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, TierError> {
        self.check_indexed(key.as_ref(), cost, None)
            .await
            .map(|(decision, _)| decision)
    }

    /// [`RedisMultiLimiter::check_n`] at the injected time `at_nanos` (see
    /// [`RedisLimiter::check_n_at`]).
    #[cfg(test)]
    pub(crate) async fn check_n_at(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        at_nanos: u64,
    ) -> Result<Decision, TierError> {
        self.check_indexed(key.as_ref(), cost, Some(at_nanos))
            .await
            .map(|(decision, _)| decision)
    }

    /// The decision, and the index of the limit it is about.
    pub(crate) async fn check_indexed(
        &self,
        key: &[u8],
        cost: u64,
        at: Option<u64>,
    ) -> Result<(Decision, usize), TierError> {
        for rule in self.rules.iter() {
            if cost > rule.capacity() {
                return Err(TierError::Capacity {
                    cost,
                    capacity: rule.capacity(),
                });
            }
        }
        let base = self.limiter.redis_key(key);
        let keys: Vec<Vec<u8>> = (0..self.rules.len())
            .map(|i| limit_key(base.clone(), i))
            .collect();
        if C::CLUSTERED
            && keys
                .iter()
                .any(|k| Slot::for_key(k) != Slot::for_key(&keys[0]))
        {
            return Err(TierError::NoHashTag {
                key: String::from_utf8_lossy(key).into_owned(),
            });
        }
        let limiter = &self.limiter;
        let mut invocation = ScriptCall::new(self.rules[0].script());
        let min_ttl = if at.is_some() {
            super::INJECTED_MIN_TTL_MS
        } else {
            0
        };
        // Mode '2': all or nothing, each item with its own rule's parameters (ARGV[3], ARGV[4]
        // are then unused).
        invocation.arg(min_ttl).arg("2").arg("").arg("");
        for (rule, redis_key) in self.rules.iter().zip(&keys) {
            let [first, second] = rule.script_params();
            invocation.key(&redis_key[..]).arg(cost);
            match at {
                Some(at) => invocation.arg(at),
                None => invocation.arg(""),
            };
            invocation.arg(first).arg(second);
        }
        let reply = limiter.invoke(&invocation, true).await?;
        let rows = rows(reply, keys.len())?;
        let unit = clock_unit(at.is_some());
        // A foreign value in any limit's key fails the check (nothing was written).
        for ((rule, row), redis_key) in self.rules.iter().zip(&rows).zip(&keys) {
            ours(*rule, row, redis_key)?;
        }
        let mut tightest: Option<(Decision, usize)> = None;
        for (index, (rule, row)) in self.rules.iter().zip(&rows).enumerate() {
            let decision = rule.decision(cost, row, unit)?;
            if !decision.allowed() {
                // The script wrote nothing: the first refusal is the answer.
                return Ok((decision, index));
            }
            if tightest
                .as_ref()
                .is_none_or(|(t, _)| decision.remaining() < t.remaining())
            {
                tightest = Some((decision, index));
            }
        }
        tightest.ok_or_else(|| TierError::bad_reply("no limit decided".into()))
    }
}

/// The Redis key of limit `index`, from the limiter's own key of the user key (`base`): `base`
/// itself for the first limit, `base:<index>` after it (the same hash tag, so the same slot).
fn limit_key(mut base: Vec<u8>, index: usize) -> Vec<u8> {
    if index > 0 {
        base.push(b':');
        base.extend_from_slice(index.to_string().as_bytes());
    }
    base
}
