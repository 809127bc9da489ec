//! The lease word: the units a node holds for one key, and until when, in one `AtomicU64` that
//! every check changes with one compare-and-swap.
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/lease.rs` models every transition below against each other).
//!
//! Transitions, each one atomic step on the word:
//! - [`LeaseWord::take`]: a check spends `cost` units if the lease holds them and has not
//!   expired (a GCRA lease's decayed units leave with them, see [`usable`]);
//! - [`LeaseWord::extend`]: a GCRA grant that follows the word's own adds its units;
//! - [`LeaseWord::deposit`]: a grant adds its units (or replaces the units of a window that is
//!   over) and sets the new deadline;
//! - [`LeaseWord::replace`]: a GCRA grant parked while the word held an earlier one's units
//!   takes the word over once those are spent or expired; what is left of them is void;
//! - [`LeaseWord::take_up_to`]: first-touch units that no grant covered are taken back;
//! - [`LeaseWord::empty`]: the lease is given back (idle key, `release_all`) or handed over to
//!   the local limiter when Redis fails: every unit left leaves the word at once;
//! - [`LeaseWord::expire`]: the sweeper voids a lease whose deadline passed, if no check
//!   changed the word since it was read.
//!
//! Every unit deposited leaves the word by exactly one of `take`, `take_up_to`, `empty`,
//! `replace` and `expire`: none is spent twice, none is lost.

use crate::sync::{spin_loop, AtomicU64, Ordering};

/// Nanoseconds per millisecond (deadlines are kept in milliseconds).
pub const MS: u64 = 1_000_000;

/// The longest a lease lives, in ns: deadlines are compared modulo 2^32 ms, so they must lie
/// less than 2^31 ms ahead.
pub const DAY: u64 = 86_400_000 * MS;
const _: () = assert!(
    DAY / MS < 1 << 31,
    "deadlines must lie less than 2^31 ms ahead"
);

/// The largest lease a node holds for one key (units are kept in 32 bits of the lease word).
///
/// # Examples
/// ```
/// use tollgate::redis::{LeaseConfig, MAX_LEASE};
/// assert_eq!(MAX_LEASE, u64::from(u32::MAX));
/// // A larger lease asked for is held to it.
/// assert_eq!(LeaseConfig::new().max_lease(1 << 40).max_lease_for(1 << 50), MAX_LEASE);
/// ```
pub const MAX_LEASE: u64 = u32::MAX as u64;

/// The word's layout:
/// - bits 63..32: units left (≤ [`MAX_LEASE`]);
/// - bits 31..0: the deadline: the lease's units are void from this millisecond of the
///   limiter's clock on (compared modulo 2^32, deadlines are at most one day ahead). A window
///   lease's is its window's end; a GCRA lease's, when the bucket would have refilled its
///   units, plus the horizon (see "Guarantee" on `LeasedLimiter`).
pub fn pack(units: u64, deadline_ms: u32) -> u64 {
    (units.min(MAX_LEASE) << 32) | deadline_ms as u64
}

pub fn units_of(word: u64) -> u64 {
    word >> 32
}

pub fn deadline_of(word: u64) -> u32 {
    word as u32
}

/// `now` (ns of the limiter's clock) in the deadline's unit.
pub fn now_ms(now: u64) -> u32 {
    // Wrapping by design: deadlines are compared modulo 2^32 ms.
    (now / MS) as u32
}

/// Whether a deadline has passed, modulo 2^32 ms (deadlines lie less than 2^31 ms ahead).
pub fn expired(now_ms: u32, deadline: u32) -> bool {
    (now_ms.wrapping_sub(deadline) as i32) >= 0
}

/// The time left before `word`'s deadline at `now` (ns), or `None` once it passed.
fn time_left(word: u64, now: u64) -> Option<u64> {
    let ms = deadline_of(word).wrapping_sub(now_ms(now)) as i32;
    // `ms ≥ 1`, so `ms·MS > now mod MS`: no borrow.
    (ms > 0).then(|| ms as u64 * MS - now % MS)
}

/// The units of `word` a check may spend at `now`: none once its deadline passed. With
/// `decay` > 0 (GCRA: the emission interval `T` in ns), also at most one per `decay` of the
/// time left: a GCRA lease's units sit in the bucket's last slots of its grant, and those
/// whose slot the bucket refilled more than the horizon ago are void (spent first).
pub fn usable(word: u64, now: u64, decay: u64) -> u64 {
    let units = units_of(word);
    match time_left(word, now) {
        None => 0,
        // The common case, without a division.
        Some(left) if decay == 0 || units.saturating_mul(decay) <= left => units,
        Some(left) => left / decay,
    }
}

