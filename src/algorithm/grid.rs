//! Where the windows of the window algorithms lie: `[k·W, (k+1)·W)` from the limiter's origin
//! (decision rules §4), re-anchored when `set_quota` changes `W`.

use crate::algorithm::rule::Words;
use crate::algorithm::rule::{limit_at_most, no_burst, window_at_least_1ms};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::{Quota, QuotaError};

/// Windows of length `window` numbered from `first`, the first one starting at `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    pub window: u64,
    pub origin: u64,
    pub first: u64,
}

impl Grid {
    /// Windows aligned to the limiter's origin.
    pub fn new(window: u64) -> Grid {
        Grid {
            window,
            origin: 0,
            first: 0,
        }
    }

    /// The index of the window holding `now`, and its start. A time before the grid's origin
    /// (a stale reading during a quota change) belongs to the first window.
    #[inline]
    pub fn locate(&self, now: Nanos) -> (u64, Nanos) {
        let since = now.saturating_sub(self.origin);
        let n = since / self.window;
        (self.first.wrapping_add(n), self.origin + n * self.window)
    }

    /// The grid that replaces `previous` at `now`. An unchanged window keeps its alignment; a
    /// new one starts at `now` under the *same* index as the current window, so the counts of
    /// the current window (and, for the sliding counter, of the one before) carry on into the
    /// first new window: changing `W` never hands out a fresh quota, and indices never go back.
    pub fn take_over(self, previous: &Grid, now: Nanos) -> Grid {
        if self.window == previous.window {
            return *previous;
        }
        let (current, _) = previous.locate(now);
        Grid {
            window: self.window,
            origin: now,
            first: current,
        }
    }
}

/// Where a stored window index (the low `bits` of an index) lies relative to `current`.
///
/// `Behind(d)`: `d` windows behind (0 = same window). `Ahead(a)`: the stored state is `a`
/// windows *ahead*, written by a thread whose clock reading was newer than this one; the rules
/// then judge the request in the stored window (decision rules: a reading older than the newest one seen
/// is treated as the newest one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lag {
    Behind(u64),
    Ahead(u64),
}

/// For a rule used on its own (no limiter keeps its base), stored indices up to this many
/// windows ahead of the reading are read as "ahead", the rest as behind.
const AHEAD_TOLERANCE: u64 = 16;

/// `Windowed::base` of a rule no limiter anchors: indices are read relative to each reading.
const UNANCHORED: u64 = u64::MAX;

/// Which index `stored` (the low `bits` of one) stands for: the one in `[low, low + 2^bits)`.
#[inline]
fn unwrap_index(stored: u64, low: u64, bits: u32) -> u64 {
    let mask = (1u64 << bits) - 1;
    low.wrapping_add(stored.wrapping_sub(low) & mask)
}

/// What both window counters are made of: the limit and the grid of windows, with the checks,
/// the quota change and the parameter words they share.
///
/// # The index horizon
/// A state keeps its window index modulo `2^bits` (`bits` = 40 for the fixed window, 23 for the
/// sliding one), so an index is only meaningful within `2^bits` windows. A limiter *anchors*
/// its rule at a `base` index and reads every stored index as the one in
/// `[base − Q, base + 3Q)`, `Q = 2^(bits − 2)`: exact however long a key sat idle, as long as
/// no state older than `base − Q` is left and none newer than `base + 3Q` is written. The
/// limiter keeps both true: from index `base + 2Q` on ([`Windowed::sweep_due`]) it evicts the
/// keys that became fresh and moves `base` up to the current index; a write at or past
/// `base + 3Q` is refused ([`Windowed::writable`]) and the caller waits for that move, then
/// decides again. A rule used on its own (never anchored) reads indices relative to each
/// reading instead: exact for states less than `2^bits − 16` windows old.
///
/// `BITS` is a constant of each rule's layout (a type parameter rather than a field, so that
/// `Q` and the masks below are constants on the hot path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windowed<const BITS: u32> {
    pub limit: u64,
    pub grid: Grid,
    /// The anchor of stored indices (see above), or `UNANCHORED`.
    pub base: u64,
}

impl<const BITS: u32> Windowed<BITS> {
    /// `Q`: a quarter of the indices a state can tell apart.
    const QUARTER: u64 = 1 << (BITS - 2);

    /// `W ≥ 1 ms`, `L ≤ max_limit`, no burst.
    pub fn new(quota: &Quota, algorithm: &'static str, max_limit: u64) -> Result<Self, QuotaError> {
        no_burst(quota, algorithm)?;
        let window = window_at_least_1ms(quota)?;
        let limit = limit_at_most(quota, max_limit)?;
        Ok(Windowed {
            limit,
            grid: Grid::new(window),
            base: UNANCHORED,
        })
    }

