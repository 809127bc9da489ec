//! The first-touch allowance: the provisional units a key's lease starts with while its first
//! grant is in flight, and how a grant (or its failure) settles them. The bound they add is on
//! [`LeasedLimiter`](super::LeasedLimiter) ("First touch").

use super::cell::{Bg, Lease};
use super::config::{Counters, Terms};
use super::word::{now_ms, LeaseWord, DAY};
use crate::clock::Nanos;
use crate::redis::exact::units::wall_nanos;
use crate::redis::exact::{Algo, UnitOp};

/// A new lease for a key this node holds none of, with `allowance` provisional units (0 while
/// Redis does not answer: the failure policy decides then).
pub(super) fn first_lease(terms: &Terms, key: &[u8], allowance: u64, now: Nanos) -> Lease {
    let mut lease = Lease::new(key);
    if allowance == 0 {
        return lease;
    }
    let wall = wall_nanos();
    let bg = lease.bg.get_mut();
    let deadline = match terms.window() {
        // Until the first grant covers them (it replaces the deadline): as a grant of them
        // from a full bucket would last (see `grant::install`).
        None => {
            let life = allowance
                .saturating_add(1)
                .saturating_mul(terms.decay())
                .saturating_add(Terms::nanos(terms.config.horizon));
            now_ms(now.saturating_add(life.min(DAY)))
        }
        Some(window) => {
            // The units belong to the current window by the wall clock: void at its end (less
            // a thousandth for drift), so none is spent in the next one.
            let left = window - wall % window;
            bg.provisional_window = wall / window;
            now_ms(now.saturating_add(left - left / 1024))
        }
    };
    bg.provisional = allowance;
    bg.provisional_at = wall;
    lease.hot.word = LeaseWord::new(allowance, deadline);
    lease
}

/// Settles the first-touch units of `lease` that no grant covered: takes back those left
/// (never spent) and returns how many of the `uncovered` were spent.
pub(super) fn void_provisional(
    lease: &Lease,
    bg: &mut Bg,
    uncovered: u64,
    stats: &Counters,
) -> u64 {
    let provisional = std::mem::take(&mut bg.provisional);
    let (left, taken) = lease.hot.word.take_up_to(uncovered);
    Counters::add(&stats.provisional, provisional.saturating_sub(left));
    uncovered - taken
}

/// Settles the first-touch units against a grant of `granted` units whose window starts at
/// `window_start` (server time): those it covers become the lease's own (the grant counted
/// them in the window they were spent in); the rest are taken back, and those already spent are
/// charged. A grant decided in a later window than the units' covers none of them. Returns the
/// units of the grant left for the lease, and the charge to send.
pub(super) fn cover(
    terms: &Terms,
    lease: &Lease,
    bg: &mut Bg,
    granted: u64,
    window_start: Option<u64>,
    stats: &Counters,
) -> (u64, Option<(UnitOp, u64)>) {
    if bg.provisional == 0 {
        return (granted, None);
    }
    let same_window = match (terms.algo, window_start) {
        (Algo::Fixed { window } | Algo::Sliding { window }, Some(start)) => {
            start / window == bg.provisional_window
        }
        _ => true,
    };
    let provisional = bg.provisional;
    let covered = if same_window {
        granted.min(provisional)
    } else {
        0
    };
    let at = bg.provisional_at;
    let overdrawn = void_provisional(lease, bg, provisional - covered, stats);
    if same_window {
        // The covered units stay in the word, as units of this window.
        bg.window_start = window_start;
    }
    let charge = (overdrawn > 0).then(|| {
        Counters::add(&stats.overdrawn, overdrawn);
        let at = if same_window { None } else { Some(at) };
        (UnitOp::Charge { at }, overdrawn)
    });
    (granted - covered, charge)
}