/// One key's lease word. Every access is `Relaxed`: the word is the whole state, and no other
/// memory is published through it (the figures next to it are hints read on their own).
#[derive(Debug, Default)]
pub struct LeaseWord(AtomicU64);

impl LeaseWord {
    /// A word holding `units` until `deadline_ms`.
    pub fn new(units: u64, deadline_ms: u32) -> LeaseWord {
        LeaseWord(AtomicU64::new(pack(units, deadline_ms)))
    }

    /// The word as it is now (a snapshot).
    pub fn load(&self) -> u64 {
        // Relaxed: the word is the whole state (see the type's docs).
        self.0.load(Ordering::Relaxed)
    }

    /// The units a check could spend at `now` ([`usable`]).
    pub fn held(&self, now: u64, decay: u64) -> u64 {
        usable(self.load(), now, decay)
    }

    /// The time the lease has left to live at `now` (ns; 0 once its deadline passed).
    pub fn time_left(&self, now: u64) -> u64 {
        time_left(self.load(), now).unwrap_or(0)
    }

    /// Takes `cost` units if that many are [`usable`] at `now`: the units left. Units that
    /// decayed leave the word with them.
    #[inline]
    pub fn take(&self, cost: u64, now: u64, decay: u64) -> Option<u64> {
        // Relaxed: the word is the whole state (see the type's docs).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let units = usable(word, now, decay);
            if units < cost {
                return None;
            }
            // Relaxed: as above; the CAS alone decides which check gets the units.
            match self.0.compare_exchange_weak(
                word,
                pack(units - cost, deadline_of(word)),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(units - cost),
                Err(seen) => {
                    word = seen;
                    spin_loop();
                }
            }
        }
    }

    /// Adds `granted` units (to those held if `keep`, else in place of them: a new window voids
    /// what is left of the old one) and sets `deadline_ms`. The units held after it.
    pub fn deposit(&self, granted: u64, keep: bool, deadline_ms: u32) -> u64 {
        self.refill(deadline_ms, |word| {
            if keep {
                units_of(word).saturating_add(granted)
            } else {
                granted
            }
        })
    }

    /// Puts `units(word)` units in the word (at most [`MAX_LEASE`]) and sets `deadline_ms`, in
    /// one step against checks: the units held after it.
    fn refill(&self, deadline_ms: u32, units: impl Fn(u64) -> u64) -> u64 {
        // Relaxed: the word is the whole state (see the type's docs).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let units = units(word).min(MAX_LEASE);
            // Relaxed: as above.
            match self.0.compare_exchange_weak(
                word,
                pack(units, deadline_ms),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return units,
                Err(seen) => word = seen,
            }
        }
    }

    /// Takes back up to `most` units: `(units held before, units taken)`.
    pub fn take_up_to(&self, most: u64) -> (u64, u64) {
        // Relaxed: the word is the whole state (see the type's docs).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let units = units_of(word);
            let take = units.min(most);
            // Relaxed: as above.
            match self.0.compare_exchange_weak(
                word,
                word - (take << 32),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (units, take),
                Err(seen) => word = seen,
            }
        }
    }

    /// GCRA: adds `granted` units to those [`usable`] at `now` and sets `deadline_ms`, for a
    /// grant whose slots in the bucket follow the word's own (one run of slots, one deadline).
    /// The units held after it.
    pub fn extend(&self, granted: u64, now: u64, decay: u64, deadline_ms: u32) -> u64 {
        self.refill(deadline_ms, |word| {
            usable(word, now, decay).saturating_add(granted)
        })
    }

    /// Puts `units` in the word until `deadline_ms`, in place of what it held: the word it
    /// held (its units are void).
    pub fn replace(&self, units: u64, deadline_ms: u32) -> u64 {
        // Relaxed: the word is the whole state (see the type's docs).
        self.0.swap(pack(units, deadline_ms), Ordering::Relaxed)
    }

    /// Empties the word (0 units, void from `now_ms` on): the word it held.
    pub fn empty(&self, now_ms: u32) -> u64 {
        // Relaxed: the word is the whole state (see the type's docs).
        self.0.swap(pack(0, now_ms), Ordering::Relaxed)
    }

    /// Voids the units of `seen` (an expired lease) if the word still is `seen`.
    pub fn expire(&self, seen: u64) -> bool {
        let void = pack(0, deadline_of(seen));
        // Relaxed: the word is the whole state (see the type's docs).
        self.0
            .compare_exchange(seen, void, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_compare_modulo_2_32_ms() {
        assert!(!expired(5, 6));
        assert!(expired(6, 6));
        assert!(expired(7, 6));
        // Across the wrap.
        assert!(!expired(u32::MAX, 3));
        assert!(expired(3, u32::MAX));
        let word = pack(MAX_LEASE, u32::MAX);
        assert_eq!((units_of(word), deadline_of(word)), (MAX_LEASE, u32::MAX));
    }

    #[test]
    fn a_lease_never_gives_more_than_it_holds() {
        let word = LeaseWord::new(10, 100);
        assert_eq!(word.take(4, 99 * MS, 0), Some(6));
        assert_eq!(word.take(7, 99 * MS, 0), None);
        assert_eq!(word.take(6, 100 * MS, 0), None, "expired");
        assert_eq!(word.held(100 * MS, 0), 0, "expired");
        assert_eq!(word.held(99 * MS, 0), 6);
        assert_eq!(word.take(u64::MAX, 0, 0), None);
        assert_eq!(word.deposit(5, true, 7), 11);
        assert_eq!(word.take_up_to(9), (11, 9));
        assert_eq!(units_of(word.load()), 2);
        assert_eq!(word.deposit(u64::MAX, false, 7), MAX_LEASE);
        assert_eq!(units_of(word.replace(3, 8)), MAX_LEASE);
        assert_eq!(word.take(3, 7 * MS, 0), Some(0));
        // Emptied: the word it held comes back, and nothing is left.
        word.deposit(5, false, 9);
        assert_eq!(word.empty(8), pack(5, 9));
        assert_eq!(word.load(), pack(0, 8));
        // The sweeper voids a word only if no check changed it since it read it.
        word.deposit(4, false, 9);
        let seen = word.load();
        assert_eq!(word.take(1, 0, 0), Some(3));
        assert!(!word.expire(seen), "changed since");
        assert_eq!(units_of(word.load()), 3);
        let seen = word.load();
        assert!(word.expire(seen));
        assert_eq!(word.load(), pack(0, 9));
    }

    /// A GCRA lease of 10 units, one per 10 ms, void from 100 ms on: at most one unit per
    /// 10 ms left is usable, the decayed ones leave the word with the next check, and a
    /// grant that follows adds to what is usable.
    #[test]
    fn a_gcra_lease_decays_one_unit_per_interval_before_its_deadline() {
        let t = 10 * MS;
        let word = LeaseWord::new(10, 100);
        assert_eq!(word.held(0, t), 10);
        assert_eq!(word.held(5 * MS, t), 9, "95 ms left");
        assert_eq!(word.held(30 * MS, t), 7);
        assert_eq!(
            word.take(1, 30 * MS, t),
            Some(6),
            "the 3 decayed ones leave"
        );
        assert_eq!(units_of(word.load()), 6);
        assert_eq!(word.held(50 * MS, t), 5);
        assert_eq!(word.take(6, 50 * MS, t), None);
        assert_eq!(
            word.held(99 * MS, t),
            0,
            "1 ms left: less than one interval"
        );
        assert_eq!(word.held(100 * MS, t), 0);
        assert_eq!(word.extend(4, 50 * MS, t, 140), 9);
        assert_eq!(word.held(50 * MS, t), 9);
        assert_eq!(word.held(70 * MS, t), 7);
        // Half a millisecond in: 89.5 ms left at 50.5 ms, not 90.5.
        assert_eq!(word.time_left(50 * MS + MS / 2), 89 * MS + MS / 2);
        assert_eq!(word.held(50 * MS + MS / 2, t), 8);
        assert_eq!(word.time_left(140 * MS), 0, "expired");
        // Fewer units than the time left would allow: the units.
        let word = LeaseWord::new(3, 100);
        assert_eq!(word.held(0, t), 3);
        assert_eq!(word.take(4, 0, t), None);
    }

    /// A lease lives at most a day (its deadline under 2^31 ms ahead, as `expired` needs, is
    /// checked where `DAY` is defined).
    #[test]
    fn the_longest_life_is_a_day() {
        assert_eq!(
            std::time::Duration::from_nanos(DAY),
            std::time::Duration::from_secs(86_400)
        );
    }
}
