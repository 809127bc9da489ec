//! Sliding window log (decision rules §6): the time of every admitted unit; at `t` the units with time
//! `> t − W` count (an entry at exactly `t − W` has expired).
//!
//! ```text
//! allow iff count + c ≤ L        then append c entries at t
//! ```

use crate::algorithm::rule::Words;
use crate::algorithm::rule::{limit_at_most, no_burst, window_at_least_1ms};
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};

// The log as a plain ring, the reference the lock-free cell (`state::log`) is tested against.
#[cfg(test)]
#[path = "sliding_log/ring.rs"]
mod ring;

#[cfg(test)]
pub(crate) use self::ring::Ring;
#[cfg(test)]
use self::ring::INLINE;

/// The largest limit (see [`SlidingLog::MAX_LIMIT`]).
const MAX_LIMIT: u64 = (1 << 20) - 1;

/// Slot time units, finest first. All up to 1 ms divide 1 ms, so traces with millisecond times
/// are decided exactly for any window up to 24.8 days.
const TICKS: [u64; 14] = [
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];

/// A slot keeps its entry's time in 31 bits (the lock-free cell's 32nd tells a written slot
/// from one being written), read as an age below 2^31 ticks: `W` plus the two ticks of
/// rounding must stay under it.
const MAX_WINDOW_TICKS: u64 = (1 << 31) - 2;

/// Sliding window log, exact: no window of length `W` ever holds more than `L` admitted units.
///
/// # Storage
/// Each key keeps a ring buffer of 4-byte slots, one per admitted unit still in the window,
/// with a 128-bit header that every admission updates by compare-and-swap (no lock): a
/// 48-byte cell, where up to 6 slots live in the cell itself, so a short log needs no
/// allocation and no second memory access; a longer log moves to a heap ring that grows by
/// doubling up to `L` slots, and moves back into the cell once it is down to 3 entries. The
/// rule's tests also run it on a plain ring, the reference the cell is checked against. A slot
/// holds its entry's time in *ticks* modulo 2^31; the tick is the finest of 1,
/// 2, …, 64 ns, 1 µs, 10 µs, … that keeps `W` under 2^31 ticks (1 ns for `W` up to 2.1 s, 64 ns
/// up to 137 s, 1 µs up to 35 min, 1 ms up to 24.8 days). An entry's time is rounded *up* to its
/// tick, so it expires at the same instant or later than the exact rule says: decisions are
/// exact when request times are multiples of the tick, and never more permissive otherwise.
///
/// # Examples
/// ```
/// use tollgate::{Quota, SlidingLog};
/// let log = SlidingLog::new(Quota::per_minute(60)?)?;
/// assert_eq!(log.tick_nanos(), 32); // 60 s / 32 ns < 2^31
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
    tick: u64,
    /// The tick's place in [`TICKS`], plus one: how a log's header records it.
    code: u8,
}

impl SlidingLog {
    /// The largest limit: one 4-byte slot per unit, 2^20 − 1 slots (4 MiB) at most per key.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, QuotaError, SlidingLog};
    /// assert!(SlidingLog::new(Quota::per_hour(SlidingLog::MAX_LIMIT)?).is_ok());
    /// assert!(matches!(SlidingLog::new(Quota::per_hour(SlidingLog::MAX_LIMIT + 1)?), Err(QuotaError::TooLarge { .. })));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub const MAX_LIMIT: u64 = MAX_LIMIT;
}

/// A log as the lock-free cell holds it (`LogCell`): entries oldest first, each known, or not
/// yet written by the call that admitted it.
pub(crate) trait Entries {
    /// The entries, written or not.
    fn count(&self) -> u32;
    /// The `i`-th oldest entry's time in ticks (`i < count`); `None` while it is not written.
    fn ticks(&self, i: u32) -> Option<u64>;
}

/// A decision on [`Entries`] and what it changes.
#[derive(Debug)]
pub(crate) struct Judged {
    pub(crate) decision: Decision,
    /// The oldest entries found expired: the cell drops them.
    pub(crate) expired: u32,
    /// The time in ticks of the `cost` entries to append, if the decision appends.
    pub(crate) append: Option<u64>,
}

