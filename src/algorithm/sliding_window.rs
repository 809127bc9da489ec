//! Sliding window counter (SPEC §5): the previous window's count, weighted by how much of it
//! still overlaps the sliding window, plus the current window's count.
//!
//! ```text
//! est = cur + prev·(W − e)/W
//! allow iff (cur + c − 1)·W + prev·(W − e) < L·W      then cur += c
//! ```
//! All in 128-bit integers: no floating point in any decision.

use crate::algorithm::grid::{Lag, Windowed};
use crate::algorithm::WordRule;
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};
use crate::state::Words;

/// `prev` holds up to `L`; `cur` has one bit more, so that its all-ones value never occurs
/// (keyed stores use it for their marks).
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const CUR_BITS: u32 = COUNT_BITS + 1;
const CUR_MASK: u64 = (1 << CUR_BITS) - 1;
const INDEX_BITS: u32 = 64 - COUNT_BITS - CUR_BITS;

/// The largest limit the packed state holds: 2^20 − 1.
pub const MAX_LIMIT: u64 = COUNT_MASK;

/// Sliding window counter.
///
/// # State layout (one `u64`)
/// ```text
/// bits 63..41  window index k mod 2^23
/// bits 40..21  prev, units admitted in window k − 1  (so L ≤ 2^20 − 1)
/// bits 20..0   cur, units admitted in window k       (≤ L: the all-ones value never occurs,
///              keyed stores use it for their marks)
/// ```
/// In a limiter, stored indices are exact however long a key sits idle (the limiter re-anchors
/// them every 2^21 windows, 35 min at W = 1 ms, see `Windowed`); the rule on its own
/// ([`WordRule::decide`]) reads a state more than 2^23 − 16 windows old (2.3 h at W = 1 ms) as
/// a recent one.
///
/// # Examples
/// ```
/// use tollgate::{Quota, SlidingWindow};
/// let sw = SlidingWindow::new(Quota::per_minute(100)?)?;
/// assert_eq!(sw.limit(), 100);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow(Windowed);

/// The counts a state stands for at some instant.
struct View {
    index: u64,
    start: Nanos,
    elapsed: u64,
    prev: u64,
    cur: u64,
}

impl SlidingWindow {
    /// The rule for `quota`: `W ≥ 1 ms`, `L ≤ 2^20 − 1`, no burst.
    pub fn new(quota: Quota) -> Result<SlidingWindow, QuotaError> {
        Windowed::new(&quota, "sliding-window", MAX_LIMIT, INDEX_BITS).map(SlidingWindow)
    }

    /// `L`.
    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// `L`: the largest cost that can ever be admitted.
    pub fn capacity(&self) -> u64 {
        self.0.limit
    }

    /// `W` in nanoseconds.
    pub fn window(&self) -> u64 {
        self.0.grid.window
    }

    pub(crate) fn period(&self) -> Nanos {
        self.0.grid.window
    }

    pub(crate) fn take_over(self, previous: &Self, now: Nanos) -> Self {
        Self(self.0.take_over(&previous.0, now))
    }

    // By reference on purpose: `Algorithm::to_words(&self)` forwards here, and a by-value
    // inherent method would lose method resolution to the trait method (endless recursion).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        self.0.to_words()
    }

    pub(crate) fn from_words(words: Words) -> Self {
        Self(Windowed::from_words(words, INDEX_BITS))
    }

    pub(crate) fn horizon(&self) -> &Windowed {
        &self.0
    }

    pub(crate) fn rebase(self, now: Nanos) -> Self {
        Self(self.0.rebase(now))
    }

    #[inline]
    fn view(&self, state: u64, now: Nanos) -> View {
        let (index, start) = self.0.grid.locate(now);
        let stored = state >> (COUNT_BITS + CUR_BITS);
        let prev = (state >> CUR_BITS) & COUNT_MASK;
        let cur = state & CUR_MASK;
        // A fresh key (index 0 may read as any window near the base).
        let lag = if state == 0 {
            Lag::Behind(2)
        } else {
            self.0.lag(index, stored)
        };
        let (index, start, elapsed, prev, cur) = match lag {
            Lag::Behind(0) => (index, start, now - start.min(now), prev, cur),
            Lag::Behind(1) => (index, start, now - start.min(now), cur, 0),
            Lag::Behind(_) => (index, start, now - start.min(now), 0, 0),
            // Judged at the start of the stored window: the previous window weighs fully.
            Lag::Ahead(a) => (
                index.wrapping_add(a),
                start.saturating_add(a.saturating_mul(self.0.grid.window)),
                0,
                prev,
                cur,
            ),
        };
        View {
            index,
            start,
            elapsed,
            prev,
            cur,
        }
    }

    /// `L·W − cur·W − prev·(W − e)`: `(L − est)·W`.
    fn headroom(&self, v: &View, cur: u64) -> i128 {
        let w = self.0.grid.window as i128;
        self.0.limit as i128 * w - cur as i128 * w - v.prev as i128 * (w - v.elapsed as i128)
    }

    /// The first instant at which `cost` units would be allowed, as a wait from `now`.
    fn retry_after(&self, v: &View, now: Nanos, cost: u64) -> u64 {
        let w = self.0.grid.window as i128;
        let end = v.start.saturating_add(self.0.grid.window);
        // Still in this window: need prev·(W − e') < R with R = (L − cur − c + 1)·W.
        let r = (self.0.limit as i128 - v.cur as i128 - cost as i128 + 1) * w;
        if r > 0 && v.prev > 0 {
            let e = w + 1 - ceil_div(r, v.prev as i128);
            if e < w {
                return (v.start as i128 + e.max(0) - now as i128).max(0) as u64;
            }
        }
        // Next window: prev' = cur, cur' = 0; need cur·(W − e') < (L − c + 1)·W.
        let r = (self.0.limit as i128 - cost as i128 + 1) * w;
        let e = if v.cur == 0 {
            0
        } else {
            (w + 1 - ceil_div(r, v.cur as i128)).max(0)
        };
        if e < w {
            return (end as i128 + e - now as i128).max(0) as u64;
        }
        // The window after: both counts have slid out.
        end.saturating_add(self.0.grid.window).saturating_sub(now)
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    (a + b - 1) / b
}

