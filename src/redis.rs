//! Global rate limits on Redis (feature `redis`, async on tokio).
//!
//! Where one node is not enough, a limit must hold across a fleet. This module keeps each key's
//! state in Redis (a single server or a Cluster) and decides by the same decision rules as the
//! in-process limiters.
//!
//! ## On a deploy, a failover and a slow Redis
//! What each tier does on the days operators judge it by, with the defaults (each is detailed
//! in its section below, and on [`FailureHandling`]):
//!
//! | tier | on a deploy | on a failover | on a slow Redis |
//! |---|---|---|---|
//! | exact ([`RedisLimiter`]) | exact from the first check; [`connect`](RedisLimiterBuilder::connect) fails if Redis is down at boot, [`connect_lazy`](RedisLimiterBuilder::connect_lazy) starts and returns transient errors until it answers | each call fails after its 50 ms timeout (a transient [`TierError`]: your policy); a demoted master answering `READONLY` gets a new connection at once (a Cluster client follows its slots) | a call slower than 50 ms is a transient error, the others are exact |
//! | guarded ([`GuardedLimiter`]) | exact from the first check; down at boot (`connect_lazy`), the [`FailurePolicy`] decides from the first check (`Local`: the share of [`assumed_nodes`](FailureHandling::assumed_nodes), denied if none told) and it is global within a second of Redis answering | the breaker opens about 300 ms after the fault, then the policy decides at once; probes every 200 ms (jittered) replace a dead connection after two failures (then after 4, 8, … up to 32 while Redis stays down); three answered probes close it; on a Cluster, a breaker per master: the other masters' keys stay global | a check that times out is decided by the policy alone; a stall under about 300 ms never opens the breaker |
//! | leased ([`LeasedLimiter`]) | a key this node holds no lease of: `check` denies until its grant lands (1 ms `retry_after`), [`check_waiting`](LeasedLimiter::check_waiting) and the tower layer wait for it (at most twice the timeout) | as guarded once the breaker opens (on a Cluster, only the failed master's keys leave their leases); `Local` starts each key from what the node knew of it (its lease, its last grant), `FailClosed` spends the leases first | `check` never waits; a key whose refill timed out is decided by the policy until a refill succeeds |
//!
//! ## The exact tier: [`RedisLimiter`]
//! Every check is one atomic Lua script on the server (one round trip, `EVALSHA`, reloaded on
//! `NOSCRIPT`), judged by the server's clock (`TIME`), so all nodes share one clock and one
//! order of events per key. Decisions are exact: under any concurrency, across any number of
//! nodes, a key admits exactly what one in-process limiter would admit at the server's times.
//!
//! ```no_run
//! use tollgate::{Quota, redis::{RedisLimiter, RedisRule}};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let rule = RedisRule::named("sliding-log", Quota::per_minute(100)?)?;
//! let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
//! match limiter.check("tenant-42").await {
//!     Ok(d) if d.allowed() => { /* serve */ }
//!     Ok(d) => { /* 429, Retry-After: d.retry_after() */ }
//!     Err(e) if e.is_transient() => { /* Redis unreachable: apply your failure policy */ }
//!     Err(e) => return Err(e.into()), // misconfiguration: a foreign value in our key, …
//! }
//! # Ok(()) }
//! ```
//!
//! - **Algorithms**: all of the decision rules — GCRA / token bucket / leaky bucket (meter), leaky bucket
//!   as a queue (with [`Decision::delay`](crate::Decision::delay)), fixed window, sliding
//!   window counter, sliding window log — chosen by a [`RedisRule`].
//! - **Decisions** carry the same fields as in-process (`allowed`, `limit`, `remaining`,
//!   `retry_after`, `reset_after`, `delay`), computed by the same formulas of the decision rules in integer
//!   arithmetic. With the server's clock the durations are rounded up to its microsecond.
//! - **Windows** are aligned to the Unix epoch (decision rules §4).
//! - **Keys** are `<prefix>:<algorithm>:{<key>}`: the user key is the Cluster hash tag, so each
//!   key's state lives in one slot. Each state is one Redis key with a TTL equal to the time
//!   until it is indistinguishable from a fresh key (rounded up to the millisecond): memory
//!   follows the active keys, with no sweeper.
//! - **Connections**: checks share one multiplexed connection ([`RedisConnection`]); the
//!   default [`ConnectionManager`](redis::aio::ConnectionManager) reconnects by itself.
//!   [`RedisLimiterBuilder::connect_cluster`] runs the same API on a Redis Cluster.
//!   [`RedisLimiterBuilder::connect`] waits for Redis (the connect timeout, 1 s by default)
//!   and fails if it does not answer; [`RedisLimiterBuilder::connect_lazy`] (and
//!   `connect_cluster_lazy`) return at once and connect on first use (see "When Redis is down
//!   at boot" below).
//! - **Batches**: [`RedisLimiter::check_batch`] decides many checks in one script call (per
//!   Cluster slot on a Cluster; the calls are pipelined).
//! - **Several limits** on a key (10 a second and 1,000 an hour): [`RedisLimiter::with_rules`]
//!   gives a [`RedisMultiLimiter`], which decides them all in one script call, all or nothing.
//! - **Trace replay** in the trace's own time: [`replay_trace`] decides a trace for
//!   `tollgate replay --redis URL` with the very [`TraceOutcome`](crate::replay::TraceOutcome)s the
//!   in-process replay prints, and [`replay`] returns full decisions.
//! - **Errors** ([`TierError`]) are classified as transient (timeout, refused or dropped connection,
//!   cluster redirect or reconfiguration; a redirect on a connection that is not a Cluster
//!   connection is fatal, a configuration to fix) or fatal (a key of the wrong type, a value our
//!   scripts did not write, a reply outside the scripts' contract). Every call has a timeout
//!   (50 ms by default). No reply, however wrong, can cause a panic: replies are parsed into
//!   typed errors and every figure is checked before it is used.
//! - **Runtime**: every async function here runs on a tokio runtime with its time driver
//!   enabled (as the `redis` crate's tokio connections require).
//!
//! ## Limits of the Redis tier
//! Lua numbers are doubles, exact only below 2^53; times are nanoseconds since the epoch
//! (~1.8·10^18). The scripts keep absolute times as decimal strings and compute only with
//! differences and counts, which these bounds keep below 2^52:
//!
//! | quantity | maximum | constant |
//! |---|---|---|
//! | limit `L` (windows, log) | 2^51 ≈ 2.25·10^15 | [`MAX_LIMIT`] |
//! | window `W` | 2^51 ns ≈ 26.06 days | [`MAX_NANOS`] |
//! | GCRA / leaky bucket span `B·T` | 2^51 ns ≈ 26.06 days | [`MAX_NANOS`] |
//!
//! A larger value is refused when the [`RedisRule`] is built, with
//! [`QuotaError::TooLarge`](crate::QuotaError::TooLarge). Windows also need `W ≥ 1 ms`, as
//! in-process. The window counters accept far larger limits than the in-process packed states
//! (`2^24 − 2`, `2^20 − 1`); up to those, both decide identically.
//!
//! ## Failure handling: [`GuardedLimiter`]
//! [`RedisLimiter::guarded`] puts the exact tier behind a circuit breaker, tuned for a slow
//! Redis as well as a dead one. A check whose call fails in a transient way is decided by the
//! [`FailurePolicy`] — `FailOpen`, `FailClosed`, or `Local`: an in-process limiter holding this
//! node's share of the quota, `L ÷ live nodes`, the nodes being counted by heartbeats each
//! keeps in Redis. The breaker opens (and from then on every check is decided by the policy at
//! once, without touching the network) when calls have kept failing for 250 ms with no answer
//! between, or when at least 20 calls failed and they are half of the last second's; so a
//! stall up to about 300 ms (a fork, an fsync, another tenant's script) costs only the checks
//! it delayed, each decided by the policy after its 50 ms timeout, and a dead server opens the
//! breaker about 300 ms after the fault. While open, a background task probes Redis (every
//! 200 ms, jittered); an answered probe makes the breaker half-open, and three in a row close
//! it. The defaults and their reasons, what each tier does on a slow Redis and the bound on
//! timed-out checks counted twice are on [`FailureHandling`]. The [`GuardMode`] and the
//! [`BreakerState`] can be read at any time and every change is logged with `tracing`. On a
//! Cluster there is a breaker per slot owner (master): one master's failover sends only its
//! slots' keys to the policy; [`GuardedLimiter::mode`] is `Global` while every master's
//! breaker is closed, [`GuardedLimiter::mode_of`] tells a key's (see "On a Cluster" on
//! [`FailureHandling`]).
//! Measured in the tests against a server killed with `kill -9` or frozen with `SIGSTOP`: the
//! p99 check latency during the outage stays within the timeout + 5 ms, and global mode is
//! back well within 2 s of the restart; a server frozen for 60 ms leaves the node global
//! throughout (`tests/redis_breaker.rs`).
//!
//! ## The leased tier: [`LeasedLimiter`]
//! [`RedisLimiter::leased`] turns a limiter into a synchronous one: `check` is one lookup and
//! one compare-and-swap on this node's **lease** of the key, units that Redis granted
//! atomically out of the key's global state (the exact tier's own state, so exact and leased
//! nodes share one budget). A background refill keeps each lease above a low-water mark, its
//! size following the key's observed rate; unused units go back to Redis when the key goes
//! idle. While Redis answers, units are granted before they are spent and leases expire, so
//! the fleet admits no more than the limit for the window algorithms, and for GCRA no more
//! than `B + 1 + (b − a + horizon)/T` over any interval `[a, b]` (plus first-touch overdrafts,
//! if an allowance is configured); it falls short of the limit by at most the units held in
//! leases:
//! `L − admitted ≤ Σ_nodes held ≤ nodes × max_lease` per window when demand lasts (the
//! formula and its conditions are in [`LeasedLimiter`]'s docs). Leases work for GCRA /
//! token bucket / leaky bucket (meter), fixed window and sliding window counter; other
//! algorithms are refused with [`LeaseError::Unsupported`]. On a transient failure the
//! [`FailurePolicy`] decides, behind the same circuit breaker as [`GuardedLimiter`], at
//! in-process speed; with `Local`, each key's share starts from what the node last knew of it
//! (its lease, its last grant's view of the global state), so an outage does not begin with a
//! burst (the bound is in [`LeasedLimiter`]'s docs).
//!
//! ```no_run
//! use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, LeaseConfig, RedisLimiter, RedisRule}};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let rule = RedisRule::gcra(Quota::per_second(50_000)?)?;
//! let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", rule)
//!     .await?
//!     .leased(LeaseConfig::new(), FailureHandling::new(FailurePolicy::Local))
//!     .await?;
//! // Synchronous, no network: call it from any thread.
//! let allowed = limiter.check("tenant-42")?.allowed();
//! # Ok(()) }
//! ```
//!
//! **On a deploy** the exact and guarded tiers keep no per-node state: a new node decides
//! exactly from its first check. The leased tier keeps leases: a new node, or one that has not
//! seen a key for [`LeaseConfig::idle_timeout`] (1 s by default) and gave its lease back,
//! holds no lease of the key. `check` never waits on the network, so it denies such a key
//! (`retry_after` 1 ms) until the first grant arrives, and the bound above holds
//! unconditionally; [`LeasedLimiter::check_waiting`] (what the tower layer's
//! `RedisBackend` calls) waits for that grant instead, at most twice the call timeout
//! (50 ms by default), so a client under its limit is not refused however rarely each node
//! sees it, nor after a breaker flap emptied the leases. A key whose budget is spent is
//! refused at once by both, also on a node that gave its lease back since (what a spent key
//! owes outlives its lease). [`LeasedLimiter::prefetch`] fetches a lease ahead.
//! [`LeaseConfig::first_touch`] (or `first_touch_share`) lets `check` spend a provisional
//! allowance on a first touch instead, at the price of a bounded overdraft when the key's
//! budget was already spent: once per node until the key's state is full again, not once
//! per idle period (documented on [`LeasedLimiter`]). Refills and returns of many keys go to
//! Redis in one script call per Cluster slot.
//!
//! ## When Redis is down at boot
//! A node built with [`RedisLimiterBuilder::connect_lazy`] starts whether or not Redis
//! answers. [`RedisLimiter::guarded`] and [`RedisLimiter::leased`] on it probe Redis first
//! (one `SET` within the call timeout, 50 ms by default): if it does not answer, the breaker
//! starts open and the [`FailurePolicy`] decides from the first check. With `Local`, each key
//! gets the share of the fleet size the node was told
//! ([`FailureHandling::assumed_nodes`]: `⌊L ÷ n⌋` per `W`, `⌊B ÷ n⌋` burst); a node told no
//! fleet size denies until a heartbeat counts the fleet, since alone it would take the whole
//! quota. The breaker's probe (every 200 ms by default) finds Redis once it answers (the
//! connection retries at most 100 ms apart meanwhile), closes the breaker after two more
//! half-open probes 50 ms apart and sends the first heartbeat, and checks are global again:
//! measured well within a second after `redis-server` started
//! (`a_node_started_while_redis_is_down_serves_its_share_then_goes_global` in
//! `tests/redis_faults.rs`, which asserts within a second). On a Cluster,
//! [`RedisLimiterBuilder::connect_cluster_lazy`] does the same over a
//! [`LazyClusterConnection`] (the Cluster client connects when it is built, so
//! [`RedisLimiterBuilder::connect_cluster`] fails while no node answers): global about 0.2 s
//! after stopped nodes resumed, in
//! `a_node_started_while_the_cluster_is_down_serves_its_share_then_goes_global`.
//!
//! ## Reconciliation
//! With [`FailureHandling::reconcile`], the units a node admitted by its `Local` or `FailOpen`
//! policy during an outage are charged to Redis once it answers again (never denied; the
//! state may pass the limit), so that no usage is lost. [`GuardedLimiter::unreconciled`] and
//! `reconciled` report what is owed and what was charged. Each charge is applied once: it
//! leaves a token key (`<state key>:charge:<token>`) that lives only as long as the same
//! charge, sent again after a lost reply, could still count (the window of its units' time
//! and, for the sliding window counter, the next; a sliding log's window from its units'
//! time; for GCRA the debt it charged), and a charge that counted nothing (its window over,
//! its debt refilled) leaves none. A GCRA charge sent again leaves out what the bucket
//! refilled since it was formed.

mod error;
mod exact;
#[cfg(test)]
mod exact_tests;
mod guard;
mod lease;
mod replay;
mod rule;
mod scripts;

pub use self::error::{ErrorClass, TierError};
pub use self::exact::{
    LazyClusterConnection, RedisConnection, RedisLimiter, RedisLimiterBuilder, RedisMultiLimiter,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_TIMEOUT, TCP_KEEPALIVE_IDLE,
    TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_RETRIES, TCP_USER_TIMEOUT,
};
pub use self::guard::{
    BreakerState, FailureHandling, FailurePolicy, GuardMode, GuardedLimiter, HandlingError,
};
pub use self::lease::{LeaseConfig, LeaseError, LeaseStats, LeasedLimiter, MAX_LEASE};
pub use self::replay::{replay, replay_trace, ReplayError};
pub use self::rule::{RedisRule, RuleError, MAX_LIMIT, MAX_NANOS};
