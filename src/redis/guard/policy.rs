//! What a guarded limiter does while Redis is unreachable: the [`FailurePolicy`], the mode a
//! limiter reports, and the [`FailureHandling`] knobs (breaker, probes, heartbeats,
//! reconciliation).

use std::time::Duration;

/// What a [`GuardedLimiter`](super::GuardedLimiter) does while Redis is unreachable.
///
/// # Examples
/// ```
/// use tollgate::redis::{FailureHandling, FailurePolicy, GuardMode};
/// // A login endpoint: better to refuse than to let a credential-stuffing burst through.
/// let handling = FailureHandling::new(FailurePolicy::FailClosed);
/// assert_eq!(handling.policy(), FailurePolicy::FailClosed);
/// // While Redis is down, a limiter's mode names the policy deciding.
/// assert_ne!(GuardMode::Degraded(FailurePolicy::FailClosed), GuardMode::Global);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Allow every request (that the rule could ever admit). Availability first: the limit is
    /// not enforced during the outage.
    FailOpen,
    /// Deny every request, with `retry_after` = the probe interval. Protection first.
    FailClosed,
    /// Decide with an in-process limiter holding this node's share of the quota: `⌊L / n⌋`
    /// per `W` (and `⌊B / n⌋` burst) with `n` the live nodes counted by heartbeats in Redis.
    /// Each key's local state follows the global state's last reply on this node (it holds
    /// `⌊remaining / n⌋` after every check while Redis answers), so an outage starts from what
    /// the node last knew, not from a full bucket; a key it never checked starts from the share
    /// (a leased node starts from its lease and last grant: see "When Redis fails" on
    /// `LeasedLimiter`). While every node does the same, the fleet admits about `L` per window
    /// during an outage, plus, in its first window, what the nodes' last replies left (each
    /// node's part of it). For a GCRA rule, over the first `d` of an outage that starts at
    /// `f`, per key:
    ///
    /// ```text
    /// admitted  ≤  Σ_nodes ( ⌊r_i / n⌋ + ⌈(f + d − t_i) · ⌊L / n⌋ / W⌉ + 1 )
    /// ```
    ///
    /// with `r_i` the units node `i`'s last reply for the key said were left and `t_i` when it
    /// came. For a window rule, `⌊r_i / n⌋ + 1` per node until a window of the node's share
    /// ends (the share's windows are the node's, not the server's), and `⌊L / n⌋` more per node
    /// for each one that does. `tests/redis_faults.rs` checks both with two nodes under load:
    /// GCRA 1000/s, `kill -9` and `SIGSTOP`, 249-251 admitted per hot key in the first 250 ms
    /// against a bound of 256 (a full bucket per node: 1,250); fixed and sliding windows of a
    /// day, 0 against 6 (a fresh window per node: 1,000). With [`FailureHandling::reconcile`],
    /// what the shares admitted is charged to Redis after the outage.
    Local,
}

/// Whether checks are decided globally, in Redis, or by the failure policy.
///
/// # Examples
/// ```
/// use tollgate::redis::{FailurePolicy, GuardMode};
/// fn header(mode: GuardMode) -> &'static str {
///     match mode {
///         GuardMode::Global => "global",
///         GuardMode::Degraded(FailurePolicy::Local) => "local-share",
///         GuardMode::Degraded(FailurePolicy::FailOpen | FailurePolicy::FailClosed) => "degraded",
///     }
/// }
/// assert_eq!(header(GuardMode::Degraded(FailurePolicy::Local)), "local-share");
/// ```
/// A live limiter reports its mode with [`GuardedLimiter::mode`](super::GuardedLimiter::mode) and
/// [`LeasedLimiter::mode`](crate::redis::LeasedLimiter::mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuardMode {
    /// Redis answers: every check is exact and global.
    Global,
    /// Redis is unreachable: checks are decided by this policy.
    Degraded(FailurePolicy),
}

