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
//! A key a node holds no lease of starts with a small provisional allowance while its first
//! grant is in flight, so that its first checks are not denied for want of a lease; the grant
//! covers it, or the units it did not cover are charged to Redis at once.
//!
//! The guarantee, the under-admission bound and what first touches add to them are
//! documented on [`LeasedLimiter`].
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
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_utils::{Backoff, CachePadded};
use dashmap::DashMap;
use parking_lot::Mutex;
use redis::aio::ConnectionManager;

use super::exact::{Algo, Reply, UnitOp, Units};
use super::rule::{Kind, RedisRule};
use super::{Error, FailureHandling, GuardedLimiter, Mode, RedisConnection, RedisLimiter};
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::decision::{Decision, Remaining};

const MS: u64 = 1_000_000;

/// The largest lease a node holds for one key (units are kept in 32 bits of the lease word).
pub const MAX_LEASE: u64 = u32::MAX as u64;

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
    first_touch: Option<u64>,
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
            first_touch: Some(0),
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

    /// How many units a node may admit for a key it holds no lease of, while the key's first
    /// grant is in flight (its *first touch*; see [`LeasedLimiter`]). Default `0`, strict: a
    /// key's checks are denied until its first grant arrives (or [`LeasedLimiter::prefetch`]
    /// ran), and the fleet never admits more than the limit. A positive allowance serves first
    /// touches at once, at the price of the bounded overdraft documented on
    /// [`LeasedLimiter`]; [`LeaseConfig::first_touch_share`] picks one per node. At most
    /// [`MAX_LEASE`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::LeaseConfig;
    /// assert_eq!(LeaseConfig::new().first_touch_for(1_600, 1), 0);
    /// assert_eq!(LeaseConfig::new().first_touch(10).first_touch_for(1_600, 1), 10);
    /// assert_eq!(LeaseConfig::new().first_touch_share().first_touch_for(1_600, 2), 25);
    /// assert_eq!(LeaseConfig::new().first_touch_share().first_touch_for(1_600, 100), 16);
    /// ```
    pub fn first_touch(mut self, units: u64) -> Self {
        self.first_touch = Some(units.min(MAX_LEASE));
        self
    }

    /// First touches get this node's share of the capacity, `⌊capacity ÷ live nodes⌋`, at most
    /// a quarter of the largest lease (see [`LeaseConfig::first_touch`]).
    pub fn first_touch_share(mut self) -> Self {
        self.first_touch = None;
        self
    }

    /// The first-touch allowance for a rule of capacity `capacity` on a fleet of `nodes`
    /// (examples on [`LeaseConfig::first_touch`]).
    pub fn first_touch_for(&self, capacity: u64, nodes: u64) -> u64 {
        match self.first_touch {
            Some(units) => units.min(capacity),
            None => (capacity / nodes.max(1)).min((self.max_lease_for(capacity) / 4).max(1)),
        }
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
    /// Script calls sent to Redis (grants, returns and charges). Refills and returns of many
    /// keys due together share calls: one per Cluster slot (per 256 keys on a single server).
    pub round_trips: u64,
    /// Grant requests (one per key refilled), however many calls carried them.
    pub refills: u64,
    /// Units Redis granted.
    pub granted: u64,
    /// Units given back to Redis.
    pub returned: u64,
    /// Units admitted on first touches, before the key's first grant arrived.
    pub provisional: u64,
    /// Of those, units the first grant did not cover (the global budget was spent): admitted
    /// beyond the limit, and charged to Redis so that its state counts them.
    pub overdrawn: u64,
}

