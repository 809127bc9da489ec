//! The lease word: the units a node holds for one key, and until when (window algorithms), in
//! one `AtomicU64` that every check changes with one compare-and-swap.
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/lease.rs` models every transition below against each other).
//!
//! Transitions, each one atomic step on the word:
//! - [`LeaseWord::take`]: a check spends `cost` units if the lease holds them and has not expired;
//! - [`LeaseWord::deposit`]: a grant adds its units (or replaces the units of a window that is
//!   over) and sets the new deadline;
//! - [`LeaseWord::take_up_to`]: first-touch units that no grant covered are taken back;
//! - [`LeaseWord::empty`]: the lease is given back (idle key, `release_all`) or handed over to
//!   the local limiter when Redis fails: every unit left leaves the word at once;
//! - [`LeaseWord::expire`]: the sweeper voids a window lease whose deadline passed, if no check
//!   changed the word since it was read.
//!
//! Every unit deposited leaves the word by exactly one of `take`, `take_up_to`, `empty` and
//! `expire`: none is spent twice, none is lost.

use crate::sync::{spin_loop, AtomicU64, Ordering};

/// Nanoseconds per millisecond (deadlines are kept in milliseconds).
pub const MS: u64 = 1_000_000;

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
/// - bits 31..0: for window algorithms, the deadline: the lease's units are void from this
///   millisecond of the limiter's clock on (compared modulo 2^32, deadlines are at most one day
///   ahead). Unused for GCRA, whose units never expire.
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

    /// The units a check could spend at `now` (0 once a window lease expired).
    pub fn held(&self, now: u64, windowed: bool) -> u64 {
        let word = self.load();
        if windowed && expired(now_ms(now), deadline_of(word)) {
            0
        } else {
            units_of(word)
        }
    }

    /// Takes `cost` units if the lease holds them and has not expired: the units left.
    #[inline]
    pub fn take(&self, cost: u64, now: u64, windowed: bool) -> Option<u64> {
        let now_ms = now_ms(now);
        // Relaxed: the word is the whole state (see the type's docs).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let units = units_of(word);
            if units < cost || (windowed && expired(now_ms, deadline_of(word))) {
                return None;
            }
            // `cost ≤ units < 2^32`: no borrow out of the unit bits.
            // Relaxed: as above; the CAS alone decides which check gets the units.
            match self.0.compare_exchange_weak(
                word,
                word - (cost << 32),
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
        // Relaxed: the word is the whole state (see the type's docs).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let units = if keep {
                units_of(word).saturating_add(granted)
            } else {
                granted
            }
            .min(MAX_LEASE);
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

    /// Empties the word (0 units, void from `now_ms` on): the word it held.
    pub fn empty(&self, now_ms: u32) -> u64 {
        // Relaxed: the word is the whole state (see the type's docs).
        self.0.swap(pack(0, now_ms), Ordering::Relaxed)
    }

    /// Voids the units of `seen` (an expired window lease) if the word still is `seen`.
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
        assert_eq!(word.take(4, 99 * MS, true), Some(6));
        assert_eq!(word.take(7, 99 * MS, true), None);
        assert_eq!(word.take(6, 100 * MS, true), None, "expired");
        assert_eq!(
            word.take(6, 100 * MS, false),
            Some(0),
            "GCRA units never expire"
        );
        assert_eq!(word.take(1, 0, false), None);
        assert_eq!(word.take(u64::MAX, 0, false), None);
        assert_eq!(word.deposit(5, true, 7), 5);
        assert_eq!(word.take_up_to(9), (5, 5));
        assert_eq!(word.deposit(u64::MAX, false, 7), MAX_LEASE);
    }
}
