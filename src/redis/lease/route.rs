//! Where a leased node's checks go: to its leases while Redis answers, to the failure policy
//! while the breaker is open, and the one-time handover between the two.
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/lease.rs`).
//!
//! ```text
//!   Leases ──begin (one caller wins)──▶ Handing ──finish──▶ Policy
//!     ▲                                                        │
//!     └──────────────── back (the breaker closed) ─────────────┘
//! ```
//!
//! The caller that wins `begin` moves every lease's units into the policy's state, then calls
//! `finish`. Checks that read `Policy` go straight to the policy; checks that read `Handing`
//! keep spending what their lease still holds (granted units) and are denied beyond it; no
//! check reaches the policy before the handover is complete.

use crate::sync::{AtomicUsize, Ordering};

const LEASES: usize = 0;
const HANDING: usize = 1;
const POLICY: usize = 2;

/// Where checks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// To the key's lease (Redis answers, or the breaker just opened and nobody noticed yet).
    Leases,
    /// A handover is running: to the key's lease, denied beyond it.
    Handing,
    /// To the failure policy, which holds whatever the leases held.
    Policy,
}

impl Way {
    /// Whether a check goes to the failure policy: only once a handover is done and while the
    /// breaker is open. During a handover checks go to the leases (denied beyond them), and
    /// once the breaker closed the route goes back to the leases.
    #[inline]
    pub fn to_policy(self, open: bool) -> bool {
        self == Way::Policy && open
    }
}

/// The route word.
#[derive(Debug, Default)]
pub struct Route(AtomicUsize);

impl Route {
    /// Where checks go now.
    #[inline]
    pub fn way(&self) -> Way {
        // Acquire: pairs with the Release in `finish`: a check that reads `Policy` sees every
        // state the handover wrote into the policy.
        match self.0.load(Ordering::Acquire) {
            LEASES => Way::Leases,
            HANDING => Way::Handing,
            _ => Way::Policy,
        }
    }

    /// Elects the one caller that runs the handover: whether this call moved `Leases` to
    /// `Handing`.
    pub fn begin(&self) -> bool {
        // Relaxed: the CAS only elects; what the handover reads (lease words, under their own
        // RMWs and locks) is not published through the route.
        self.0
            .compare_exchange(LEASES, HANDING, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends the handover: checks go to the policy from now on.
    pub fn finish(&self) {
        // Release: publishes the policy's states the handover wrote (see `way`).
        self.0.store(POLICY, Ordering::Release);
    }

    /// Back to the leases once the breaker closed (from `Policy` only: a running handover
    /// finishes first). Whether this call moved it.
    pub fn back(&self) -> bool {
        // Relaxed: the leases were emptied by RMWs on their own words before `finish`; a
        // check reading `Leases` finds them by those RMWs, not through the route.
        self.0
            .compare_exchange(POLICY, LEASES, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_finished_handover_with_the_breaker_open_goes_to_the_policy() {
        let cases = [
            (Way::Leases, false, false),
            (Way::Leases, true, false),
            // A check racing a handover still spends from its lease.
            (Way::Handing, false, false),
            (Way::Handing, true, false),
            (Way::Policy, false, false),
            (Way::Policy, true, true),
        ];
        for (way, open, to_policy) in cases {
            assert_eq!(way.to_policy(open), to_policy, "{way:?}, open: {open}");
        }
    }

    #[test]
    fn one_handover_then_the_policy_then_back_to_the_leases() {
        let route = Route::default();
        assert_eq!(route.way(), Way::Leases);
        assert!(!route.back(), "no way back before a handover");
        assert!(route.begin(), "the first caller is elected");
        assert_eq!(route.way(), Way::Handing);
        assert!(!route.begin(), "one caller runs the handover");
        assert!(!route.back(), "a running handover finishes first");
        route.finish();
        assert_eq!(route.way(), Way::Policy);
        assert!(!route.begin(), "not while the policy decides");
        assert!(route.back(), "the breaker closed");
        assert_eq!(route.way(), Way::Leases);
        assert!(!route.back());
        assert!(route.begin(), "the next outage hands over again");
    }
}
