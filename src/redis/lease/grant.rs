//! The grant protocol, on one lease: how much a refill asks for, and how Redis's answer becomes
//! units in the word, a low-water mark, a backoff and the figures checks report. No network
//! here: the scheduler sends what [`prepare`] asks and hands the reply to [`install`].

use std::sync::atomic::Ordering;

use super::cell::Lease;
use super::config::{Counters, Terms};
use super::first_touch::cover;
use super::word::{now_ms, DAY, MAX_LEASE};
use crate::clock::Nanos;
use crate::redis::exact::{Algo, Reply, UnitOp};

/// What a refill of `lease`, asked for at `t0`, requests: `(want, target)`, or `None`.
pub(super) fn prepare(terms: &Terms, lease: &Lease, t0: Nanos) -> Option<(u64, u64)> {
    let mut bg = lease.bg.lock();
    // First-touch units are not held: the first grant must cover them.
    let owed = bg.provisional;
    // What will still be usable when the grant arrives (GCRA leases decay).
    let (decay, at) = (terms.decay(), t0.saturating_add(bg.lead));
    let held = lease.hot.word.held(at, decay).saturating_sub(owed) + bg.parked_units(at, decay);
    if bg.installed_at > 0 && t0 > bg.installed_at {
        let consumed = bg.level_after.saturating_sub(held) as f64;
        let rate = consumed / (t0 - bg.installed_at) as f64;
        bg.rate = if bg.rate == 0.0 {
            rate
        } else {
            0.5 * rate + 0.5 * bg.rate
        };
    }
    // Enough for the horizon, and for four of the slowest recent refills.
    let horizon = (terms.config.horizon.as_nanos() as f64).max(4.0 * bg.slowest as f64);
    bg.target = if bg.rate > 0.0 {
        ((bg.rate * horizon).ceil() as u64).clamp(1, terms.max_lease)
    } else {
        // No history yet: a quarter of the largest lease.
        (terms.max_lease / 4).max(1)
    };
    // Relaxed: a self-contained hint; no other memory is published through it.
    let need = lease.need.swap(0, Ordering::Relaxed);
    let want = bg
        .target
        .saturating_sub(held)
        .max(need.saturating_sub(held))
        .max(1)
        .saturating_add(owed)
        .min(MAX_LEASE - held.min(MAX_LEASE));
    (want > 0).then_some((want, bg.target))
}

