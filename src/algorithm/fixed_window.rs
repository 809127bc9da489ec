//! Fixed window (decision rules §4): windows `[k·W, (k+1)·W)`, `n` = units admitted in the current one.
//!
//! ```text
//! allow iff n + c ≤ L        then n += c
//! ```

use crate::algorithm::grid::{windowed_rule, Lag, Windowed};
use crate::algorithm::rule::WordRule;
use crate::algorithm::rule::Words;
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};

const COUNT_BITS: u32 = 24;
const INDEX_BITS: u32 = 64 - COUNT_BITS;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The largest limit (see [`FixedWindow::MAX_LIMIT`]).
const MAX_LIMIT: u64 = COUNT_MASK - 1;

/// Fixed window counter.
///
/// # State layout (one `u64`)
/// ```text
/// bits 63..24  window index mod 2^40   (2^40 windows ≥ 34 years at W = 1 ms)
/// bits 23..0   n, units admitted in that window (n ≤ L ≤ 2^24 − 2)
/// ```
/// In a limiter, stored indices are exact however long a key sits idle (the limiter re-anchors
/// them every 2^39 − 2 windows, see `Windowed`); the packed state alone would read one more than
/// 2^40 − 16 windows old as a recent one.
///
/// # Examples
/// ```
/// use tollgate::{FixedWindow, Quota};
/// let fw = FixedWindow::new(Quota::per_minute(100)?)?;
/// assert_eq!(fw.limit(), 100);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow(Windowed<INDEX_BITS>);

windowed_rule!(
    FixedWindow,
    "fixed-window",
    "The rule for `quota`: `W ≥ 1 ms`, `L ≤ 2^24 − 2`, no burst."
);

impl FixedWindow {
    /// The largest limit the packed state holds: 2^24 − 2 (a count of all ones is left to a keyed
    /// store's marks, see `RETIRED`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{FixedWindow, Quota, QuotaError};
    /// assert_eq!(FixedWindow::MAX_LIMIT, (1 << 24) - 2);
    /// assert!(FixedWindow::new(Quota::per_minute(FixedWindow::MAX_LIMIT)?).is_ok());
    /// // One more does not fit the packed count.
    /// assert!(matches!(FixedWindow::new(Quota::per_minute(FixedWindow::MAX_LIMIT + 1)?), Err(QuotaError::TooLarge { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub const MAX_LIMIT: u64 = MAX_LIMIT;
}

impl FixedWindow {
    /// (window index, window start, n) of `state` as seen at `now`.
    #[inline]
    fn current(&self, state: u64, now: Nanos) -> (u64, Nanos, u64) {
        let (index, start) = self.0.grid.locate(now);
        let stored = state >> COUNT_BITS;
        let n = state & COUNT_MASK;
        if state == 0 {
            // A fresh key (index 0 may read as any window near the base).
            return (index, start, 0);
        }
        match self.0.lag(index, stored) {
            Lag::Behind(0) => (index, start, n),
            Lag::Behind(_) => (index, start, 0),
            Lag::Ahead(a) => (
                index.wrapping_add(a),
                start.saturating_add(a.saturating_mul(self.0.grid.window)),
                n,
            ),
        }
    }
}

fn pack(index: u64, n: u64) -> u64 {
    (index << COUNT_BITS) | n
}

impl FixedWindow {
    /// `decide` for `cost ≤ L`.
    #[inline(always)]
    fn decide_within(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let (index, start, n) = self.current(state, now);
        let to_end = start.saturating_add(self.0.grid.window).saturating_sub(now);
        let allowed = n + cost <= self.0.limit;
        let n_after = if allowed { n + cost } else { n };
        let decision = Decision {
            allowed: allowed.into(),
            limit: self.0.limit,
            retry_after: if allowed { 0 } else { to_end },
            reset_after: if n_after > 0 { to_end } else { 0 },
            delay: 0,
            remaining: Remaining::Exact(self.0.limit.saturating_sub(n_after)),
        };
        let next = if allowed && cost > 0 && self.0.writable(index) {
            pack(index, n_after)
        } else {
            state
        };
        (decision, next)
    }
}

impl WordRule for FixedWindow {
    #[inline]
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        self.0
            .within_limit(state, cost, |cost| self.decide_within(state, now, cost))
    }

    fn refunded(&self, state: u64, now: Nanos, cost: u64) -> u64 {
        let (index, start, n) = self.current(state, now);
        let _ = start;
        if n == 0 || !self.0.writable(index) {
            return state;
        }
        pack(index, n - n.min(cost))
    }

    fn is_fresh(&self, state: u64, now: Nanos) -> bool {
        self.current(state, now).2 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn rule(limit: u64, window_ms: u64) -> FixedWindow {
        FixedWindow::new(Quota::new(limit, Duration::from_millis(window_ms)).unwrap()).unwrap()
    }

    #[test]
    fn counts_per_aligned_window() {
        let fw = rule(3, 1000);
        let mut s = 0;
        let mut out = vec![];
        for t in [0, 10, 999, 999, 1000, 1500, 1999, 1999, 2000] {
            let (d, next) = fw.decide(s, t * MS, 1);
            out.push(d.allowed());
            s = next;
        }
        assert_eq!(
            out,
            [true, true, true, false, true, true, true, false, true]
        );
    }

    #[test]
    fn figures() {
        let fw = rule(3, 1000);
        let (d, s) = fw.decide(0, 200 * MS, 2);
        assert_eq!((d.remaining(), d.reset_after_nanos()), (1, 800 * MS));
        let (d, _) = fw.decide(s, 300 * MS, 2);
        assert!(!d.allowed());
        assert_eq!(d.retry_after_nanos(), 700 * MS);
        assert_eq!(fw.decide(0, 300 * MS, 0).0.reset_after_nanos(), 0);
    }

    #[test]
    fn refuses_bad_quotas() {
        let q = Quota::new(1 << 24, Duration::from_secs(1)).unwrap();
        assert!(matches!(
            FixedWindow::new(q),
            Err(QuotaError::TooLarge { .. })
        ));
        let q = Quota::new(1, Duration::from_micros(999)).unwrap();
        assert!(matches!(
            FixedWindow::new(q),
            Err(QuotaError::WindowTooShort { .. })
        ));
        assert!(FixedWindow::new(Quota::new(MAX_LIMIT, Duration::from_millis(1)).unwrap()).is_ok());
    }

    #[test]
    fn changing_the_window_carries_the_current_count() {
        let before = rule(2, 1000);
        let (_, s) = before.decide(0, 1500 * MS, 2);
        // Toggle W back and forth at the same instant: no fresh quota appears.
        let mid = rule(2, 700).take_over(&before, 1500 * MS);
        assert!(!mid.decide(s, 1500 * MS, 1).0.allowed());
        let after = rule(2, 1000).take_over(&mid, 1500 * MS);
        assert!(!after.decide(s, 1500 * MS, 1).0.allowed());
        // The new window starts at the change and lasts the new W.
        assert!(after.decide(s, 2500 * MS, 1).0.allowed());
    }

    #[test]
    fn a_state_from_a_later_window_is_judged_in_that_window() {
        let fw = rule(2, 1000);
        let (_, s) = fw.decide(0, 1500 * MS, 2);
        // A stale reading from the window before must not see a fresh window.
        assert!(!fw.decide(s, 900 * MS, 1).0.allowed());
    }
}
