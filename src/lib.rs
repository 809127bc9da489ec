//! # tollgate
//!
//! Exact, in-process rate limiting, with each key's state in atomics updated by
//! compare-and-swap (a shard's lock is taken only when a key is new or a thread's cached table
//! is stale): GCRA / token bucket, leaky bucket
//! (meter and queue), fixed window, sliding window counter and sliding window log. Each decides exactly by
//! the rules written out in [`docs::decision_rules`]: the state, the admission inequality,
//! `remaining`, `retry_after` and `reset_after` of every algorithm, and how costs and capacity
//! errors work. "Exactly" is meant literally: the same requests at the same instants get the
//! same decisions from every limiter, under any number of threads, and from the Redis tier.
//! One exception: the in-process sliding log keeps its entries' times in ticks, 1 ns for a
//! window up to about 2.1 s and coarser beyond (see [`SlidingLog`]); its decisions are then
//! exact when request times are multiples of the tick, and never more permissive otherwise,
//! while the Redis tier's log keeps nanoseconds.
//!
//! This page is the guide; each type's page has the details and examples.
//!
//! ## Quick start
//! ```
//! use tollgate::{Gcra, KeyedLimiter, Quota};
//!
//! // 10 requests per second per client, bursts of up to 20.
//! let quota = Quota::per_second(10)?.with_burst(20)?;
//! let limiter: KeyedLimiter<String, Gcra> = KeyedLimiter::new(Gcra::new(quota)?);
//!
//! let decision = limiter.check("203.0.113.7").expect("no key bound set");
//! if decision.allowed() {
//!     // serve the request
//! } else {
//!     let _retry_after = decision.retry_after(); // render as `Retry-After`
//! }
//! # Ok::<(), tollgate::QuotaError>(())
//! ```
//!
//! A [`Quota`] is `L` units per window `W` (and, for GCRA, a burst `B`); an algorithm
//! ([`Gcra`], [`FixedWindow`], …) turns it into a rule, after checking that its state can hold
//! it; a limiter applies the rule at the instants its [`clock`] reads.
//!
//! ## What to pick
//!
//! | you want | take | why |
//! |---|---|---|
//! | an API limit with room for bursts | [`Gcra`] (= [`TokenBucket`]) | one `u64` per key, a burst separate from the rate, exact `retry_after`; never more than `B` plus what refills in a window |
//! | a smooth outgoing stream (calls to a paid API, a job queue) | [`LeakyQueue`] | admitted requests are told when to go ([`Decision::delay`]), one unit every `W/L` |
//! | "at most `L` in any window of length `W`", exactly | [`SlidingLog`] | no span of length `W` ever holds more than `L`; memory per admitted unit |
//! | quotas that reset on the clock ("1000 a day") | [`FixedWindow`] | simple to explain; lets up to `2L` through around each boundary |
//! | a cheap, smoother window | [`SlidingWindow`] | one `u64` per key; approximates the log, errs both ways by a little |
//!
//! When unsure, take [`Gcra`]: it is the cheapest, its burst is explicit, and it has no window
//! boundary to game. `docs/choosing.md` in the repository and the package backs this table
//! with `tollgate replay --compare` runs on the shipped traces (for example, what a fixed
//! window lets through around a boundary); [`docs::decision_rules`] says exactly how each
//! decides.
//!
//! ## Keyed or direct
//!
//! - [`Limiter`]: one state. Every call counts against the same quota: a whole service, one
//!   outgoing connection, one tenant known when the program starts. Checks return a
//!   [`Decision`] directly (they cannot fail, except for an impossible cost).
//! - [`KeyedLimiter`]: one state per key (client IP, API key, user id) in a concurrent map; a
//!   key is created on its first check. Look keys up by a borrowed form (`&str` for `String`):
//!   a known key costs no allocation. Checks return `Result<Decision, LimitError>`, because a key
//!   bound can refuse a new key.
//! - [`MultiLimiter`]: several quotas on one key (10 a second *and* 1000 an hour), admitted
//!   only if all admit; a request refused by one consumes nothing from the others.
//!
//! ```
//! use tollgate::{FixedWindow, Gcra, KeyedLimiter, Limiter, MultiLimiter, Quota};
//!
//! // All calls to a paid upstream share 100 a minute.
//! let upstream = Limiter::new(FixedWindow::new(Quota::per_minute(100)?)?);
//! assert!(upstream.check().allowed());
//!
//! // Each user: 5 a second, and 1000 an hour.
//! let users: MultiLimiter<u64, Gcra> = MultiLimiter::new([
//!     Gcra::new(Quota::per_second(5)?)?,
//!     Gcra::new(Quota::per_hour(1000)?)?,
//! ]);
//! assert!(users.check(&42).unwrap().allowed());
//!
//! // A keyed limiter with one quota.
//! let ips: KeyedLimiter<String, Gcra> = KeyedLimiter::new(Gcra::new(Quota::per_second(5)?)?);
//! assert!(ips.check("198.51.100.4").unwrap().allowed());
//! # Ok::<(), tollgate::QuotaError>(())
//! ```
//!
//! ## Costs
//!
//! A request may cost more than one unit (a batch of 50 rows, a 5-unit export):
//! `check_n(cost)`. A cost is admitted whole or not at all. `peek` asks what a request
//! would get without counting it, `refund` gives back units admitted but not used (a request
//! that failed before doing work), and a cost of 0 is always allowed and changes nothing.
//!
//! A cost the quota can *never* admit (above the burst for GCRA, above `L` for windows) is
//! not a denial, because no wait would help: it is [`LimitError::CapacityExceeded`], and nothing is
//! charged. Waiting and retrying would loop forever, so handle it as a bad request.
//!
//! ```
//! use tollgate::{LimitError, Gcra, Limiter, Quota};
//!
//! let limiter = Limiter::new(Gcra::new(Quota::per_second(10)?)?); // burst = 10
//! assert!(limiter.check_n(8)?.allowed());
//! assert!(!limiter.check_n(5)?.allowed()); // only 2 left: denied, nothing charged
//! limiter.refund(8); // the 8-unit job failed before doing anything
//! assert!(limiter.check_n(5)?.allowed());
//! assert_eq!(
//!     limiter.check_n(11),
//!     Err(LimitError::CapacityExceeded { cost: 11, capacity: 10 })
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Errors and what they mean
//!
//! - A **denial is not an error**: it is a [`Decision`] with `allowed() == false`, carrying
//!   `retry_after` (the shortest wait after which the same request would pass), `remaining`,
//!   `reset_after` and `limit`, ready for `Retry-After` or `RateLimit` headers.
//! - [`QuotaError`], when building: a quota or rule the algorithm cannot represent (a zero
//!   limit, a window under 1 ms for window algorithms, a limit above what the packed state
//!   holds, a burst on a window algorithm, a clock too coarse for the quota). It is a
//!   configuration mistake; report it at start-up.
//! - [`InFlightBoundError`], when building an [`InFlight`]: a concurrency bound of 0, or one
//!   above what its count holds (a concurrency limit has no quota, hence its own error).
//! - [`LimitError`], when checking: [`LimitError::CapacityExceeded`] (see Costs above) or
//!   [`LimitError::KeyTableFull`] (a keyed limiter at its `max_keys` bound with
//!   [`OverflowPolicy::Deny`] refuses a key it does not hold yet; known keys are unaffected).
//! - `wait::WaitError` (feature `tokio`), when a bounded wait (`acquire`, `acquire_n`, on
//!   every limiter) gives up: `TooLong`, or the check's [`LimitError`].
//!
//! No call panics on any input: constructors return [`QuotaError`] (or
//! [`InFlightBoundError`]), checks return [`LimitError`].
//! The Redis tier and the tower layer have error types of their own, which say whether a failure
//! is transient.
//!
//! ## The clock
//!
//! Limiters read time as nanoseconds since their own origin, through the [`Clock`](clock::Clock)
//! trait, once per call. The default [`QuantaClock`](clock::QuantaClock) is precise (a TSC
//! read); [`CoarseClock`](clock::CoarseClock) is one relaxed load, with a 1 ms tick, and is
//! refused ([`QuotaError::ClockTooCoarse`]) for quotas it cannot resolve;
//! [`ManualClock`](clock::ManualClock) moves only when told, for tests and replays.
//!
//! Time never goes backwards for a limiter: a reading older than the newest one it has seen is
//! treated as that newest one (clocks read on different cores can disagree slightly).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{clock::ManualClock, Gcra, Limiter, Quota};
//!
//! let clock = ManualClock::new();
//! let limiter = Limiter::with_clock(Gcra::new(Quota::per_second(1)?)?, clock.clone())?;
//! assert!(limiter.check().allowed());
//! let denied = limiter.check();
//! assert_eq!(denied.retry_after(), Duration::from_secs(1));
//! clock.advance(denied.retry_after());
//! assert!(limiter.check().allowed());
//! # Ok::<(), tollgate::QuotaError>(())
//! ```
//!
//! ## Eviction and memory bounds
//!
//! A keyed limiter forgets a key only when its state is indistinguishable from a fresh key's,
//! so forgetting never changes a decision. Two settings of [`KeyedLimiter::builder`] bound the
//! memory:
//! - [`evict_above`](KeyedLimiterBuilder::evict_above) (default
//!   [`DEFAULT_EVICT_ABOVE`](store::DEFAULT_EVICT_ABOVE), 2^21 keys): below it, every key is
//!   kept, so a client that returns finds its slot; above it, fresh unused keys make room, so
//!   a flood of one-time keys holds about that many. A soft bound; the default one rises (up
//!   to 2^24 keys) when the keys evicted come back, so that millions of returning clients
//!   keep their slots.
//! - [`max_keys`](KeyedLimiterBuilder::max_keys) with an [`OverflowPolicy`]: a hard bound.
//!   At the bound a new key replaces a fresh one if it finds one; otherwise `Deny` refuses it
//!   ([`LimitError::KeyTableFull`]) and `Shared` counts every key that did not fit against one
//!   shared state (strict in aggregate, never unlimited).
//!
//! ```
//! use tollgate::{LimitError, Gcra, KeyedLimiter, OverflowPolicy, Quota};
//!
//! let limiter = KeyedLimiter::<u32, _>::builder(Gcra::new(Quota::per_hour(10)?)?)
//!     .max_keys(2, OverflowPolicy::Deny)
//!     .build()?;
//! assert!(limiter.check(&1).unwrap().allowed());
//! assert!(limiter.check(&2).unwrap().allowed());
//! // Keys 1 and 2 hold state (a unit each, for the next 6 minutes): no room for key 3.
//! assert_eq!(limiter.check(&3), Err(LimitError::KeyTableFull { max_keys: 2 }));
//! assert!(limiter.check(&1).unwrap().allowed()); // known keys keep their limits
//! # Ok::<(), tollgate::QuotaError>(())
//! ```
//!
//! ## The Redis tier
//!
//! Where one process is not enough, a limit must hold across a fleet. With feature `redis`,
//! `tollgate::redis` keeps each key's state in Redis (a single server or a Cluster) and
//! decides by the same decision rules, so a key admits exactly what one in-process limiter
//! would:
//! - `RedisLimiter`, the exact tier: every check is one atomic script on the server, judged by
//!   the server's clock (one round trip, async on tokio). Errors say whether they are
//!   transient (`Error::is_transient`: a timeout, a dropped connection) or fatal.
//! - `GuardedLimiter` (`RedisLimiter::guarded`): the same behind a circuit breaker, with a
//!   `FailurePolicy` for outages: fail open, fail closed, or `Local`, this node's share of the
//!   quota in process.
//! - `LeasedLimiter` (`RedisLimiter::leased`): synchronous checks at in-process speed on units
//!   Redis granted this node in advance; the fleet admits no more than the limit (for GCRA,
//!   plus one horizon of the rate and one unit over any interval; see `LeasedLimiter`), and
//!   falls short of it by at most the units held in leases.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{Quota, redis::{FailureHandling, FailurePolicy, RedisLimiter, RedisRule}};
//!
//! // 100 a minute per tenant, across every node that shares this Redis.
//! let rule = RedisRule::gcra(Quota::per_minute(100)?)?;
//! let exact = RedisLimiter::connect("redis://127.0.0.1:6379", rule).await?;
//! let limiter = exact.guarded(FailureHandling::new(FailurePolicy::Local)).await;
//! if !limiter.check("tenant-42").await?.allowed() {
//!     // 429
//! }
//! # Ok(()) }
//! ```
//!
//! The tower layer takes any of them as a policy's backend (`tollgate::tower::RedisBackend`),
//! so moving a limit from one node to the fleet changes one argument. The `redis` module's
//! page covers the scripts, keys and TTLs, the bounds on limits and windows, and what each
//! tier guarantees when Redis fails.
//!
//! ## Features
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | the in-process limiters, clocks, algorithms and the [`replay`] trace format |
//! | `tower` | `tollgate::tower`: a tower layer for HTTP services (policies, client keys behind trusted proxies, 429 and gRPC denials, rate-limit headers, tiers) |
//! | `axum` | `tower`, and the layer reads axum's `ConnectInfo` for the peer address |
//! | `actix` | `tower`, and `tollgate::actix`: the layer's policies as an actix-web middleware |
//! | `tokio` | `tollgate::wait`: `until_ready` / `until_ready_n` and `acquire` / `acquire_n` (bounded) on every limiter, waiting on tokio's timer; with `tower`, the layer's delay mode |
//! | `metrics` | `tower`, and per-policy counters through the `metrics` facade, plus `tracing` debug events |
//! | `serde` | `tower`, and `tollgate::tower::config`: the whole layer from TOML, JSON or YAML |
//! | `redis` | `tollgate::redis`: exact, leased and guarded global limits on Redis or Redis Cluster |
//!
//! (The modules named above appear in these docs when their feature is on; docs.rs builds
//! with every feature.)
//!
//! ## Where to go next
//!
//! - [`prelude`]: `use tollgate::prelude::*;` imports the limiters, algorithms, quotas,
//!   decisions and errors, and with feature `tower` the layer, [`Policy`](tower::Policy) and
//!   what a server sets on it (`Policy::gcra(name, quota)` is a per-client policy in one call).
//! - [`docs::decision_rules`]: exactly how each algorithm decides; the boundary cases.
//! - [`KeyedLimiter`]: the store, eviction and its caveats; [`Decision`]: every figure.
//! - `tollgate replay` (the repository's `tollgate-cli` crate, on this crate's public API;
//!   `docs/cli.md` in the repository and the package): what a limit would do to a recorded
//!   trace, with a summary, a JSON object or an SVG plot; `--compare` runs every algorithm.
//! - README starts with a whole axum server (`examples/quickstart.rs`); `docs/tower.md` is the
//!   tower layer's guide (async waiting and configuration files included), `docs/security.md`
//!   what a client can and cannot choose, `docs/redis.md` the Redis tier;
//!   `examples/server.rs` is a whole axum server limited from `examples/policies.toml`.
//! - CONTRIBUTING.md, for anyone changing tollgate: commands, layout, rules and pitfalls.
//!
//! ## Design
//! - [`algorithm`]: each algorithm's rule as a pure function (state, now, cost) → (decision,
//!   state). Nothing there touches an atomic.
//! - The state cells (crate-private): GCRA, leaky and both window counters pack a key's state
//!   in one `u64` updated by a compare-and-swap loop; the sliding log keeps a compact ring
//!   buffer.
//! - [`store`]: the sharded concurrent map of keyed limiters (the lock-free word table by
//!   default, [`store::DashMapStore`] to compare), and the [`store::KeyedStore`] trait that
//!   names either.
//! - [`limiter`]: [`Limiter`] and [`KeyedLimiter`] wire a [`clock`], a rule and a store.
//! - [`MultiLimiter`]: several quotas on one key, all or nothing.
//! - [`replay`]: the trace format of `tollgate replay`.
//! - `tower` (feature `tower`): a tower layer for HTTP servers (policies, client keys, 429s).