/// Installs the answer to a grant request of `want` units asked at `t0` (`now` is the limiter
/// clock after the reply). Returns the charge to send if first-touch units were spent that the
/// grant did not cover.
pub(super) fn install(
    terms: &Terms,
    lease: &Lease,
    reply: &Reply,
    (t0, now): (Nanos, Nanos),
    (want, target): (u64, u64),
    stats: &Counters,
) -> Option<(UnitOp, u64)> {
    Counters::add(&stats.granted, reply.units);
    let horizon = Terms::nanos(terms.config.horizon);
    let mut bg = lease.bg.lock();
    // The deadline, the window's start on the server's clock, and when more budget is
    // expected.
    let (deadline, window_start, retry, poll) = match terms.algo {
        Algo::Gcra { interval, span } => {
            // The grant's units are the bucket's last slots, up to the end of its debt
            // (`fact`, the debt after the grant). The lease's deadline is that end plus the
            // horizon and one `T`, by the node's clock started before the server read its own
            // (a thousandth less for drift), at most a day; before it, the lease decays one
            // unit per `T` (`word::usable`). So no unit outlives its slot by more than the
            // horizon and one `T` (the bound on `LeasedLimiter`).
            let life = reply.fact.saturating_add(horizon).saturating_add(interval);
            let life = (life - life / 1024).min(DAY);
            let next_unit = (reply.fact + interval).saturating_sub(span);
            let wanted = reply
                .fact
                .saturating_add(want.saturating_mul(interval))
                .saturating_sub(span);
            (
                now_ms(t0.saturating_add(life)),
                None,
                next_unit,
                wanted.min(horizon),
            )
        }
        Algo::Fixed { window } | Algo::Sliding { window } => {
            let e = reply.fact;
            let left = window - e;
            // The node's clock started before the server read its own: `t0 + left` is at or
            // before the window's end; a thousandth more covers clock drift.
            let life = (left - left / 1024).min(Terms::nanos(terms.config.max_age));
            let deadline = now_ms(t0.saturating_add(life));
            // A spent fixed window has budget again when it ends; a sliding estimate frees
            // some continuously. Either may get units back from other nodes sooner: ask again
            // within the horizon.
            let retry = if matches!(terms.algo, Algo::Fixed { .. }) {
                left
            } else {
                window / 64
            };
            (deadline, Some(reply.time - e), retry, retry.min(horizon))
        }
    };
    let covering = bg.provisional > 0;
    let (granted, charge) = cover(terms, lease, &mut bg, reply.units, window_start, stats);
    // The slowest recent refill, forgotten by an eighth per refill.
    bg.slowest = (now - t0).max(bg.slowest - bg.slowest / 8);
    // Refill when what is left covers two of the slowest recent refills, or half the target,
    // whichever is more (at most the target).
    let low_water = ((bg.rate * 2.0 * bg.slowest as f64) as u64)
        .max(target / 2)
        .min(target);
    let level = match terms.window() {
        // Units of the same window stay valid until the new grant's deadline (it is as
        // conservative as the old one, and the server has just confirmed the window), even if
        // the old lease expired by age; a new window voids what is left of the old one.
        Some(_) => {
            let same = bg.window_start == window_start;
            lease.hot.word.deposit(granted, same, deadline)
        }
        // GCRA: each grant's units keep their own deadline. While the word holds live units
        // of an earlier grant, this one is parked until a check finds those spent or expired.
        None => {
            let decay = terms.decay();
            let end = reply.time.saturating_add(reply.fact);
            let start = end.saturating_sub(reply.units.saturating_mul(decay));
            if lease.hot.word.held(now, decay) == 0 {
                // A parked grant no check has taken over yet goes first.
                if let Some((units, at)) = bg.parked.take() {
                    lease.hot.word.replace(units, at);
                }
            }
            let held = lease.hot.word.held(now, decay);
            if held == 0 {
                lease.hot.word.replace(granted, deadline);
                bg.parked = None;
                bg.grant_end = end;
                granted
            } else if covering || (bg.parked.is_none() && start == bg.grant_end) {
                // The word's units are this grant's (first-touch units it covered), or the
                // grant's slots follow the word's: one run, the new deadline.
                bg.grant_end = end;
                lease.hot.word.extend(granted, now, decay, deadline)
            } else if granted == 0 {
                held + bg.parked_units(now, decay)
            } else {
                let (units, at, end) = match bg.parked {
                    // Its slots follow the parked grant's: one run.
                    Some((units, _)) if start == bg.grant_end => {
                        (units.saturating_add(granted), deadline, end)
                    }
                    // Two parked grants share the earlier deadline, and cannot go back.
                    Some((units, at)) => (units.saturating_add(granted), at, 0),
                    None => (granted, deadline, end),
                };
                bg.parked = Some((units.min(MAX_LEASE), at));
                bg.grant_end = end;
                held + units
            }
        }
    };
    bg.window_start = window_start;
    bg.grant_time = reply.time;
    // The reply came after the server read its clock: the window is surely over by then.
    bg.window_over = terms
        .window()
        .map_or(u64::MAX, |window| now.saturating_add(window - reply.fact));
    bg.installed_at = now;
    bg.level_after = level;
    bg.low_water = low_water;
    // Ask for the next grant two of the slowest recent refills before the word expires, and
    // a quarter of the horizon at least: a runtime stalled longer than its refills took
    // (a loaded machine) would otherwise let the word expire before the grant arrives.
    bg.lead = if terms.decay() > 0 {
        (2 * bg.slowest).max(horizon / 4)
    } else {
        0
    };
    // While a grant is parked, the word's rest runs out before another refill is due.
    let parked = bg.parked.is_some();
    // Relaxed, both: self-contained hints; no other memory is published through them.
    lease
        .hot
        .low_water
        .store(if parked { 0 } else { low_water }, Ordering::Relaxed);
    lease
        .hot
        .lead
        .store(if parked { 0 } else { bg.lead }, Ordering::Relaxed);
    // An overdraft charged now lands in the grant's window (one of an earlier window does not).
    let extra = match charge {
        Some((UnitOp::Charge { at: None }, units)) => units,
        _ => 0,
    };
    let (left, full_in) = view(terms, reply, extra);
    // Relaxed, all three: hints for the figures of decisions (see `LeasedLimiter::check_n`).
    lease.hot.view_left.store(left, Ordering::Relaxed);
    lease.hot.view_at.store(now, Ordering::Relaxed);
    lease.hot.view_full_at.store(
        full_in.map_or(0, |d| now.saturating_add(d)),
        Ordering::Relaxed,
    );
    let backoff = Terms::nanos(terms.config.backoff);
    let retry_at = if reply.units < want {
        bg.not_before = t0.saturating_add(poll.max(backoff));
        t0.saturating_add(retry)
    } else {
        bg.not_before = 0;
        0
    };
    // Relaxed: a self-contained hint; no other memory is published through it.
    lease.retry_at.store(retry_at, Ordering::Relaxed);
    charge
}

