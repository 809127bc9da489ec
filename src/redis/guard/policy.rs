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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureHandling {
    pub(super) policy: FailurePolicy,
    pub(super) failure_threshold: u32,
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
    /// `policy`, opening after 1 transient failure, probing every 200 ms, heartbeats every
    /// second, 1 node assumed until the first heartbeat.
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
    ///         .failure_threshold(1)
    ///         .probe_interval(Duration::from_millis(200))
    ///         .heartbeat_interval(Duration::from_secs(1))
    ///         .reconcile(false)
    /// );
    /// // One node is assumed, but not told: a node started while Redis is down with the
    /// // `Local` policy denies until it can count the fleet (see `assumed_nodes`).
    /// assert_ne!(handling, handling.assumed_nodes(1));
    /// ```
    pub fn new(policy: FailurePolicy) -> Self {
        FailureHandling {
            policy,
            failure_threshold: 1,
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

    /// How many transient failures in a row open the breaker (at least 1; default 1, so that
    /// no later check waits on a dead server).
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{FailureHandling, FailurePolicy};
    /// // Tolerate two lost replies on a flaky network before degrading.
    /// let handling = FailureHandling::new(FailurePolicy::Local).failure_threshold(3);
    /// # let _ = handling;
    /// // 0 would never open the breaker: it is raised to 1.
    /// let zero = FailureHandling::new(FailurePolicy::Local).failure_threshold(0);
    /// assert_eq!(zero, FailureHandling::new(FailurePolicy::Local).failure_threshold(1));
    /// ```
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How often an open breaker probes Redis (default 200 ms; at least 1 ms).
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
    ///   for a window, or for GCRA until the excess has drained at one unit per `T`; opt in
    ///   knowingly). `FailClosed` admits nothing, so there is nothing to charge.
    /// - **Algorithms**: all of them (GCRA / token bucket / leaky bucket as a meter and as a
    ///   queue, fixed window, sliding window counter, sliding log).
    /// - **What is charged, per key**: what the global state would still remember. Window
    ///   counters: the units admitted in the current window (and, sliding, the one before),
    ///   added to that window's count; usage in windows already over changes nothing and is
    ///   dropped. GCRA: the node runs its outage admissions through GCRA at the global `T`
    ///   from an empty bucket and adds the debt they still carry (rounded up to whole units)
    ///   to the global state's; units the bucket would have refilled since are not charged.
    ///   Sliding log: the units of each of the last two windows are appended as one entry at
    ///   the time of the newest of them (or of the log's newest entry, if later); those that
    ///   would already have expired are dropped.
    /// - **Never denied**: a charge may push a state past the limit (up to the largest value
    ///   a state holds, `2^52 − 1` units or ns); the key is then denied until the excess has
    ///   drained (GCRA) or slid out of the window (windows).
    /// - **When**: as soon as the probe finds Redis answering, then at every probe interval
    ///   while anything is owed (a check decided by the policy just as Redis came back is
    ///   charged at the next). One script call per Cluster slot for up to 1,024 charges at a
    ///   time (the next ones once those were answered). Units this node admitted by the policy
    ///   and not yet charged: [`GuardedLimiter::unreconciled`](super::GuardedLimiter::unreconciled).
    /// - **Exactly once**: each charge carries a token that the script keeps for a day next
    ///   to the key's state (`<state key>:charge:<token>`). A charge whose call fails in a
    ///   transient way (a timeout after the server ran it, a dropped connection, the task
    ///   stopped) stays owed and is sent again with the same token until Redis answers it,
    ///   and the script applies a token once.
    ///
    /// Charges use the node's wall clock to place units in windows (and as `now` for GCRA
    /// debts), so they are as accurate as the fleet's clocks agree with the server's. A check
    /// whose call timed out may still have reached Redis (a hung server runs what was queued
    /// once it resumes); the policy decides it too, and it is then counted twice (the checks
    /// that met the outage, at most one per check in flight when it began).
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
}
