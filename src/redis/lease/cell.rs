//! A key's lease on this node: the word checks spend from, the hints they read, and the
//! background bookkeeping that only refills, returns and the sweeper touch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::refill::Refill;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::word::{pack, usable, LeaseWord};
use crate::clock::Nanos;
use crate::redis::error::TierError;

/// One key's lease on this node.
pub(super) struct Lease {
    /// What a check touches, on one cache line of its own.
    pub hot: CachePadded<Hot>,
    /// Whether a refill is queued or in flight (at most one per key), or the lease retired.
    pub refill: Refill,
    /// The largest cost a check could not take from the lease since the last grant.
    pub need: AtomicU64,
    /// Until when (limiter clock, ns) the global state is expected to grant nothing: the
    /// `retry_after` of a denial.
    pub retry_at: AtomicU64,
    /// A fatal error from the last refill, returned by checks the lease cannot serve.
    error: Mutex<Option<TierError>>,
    failed: AtomicBool,
    /// Whether the last refill failed in a transient way while the breaker may still be
    /// closed: checks the lease cannot serve are decided by the failure policy, as a guarded
    /// check whose call failed is, until a refill succeeds (see `Node::finish`).
    unreachable: AtomicBool,
    /// The refill and sweeper's bookkeeping (never touched by a check).
    pub bg: Mutex<Bg>,
    pub refilled: tokio::sync::Notify,
    pub key: Box<[u8]>,
}

/// The part of a lease a check reads: written by checks (the word) and by grants.
#[derive(Default)]
pub(super) struct Hot {
    /// The only state a check changes (see `word.rs`).
    pub word: LeaseWord,
    /// A check that leaves fewer units than this asks for a refill.
    pub low_water: AtomicU64,
    /// GCRA: a check that finds the lease with less than this left to live (ns) asks for a
    /// refill (two of the slowest recent refills, a quarter of the horizon at least), so the
    /// next grant arrives before the word's units decay. 0 for windows.
    pub lead: AtomicU64,
    /// The global state as the last grant saw it, for the figures of decisions: what it could
    /// still grant (units held in leases count as spent), when (limiter clock, ns) that grant
    /// was installed, and when the state would be back to full capacity (limiter clock, ns;
    /// 0 = already full).
    pub view_left: AtomicU64,
    pub view_at: AtomicU64,
    pub view_full_at: AtomicU64,
}

impl Hot {
    /// Whether a check that left `left` units at `now` asks for a refill: fewer than the
    /// low-water mark, or less than the lead time left to live. Both hints are 0 while a
    /// grant is parked: the word's rest runs out first.
    #[inline]
    pub fn low(&self, left: u64, now: Nanos) -> bool {
        // Relaxed, both: hints; a stale value only moves a refill by one check.
        left < self.low_water.load(Ordering::Relaxed) || {
            let lead = self.lead.load(Ordering::Relaxed);
            lead > 0 && self.word.time_left(now) < lead
        }
    }
}

/// A lease's background bookkeeping, under its mutex.
#[derive(Default)]
pub(super) struct Bg {
    /// When the last grant was installed, and the units the lease held right after it.
    pub installed_at: Nanos,
    pub level_after: u64,
    /// Units per ns, smoothed.
    pub rate: f64,
    /// The slowest recent refill, ns from asking to installing.
    pub slowest: Nanos,
    pub target: u64,
    /// The server time (ns since the epoch) the window of the current lease starts at, and
    /// the server time of its last grant (for returns).
    pub window_start: Option<u64>,
    pub grant_time: u64,
    /// When (limiter clock) that window is surely over.
    pub window_over: Nanos,
    /// No grant request before this time (limiter clock, ns).
    pub not_before: Nanos,
    /// First touch: units put in the word before any grant (0 once the first grant or its
    /// failure settled them), the wall time (ns since the epoch) they were put there, and
    /// the window index (wall time ÷ W) they belong to.
    pub provisional: u64,
    pub provisional_at: u64,
    pub provisional_window: u64,
    /// GCRA: a grant that arrived while the word held live units of an earlier one, with its
    /// deadline (ms of the limiter's clock). It takes the word over once those are spent or
    /// expired ([`Lease::unpark`]): one deadline per word, and no unit outlives its own.
    pub parked: Option<(u64, u32)>,
    /// GCRA: the bucket's TAT right after the grant whose units the lease would give back
    /// (the parked one if any, else the word's; server ns since the epoch), or 0 when those
    /// are mixed with another grant's. See [`UnitOp::Return`](crate::redis::exact::UnitOp).
    pub grant_end: u64,
    /// The low-water mark and lead of the last grant (the hints in [`Hot`] are 0 while one
    /// is parked).
    pub low_water: u64,
    pub lead: u64,
    /// The sweeper's view: the word at its last pass, and since when it has not changed.
    pub last_word: u64,
    pub still_since: Nanos,
}

