//! Failure handling for the exact tier: a circuit breaker and a failure policy.
//!
//! While Redis answers, a [`GuardedLimiter`] is its [`RedisLimiter`]: every check is exact and
//! global. A check whose call fails in a transient way (timeout, refused or dropped
//! connection, cluster reconfiguring) is decided by the [`FailurePolicy`]; when failures last
//! or pile up (see "The breaker" on [`FailureHandling`]), the breaker opens and every check is
//! decided by the policy at once, without touching the network, until background probes find
//! Redis taking writes again (a `SET` of a key of the limiter's own), a few in a row; then the
//! breaker closes by itself. On a Cluster there is a breaker per slot owner (`owners.rs`).
//! Fatal errors (a foreign value in a key, a bad reply) are returned as they are: no policy
//! can fix them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use redis::cluster_routing::Slot;

use super::error::TierError;
use super::exact::{RedisConnection, RedisLimiter, UnitOp, Units};
use super::scripts::{scripts, ScriptCall};
use crate::decision::{Decision, Remaining};

mod breaker;
mod local;
mod owners;
mod policy;
mod reconcile;

use breaker::{Breaker, Phase};
use local::Local;
use owners::{key_slot, least_recovered, parse_slots, Owners};

pub use self::policy::{BreakerState, FailureHandling, FailurePolicy, GuardMode, HandlingError};

use self::reconcile::Ledger;
use super::exact::units::wall_nanos;

/// A [`RedisLimiter`] behind a circuit breaker, with a [`FailurePolicy`] for outages.
///
/// Cheap to clone (clones share the breaker, the connection and the local limiter). A
/// background task on the tokio runtime probes Redis while the breaker is open and, for the
/// `Local` policy, keeps this node's heartbeat; it stops when the last clone is dropped.
/// Mode changes are logged with `tracing` (`warn` when degrading, `info` when back).
///
/// The probes also heal the connection: after two failed in a row while the breaker is open
/// (a black-holed connection only times out, and the client library keeps it), or one that
/// meets `READONLY` on a single server (a demoted master), the connection is replaced by a
/// new one to the same address, used by the next probe and every later call. Only a
/// connection the builder made can be replaced; one given to
/// [`RedisLimiterBuilder::build`](super::RedisLimiterBuilder::build) is the caller's to heal.
///
/// # Examples
/// ```no_run
/// use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, GuardMode, RedisLimiter, RedisRule}};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let exact = RedisLimiter::connect("redis://127.0.0.1:6379", RedisRule::gcra(Quota::per_second(100)?)?).await?;
/// let limiter = exact.guarded(FailureHandling::new(FailurePolicy::Local)).await;
/// let decision = limiter.check("alice").await?; // never a transient error
/// if limiter.mode() != GuardMode::Global {
///     // decided locally: Redis is unreachable
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct GuardedLimiter<C: RedisConnection = ConnectionManager> {
    shared: Arc<Shared<C>>,
    _task: Arc<Task>,
}

impl<C: RedisConnection> std::fmt::Debug for GuardedLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedLimiter")
            .field("exact", &self.shared.exact)
            .field("handling", &self.shared.handling)
            .field("mode", &self.mode())
            .field("live_nodes", &self.live_nodes())
            .finish()
    }
}

struct Shared<C> {
    exact: RedisLimiter<C>,
    handling: FailureHandling,
    /// Closed: Redis decides; open or half-open: the failure policy does. One per Cluster
    /// slot owner for a guarded limiter on a Cluster.
    breakers: Breakers,
    /// The slot of the heartbeat key: failures of calls about no key (heartbeats,
    /// reconciliation) count on its owner's breaker.
    home: Slot,
    /// The breaker's time scale: ns since this instant.
    epoch: Instant,
    live_nodes: AtomicU64,
    local: Option<Local>,
    /// What the policy admitted while the breaker was open, until charged (`reconcile`).
    ledger: Option<Ledger>,
    heartbeat_key: Vec<u8>,
    node_id: String,
    /// The key of the last call that failed in a transient way: the probe writes next to it,
    /// on its Cluster slot, so the breaker closes when that slot answers again (not some
    /// other master's).
    probe_at: parking_lot::Mutex<Option<Box<[u8]>>>,
    /// Started while Redis was down with the `Local` policy and no fleet size told: the node
    /// cannot count the fleet, so it denies (rather than take the whole quota as if alone)
    /// until a heartbeat answers.
    uncounted: AtomicBool,
}