/// Where a guarded or leased limiter's circuit breaker is (see "The breaker" on
/// [`FailureHandling`]).
///
/// # Examples
/// ```no_run
/// # use tollgate::redis::{BreakerState, GuardedLimiter};
/// # fn demo(limiter: GuardedLimiter) {
/// if limiter.breaker() == BreakerState::HalfOpen {
///     // Redis answered a probe: global again after a few more.
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Redis decides (the mode is [`GuardMode::Global`]).
    Closed,
    /// The failure policy decides; a probe looks for Redis now and then.
    Open,
    /// Redis answered a probe: the failure policy still decides until it has answered
    /// [`FailureHandling::half_open_successes`] in a row.
    HalfOpen,
}

/// A [`FailureHandling`] setting out of its range.
///
/// # Examples
/// ```
/// use tollgate::redis::{FailureHandling, FailurePolicy, HandlingError};
/// let error = FailureHandling::new(FailurePolicy::Local).failure_rate(2.0).unwrap_err();
/// assert_eq!(error, HandlingError::FailureRate { rate: 2.0 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlingError {
    /// A failure rate outside `(0, 1]` (or not a number).
    #[error("a failure rate must be above 0 and at most 1, not {rate}")]
    FailureRate {
        /// The rate given.
        rate: f64,
    },
}

