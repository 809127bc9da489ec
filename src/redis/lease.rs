//! The leased tier: synchronous checks on local atomics (a map lookup and a compare-and-swap),
//! against a global budget that Redis grants in leases.
//!
//! # How it works
//! Each node holds, per key, a **lease**: units that Redis granted it atomically out of the
//! key's global state, the very state the exact tier keeps (one Lua script grants
//! `min(requested, what the state still admits now)` and counts the grant as admitted). A check
//! takes units from the lease with one compare-and-swap on an `AtomicU64`; it never touches the
//! network. When a lease falls below its low-water mark (half its target size, and at least
//! what the key spends during two of the slowest recent refills), the check spawns a refill on the tokio runtime, so the next units arrive before the last ones are
//! spent. A lease's target size follows the key's observed rate (smoothed over refills): enough
//! for [`LeaseConfig::horizon`] of recent demand (50 ms by default) and for four of the
//! slowest recent refills, at most
//! [`LeaseConfig::max_lease`] (by default 1/16 of the capacity). Every lease expires: a window
//! lease at its window's end, a GCRA lease one horizon (and one `T`) after its units' slots in
//! the bucket, decaying by a unit per `T` before that. Unused units go back to Redis when the
//! key goes idle ([`LeaseConfig::idle_timeout`]), when a sliding window's lease expires, and on
//! [`LeasedLimiter::release_all`] (for GCRA, while nothing was admitted behind them).
//!
//! A key a node holds no lease of is denied by `check` until its first grant arrives, by
//! default; [`LeasedLimiter::check_waiting`] waits for that grant instead (within twice the
//! call timeout). With a first-touch allowance ([`LeaseConfig::first_touch`]), its lease
//! starts with that many provisional units while the grant is in flight, so that its first
//! checks are not denied for want of a lease; the grant covers them, or the units it did not
//! cover are charged to Redis at once. A lease retired while its key's state was not full
//! leaves what it knew of the key to the key's next lease (no allowance, the same backoff)
//! until the state is expected full again.
//!
//! The guarantee, the under-admission bound and what first touches add to them are
//! documented on [`LeasedLimiter`].
//!
//! # Failures
//! The leased tier shares the exact tier's circuit breaker and [`FailurePolicy`] (on a
//! Cluster, a breaker per slot owner, and the handover below per owner: only the leases of
//! the failed master's keys are handed over, the others are kept and used): transient
//! failures of refills (and of heartbeats) count toward opening it (see "The breaker" on
//! [`FailureHandling`](super::FailureHandling)); until it opens, a lease whose refill failed
//! backs off a probe interval, and what it cannot serve of its key is decided by the policy
//! (as a guarded check whose call failed), until one of its refills succeeds.
//! - `Local` and `FailOpen`: the first check that sees the breaker open hands every lease over
//!   to the policy (on a Cluster, every lease of that breaker's master's keys), once per
//!   outage. With `Local`, each key's in-process share
//!   (`L ÷ live nodes`) starts from the units its lease held plus this node's part of what the
//!   global state could still grant at its last grant, not from a full bucket (with
//!   `FailOpen` the leases keep their units, until they expire). From then on every check
//!   goes straight to the policy: no lease, no lock, no task.
//! - `FailClosed`: the node keeps spending what its leases hold (granted units), then denies.
//!
//! No refill is asked for while the breaker is open: the breaker's probe alone looks for
//! Redis; once it closes the breaker, checks go back to the leases, which ask for grants
//! again. The bound is on [`LeasedLimiter`] ("When Redis fails").
//!
//! [`FailurePolicy`]: super::FailurePolicy

mod cell;
mod config;
mod first_touch;
mod grant;
mod refill;
mod route;
mod routes;
mod scheduler;
mod sweep;
mod takeover;
mod word;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

pub use self::config::{LeaseConfig, LeaseError, LeaseStats};
pub use self::word::MAX_LEASE;

use self::cell::Lease;
use self::config::Terms;
use self::grant::accrued;
use self::route::Way;
use self::routes::RouteOf;
use self::scheduler::{Node, Tasks};
use self::word::{units_of, MS};
use super::error::TierError;
use super::exact::{Algo, RedisConnection, RedisLimiter};
use super::guard::{BreakerState, FailureHandling, GuardMode};
use super::rule::{Kind, RedisRule};
use crate::clock::{Clock, Nanos};
use crate::decision::{Decision, Remaining};