/// Aborts the background task when the last clone of the limiter is dropped.
struct Task(tokio::task::AbortHandle);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// This limiter behind a circuit breaker with `handling` (see [`GuardedLimiter`]).
    /// For the `Local` policy, sends the first heartbeat before returning (within the
    /// limiter's timeout), so the node's share is known from the start when Redis answers.
    /// A limiter built by [`RedisLimiterBuilder::connect_lazy`](super::RedisLimiterBuilder::connect_lazy)
    /// is probed first (within the timeout): if Redis does not answer, the breaker starts open
    /// and the policy decides until the probe finds Redis.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{FailureHandling, FailurePolicy, RedisLimiter};
    /// # async fn demo(exact: RedisLimiter) {
    /// let limiter = exact.guarded(FailureHandling::new(FailurePolicy::FailClosed)).await;
    /// # }
    /// ```
    pub async fn guarded(self, handling: FailureHandling) -> GuardedLimiter<C> {
        let shared = self.guard_state(handling, C::CLUSTERED);
        // A limiter that never connected is trusted only once Redis answers a probe.
        if shared.exact.is_lazy() && shared.exact.probe(None).await.is_err() {
            shared.start_degraded();
        } else if shared.local.is_some() {
            shared.beat().await;
        }
        let task = tokio::spawn(watch(Arc::downgrade(&shared)));
        GuardedLimiter {
            shared,
            _task: Arc::new(Task(task.abort_handle())),
        }
    }

    /// [`guarded`](Self::guarded) from synchronous code, its background task spawned on
    /// `runtime`: the first heartbeat is sent by that task rather than awaited here, so until
    /// it answers a `Local` policy assumes [`FailureHandling::assumed_nodes`] nodes.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{FailureHandling, FailurePolicy, RedisLimiter};
    /// # fn demo(exact: RedisLimiter, runtime: &tokio::runtime::Handle) {
    /// let limiter = exact.guarded_on(FailureHandling::new(FailurePolicy::Local), runtime);
    /// # }
    /// ```
    pub fn guarded_on(
        self,
        handling: FailureHandling,
        runtime: &tokio::runtime::Handle,
    ) -> GuardedLimiter<C> {
        let shared = self.guard_state(handling, C::CLUSTERED);
        if shared.exact.is_lazy() {
            // Not known to answer: the task's first probe closes the breaker if it does.
            shared.start_degraded();
        }
        let task = runtime.spawn(watch(Arc::downgrade(&shared)));
        GuardedLimiter {
            shared,
            _task: Arc::new(Task(task.abort_handle())),
        }
    }

    /// What a guarded limiter shares with its background task.
    /// `per_owner`: a breaker per Cluster slot owner (see `owners.rs`), else one.
    fn guard_state(self, handling: FailureHandling, per_owner: bool) -> Arc<Shared<C>> {
        let rule = self.rule();
        let local = (handling.policy == FailurePolicy::Local)
            .then(|| Local::new(&rule, handling.assumed_nodes))
            .flatten();
        let admits = matches!(
            handling.policy,
            FailurePolicy::Local | FailurePolicy::FailOpen
        );
        let ledger = (handling.reconcile && admits).then(|| Ledger::new(&rule));
        let mut heartbeat_key = self.redis_key("");
        // `<prefix>:<algorithm>:{}` → `<prefix>:<algorithm>:nodes`
        heartbeat_key.truncate(heartbeat_key.len().saturating_sub(2));
        heartbeat_key.extend_from_slice(b"nodes");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let breakers = if per_owner {
            Breakers::Owners(Owners::new(handling.breaker_settings()))
        } else {
            Breakers::One(Breaker::new(handling.breaker_settings()))
        };
        Arc::new(Shared {
            exact: self,
            handling,
            breakers,
            home: Slot::for_key(&heartbeat_key),
            epoch: Instant::now(),
            live_nodes: AtomicU64::new(handling.assumed_nodes),
            local,
            ledger,
            heartbeat_key,
            node_id: format!("{}-{nanos:x}", std::process::id()),
            probe_at: parking_lot::Mutex::new(None),
            uncounted: AtomicBool::new(false),
        })
    }
}

/// # Checking
impl<C: RedisConnection> GuardedLimiter<C> {
    /// Decides a request of cost 1 for `key`: globally while Redis answers, else by the
    /// failure policy.
    ///
    /// # Errors
    /// Only fatal errors (see [`TierError::is_fatal`]): transient failures are absorbed by the
    /// policy.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # async fn demo(limiter: GuardedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let allowed = limiter.check("alice").await?.allowed();
    /// # Ok(()) }
    /// ```
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, TierError> {
        self.check_n(key, 1).await
    }

    /// Decides a request of cost `cost` for `key` (see [`GuardedLimiter::check`]).
    ///
    /// # Errors
    /// [`TierError::Capacity`] if the cost can never be admitted; otherwise only fatal errors.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # async fn demo(limiter: GuardedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// let allowed = limiter.check_n("alice", 3).await?.allowed();
    /// # Ok(()) }
    /// ```
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, TierError> {
        let key = key.as_ref();
        let shared = &self.shared;
        let breaker = shared.breaker_of(key);
        if !breaker.is_open() {
            match shared.exact.check_n(key, cost).await {
                Ok(decision) => {
                    breaker.answered(|| shared.now());
                    if let Some(local) = &shared.local {
                        // The share follows the global state this reply saw: an outage starts
                        // each key from there, not from a full bucket.
                        // Relaxed: a count that publishes nothing; a stale one sizes one
                        // key's share by the previous heartbeat.
                        let nodes = shared.live_nodes.load(Ordering::Relaxed).max(1);
                        local.follow(key, decision.remaining() / nodes);
                    }
                    return Ok(decision);
                }
                Err(error) if error.is_transient() => shared.failed_on(&breaker, &error, Some(key)),
                Err(error) => return Err(error),
            }
        }
        shared.fallback(key, cost)
    }

