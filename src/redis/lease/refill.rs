//! A lease's refill state: whether a refill of it is queued or in flight (at most one per
//! key), and whether it was retired (given back and forgotten: no refill ever again).
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/lease.rs`).
//!
//! ```text
//!   Idle ──claim──▶ Pending ──finish──▶ Idle
//!     │                │
//!     └──retire_idle───┴──retire──▶ Retired (for good)
//! ```
//!
//! A refill that finishes on a lease retired meanwhile finds `Retired` (its `finish` fails),
//! and gives back what its grant brought: a retired lease is never refilled again, and no
//! grant lands unseen on a lease nobody holds.

use crate::sync::{AtomicUsize, Ordering};

const IDLE: usize = 0;
const PENDING: usize = 1;
const RETIRED: usize = 2;

/// The refill state word.
#[derive(Debug, Default)]
pub struct Refill(AtomicUsize);

impl Refill {
    /// Elects the one caller that queues a refill: whether this call moved `Idle` to
    /// `Pending`.
    pub fn claim(&self) -> bool {
        // Relaxed: the CAS only elects; the lease's bookkeeping is under its own lock.
        // (The load first: a lease with a refill in flight is asked often, and a failing CAS
        // would take the line from the checks' cores.)
        self.0.load(Ordering::Relaxed) == IDLE
            && self
                .0
                .compare_exchange(IDLE, PENDING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Ends a refill: whether the lease is still live (`Pending` moved back to `Idle`); false
    /// if it was retired meanwhile.
    pub fn finish(&self) -> bool {
        // Release: a caller that reads `Idle` (`in_flight`, Acquire) sees the grant the refill
        // installed before it.
        self.0
            .compare_exchange(PENDING, IDLE, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Retires the lease, whatever its state: no refill is queued after this.
    pub fn retire(&self) {
        // Relaxed: what the retirement takes back is taken by RMWs on the lease word. A swap
        // rather than a store: one RMW against `finish`'s CAS (with a plain store, loom 0.7
        // let that CAS succeed on the value before it, an order no hardware produces).
        self.0.swap(RETIRED, Ordering::Relaxed);
    }

    /// Retires the lease if no refill is queued or in flight; whether this call did.
    pub fn retire_idle(&self) -> bool {
        // Relaxed: as `retire`.
        self.0
            .compare_exchange(IDLE, RETIRED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether a refill is queued or in flight (or the lease was retired).
    pub fn in_flight(&self) -> bool {
        // Acquire: pairs with `finish`'s Release (the installed grant is visible).
        self.0.load(Ordering::Acquire) != IDLE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One refill at a time; a finished one lets the next be claimed; a retired lease is never
    /// claimed, finished or retired idle again, whatever state it was retired from.
    #[test]
    fn one_refill_at_a_time_and_none_once_retired() {
        let refill = Refill::default();
        assert!(!refill.in_flight());
        assert!(refill.claim());
        assert!(refill.in_flight());
        assert!(!refill.claim(), "one in flight");
        assert!(!refill.retire_idle(), "a refill is in flight");
        assert!(refill.finish());
        assert!(!refill.in_flight());
        assert!(!refill.finish(), "none in flight");
        assert!(refill.claim(), "the next one");

        // Retired with a refill in flight: it finishes on a retired lease.
        refill.retire();
        assert!(!refill.finish());
        assert!(
            refill.in_flight(),
            "retired reads as busy: no refill is queued"
        );
        assert!(!refill.claim());
        assert!(!refill.retire_idle());

        // Retired while idle.
        let idle = Refill::default();
        assert!(idle.retire_idle());
        assert!(!idle.claim());
        assert!(!idle.finish());
        assert!(!idle.retire_idle(), "once");
    }
}