/// A global rate limiter whose checks are synchronous and local: one lookup and one
/// compare-and-swap on this node's lease of the key, never a network call. Built by
/// [`RedisLimiter::leased`].
///
/// # Guarantee, while Redis answers
/// Units are granted before they are spent (except a key's first-touch units, see "First
/// touch" below), and a grant is an admission in the global state, so the fleet never admits
/// more than the rule allows:
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
/// # First touch
/// A node that holds no lease of a key cannot know, without asking Redis, whether the key
/// has budget left. So that the first checks of a key on a node are not denied for that
/// alone (the hot path never waits on the network), the node starts the key's lease with a
/// *provisional* allowance `A` if configured ([`LeaseConfig::first_touch`]; by default `A = 0`:
/// first touches are denied, and the guarantee above holds unconditionally;
/// [`LeaseConfig::first_touch_share`] gives each node `⌊capacity ÷ live nodes⌋`, at most a
/// quarter of the largest lease) and requests the first grant at once, asking for `A` more than
/// it needs:
/// - The grant **covers** what it can of the provisional units, which then become units of
///   the lease like any other (granted in the window they were spent in: provisional units
///   of a window lease expire at that window's end by the node's wall clock, and a grant
///   decided in a later window covers none of them). Whenever the key still has `A` units
///   of budget when the grant is decided, the guarantee above holds unchanged.
/// - Units spent provisionally that the grant did not cover (the key's budget was already
///   spent by others, or the grant was decided in the next window) were admitted **beyond
///   the limit**. The node charges them to Redis at once, in the window they were spent in
///   if the state still remembers it (never denied: the state may pass the limit), so the
///   global state counts them and the key stays denied until the excess has drained (GCRA)
///   or slid out of the window; [`LeaseStats::overdrawn`] counts them. They are bounded by
///   `A` per node per first touch of a key (a lease is created again after the key went idle
///   and was given back):
///
/// ```text
/// admitted ≤ the bound above + Σ overdrafts,  each overdraft ≤ A, one at most per node per
/// first touch of the key that met a spent budget or a window's end
/// ```
///
/// - If the first grant fails (Redis unreachable), the provisional units left are voided and
///   the policy decides; those spent are charged after the outage with
///   [`FailureHandling::reconcile`].
///
/// With `first_touch(0)` there is no provisional allowance: a key's checks are denied until
/// its first grant arrives (or [`LeasedLimiter::prefetch`] ran), and the fleet never admits
/// more than the limit.
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

/// Aborts the background tasks (the sweeper and the refiller) when the last clone of the
/// limiter is dropped.
struct Sweeper([tokio::task::AbortHandle; 2]);

impl Drop for Sweeper {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
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
    refills: AtomicU64,
    granted: AtomicU64,
    returned: AtomicU64,
    provisional: AtomicU64,
    overdrawn: AtomicU64,
    /// Refills asked for and not yet sent; the refill task takes them all at once.
    queue: Mutex<Vec<Queued>>,
    wake: tokio::sync::Notify,
}

/// A refill asked for: the lease, and when (limiter clock, ns).
struct Queued {
    lease: Arc<Lease>,
    at: Nanos,
}

