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
