//! Where the windows of the window algorithms lie: `[k·W, (k+1)·W)` from the limiter's origin
//! (SPEC §4), re-anchored when `set_quota` changes `W`.

use crate::algorithm::{limit_at_most, no_burst, window_at_least_1ms};
use crate::clock::Nanos;
use crate::quota::{Quota, QuotaError};
use crate::state::Words;

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

/// How far a stored window index `stored` (the low `bits` of an index) is behind `current`.
///
/// `Behind(d)`: `d` windows behind (0 = same window). `Ahead(a)`: the stored state is `a`
/// windows *ahead*, which only a clock reading that went backwards can produce; the rules then
/// judge the request in the stored window (the stricter choice). Indices are kept modulo
/// `2^bits`, so a key idle for an exact multiple of `2^bits` windows reads as "same window"
/// (again the stricter choice; never more admissions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lag {
    Behind(u64),
    Ahead(u64),
}

/// Stored indices up to this many windows ahead are read as "ahead", not as a wrap.
const AHEAD_TOLERANCE: u64 = 16;

#[inline]
pub(crate) fn lag(current: u64, stored: u64, bits: u32) -> Lag {
    let mask = (1u64 << bits) - 1;
    let behind = current.wrapping_sub(stored) & mask;
    let ahead = stored.wrapping_sub(current) & mask;
    if ahead != 0 && ahead <= AHEAD_TOLERANCE {
        Lag::Ahead(ahead)
    } else {
        Lag::Behind(behind)
    }
}

/// What both window counters are made of: the limit and the grid of windows, with the checks,
/// the quota change and the parameter words they share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Windowed {
    pub limit: u64,
    pub grid: Grid,
}

impl Windowed {
    /// `W ≥ 1 ms`, `L ≤ max_limit`, no burst.
    pub fn new(quota: &Quota, algorithm: &'static str, max_limit: u64) -> Result<Self, QuotaError> {
        no_burst(quota, algorithm)?;
        let window = window_at_least_1ms(quota)?;
        let limit = limit_at_most(quota, max_limit)?;
        Ok(Windowed {
            limit,
            grid: Grid::new(window),
        })
    }

    pub fn take_over(self, previous: &Self, now: Nanos) -> Self {
        Windowed {
            limit: self.limit,
            grid: self.grid.take_over(&previous.grid, now),
        }
    }

    pub fn to_words(self) -> Words {
        [
            self.limit,
            self.grid.window,
            self.grid.origin,
            self.grid.first,
        ]
    }

    pub fn from_words([limit, window, origin, first]: Words) -> Self {
        Windowed {
            limit,
            grid: Grid {
                window,
                origin,
                first,
            },
        }
    }
}
