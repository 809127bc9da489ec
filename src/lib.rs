//! # tollgate
//!
//! Exact, lock-free, in-process rate limiting: GCRA / token bucket, leaky bucket (meter and
//! queue), fixed window, sliding window counter and sliding window log, each deciding exactly
//! by the rules of [`docs::decision_rules`] (`docs/decision-rules.md` in the repository: the
//! state, admission inequality, `remaining`, `retry_after` and `reset_after` of each algorithm,
//! costs and capacity errors). Which one to pick, with figures measured by
//! `tollgate replay --compare` on the sample traces: `docs/choosing.md` in the repository.
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
//! ## Design
//! - [`algorithm`]: each algorithm's rule as a pure function (state, now, cost) → (decision,
//!   state). Nothing there touches an atomic.
//! - [`state`]: the atomics. GCRA, leaky and both window counters pack a key's state in one
//!   `u64` updated by a compare-and-swap loop; the sliding log keeps a compact ring buffer.
//! - [`store`]: the sharded concurrent map of keyed limiters.
//! - [`limiter`]: [`Limiter`] and [`KeyedLimiter`] wire a [`clock`], a rule and a store.
//! - [`MultiLimiter`]: several quotas on one key, all or nothing.
//! - [`replay`]: the trace format of `tollgate replay`.
//! - `tower` (feature `tower`): a tower layer for HTTP servers (policies, client keys, 429s).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod algorithm;
pub mod clock;
/// Documents of the repository's `docs/` folder that travel with the crate.
pub mod docs {
    #[doc = include_str!("../docs/decision-rules.md")]
    pub mod decision_rules {}
}
mod decision;
pub mod limiter;
mod multi;
mod quota;
#[cfg(feature = "redis")]
pub mod redis;
pub mod replay;
pub mod state;
pub mod store;
mod sync;
#[cfg(feature = "tower")]
pub mod tower;
#[cfg(feature = "tokio")]
pub mod wait;

pub use algorithm::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, LeakyQueue, SlidingLog, SlidingWindow, TokenBucket,
};
pub use decision::{Decision, Error};
pub use limiter::{KeyedLimiter, KeyedLimiterBuilder, Limiter, OverflowPolicy};
pub use multi::MultiLimiter;
pub use quota::{Quota, QuotaError};
