//! What a request costs under a policy: a fixed number of units, or one computed from the
//! request's head.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// How many units a request costs.
///
/// Set on a policy with [`Policy::cost`](super::Policy::cost) (`Fixed`) or
/// [`Policy::cost_fn`](super::Policy::cost_fn) (`Fn`).
///
/// # Examples
/// ```
/// use tollgate::tower::Cost;
/// let cost = Cost::Fixed(5);
/// assert_eq!(format!("{cost:?}"), "Fixed(5)");
/// ```
#[derive(Clone)]
pub enum Cost {
    /// The same for every request of the policy.
    Fixed(u64),
    /// Computed from the request's head (e.g. from `content-length`).
    Fn(Arc<CostFn>),
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::Fixed(n) => f.debug_tuple("Fixed").field(n).finish(),
            Cost::Fn(_) => f.write_str("Fn(..)"),
        }
    }
}

impl Cost {
    pub(crate) fn of(&self, parts: &Parts) -> u64 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Fn(f) => f(parts),
        }
    }
}