/// One key's lease on this node.
struct Lease {
    /// What a check touches, on one cache line of its own.
    hot: CachePadded<Hot>,
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

/// The part of a lease a check reads: written by checks (the word) and by grants.
#[derive(Default)]
struct Hot {
    /// The lease word, the only state a check changes:
    /// - bits 63..32: units left (≤ [`MAX_LEASE`]);
    /// - bits 31..0: for window algorithms, the deadline: the lease's units are void from this
    ///   millisecond of the limiter's clock on (compared modulo 2^32, deadlines are at most
    ///   one day ahead). Unused for GCRA, whose units never expire.
    word: AtomicU64,
    /// A check that leaves fewer units than this asks for a refill.
    low_water: AtomicU64,
    /// The global state as the last grant saw it, for the figures of decisions: what it could
    /// still grant (units held in leases count as spent), when (limiter clock, ns) that grant
    /// was installed, and when the state would be back to full capacity (limiter clock, ns;
    /// 0 = already full).
    view_left: AtomicU64,
    view_at: AtomicU64,
    view_full_at: AtomicU64,
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
    /// First touch: units put in the word before any grant (0 once the first grant or its
    /// failure settled them), the wall time (ns since the epoch) they were put there, and
    /// the window index (wall time ÷ W) they belong to.
    provisional: u64,
    provisional_at: u64,
    provisional_window: u64,
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
            hot: CachePadded::new(Hot::default()),
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
        let mut word = self.hot.word.load(Ordering::Relaxed);
        loop {
            let units = units_of(word);
            if units < cost || (windowed && expired(now_ms, deadline_of(word))) {
                return None;
            }
            // `cost ≤ units < 2^32`: no borrow out of the unit bits.
            match self.hot.word.compare_exchange_weak(
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
            refills: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            provisional: AtomicU64::new(0),
            overdrawn: AtomicU64::new(0),
            queue: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        });
        let sweeper = inner.runtime.spawn(sweep(Arc::downgrade(&inner)));
        let refiller = inner.runtime.spawn(refills(Arc::clone(&inner)));
        Ok(LeasedLimiter {
            inner,
            _task: Arc::new(Sweeper([sweeper.abort_handle(), refiller.abort_handle()])),
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
    /// - The lease holds `cost` units: allowed.
    /// - It does not: a refill is requested, and the check is denied, with `retry_after` the
    ///   time until the global state is expected to grant again (1 ms while a refill is in
    ///   flight). While the breaker is open (Redis unreachable), the failure policy decides
    ///   instead.
    /// - A key this node holds no lease of (its *first touch*) gets the first-touch
    ///   allowance ([`LeaseConfig::first_touch`]) as a provisional lease while its first
    ///   grant is requested at once: the first checks are not denied for want of a lease.
    ///   See "First touch" on [`LeasedLimiter`] for what that does to the global bound.
    ///
    /// The figures are the best this node knows without asking Redis, from the global state
    /// as its last grant of the key saw it (the server's answer, SPEC's formulas):
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
        let now = inner.clock.now();
        if cost == 0 {
            // SPEC: always allowed, changes nothing.
            let held = self.held(key);
            let lease = inner.leases.get(key);
            return Ok(inner.allowed(lease.as_deref().map(|l| &**l), held, now));
        }
        let windowed = inner.algo.windowed();
        if let Some(lease) = inner.leases.get(key) {
            if let Some(left) = lease.take(cost, now, windowed) {
                // Relaxed: a hint; a stale value only moves a refill by one check.
                if left < lease.hot.low_water.load(Ordering::Relaxed) {
                    inner.request_refill(&lease);
                }
                return Ok(inner.allowed(Some(&lease), left, now));
            }
            return inner.short(&lease, key, cost, now);
        }
        // First touch: the lease starts with this node's provisional allowance, and its first
        // grant is requested at once.
        let mut created = false;
        let lease = inner
            .leases
            .entry(key.into())
            .or_insert_with(|| {
                created = true;
                Arc::new(inner.first_lease(key, now))
            })
            .clone();
        if created {
            inner.request_refill(&lease);
        }
        match lease.take(cost, now, windowed) {
            Some(left) => Ok(inner.allowed(Some(&lease), left, now)),
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
            if units_of(lease.hot.word.load(Ordering::Relaxed)) > 0 {
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
        let inner = &self.inner;
        let leases: Vec<Arc<Lease>> = inner
            .leases
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        // One batch: a script call per Cluster slot (per 256 keys on a single server).
        let returns: Vec<_> = leases
            .into_iter()
            .map(|lease| inner.retire(lease))
            .collect();
        inner.give_back(&returns).await;
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

    /// The units this node holds for `key` right now (0 if none or expired), provisional
    /// first-touch units included.
    pub fn held(&self, key: impl AsRef<[u8]>) -> u64 {
        let inner = &self.inner;
        inner.leases.get(key.as_ref()).map_or(0, |lease| {
            // Relaxed: a snapshot for inspection.
            let word = lease.hot.word.load(Ordering::Relaxed);
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

    /// Units the failure policy admitted on this node during an outage (and first-touch units
    /// no grant covered before it) that are not yet charged to Redis: see
    /// [`FailureHandling::reconcile`]. Always 0 unless reconciliation is on.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{LeasedLimiter, Mode};
    /// # async fn demo(limiter: LeasedLimiter) {
    /// // After an outage: wait until what was admitted locally is counted in Redis.
    /// while limiter.mode() == Mode::Global && limiter.unreconciled() > 0 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    /// }
    /// println!("{} units charged after outages", limiter.reconciled());
    /// # }
    /// ```
    pub fn unreconciled(&self) -> u64 {
        self.inner.guard.unreconciled()
    }

    /// Units charged to Redis after outages so far (see [`FailureHandling::reconcile`]; an
    /// example is on [`LeasedLimiter::unreconciled`]).
    pub fn reconciled(&self) -> u64 {
        self.inner.guard.reconciled()
    }

    /// The traffic with Redis so far.
    pub fn stats(&self) -> LeaseStats {
        let inner = &self.inner;
        // Relaxed: statistics counters.
        LeaseStats {
            round_trips: inner.round_trips.load(Ordering::Relaxed),
            refills: inner.refills.load(Ordering::Relaxed),
            granted: inner.granted.load(Ordering::Relaxed),
            returned: inner.returned.load(Ordering::Relaxed),
            provisional: inner.provisional.load(Ordering::Relaxed),
            overdrawn: inner.overdrawn.load(Ordering::Relaxed),
        }
    }

    /// The exact limiter underneath (same connection, rule and prefix).
    pub fn exact(&self) -> &RedisLimiter<C> {
        &self.inner.exact
    }
}

impl<C: RedisConnection> Inner<C> {
    /// An allowed decision with `left` units left in this node's lease: its figures are the
    /// lease's view of the global state (see [`LeasedLimiter::check_n`]).
    #[inline]
    fn allowed(&self, lease: Option<&Lease>, left: u64, now: Nanos) -> Decision {
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
        let accrued = match self.algo {
            Algo::Gcra { interval, .. } if view_at > 0 => {
                let since = now.saturating_sub(view_at);
                if since >= interval {
                    since / interval.max(1)
                } else {
                    0
                }
            }
            _ => 0,
        };
        Decision {
            allowed: true.into(),
            limit: self.rule.limit(),
            retry_after: 0,
            reset_after: full_at.saturating_sub(now),
            delay: 0,
            remaining: Remaining::Exact(
                left.saturating_add(view_left)
                    .saturating_add(accrued)
                    .min(self.rule.capacity()),
            ),
        }
    }

    /// A new lease for a key this node holds none of: with the first-touch allowance while
    /// Redis answers (see [`LeaseConfig::first_touch`]).
    fn first_lease(&self, key: &[u8], now: Nanos) -> Lease {
        let lease = Lease::new(key);
        if self.guard.mode() != Mode::Global {
            return lease;
        }
        let units = self
            .config
            .first_touch_for(self.rule.capacity(), self.guard.live_nodes());
        if units == 0 {
            return lease;
        }
        let wall = super::guard::wall_nanos();
        let mut bg = lease.bg.lock();
        let deadline = match self.algo {
            Algo::Gcra { .. } => 0,
            Algo::Fixed { window } | Algo::Sliding { window } => {
                // The units belong to the current window by the wall clock: void at its end
                // (less a thousandth for drift), so none is spent in the next one.
                let left = window - wall % window;
                bg.provisional_window = wall / window;
                now_ms(now.saturating_add(left - left / 1024))
            }
        };
        bg.provisional = units;
        bg.provisional_at = wall;
        drop(bg);
        // Relaxed: the word is the whole state (see `take`); not yet shared.
        lease
            .hot
            .word
            .store(pack(units, deadline), Ordering::Relaxed);
        lease
    }

    /// Settles the first-touch units of `lease` that no grant covered: takes back those left
    /// (never spent) and returns how many were spent.
    fn void_provisional(&self, lease: &Lease, bg: &mut Bg, uncovered: u64) -> u64 {
        let provisional = std::mem::take(&mut bg.provisional);
        // Relaxed: the word is the whole state (see `take`).
        let mut word = lease.hot.word.load(Ordering::Relaxed);
        let (left, taken) = loop {
            let units = units_of(word);
            let take = units.min(uncovered);
            match lease.hot.word.compare_exchange_weak(
                word,
                word - (take << 32),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break (units, take),
                Err(seen) => word = seen,
            }
        };
        // Relaxed: a statistics counter.
        self.provisional
            .fetch_add(provisional.saturating_sub(left), Ordering::Relaxed);
        uncovered - taken
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
        // Relaxed: self-contained hints; no other memory is published through them.
        let retry_at = lease.retry_at.load(Ordering::Relaxed);
        let full_at = lease.hot.view_full_at.load(Ordering::Relaxed);
        Ok(Decision {
            allowed: false.into(),
            limit: self.rule.limit(),
            retry_after: retry_at.saturating_sub(now).max(MS),
            reset_after: full_at.saturating_sub(now),
            delay: 0,
            remaining: Remaining::Exact(0),
        })
    }

    /// Queues a refill of `lease` for the refill task unless one is already queued or in
    /// flight; after its backoff if it has one.
    fn request_refill(self: &Arc<Self>, lease: &Arc<Lease>) {
        // Relaxed: the flag only elects one refiller; the lease's bookkeeping is under `bg`.
        if lease.pending.load(Ordering::Relaxed) || lease.pending.swap(true, Ordering::Relaxed) {
            return;
        }
        let now = self.clock.now();
        let not_before = lease.bg.lock().not_before;
        if not_before > now {
            let (inner, lease) = (Arc::clone(self), Arc::clone(lease));
            self.runtime.spawn(async move {
                tokio::time::sleep(Duration::from_nanos(not_before - now)).await;
                let at = inner.clock.now();
                inner.enqueue(lease, at);
            });
        } else {
            self.enqueue(Arc::clone(lease), now);
        }
    }

    fn enqueue(&self, lease: Arc<Lease>, at: Nanos) {
        self.queue.lock().push(Queued { lease, at });
        // A permit is stored if the refill task is busy: no request is left waiting.
        self.wake.notify_one();
    }

    /// Whether `lease` is no longer the key's current lease (given back, or forgotten).
    fn retired(&self, lease: &Arc<Lease>) -> bool {
        self.leases
            .get(&lease.key)
            .is_none_or(|current| !Arc::ptr_eq(&current, lease))
    }

    /// Sends the grant requests of `batch` together (one script call per Cluster slot, per
    /// `max_batch` keys) and installs the grants. While the breaker is open, no request is
    /// sent: the policy decides, and the next check after recovery asks again.
    async fn refill_batch(&self, batch: Vec<Queued>) {
        let global = self.guard.mode() == Mode::Global;
        let mut asks = Vec::with_capacity(batch.len());
        let mut done = Vec::with_capacity(batch.len());
        for Queued { lease, at } in batch {
            if global && !self.retired(&lease) {
                if let Some((want, target)) = self.prepare(&lease, at) {
                    asks.push((lease, at, want, target));
                    continue;
                }
            } else {
                // No grant will cover first-touch units: the policy decides from now on.
                let spent = {
                    let mut bg = lease.bg.lock();
                    let owed = bg.provisional;
                    self.void_provisional(&lease, &mut bg, owed)
                };
                self.guard.record_admitted(&lease.key, spent);
            }
            done.push(lease);
        }
        if !asks.is_empty() {
            let items: Vec<Units> = asks
                .iter()
                .map(|(lease, _, want, _)| Units {
                    key: self.exact.redis_key(&lease.key),
                    op: UnitOp::Grant,
                    units: *want,
                })
                .collect();
            let (results, calls) = self.exact.move_units(self.algo, &items).await;
            // Relaxed: statistics counters.
            self.round_trips.fetch_add(calls, Ordering::Relaxed);
            self.refills
                .fetch_add(items.len() as u64, Ordering::Relaxed);
            let mut charges = Vec::new();
            let mut charged = Vec::new();
            for ((lease, t0, want, target), result) in asks.into_iter().zip(results) {
                if let Some((op, units)) = self.finish(&lease, result, t0, want, target) {
                    charges.push(Units {
                        key: self.exact.redis_key(&lease.key),
                        op,
                        units,
                    });
                    charged.push(Arc::clone(&lease));
                }
                done.push(lease);
            }
            if !charges.is_empty() {
                // First-touch units the grants did not cover: the state must count them.
                let (results, calls) = self.exact.move_units(self.algo, &charges).await;
                // Relaxed: a statistics counter.
                self.round_trips.fetch_add(calls, Ordering::Relaxed);
                for ((charge, lease), result) in charges.iter().zip(&charged).zip(results) {
                    match result {
                        Ok(_) => self.guard.answered(),
                        Err(error) if error.is_transient() => {
                            // Charged after the outage, if reconciliation is on.
                            self.guard.record_admitted(&lease.key, charge.units);
                            self.guard.transient_failure(&error);
                        }
                        Err(error) => tracing::warn!(%error, "charging an overdraft failed"),
                    }
                }
            }
        }
        let mut returns = Vec::new();
        for lease in done {
            if self.retired(&lease) {
                // Retired while the grant was in flight: whatever it brought goes back.
                let (units, since) = self.take_all(&lease);
                returns.push((lease, units, since));
            } else {
                // Release: `refilling` readers that see the flag clear also see the installed
                // word.
                lease.pending.store(false, Ordering::Release);
                lease.refilled.notify_waiters();
            }
        }
        self.give_back(&returns).await;
        for (lease, _, _) in returns {
            lease.refilled.notify_waiters();
        }
    }

    fn windowed(&self) -> bool {
        self.algo.windowed()
    }

    /// What a refill of `lease`, asked for at `t0`, requests: `(want, target)`, or `None`.
    fn prepare(&self, lease: &Lease, t0: Nanos) -> Option<(u64, u64)> {
        // Relaxed: the word is the whole state (see `take`).
        let word = lease.hot.word.load(Ordering::Relaxed);
        let windowed = self.windowed();
        let held = if windowed && expired(now_ms(t0), deadline_of(word)) {
            0
        } else {
            units_of(word)
        };
        let (want, target) = {
            let mut bg = lease.bg.lock();
            // First-touch units are not held: the first grant must cover them.
            let owed = bg.provisional;
            let held = held.saturating_sub(owed);
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
                .saturating_add(owed)
                .min(MAX_LEASE - held.min(MAX_LEASE));
            (want, bg.target)
        };
        (want > 0).then_some((want, target))
    }

    /// Applies the answer to a grant request of `want` units asked at `t0`. Returns the charge
    /// to send if first-touch units were spent that the grant did not cover.
    fn finish(
        &self,
        lease: &Lease,
        result: Result<Reply, Error>,
        t0: Nanos,
        want: u64,
        target: u64,
    ) -> Option<(UnitOp, u64)> {
        match result {
            Ok(reply) => {
                self.guard.answered();
                *lease.error.lock() = None;
                // Relaxed: the error itself is under its mutex.
                lease.failed.store(false, Ordering::Relaxed);
                self.install(lease, reply, t0, want, target)
            }
            Err(error) => {
                let wait = self.guard.probe_interval().as_nanos() as u64;
                let spent = {
                    let mut bg = lease.bg.lock();
                    bg.not_before = t0.saturating_add(wait);
                    let owed = bg.provisional;
                    self.void_provisional(lease, &mut bg, owed)
                };
                if error.is_transient() {
                    // Admitted without a grant, as during an outage.
                    self.guard.record_admitted(&lease.key, spent);
                    self.guard.transient_failure(&error);
                } else {
                    tracing::warn!(%error, "lease refill failed");
                    *lease.error.lock() = Some(error);
                    // Relaxed: the error itself is under its mutex.
                    lease.failed.store(true, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Installs a grant in `lease`. Returns the charge to send if first-touch units were
    /// spent that the grant did not cover.
    fn install(
        &self,
        lease: &Lease,
        reply: Reply,
        t0: Nanos,
        want: u64,
        target: u64,
    ) -> Option<(UnitOp, u64)> {
        let mut granted = reply.units;
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
                let wanted = reply
                    .fact
                    .saturating_add(want.saturating_mul(interval))
                    .saturating_sub(span);
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
        // First-touch units: those the grant covers become the lease's own (the grant counted
        // them in the window they were spent in); the rest are taken back, and those already
        // spent are charged to the state. A grant decided in a later window than the units'
        // covers none of them.
        let mut charge = None;
        if bg.provisional > 0 {
            let same_window = match (self.algo, window_start) {
                (Algo::Fixed { window } | Algo::Sliding { window }, Some(start)) => {
                    start / window == bg.provisional_window
                }
                _ => true,
            };
            let provisional = bg.provisional;
            let covered = if same_window {
                granted.min(provisional)
            } else {
                0
            };
            granted -= covered;
            let at = bg.provisional_at;
            let overdrawn = self.void_provisional(lease, &mut bg, provisional - covered);
            if same_window {
                // The covered units stay in the word below, as units of this window.
                bg.window_start = window_start;
            }
            if overdrawn > 0 {
                // Relaxed: a statistics counter.
                self.overdrawn.fetch_add(overdrawn, Ordering::Relaxed);
                let at = if same_window { None } else { Some(at) };
                charge = Some((UnitOp::Charge { at }, overdrawn));
            }
        }
        let now = self.clock.now();
        // The slowest recent refill, forgotten by an eighth per refill.
        bg.slowest = (now - t0).max(bg.slowest - bg.slowest / 8);
        // Refill when what is left covers two of the slowest recent refills, or half the
        // target, whichever is more (at most the target).
        let low_water = ((bg.rate * 2.0 * bg.slowest as f64) as u64)
            .max(target / 2)
            .min(target);
        // Relaxed: the word is the whole state (see `take`).
        let mut word = lease.hot.word.load(Ordering::Relaxed);
        let level = loop {
            let units = units_of(word);
            // Units of the same window stay valid until the new grant's deadline (it is as
            // conservative as the old one, and the server has just confirmed the window), even
            // if the old lease expired by age; a new window voids what is left of the old one.
            let same = window_start.is_none() || bg.window_start == window_start;
            let units = if same { units + granted } else { granted };
            match lease.hot.word.compare_exchange_weak(
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
        lease.hot.low_water.store(low_water, Ordering::Relaxed);
        // An overdraft charged now lands in the grant's window (one of an earlier window does not).
        let extra = match charge {
            Some((UnitOp::Charge { at: None }, units)) => units,
            _ => 0,
        };
        let (left, full_in) = self.view(&reply, extra);
        // Relaxed, all three: hints for the figures of decisions (see `allowed`).
        lease.hot.view_left.store(left, Ordering::Relaxed);
        lease.hot.view_at.store(now, Ordering::Relaxed);
        lease.hot.view_full_at.store(
            full_in.map_or(0, |d| now.saturating_add(d)),
            Ordering::Relaxed,
        );
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
        charge
    }

    /// The global state right after a grant, from its reply: the units it could still grant
    /// (every unit held in a lease counts as spent), and the wait until it is back to full
    /// capacity (`None` if it is full), by SPEC's `remaining` and `reset_after` at the
    /// server's time; `extra` units are about to be charged on top.
    fn view(&self, reply: &Reply, extra: u64) -> (u64, Option<u64>) {
        let limit = self.rule.limit();
        match self.algo {
            Algo::Gcra { interval, span } => {
                let debt = reply.fact.saturating_add(extra.saturating_mul(interval));
                let left = span.saturating_sub(debt) / interval.max(1);
                (left, (debt > 0).then_some(debt))
            }
            Algo::Fixed { window } => {
                let count = reply.count.saturating_add(extra);
                let left = limit.saturating_sub(count);
                (left, (count > 0).then_some(window - reply.fact))
            }
            Algo::Sliding { window } => {
                let (l, w, e) = (limit as i128, window as i128, reply.fact as i128);
                let cur = reply.count.saturating_add(extra) as i128;
                let prev = reply.prev as i128;
                // (L − est)·W, est = cur + prev·(W − e)/W; remaining = ⌈L − est⌉.
                let headroom = l * w - cur * w - prev * (w - e);
                let left = if headroom <= 0 {
                    0
                } else {
                    u64::try_from((headroom + w - 1) / w).unwrap_or(u64::MAX)
                };
                let full_in = if cur > 0 {
                    Some(2 * window - reply.fact)
                } else if prev > 0 {
                    Some(window - reply.fact)
                } else {
                    None
                };
                (left, full_in)
            }
        }
    }

    /// Takes back every unit of `lease` and forgets it: what to give back to Redis.
    fn retire(&self, lease: Arc<Lease>) -> (Arc<Lease>, u64, u64) {
        // Relaxed: keeps refills away for good; a check that still holds the lease finds it
        // empty.
        lease.pending.store(true, Ordering::Relaxed);
        let (units, since) = self.take_all(&lease);
        self.leases
            .remove_if(&lease.key, |_, v| Arc::ptr_eq(v, &lease));
        (lease, units, since)
    }

    /// Empties `lease`: its units and the server time of their window's last grant, read
    /// together under the lock that installs grants.
    fn take_all(&self, lease: &Lease) -> (u64, u64) {
        let bg = lease.bg.lock();
        let void = pack(0, now_ms(self.clock.now()));
        // Relaxed: the word is the whole state (see `take`).
        let word = lease.hot.word.swap(void, Ordering::Relaxed);
        // First-touch units were never granted: nothing of them goes back.
        (units_of(word).saturating_sub(bg.provisional), bg.grant_time)
    }

    /// Returns `(lease, units, since)`: `units` of `lease`, granted in the window of server
    /// time `since`, to Redis, all in one batch (one script call per Cluster slot, per
    /// `max_batch` keys). Those of a window that is over change nothing (the script checks):
    /// a fixed window's count is gone, a sliding window's `prev` still takes them back.
    async fn give_back(&self, returns: &[(Arc<Lease>, u64, u64)]) {
        let items: Vec<Units> = returns
            .iter()
            .filter(|(_, units, _)| *units > 0)
            .map(|(lease, units, since)| Units {
                key: self.exact.redis_key(&lease.key),
                op: UnitOp::Return { since: *since },
                units: *units,
            })
            .collect();
        if items.is_empty() {
            return;
        }
        let (results, calls) = self.exact.move_units(self.algo, &items).await;
        // Relaxed: a statistics counter.
        self.round_trips.fetch_add(calls, Ordering::Relaxed);
        for result in results {
            match result {
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
    }
}

/// The refill task: sends every refill asked for since its last batch at once (one script
/// call per Cluster slot), so that refills of many keys due together cost few round trips;
/// requests that arrive while a batch is in flight make the next batch.
async fn refills<C: RedisConnection>(inner: Arc<Inner<C>>) {
    loop {
        inner.wake.notified().await;
        loop {
            let batch = std::mem::take(&mut *inner.queue.lock());
            if batch.is_empty() {
                break;
            }
            inner.refill_batch(batch).await;
        }
    }
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
            let word = lease.hot.word.load(Ordering::Relaxed);
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
                    .hot
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
        // All returns in one batch: a script call per Cluster slot.
        let mut returns = expired_units;
        for lease in idle_leases {
            // Relaxed: the flag elects one refiller; the data it guards is under `bg`.
            if !lease.pending.swap(true, Ordering::Relaxed) {
                returns.push(inner.retire(lease));
            }
        }
        inner.give_back(&returns).await;
        drop(inner);
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
        lease.hot.word.store(pack(10, 100), Ordering::Relaxed);
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
}