    /// `decide(cost)`, except that a cost above `L`, never admissible, is decided as cost 0
    /// (the state's own figures) and then denied, `state` unchanged. In line on purpose: a
    /// recursive or out-of-line call for that case kept the rule from being inlined or spilled
    /// registers around the call (+37 instructions a sliding-window check).
    #[inline(always)]
    pub fn within_limit(
        &self,
        state: u64,
        cost: u64,
        decide: impl FnOnce(u64) -> (Decision, u64),
    ) -> (Decision, u64) {
        let never = cost > self.limit;
        let (decision, next) = decide(if never { 0 } else { cost });
        if never {
            return (decision.never(), state);
        }
        (decision, next)
    }

    /// Where `stored` lies relative to the reading at window `current`.
    #[inline]
    pub fn lag(&self, current: u64, stored: u64) -> Lag {
        let low = if self.base == UNANCHORED {
            current.wrapping_sub((1 << BITS) - 1 - AHEAD_TOLERANCE)
        } else {
            self.base.wrapping_sub(Self::QUARTER)
        };
        let index = unwrap_index(stored, low, BITS);
        // Signed: both lie within 2^bits of each other.
        let behind = current.wrapping_sub(index) as i64;
        if behind >= 0 {
            Lag::Behind(behind as u64)
        } else {
            Lag::Ahead(behind.unsigned_abs())
        }
    }

    /// Whether a state at window `index` may be stored: always for a rule on its own; below
    /// `base + 3Q` for an anchored one.
    #[inline]
    pub fn writable(&self, index: u64) -> bool {
        index < self.base.saturating_add(3 * Self::QUARTER)
    }

    /// The instant from which the limiter should move the base up: the start of window
    /// `base + 2Q` (never, for a rule on its own).
    #[inline]
    pub fn sweep_due(&self) -> Nanos {
        if self.base == UNANCHORED {
            return Nanos::MAX;
        }
        let windows = (self.base + 2 * Self::QUARTER).saturating_sub(self.grid.first);
        windows
            .checked_mul(self.grid.window)
            .and_then(|span| span.checked_add(self.grid.origin))
            .unwrap_or(Nanos::MAX)
    }

    /// Whether a reading at `now` falls past what this rule may write.
    pub fn beyond_horizon(&self, now: Nanos) -> bool {
        !self.writable(self.grid.locate(now).0)
    }

    /// The rule anchored at the window of `now`, less two: every state a sweep at `now` keeps
    /// (not fresh: at most one window behind) lies within its range.
    pub fn rebase(self, now: Nanos) -> Self {
        Windowed {
            base: self.grid.locate(now).0.saturating_sub(2),
            ..self
        }
    }

    /// `state`, written in a table of era `from` (a base), as a table of the later era `to`
    /// stores it: unchanged if its index lies within `to`'s range (it then reads the same
    /// there), else 0, the fresh state. A state out of that range is below `to − Q`, so at
    /// least `Q` windows behind any reading in era `to` (which starts at `to + 2`): fresh.
    pub fn carried(state: u64, from: u64, to: u64) -> u64 {
        if state == 0 || from >= to {
            return state;
        }
        let index = unwrap_index(state >> (64 - BITS), from.wrapping_sub(Self::QUARTER), BITS);
        // Signed: both lie within 2^bits of `from`.
        if (index.wrapping_sub(to.wrapping_sub(Self::QUARTER)) as i64) < 0 {
            0
        } else {
            state
        }
    }

    pub fn take_over(self, previous: &Self, now: Nanos) -> Self {
        Windowed {
            limit: self.limit,
            grid: self.grid.take_over(&previous.grid, now),
            base: previous.base,
        }
    }

    pub fn to_words(self) -> Words {
        [
            self.limit,
            self.grid.window,
            self.grid.origin,
            self.grid.first,
            self.base,
        ]
    }

    /// The words of a rule from [`Windowed::to_words`].
    pub fn from_words([limit, window, origin, first, base]: Words) -> Self {
        Windowed {
            limit,
            grid: Grid {
                window,
                origin,
                first,
            },
            base,
        }
    }
}