impl Bg {
    /// The units of the parked grant still usable at `now`.
    pub fn parked_units(&self, now: Nanos, decay: u64) -> u64 {
        self.parked.map_or(0, |(units, deadline)| {
            usable(pack(units, deadline), now, decay)
        })
    }
}

impl Lease {
    pub fn new(key: &[u8]) -> Lease {
        Lease {
            hot: CachePadded::new(Hot::default()),
            refill: Refill::default(),
            need: AtomicU64::new(0),
            retry_at: AtomicU64::new(0),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
            bg: Mutex::new(Bg::default()),
            refilled: tokio::sync::Notify::new(),
            key: key.into(),
        }
    }

    /// Puts a parked GCRA grant in the word, if it is still live, in place of what is left
    /// there (spent below a check's cost, or expired: those units are void). Whether it did.
    pub fn unpark(&self, now: Nanos, decay: u64) -> bool {
        let mut bg = self.bg.lock();
        if bg.parked_units(now, decay) == 0 {
            bg.parked = None;
            return false;
        }
        match bg.parked.take() {
            Some((units, deadline)) => {
                self.hot.word.replace(units, deadline);
                // Relaxed, both: self-contained hints; no other memory is published through
                // them.
                self.hot.low_water.store(bg.low_water, Ordering::Relaxed);
                self.hot.lead.store(bg.lead, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The fatal error the last refill met, if it did.
    pub fn fatal(&self) -> Option<TierError> {
        // Relaxed: the error itself is read under its mutex.
        if self.failed.load(Ordering::Relaxed) {
            self.error.lock().clone()
        } else {
            None
        }
    }

    /// Whether checks the lease cannot serve go to the failure policy (its last refill failed
    /// in a transient way).
    pub fn unreachable(&self) -> bool {
        // Acquire: pairs with the Release in `set_unreachable`, so a check that sees the flag
        // also sees the policy's state of the key that was started before it.
        self.unreachable.load(Ordering::Acquire)
    }

    /// Sets whether the last refill failed in a transient way.
    pub fn set_unreachable(&self, unreachable: bool) {
        // Release: publishes the policy's state of the key started before (see above).
        self.unreachable.store(unreachable, Ordering::Release);
    }

    /// Records the outcome of a refill: `Some` fatal error, or `None` (it succeeded).
    pub fn set_fatal(&self, error: Option<TierError>) {
        let failed = error.is_some();
        *self.error.lock() = error;
        // Relaxed: the error itself is under its mutex.
        self.failed.store(failed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::lease::word::MS;

    /// A check asks for a refill when it leaves fewer units than the low-water mark, or when
    /// the lease has less than the lead time left to live, whichever comes first.
    #[test]
    fn a_check_asks_for_a_refill_below_the_low_water_mark_or_near_the_deadline() {
        let mut lease = Lease::new(b"k");
        // 100 units until 1 s.
        lease.hot.word = LeaseWord::new(100, 1_000);
        lease.hot.low_water.store(10, Ordering::Relaxed);
        lease.hot.lead.store(50 * MS, Ordering::Relaxed);
        assert!(!lease.hot.low(20, 0));
        assert!(
            lease.hot.low(9, 0),
            "below the low-water mark, the deadline far"
        );
        assert!(
            lease.hot.low(20, 960 * MS),
            "less than the lead left to live"
        );
        // Windows (and a parked grant): no lead.
        lease.hot.lead.store(0, Ordering::Relaxed);
        assert!(!lease.hot.low(20, 960 * MS));
    }
}
