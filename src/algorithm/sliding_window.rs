//! Sliding window counter (decision rules §5): the previous window's count, weighted by how much of it
//! still overlaps the sliding window, plus the current window's count.
//!
//! ```text
//! est = cur + prev·(W − e)/W
//! allow iff (cur + c − 1)·W + prev·(W − e) < L·W      then cur += c
//! ```
//! All in 128-bit integers: no floating point in any decision.

use crate::algorithm::grid::{windowed_rule, Lag, Windowed};
use crate::algorithm::rule::WordRule;
use crate::algorithm::rule::Words;
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};

/// `prev` holds up to `L`; `cur` has one bit more, so that its all-ones value never occurs
/// (keyed stores use it for their marks).
const COUNT_BITS: u32 = 20;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const CUR_BITS: u32 = COUNT_BITS + 1;
const CUR_MASK: u64 = (1 << CUR_BITS) - 1;
const INDEX_BITS: u32 = 64 - COUNT_BITS - CUR_BITS;

/// The largest limit (see [`SlidingWindow::MAX_LIMIT`]).
const MAX_LIMIT: u64 = COUNT_MASK;

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
/// them every 2^22 − 2 windows, 70 min at W = 1 ms, see `Windowed`); the packed state alone
/// would read one more than 2^23 − 16 windows old (2.3 h at W = 1 ms) as a recent one.
///
/// # Examples
/// ```
/// use tollgate::{Quota, SlidingWindow};
/// let sw = SlidingWindow::new(Quota::per_minute(100)?)?;
/// assert_eq!(sw.limit(), 100);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow(Windowed<INDEX_BITS>);

/// The counts a state stands for at some instant.
struct View {
    index: u64,
    start: Nanos,
    elapsed: u64,
    prev: u64,
    cur: u64,
}

windowed_rule!(
    SlidingWindow,
    "sliding-window",
    "The rule for `quota`: `W ≥ 1 ms`, `L ≤ 2^20 − 1`, no burst."
);

impl SlidingWindow {
    /// The largest limit the packed state holds: 2^20 − 1.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, QuotaError, SlidingWindow};
    /// assert!(SlidingWindow::new(Quota::per_minute(SlidingWindow::MAX_LIMIT)?).is_ok());
    /// assert!(matches!(SlidingWindow::new(Quota::per_minute(SlidingWindow::MAX_LIMIT + 1)?), Err(QuotaError::TooLarge { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub const MAX_LIMIT: u64 = MAX_LIMIT;
}

impl SlidingWindow {
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
    #[inline]
    fn headroom<T: Wide>(&self, v: &View, cur: u64) -> T {
        let w = T::of(self.0.grid.window);
        T::of(self.0.limit) * w - T::of(cur) * w - T::of(v.prev) * (w - T::of(v.elapsed))
    }

    /// The first instant at which `cost` units would be allowed, as a wait from `now`.
    fn retry_after<T: Wide>(&self, v: &View, now: Nanos, cost: u64) -> u64 {
        let w = T::of(self.0.grid.window);
        let (zero, one) = (T::of(0), T::of(1));
        let end = v.start.saturating_add(self.0.grid.window);
        // Still in this window: need prev·(W − e') < R with R = (L − cur − c + 1)·W.
        let r = (T::of(self.0.limit) - T::of(v.cur) - T::of(cost) + one) * w;
        if r > zero && v.prev > 0 {
            let e = w + one - ceil_div(r, T::of(v.prev));
            if e < w {
                return (v.start as i128 + e.max(zero).wide() - now as i128).max(0) as u64;
            }
        }
        // Next window: prev' = cur, cur' = 0; need cur·(W − e') < (L − c + 1)·W.
        let r = (T::of(self.0.limit) - T::of(cost) + one) * w;
        let e = if v.cur == 0 {
            zero
        } else {
            (w + one - ceil_div(r, T::of(v.cur))).max(zero)
        };
        if e < w {
            return (end as i128 + e.wide() - now as i128).max(0) as u64;
        }
        // The window after: both counts have slid out.
        end.saturating_add(self.0.grid.window).saturating_sub(now)
    }

