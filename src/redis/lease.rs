//! The leased tier: synchronous, lock-free checks on local atomics, against a global budget that
//! Redis grants in leases.
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
//! [`LeaseConfig::max_lease`] (by default 1/16 of the capacity). Unused units go back to Redis
//! when the key goes idle ([`LeaseConfig::idle_timeout`]), when a sliding window's lease
//! expires, and on [`LeasedLimiter::release_all`].
//!
//! The guarantee and the under-admission bound are documented on [`LeasedLimiter`].
//!
//! # Failures
//! The leased tier shares the exact tier's circuit breaker and [`FailurePolicy`]: a transient
//! failure of a refill opens it; the node keeps serving the units it holds, and once its lease
//! of a key is spent, checks of that key are decided by the policy (`FailOpen`, `FailClosed`,
//! or `Local`: the in-process share `L ÷ live nodes`). The breaker's probe closes it again
//! and refills resume at the next check.
//!
//! [`FailurePolicy`]: super::FailurePolicy

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crossbeam_utils::{Backoff, CachePadded};
use dashmap::DashMap;
use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::{Script, Value};

use super::rule::{Kind, RedisRule};
use super::{
    scripts as lua, Error, FailureHandling, GuardedLimiter, Mode, RedisConnection, RedisLimiter,
};
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::decision::{Decision, Remaining};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

/// The largest lease a node holds for one key (units are kept in 32 bits of the lease word).
pub const MAX_LEASE: u64 = u32::MAX as u64;

fn scripts() -> &'static (Script, Script) {
    static SCRIPTS: OnceLock<(Script, Script)> = OnceLock::new();
    SCRIPTS.get_or_init(|| (Script::new(lua::LEASE_GCRA), Script::new(lua::LEASE_WINDOW)))
}

/// Why a [`LeasedLimiter`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The rule's algorithm cannot be leased: a lease is a count of units, which fits GCRA /
    /// token bucket / leaky bucket (meter), fixed window and sliding window counter. The
    /// leaky bucket as a queue must tell each request its own delay, and the sliding log
    /// must record each request's time: use the exact tier for them.
    #[error("the leased tier does not support {algorithm}: use gcra (token-bucket, leaky-bucket), fixed-window or sliding-window, or the exact tier")]
    Unsupported {
        /// The rule's algorithm.
        algorithm: &'static str,
    },
    /// Not called on a tokio runtime: refills run as tokio tasks.
    #[error("the leased tier needs a tokio runtime")]
    NoRuntime,
}

/// How a [`LeasedLimiter`] sizes, refills and returns its leases.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::LeaseConfig;
/// let config = LeaseConfig::new()
///     .horizon(Duration::from_millis(20))
///     .max_lease(10_000)
///     .idle_timeout(Duration::from_millis(500));
/// assert_eq!(config.max_lease_for(1_000_000), 10_000);
/// assert_eq!(LeaseConfig::new().max_lease_for(1_600), 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    horizon: Duration,
    max_lease: Option<u64>,
    idle_timeout: Duration,
    max_age: Duration,
    backoff: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseConfig {
    /// Leases of 50 ms of demand, at most 1/16 of the capacity, returned after 1 s idle;
    /// window leases live at most 10 s; a short grant is retried after at least 1 ms.
    pub fn new() -> Self {
        LeaseConfig {
            horizon: Duration::from_millis(50),
            max_lease: None,
            idle_timeout: Duration::from_secs(1),
            max_age: Duration::from_secs(10),
            backoff: Duration::from_millis(1),
        }
    }

    /// A lease holds about this much of the key's recent demand (default 50 ms; at least
    /// 1 ms). Longer means fewer round trips and a larger under-admission bound.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon.max(Duration::from_millis(1));
        self
    }

    /// The most units a node holds for one key (default: the rule's capacity ÷ 16, at least
    /// 1; at most [`MAX_LEASE`]). The under-admission bound is `nodes × max_lease`.
    pub fn max_lease(mut self, units: u64) -> Self {
        self.max_lease = Some(units.clamp(1, MAX_LEASE));
        self
    }

    /// A key whose lease is untouched this long gives its units back and is forgotten
    /// (default 1 s; at least 10 ms).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// A window lease expires after this long even if its window lasts longer (default 10 s,
    /// between 1 ms and 1 day): it bounds how far the node's clock may drift from the
    /// server's while it holds units.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age.clamp(Duration::from_millis(1), Duration::from_secs(86_400));
        self
    }

    /// After a grant that was short (the global budget ran out), the next request for that
    /// key waits at least this long (default 1 ms), and at most the
    /// [horizon](LeaseConfig::horizon) or until more budget is due, whichever comes first
    /// (units given back by other nodes are picked up within the horizon).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// The largest lease for a rule of capacity `capacity`.
    pub fn max_lease_for(&self, capacity: u64) -> u64 {
        self.max_lease
            .unwrap_or(capacity / 16)
            .clamp(1, MAX_LEASE)
            .min(capacity.max(1))
    }
}