/// How a [`GuardedLimiter`](super::GuardedLimiter) handles failures.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::{FailureHandling, FailurePolicy};
/// let handling = FailureHandling::new(FailurePolicy::Local)
///     .probe_interval(Duration::from_millis(100))
///     .assumed_nodes(4);
/// assert_eq!(handling.policy(), FailurePolicy::Local);
/// ```
///
/// # The breaker
/// Closed, Redis decides every check. It opens on the first of:
/// - **a run of failures lasting [`open_after`](Self::open_after)** (250 ms): transient
///   failures with no call answered between, the first and the latest that far apart. A dead
///   server or a black-holed network fails every call from the fault on, so the breaker opens
///   about `timeout + open_after` (~300 ms) after it, whatever the traffic (the heartbeat
///   fails too, once a second). A stall of `S` (a fork, an fsync, another tenant's slow
///   script) fails the calls whose timeout `T` ends inside it, a run of about `S − T`: with
///   the defaults, stalls up to about 300 ms leave it closed. The figure is five timeouts:
///   long enough for the stalls a healthy server has, short enough that checks stop waiting
///   on a dead one within a third of a second.
/// - **a failure rate**: at least [`min_failures`](Self::min_failures) (20) failures making
///   [`failure_rate`](Self::failure_rate) (half) of the calls over the last
///   [`failure_window`](Self::failure_window) (1 s, sliding): a server that answers some calls
///   and loses many. A stall fails every call in flight at once (as many failures as checks
///   are in flight), but a busy node answered far more in the second before it; a quiet node
///   seldom meets 20 failures in one stall.
/// - **[`failure_threshold`](Self::failure_threshold) failures in a row**, if set (not by
///   default: under concurrency one stall fails every call in flight, so a count says little;
///   `failure_threshold(1)` is the breaker of earlier versions).
///
/// Open, the [`FailurePolicy`] decides every check at once, and a probe (a `SET` of a key of
/// the limiter's own, next to the last key that failed, on its Cluster slot) is sent after
/// a wait drawn from `[½, 1½) ×` [`probe_interval`](Self::probe_interval) (200 ms): the
/// nodes of a fleet that opened together do not probe together. A probe answered makes it
/// half-open: the policy still decides while [`half_open_successes`](Self::half_open_successes)
/// (3) probes in a row, a quarter of the probe interval apart, are answered; then it closes,
/// with a clean slate. A probe that fails in between opens it again. So after an outage a node
/// is global again about `probe_interval + half_open_successes × probe_interval / 4`
/// (~0.35 s) after Redis answers, and a server that answers once and stalls again keeps it on
/// its policy rather than flapping. [`GuardedLimiter::breaker`](super::GuardedLimiter::breaker)
/// reports the breaker's [`BreakerState`].
///
/// # On a Cluster
/// A guarded limiter on a Redis Cluster keeps a breaker per slot owner (each master, named
/// by its node id in `CLUSTER SLOTS`, read at start, when a breaker opens or closes, while one
/// is open, or when a call meets a topology error, at most every 2 s, and every 30 s anyway):
/// a master that fails or fails over opens its own breaker, and only the keys of its slots go
/// to the policy, while the other masters' keys stay global. Each owner's probe writes on one
/// of that owner's slots. Once the map shows an open master's slots served by another (its
/// replica promoted), the keys follow them there, on a breaker of the new master's; and since
/// the Cluster client re-reads its slots only on a redirect or a dropped connection, not on a
/// timeout, the limiter replaces its connection with a new one as soon as that one answers on
/// the new master (the builder's own connections only: with
/// [`connect_cluster`](crate::redis::RedisLimiterBuilder::connect_cluster)'s, the keys of a master
/// that hangs with its connection open stay on the policy until the kernel drops it). Tested
/// with one of three masters stopped, and with one failed over to its replica:
/// `tests/redis_breaker.rs`. [`GuardedLimiter::mode`](super::GuardedLimiter::mode) is `Global` only while every
/// owner's breaker is closed and [`GuardedLimiter::breaker`](super::GuardedLimiter::breaker)
/// is the least recovered one's; [`GuardedLimiter::mode_of`](super::GuardedLimiter::mode_of)
/// tells a key's. A `Local` node beats on every master whose breaker is closed
/// (`<prefix>:<algorithm>:nodes`, where every node beats, and one key on each master's
/// slots) and counts the most live nodes any of them saw, so the fleet is counted while a
/// master is down. Reconciliation runs once no owner's breaker is open. With Redis's default
/// `cluster-require-full-coverage yes`, a master that is down past `cluster-node-timeout`
/// with no replica to take its slots stops the whole Cluster (`CLUSTERDOWN` from every
/// master), and every owner's breaker opens. A leased limiter on a Cluster has the same
/// breakers, and a route and handover per owner: a master's failure hands over only the
/// leases of its keys, and the other keys keep theirs (`tests/redis_leased.rs`).
///
/// # On a slow Redis, with the defaults
/// - **Exact tier** ([`RedisLimiter`](super::RedisLimiter), no breaker): a check whose call does
///   not answer within the timeout (50 ms) fails with [`TierError::Timeout`](super::TierError).
/// - **Guarded tier**: while the breaker stays closed, each check whose call times out is
///   decided by the policy on its own (it waited the timeout), and the others are global; the
///   mode stays `Global`, nothing else changes (the `Local` shares, the heartbeats, the leases).
///   A stall up to about 300 ms therefore costs only the checks it delayed.
/// - **Leased tier**: `check` never waits; a refill that times out leaves its lease to back off
///   a probe interval and counts toward the breaker; no lease is emptied unless the breaker
///   opens. Until one of its refills succeeds, that key's checks the lease cannot serve are
///   decided by the policy, as a guarded check whose call failed is (`Local` starts the key
///   from what the node last knew of it, its share at most): a client under its limit is not
///   refused for the lease's sake while the breaker is still closed.
///
/// # Timed-out checks
/// A call that timed out may still have run: a stalled server runs what was queued once it
/// resumes. A guarded check whose call timed out is decided by the policy too, so when that
/// call ran and the policy admits (`Local`, `FailOpen`; `FailClosed` denies), the check is
/// counted twice, once in Redis and once by the policy. Only checks sent to Redis can be: at
/// most the checks whose calls timed out, which are those sent from one timeout before a stall
/// or an outage began until the breaker opened (with the defaults, the checks of about
/// `open_after + 2 × timeout` ≈ 350 ms of traffic; none once it is open, when nothing is sent),
/// each counted at most once more. With the `Local` policy the extra admissions are further
/// bounded by the node's share. [`reconcile`](Self::reconcile) charges what the policy admitted
/// again, since it cannot tell whether a timed-out call ran. A leased refill that timed out but
/// ran is the other way round: its units are counted in Redis and never received, an
/// under-admission until they expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureHandling {
    pub(super) policy: FailurePolicy,
    /// Failures in a row that open the breaker; `u32::MAX`: not set.
    pub(super) failure_threshold: u32,
    pub(super) open_after: Duration,
    pub(super) failure_window: Duration,
    /// In millionths.
    pub(super) failure_rate_ppm: u32,
    pub(super) min_failures: u32,
    pub(super) half_open_successes: u32,
    pub(super) probe_interval: Duration,
    pub(super) heartbeat_interval: Duration,
    pub(super) assumed_nodes: u64,
    /// Whether `assumed_nodes` was set: a node started while Redis is down with the `Local`
    /// policy and no fleet size denies (it cannot count the fleet, and alone it would take the
    /// whole quota) until a heartbeat answers.
    pub(super) nodes_told: bool,
    pub(super) reconcile: bool,
}