    /// [`WordRule::decide`] on a view, in `T`'s arithmetic.
    #[inline]
    fn decide_in<T: Wide>(&self, v: &View, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        let w = T::of(self.0.grid.window);
        let weighted_prev = T::of(v.prev) * (w - T::of(v.elapsed));
        let allowed =
            cost == 0 || T::of(v.cur + cost - 1) * w + weighted_prev < T::of(self.0.limit) * w;
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
                self.retry_after::<T>(v, now, cost)
            },
            reset_after,
            delay: 0,
            remaining: Remaining::ceil(self.headroom::<T>(v, cur).wide(), self.0.grid.window),
        };
        let next = if allowed && cost > 0 && self.0.writable(v.index) {
            pack(v.index, v.prev, cur)
        } else {
            state
        };
        (decision, next)
    }

    /// Whether every product of `decide_in` fits in an `i64` for this view and a cost of at
    /// most `L` (`Windowed::within_limit` keeps larger ones out): each is at most
    /// `(max(cur, prev) + cost + L)·W`, kept ≤ 2^61. True for any `W` up to 2^61 / 2^22 ns
    /// (6.5 days) whatever the counts; the `i128` path (a division that is a library call on
    /// x86-64) serves the rest.
    #[inline]
    fn fits_i64(&self, v: &View, cost: u64) -> bool {
        (v.cur.max(v.prev) + cost + self.0.limit)
            .checked_mul(self.0.grid.window)
            .is_some_and(|bound| bound <= 1 << 61)
    }
}

/// The signed integers the sliding window computes in: `i64` when every product fits (almost
/// always), `i128` otherwise. One formula, two widths.
trait Wide:
    Copy
    + Ord
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn of(n: u64) -> Self;
    fn wide(self) -> i128;
}

impl Wide for i64 {
    #[inline]
    fn of(n: u64) -> Self {
        n as i64 // callers check `fits_i64` first: every operand is ≤ 2^61
    }
    #[inline]
    fn wide(self) -> i128 {
        self as i128
    }
}

impl Wide for i128 {
    #[inline]
    fn of(n: u64) -> Self {
        n as i128
    }
    #[inline]
    fn wide(self) -> i128 {
        self
    }
}

fn ceil_div<T: Wide>(a: T, b: T) -> T {
    (a + b - T::of(1)) / b
}

impl WordRule for SlidingWindow {
    #[inline]
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        self.0.within_limit(state, cost, |cost| {
            let v = self.view(state, now);
            if self.fits_i64(&v, cost) {
                self.decide_in::<i64>(&v, state, now, cost)
            } else {
                self.decide_in::<i128>(&v, state, now, cost)
            }
        })
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

    /// The packed window index is read relative to the reading's own window.
    #[test]
    fn a_rule_on_its_own_reads_indices_relative_to_the_reading() {
        use crate::algorithm::WordRule;
        const MS: u64 = 1_000_000;
        let rule = SlidingWindow::new(Quota::new(1, Duration::from_millis(1)).unwrap()).unwrap();
        let (_, state) = rule.decide(0, 0, 1);
        assert!(!rule.decide(state, MS / 2, 1).0.allowed());
        assert!(rule.decide(state, 2 * MS, 1).0.allowed());
        // Up to 2^23 − 16 windows later the state still reads as old (documented limit).
        assert!(rule.decide(state, ((1 << 23) - 17) * MS, 1).0.allowed());
    }

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

    /// The `i64` fast path computes what the `i128` path computes, wherever it is taken.
    #[test]
    fn both_widths_agree() {
        let mut checked = 0;
        for (limit, window_ms) in [(1, 1), (10, 1000), (1000, 60_000), (MAX_LIMIT, 3_600_000)] {
            let sw = rule(limit, window_ms);
            let w = window_ms * MS;
            let counts = [0, 1, limit / 2, limit.saturating_sub(1), limit];
            for prev in counts {
                for cur in counts {
                    let state = pack(2, prev, cur);
                    for now in [2 * w, 2 * w + 1, 2 * w + w / 3, 3 * w - 1, 3 * w + w / 2] {
                        let v = sw.view(state, now);
                        for cost in [0, 1, limit / 3, limit] {
                            if !sw.fits_i64(&v, cost) {
                                continue;
                            }
                            let narrow = sw.decide_in::<i64>(&v, state, now, cost);
                            let wide = sw.decide_in::<i128>(&v, state, now, cost);
                            assert_eq!(
                                narrow, wide,
                                "L={limit} W={window_ms}ms {prev}/{cur} t={now} c={cost}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 300, "the fast path was taken {checked} times");
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
