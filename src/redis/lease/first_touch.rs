//! The first-touch allowance: the provisional units a key's lease starts with while its first
//! grant is in flight, and how a grant (or its failure) settles them; and what a retired
//! lease leaves behind ([`Owed`]) so that the allowance does not come back with every idle
//! period. The bound they add is on [`LeasedLimiter`](super::LeasedLimiter) ("First touch").

use std::sync::atomic::Ordering;

use super::cell::{Bg, Lease};
use super::config::{Counters, Terms};
use super::word::{now_ms, LeaseWord, DAY};
use crate::clock::Nanos;
use crate::redis::exact::units::wall_nanos;
use crate::redis::exact::{Algo, UnitOp};

/// What a lease retired before its key's global state was full again leaves behind: the
/// global state as its last grant saw it, and when to ask again. A first touch of the key
/// while it lasts starts from it instead of from nothing: no provisional allowance (the key
/// was not full when this node last saw it, so an allowance could be spent beyond the
/// limit), and a denial's `retry_after` and the refill's backoff as the retired lease had
/// them. Kept until the state is expected full again (`full_at`), then forgotten: a key is
/// remembered no longer than its own refill takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owed {
    /// When the global state is expected back at full capacity (limiter clock, ns).
    pub full_at: Nanos,
    /// The retired lease's hints (see [`Lease`]): `retry_at`, `view_left`, `view_at`.
    pub retry_at: Nanos,
    pub view_left: u64,
    pub view_at: Nanos,
    /// No grant request before this time (limiter clock, ns).
    pub not_before: Nanos,
}

impl Owed {
    /// What `lease`, retired at `now`, leaves behind: `None` if its key's state was full as
    /// the last grant saw it, or is expected full by now (nothing is owed).
    pub fn of(lease: &Lease, now: Nanos) -> Option<Owed> {
        // Relaxed, all: hints written by one grant's install (see `LeasedLimiter::check_n`).
        let read = |hint: &std::sync::atomic::AtomicU64| hint.load(Ordering::Relaxed);
        let full_at = read(&lease.hot.view_full_at);
        (full_at > now).then(|| Owed {
            full_at,
            retry_at: read(&lease.retry_at),
            view_left: read(&lease.hot.view_left),
            view_at: read(&lease.hot.view_at),
            not_before: lease.bg.lock().not_before,
        })
    }

    /// Whether it still holds at `now`.
    pub fn live(&self, now: Nanos) -> bool {
        self.full_at > now
    }

    /// Puts the retired lease's hints into `lease`, a new lease of the same key.
    fn restore(&self, lease: &mut Lease) {
        // Relaxed, all: hints, as a grant's install writes them; the lease is not shared yet.
        lease
            .hot
            .view_full_at
            .store(self.full_at, Ordering::Relaxed);
        lease.hot.view_left.store(self.view_left, Ordering::Relaxed);
        lease.hot.view_at.store(self.view_at, Ordering::Relaxed);
        lease.retry_at.store(self.retry_at, Ordering::Relaxed);
        lease.bg.get_mut().not_before = self.not_before;
    }
}

