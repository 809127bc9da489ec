//! [`Algorithm`]: what a limiter takes, a rule whose states the crate knows how to store.

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
