//! Sliding window log (SPEC §6): the time of every admitted unit; at `t` the units with time
//! `> t − W` count (an entry at exactly `t − W` has expired).
//!
//! ```text
//! allow iff count + c ≤ L        then append c entries at t
//! ```

use crate::algorithm::{limit_at_most, no_burst, window_at_least_1ms};
use crate::clock::Nanos;
use crate::decision::{Decision, Remaining};
use crate::quota::{Quota, QuotaError};
use crate::state::Words;

/// The largest limit: one 4-byte slot per unit, 2^20 − 1 slots (4 MiB) at most per key.
pub const MAX_LIMIT: u64 = (1 << 20) - 1;

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

/// The log's slots must tell apart times up to `2W` apart in 32 bits.
const MAX_WINDOW_TICKS: u64 = 1 << 31;

/// Sliding window log, exact: no window of length `W` ever holds more than `L` admitted units.
///
/// # Storage
/// Each key keeps a ring buffer of 4-byte slots, one per admitted unit still in the window,
/// growing by doubling up to `L` slots, plus a 24-byte header. A slot holds its entry's time
/// in *ticks* modulo 2^32; the tick is the finest of 1, 2, …, 64 ns, 1 µs, 10 µs, … that keeps
/// `W` under 2^31 ticks (1 ns for `W` up to 2.1 s, 64 ns up to 137 s, 1 µs up to 35 min,
/// 1 ms up to 24.8 days). An entry's time is rounded *up* to its tick, so it expires at the same
/// instant or later than the exact rule says: decisions are exact when request times are
/// multiples of the tick, and never more permissive otherwise.
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
}

/// A key's log: entry times in ticks, oldest first, in a ring of 4-byte slots.
#[derive(Debug, Default)]
pub struct Ring {
    /// The newest entry's time in ticks (all 64 bits); meaningless when empty.
    newest: u64,
    /// The tick the slots are counted in; 0 until the first entry.
    tick: u64,
    /// Index of the oldest entry.
    head: u32,
    /// Number of entries.
    len: u32,
    slots: Box<[u32]>,
}

impl Ring {
    /// The time in ticks of the `i`-th oldest entry (`i < len`).
    fn entry(&self, i: u32) -> u64 {
        let slot = self.slots[((self.head as usize) + i as usize) % self.slots.len()];
        self.newest - (self.newest as u32).wrapping_sub(slot) as u64
    }

    fn push(&mut self, ticks: u64, limit: u64) {
        if self.len as usize == self.slots.len() {
            self.grow(limit);
        }
        let cap = self.slots.len();
        self.slots[(self.head as usize + self.len as usize) % cap] = ticks as u32;
        self.len += 1;
        self.newest = ticks;
    }

    /// Doubles the slots (at most `limit`, at least `len + 1`), oldest entry first.
    fn grow(&mut self, limit: u64) {
        let cap = self.slots.len();
        let new_cap = (cap * 2).max(4).min((limit as usize).max(cap + 1));
        let mut slots = vec![0u32; new_cap].into_boxed_slice();
        for i in 0..self.len as usize {
            slots[i] = self.slots[(self.head as usize + i) % cap];
        }
        self.slots = slots;
        self.head = 0;
    }

    fn pop_front(&mut self) {
        self.head = ((self.head as usize + 1) % self.slots.len()) as u32;
        self.len -= 1;
    }

    fn pop_back(&mut self) {
        self.len -= 1;
        if self.len > 0 {
            self.newest = self.entry(self.len - 1);
        }
    }

    /// Re-expresses the entries in another tick (after `set_quota` changed the window), rounding
    /// up: entries never expire earlier than they did.
    fn retick(&mut self, tick: u64) {
        if self.len > 0 && self.tick != 0 {
            let times: Vec<u64> = (0..self.len)
                .map(|i| self.entry(i).saturating_mul(self.tick).div_ceil(tick))
                .collect();
            self.len = 0;
            self.head = 0;
            for t in times {
                self.push(t, u64::MAX);
            }
        }
        self.tick = tick;
    }

    /// The number of entries; for tests and memory accounting.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of slot storage.
    pub fn slot_bytes(&self) -> usize {
        self.slots.len() * 4
    }
}

