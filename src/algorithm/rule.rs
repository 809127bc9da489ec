//! The traits every rule implements, and the checks their constructors share.

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::{Quota, QuotaError};

pub(crate) mod sealed {
    /// Keeps [`Rule`](super::Rule) to this crate's rules.
    pub trait Sealed {}
}

/// What every rule tells about itself: [`Gcra`](crate::Gcra) (alias
/// [`TokenBucket`](crate::TokenBucket), [`LeakyBucket`](crate::LeakyBucket)),
/// [`LeakyQueue`](crate::LeakyQueue), [`FixedWindow`](crate::FixedWindow),
/// [`SlidingWindow`](crate::SlidingWindow), [`SlidingLog`](crate::SlidingLog).
///
/// The trait is sealed. Limiters take an [`Algorithm`](crate::Algorithm), which is a `Rule`
/// whose states the crate knows how to store.
///
/// # Examples
/// Code generic over the rule, as a configuration loader or a report might be:
/// ```
/// use tollgate::{algorithm::Rule, FixedWindow, Gcra, Quota};
/// fn describe<R: Rule>(rule: R) -> String {
///     format!("{}: {} per period, up to {} at once", R::NAME, rule.limit(), rule.capacity())
/// }
/// let quota = Quota::per_minute(60)?;
/// assert_eq!(describe(Gcra::new(quota.with_burst(5)?)?), "gcra: 60 per period, up to 5 at once");
/// assert_eq!(describe(FixedWindow::new(quota)?), "fixed-window: 60 per period, up to 60 at once");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Rule: Copy + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed {
    /// The canonical name, e.g. `"gcra"`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::{Rule, TokenBucket}, SlidingLog};
    /// assert_eq!(SlidingLog::NAME, "sliding-log");
    /// // An alias shares its rule's name.
    /// assert_eq!(TokenBucket::NAME, "gcra");
    /// ```
    const NAME: &'static str;

    /// `L`, as reported in every decision.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Rule, Gcra, Quota};
    /// let rule = Gcra::new(Quota::per_second(10)?.with_burst(50)?)?;
    /// assert_eq!(Rule::limit(&rule), 10);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn limit(&self) -> u64;

    /// The largest cost that can ever be admitted (`B`, `C` or `L`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Rule, Gcra, Limiter, Quota};
    /// let rule = Gcra::new(Quota::per_second(10)?.with_burst(50)?)?;
    /// assert_eq!(Rule::capacity(&rule), 50);
    /// // A larger cost is an error, not a denial: waiting would never help.
    /// assert!(Limiter::new(rule).check_n(51).is_err());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn capacity(&self) -> u64;

    /// The interval the rule must resolve: `B·T` for GCRA and the leaky buckets, `W` for the
    /// windows. A clock whose resolution exceeds a tenth of it is refused.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Rule, FixedWindow, Gcra, Quota};
    /// // Windows: W.
    /// assert_eq!(FixedWindow::new(Quota::per_minute(100)?)?.period(), 60_000_000_000);
    /// // GCRA: B·T = 50 × 100 ms = 5 s.
    /// assert_eq!(Gcra::new(Quota::per_second(10)?.with_burst(50)?)?.period(), 5_000_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn period(&self) -> Nanos;

    /// The quota's window `W` in nanoseconds, as the `RateLimit-Policy` header shows it.
    /// GCRA and the leaky queue keep only `T = W/L`, rounded to the nearest ns: `W` is
    /// recovered from `L·T` when it is a multiple of the first power of ten above `L`, else
    /// `L·T` is reported.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{algorithm::Rule, Gcra, Quota, SlidingWindow};
    /// let w = SlidingWindow::new(Quota::per_minute(100)?)?;
    /// assert_eq!(w.window_nanos(), 60_000_000_000);
    /// // GCRA keeps only T = 1 s / 7, rounded; W = 1 s is recovered from 7·T.
    /// let g = Gcra::new(Quota::new(7, Duration::from_secs(1))?)?;
    /// assert_eq!(g.window_nanos(), 1_000_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn window_nanos(&self) -> Nanos;
}

/// How many `u64` words a rule's parameters take (what a limiter's `set_quota` swaps).
pub const WORDS: usize = 5;
/// A rule's parameters as plain words.
pub type Words = [u64; WORDS];