impl SlidingLog {
    /// The rule for `quota`: `W ≥ 1 ms`, `L ≤ 2^20 − 1`, no burst.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, QuotaError, SlidingLog};
    /// assert!(SlidingLog::new(Quota::per_minute(60)?).is_ok());
    /// // A log admits at most L in any window: there is no burst to give it.
    /// assert!(matches!(
    ///     SlidingLog::new(Quota::per_minute(60)?.with_burst(100)?),
    ///     Err(QuotaError::BurstNotSupported { .. })
    /// ));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new(quota: Quota) -> Result<SlidingLog, QuotaError> {
        no_burst(&quota, "sliding-log")?;
        let window = window_at_least_1ms(&quota)?;
        let limit = limit_at_most(&quota, MAX_LIMIT)?;
        let at = TICKS
            .iter()
            .position(|tick| window / tick < MAX_WINDOW_TICKS)
            .unwrap_or(TICKS.len() - 1);
        Ok(SlidingLog {
            limit,
            window,
            tick: TICKS[at],
            code: at as u8 + 1,
        })
    }

    /// `L`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, SlidingLog};
    /// assert_eq!(SlidingLog::new(Quota::per_minute(60)?)?.limit(), 60);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `W` in nanoseconds.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, SlidingLog};
    /// assert_eq!(SlidingLog::new(Quota::per_minute(60)?)?.window(), 60_000_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The unit entry times are kept in (see the type's docs).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{Quota, SlidingLog};
    /// // W = 1 s fits in 2^31 ns: exact to the nanosecond.
    /// assert_eq!(SlidingLog::new(Quota::per_second(10)?)?.tick_nanos(), 1);
    /// // W = 1 h needs a coarser tick: 10 µs.
    /// assert_eq!(SlidingLog::new(Quota::per_hour(10)?)?.tick_nanos(), 10_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn tick_nanos(&self) -> u64 {
        self.tick
    }

    // By reference on purpose: `Stored::to_words(&self)` forwards here, and a by-value
    // inherent method would lose method resolution to the trait method (endless recursion).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        [self.limit, self.window, self.tick, u64::from(self.code), 0]
    }

    pub(crate) fn from_words([limit, window, tick, code, _]: Words) -> Self {
        SlidingLog {
            limit,
            window,
            tick,
            code: code as u8,
        }
    }

    /// `nanos / tick`, rounded down. A 1 ns tick (every `W` up to 2.1 s) skips the division,
    /// which is a good part of a check's arithmetic.
    #[inline]
    fn ticks_floor(&self, nanos: Nanos) -> u64 {
        if self.tick == 1 {
            nanos
        } else {
            nanos / self.tick
        }
    }

    /// `nanos / tick`, rounded up.
    #[inline]
    pub(crate) fn ticks_ceil(&self, nanos: Nanos) -> u64 {
        if self.tick == 1 {
            nanos
        } else {
            nanos.div_ceil(self.tick)
        }
    }

    #[cfg(test)]
    /// Drops expired entries and brings the ring to this rule's tick.
    #[inline]
    fn prune(&self, ring: &mut Ring, now: Nanos) {
        // Before `W` has passed since the origin nothing has expired. After, an entry at
        // `ticks` has expired iff `ticks·tick ≤ now − W`, i.e. `ticks ≤ (now − W) / tick`.
        let last_expired = now
            .checked_sub(self.window)
            .map(|past| self.ticks_floor(past));
        if u64::from(ring.tick) != self.tick {
            ring.retick(self.tick, self.ticks_ceil(now), last_expired);
        }
        if let Some(last_expired) = last_expired {
            ring.expire_through(last_expired);
        }
    }

    /// Time in ns of an entry at `ticks` plus `W`, minus `now`: when it stops counting.
    #[inline]
    fn expires_in(&self, ticks: u64, now: Nanos) -> u64 {
        let end = ticks as u128 * self.tick as u128 + self.window as u128;
        u64::try_from(end.saturating_sub(now as u128)).unwrap_or(u64::MAX)
    }

    #[cfg(test)]
    /// Decides `cost ≤ L` at `now`, appending the entries when `commit` and allowed: the pure
    /// rule over one key's ring (the limiter runs it under the key's lock).
    #[inline]
    pub(crate) fn decide(&self, ring: &mut Ring, now: Nanos, cost: u64, commit: bool) -> Decision {
        self.prune(ring, now);
        let count = ring.len() as u64;
        let allowed = count + cost <= self.limit;
        if allowed && commit && cost > 0 {
            // Rounded up to the tick, and never before the newest entry (time order).
            let mut ticks = self.ticks_ceil(now);
            if count > 0 {
                ticks = ticks.max(ring.newest());
            }
            for _ in 0..cost {
                ring.push(ticks, self.limit);
            }
        }
        let count_after = if allowed { count + cost } else { count };
        let retry_after = if allowed {
            0
        } else {
            // The (count + c − L)-th oldest live entry must expire.
            self.expires_in(ring.entry((count + cost - self.limit - 1) as u32), now)
        };
        let reset_after = if count_after == 0 {
            0
        } else if !(allowed && cost > 0 && !commit) {
            // `newest` is the newest entry's time whenever the log is not empty.
            self.expires_in(ring.newest(), now)
        } else {
            // A peek that would append: the new entries would be the newest.
            self.expires_in(self.ticks_ceil(now), now)
        };
        Decision {
            allowed: allowed.into(),
            limit: self.limit,
            retry_after,
            reset_after,
            delay: 0,
            remaining: Remaining::Exact(self.limit.saturating_sub(count_after)),
        }
    }

    /// Decides as [`SlidingLog::decide`] does on a ring holding the same entries, for the
    /// lock-free cell (`LogCell`), which reads its entries in place and applies the outcome
    /// itself. An entry whose writer has not written it yet counts as live, at `pending` ticks
    /// (no earlier than its real time): the decision is then never more permissive than the
    /// exact one, and is the exact one when every entry is written.
    #[inline]
    pub(crate) fn judge(
        &self,
        log: &impl Entries,
        now: Nanos,
        pending: u64,
        cost: u64,
        commit: bool,
    ) -> Judged {
        let n = log.count();
        let ticks = |i| log.ticks(i).unwrap_or(pending);
        let mut expired = 0;
        if let Some(past) = now.checked_sub(self.window) {
            let last_expired = self.ticks_floor(past);
            while expired < n && log.ticks(expired).is_some_and(|t| t <= last_expired) {
                expired += 1;
            }
        }
        let count = u64::from(n - expired);
        let allowed = count + cost <= self.limit;
        let append = (allowed && commit && cost > 0).then(|| {
            // Never before the newest entry: the log stays in time order.
            let at = self.ticks_ceil(now);
            if count > 0 {
                at.max(ticks(n - 1))
            } else {
                at
            }
        });
        let count_after = if allowed { count + cost } else { count };
        let retry_after = if allowed {
            0
        } else {
            self.expires_in(ticks(expired + (count + cost - self.limit - 1) as u32), now)
        };
        let reset_after = match append {
            _ if count_after == 0 => 0,
            Some(at) => self.expires_in(at, now),
            None if allowed && cost > 0 => self.expires_in(self.ticks_ceil(now), now),
            None => self.expires_in(ticks(n - 1), now),
        };
        Judged {
            decision: Decision {
                allowed: allowed.into(),
                limit: self.limit,
                retry_after,
                reset_after,
                delay: 0,
                remaining: Remaining::Exact(self.limit.saturating_sub(count_after)),
            },
            expired,
            append,
        }
    }

    /// The index of this rule's tick in [`TICKS`], plus one (0 stands for no tick yet).
    #[inline]
    pub(crate) fn tick_code(&self) -> u8 {
        self.code
    }

    /// The tick a [`SlidingLog::tick_code`] stands for (`None` for 0).
    pub(crate) fn tick_of(code: u8) -> Option<u64> {
        TICKS.get(usize::from(code).checked_sub(1)?).copied()
    }

    #[cfg(test)]
    /// Removes up to `cost` of the newest live entries.
    pub(crate) fn refund(&self, ring: &mut Ring, now: Nanos, cost: u64) {
        self.prune(ring, now);
        for _ in 0..cost.min(ring.len() as u64) {
            ring.pop_back();
        }
    }

    #[cfg(test)]
    /// Whether no entry counts at `now`.
    pub(crate) fn is_empty_at(&self, ring: &mut Ring, now: Nanos) -> bool {
        self.prune(ring, now);
        ring.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    #[test]
    fn spec_worked_example_entry_at_exactly_t_minus_w_has_expired() {
        let log = SlidingLog::new(Quota::new(2, Duration::from_millis(60)).unwrap()).unwrap();
        let mut ring = Ring::default();
        assert!(log.decide(&mut ring, 60 * MS, 1, true).allowed());
        assert!(log.decide(&mut ring, 70 * MS, 1, true).allowed());
        assert!(!log.decide(&mut ring, 119 * MS, 1, true).allowed());
        // At 121 (W = 60) the entry at 60 is gone, the one at 70 stays.
        let d = log.decide(&mut ring, 121 * MS, 1, true);
        assert!(d.allowed());
        assert_eq!(ring.len(), 2);
        let d2 = log.decide(&mut ring, 121 * MS, 1, true);
        assert!(!d2.allowed());
        assert_eq!(d2.retry_after_nanos(), 9 * MS);
    }

    #[test]
    fn ring_is_40_bytes_and_short_logs_stay_inline() {
        // (Its cell, the ring and a lock, is 48: `state/log.rs`.)
        assert_eq!(std::mem::size_of::<Ring>(), 40);
        let log = SlidingLog::new(Quota::new(64, Duration::from_millis(10)).unwrap()).unwrap();
        let mut ring = Ring::default();
        for i in 0..INLINE as u64 {
            assert!(log.decide(&mut ring, i, 1, true).allowed());
        }
        assert_eq!(ring.slot_bytes(), 0, "seven entries fit in the state");
        assert!(log.decide(&mut ring, 100, 1, true).allowed());
        assert_eq!(ring.len(), 8);
        assert!(
            ring.slot_bytes() > 0,
            "the eighth moves the log to the heap"
        );
        // 10 ms later the first seven have expired: the log is back in its state, in order.
        let d = log.decide(&mut ring, 10 * MS + 8, 1, true);
        assert!(d.allowed());
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.slot_bytes(), 0);
        assert_eq!(d.remaining(), 62);
        assert_eq!(
            log.decide(&mut ring, 10 * MS + 100, 0, false).remaining(),
            63
        );
    }

    #[test]
    fn ring_grows_and_wraps() {
        let log = SlidingLog::new(Quota::new(100, Duration::from_millis(10)).unwrap()).unwrap();
        let mut ring = Ring::default();
        let mut admitted = 0;
        for t in 0..10_000u64 {
            admitted += log.decide(&mut ring, t * MS / 7, 1, true).allowed() as u64;
        }
        assert!(ring.slot_bytes() <= 400);
        assert!(admitted > 0);
    }
}
