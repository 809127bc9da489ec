//! Limiters: a clock, a quota and a store of states, wired together.
//!
//! - [`Limiter`]: one state (a whole service, one connection, one tenant known up front).
//! - [`KeyedLimiter`]: one state per key, in a sharded concurrent map, with automatic eviction
//!   of keys that have become indistinguishable from fresh ones and an optional `max_keys`.
//!
//! ```
//! use tollgate::{limiter::{KeyedLimiter, Limiter}, FixedWindow, Quota};
//! let global = Limiter::new(FixedWindow::new(Quota::per_second(100)?)?);
//! let per_user = KeyedLimiter::<u64, _>::new(FixedWindow::new(Quota::per_second(5)?)?);
//! // Admitted only if the user's limit and the global one both admit.
//! let admitted = per_user.check(&7).unwrap().allowed() && global.check().allowed();
//! assert!(admitted);
//! # Ok::<(), tollgate::QuotaError>(())
//! ```

// Explicit path: `loom-tests` includes `core.rs` on its own (see `algorithm.rs`).
#[path = "limiter/core.rs"]
pub(crate) mod core;
mod direct;
mod keyed;

pub(crate) use self::core::{Core, Sweep};
pub use self::direct::Limiter;
pub use self::keyed::{KeyedLimiter, KeyedLimiterBuilder, OverflowPolicy};
use crate::algorithm::Rule;
use crate::store::Stored;

/// A rule a limiter can run: [`Gcra`](crate::Gcra) (alias
/// [`TokenBucket`](crate::algorithm::TokenBucket), [`LeakyBucket`](crate::algorithm::LeakyBucket)),
/// [`LeakyQueue`](crate::LeakyQueue), [`FixedWindow`](crate::FixedWindow),
/// [`SlidingWindow`](crate::SlidingWindow), [`SlidingLog`](crate::SlidingLog).
///
/// Every [`Rule`] of the crate is one; what a rule tells about itself (its name, limit,
/// capacity and period) is [`Rule`]'s. The trait is sealed: how each rule's states are stored is
/// the crate's own business, and may change without a breaking change.
///
/// # Examples
/// Code generic over the rule, as a configuration loader might be:
/// ```
/// use tollgate::{Algorithm, FixedWindow, KeyedLimiter, Quota};
/// fn per_user<A: Algorithm>(rule: A) -> (String, KeyedLimiter<u64, A>) {
///     (format!("{} per user", A::NAME), KeyedLimiter::new(rule))
/// }
/// let (name, limiter) = per_user(FixedWindow::new(Quota::per_minute(60)?)?);
/// assert_eq!(name, "fixed-window per user");
/// assert!(limiter.check(&7)?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Algorithm: Rule + Stored {}

impl<A: Rule + Stored> Algorithm for A {}