    /// The current mode.
    ///
    /// On a Cluster (a breaker per slot owner) this is `Global` while every owner's breaker is
    /// closed, and `Degraded` while any is open or half-open, though the keys of the other
    /// owners are still decided by Redis: [`mode_of`](Self::mode_of) tells a key's.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{GuardedLimiter, GuardMode};
    /// # fn demo(limiter: GuardedLimiter) {
    /// if let GuardMode::Degraded(policy) = limiter.mode() {
    ///     eprintln!("Redis unreachable, deciding by {policy:?}");
    /// }
    /// # }
    /// ```
    pub fn mode(&self) -> GuardMode {
        // Relaxed loads (see `Breaker`): open and half-open both mean the policy decides.
        if self.shared.breakers.any_open() {
            GuardMode::Degraded(self.shared.handling.policy)
        } else {
            GuardMode::Global
        }
    }

    /// The mode `key`'s checks are decided in: on a Cluster, its slot owner's breaker's; on a
    /// single server, [`mode`](Self::mode).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{GuardedLimiter, GuardMode};
    /// # fn demo(limiter: GuardedLimiter) {
    /// if limiter.mode_of("alice") == GuardMode::Global {
    ///     // alice's master answers, whatever the other masters do
    /// }
    /// # }
    /// ```
    pub fn mode_of(&self, key: impl AsRef<[u8]>) -> GuardMode {
        // One Relaxed load (see `Breaker`).
        if self.shared.breaker_of(key.as_ref()).is_open() {
            GuardMode::Degraded(self.shared.handling.policy)
        } else {
            GuardMode::Global
        }
    }