/// The global state right after a grant, from its reply: the units it could still grant
/// (every unit held in a lease counts as spent), and the wait until it is back to full
/// capacity (`None` if it is full), by the decision rules' `remaining` and `reset_after` at the server's
/// time; `extra` units are about to be charged on top.
fn view(terms: &Terms, reply: &Reply, extra: u64) -> (u64, Option<u64>) {
    let limit = terms.rule.limit();
    match terms.algo {
        Algo::Gcra { interval, span } => {
            let debt = reply.fact.saturating_add(extra.saturating_mul(interval));
            let left = span.saturating_sub(debt) / interval.max(1);
            (left, (debt > 0).then_some(debt))
        }
        Algo::Fixed { window } => {
            let count = reply.count.saturating_add(extra);
            let left = limit.saturating_sub(count);
            (left, (count > 0).then_some(window - reply.fact))
        }
        Algo::Sliding { window } => {
            let (l, w, e) = (limit as i128, window as i128, reply.fact as i128);
            let cur = reply.count.saturating_add(extra) as i128;
            let prev = reply.prev as i128;
            // (L − est)·W, est = cur + prev·(W − e)/W; remaining = ⌈L − est⌉.
            let headroom = l * w - cur * w - prev * (w - e);
            let left = if headroom <= 0 {
                0
            } else {
                u64::try_from((headroom + w - 1) / w).unwrap_or(u64::MAX)
            };
            let full_in = if cur > 0 {
                Some(2 * window - reply.fact)
            } else if prev > 0 {
                Some(window - reply.fact)
            } else {
                None
            };
            (left, full_in)
        }
    }
}

