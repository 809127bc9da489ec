//! [`Algorithm`]: what a limiter takes, a rule whose states the crate knows how to store.

use std::hash::Hash;

use crate::algorithm::Rule;
use crate::store::{CellOf, KeyedStore, Stored};

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
pub trait Algorithm: Rule + Stored {
    /// The store a [`KeyedLimiter`](crate::KeyedLimiter) of this rule keeps its keys in unless
    /// given another ([`KeyedLimiterBuilder::build_with_store`](crate::KeyedLimiterBuilder::build_with_store)):
    /// the lock-free word table. It is `KeyedLimiter`'s default fourth parameter, so that a
    /// field or a function generic over the rule names it as `KeyedLimiter<K, A>`; its
    /// concrete type is the crate's own business.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Algorithm, Gcra, KeyedLimiter, Quota, clock::QuantaClock};
    /// // The same type as `KeyedLimiter<u64, Gcra>`, written out.
    /// type PerUser = KeyedLimiter<u64, Gcra, QuantaClock, <Gcra as Algorithm>::DefaultStore<u64>>;
    /// let limiter: PerUser = KeyedLimiter::new(Gcra::new(Quota::per_second(1)?)?);
    /// assert!(limiter.check(&7)?.allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    type DefaultStore<K: Clone + Hash + Eq + Send + Sync>: KeyedStore<K, CellOf<Self>>;

    /// An empty default store (what `KeyedLimiterBuilder::build` fills).
    #[doc(hidden)]
    fn default_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::DefaultStore<K>;
}

// Hidden: the rule's page would otherwise show the crate-private trait this is read from.
impl<A: Rule + Stored> Algorithm for A {
    #[doc(hidden)]
    type DefaultStore<K: Clone + Hash + Eq + Send + Sync> = <A as Stored>::Store<K>;

    #[doc(hidden)]
    fn default_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::DefaultStore<K> {
        A::new_store()
    }
}