    /// Where the circuit breaker is: [`BreakerState::HalfOpen`] while Redis answers probes
    /// but not yet enough in a row to close it (the mode is still degraded). On a Cluster, the
    /// least recovered of the slot owners' breakers: open if any is, else half-open if any is.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{BreakerState, GuardedLimiter, GuardMode};
    /// # fn demo(limiter: GuardedLimiter) {
    /// let open = limiter.breaker() != BreakerState::Closed;
    /// assert_eq!(open, limiter.mode() != GuardMode::Global);
    /// # }
    /// ```
    pub fn breaker(&self) -> BreakerState {
        match self.shared.breakers.phase() {
            Phase::Closed => BreakerState::Closed,
            Phase::Open => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The live nodes counted by the last heartbeat (`Local` policy; otherwise the assumed
    /// number).
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # fn demo(limiter: GuardedLimiter) {
    /// // With the Local policy, an outage leaves this node L / n of the quota.
    /// let share = limiter.exact().rule().limit() / limiter.live_nodes();
    /// println!("local share during an outage: {share}");
    /// # }
    /// ```
    pub fn live_nodes(&self) -> u64 {
        self.shared.live_nodes.load(Ordering::Relaxed)
    }

    /// The exact limiter underneath.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # async fn demo(limiter: GuardedLimiter) -> Result<(), tollgate::redis::TierError> {
    /// // Bypass the breaker, e.g. in a health check that must see Redis's own errors.
    /// let decision = limiter.exact().check("health-probe").await?;
    /// # let _ = decision;
    /// # Ok(()) }
    /// ```
    pub fn exact(&self) -> &RedisLimiter<C> {
        &self.shared.exact
    }

    /// Units the failure policy admitted on this node during an outage that are not yet
    /// charged to Redis (always 0 unless [`FailureHandling::reconcile`] is on). Once it reads
    /// 0 after a recovery, Redis's state includes every charge.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::{GuardedLimiter, GuardMode};
    /// # async fn demo(limiter: GuardedLimiter) {
    /// while limiter.mode() == GuardMode::Global && limiter.unreconciled() > 0 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    /// }
    /// # }
    /// ```
    pub fn unreconciled(&self) -> u64 {
        self.shared.ledger.as_ref().map_or(0, Ledger::pending)
    }

    /// Units charged to Redis after outages so far (see [`FailureHandling::reconcile`]):
    /// what the state counted, so usage in windows already over is not included.
    ///
    /// # Examples
    /// ```no_run
    /// # fn demo(limiter: tollgate::redis::GuardedLimiter) {
    /// println!("{} units admitted during outages were charged", limiter.reconciled());
    /// # }
    /// ```
    pub fn reconciled(&self) -> u64 {
        self.shared.ledger.as_ref().map_or(0, Ledger::charged)
    }

    /// Withdraws this node's heartbeat now (best effort, within the timeout), so the other
    /// nodes' shares grow at their next heartbeat instead of three intervals later.
    ///
    /// # Examples
    /// ```no_run
    /// # use tollgate::redis::GuardedLimiter;
    /// # async fn demo(limiter: GuardedLimiter) {
    /// // On shutdown (say, on SIGTERM), before the process exits.
    /// limiter.leave().await;
    /// # }
    /// ```
    pub async fn leave(&self) {
        if self.shared.local.is_some() {
            for (key, _) in self.shared.heartbeat_keys() {
                let _ = self.shared.heartbeat(&key, false).await;
            }
        }
    }
}

/// For the tiers that share this breaker and policy (the leased tier).
impl<C: RedisConnection> GuardedLimiter<C> {
    /// A transient failure seen outside [`GuardedLimiter::check_n`], on a call about `key`:
    /// counts toward opening.
    pub(crate) fn transient_failure(&self, error: &TierError, key: &[u8]) {
        self.shared.failed(error, Some(key));
    }

    /// A call about `key` that Redis answered: ends a run of failures of its breaker.
    pub(crate) fn answered(&self, key: &[u8]) {
        self.shared.breaker_of(key).answered(|| self.shared.now());
    }

    /// The breaker deciding `key`: on a Cluster, its slot owner's (see [`Gate`]); `None` on a
    /// single server, whose one breaker [`is_open`](Self::is_open) reads.
    pub(crate) fn gate_of(&self, key: &[u8]) -> Option<Gate> {
        match self.shared.breaker_of(key) {
            Of::One(_) => None,
            Of::Owner(breaker) => Some(Gate(breaker)),
        }
    }

    /// The failure policy's decision, without touching the network.
    #[inline]
    pub(crate) fn fallback(&self, key: &[u8], cost: u64) -> Result<Decision, TierError> {
        self.shared.fallback(key, cost)
    }

    /// Units admitted for `key` without Redis (a leased node's first-touch units that no grant
    /// covered): charged after the outage like the policy's, if reconciliation is on.
    pub(crate) fn record_admitted(&self, key: &[u8], units: u64) {
        if let Some(ledger) = &self.shared.ledger {
            ledger.record(key, units, wall_nanos());
        }
    }

    /// A charge of units admitted for `key` without Redis whose call failed in a transient
    /// way (it may have run): sent again with its token after the outage, if reconciliation
    /// is on, so that it is applied once. `formed`: the wall time it was formed at, which a
    /// charge of "now" (`at: None`) keeps when sent again.
    pub(crate) fn resend_charge(&self, key: &[u8], charge: &Units, formed: u64) {
        if let (Some(ledger), UnitOp::Charge { at }) = (&self.shared.ledger, charge.op) {
            ledger.resend(
                key,
                reconcile::Charge {
                    // A window's units count in the window they were admitted in.
                    at: at.or(Some(formed)),
                    units: charge.units,
                    token: charge.token,
                    counted: charge.units,
                },
            );
        }
    }

    /// Whether the breaker is open (the policy decides; on a Cluster, any owner's: the leased
    /// tier's guard has one breaker). `Relaxed` loads: a check that reads it a moment late
    /// decides one more request the old way (see `Breaker`).
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.shared.breakers.any_open()
    }

    /// Whether a leased node keeps spending what its leases hold while the breaker is open
    /// (`FailClosed`: granted units are no over-admission, and the policy would deny them).
    pub(crate) fn spends_leases_first(&self) -> bool {
        self.shared.handling.policy == FailurePolicy::FailClosed
    }

    /// Whether the policy keeps per-key state of its own (`Local`) that a leased node's
    /// handover must start.
    pub(crate) fn keeps_local_state(&self) -> bool {
        self.shared.local.is_some()
    }

    /// A leased node hands `key` over to the `Local` policy's limiter: it held `held` granted
    /// units, and its last grant saw `seen` more units the global state could still grant. The
    /// key's local state starts from `held + ⌊seen ÷ live nodes⌋` units (at most the share,
    /// and never more than it already holds), and reconciliation will not charge the first
    /// `held` units admitted locally (they were granted already).
    pub(crate) fn take_over(&self, key: &[u8], held: u64, seen: u64) {
        let Some(local) = &self.shared.local else {
            return;
        };
        let nodes = self.live_nodes().max(1);
        local.start_from(key, held.saturating_add(seen / nodes));
        if let Some(ledger) = &self.shared.ledger {
            ledger.credit(key, held);
        }
    }

    /// The probe interval (the `retry_after` of a policy denial).
    pub(crate) fn probe_interval(&self) -> Duration {
        self.shared.handling.probe_interval
    }
}

/// One Cluster slot owner's breaker, as the leased tier keeps a route per breaker: the same
/// gate while the owner keeps its name in the slot map.
#[derive(Clone)]
pub(crate) struct Gate(Arc<Breaker>);

impl Gate {
    /// Whether the policy decides this owner's keys. One `Relaxed` load (see `Breaker`).
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.0.is_open()
    }

    /// Whether both are the same owner's breaker.
    #[inline]
    pub(crate) fn same(&self, other: &Gate) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A guarded limiter's breakers: one, or one per Cluster slot owner.
enum Breakers {
    One(Breaker),
    Owners(Owners),
}

impl Breakers {
    /// Whether some master's breaker is closed (on a single server, the one).
    fn any_closed(&self) -> bool {
        match self {
            Breakers::One(breaker) => !breaker.is_open(),
            Breakers::Owners(owners) => owners.map().any_closed(),
        }
    }

    /// Whether the policy decides any key (a breaker is open or half-open).
    fn any_open(&self) -> bool {
        match self {
            Breakers::One(breaker) => breaker.is_open(),
            Breakers::Owners(owners) => owners.map().any_open(),
        }
    }

    /// The least recovered breaker's phase.
    fn phase(&self) -> Phase {
        match self {
            Breakers::One(breaker) => breaker.phase(),
            Breakers::Owners(owners) => {
                least_recovered(owners.map().owners.iter().map(|o| o.breaker.phase()))
            }
        }
    }

    /// The phase that sets the background task's pace: half-open if any breaker is (its
    /// probes come faster), else the least recovered.
    fn pace(&self) -> Phase {
        match self {
            Breakers::One(breaker) => breaker.phase(),
            Breakers::Owners(owners) => {
                let phases: Vec<Phase> = owners
                    .map()
                    .owners
                    .iter()
                    .map(|o| o.breaker.phase())
                    .collect();
                phases
                    .iter()
                    .copied()
                    .find(|p| matches!(p, Phase::HalfOpen { .. }))
                    .unwrap_or_else(|| least_recovered(phases))
            }
        }
    }
}

/// The breaker a call goes by: the limiter's one, or its key's slot owner's.
enum Of<'a> {
    One(&'a Breaker),
    Owner(Arc<Breaker>),
}

impl std::ops::Deref for Of<'_> {
    type Target = Breaker;

    fn deref(&self) -> &Breaker {
        match self {
            Of::One(breaker) => breaker,
            Of::Owner(breaker) => breaker,
        }
    }
}

impl<C: RedisConnection> Shared<C> {
    /// The breaker of `key`'s checks.
    #[inline]
    fn breaker_of(&self, key: &[u8]) -> Of<'_> {
        match &self.breakers {
            Breakers::One(breaker) => Of::One(breaker),
            Breakers::Owners(owners) => {
                let slot = key_slot(key, |key| self.exact.redis_key(key));
                Of::Owner(owners.breaker_of(slot))
            }
        }
    }

