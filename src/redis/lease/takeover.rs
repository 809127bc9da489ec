//! The takeover: when the breaker opens, every lease's units (on a Cluster, those of the keys
//! of that breaker's slot owner) move into the failure policy's own state at once, so that from then on a check goes straight to the policy (no lease, no
//! lock, no task), and the policy starts each key from what the node last knew of it, not
//! from a full bucket. The bound this gives is on [`LeasedLimiter`](super::LeasedLimiter)
//! ("When Redis fails").

use std::sync::atomic::Ordering;

use super::cell::Lease;
use super::config::Terms;
use super::grant::accrued;
use super::routes::RouteOf;
use super::scheduler::Node;
use super::word::{now_ms, usable};
use crate::clock::{Clock, Nanos};
use crate::redis::exact::{Algo, RedisConnection};

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

/// What the global state could still grant at `now`, as `lease`'s last grant saw it.
pub(super) fn seen_left(terms: &Terms, lease: &Lease, now: Nanos, window_over: Nanos) -> u64 {
    let capacity = terms.rule.capacity();
    // Relaxed, both: hints written by one grant's install (see `LeasedLimiter::check_n`).
    let view_left = lease.hot.view_left.load(Ordering::Relaxed);
    let view_at = lease.hot.view_at.load(Ordering::Relaxed);
    if view_at == 0 {
        // No grant yet: the node knows nothing of the key.
        return capacity;
    }
    match terms.algo {
        Algo::Gcra { interval, .. } => view_left
            .saturating_add(accrued(interval, view_at, now))
            .min(capacity),
        Algo::Fixed { .. } | Algo::Sliding { .. } if now < window_over => view_left,
        Algo::Fixed { .. } | Algo::Sliding { .. } => capacity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::lease::word::MS;
    use crate::redis::RedisRule;
    use crate::Quota;

    /// What the policy starts a key from when Redis fails: what the last grant's reply left,
    /// plus for GCRA the units that accrued since (at most the capacity); for a window, its
    /// figure while the window lasts, then the capacity; the capacity for a key never granted.
    #[test]
    fn the_policy_starts_from_what_the_last_grant_left() {
        for (rule, windowed) in [
            (RedisRule::gcra as fn(Quota) -> _, false),
            (RedisRule::fixed_window, true),
            (RedisRule::sliding_window, true),
        ] {
            let terms = Terms::thousand_a_second(rule);
            let lease = Lease::new(b"k");
            assert_eq!(
                seen_left(&terms, &lease, 5 * MS, u64::MAX),
                1_000,
                "never granted"
            );
            lease.hot.view_left.store(100, Ordering::Relaxed);
            lease.hot.view_at.store(10 * MS, Ordering::Relaxed);
            let (soon, later) = (
                seen_left(&terms, &lease, 15 * MS + 1, 20 * MS),
                seen_left(&terms, &lease, 20 * MS, 20 * MS),
            );
            if windowed {
                assert_eq!((soon, later), (100, 1_000), "the window is over at 20 ms");
            } else {
                assert_eq!((soon, later), (105, 110), "1 unit a ms");
                let much_later = seen_left(&terms, &lease, 10_000 * MS, 0);
                assert_eq!(much_later, 1_000, "at most the capacity");
            }
        }
    }
}