/// A new lease for a key this node holds none of, with `allowance` provisional units (0 while
/// Redis does not answer: the failure policy decides then), or, if a retired lease of the key
/// left something `owed` that still holds, none and that lease's hints.
pub(super) fn first_lease(
    terms: &Terms,
    key: &[u8],
    allowance: u64,
    owed: Option<Owed>,
    now: Nanos,
) -> Lease {
    let mut lease = Lease::new(key);
    if let Some(owed) = owed.filter(|owed| owed.live(now)) {
        owed.restore(&mut lease);
        return lease;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::lease::word::{deadline_of, units_of, MS};
    use crate::redis::RedisRule;
    use crate::Quota;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// A GCRA first-touch lease lasts as a grant of its units from a full bucket would: one
    /// interval a unit, one more, and the horizon. None is made while Redis does not answer.
    #[test]
    fn a_first_lease_lasts_as_a_grant_of_its_units_would() {
        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        let lease = first_lease(&gcra, b"k", 5, None, 10 * MS);
        let word = lease.hot.word.load();
        assert_eq!(units_of(word), 5);
        assert_eq!(deadline_of(word), now_ms(10 * MS + 6 * MS + 50 * MS));
        assert_eq!(lease.bg.lock().provisional, 5);
        let none = first_lease(&gcra, b"k", 0, None, 10 * MS);
        assert_eq!((none.hot.word.load(), none.bg.lock().provisional), (0, 0));

        // A window's units are void a thousandth before its end, by the wall clock (an hour's
        // window: a thousandth of what is left of it is seconds).
        let hour = 3_600_000 * MS;
        let fixed = Terms::of(
            RedisRule::fixed_window(Quota::new(1, Duration::from_secs(3_600)).unwrap()).unwrap(),
        );
        let before = wall_nanos() / hour;
        let lease = first_lease(&fixed, b"k", 5, None, 10 * MS);
        let after = wall_nanos() / hour;
        let bg = lease.bg.lock();
        assert!((before..=after).contains(&bg.provisional_window));
        assert_eq!(bg.provisional_window, bg.provisional_at / hour);
        let left = hour - bg.provisional_at % hour;
        let deadline = now_ms(10 * MS + left - left / 1024);
        assert_eq!(deadline_of(lease.hot.word.load()), deadline);
    }

    /// A lease retired before its key's state was full again leaves what it knew: a new lease
    /// of the key starts from it, with no allowance, while the state is not expected full;
    /// after that, or for a lease whose key was full, a new lease gets the allowance.
    #[test]
    fn a_retired_lease_of_a_key_not_full_again_leaves_no_allowance_behind() {
        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        let lease = Lease::new(b"k");
        lease.hot.view_left.store(3, Ordering::Relaxed);
        lease.hot.view_at.store(5 * MS, Ordering::Relaxed);
        lease.hot.view_full_at.store(100 * MS, Ordering::Relaxed);
        lease.retry_at.store(50 * MS, Ordering::Relaxed);
        lease.bg.lock().not_before = 40 * MS;
        let owed = Owed::of(&lease, 10 * MS).expect("not full before 100 ms");
        assert_eq!(Owed::of(&lease, 100 * MS), None, "full by then");
        assert!(owed.live(99 * MS) && !owed.live(100 * MS));

        let next = first_lease(&gcra, b"k", 5, Some(owed), 20 * MS);
        assert_eq!(units_of(next.hot.word.load()), 0, "no allowance");
        assert_eq!(next.bg.lock().provisional, 0);
        assert_eq!(next.retry_at.load(Ordering::Relaxed), 50 * MS);
        assert_eq!(next.bg.lock().not_before, 40 * MS);
        assert_eq!(next.hot.view_left.load(Ordering::Relaxed), 3);
        assert_eq!(next.hot.view_at.load(Ordering::Relaxed), 5 * MS);
        assert_eq!(next.hot.view_full_at.load(Ordering::Relaxed), 100 * MS);

        let later = first_lease(&gcra, b"k", 5, Some(owed), 100 * MS);
        assert_eq!(
            units_of(later.hot.word.load()),
            5,
            "full again: the allowance"
        );

        // A key full at its last grant (`view_full_at` 0) owes nothing.
        assert_eq!(Owed::of(&Lease::new(b"k"), 10 * MS), None);
    }

    /// A grant covers the first-touch units it can: those spent beyond it are charged, those
    /// never spent are taken back; a grant of a later window covers none, and the charge
    /// then names when they were spent.
    #[test]
    fn a_grant_covers_the_first_touch_units_and_the_rest_are_charged_or_taken_back() {
        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        let decay = gcra.decay();
        // 5 provisional units, 2 spent: a grant of 8 covers all 5, 3 of it are new.
        let stats = Counters::default();
        let lease = first_lease(&gcra, b"k", 5, None, 0);
        assert_eq!(lease.hot.word.take(2, 0, decay), Some(3));
        let covered = cover(&gcra, &lease, &mut lease.bg.lock(), 8, None, &stats);
        assert_eq!(covered, (3, None));
        assert_eq!(units_of(lease.hot.word.load()), 3, "the covered units stay");
        assert_eq!(lease.bg.lock().provisional, 0);
        assert_eq!(stats.provisional.load(Ordering::Relaxed), 2, "spent");
        assert_eq!(
            cover(&gcra, &lease, &mut lease.bg.lock(), 4, None, &stats),
            (4, None)
        );

        // A grant of 1: of the 2 spent, 1 is charged now; the 3 unspent are taken back.
        let stats = Counters::default();
        let lease = first_lease(&gcra, b"k", 5, None, 0);
        lease.hot.word.take(2, 0, decay);
        let covered = cover(&gcra, &lease, &mut lease.bg.lock(), 1, None, &stats);
        assert_eq!(covered, (0, Some((UnitOp::Charge { at: None }, 1))));
        assert_eq!(units_of(lease.hot.word.load()), 0);
        assert_eq!(stats.overdrawn.load(Ordering::Relaxed), 1);

        // A window: a grant decided in the units' window covers them; one of a later window
        // covers none, and the 2 spent are charged at the time they were spent.
        let fixed = Terms::thousand_a_second(RedisRule::fixed_window);
        let window = 1_000 * MS;
        for later in [false, true] {
            let stats = Counters::default();
            let lease = first_lease(&fixed, b"k", 5, None, 0);
            lease.hot.word.take(2, 0, 0);
            let mut bg = lease.bg.lock();
            let start = (bg.provisional_window + u64::from(later)) * window;
            let at = bg.provisional_at;
            let covered = cover(&fixed, &lease, &mut bg, 8, Some(start), &stats);
            if later {
                let charge = (UnitOp::Charge { at: Some(at) }, 2);
                assert_eq!(covered, (8, Some(charge)));
                assert_eq!(bg.window_start, None);
                assert_eq!(units_of(lease.hot.word.load()), 0);
            } else {
                assert_eq!(covered, (3, None));
                assert_eq!(bg.window_start, Some(start));
                assert_eq!(units_of(lease.hot.word.load()), 3);
            }
        }
    }
}