impl WordRule for SlidingWindow {
    #[inline]
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let v = self.view(state, now);
        let w = self.0.grid.window as u128;
        let weighted_prev = v.prev as u128 * (w - v.elapsed as u128);
        let allowed =
            cost == 0 || (v.cur + cost - 1) as u128 * w + weighted_prev < self.0.limit as u128 * w;
        let cur = if allowed { v.cur + cost } else { v.cur };
        let end = v.start.saturating_add(self.0.grid.window);
        let reset_after = if cur > 0 {
            end.saturating_add(self.0.grid.window).saturating_sub(now)
        } else if v.prev > 0 {
            end.saturating_sub(now)
        } else {
            0
        };
        let decision = Decision {
            allowed: allowed.into(),
            limit: self.0.limit,
            retry_after: if allowed {
                0
            } else {
                self.retry_after(&v, now, cost)
            },
            reset_after,
            delay: 0,
            remaining: Remaining::ceil(self.headroom(&v, cur), self.0.grid.window),
        };
        let next = if allowed && cost > 0 && self.0.writable(v.index) {
            pack(v.index, v.prev, cur)
        } else {
            state
        };
        (decision, next)
    }

    /// Takes the units off the current window's count first, then off the previous one's (where
    /// units admitted just before a window boundary now count).
    fn refunded(&self, state: u64, now: Nanos, cost: u64) -> u64 {
        let v = self.view(state, now);
        if (v.cur == 0 && v.prev == 0) || !self.0.writable(v.index) {
            return state;
        }
        let from_cur = v.cur.min(cost);
        let from_prev = v.prev.min(cost - from_cur);
        pack(v.index, v.prev - from_prev, v.cur - from_cur)
    }

    fn is_fresh(&self, state: u64, now: Nanos) -> bool {
        let v = self.view(state, now);
        v.cur == 0 && v.prev == 0
    }
}

fn pack(index: u64, prev: u64, cur: u64) -> u64 {
    (index << (COUNT_BITS + CUR_BITS)) | (prev << CUR_BITS) | cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn rule(limit: u64, window_ms: u64) -> SlidingWindow {
        SlidingWindow::new(Quota::new(limit, Duration::from_millis(window_ms)).unwrap()).unwrap()
    }

    #[test]
    fn previous_window_weighs_by_overlap() {
        let sw = rule(10, 1000);
        let mut s = 0;
        for _ in 0..10 {
            let (d, next) = sw.decide(s, 500 * MS, 1);
            assert!(d.allowed());
            s = next;
        }
        // At 1250 ms: est = 0 + 10·0.75 = 7.5 → two more (7.5 < 10, 8.5 < 10, 9.5 < 10 → 3).
        let mut allowed = 0;
        for _ in 0..5 {
            let (d, next) = sw.decide(s, 1250 * MS, 1);
            allowed += d.allowed() as u32;
            s = next;
        }
        assert_eq!(allowed, 3);
    }

    #[test]
    fn retry_after_is_the_first_instant_allowed() {
        let sw = rule(10, 1000);
        let mut s = 0;
        for _ in 0..10 {
            s = sw.decide(s, 500 * MS, 1).1;
        }
        let (d, _) = sw.decide(s, 1000 * MS, 1);
        assert!(!d.allowed());
        let wait = d.retry_after_nanos();
        assert!(!sw.decide(s, 1000 * MS + wait - 1, 1).0.allowed());
        assert!(sw.decide(s, 1000 * MS + wait, 1).0.allowed());
    }
}
