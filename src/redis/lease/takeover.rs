//! The takeover: when the breaker opens, every lease's units (on a Cluster, those of the keys
//! of that breaker's slot owner) move into the failure policy's own state at once, so that from then on a check goes straight to the policy (no lease, no
//! lock, no task), and the policy starts each key from what the node last knew of it, not
//! from a full bucket. The bound this gives is on [`LeasedLimiter`](super::LeasedLimiter)
//! ("When Redis fails").

use super::cell::Lease;
use super::grant::seen_left;
use super::routes::RouteOf;
use super::scheduler::Node;
use super::word::{now_ms, usable};
use crate::clock::{Clock, Nanos};
use crate::redis::exact::RedisConnection;

impl<C: RedisConnection> Node<C> {
    /// Routes the checks of `route` to the failure policy, after handing its leases over to
    /// it if the policy keeps state of its own (`Local`): every lease on a single server, those
    /// of its slot owner's keys on a Cluster. Only one caller runs it (the route elects it);
    /// the others keep to their leases meanwhile. The cost, one pass over the leases, is paid
    /// once per outage by the check that noticed it.
    #[cold]
    pub fn hand_over(&self, route: &RouteOf<'_>) {
        if !route.route().begin() {
            return;
        }
        if self.guard.keeps_local_state() {
            let now = self.clock.now();
            for entry in self.leases.iter() {
                let lease = entry.value();
                if !route.covers(&self.guard, &lease.key) {
                    continue;
                }
                let (held, seen) = self.empty_for_takeover(lease, now);
                self.guard.take_over(&lease.key, held, seen);
            }
        }
        route.route().finish();
    }

    /// Empties `lease` for the takeover: the granted units it held, and what the global state
    /// could still grant as far as this node knows (from the last grant's reply, plus for
    /// GCRA the units that accrued since, at most the capacity; for a window that is over,
    /// unknown: the capacity). First-touch units are settled as a failed grant settles them.
    fn empty_for_takeover(&self, lease: &Lease, now: Nanos) -> (u64, u64) {
        let spent = self.void_provisional(lease);
        self.guard.record_admitted(&lease.key, spent);
        let mut bg = lease.bg.lock();
        let word = lease.hot.word.empty(now_ms(now));
        // A parked GCRA grant is void: the policy starts from what the word held.
        bg.parked = None;
        bg.grant_end = 0;
        let held = usable(word, now, self.terms.decay());
        let window_over = bg.window_over;
        drop(bg);
        (held, seen_left(&self.terms, lease, now, window_over))
    }
}