impl FailureHandling {
    /// `policy`, with the breaker tuned for a slow Redis as well as a dead one: it opens when
    /// calls have kept failing for 250 ms with no answer between, or when at least 20 calls
    /// failed and they are half of the calls of the last second; it probes every 200 ms
    /// (jittered) while open and closes after 3 probes in a row were answered. Heartbeats
    /// every second, 1 node assumed until the first heartbeat. See "The breaker" on
    /// [`FailureHandling`] for the reasons.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// let handling = FailureHandling::new(FailurePolicy::FailOpen);
    /// // The defaults, spelled out: setting them changes nothing.
    /// assert_eq!(
    ///     handling,
    ///     FailureHandling::new(FailurePolicy::FailOpen)
    ///         .open_after(Duration::from_millis(250))
    ///         .failure_window(Duration::from_secs(1))
    ///         .failure_rate(0.5)?
    ///         .min_failures(20)
    ///         .half_open_successes(3)
    ///         .probe_interval(Duration::from_millis(200))
    ///         .heartbeat_interval(Duration::from_secs(1))
    ///         .reconcile(false)
    /// );
    /// // No count of failures in a row opens it unless one is set.
    /// assert_ne!(handling, handling.failure_threshold(1));
    /// // One node is assumed, but not told: a node started while Redis is down with the
    /// // `Local` policy denies until it can count the fleet (see `assumed_nodes`).
    /// assert_ne!(handling, handling.assumed_nodes(1));
    /// # Ok::<(), tollgate::redis::HandlingError>(())
    /// ```
    pub fn new(policy: FailurePolicy) -> Self {
        FailureHandling {
            policy,
            failure_threshold: u32::MAX,
            open_after: Duration::from_millis(250),
            failure_window: Duration::from_secs(1),
            failure_rate_ppm: 500_000,
            min_failures: 20,
            half_open_successes: 3,
            probe_interval: Duration::from_millis(200),
            heartbeat_interval: Duration::from_secs(1),
            assumed_nodes: 1,
            nodes_told: false,
            reconcile: false,
        }
    }