/// A global rate limiter whose checks are synchronous and local: one lookup and one
/// compare-and-swap on this node's lease of the key, never a network call. Built by
/// [`RedisLimiter::leased`].
///
#[doc = include_str!("lease/bound.md")]
///
/// # Sharing
/// Cheap to clone; clones share the leases. A background task returns idle leases; it stops
/// when the last clone is dropped (call [`LeasedLimiter::release_all`] first to give the
/// units back at once).
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let rule = RedisRule::fixed_window(Quota::per_second(100_000)?)?;
/// let exact = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
/// let limiter = exact
///     .leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local))
///     .await?;
/// limiter.prefetch("tenant-7").await?; // optional: the first check finds units
/// if limiter.check("tenant-7")?.allowed() { /* serve */ }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeasedLimiter<C: RedisConnection = ConnectionManager> {
    node: Arc<Node<C>>,
    _tasks: Arc<Tasks>,
}

impl<C: RedisConnection> std::fmt::Debug for LeasedLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("rule", &self.node.terms.rule)
            .field("config", &self.node.terms.config)
            .field("mode", &self.mode())
            .field("keys", &self.node.leases.len())
            .finish_non_exhaustive()
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// A leased limiter on this limiter's connection, rule and key prefix, behind a circuit
    /// breaker with `handling` (as [`RedisLimiter::guarded`]). Leased and exact nodes with
    /// the same rule and prefix share each key's budget.
    ///
    /// # Errors
    /// [`LeaseError::Unsupported`] for the leaky bucket as a queue and the sliding log;
    /// [`LeaseError::NoRuntime`] outside a tokio runtime.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter};
    /// # async fn demo(exact: RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let leased = exact
    ///     .leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::FailClosed))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn leased(
        self,
        config: LeaseConfig,
        handling: FailureHandling,
    ) -> Result<LeasedLimiter<C>, LeaseError> {
        let rule = self.rule();
        let algo = match rule.kind {
            Kind::Gcra {
                interval,
                span,
                queue: false,
                ..
            } => Algo::Gcra { interval, span },
            Kind::FixedWindow { window } => Algo::Fixed { window },
            Kind::SlidingWindow { window } => Algo::Sliding { window },
            Kind::Gcra { queue: true, .. } | Kind::SlidingLog { .. } => {
                return Err(LeaseError::Unsupported {
                    algorithm: rule.name(),
                })
            }
        };
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LeaseError::NoRuntime)?;
        let guard = self.clone().guarded(handling).await;
        let terms = Terms {
            max_lease: config.max_lease_for(rule.capacity()),
            rule,
            algo,
            config,
        };
        let (node, tasks) = Node::start(self, guard, terms, runtime);
        Ok(LeasedLimiter {
            node,
            _tasks: Arc::new(tasks),
        })
    }
}

/// # Checking
impl<C: RedisConnection> LeasedLimiter<C> {
    /// Decides a request of cost 1 for `key` from this node's lease (see
    /// [`LeasedLimiter::check_n`]).
    ///
    /// # Errors
    /// As for [`LeasedLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let allowed = limiter.check("alice")?.allowed();
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, TierError> {
        self.check_n(key, 1)
    }