    /// The breaker of calls about no user key (heartbeats, reconciliation): the heartbeat
    /// key's slot owner's.
    fn home(&self) -> Of<'_> {
        match &self.breakers {
            Breakers::One(breaker) => Of::One(breaker),
            Breakers::Owners(owners) => Of::Owner(owners.breaker_of(self.home)),
        }
    }

    fn failed(&self, error: &TierError, key: Option<&[u8]>) {
        let breaker = match key {
            Some(key) => self.breaker_of(key),
            None => self.home(),
        };
        self.failed_on(&breaker, error, key);
    }

    /// A transient failure of a call about `key` (if any), counted on `breaker`.
    fn failed_on(&self, breaker: &Breaker, error: &TierError, key: Option<&[u8]>) {
        if let Some(key) = key {
            *self.probe_at.lock() = Some(key.into());
        }
        let topology = matches!(error, TierError::Unavailable { source }
            if source.is_cluster_error() || source.kind() == redis::ErrorKind::ClusterConnectionNotFound);
        let opened = breaker.failed(self.now());
        if let Breakers::Owners(owners) = &self.breakers {
            if opened || topology {
                owners.ask_refresh();
            }
        }
        if opened {
            tracing::warn!(
                policy = ?self.handling.policy,
                %error,
                "Redis unreachable: rate limits degraded to the failure policy"
            );
        }
    }

    /// Opens the breaker of a limiter that starts while Redis does not answer: the policy
    /// decides from the first check, and the probes close the breaker once Redis answers. With
    /// the `Local` policy and no fleet size told, its checks are denied until a heartbeat
    /// counts the fleet.
    fn start_degraded(&self) {
        if self.local.is_some() && !self.handling.nodes_told {
            // Relaxed: a mode flag that publishes no data (as the breaker's).
            self.uncounted.store(true, Ordering::Relaxed);
        }
        match &self.breakers {
            Breakers::One(breaker) => {
                breaker.force_open();
            }
            Breakers::Owners(owners) => {
                for owner in &owners.map().owners {
                    owner.breaker.force_open();
                }
            }
        }
        tracing::warn!(
            policy = ?self.handling.policy,
            uncounted = self.uncounted.load(Ordering::Relaxed),
            "Redis unreachable at start: rate limits decided by the failure policy until it answers"
        );
    }

    /// Ns on the breaker's time scale.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A probe that Redis answered; whether it closed `breaker`.
    fn recovered(&self, breaker: &Breaker) -> bool {
        let closed = breaker.probe_answered(self.now());
        if let (Breakers::Owners(owners), true) = (&self.breakers, closed) {
            owners.ask_refresh();
        }
        if closed {
            tracing::info!("Redis answers again: rate limits are global again");
        } else {
            tracing::debug!("Redis answered a probe: the breaker is half-open");
        }
        closed
    }

    #[inline]
    fn fallback(&self, key: &[u8], cost: u64) -> Result<Decision, TierError> {
        // Relaxed: a mode flag (see `start_degraded`).
        if self.uncounted.load(Ordering::Relaxed) {
            return self.deny_uncounted(cost);
        }
        if let (Some(local), None) = (&self.local, &self.ledger) {
            // The `Local` policy without reconciliation: the share's decision is the answer
            // (a cost it refuses goes the long way, for the global capacity's error).
            if let Ok(decision) = local.check(key, cost) {
                return Ok(decision);
            }
        }
        self.decide_by_policy(key, cost)
    }

    /// A check of a node that cannot count its fleet yet (see `start_degraded`): denied, to
    /// retry after a probe interval, as `FailClosed` would.
    #[cold]
    fn deny_uncounted(&self, cost: u64) -> Result<Decision, TierError> {
        let rule = self.exact.rule();
        let capacity = rule.capacity();
        if cost > capacity {
            return Err(TierError::Capacity { cost, capacity });
        }
        Ok(Decision {
            allowed: false.into(),
            limit: rule.limit(),
            retry_after: u64::try_from(self.handling.probe_interval.as_nanos()).unwrap_or(u64::MAX),
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(0),
        })
    }

    fn decide_by_policy(&self, key: &[u8], cost: u64) -> Result<Decision, TierError> {
        let rule = self.exact.rule();
        let capacity = rule.capacity();
        if cost > capacity {
            return Err(TierError::Capacity { cost, capacity });
        }
        let decision = |allowed: bool, remaining: u64, retry_after: u64| Decision {
            allowed: allowed.into(),
            limit: rule.limit(),
            retry_after,
            reset_after: 0,
            delay: 0,
            remaining: Remaining::Exact(remaining),
        };
        let probe = u64::try_from(self.handling.probe_interval.as_nanos()).unwrap_or(u64::MAX);
        let decision = match (self.handling.policy, &self.local) {
            (FailurePolicy::FailOpen, _) => decision(true, capacity - cost, 0),
            (FailurePolicy::Local, Some(local)) => match local.check(key, cost) {
                Ok(decision) => decision,
                // Beyond this node's share, though not the global capacity: a denial.
                Err(_) => decision(false, 0, probe),
            },
            (FailurePolicy::FailClosed, _) | (FailurePolicy::Local, None) => {
                decision(false, 0, probe)
            }
        };
        if let Some(ledger) = &self.ledger {
            if decision.allowed() {
                ledger.record(key, cost, wall_nanos());
            }
        }
        Ok(decision)
    }

    /// Charges what the policy admitted during the outage (see `FailureHandling::reconcile`).
    async fn reconcile(&self) {
        let Some(ledger) = &self.ledger else {
            return;
        };
        if ledger.is_empty() {
            return;
        }
        let before = ledger.charged();
        match ledger.settle(&self.exact).await {
            Ok(()) => {
                self.home().answered(|| self.now());
                tracing::info!(
                    units = ledger.charged() - before,
                    "charged the units admitted during the outage to Redis"
                );
            }
            Err(error) => {
                tracing::debug!(%error, "reconciliation failed; retrying at the next probe");
                self.failed(&error, None);
            }
        }
    }

    /// Renews the heartbeat and rescales the local share; a transient failure opens the
    /// breaker (an outage is noticed without traffic).
    ///
    /// On a Cluster the node beats on every master whose breaker is closed (see
    /// `heartbeat_keys`) and counts the most live nodes any of them saw: a master that fails
    /// leaves the fleet counted on the others.
    async fn beat(&self) {
        let mut counted = None;
        for (key, breaker) in self.heartbeat_keys() {
            if breaker.is_open() {
                continue;
            }
            match self.heartbeat(&key, true).await {
                Ok(nodes) => counted = counted.max(Some(nodes)),
                Err(error) if error.is_transient() => self.failed_on(&breaker, &error, None),
                Err(error) => tracing::warn!(%error, "heartbeat failed"),
            }
        }
        let Some(nodes) = counted else {
            return;
        };
        // Relaxed: a mode flag (see `start_degraded`); the fleet is counted now.
        self.uncounted.store(false, Ordering::Relaxed);
        let nodes = nodes.max(1);
        if self.live_nodes.swap(nodes, Ordering::Relaxed) != nodes {
            tracing::debug!(nodes, "live nodes changed");
            if let Some(local) = &self.local {
                local.rescale(&self.exact.rule(), nodes);
            }
        }
    }

    /// The heartbeat keys and the breakers of their masters: `<prefix>:<algorithm>:nodes`
    /// (every node, of every version, beats there), and on a Cluster one more per master, on
    /// its probe key's slot (`<probe key's state key>:nodes`): every node with the same slot
    /// map names the same keys.
    fn heartbeat_keys(&self) -> Vec<(Vec<u8>, Of<'_>)> {
        let mut keys = vec![(self.heartbeat_key.clone(), self.home())];
        if let Breakers::Owners(owners) = &self.breakers {
            for owner in owners.map().owners.iter().skip(1) {
                if let Some(probe) = &owner.probe {
                    let mut key = self.exact.redis_key(probe);
                    key.extend_from_slice(b":nodes");
                    keys.push((key, Of::Owner(Arc::clone(&owner.breaker))));
                }
            }
        }
        keys
    }

    /// Reads the Cluster's slot map when it is due (see `owners.rs`), within the timeout; a
    /// failed read is tried again at the next allowed time.
    async fn refresh_owners(&self) {
        let Breakers::Owners(owners) = &self.breakers else {
            return;
        };
        if owners.map().any_open() {
            // A master that fails may be failing over: its slots may move any time.
            owners.ask_refresh();
        }
        if !owners.due(Instant::now()) {
            return;
        }
        let mut conn = self.exact.connection();
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let read = slots.query_async::<redis::Value>(&mut conn);
        let ranges = match tokio::time::timeout(self.exact.timeout(), read).await {
            Ok(Ok(reply)) => parse_slots(&reply),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("timed out".to_owned()),
        };
        match ranges {
            Ok(ranges) => {
                let count = ranges.len();
                let installed = owners.install(ranges, |key| self.exact.redis_key(key));
                if installed.changed {
                    tracing::debug!(ranges = count, "read the Cluster's slot map");
                }
                if installed.failed_over {
                    tracing::info!("a failed Cluster master's slots are served by another");
                }
            }
            Err(error) => {
                tracing::debug!(%error, "could not read the Cluster's slot map");
                owners.ask_refresh();
            }
        }
    }

    /// After a failover, replaces the connection once a new one answers on a master that
    /// took slots over. The Cluster client refreshes its slots on a redirect or a dropped
    /// connection, not on a timeout: a master that hangs with its connection open would keep
    /// its failed-over slots' calls for good. A new connection reads the slots afresh (if the
    /// builder made it); the old one serves the other masters' keys meanwhile.
    async fn follow_failover(&self) {
        let Breakers::Owners(owners) = &self.breakers else {
            return;
        };
        let Some(at) = owners.failed_over() else {
            return;
        };
        let why = "a failed master's slots are served by another";
        if self.exact.replace_when_warm(at.as_deref(), why).await {
            owners.replaced();
        }
    }

    /// The breakers to probe now, each with the key its probe writes next to.
    fn open_breakers(&self) -> Vec<(Of<'_>, Option<Box<[u8]>>)> {
        match &self.breakers {
            Breakers::One(breaker) if breaker.is_open() => {
                vec![(Of::One(breaker), self.probe_at.lock().clone())]
            }
            Breakers::One(_) => Vec::new(),
            Breakers::Owners(owners) => owners
                .map()
                .owners
                .iter()
                .filter(|o| o.breaker.is_open())
                .map(|o| {
                    // The unknown owner writes next to the last key that failed.
                    let at = o.probe.clone().or_else(|| self.probe_at.lock().clone());
                    (Of::Owner(Arc::clone(&o.breaker)), at)
                })
                .collect(),
        }
    }

    fn tick(&self) {
        let now = self.now();
        match &self.breakers {
            Breakers::One(breaker) => breaker.tick(now),
            Breakers::Owners(owners) => {
                for owner in &owners.map().owners {
                    owner.breaker.tick(now);
                }
            }
        }
    }

    async fn heartbeat(&self, key: &[u8], beat: bool) -> Result<u64, TierError> {
        let expiry_ms = u64::try_from(self.handling.heartbeat_interval.as_millis() * 3)
            .unwrap_or(u64::MAX)
            .min(1 << 52);
        let mut call = ScriptCall::new(&scripts().heartbeat);
        call.key(key)
            .arg(&self.node_id)
            .arg(expiry_ms)
            .arg(if beat { "1" } else { "0" });
        // Reloaded on its slot's node alone, as every script call is.
        match self.exact.invoke(&call, true).await? {
            redis::Value::Int(nodes) => u64::try_from(nodes)
                .map_err(|_| TierError::bad_reply(format!("{nodes} live nodes"))),
            other => Err(TierError::bad_reply(format!(
                "expected live nodes, got {other:?}"
            ))),
        }
    }
}

