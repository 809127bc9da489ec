//! What the sweeper decides: how often it runs, and for each lease whether it is idle (to
//! retire, its units given back to Redis) or holds expired units to give back, so that units
//! a node no longer spends count against the global limit for no longer than a sweep period.
//! The task that acts on it is the scheduler's.

use std::time::Duration;

use super::cell::Lease;
use super::config::Terms;
use super::word::{deadline_of, expired, now_ms, units_of};
use crate::clock::Nanos;
use crate::redis::exact::Algo;

/// How often the sweeper runs: often enough to notice idle keys within a quarter of the idle
/// timeout, and expired window leases within a quarter of a window; at most every 5 ms.
pub(super) fn period(terms: &Terms) -> Duration {
    let config = terms.config;
    let window = terms.window().unwrap_or(u64::MAX);
    (config.idle_timeout / 4)
        .min(config.max_age / 2)
        .min(Duration::from_nanos(window / 4))
        .max(Duration::from_millis(5))
}

/// What a sweep found of one lease.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Swept {
    /// Nothing to do: in use, refilling, or holding nothing to give back.
    Kept,
    /// Unchanged for the idle timeout: to retire, its units given back.
    Idle,
    /// Its units expired (now void in the lease), and are still counted by the global state:
    /// `units` to give back, granted in the window of server time `since`.
    Expired { units: u64, since: u64 },
}

/// Sweeps `lease` at `now`: notes whether its word changed since the last sweep, and expires
/// its units if their deadline passed.
pub(super) fn visit(terms: &Terms, lease: &Lease, now: Nanos) -> Swept {
    if lease.refill.in_flight() {
        return Swept::Kept;
    }
    let word = lease.hot.word.load();
    let mut bg = lease.bg.lock();
    if word != bg.last_word || bg.still_since == 0 {
        bg.last_word = word;
        bg.still_since = now;
    } else if now - bg.still_since >= Terms::nanos(terms.config.idle_timeout) {
        return Swept::Idle;
    }
    if units_of(word) == 0
        || !expired(now_ms(now), deadline_of(word))
        || !lease.hot.word.expire(word)
    {
        return Swept::Kept;
    }
    bg.last_word = lease.hot.word.load();
    // A fixed window that is over has forgotten its count, and the bucket refilled an expired
    // GCRA lease's units: nothing to give back.
    let over = match terms.algo {
        Algo::Fixed { .. } => now >= bg.window_over,
        Algo::Gcra { .. } => true,
        Algo::Sliding { .. } => false,
    };
    if over {
        return Swept::Kept;
    }
    Swept::Expired {
        units: units_of(word),
        since: bg.grant_time,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::lease::config::LeaseConfig;
    use crate::redis::lease::word::MS;
    use crate::redis::RedisRule;
    use crate::Quota;

    fn terms_with(rule: RedisRule, config: LeaseConfig) -> Terms {
        Terms {
            config,
            ..Terms::of(rule)
        }
    }

    /// A quarter of the idle timeout, half the largest lease age, a quarter of the window,
    /// whichever is shortest, and never under 5 ms.
    #[test]
    fn the_sweeper_runs_often_enough_for_the_shortest_of_its_deadlines() {
        let ms = Duration::from_millis;
        let gcra = RedisRule::gcra(Quota::per_second(1_000).unwrap()).unwrap();
        let window = |w| RedisRule::fixed_window(Quota::new(100, ms(w)).unwrap()).unwrap();
        let config = LeaseConfig::new();
        assert_eq!(period(&terms_with(gcra, config)), ms(250), "1 s idle");
        let idle = config.idle_timeout(ms(200));
        assert_eq!(period(&terms_with(gcra, idle)), ms(50));
        let young = config.max_age(ms(60));
        assert_eq!(period(&terms_with(gcra, young)), ms(30));
        assert_eq!(period(&terms_with(window(100), config)), ms(25));
        assert_eq!(period(&terms_with(window(8), config)), ms(5), "the floor");
    }

    /// A lease is idle once its word stayed the same for the idle timeout; a change, or a
    /// refill in flight, keeps it.
    #[test]
    fn a_lease_unchanged_for_the_idle_timeout_is_idle() {
        let terms = Terms::thousand_a_second(RedisRule::gcra);
        let idle = Terms::nanos(terms.config.idle_timeout);
        let lease = Lease::new(b"k");
        let t0 = 5 * MS;
        assert_eq!(visit(&terms, &lease, t0), Swept::Kept, "first seen");
        assert_eq!(visit(&terms, &lease, t0 + idle - 1), Swept::Kept);
        assert_eq!(visit(&terms, &lease, t0 + idle), Swept::Idle);

        // A check spent from it (its word changed): still from then on.
        lease.hot.word.deposit(3, false, 100_000);
        let t1 = t0 + idle + 1;
        assert_eq!(visit(&terms, &lease, t1), Swept::Kept);
        assert_eq!(visit(&terms, &lease, t1 + idle - 1), Swept::Kept);
        assert!(lease.refill.claim());
        assert_eq!(visit(&terms, &lease, t1 + idle), Swept::Kept, "refilling");
        assert!(lease.refill.finish());
        assert_eq!(visit(&terms, &lease, t1 + idle), Swept::Idle);
    }

    /// Expired units are voided; they go back while the global state still counts them: a
    /// sliding window's always (its `prev`), a fixed window's until the window is over, a
    /// GCRA grant's never (the bucket refilled them).
    #[test]
    fn expired_units_are_void_and_go_back_while_the_state_counts_them() {
        let cases = [
            (RedisRule::sliding_window as fn(_) -> _, 0, true),
            (RedisRule::fixed_window, 20 * MS, true),
            (RedisRule::fixed_window, 10 * MS, false),
            (RedisRule::gcra, 20 * MS, false),
        ];
        for (rule, window_over, back) in cases {
            let terms = Terms::thousand_a_second(rule);
            let lease = Lease::new(b"k");
            lease.hot.word.deposit(7, false, 10);
            {
                let mut bg = lease.bg.lock();
                (bg.grant_time, bg.window_over) = (42, window_over);
            }
            assert_eq!(visit(&terms, &lease, 9 * MS), Swept::Kept, "live");
            assert_eq!(units_of(lease.hot.word.load()), 7);
            let swept = visit(&terms, &lease, 10 * MS);
            let expected = if back {
                Swept::Expired {
                    units: 7,
                    since: 42,
                }
            } else {
                Swept::Kept
            };
            assert_eq!(swept, expected, "{:?}", terms.algo);
            assert_eq!(units_of(lease.hot.word.load()), 0, "void");
            assert_eq!(visit(&terms, &lease, 11 * MS), Swept::Kept, "once");
        }
    }
}