/// GCRA: the units refilled between `since` and `now`, one per `interval`.
pub(super) fn accrued(interval: u64, since: Nanos, now: Nanos) -> u64 {
    now.saturating_sub(since) / interval.max(1)
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
    use crate::redis::lease::first_touch::first_lease;
    use crate::redis::lease::word::{deadline_of, pack, units_of, MS};
    use crate::redis::RedisRule;
    use crate::Quota;

    /// A lease's life less the thousandth kept for clock drift.
    fn less_drift(life: u64) -> u64 {
        life - life / 1024
    }

    fn relaxed(atomic: &std::sync::atomic::AtomicU64) -> u64 {
        atomic.load(Ordering::Relaxed)
    }

    /// A first refill asks for a quarter of the largest lease; one that knows the key's rate
    /// asks for the horizon's worth of it, the rate a running average of each refill's; a
    /// check's stated need and unsettled first-touch units are asked on top.
    #[test]
    fn a_refill_asks_for_the_horizons_worth_of_the_recent_rate() {
        let terms = Terms::thousand_a_second(RedisRule::fixed_window);
        assert_eq!(terms.max_lease, 62);
        let lease = Lease::new(b"k");
        assert_eq!(prepare(&terms, &lease, MS), Some((15, 15)), "62 / 4");
        lease.need.store(40, Ordering::Relaxed);
        assert_eq!(
            prepare(&terms, &lease, MS),
            Some((40, 15)),
            "a check needs 40"
        );
        assert_eq!(relaxed(&lease.need), 0, "the need is taken");

        // 20 units installed at 1 ms, 10 left at 11 ms: 1 unit a ms, 50 for the horizon.
        lease.hot.word.deposit(10, false, 1_000);
        {
            let mut bg = lease.bg.lock();
            bg.installed_at = MS;
            bg.level_after = 20;
        }
        assert_eq!(prepare(&terms, &lease, 11 * MS), Some((40, 50)));
        // 10 consumed in 20 ms: 0.5 a ms, averaged with the last rate: 0.75, 38 units.
        assert_eq!(prepare(&terms, &lease, 21 * MS), Some((28, 38)));

        // Asked again at the instant of the last install: no time to measure a rate in, the
        // last one stands.
        lease.bg.lock().installed_at = 21 * MS;
        assert_eq!(prepare(&terms, &lease, 21 * MS), Some((28, 38)));

        // First-touch units the first grant must cover are asked on top.
        let lease = Lease::new(b"k");
        lease.hot.word.deposit(5, false, 1_000);
        lease.bg.lock().provisional = 5;
        assert_eq!(prepare(&terms, &lease, MS), Some((20, 15)));

        // A parked grant's units are held.
        let lease = Lease::new(b"k");
        lease.bg.lock().parked = Some((10, 1_000));
        assert_eq!(prepare(&terms, &lease, MS), Some((5, 15)));

        // Slow refills lengthen the horizon: four of the slowest, 80 ms at 0.5 units a ms.
        let lease = Lease::new(b"k");
        lease.hot.word.deposit(10, false, 1_000);
        {
            let mut bg = lease.bg.lock();
            (bg.installed_at, bg.level_after, bg.slowest) = (MS, 20, 20 * MS);
        }
        assert_eq!(prepare(&terms, &lease, 21 * MS), Some((30, 40)));

        // The word holds at most `MAX_LEASE`: a need beyond asks for the rest, a full word
        // for nothing.
        let lease = Lease::new(b"k");
        lease.hot.word.deposit(MAX_LEASE - 5, false, 1_000);
        lease.need.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(prepare(&terms, &lease, MS), Some((5, 15)));
        lease.hot.word.deposit(5, true, 1_000);
        assert_eq!(prepare(&terms, &lease, MS), None);
    }

    /// A window grant: its units are the window's until (a thousandth before) its end, the
    /// low-water mark is half the target, the figures are the window's after the grant, and a
    /// short grant sets when to ask again (the window's end, for a fixed window) and backs off.
    #[test]
    fn a_window_grant_lasts_to_the_windows_end() {
        let terms = Terms::thousand_a_second(RedisRule::fixed_window);
        let stats = Counters::default();
        let lease = Lease::new(b"k");
        let time = 7_000 * 1_000 * MS; // the server's clock: 200 ms into a window
        let reply = Reply {
            units: 15,
            time: time + 200 * MS,
            fact: 200 * MS,
            prev: 0,
            count: 15,
        };
        let charge = install(&terms, &lease, &reply, (0, 2 * MS), (15, 15), &stats);
        assert_eq!(charge, None);
        let life = less_drift(800 * MS);
        assert_eq!(lease.hot.word.load(), pack(15, now_ms(life)));
        assert_eq!(relaxed(&stats.granted), 15);
        assert_eq!(relaxed(&lease.hot.low_water), 7);
        assert_eq!(relaxed(&lease.hot.lead), 0, "window units do not decay");
        assert_eq!(relaxed(&lease.hot.view_left), 985);
        assert_eq!(relaxed(&lease.hot.view_at), 2 * MS);
        assert_eq!(relaxed(&lease.hot.view_full_at), 802 * MS);
        assert_eq!(relaxed(&lease.retry_at), 0, "granted in full");
        {
            let bg = lease.bg.lock();
            assert_eq!(bg.window_start, Some(time));
            assert_eq!(bg.window_over, 802 * MS);
            assert_eq!(
                (bg.installed_at, bg.level_after, bg.slowest),
                (2 * MS, 15, 2 * MS)
            );
        }

        // The same window again, short of what was asked: the units add up, and the next ask
        // waits for the window's end, the next refill for the horizon.
        let short = Reply {
            units: 5,
            time: time + 300 * MS,
            fact: 300 * MS,
            count: 20,
            ..reply
        };
        install(
            &terms,
            &lease,
            &short,
            (100 * MS, 101 * MS),
            (15, 15),
            &stats,
        );
        assert_eq!(units_of(lease.hot.word.load()), 20);
        assert_eq!(relaxed(&lease.retry_at), 100 * MS + 700 * MS);
        assert_eq!(lease.bg.lock().not_before, 150 * MS);
        assert_eq!(relaxed(&stats.granted), 20);
        // A faster refill: the slowest is forgotten by an eighth.
        assert_eq!(lease.bg.lock().slowest, 2 * MS - 2 * MS / 8);

        // A new window voids what is left of the old one.
        let next = Reply {
            units: 3,
            time: time + 1_100 * MS,
            fact: 100 * MS,
            count: 3,
            ..reply
        };
        install(&terms, &lease, &next, (900 * MS, 901 * MS), (3, 15), &stats);
        assert_eq!(units_of(lease.hot.word.load()), 3);
        assert_eq!(lease.bg.lock().window_start, Some(time + 1_000 * MS));

        // A sliding estimate frees units continuously: a short grant asks again a 64th of the
        // window later.
        let sliding = Terms::thousand_a_second(RedisRule::sliding_window);
        let lease = Lease::new(b"k");
        install(
            &sliding,
            &lease,
            &short,
            (100 * MS, 101 * MS),
            (15, 15),
            &stats,
        );
        assert_eq!(relaxed(&lease.retry_at), 100 * MS + 1_000 * MS / 64);
        assert_eq!(lease.bg.lock().not_before, 100 * MS + 1_000 * MS / 64);
    }

    /// GCRA grants: a grant's units live until the end of the bucket's debt plus the horizon
    /// and one interval; a grant whose slots follow the word's extends it, one that does not
    /// is parked until the word's units are spent (no refill is asked meanwhile).
    #[test]
    fn gcra_grants_extend_the_word_or_wait_parked() {
        let terms = Terms::thousand_a_second(RedisRule::gcra);
        let Algo::Gcra { interval, span } = terms.algo else {
            unreachable!()
        };
        assert_eq!(interval, MS);
        let stats = Counters::default();
        let lease = Lease::new(b"k");
        let time = 7_000 * 1_000 * MS;
        // 15 units from a full bucket: a debt of 15 ms after the grant.
        let reply = Reply {
            units: 15,
            time,
            fact: 15 * MS,
            prev: 0,
            count: 0,
        };
        install(&terms, &lease, &reply, (0, 2 * MS), (15, 15), &stats);
        let life = |debt: u64| less_drift(debt + 50 * MS + interval);
        assert_eq!(lease.hot.word.load(), pack(15, now_ms(life(15 * MS))));
        assert_eq!(
            relaxed(&lease.hot.lead),
            50 * MS / 4,
            "a quarter of the horizon"
        );
        assert_eq!(relaxed(&lease.hot.view_left), (span - 15 * MS) / interval);
        assert_eq!(relaxed(&lease.hot.view_full_at), 2 * MS + 15 * MS);
        assert_eq!(lease.bg.lock().grant_end, time + 15 * MS);

        // 5 ms later on the server: 5 units refilled, 10 granted, whose slots follow the
        // word's (the debt is 20 ms): one run of 25 units, the new deadline.
        let follows = Reply {
            units: 10,
            time: time + 5 * MS,
            fact: 20 * MS,
            ..reply
        };
        install(&terms, &lease, &follows, (5 * MS, 7 * MS), (10, 15), &stats);
        let word = lease.hot.word.load();
        assert_eq!(units_of(word), 25);
        assert_eq!(deadline_of(word), now_ms(5 * MS + life(20 * MS)));
        assert_eq!(lease.bg.lock().parked, None);

        // A grant whose slots do not follow (another node took some between): parked while
        // the word holds units, and no refill is asked until a check takes it over.
        let apart = Reply {
            units: 4,
            time: time + 10 * MS,
            fact: 30 * MS,
            ..reply
        };
        install(&terms, &lease, &apart, (10 * MS, 12 * MS), (4, 15), &stats);
        assert_eq!(units_of(lease.hot.word.load()), 25, "the word is unchanged");
        let deadline = now_ms(10 * MS + life(30 * MS));
        assert_eq!(lease.bg.lock().parked, Some((4, deadline)));
        assert_eq!(relaxed(&lease.hot.low_water), 0);
        assert_eq!(relaxed(&lease.hot.lead), 0);
        // The word spent, a check takes the parked grant over.
        assert!(lease.hot.word.take(25, 12 * MS, interval).is_some());
        assert!(lease.unpark(12 * MS, interval));
        assert_eq!(lease.hot.word.load(), pack(4, deadline));
        assert_eq!(relaxed(&stats.granted), 29);

        // Short of what was asked, with the bucket empty after the grant: the next unit is
        // due in one interval; the next refill waits until the units asked for are.
        let lease = Lease::new(b"k");
        let empty = Reply {
            units: 5,
            fact: span,
            ..reply
        };
        install(&terms, &lease, &empty, (10 * MS, 12 * MS), (15, 15), &stats);
        assert_eq!(relaxed(&lease.retry_at), 10 * MS + interval);
        assert_eq!(lease.bg.lock().not_before, 10 * MS + 15 * interval);

        // The first grant of a first-touch lease covers its units: the word's units are the
        // grant's, so the rest of the grant extends the word rather than waiting parked.
        let lease = first_lease(&terms, b"k", 5, None, 0);
        let first = Reply { units: 8, ..reply };
        install(&terms, &lease, &first, (0, 2 * MS), (13, 15), &stats);
        assert_eq!(units_of(lease.hot.word.load()), 8);
        assert_eq!(lease.bg.lock().parked, None);

        // All 5 spent and 2 granted: 3 are charged, and the figures count them.
        let lease = first_lease(&terms, b"k", 5, None, 0);
        lease.hot.word.take(5, 0, interval);
        let first = Reply { units: 2, ..reply };
        let charge = install(&terms, &lease, &first, (0, 2 * MS), (7, 15), &stats);
        assert_eq!(charge, Some((UnitOp::Charge { at: None }, 3)));
        let left = (span - 15 * MS) / interval - 3;
        assert_eq!(relaxed(&lease.hot.view_left), left);

        // A second's interval: the thousandth taken off the life for drift is whole
        // milliseconds (6.05 s of life, 5.9 ms off).
        let slow = Terms::of(RedisRule::gcra(Quota::per_minute(60).unwrap()).unwrap());
        let lease = Lease::new(b"k");
        let debt = Reply {
            fact: 5_000 * MS,
            ..reply
        };
        install(&slow, &lease, &debt, (0, 2 * MS), (15, 15), &stats);
        let life = less_drift(6_050 * MS);
        assert_eq!(lease.hot.word.load(), pack(15, now_ms(life)));
    }

    /// The low-water mark covers two of the slowest refills at the recent rate, if that is
    /// more than half the target.
    #[test]
    fn the_low_water_mark_covers_two_slow_refills() {
        let terms = Terms::thousand_a_second(RedisRule::fixed_window);
        let lease = Lease::new(b"k");
        lease.bg.lock().rate = 1.0 / 131_072.0; // units a ns: 30.5 in two refills of 2 ms
        let reply = Reply {
            units: 40,
            time: 200 * MS,
            fact: 200 * MS,
            prev: 0,
            count: 40,
        };
        install(
            &terms,
            &lease,
            &reply,
            (0, 2 * MS),
            (40, 40),
            &Counters::default(),
        );
        assert_eq!(relaxed(&lease.hot.low_water), 30);
    }

    /// GCRA grants queue behind the word's units: a parked grant goes into an empty word
    /// before a new grant that follows it; grants that follow the parked one join it (its
    /// units, the new deadline), others share the earlier deadline; the level a refill
    /// measures the rate from counts the word's units and the parked ones.
    #[test]
    fn gcra_grants_queue_behind_the_words_units() {
        let terms = Terms::thousand_a_second(RedisRule::gcra);
        let stats = Counters::default();
        let far = 10_000; // ms
        let grant = |units: u64, end: u64| Reply {
            units,
            time: 0,
            fact: end,
            prev: 0,
            count: 0,
        };

        // An empty word, a parked grant ending at 15 ms: the new grant follows it.
        let lease = Lease::new(b"k");
        {
            let mut bg = lease.bg.lock();
            (bg.parked, bg.grant_end) = (Some((4, far)), 15 * MS);
        }
        install(
            &terms,
            &lease,
            &grant(2, 17 * MS),
            (2 * MS, 12 * MS),
            (2, 15),
            &stats,
        );
        assert_eq!(units_of(lease.hot.word.load()), 6);
        assert_eq!(lease.bg.lock().parked, None);
        // A refill of 10 ms: the next is asked two of them before the word expires (more
        // than a quarter of the horizon).
        assert_eq!(relaxed(&lease.hot.lead), 20 * MS);

        // A word of 10 units and a parked grant of 4 ending at 15 ms.
        let lease = Lease::new(b"k");
        lease.hot.word.replace(10, far);
        {
            let mut bg = lease.bg.lock();
            (bg.parked, bg.grant_end) = (Some((4, far)), 15 * MS);
        }
        // Nothing granted: the level is both.
        install(
            &terms,
            &lease,
            &grant(0, 30 * MS),
            (0, 2 * MS),
            (5, 15),
            &stats,
        );
        assert_eq!(lease.bg.lock().level_after, 14);
        // Following the parked grant: one run, the new deadline.
        install(
            &terms,
            &lease,
            &grant(2, 17 * MS),
            (0, 2 * MS),
            (5, 15),
            &stats,
        );
        let deadline = now_ms(less_drift(17 * MS + 50 * MS + MS));
        {
            let bg = lease.bg.lock();
            assert_eq!(bg.parked, Some((6, deadline)));
            assert_eq!((bg.grant_end, bg.level_after), (17 * MS, 16));
        }
        // Not following: the earlier deadline, and no run to follow any more.
        install(
            &terms,
            &lease,
            &grant(3, 40 * MS),
            (0, 2 * MS),
            (5, 15),
            &stats,
        );
        let bg = lease.bg.lock();
        assert_eq!(bg.parked, Some((9, deadline)));
        assert_eq!((bg.grant_end, bg.level_after), (0, 19));
        assert_eq!(units_of(lease.hot.word.load()), 10, "the word is unchanged");
    }

    /// The figures after a grant, by the decision rules at the server's time: what the state
    /// could still grant, and when it is full again.
    #[test]
    fn the_figures_after_a_grant_are_the_rules_at_the_servers_time() {
        let reply = |fact, prev, count| Reply {
            units: 0,
            time: 0,
            fact,
            prev,
            count,
        };
        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        assert_eq!(view(&gcra, &reply(0, 0, 0), 0), (1_000, None));
        assert_eq!(view(&gcra, &reply(15 * MS, 0, 0), 5), (980, Some(20 * MS)));
        let fixed = Terms::thousand_a_second(RedisRule::fixed_window);
        assert_eq!(view(&fixed, &reply(200 * MS, 0, 0), 0), (1_000, None));
        assert_eq!(
            view(&fixed, &reply(200 * MS, 0, 990), 20),
            (0, Some(800 * MS))
        );
        let sliding = Terms::thousand_a_second(RedisRule::sliding_window);
        // 400 of the previous window weigh 400 · 3/4 at a quarter in: 1000 − 300 − 100.
        assert_eq!(
            view(&sliding, &reply(250 * MS, 400, 100), 0),
            (600, Some(1_750 * MS))
        );
        assert_eq!(
            view(&sliding, &reply(250 * MS, 400, 0), 0),
            (700, Some(750 * MS))
        );
        assert_eq!(view(&sliding, &reply(250 * MS, 0, 0), 0), (1_000, None));
        // Over the limit: nothing left, not a wrapped count. Part of a unit left rounds up
        // (1,000 − 998 − 0.75).
        assert_eq!(view(&sliding, &reply(0, 2_000, 0), 0).0, 0);
        assert_eq!(view(&sliding, &reply(250 * MS, 1, 998), 0).0, 2);
        assert_eq!(accrued(MS, 10 * MS, 15 * MS + 1), 5);
        assert_eq!(accrued(MS, 15 * MS, 10 * MS), 0);
    }

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