/// The methods both window counters share, forwarded to their [`Windowed`]: `$name` wraps one
/// and its module defines `MAX_LIMIT` and `INDEX_BITS`; `$doc` is the constructor's doc line.
macro_rules! windowed_rule {
    ($name:ident, $algorithm:literal, $doc:literal) => {
        impl $name {
            #[doc = $doc]
            ///
            /// # Examples
            /// ```
            #[doc = concat!("use tollgate::{", stringify!($name), ", Quota, QuotaError};")]
            #[doc = concat!("// 100 a minute, counted per window: windows refuse a burst and windows under 1 ms.")]
            #[doc = concat!("let rule = ", stringify!($name), "::new(Quota::per_minute(100)?)?;")]
            #[doc = concat!("assert_eq!(rule.limit(), 100);")]
            #[doc = concat!("let burst = Quota::per_minute(100)?.with_burst(10)?;")]
            #[doc = concat!("assert!(matches!(", stringify!($name), "::new(burst), Err(QuotaError::BurstNotSupported { .. })));")]
            #[doc = concat!("# Ok::<(), QuotaError>(())")]
            /// ```
            pub fn new(quota: Quota) -> Result<$name, QuotaError> {
                Windowed::new(&quota, $algorithm, MAX_LIMIT).map($name)
            }

            /// `L`.
            ///
            /// # Examples
            /// ```
            #[doc = concat!("use tollgate::{", stringify!($name), ", Quota};")]
            #[doc = concat!("assert_eq!(", stringify!($name), "::new(Quota::per_second(50)?)?.limit(), 50);")]
            #[doc = concat!("# Ok::<(), tollgate::QuotaError>(())")]
            /// ```
            pub fn limit(&self) -> u64 {
                self.0.limit
            }

            /// `L`: the largest cost that can ever be admitted. A larger cost is
            /// [`LimitError::CapacityExceeded`](crate::LimitError::CapacityExceeded), not a denial.
            ///
            /// # Examples
            /// ```
            #[doc = concat!("use tollgate::{", stringify!($name), ", LimitError, Limiter, Quota};")]
            #[doc = concat!("let rule = ", stringify!($name), "::new(Quota::per_second(50)?)?;")]
            #[doc = concat!("assert_eq!(rule.capacity(), 50);")]
            #[doc = concat!("let limiter = Limiter::new(rule);")]
            #[doc = concat!("assert_eq!(limiter.check_n(51), Err(LimitError::CapacityExceeded { cost: 51, capacity: 50 }));")]
            #[doc = concat!("# Ok::<(), tollgate::QuotaError>(())")]
            /// ```
            pub fn capacity(&self) -> u64 {
                self.0.limit
            }

            /// `W` in nanoseconds.
            ///
            /// # Examples
            /// ```
            #[doc = concat!("use tollgate::{", stringify!($name), ", Quota};")]
            #[doc = concat!("assert_eq!(", stringify!($name), "::new(Quota::per_second(5)?)?.window(), 1_000_000_000);")]
            #[doc = concat!("# Ok::<(), tollgate::QuotaError>(())")]
            /// ```
            pub fn window(&self) -> u64 {
                self.0.grid.window
            }

            pub(crate) fn period(&self) -> Nanos {
                self.0.grid.window
            }

            pub(crate) fn take_over(self, previous: &Self, now: Nanos) -> Self {
                Self(self.0.take_over(&previous.0, now))
            }

            // By reference on purpose: `Stored::to_words(&self)` forwards here, and a
            // by-value inherent method would lose method resolution to the trait method
            // (endless recursion).
            #[allow(clippy::wrong_self_convention)]
            pub(crate) fn to_words(&self) -> Words {
                self.0.to_words()
            }

            pub(crate) fn from_words(words: Words) -> Self {
                Self(Windowed::from_words(words))
            }

            pub(crate) fn horizon(&self) -> &Windowed<INDEX_BITS> {
                &self.0
            }

            pub(crate) fn rebase(self, now: Nanos) -> Self {
                Self(self.0.rebase(now))
            }

            pub(crate) fn carried(state: u64, from: u64, to: u64) -> u64 {
                Windowed::<INDEX_BITS>::carried(state, from, to)
            }
        }
    };
}
pub(crate) use windowed_rule;

#[cfg(test)]
mod tests {
    use super::*;

    /// The horizon's figures for a rule anchored at `base`: the base moves up from window
    /// `base + 2Q` on, a write at `base + 3Q` waits for it, and a state `Q` windows under the
    /// base still reads as behind. With 23 index bits (the sliding window), `Q` is 2^21.
    #[test]
    fn the_horizon_is_a_quarter_of_the_indices() {
        const Q: u64 = 1 << 21;
        let ms = 1_000_000;
        let rule = Windowed::<23> {
            limit: 10,
            grid: Grid::new(ms),
            base: 0,
        };
        assert_eq!(rule.sweep_due(), 2 * Q * ms);
        assert!(rule.writable(3 * Q - 1));
        assert!(!rule.writable(3 * Q));
        let later = Windowed::<23> {
            base: 5 * Q,
            ..rule
        };
        assert_eq!(later.sweep_due(), 7 * Q * ms);
        let mask = (1 << 23) - 1;
        assert_eq!(later.lag(5 * Q, (4 * Q) & mask), Lag::Behind(Q));
        assert_eq!(later.lag(5 * Q, (5 * Q + 3) & mask), Lag::Ahead(3));
        // A rule on its own is never swept.
        let alone = Windowed::<23> {
            base: UNANCHORED,
            ..rule
        };
        assert_eq!(alone.sweep_due(), Nanos::MAX);
        assert!(alone.writable(u64::MAX - 1));
    }
}