impl SlidingLog {
    /// The rule for `quota`: `W ≥ 1 ms`, `L ≤ 2^20 − 1`, no burst.
    pub fn new(quota: Quota) -> Result<SlidingLog, QuotaError> {
        no_burst(&quota, "sliding-log")?;
        let window = window_at_least_1ms(&quota)?;
        let limit = limit_at_most(&quota, MAX_LIMIT)?;
        let tick = TICKS
            .into_iter()
            .find(|tick| window / tick < MAX_WINDOW_TICKS)
            .unwrap_or(TICKS[TICKS.len() - 1]);
        Ok(SlidingLog {
            limit,
            window,
            tick,
        })
    }

    /// `L`.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `W` in nanoseconds.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The unit entry times are kept in (see the type's docs).
    pub fn tick_nanos(&self) -> u64 {
        self.tick
    }

    // By reference on purpose: `Algorithm::to_words(&self)` forwards here, and a by-value
    // inherent method would lose method resolution to the trait method (endless recursion).
    #[allow(clippy::wrong_self_convention)]
    pub(crate) fn to_words(&self) -> Words {
        [self.limit, self.window, self.tick, 0]
    }

    pub(crate) fn from_words([limit, window, tick, _]: Words) -> Self {
        SlidingLog {
            limit,
            window,
            tick,
        }
    }

    /// Whether an entry at `ticks` still counts at `now`: `time > now − W`.
    fn live(&self, ticks: u64, now: Nanos) -> bool {
        (ticks as u128 * self.tick as u128) + self.window as u128 > now as u128
    }

    /// Drops expired entries and brings the ring to this rule's tick.
    fn prune(&self, ring: &mut Ring, now: Nanos) {
        if ring.tick != self.tick {
            ring.retick(self.tick);
        }
        while ring.len > 0 && !self.live(ring.entry(0), now) {
            ring.pop_front();
        }
    }

    /// Time in ns of entry `i` plus `W`, minus `now`: when it stops counting.
    fn expires_in(&self, ring: &Ring, i: u32, now: Nanos) -> u64 {
        let end = ring.entry(i) as u128 * self.tick as u128 + self.window as u128;
        u64::try_from(end.saturating_sub(now as u128)).unwrap_or(u64::MAX)
    }

    /// Decides `cost ≤ L` at `now`, appending the entries when `commit` and allowed: the pure
    /// rule over one key's ring (the limiter runs it under the key's lock).
    pub fn decide(&self, ring: &mut Ring, now: Nanos, cost: u64, commit: bool) -> Decision {
        self.prune(ring, now);
        let count = ring.len as u64;
        let allowed = count + cost <= self.limit;
        if allowed && commit && cost > 0 {
            // Rounded up to the tick, and never before the newest entry (time order).
            let mut ticks = now.div_ceil(self.tick);
            if ring.len > 0 {
                ticks = ticks.max(ring.newest);
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
            self.expires_in(ring, (count + cost - self.limit - 1) as u32, now)
        };
        let reset_after = if count_after == 0 {
            0
        } else if !(allowed && cost > 0 && !commit) {
            self.expires_in(ring, ring.len - 1, now)
        } else {
            // A peek that would append: the new entries would be the newest.
            (now.div_ceil(self.tick) as u128 * self.tick as u128 + self.window as u128)
                .saturating_sub(now as u128)
                .try_into()
                .unwrap_or(u64::MAX)
        };
        Decision {
            allowed,
            limit: self.limit,
            retry_after,
            reset_after,
            delay: 0,
            remaining: Remaining::Exact(self.limit.saturating_sub(count_after)),
        }
    }

    /// Removes up to `cost` of the newest live entries.
    pub fn refund(&self, ring: &mut Ring, now: Nanos, cost: u64) {
        self.prune(ring, now);
        for _ in 0..cost.min(ring.len as u64) {
            ring.pop_back();
        }
    }

    /// Whether no entry counts at `now`.
    pub fn is_empty_at(&self, ring: &mut Ring, now: Nanos) -> bool {
        self.prune(ring, now);
        ring.len == 0
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