/// Counters of a [`LeasedLimiter`]'s traffic with Redis, since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Script calls sent to Redis (grants and returns).
    pub round_trips: u64,
    /// Units Redis granted.
    pub granted: u64,
    /// Units given back to Redis.
    pub returned: u64,
}

/// The algorithm a lease counts units of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algo {
    Gcra { interval: u64, span: u64 },
    Fixed { window: u64 },
    Sliding { window: u64 },
}

/// A global rate limiter whose checks are synchronous and local: one lookup and one
/// compare-and-swap on this node's lease of the key, never a network call. Built by
/// [`RedisLimiter::leased`].
///
/// # Guarantee, while Redis answers
/// Units are granted before they are spent, and a grant is an admission in the global state, so
/// the fleet never admits more than the rule allows:
/// - **Fixed window, sliding window counter**: a lease granted in window `k` expires when
///   window `k` ends, by the node's clock and conservatively (the node starts the clock before
///   it sends the request, so its deadline falls before the server's window end). Every unit
///   spent in window `k` was counted in window `k`, so the fleet admits at most `L` per fixed
///   window, and the sliding estimate of what it admitted never exceeds the state's.
/// - **GCRA / token bucket / leaky bucket (meter)**: at every instant, the tokens left in the
///   bucket plus the units held in leases are at most `B`, so over any interval `[a, b]` the
///   fleet admits at most `B + (b − a)/T`, the token bucket's own bound (GCRA's conformance).
///
/// Exact-tier nodes and leased nodes on the same key share one budget.
///
/// **Under-admission** is bounded by the outstanding leases: at any instant, the units the
/// global state counts as admitted but that no node has admitted are exactly the units held in
/// leases. With `N` nodes, for a window in which demand lasts until the budget is spent,
///
/// ```text
/// L − admitted(window)  ≤  Σ_nodes held(node, end of window)  ≤  N × M,
/// M = max(max_lease, the largest cost asked for)
/// ```
///
/// (and likewise `B + (b − a)/T − admitted([a, b]) ≤ N × M + the tokens that accrued since the
/// nodes last asked` for GCRA). Not in the bound: denials while a refill is in flight, when a
/// burst drains a lease faster than one refill; the low-water mark (half the lease, and at
/// least two of the slowest recent refills' worth of demand) makes them rare. `tests/redis_leased.rs` measures both sides with 4
/// nodes hammering one key.
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
    inner: Arc<Inner<C>>,
    _task: Arc<Sweeper>,
}

impl<C: RedisConnection> std::fmt::Debug for LeasedLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("rule", &self.inner.rule)
            .field("config", &self.inner.config)
            .field("mode", &self.mode())
            .field("keys", &self.inner.leases.len())
            .finish_non_exhaustive()
    }
}