    /// Decides a request of cost `cost` for `key`, synchronously: one lookup and one
    /// compare-and-swap on the key's lease, never a network call.
    ///
    /// - The lease holds `cost` units: allowed.
    /// - It does not: a refill is requested, and the check is denied, with `retry_after` the
    ///   time until the global state is expected to grant again (1 ms while a refill is in
    ///   flight).
    /// - While the breaker is open (Redis unreachable), the failure policy decides every check
    ///   at once (`Local`: from the state the leases were handed over in, see "When Redis
    ///   fails" on [`LeasedLimiter`]); with `FailClosed`, after what the lease still holds.
    /// - A key this node holds no lease of (its *first touch*) gets the first-touch
    ///   allowance ([`LeaseConfig::first_touch`], 0 by default: denied) as a provisional lease
    ///   while its first grant is requested at once: with an allowance, the first checks are
    ///   not denied for want of a lease.
    ///   See "First touch" on [`LeasedLimiter`] for what that does to the global bound.
    ///   [`LeasedLimiter::check_n_waiting`] waits for the grant instead of denying.
    ///
    /// The figures are the best this node knows without asking Redis, from the global state
    /// as its last grant of the key saw it (the server's answer, the decision rules' formulas):
    /// - `remaining` = the units this node still holds for the key **+** what the global state
    ///   could still grant at that grant (units held in any node's lease count as spent there)
    ///   **+**, for GCRA, the units refilled since (one per `T`), at most the capacity. It
    ///   does not see what other nodes spent since that grant, so it can exceed the truth by
    ///   that much; it is never below what this node can admit on its own. Denied: 0.
    /// - `reset_after` = the global state's `reset_after` at that grant (the wait until it is
    ///   back to full capacity, counting units held in leases as spent, so an upper estimate
    ///   for this node's share), less the time since. 0 before the key's first grant.
    ///
    /// Both are refreshed at every grant (about every half lease of the key's traffic).
    ///
    /// # Errors
    /// [`TierError::Capacity`] if the cost can never be admitted; a fatal error that the key's
    /// last refill met (a key of the wrong type, …), until a refill succeeds again.
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let d = limiter.check_n("tenant-7", 5)?;
    /// if !d.allowed() {
    ///     println!("retry after {:?}", d.retry_after());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, TierError> {
        let key = key.as_ref();
        let node = &self.node;
        // Degraded: straight to the policy, which holds what the leases held (no lease, no
        // clock read of ours, no lock, no task). Only the breaker's probe looks for Redis.
        let route = node.routes.of(&node.guard, key);
        let way = route.way();
        let open = route.open(&node.guard);
        match (way, open) {
            (Way::Policy, true) => return node.guard.fallback(key, cost),
            (Way::Leases, false) => {}
            // Fail closed: what the leases hold is still spent, then the policy denies.
            (Way::Leases, true) if node.guard.spends_leases_first() => {}
            _ => {
                reroute(node, &route, way, open);
                if route.way().to_policy(route.open(&node.guard)) {
                    return node.guard.fallback(key, cost);
                }
            }
        }
        let capacity = node.terms.rule.capacity();
        if cost > capacity {
            return Err(TierError::Capacity { cost, capacity });
        }
        let now = node.clock.now();
        if cost == 0 {
            // SPEC: always allowed, changes nothing.
            let held = self.held(key);
            let lease = node.leases.get(key);
            return Ok(allowed(
                &node.terms,
                lease.as_deref().map(|l| &**l),
                held,
                now,
            ));
        }
        if let Some(lease) = node.leases.get(key) {
            if let Some(left) = lease.hot.word.take(cost, now, node.terms.decay()) {
                if lease.hot.low(left, now) {
                    node.request_refill(&lease);
                }
                return Ok(allowed(&node.terms, Some(&lease), left, now));
            }
            return short(node, &lease, key, cost, now);
        }
        // First touch: the lease starts with this node's provisional allowance (while Redis
        // answers), and its first grant is requested at once.
        let mut created = false;
        let lease = node
            .leases
            .entry(key.into())
            .or_insert_with(|| {
                created = true;
                let allowance = if !route.open(&node.guard) {
                    let capacity = node.terms.rule.capacity();
                    let nodes = node.guard.live_nodes();
                    node.terms.config.first_touch_for(capacity, nodes)
                } else {
                    0
                };
                Arc::new(node.new_lease(key, allowance, now))
            })
            .clone();
        if created {
            node.request_refill(&lease);
        }
        match lease.hot.word.take(cost, now, node.terms.decay()) {
            Some(left) => Ok(allowed(&node.terms, Some(&lease), left, now)),
            None => short(node, &lease, key, cost, now),
        }
    }

    /// Decides a request of cost 1 for `key`, waiting for a grant where the lease alone would
    /// refuse it for want of units it was never given (see [`LeasedLimiter::check_n_waiting`]).
    ///
    /// # Errors
    /// As for [`LeasedLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // The first request of a key on this node: admitted if the key has budget globally.
    /// let allowed = limiter.check_waiting("alice").await?.allowed();
    /// # Ok(()) }
    /// ```
    pub async fn check_waiting(&self, key: impl AsRef<[u8]>) -> Result<Decision, TierError> {
        self.check_n_waiting(key, 1).await
    }

    /// Decides a request of cost `cost` for `key` as [`LeasedLimiter::check_n`] does, except
    /// that a request the lease cannot serve for how leases are kept, not for the key's
    /// budget, waits for the grant instead of being refused: a key this node holds no lease
    /// of (its first touch, after a deploy or once its lease went idle and was given back), a
    /// lease emptied when the breaker opened and closed again, or one a burst drained before
    /// its refill landed. It waits for that refill, at most twice the limiter's call timeout
    /// ([`RedisLimiterBuilder::timeout`](super::RedisLimiterBuilder::timeout), 50 ms by
    /// default: the refill may be queued behind a batch in flight), then decides again from
    /// the lease, or by the failure policy if the refill failed and opened the breaker.
    ///
    /// A key whose last grant was short (its global budget spent: the denial's `retry_after`
    /// is in the future) is decided at once, as by `check_n`, also on a node that gave its
    /// lease back since ([`LeaseConfig::idle_timeout`]): what the key owes outlives the
    /// lease. Admissions are no more than `check_n` allows (the bound on [`LeasedLimiter`]);
    /// only the refusals for want of a lease are gone. Most checks never wait: a lease with
    /// units decides as `check_n` does, with no network call.
    ///
    /// This is the check the tower layer's [`RedisBackend`](crate::tower::RedisBackend)
    /// makes.
    ///
    /// A check, as its name says, not one of the in-process limiters' waits (the
    /// `until_ready` / `acquire` of feature `tokio`): it waits for a grant, never
    /// for the key's budget, with no bound of the caller's, and a spent key is denied. Like
    /// theirs, its form of cost 1 drops the `_n` ([`LeasedLimiter::check_waiting`]).
    ///
    /// # Errors
    /// As for [`LeasedLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let d = limiter.check_n_waiting("tenant-7", 5).await?;
    /// if !d.allowed() {
    ///     // The key's budget is spent (or Redis is down and the failure policy refused).
    ///     println!("retry after {:?}", d.retry_after());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn check_n_waiting(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<Decision, TierError> {
        let key = key.as_ref();
        let decision = self.check_n(key, cost)?;
        if decision.allowed() {
            return Ok(decision);
        }
        let node = &self.node;
        let timeout = node.exact.timeout();
        let route = node.routes.of(&node.guard, key);
        if route.way() == Way::Handing {
            // The breaker opened and another check is handing the leases over: the policy
            // decides once it holds this key's state (a pass over the leases, in memory).
            let until = tokio::time::Instant::now() + timeout;
            while route.way() == Way::Handing && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            return self.check_n(key, cost);
        }
        let Some(lease) = node.leases.get(key).map(|lease| Arc::clone(&lease)) else {
            return Ok(decision);
        };
        if !waits_for(node, &lease) {
            return Ok(decision);
        }
        let notified = lease.refilled.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Read after `enable`: a refill that finished before it is seen here (and its grant
        // is in the word), one that finishes after it wakes the wait.
        if lease.refill.in_flight() {
            // Timed out: the failure policy's business (the refill's failure opens the
            // breaker), decided by the check below.
            // Twice the timeout: the refill may be queued behind a batch already in flight,
            // each call bounded by the timeout.
            let _ = tokio::time::timeout(timeout * 2, notified).await;
        }
        self.check_n(key, cost)
    }

    /// Makes sure this node holds a lease of `key`: requests one and waits for the grant
    /// (within twice the timeout, plus the key's backoff if the global budget was spent).
    /// [`LeasedLimiter::check_n`] denies a key this node has not seen yet until its first grant
    /// arrives; call this ahead where such a check must find units (or check with
    /// [`LeasedLimiter::check_n_waiting`], which waits for the grant). Returns `Ok` also when the
    /// grant was empty (the global budget is spent).
    ///
    /// # Errors
    /// [`TierError::Timeout`] if no grant arrived in time; a fatal error as for
    /// [`LeasedLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// limiter.prefetch("tenant-7").await?;
    /// # Ok(()) }
    /// ```
    pub async fn prefetch(&self, key: impl AsRef<[u8]>) -> Result<(), TierError> {
        let key = key.as_ref();
        let node = &self.node;
        let lease = node
            .leases
            .entry(key.into())
            .or_insert_with(|| Arc::new(node.new_lease(key, 0, node.clock.now())))
            .clone();
        for _ in 0..2 {
            // A refill may first wait out a backoff (the budget was spent, or Redis failed).
            let backoff = lease.bg.lock().not_before.saturating_sub(node.clock.now());
            let timeout = node.exact.timeout() * 2 + Duration::from_nanos(backoff);
            let notified = lease.refilled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            node.request_refill(&lease);
            if tokio::time::timeout(timeout, notified).await.is_err() {
                return Err(TierError::Timeout { timeout });
            }
            if let Some(error) = lease.fatal() {
                return Err(error);
            }
            // A count; a refill that raced this read is picked up by the next loop.
            if units_of(lease.hot.word.load()) > 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Gives every lease's unused units back to Redis now and forgets the leases (for a
    /// graceful shutdown; idle keys are returned by the background task anyway).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) {
    /// limiter.release_all().await;
    /// # }
    /// ```
    pub async fn release_all(&self) {
        let node = &self.node;
        let leases: Vec<Arc<Lease>> = node
            .leases
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        // One batch: a script call per Cluster slot (per 256 keys on a single server).
        let returns: Vec<_> = leases.into_iter().map(|lease| node.retire(lease)).collect();
        node.give_back(&returns).await;
    }
}

/// # Inspection
impl<C: RedisConnection> LeasedLimiter<C> {
    /// Whether Redis answers (`Global`) or the failure policy decides (the breaker is open).
    /// On a Cluster, `Global` while every slot owner's breaker is closed (as
    /// [`GuardedLimiter::mode`](super::GuardedLimiter::mode)); [`mode_of`](Self::mode_of)
    /// tells a key's.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{LeasedLimiter, GuardMode};
    /// # fn demo(limiter: LeasedLimiter) {
    /// if limiter.mode() != GuardMode::Global {
    ///     eprintln!("Redis unreachable: checks decided by the failure policy");
    /// }
    /// # }
    /// ```
    pub fn mode(&self) -> GuardMode {
        self.node.guard.mode()
    }

    /// The mode `key`'s checks are decided in: on a Cluster, its slot owner's breaker's (a
    /// master that fails hands over only its own keys' leases); on a single server,
    /// [`mode`](Self::mode).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{LeasedLimiter, GuardMode};
    /// # fn demo(limiter: LeasedLimiter) {
    /// if limiter.mode_of("alice") == GuardMode::Global {
    ///     // alice's lease is in use: her master answers
    /// }
    /// # }
    /// ```
    pub fn mode_of(&self, key: impl AsRef<[u8]>) -> GuardMode {
        self.node.guard.mode_of(key)
    }

    /// Where the circuit breaker is (see [`GuardedLimiter::breaker`](super::GuardedLimiter::breaker)).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{BreakerState, LeasedLimiter};
    /// # fn demo(limiter: LeasedLimiter) {
    /// if limiter.breaker() == BreakerState::HalfOpen {
    ///     eprintln!("Redis answers probes again; leases come back once it keeps answering");
    /// }
    /// # }
    /// ```
    pub fn breaker(&self) -> BreakerState {
        self.node.guard.breaker()
    }

    /// The rule.
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) {
    /// println!("{} with L = {}", limiter.rule().name(), limiter.rule().limit());
    /// # }
    /// ```
    pub fn rule(&self) -> RedisRule {
        self.node.terms.rule
    }

    /// The largest lease this node takes for one key.
    ///
    /// # Examples
    /// ```no_run
    /// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule}};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let rule = RedisRule::gcra(Quota::per_second(1_600)?)?;
    /// let exact = RedisLimiter::connect("redis://127.0.0.1/", rule).await?;
    /// let limiter = exact.leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local)).await?;
    /// // By default 1/16 of the capacity: with 10 nodes, at most 1,000 units sit unused in leases.
    /// assert_eq!(limiter.max_lease(), 100);
    /// # Ok(()) }
    /// ```
    pub fn max_lease(&self) -> u64 {
        self.node.terms.max_lease
    }

    /// The units this node holds for `key` right now (0 if none or expired), provisional
    /// first-touch units included.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// limiter.prefetch("tenant-7").await?;
    /// // The units the next checks of tenant-7 spend without a network call.
    /// println!("{} units in hand", limiter.held("tenant-7"));
    /// assert!(limiter.held("tenant-7") <= limiter.max_lease());
    /// # Ok(()) }
    /// ```
    pub fn held(&self, key: impl AsRef<[u8]>) -> u64 {
        let node = &self.node;
        node.leases.get(key.as_ref()).map_or(0, |lease| {
            let (now, decay) = (node.clock.now(), node.terms.decay());
            lease.hot.word.held(now, decay) + lease.bg.lock().parked_units(now, decay)
        })
    }

    /// Whether a refill of `key` is queued or in flight on this node. Once it reads `false`,
    /// [`LeasedLimiter::held`] includes everything Redis granted this node for `key`, until a
    /// check asks for the next refill.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) {
    /// let _ = limiter.check("tenant-7");
    /// // In a test: wait for the refill that check may have started, then read the lease.
    /// while limiter.refilling("tenant-7") {
    ///     tokio::task::yield_now().await;
    /// }
    /// println!("{} units in hand", limiter.held("tenant-7"));
    /// # }
    /// ```
    pub fn refilling(&self, key: impl AsRef<[u8]>) -> bool {
        self.node
            .leases
            .get(key.as_ref())
            .is_some_and(|lease| lease.refill.in_flight())
    }

    /// Units the failure policy admitted on this node during an outage (and first-touch units
    /// no grant covered before it) that are not yet charged to Redis: see
    /// [`FailureHandling::reconcile`]. Always 0 unless reconciliation is on.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{LeasedLimiter, GuardMode};
    /// # async fn demo(limiter: LeasedLimiter) {
    /// // After an outage: wait until what was admitted locally is counted in Redis.
    /// while limiter.mode() == GuardMode::Global && limiter.unreconciled() > 0 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    /// }
    /// println!("{} units charged after outages", limiter.reconciled());
    /// # }
    /// ```
    pub fn unreconciled(&self) -> u64 {
        self.node.guard.unreconciled()
    }

    /// Units charged to Redis after outages so far (see [`FailureHandling::reconcile`]; an
    /// example is on [`LeasedLimiter::unreconciled`]).
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) {
    /// println!("{} units admitted during outages were charged", limiter.reconciled());
    /// # }
    /// ```
    pub fn reconciled(&self) -> u64 {
        self.node.guard.reconciled()
    }

    /// The traffic with Redis so far.
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) {
    /// let stats = limiter.stats();
    /// println!("{} grants in {} round trips", stats.refills, stats.round_trips);
    /// # }
    /// ```
    pub fn stats(&self) -> LeaseStats {
        self.node.stats.snapshot()
    }

    /// The exact limiter underneath (same connection, rule and prefix).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // An exact check of the same key's global state (one round trip), e.g. for an audit.
    /// let decision = limiter.exact().check("tenant-7").await?;
    /// println!("{} left globally", decision.remaining());
    /// # Ok(()) }
    /// ```
    pub fn exact(&self) -> &RedisLimiter<C> {
        &self.node.exact
    }
}

/// An allowed decision with `left` units left in this node's lease: its figures are the
/// lease's view of the global state (see [`LeasedLimiter::check_n`]).
#[inline]
fn allowed(terms: &Terms, lease: Option<&Lease>, left: u64, now: Nanos) -> Decision {
    // Relaxed, all three: hints written by one grant's install; a mix of two grants'
    // figures is an estimate as good as either.
    let (view_left, view_at, full_at) = lease.map_or((0, 0, 0), |lease| {
        (
            lease.hot.view_left.load(Ordering::Relaxed),
            lease.hot.view_at.load(Ordering::Relaxed),
            lease.hot.view_full_at.load(Ordering::Relaxed),
        )
    });
    // GCRA refills one unit per T since the grant.
    let accrued = match terms.algo {
        Algo::Gcra { interval, .. } if view_at > 0 => accrued(interval, view_at, now),
        _ => 0,
    };
    Decision {
        allowed: true.into(),
        limit: terms.rule.limit(),
        retry_after: 0,
        reset_after: full_at.saturating_sub(now),
        delay: 0,
        remaining: Remaining::Exact(
            left.saturating_add(view_left)
                .saturating_add(accrued)
                .min(terms.rule.capacity()),
        ),
    }
}

/// A check the lease could not serve.
#[cold]
fn short<C: RedisConnection>(
    node: &Arc<Node<C>>,
    lease: &Arc<Lease>,
    key: &[u8],
    cost: u64,
    now: Nanos,
) -> Result<Decision, TierError> {
    // GCRA: a grant parked behind the units this check found short takes over.
    let decay = node.terms.decay();
    if decay > 0 && lease.unpark(now, decay) {
        if let Some(left) = lease.hot.word.take(cost, now, decay) {
            if lease.hot.low(left, now) {
                node.request_refill(lease);
            }
            return Ok(allowed(&node.terms, Some(lease), left, now));
        }
    }
    // Relaxed: a hint for the next refill's size.
    lease.need.fetch_max(cost, Ordering::Relaxed);
    if let Some(error) = lease.fatal() {
        return Err(error);
    }
    if node.routes.of(&node.guard, key).open(&node.guard) {
        // No refill: only the breaker's probe looks for Redis.
        if node.guard.spends_leases_first() {
            return node.guard.fallback(key, cost);
        }
        // A handover is running (or the breaker opened during this check): the policy does
        // not hold this key's state yet. Denied for a moment; only granted units were spent.
        return Ok(Decision {
            allowed: false.into(),
            limit: node.terms.rule.limit(),
            retry_after: MS,
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(0),
        });
    }
    node.request_refill(lease);
    if lease.unreachable() {
        // Its last refill failed, the breaker not open (yet): decided as a guarded check whose
        // call failed, by the policy, until a refill succeeds.
        return node.guard.fallback(key, cost);
    }
    // Relaxed: self-contained hints; no other memory is published through them.
    let retry_at = lease.retry_at.load(Ordering::Relaxed);
    let full_at = lease.hot.view_full_at.load(Ordering::Relaxed);
    Ok(Decision {
        allowed: false.into(),
        limit: node.terms.rule.limit(),
        retry_after: retry_at.saturating_sub(now).max(MS),
        reset_after: full_at.saturating_sub(now),
        delay: 0,
        remaining: Remaining::Exact(0),
    })
}

/// Whether a check that `lease` could not serve waits for its refill: Redis answers, the
/// checks go to the leases, and nothing says the key's budget is spent (no short grant whose
/// retry time is still ahead, no backoff after a failed refill, no fatal error).
fn waits_for<C: RedisConnection>(node: &Node<C>, lease: &Lease) -> bool {
    let now = node.clock.now();
    // Relaxed: a self-contained hint (see `short`).
    let spent = lease.retry_at.load(Ordering::Relaxed) > now;
    let route = node.routes.of(&node.guard, &lease.key);
    !route.open(&node.guard)
        && route.way() == Way::Leases
        && !spent
        && lease.fatal().is_none()
        && lease.bg.lock().not_before <= now
}

/// A check that found the route and the breaker disagreeing: the breaker opened (hand the
/// leases over, unless a handover already runs), or it closed (back to the leases, whose
/// next checks ask for grants again).
#[cold]
#[inline(never)]
fn reroute<C: RedisConnection>(node: &Node<C>, route: &RouteOf<'_>, way: Way, open: bool) {
    match (way, open) {
        (Way::Leases, true) => node.hand_over(route),
        (Way::Policy, false) => {
            route.route().back();
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(view_left: u64, view_at: Nanos, full_at: Nanos) -> Lease {
        let lease = Lease::new(b"k");
        lease.hot.view_left.store(view_left, Ordering::Relaxed);
        lease.hot.view_at.store(view_at, Ordering::Relaxed);
        lease.hot.view_full_at.store(full_at, Ordering::Relaxed);
        lease
    }

    fn admitted(remaining: u64, reset_after: Nanos) -> Decision {
        Decision {
            allowed: true.into(),
            limit: 1_000,
            retry_after: 0,
            reset_after,
            delay: 0,
            remaining: Remaining::Exact(remaining),
        }
    }

    /// A check spent from a lease reports the lease's units left plus what the global state
    /// could still grant as of the last grant (for GCRA, plus a unit a `T` since), at most the
    /// capacity, and the time until the state is full.
    #[test]
    fn an_admission_from_a_lease_reports_the_global_figures_as_last_seen() {
        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        let fixed = Terms::thousand_a_second(RedisRule::fixed_window);
        let (seen, now) = (lease(100, 10 * MS, 500 * MS), 30 * MS);
        // 20 ms at 1 ms a unit.
        assert_eq!(allowed(&gcra, Some(&seen), 5, now), admitted(125, 470 * MS));
        assert_eq!(
            allowed(&fixed, Some(&seen), 5, now),
            admitted(105, 470 * MS)
        );
        let ungranted = lease(100, 0, 0);
        assert_eq!(allowed(&gcra, Some(&ungranted), 5, now), admitted(105, 0));
        let full = lease(990, 10 * MS, 0);
        assert_eq!(allowed(&gcra, Some(&full), 5, now), admitted(1_000, 0));
        assert_eq!(allowed(&gcra, None, 5, now), admitted(5, 0));
        assert_eq!(allowed(&gcra, Some(&seen), 5, 600 * MS), admitted(695, 0));
    }
}