/// A rule whose whole per-key state is one `u64` (0 = a fresh key): the pure decision
/// function, usable on its own (tests, simulations, a store of your own).
pub trait WordRule: Copy {
    /// (decision, next state). The next state equals `state` when denied or `cost == 0`. A cost
    /// above the rule's capacity is denied with `retry_after` = `u64::MAX` ns (never), the state
    /// unchanged (limiters refuse such a cost with [`crate::LimitError::CapacityExceeded`] instead).
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64);
    /// The state after giving back `cost` units at `now`.
    fn refunded(&self, state: u64, now: Nanos, cost: u64) -> u64;
    /// (decision, next state) of a reservation of `cost` units at `now`: by default the same
    /// as [`WordRule::decide`]. GCRA takes the units even when it would refuse them now
    /// (`TAT := max(TAT, t) + c·T`) and admits them with a delay, the instant its check would:
    /// waiters that reserve are served in the order they reserved, each charged once.
    fn reserve(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        self.decide(state, now, cost)
    }
    /// Whether `state` behaves as a fresh key at `now`.
    fn is_fresh(&self, state: u64, now: Nanos) -> bool;
}

/// Refuses a quota with an explicit burst for an algorithm that has none.
pub(crate) fn no_burst(quota: &Quota, algorithm: &'static str) -> Result<(), QuotaError> {
    if quota.has_burst() {
        Err(QuotaError::BurstNotSupported { algorithm })
    } else {
        Ok(())
    }
}

/// Refuses windows under 1 ms (decision rules: `W ≥ 1 ms` for windows).
pub(crate) fn window_at_least_1ms(quota: &Quota) -> Result<u64, QuotaError> {
    let window_nanos = quota.window_nanos();
    if window_nanos < 1_000_000 {
        Err(QuotaError::WindowTooShort { window_nanos })
    } else {
        Ok(window_nanos)
    }
}

/// Refuses a limit above `max`.
pub(crate) fn limit_at_most(quota: &Quota, max: u64) -> Result<u64, QuotaError> {
    let limit = quota.limit();
    if limit > max {
        Err(QuotaError::TooLarge {
            what: "limit",
            value: limit,
            max,
        })
    } else {
        Ok(limit)
    }
}

/// `W` of a rule that keeps only `T = W / L`, rounded to the nearest ns: `L·T` is within
/// `L/2` ns of `W`; when the nearest multiple of the first power of ten above `L` is that
/// close, it is `W` (2 s at `L = 7`: `L·T` is 2.000000002 s, shown as 3 s rounded up without
/// this).
pub(crate) fn window_of(interval: u64, limit: u64) -> u64 {
    let approx = interval.saturating_mul(limit);
    let Some(unit) = limit
        .checked_ilog10()
        .and_then(|digits| 10u64.checked_pow(digits + 1))
    else {
        return approx;
    };
    match (approx.saturating_add(unit / 2) / unit).checked_mul(unit) {
        // Only within the rounding error: an exact `L·T` stays as it is.
        Some(rounded) if rounded > 0 && rounded.abs_diff(approx) <= limit / 2 => rounded,
        _ => approx,
    }
}

#[cfg(test)]
mod tests {
    use super::window_of;

    /// The pure rules, given a cost above their capacity (which limiters refuse before deciding):
    /// a denial that changes nothing and never comes due, for any state and any cost.
    #[test]
    fn pure_rules_deny_costs_above_capacity_without_overflow() {
        use super::WordRule;
        use crate::{FixedWindow, Gcra, LeakyQueue, Quota, SlidingWindow};
        fn check<R: WordRule>(rule: R, capacity: u64) {
            let (_, state) = rule.decide(0, 1_000, 1);
            for cost in [capacity + 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                for now in [0, 1_000, u64::MAX / 2, u64::MAX] {
                    let (decision, next) = rule.decide(state, now, cost);
                    assert!(!decision.allowed(), "cost {cost} at {now}");
                    assert_eq!(decision.retry_after_nanos(), u64::MAX);
                    assert_eq!(next, state, "nothing changes");
                }
            }
        }
        let quota = Quota::per_second(10).unwrap();
        check(Gcra::new(quota).unwrap(), 10);
        check(LeakyQueue::new(quota).unwrap(), 10);
        check(FixedWindow::new(quota).unwrap(), 10);
        check(SlidingWindow::new(quota).unwrap(), 10);
    }

    #[test]
    fn windows_are_recovered_from_rounded_intervals() {
        // 2 s / 7 = 285_714_285.7 ns, kept as 285_714_286.
        assert_eq!(window_of(285_714_286, 7), 2_000_000_000);
        assert_eq!(window_of(333_333_333, 3), 1_000_000_000);
        assert_eq!(window_of(1_500_000_000, 2), 3_000_000_000);
        assert_eq!(window_of(1, 1), 1);
        assert_eq!(window_of(1, 5), 5);
        assert_eq!(window_of(3, 1_000_000), 3_000_000);
        assert_eq!(window_of(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(window_of(60_000_000_000 / 1_000, 1_000), 60_000_000_000);
    }
}