struct Sweeper(tokio::task::AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Inner<C: RedisConnection> {
    exact: RedisLimiter<C>,
    guard: GuardedLimiter<C>,
    rule: RedisRule,
    algo: Algo,
    config: LeaseConfig,
    max_lease: u64,
    leases: DashMap<Box<[u8]>, Arc<Lease>, foldhash::fast::RandomState>,
    clock: QuantaClock,
    runtime: tokio::runtime::Handle,
    // Statistics. Relaxed: counters that publish nothing.
    round_trips: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
}

/// One key's lease on this node.
struct Lease {
    /// The lease word, the only state a check touches:
    /// - bits 63..32: units left (≤ [`MAX_LEASE`]);
    /// - bits 31..0: for window algorithms, the deadline: the lease's units are void from this
    ///   millisecond of the limiter's clock on (compared modulo 2^32, deadlines are at most
    ///   one day ahead). Unused for GCRA, whose units never expire.
    word: CachePadded<AtomicU64>,
    /// A check that leaves fewer units than this asks for a refill.
    low_water: AtomicU64,
    /// A refill is queued or in flight (at most one per key). Set for good once retired.
    pending: AtomicBool,
    /// The largest cost a check could not take from the lease since the last grant.
    need: AtomicU64,
    /// Until when (limiter clock, ns) the global state is expected to grant nothing: the
    /// `retry_after` of a denial.
    retry_at: AtomicU64,
    /// A fatal error from the last refill, returned by checks the lease cannot serve.
    error: Mutex<Option<Error>>,
    failed: AtomicBool,
    /// The refill and sweeper's bookkeeping (never touched by a check).
    bg: Mutex<Bg>,
    refilled: tokio::sync::Notify,
    key: Box<[u8]>,
}

#[derive(Default)]
struct Bg {
    /// When the last grant was installed, and the units the lease held right after it.
    installed_at: Nanos,
    level_after: u64,
    /// Units per ns, smoothed.
    rate: f64,
    /// The slowest recent refill, ns from asking to installing.
    slowest: Nanos,
    target: u64,
    /// The server time (ns since the epoch) the window of the current lease starts at, and
    /// the server time of its last grant (for returns).
    window_start: Option<u64>,
    grant_time: u64,
    /// When (limiter clock) that window is surely over.
    window_over: Nanos,
    /// No grant request before this time (limiter clock, ns).
    not_before: Nanos,
    /// The sweeper's view: the word at its last pass, and since when it has not changed.
    last_word: u64,
    still_since: Nanos,
}

fn pack(units: u64, deadline_ms: u32) -> u64 {
    (units << 32) | deadline_ms as u64
}

fn units_of(word: u64) -> u64 {
    word >> 32
}

fn deadline_of(word: u64) -> u32 {
    word as u32
}

fn now_ms(now: Nanos) -> u32 {
    // Wrapping by design: deadlines are compared modulo 2^32 ms.
    (now / MS) as u32
}

/// Whether a deadline has passed, modulo 2^32 ms (deadlines lie less than 2^31 ms ahead).
fn expired(now_ms: u32, deadline: u32) -> bool {
    (now_ms.wrapping_sub(deadline) as i32) >= 0
}

impl Lease {
    fn new(key: &[u8]) -> Lease {
        Lease {
            word: CachePadded::new(AtomicU64::new(0)),
            low_water: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            need: AtomicU64::new(0),
            retry_at: AtomicU64::new(0),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            bg: Mutex::new(Bg::default()),
            refilled: tokio::sync::Notify::new(),
            key: key.into(),
        }
    }

    /// Takes `cost` units if the lease holds them and has not expired: the units left.
    #[inline]
    fn take(&self, cost: u64, now: Nanos, windowed: bool) -> Option<u64> {
        let now_ms = now_ms(now);
        let backoff = Backoff::new();
        // Relaxed: the word is the whole state; no other memory is published through it.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let units = units_of(word);
            if units < cost || (windowed && expired(now_ms, deadline_of(word))) {
                return None;
            }
            // `cost ≤ units < 2^32`: no borrow out of the unit bits.
            match self.word.compare_exchange_weak(
                word,
                word - (cost << 32),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(units - cost),
                Err(seen) => {
                    word = seen;
                    backoff.spin();
                }
            }
        }
    }

    fn fatal(&self) -> Option<Error> {
        // Relaxed: the error itself is read under its mutex.
        if self.failed.load(Ordering::Relaxed) {
            self.error.lock().clone()
        } else {
            None
        }
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
        let inner = Arc::new(Inner {
            max_lease: config.max_lease_for(rule.capacity()),
            exact: self,
            guard,
            rule,
            algo,
            config,
            leases: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            clock: QuantaClock::new(),
            runtime,
            round_trips: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            returned: AtomicU64::new(0),
        });
        let task = inner.runtime.spawn(sweep(Arc::downgrade(&inner)));
        Ok(LeasedLimiter {
            inner,
            _task: Arc::new(Sweeper(task.abort_handle())),
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
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::Error> {
    /// let allowed = limiter.check("alice")?.allowed();
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        self.check_n(key, 1)
    }

    /// Decides a request of cost `cost` for `key`, synchronously: one lookup and one
    /// compare-and-swap on the key's lease, never a network call.
    ///
    /// - The lease holds `cost` units: allowed. `remaining` is what this node's lease still
    ///   holds (what it can admit for the key without asking Redis); `reset_after` is 0
    ///   (unknown locally).
    /// - It does not: a refill is requested, and the check is denied, with `retry_after` the
    ///   time until the global state is expected to grant again (1 ms while a refill is in
    ///   flight). A key this node has not seen yet starts that way: its first check is denied
    ///   unless [`LeasedLimiter::prefetch`] ran. While the breaker is open (Redis
    ///   unreachable), the failure policy decides instead.
    ///
    /// # Errors
    /// [`Error::Capacity`] if the cost can never be admitted; a fatal error that the key's
    /// last refill met (a key of the wrong type, …), until a refill succeeds again.
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::Error> {
    /// let d = limiter.check_n("tenant-7", 5)?;
    /// if !d.allowed() {
    ///     println!("retry after {:?}", d.retry_after());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, Error> {
        let key = key.as_ref();
        let inner = &self.inner;
        let capacity = inner.rule.capacity();
        if cost > capacity {
            return Err(Error::Capacity { cost, capacity });
        }
        if cost == 0 {
            // SPEC: always allowed, changes nothing.
            return Ok(inner.allowed(self.held(key)));
        }
        let now = inner.clock.now();
        let windowed = !matches!(inner.algo, Algo::Gcra { .. });
        if let Some(lease) = inner.leases.get(key) {
            if let Some(left) = lease.take(cost, now, windowed) {
                // Relaxed: a hint; a stale value only moves a refill by one check.
                if left < lease.low_water.load(Ordering::Relaxed) {
                    inner.request_refill(&lease);
                }
                return Ok(inner.allowed(left));
            }
            return inner.short(&lease, key, cost, now);
        }
        let lease = inner
            .leases
            .entry(key.into())
            .or_insert_with(|| Arc::new(Lease::new(key)))
            .clone();
        match lease.take(cost, now, windowed) {
            Some(left) => Ok(inner.allowed(left)),
            None => inner.short(&lease, key, cost, now),
        }
    }

    /// Makes sure this node holds a lease of `key`: requests one and waits for the grant
    /// (within twice the timeout, plus the key's backoff if the global budget was spent). Checks
    /// of a key this node has not seen yet are denied until its first grant arrives; call this
    /// where a first request must not be denied. Returns `Ok` also when the grant was empty (the
    /// global budget is spent).
    ///
    /// # Errors
    /// [`Error::Timeout`] if no grant arrived in time; a fatal error as for
    /// [`LeasedLimiter::check_n`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(limiter: tollgate::redis::LeasedLimiter) -> Result<(), tollgate::redis::Error> {
    /// limiter.prefetch("tenant-7").await?;
    /// # Ok(()) }
    /// ```
    pub async fn prefetch(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let key = key.as_ref();
        let inner = &self.inner;
        let lease = inner
            .leases
            .entry(key.into())
            .or_insert_with(|| Arc::new(Lease::new(key)))
            .clone();
        for _ in 0..2 {
            // A refill may first wait out a backoff (the budget was spent, or Redis failed).
            let backoff = lease.bg.lock().not_before.saturating_sub(inner.clock.now());
            let timeout = inner.exact.timeout() * 2 + Duration::from_nanos(backoff);
            let notified = lease.refilled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            inner.request_refill(&lease);
            if tokio::time::timeout(timeout, notified).await.is_err() {
                return Err(Error::Timeout { timeout });
            }
            if let Some(error) = lease.fatal() {
                return Err(error);
            }
            // Relaxed: a count; a refill that raced this read is picked up by the next loop.
            if units_of(lease.word.load(Ordering::Relaxed)) > 0 {
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
        let leases: Vec<Arc<Lease>> = self
            .inner
            .leases
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        // Concurrently: pipelined on the shared connection.
        let mut returns = tokio::task::JoinSet::new();
        for lease in leases {
            let inner = Arc::clone(&self.inner);
            returns.spawn(async move { inner.retire(&lease).await });
        }
        while returns.join_next().await.is_some() {}
    }
}

/// # Inspection
impl<C: RedisConnection> LeasedLimiter<C> {
    /// Whether Redis answers (`Global`) or the failure policy decides what leases cannot.
    pub fn mode(&self) -> Mode {
        self.inner.guard.mode()
    }

    /// The rule.
    pub fn rule(&self) -> RedisRule {
        self.inner.rule
    }

    /// The largest lease this node takes for one key.
    pub fn max_lease(&self) -> u64 {
        self.inner.max_lease
    }

    /// The units this node holds for `key` right now (0 if none or expired).
    pub fn held(&self, key: impl AsRef<[u8]>) -> u64 {
        let inner = &self.inner;
        inner.leases.get(key.as_ref()).map_or(0, |lease| {
            // Relaxed: a snapshot for inspection.
            let word = lease.word.load(Ordering::Relaxed);
            let windowed = !matches!(inner.algo, Algo::Gcra { .. });
            if windowed && expired(now_ms(inner.clock.now()), deadline_of(word)) {
                0
            } else {
                units_of(word)
            }
        })
    }

    /// Whether a refill of `key` is queued or in flight on this node. Once it reads `false`,
    /// [`LeasedLimiter::held`] includes everything Redis granted this node for `key`, until a
    /// check asks for the next refill.
    pub fn refilling(&self, key: impl AsRef<[u8]>) -> bool {
        self.inner.leases.get(key.as_ref()).is_some_and(|lease| {
            // Acquire: pairs with the Release that clears the flag after the grant's install.
            lease.pending.load(Ordering::Acquire)
        })
    }

    /// The traffic with Redis so far.
    pub fn stats(&self) -> LeaseStats {
        let inner = &self.inner;
        // Relaxed: statistics counters.
        LeaseStats {
            round_trips: inner.round_trips.load(Ordering::Relaxed),
            granted: inner.granted.load(Ordering::Relaxed),
            returned: inner.returned.load(Ordering::Relaxed),
        }
    }

    /// The exact limiter underneath (same connection, rule and prefix).
    pub fn exact(&self) -> &RedisLimiter<C> {
        &self.inner.exact
    }
}

/// One reply item of a lease script.
#[derive(Debug, Clone, Copy)]
struct Reply {
    units: u64,
    /// Server time judged at, ns since the epoch.
    time: u64,
    /// GCRA: the debt after; windows: the time into the window.
    fact: u64,
}

impl<C: RedisConnection> Inner<C> {
    fn allowed(&self, left: u64) -> Decision {
        Decision {
            allowed: true,
            limit: self.rule.limit(),
            retry_after: 0,
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(left),
        }
    }

    /// A check the lease could not serve.
    #[cold]
    fn short(
        self: &Arc<Self>,
        lease: &Arc<Lease>,
        key: &[u8],
        cost: u64,
        now: Nanos,
    ) -> Result<Decision, Error> {
        // Relaxed: a hint for the next refill's size.
        lease.need.fetch_max(cost, Ordering::Relaxed);
        self.request_refill(lease);
        if let Some(error) = lease.fatal() {
            return Err(error);
        }
        if self.guard.mode() != Mode::Global {
            return self.guard.fallback(key, cost);
        }
        // Relaxed: a self-contained hint; no other memory is published through it.
        let retry_at = lease.retry_at.load(Ordering::Relaxed);
        Ok(Decision {
            allowed: false,
            limit: self.rule.limit(),
            retry_after: retry_at.saturating_sub(now).max(MS),
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(0),
        })
    }

    /// Spawns a refill of `lease` unless one is already queued or in flight.
    fn request_refill(self: &Arc<Self>, lease: &Arc<Lease>) {
        // Relaxed: the flag only elects one refiller; the lease's bookkeeping is under `bg`.
        if lease.pending.load(Ordering::Relaxed) || lease.pending.swap(true, Ordering::Relaxed) {
            return;
        }
        self.runtime
            .spawn(refill(Arc::clone(self), Arc::clone(lease)));
    }

    fn windowed(&self) -> bool {
        !matches!(self.algo, Algo::Gcra { .. })
    }

    /// Asks Redis for units and installs them (called by one refill at a time per lease).
    async fn grant(&self, lease: &Lease) {
        let t0 = self.clock.now();
        // Relaxed: the word is the whole state (see `take`).
        let word = lease.word.load(Ordering::Relaxed);
        let windowed = self.windowed();
        let held = if windowed && expired(now_ms(t0), deadline_of(word)) {
            0
        } else {
            units_of(word)
        };
        let (want, target) = {
            let mut bg = lease.bg.lock();
            if bg.installed_at > 0 && t0 > bg.installed_at {
                let consumed = bg.level_after.saturating_sub(held) as f64;
                let rate = consumed / (t0 - bg.installed_at) as f64;
                bg.rate = if bg.rate == 0.0 {
                    rate
                } else {
                    0.5 * rate + 0.5 * bg.rate
                };
            }
            // Enough for the horizon, and for four of the slowest recent refills.
            let horizon = (self.config.horizon.as_nanos() as f64).max(4.0 * bg.slowest as f64);
            bg.target = if bg.rate > 0.0 {
                ((bg.rate * horizon).ceil() as u64).clamp(1, self.max_lease)
            } else {
                // No history yet: a quarter of the largest lease.
                (self.max_lease / 4).max(1)
            };
            // Relaxed: a self-contained hint; no other memory is published through it.
            let need = lease.need.swap(0, Ordering::Relaxed);
            let want = bg
                .target
                .saturating_sub(held)
                .max(need.saturating_sub(held))
                .max(1)
                .min(MAX_LEASE - held.min(MAX_LEASE));
            (want, bg.target)
        };
        if want == 0 {
            return;
        }
        let key = self.exact.redis_key(&lease.key);
        match self.call(&key, true, want, 0).await {
            Ok(reply) => {
                self.guard.answered();
                *lease.error.lock() = None;
                // Relaxed: the error itself is under its mutex.
                lease.failed.store(false, Ordering::Relaxed);
                self.install(lease, reply, t0, want, target);
            }
            Err(error) => {
                let wait = self.guard.probe_interval().as_nanos() as u64;
                lease.bg.lock().not_before = t0.saturating_add(wait);
                if error.is_transient() {
                    self.guard.transient_failure(&error);
                } else {
                    tracing::warn!(%error, "lease refill failed");
                    *lease.error.lock() = Some(error);
                    // Relaxed: the error itself is under its mutex.
                    lease.failed.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    fn install(&self, lease: &Lease, reply: Reply, t0: Nanos, want: u64, target: u64) {
        let granted = reply.units;
        // Relaxed: a statistics counter.
        self.granted.fetch_add(granted, Ordering::Relaxed);
        let backoff = self.config.backoff.as_nanos() as u64;
        let max_age = self.config.max_age.as_nanos() as u64;
        let mut bg = lease.bg.lock();
        // The deadline, the window's start on the server's clock, and when more budget
        // is expected.
        let (deadline, window_start, retry, poll) = match self.algo {
            Algo::Gcra { interval, span } => {
                let next_unit = (reply.fact + interval).saturating_sub(span);
                let wanted = (reply.fact + want.saturating_mul(interval)).saturating_sub(span);
                (
                    0,
                    None,
                    next_unit,
                    wanted.min(self.config.horizon.as_nanos() as u64),
                )
            }
            Algo::Fixed { window } | Algo::Sliding { window } => {
                let e = reply.fact;
                let left = window - e;
                // The node's clock started before the server read its own: `t0 + left` is at
                // or before the window's end; a thousandth more covers clock drift.
                let life = (left - left / 1024).min(max_age);
                let deadline = now_ms(t0.saturating_add(life));
                let start = reply.time - e;
                // A spent fixed window has budget again when it ends; a sliding estimate
                // frees some continuously. Either may get units back from other nodes sooner:
                // ask again within the horizon.
                let retry = if matches!(self.algo, Algo::Fixed { .. }) {
                    left
                } else {
                    window / 64
                };
                let poll = retry.min(self.config.horizon.as_nanos() as u64);
                (deadline, Some(start), retry, poll)
            }
        };
        let now = self.clock.now();
        // The slowest recent refill, forgotten by an eighth per refill.
        bg.slowest = (now - t0).max(bg.slowest - bg.slowest / 8);
        // Refill when what is left covers two of the slowest recent refills, or half the
        // target, whichever is more (at most the target).
        let low_water = ((bg.rate * 2.0 * bg.slowest as f64) as u64)
            .max(target / 2)
            .min(target);
        // Relaxed: the word is the whole state (see `take`).
        let mut word = lease.word.load(Ordering::Relaxed);
        let level = loop {
            let units = units_of(word);
            // Units of the same window stay valid until the new grant's deadline (it is as
            // conservative as the old one, and the server has just confirmed the window), even
            // if the old lease expired by age; a new window voids what is left of the old one.
            let same = window_start.is_none() || bg.window_start == window_start;
            let units = if same { units + granted } else { granted };
            match lease.word.compare_exchange_weak(
                word,
                pack(units.min(MAX_LEASE), deadline),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break units.min(MAX_LEASE),
                Err(seen) => word = seen,
            }
        };
        bg.window_start = window_start;
        bg.grant_time = reply.time;
        // The reply came after the server read its clock: the window is surely over by then.
        bg.window_over = match self.algo {
            Algo::Gcra { .. } => u64::MAX,
            Algo::Fixed { window } | Algo::Sliding { window } => {
                now.saturating_add(window - reply.fact)
            }
        };
        bg.installed_at = now;
        bg.level_after = level;
        // Relaxed: a self-contained hint; no other memory is published through it.
        lease.low_water.store(low_water, Ordering::Relaxed);
        if granted < want {
            bg.not_before = t0.saturating_add(poll.max(backoff));
            lease
                .retry_at
                .store(t0.saturating_add(retry), Ordering::Relaxed);
        } else {
            bg.not_before = 0;
            // Relaxed: a self-contained hint; no other memory is published through it.
            lease.retry_at.store(0, Ordering::Relaxed);
        }
    }

    /// Takes back every unit of `lease`, forgets it, and returns the units to Redis.
    async fn retire(&self, lease: &Arc<Lease>) {
        // Keeps refills away for good; a check that still holds the lease finds it empty.
        lease.pending.store(true, Ordering::Relaxed);
        let (units, since) = self.take_all(lease);
        self.leases
            .remove_if(&lease.key, |_, v| Arc::ptr_eq(v, lease));
        self.give_back(lease, units, since).await;
    }

    /// Empties `lease`: its units and the server time of their window's last grant, read
    /// together under the lock that installs grants.
    fn take_all(&self, lease: &Lease) -> (u64, u64) {
        let bg = lease.bg.lock();
        let void = pack(0, now_ms(self.clock.now()));
        // Relaxed: the word is the whole state (see `take`).
        let word = lease.word.swap(void, Ordering::Relaxed);
        (units_of(word), bg.grant_time)
    }

    /// Returns `units` of `lease`, granted in the window of server time `since`, to Redis.
    /// Those of a window that is over change nothing (the script checks): a fixed window's
    /// count is gone, a sliding window's `prev` still takes them back.
    async fn give_back(&self, lease: &Lease, units: u64, since: u64) {
        if units == 0 {
            return;
        }
        let key = self.exact.redis_key(&lease.key);
        match self.call(&key, false, units, since).await {
            Ok(reply) => {
                self.guard.answered();
                // Relaxed: a statistics counter.
                self.returned.fetch_add(reply.units, Ordering::Relaxed);
            }
            // The units stay counted: under-admission, never over-admission.
            Err(error) if error.is_transient() => self.guard.transient_failure(&error),
            Err(error) => tracing::warn!(%error, "lease return failed"),
        }
    }

    /// One lease script call: a grant of `units`, or a return of `units` granted at server
    /// time `since`.
    async fn call(&self, key: &[u8], grant: bool, units: u64, since: u64) -> Result<Reply, Error> {
        // Relaxed: a statistics counter.
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let (gcra_script, window_script) = scripts();
        let [first, second] = self.rule.script_params();
        let (script, mode) = match self.algo {
            Algo::Gcra { .. } => (gcra_script, "1"),
            Algo::Fixed { .. } => (window_script, "f"),
            Algo::Sliding { .. } => (window_script, "s"),
        };
        let mut invocation = script.prepare_invoke();
        invocation.arg(0).arg(mode).arg(first).arg(second);
        invocation
            .key(key)
            .arg(if grant { "g" } else { "r" })
            .arg(units);
        if grant || since == 0 {
            invocation.arg("");
        } else {
            invocation.arg(since);
        }
        invocation.arg("");
        let timeout = self.exact.timeout();
        let mut conn = self.exact.connection().clone();
        let reply: Value =
            match tokio::time::timeout(timeout, invocation.invoke_async(&mut conn)).await {
                Err(_) => return Err(Error::Timeout { timeout }),
                Ok(Err(error)) if error.is_timeout() => return Err(Error::Timeout { timeout }),
                Ok(Err(error)) => return Err(Error::from(error)),
                Ok(Ok(reply)) => reply,
            };
        parse(self.algo, key, reply, units)
    }
}

/// The one item of a lease script's reply, checked against the scripts' contract: anything
/// else is an error, never a panic.
fn parse(algo: Algo, key: &[u8], reply: Value, asked: u64) -> Result<Reply, Error> {
    let bad = |detail: String| Err(Error::bad_reply(detail));
    let item = match reply {
        Value::Array(mut items) if items.len() == 1 => items.pop(),
        other => return bad(format!("expected one item, got {other:?}")),
    };
    let fields: Vec<i64> = match item {
        Some(Value::Array(fields)) if fields.len() == 7 => fields
            .into_iter()
            .map(|f| match f {
                Value::Int(v) => Ok(v),
                other => Err(Error::bad_reply(format!(
                    "expected an integer, got {other:?}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        other => return bad(format!("expected 7 integers, got {other:?}")),
    };
    let key = || String::from_utf8_lossy(key).into_owned();
    match fields[0] {
        1 => {}
        -1 => return Err(Error::WrongType { key: key() }),
        -2 => return Err(Error::CorruptState { key: key() }),
        code => return bad(format!("lease code {code}")),
    }
    let in_range = |v: i64, max: u64| u64::try_from(v).ok().filter(|v| *v <= max);
    let (Some(units), Some(secs), Some(nanos)) = (
        in_range(fields[1], asked),
        in_range(fields[2], u64::MAX / SEC - 1),
        in_range(fields[3], SEC - 1),
    ) else {
        return bad(format!("lease reply out of range: {fields:?}"));
    };
    let limit = match algo {
        Algo::Gcra { span, .. } => span,
        Algo::Fixed { window } | Algo::Sliding { window } => window - 1,
    };
    let Some(fact) = in_range(fields[4], limit) else {
        return bad(format!("lease reply out of range: {fields:?}"));
    };
    let time = secs * SEC + nanos;
    if !matches!(algo, Algo::Gcra { .. }) && time < fact {
        return bad(format!("lease reply out of range: {fields:?}"));
    }
    Ok(Reply { units, time, fact })
}

/// One refill of `lease`: waits out the backoff, then asks Redis (unless the breaker is
/// open: the policy decides meanwhile, and the next check after recovery asks again).
async fn refill<C: RedisConnection>(inner: Arc<Inner<C>>, lease: Arc<Lease>) {
    let not_before = lease.bg.lock().not_before;
    let now = inner.clock.now();
    if not_before > now {
        tokio::time::sleep(Duration::from_nanos(not_before - now)).await;
    }
    let retired = || {
        inner
            .leases
            .get(&lease.key)
            .is_none_or(|current| !Arc::ptr_eq(&current, &lease))
    };
    if inner.guard.mode() == Mode::Global && !retired() {
        inner.grant(&lease).await;
    }
    if retired() {
        // Retired while the grant was in flight: whatever it brought goes back.
        let (units, since) = inner.take_all(&lease);
        inner.give_back(&lease, units, since).await;
    } else {
        // Release: `refilling` readers that see the flag clear also see the installed word.
        lease.pending.store(false, Ordering::Release);
    }
    lease.refilled.notify_waiters();
}

/// The background task: returns the units of idle keys and of expired sliding-window leases.
async fn sweep<C: RedisConnection>(inner: Weak<Inner<C>>) {
    loop {
        let period = match inner.upgrade() {
            // Often enough to notice idle keys within a quarter of the timeout, and expired
            // window leases within a quarter of a window.
            Some(inner) => {
                let window = match inner.algo {
                    Algo::Gcra { .. } => u64::MAX,
                    Algo::Fixed { window } | Algo::Sliding { window } => window,
                };
                (inner.config.idle_timeout / 4)
                    .min(inner.config.max_age / 2)
                    .min(Duration::from_nanos(window / 4))
                    .max(Duration::from_millis(5))
            }
            None => return,
        };
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = inner.clock.now();
        let idle = inner.config.idle_timeout.as_nanos() as u64;
        let windowed = inner.windowed();
        let mut idle_leases = Vec::new();
        let mut expired_units = Vec::new();
        for entry in inner.leases.iter() {
            let lease = entry.value();
            // Relaxed: the flag elects one refiller; the data it guards is under `bg`.
            if lease.pending.load(Ordering::Relaxed) {
                continue;
            }
            // Relaxed: the word is the whole state (see `take`).
            let word = lease.word.load(Ordering::Relaxed);
            let mut bg = lease.bg.lock();
            if word != bg.last_word || bg.still_since == 0 {
                bg.last_word = word;
                bg.still_since = now;
            } else if now - bg.still_since >= idle {
                idle_leases.push(lease.clone());
                continue;
            }
            if windowed && units_of(word) > 0 && expired(now_ms(now), deadline_of(word)) {
                let void = pack(0, deadline_of(word));
                if lease
                    .word
                    .compare_exchange(word, void, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    bg.last_word = void;
                    // A fixed window that is over has forgotten its count: nothing to return.
                    let over = matches!(inner.algo, Algo::Fixed { .. }) && now >= bg.window_over;
                    if !over {
                        expired_units.push((lease.clone(), units_of(word), bg.grant_time));
                    }
                }
            }
        }
        // The returns run concurrently: pipelined on the shared connection, many keys cost
        // about one round trip.
        let mut returns = tokio::task::JoinSet::new();
        for (lease, units, since) in expired_units {
            let inner = Arc::clone(&inner);
            returns.spawn(async move { inner.give_back(&lease, units, since).await });
        }
        for lease in idle_leases {
            // Relaxed: the flag elects one refiller; the data it guards is under `bg`.
            if !lease.pending.swap(true, Ordering::Relaxed) {
                let inner = Arc::clone(&inner);
                returns.spawn(async move { inner.retire(&lease).await });
            }
        }
        drop(inner);
        while returns.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_compare_modulo_2_32_ms() {
        assert!(!expired(5, 6));
        assert!(expired(6, 6));
        assert!(expired(7, 6));
        // Across the wrap.
        assert!(!expired(u32::MAX, 3));
        assert!(expired(3, u32::MAX));
        let word = pack(MAX_LEASE, u32::MAX);
        assert_eq!((units_of(word), deadline_of(word)), (MAX_LEASE, u32::MAX));
    }

    #[test]
    fn a_lease_never_gives_more_than_it_holds() {
        let lease = Lease::new(b"k");
        lease.word.store(pack(10, 100), Ordering::Relaxed);
        assert_eq!(lease.take(4, 99 * MS, true), Some(6));
        assert_eq!(lease.take(7, 99 * MS, true), None);
        assert_eq!(lease.take(6, 100 * MS, true), None, "expired");
        assert_eq!(
            lease.take(6, 100 * MS, false),
            Some(0),
            "GCRA units never expire"
        );
        assert_eq!(lease.take(1, 0, false), None);
        assert_eq!(lease.take(u64::MAX, 0, false), None);
    }

    #[test]
    fn replies_out_of_contract_are_errors_not_panics() {
        let algos = [
            Algo::Gcra {
                interval: 1_000,
                span: 10_000,
            },
            Algo::Fixed { window: SEC },
            Algo::Sliding { window: SEC },
        ];
        let edges = [
            i64::MIN,
            -3,
            -2,
            -1,
            0,
            1,
            2,
            999_999_999,
            1 << 53,
            i64::MAX,
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..100_000 {
            let fields = (next() % 9) as usize;
            let mut item: Vec<Value> = (0..fields)
                .map(|i| match next() % 4 {
                    _ if i == 0 && next() % 3 != 0 => Value::Int(1),
                    0 => Value::Int((next() % (1 << 40)) as i64),
                    1 => Value::Nil,
                    _ => Value::Int(edges[(next() % edges.len() as u64) as usize]),
                })
                .collect();
            if next() % 2 == 0 {
                item.truncate(7);
            }
            let reply = match next() % 4 {
                0 => Value::Array(item),
                1 => Value::Array(vec![Value::Array(item.clone()), Value::Array(item)]),
                _ => Value::Array(vec![Value::Array(item)]),
            };
            let algo = algos[(next() % 3) as usize];
            if let Ok(r) = parse(algo, b"k", reply, 100) {
                assert!(r.units <= 100);
            }
        }
        let good = Value::Array(vec![Value::Array(
            [1, 7, 1_700_000_000, 5, 250, 0, 0].map(Value::Int).to_vec(),
        )]);
        let r = parse(algos[1], b"k", good, 10).unwrap();
        assert_eq!((r.units, r.time, r.fact), (7, 1_700_000_000 * SEC + 5, 250));
        let wrong = Value::Array(vec![Value::Array(
            [-1, 0, 0, 0, 0, 0, 0].map(Value::Int).to_vec(),
        )]);
        assert!(matches!(
            parse(algos[0], b"k", wrong, 10),
            Err(Error::WrongType { .. })
        ));
    }
}