#![deny(unsafe_code)]
#![deny(missing_docs)]
// docs.rs (`[package.metadata.docs.rs]` passes `--cfg docsrs`) builds on nightly, where
// `doc_cfg` marks every item behind a feature with its feature, read from its `#[cfg]`.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "actix")]
pub mod actix;
pub mod algorithm;
pub mod clock;
/// Documents of the repository's `docs/` folder that travel with the crate.
///
/// # Examples
/// A boundary case of [`decision_rules`](docs::decision_rules), run: in a sliding log, an
/// entry at exactly `t − W` has expired.
/// ```
/// use std::time::Duration;
/// use tollgate::{clock::ManualClock, Limiter, Quota, SlidingLog};
/// let clock = ManualClock::new();
/// let rule = SlidingLog::new(Quota::new(1, Duration::from_millis(60))?)?;
/// let limiter = Limiter::with_clock(rule, clock.clone())?;
/// assert!(limiter.check().allowed());
/// clock.advance(Duration::from_millis(60));
/// assert!(limiter.check().allowed()); // the entry at 0 stopped counting at 60 ms
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub mod docs {
    #[doc = include_str!("../docs/decision-rules.md")]
    pub mod decision_rules {}
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
}
// The pure rules and the stored limiters against SPEC's reference model, on random traces
// (a unit test: the pure rules' packed states are crate-private).
#[cfg(test)]
mod against_reference_tests;
mod decision;
pub mod limiter;
mod multi;
pub mod prelude;
mod quota;
#[cfg(feature = "redis")]
pub mod redis;
pub mod replay;
pub(crate) mod state;
pub mod store;
mod sync;
#[cfg(feature = "tower")]
pub mod tower;
#[cfg(feature = "tokio")]
pub mod wait;

// Inlined: the crate root's page lists the types most programs start from, not only their
// `pub use` lines.
#[doc(inline)]
pub use algorithm::{
    AlgorithmName, FixedWindow, Gcra, LeakyBucket, LeakyQueue, SlidingLog, SlidingWindow,
    TokenBucket,
};
pub use decision::{Decision, LimitError};
#[doc(inline)]
pub use limiter::{
    Algorithm, InFlight, InFlightBoundError, InFlightPermit, KeyedLimiter, KeyedLimiterBuilder,
    Limiter, OverflowPolicy, OwnedInFlightPermit,
};
pub use multi::MultiLimiter;
pub use quota::{Quota, QuotaError};