/// When an open breaker's failed probes replace the connection with a new one (if the builder
/// made it; see `RedisLimiter::replace_connection`). The client library replaces its
/// connection only on errors it deems fatal to it: a connection that stopped answering (a
/// network black hole, a peer gone without a reset) only times out, and would be kept until
/// the kernel gives up on it. Two failed probes in a row (about 400 ms apart from the first
/// failure) tell a dead connection from one lost reply. While the server stays down, each
/// replacement waits for twice as many failed probes as the one before, up to 32 (about 6 s
/// at the default probe interval): a fleet whose Redis is down for long does not open a
/// connection per node every 400 ms, nor all at once when it comes back.
#[derive(Debug)]
struct Replacements {
    /// Probes failed in a row since the last replacement (or answer).
    failed: u32,
    /// Failed probes that make the next replacement.
    after: u32,
}

impl Replacements {
    const FIRST_AFTER: u32 = 2;
    const MOST_AFTER: u32 = 32;

    fn new() -> Replacements {
        Replacements {
            failed: 0,
            after: Self::FIRST_AFTER,
        }
    }

    /// A probe was answered: the connection works, the next failure starts afresh.
    fn answered(&mut self) {
        *self = Replacements::new();
    }

    /// A probe failed; whether to replace the connection now.
    fn failed(&mut self) -> bool {
        self.failed += 1;
        if self.failed < self.after {
            return false;
        }
        self.failed = 0;
        self.after = (self.after * 2).min(Self::MOST_AFTER);
        true
    }
}