    /// The policy.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// assert_eq!(FailureHandling::new(FailurePolicy::Local).policy(), FailurePolicy::Local);
    /// ```
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// Also open the breaker after this many transient failures in a row, with no answer
    /// between (at least 1; not set by default). Under concurrency a count in a row says
    /// little: one stall of a few milliseconds fails every call in flight at once, so the
    /// default rules count time ([`open_after`](Self::open_after)) and a rate
    /// ([`failure_rate`](Self::failure_rate)) instead. `failure_threshold(1)` is the breaker
    /// of earlier versions, which opened on the first failure: no check waits on a dead
    /// server for more than one timeout, but any stall longer than the timeout degrades the
    /// node for at least a probe interval.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // Degrade on the first timeout, as earlier versions did.
    /// let handling = FailureHandling::new(FailurePolicy::Local).failure_threshold(1);
    /// # let _ = handling;
    /// // 0 would open it before any failure: it is raised to 1.
    /// let zero = FailureHandling::new(FailurePolicy::Local).failure_threshold(0);
    /// assert_eq!(zero, FailureHandling::new(FailurePolicy::Local).failure_threshold(1));
    /// ```
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How long calls must keep failing, with no call answered between, before the breaker
    /// opens (default 250 ms; at least 1 ms). Measured between the first failure of the run
    /// and the latest, so a single failure never opens it, and a stall of `S` with the call
    /// timeout `T` makes a run of about `S − T`: with the defaults, a server that stops for up
    /// to ~300 ms (a fork, an fsync, another tenant's long script) leaves the breaker closed,
    /// and one that stops for good opens it about 300 ms after the fault. Until then each
    /// check waits its timeout and is decided by the policy on its own.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // Ride out stalls of up to a second (a large fork), at the price of checks that wait
    /// // their timeout for a second when Redis dies.
    /// let handling = FailureHandling::new(FailurePolicy::Local).open_after(Duration::from_secs(1));
    /// # let _ = handling;
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).open_after(Duration::ZERO),
    ///     FailureHandling::new(FailurePolicy::Local).open_after(Duration::from_millis(1))
    /// );
    /// ```
    pub fn open_after(mut self, duration: Duration) -> Self {
        self.open_after = duration.max(Duration::from_millis(1));
        self
    }

    /// The span over which the failure rate is measured (default 1 s; at least 10 ms): a
    /// sliding window over the calls to Redis (checks, refills, charges, heartbeats).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// let handling = FailureHandling::new(FailurePolicy::Local).failure_window(Duration::from_secs(5));
    /// # let _ = handling;
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).failure_window(Duration::ZERO),
    ///     FailureHandling::new(FailurePolicy::Local).failure_window(Duration::from_millis(10))
    /// );
    /// ```
    pub fn failure_window(mut self, window: Duration) -> Self {
        self.failure_window = window.max(Duration::from_millis(10));
        self
    }

    /// The share of calls over the [`failure_window`](Self::failure_window) that must fail
    /// to open the breaker, once the window holds [`min_failures`](Self::min_failures)
    /// (default 0.5): a server that answers some calls and loses many (an overloaded one, a
    /// lossy network) degrades the node even though no run of failures lasts.
    ///
    /// # Errors
    /// [`HandlingError::FailureRate`] unless `0 < rate ≤ 1`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy, HandlingError};
    /// let handling = FailureHandling::new(FailurePolicy::Local).failure_rate(0.25)?;
    /// # let _ = handling;
    /// assert!(matches!(
    ///     FailureHandling::new(FailurePolicy::Local).failure_rate(f64::NAN),
    ///     Err(HandlingError::FailureRate { .. })
    /// ));
    /// assert!(FailureHandling::new(FailurePolicy::Local).failure_rate(0.0).is_err());
    /// assert!(FailureHandling::new(FailurePolicy::Local).failure_rate(1.5).is_err());
    /// # Ok::<(), HandlingError>(())
    /// ```
    pub fn failure_rate(mut self, rate: f64) -> Result<Self, HandlingError> {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(HandlingError::FailureRate { rate });
        }
        // In (0, 1]: the product is in (0, 1e6], so the cast neither wraps nor saturates.
        self.failure_rate_ppm = ((rate * 1e6).round() as u32).max(1);
        Ok(self)
    }

    /// The failures the [`failure_window`](Self::failure_window) must hold before its rate
    /// can open the breaker (default 20; at least 1), so that a few failures among few calls
    /// (a quiet node meeting one stall) do not.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// let handling = FailureHandling::new(FailurePolicy::Local).min_failures(100);
    /// # let _ = handling;
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).min_failures(0),
    ///     FailureHandling::new(FailurePolicy::Local).min_failures(1)
    /// );
    /// ```
    pub fn min_failures(mut self, failures: u32) -> Self {
        self.min_failures = failures.max(1);
        self
    }

    /// How many probes in a row Redis must answer before an open breaker closes (default 3;
    /// at least 1). After the first, the breaker is half-open: the policy still decides, and
    /// the next probes follow a quarter of the probe interval apart (50 ms by default); a
    /// probe that fails opens it again. A server that answers once and stalls again (still
    /// loading, failing over, starved) keeps the node on its policy instead of flapping.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // Close on the first answered probe, as earlier versions did.
    /// let handling = FailureHandling::new(FailurePolicy::Local).half_open_successes(1);
    /// # let _ = handling;
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).half_open_successes(0),
    ///     FailureHandling::new(FailurePolicy::Local).half_open_successes(1)
    /// );
    /// ```
    pub fn half_open_successes(mut self, probes: u32) -> Self {
        self.half_open_successes = probes.max(1);
        self
    }

    /// How often an open breaker probes Redis (default 200 ms; at least 1 ms). Each wait is
    /// drawn between half and one and a half times the interval, so that the nodes of a fleet
    /// that opened together do not probe together.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // With FailClosed, denials carry the probe interval as their retry-after: keep it short.
    /// let handling = FailureHandling::new(FailurePolicy::FailClosed).probe_interval(Duration::from_millis(50));
    /// # let _ = handling;
    /// // Below the 1 ms floor, the floor applies.
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::FailClosed).probe_interval(Duration::ZERO),
    ///     FailureHandling::new(FailurePolicy::FailClosed).probe_interval(Duration::from_millis(1))
    /// );
    /// ```
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How often a node with the `Local` policy renews its heartbeat (default 1 s; at least
    /// 10 ms). A node silent for three intervals is no longer counted.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // A node that dies is dropped from the count after 3 × 250 ms, not 3 s.
    /// let handling = FailureHandling::new(FailurePolicy::Local).heartbeat_interval(Duration::from_millis(250));
    /// # let _ = handling;
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).heartbeat_interval(Duration::from_millis(1)),
    ///     FailureHandling::new(FailurePolicy::Local).heartbeat_interval(Duration::from_millis(10))
    /// );
    /// ```
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The number of nodes assumed before the first heartbeat answers. Unset, one is assumed
    /// (the whole quota) by a node that connected, and a node that starts while Redis is down
    /// ([`RedisLimiterBuilder::connect_lazy`](crate::redis::RedisLimiterBuilder::connect_lazy))
    /// with the `Local` policy denies until a heartbeat counts the fleet: it never assumes it
    /// is alone. Set the expected fleet size to serve each node's share from the start.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // A fleet of 8: a node that starts during an outage takes 1/8 of the quota, not all of it.
    /// let handling = FailureHandling::new(FailurePolicy::Local).assumed_nodes(8);
    /// # let _ = handling;
    /// // There is always at least this node.
    /// assert_eq!(
    ///     FailureHandling::new(FailurePolicy::Local).assumed_nodes(0),
    ///     FailureHandling::new(FailurePolicy::Local).assumed_nodes(1)
    /// );
    /// ```
    pub fn assumed_nodes(mut self, nodes: u64) -> Self {
        self.assumed_nodes = nodes.max(1);
        self.nodes_told = true;
        self
    }

    /// After an outage, charge to Redis what the policy admitted while the breaker was open,
    /// so that no usage is lost (default `false`).
    ///
    /// - **Policies**: `Local` (what this node's share admitted) and `FailOpen` (everything
    ///   it admitted: after a long outage under heavy traffic this can hold a busy key denied
    ///   for a window or two; for GCRA a charge owes at most the burst `B`, so the key is
    ///   denied at most about `B·T + T` after it; opt in knowingly). `FailClosed` admits
    ///   nothing, so there is nothing to charge.
    /// - **Algorithms**: all of them (GCRA / token bucket / leaky bucket as a meter and as a
    ///   queue, fixed window, sliding window counter, sliding log).
    /// - **What is charged, per key**: what the global state would still remember. Window
    ///   counters: the units admitted in the current window (and, sliding, the one before),
    ///   added to that window's count; usage in windows already over changes nothing and is
    ///   dropped. GCRA: the node runs its outage admissions through GCRA at the global `T`
    ///   from an empty bucket and adds the debt they still carry (rounded up to whole units,
    ///   at most `B` of them) to the global state's; units the bucket would have refilled
    ///   since are not charged.
    ///   Sliding log: the units of the last window, in parts of a sixteenth of a window,
    ///   each inserted in the log at the time of its newest unit (before the entries Redis
    ///   admitted since, whose counts move up: a write each), so a unit expires at most
    ///   `W/16` later than it would have, never earlier, and a key is admitted again about a
    ///   window after its local admissions; parts that would already have expired are
    ///   dropped.
    /// - **Never denied**: a charge may push a state past the limit (up to the largest value
    ///   a state holds, `2^52 − 1` units or ns); the key is then denied until the excess has
    ///   drained (GCRA) or slid out of the window (windows).
    /// - **When**: as soon as the probe finds Redis answering, then at every probe interval
    ///   while anything is owed (a check decided by the policy just as Redis came back is
    ///   charged at the next). One script call per Cluster slot for up to 1,024 charges at a
    ///   time (the next ones once those were answered). Units this node admitted by the policy
    ///   and not yet charged: [`GuardedLimiter::unreconciled`](super::GuardedLimiter::unreconciled).
    /// - **Exactly once**: each charge carries a token that the script keeps next to the
    ///   key's state (`<state key>:charge:<token>`) for as long as the same charge, sent
    ///   again, could still count: to the end of its units' window (of the next one for the
    ///   sliding window counter), a window from its units' time (sliding log), or the debt it
    ///   charged (GCRA, whose charge sent again leaves out what the bucket refilled since it
    ///   was formed). A charge that counted nothing keeps none. A charge whose call fails in
    ///   a transient way (a timeout after the server ran it, a dropped connection, the task
    ///   stopped) stays owed and is sent again with the same token until Redis answers it,
    ///   and the script applies a token once.
    ///
    /// Charges use the node's wall clock to place units in windows (and as `now` for GCRA
    /// debts), so they are as accurate as the fleet's clocks agree with the server's. A check
    /// whose call timed out may still have reached Redis (a hung server runs what was queued
    /// once it resumes); the policy decides it too, and it is then counted twice: see "Timed-out
    /// checks" on [`FailureHandling`] for the bound.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// let handling = FailureHandling::new(FailurePolicy::Local).reconcile(true);
    /// assert!(handling.reconciles());
    /// ```
    pub fn reconcile(mut self, reconcile: bool) -> Self {
        self.reconcile = reconcile;
        self
    }

    /// Whether units admitted during an outage are charged after it
    /// ([`FailureHandling::reconcile`]).
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // Off unless asked for.
    /// assert!(!FailureHandling::new(FailurePolicy::Local).reconciles());
    /// assert!(FailureHandling::new(FailurePolicy::Local).reconcile(true).reconciles());
    /// ```
    pub fn reconciles(&self) -> bool {
        self.reconcile
    }

    /// What moves the breaker, in the breaker's units.
    pub(super) fn breaker_settings(&self) -> super::breaker::Settings {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        super::breaker::Settings {
            threshold: self.failure_threshold,
            open_after: nanos(self.open_after),
            window: nanos(self.failure_window),
            rate_ppm: self.failure_rate_ppm,
            min_failures: self.min_failures,
            half_open_successes: self.half_open_successes,
        }
    }
}