/// The background task: probes while the breaker is open (a jittered probe interval apart,
/// a quarter of it apart while half-open), heartbeats while it is closed, and places the
/// answers counted since its last round in the breaker's failure-rate window.
async fn watch<C: RedisConnection>(shared: Weak<Shared<C>>) {
    let mut next_beat = Instant::now();
    let mut jitter = Jitter::seeded();
    let mut replacements = Replacements::new();
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        let interval = s.handling.probe_interval;
        s.tick();
        s.refresh_owners().await;
        s.follow_failover().await;
        // The probe is a write, what checks need: a server that answers but cannot take
        // writes (a demoted master, out of memory) keeps the breaker open. On a Cluster, each
        // open owner's probe writes on one of its own slots.
        let mut probes_failed = false;
        for (breaker, at) in s.open_breakers() {
            match s.exact.probe(at.as_deref()).await {
                Ok(()) => {
                    if s.recovered(&breaker) {
                        next_beat = Instant::now();
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "probe failed");
                    breaker.probe_failed();
                    probes_failed = true;
                }
            }
        }
        if !probes_failed {
            replacements.answered();
        } else if !matches!(&s.breakers, Breakers::Owners(o) if o.map().any_closed())
            && replacements.failed()
        {
            // On a Cluster only while no master answers: one that does shows the connection
            // works, and the Cluster client reconnects to each node by itself.
            s.exact.replace_connection("probes failed in a row");
        }
        // A late read of the breakers charges one probe later.
        if !s.breakers.any_open() {
            s.reconcile().await;
        }
        // On a Cluster, while any master answers (`beat` skips the others).
        if s.local.is_some() && s.breakers.any_closed() && Instant::now() >= next_beat {
            s.beat().await;
            next_beat = Instant::now() + s.handling.heartbeat_interval;
        }
        let wait = match s.breakers.pace() {
            Phase::Closed => interval,
            Phase::HalfOpen { .. } => interval / 4,
            Phase::Open => jitter.spread(interval),
        };
        drop(s);
        tokio::time::sleep(wait).await;
    }
}

/// The spread of an open breaker's probes (splitmix64): not on any decision path, so a
/// sequence per task, seeded from the clock and the process.
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Jitter {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Jitter(u64::from(nanos) ^ (u64::from(std::process::id()) << 32))
    }

    /// A wait drawn uniformly from `[interval / 2, 3 × interval / 2)`.
    fn spread(&mut self, interval: Duration) -> Duration {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let nanos = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        // `z / 2^64` of the interval, in [0, 1): a 128-bit product, no overflow.
        let part = ((u128::from(nanos) * u128::from(z)) >> 64) as u64;
        Duration::from_nanos(nanos / 2).saturating_add(Duration::from_nanos(part))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first replacement comes after two failed probes, each next one after twice as
    /// many, up to 32; an answer starts the count afresh.
    #[test]
    fn replacements_back_off_while_probes_keep_failing() {
        let mut r = Replacements::new();
        let mut gaps = Vec::new();
        let mut since = 0;
        for _ in 0..200 {
            since += 1;
            if r.failed() {
                gaps.push(since);
                since = 0;
            }
        }
        assert_eq!(gaps[..6], [2, 4, 8, 16, 32, 32]);
        assert!(gaps[6..].iter().all(|&g| g == 32), "{gaps:?}");
        r.answered();
        assert!(!r.failed());
        assert!(r.failed(), "two failures after an answer replace again");
    }

    /// Probe waits stay within `[½, 1½)` of the interval and spread over it.
    #[test]
    fn probe_waits_are_spread_around_the_interval() {
        let mut jitter = Jitter(7);
        let interval = Duration::from_millis(200);
        let waits: Vec<Duration> = (0..1_000).map(|_| jitter.spread(interval)).collect();
        assert!(waits
            .iter()
            .all(|w| *w >= interval / 2 && *w < interval * 3 / 2));
        let early = waits.iter().filter(|w| **w < interval).count();
        assert!(
            (400..600).contains(&early),
            "{early} of 1000 below the interval"
        );
        assert_eq!(
            Jitter(1).spread(Duration::MAX),
            Jitter(1).spread(Duration::MAX)
        );
    }
}
