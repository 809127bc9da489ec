//! A key's lease on this node: the word checks spend from, the hints they read, and the
//! background bookkeeping that only refills, returns and the sweeper touch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::refill::Refill;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::word::LeaseWord;
use crate::clock::Nanos;
use crate::redis::error::Error;

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
    error: Mutex<Option<Error>>,
    failed: AtomicBool,
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
    /// The global state as the last grant saw it, for the figures of decisions: what it could
    /// still grant (units held in leases count as spent), when (limiter clock, ns) that grant
    /// was installed, and when the state would be back to full capacity (limiter clock, ns;
    /// 0 = already full).
    pub view_left: AtomicU64,
    pub view_at: AtomicU64,
    pub view_full_at: AtomicU64,
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
    /// The sweeper's view: the word at its last pass, and since when it has not changed.
    pub last_word: u64,
    pub still_since: Nanos,
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
            bg: Mutex::new(Bg::default()),
            refilled: tokio::sync::Notify::new(),
            key: key.into(),
        }
    }

    /// The fatal error the last refill met, if it did.
    pub fn fatal(&self) -> Option<Error> {
        // Relaxed: the error itself is read under its mutex.
        if self.failed.load(Ordering::Relaxed) {
            self.error.lock().clone()
        } else {
            None
        }
    }

    /// Records the outcome of a refill: `Some` fatal error, or `None` (it succeeded).
    pub fn set_fatal(&self, error: Option<Error>) {
        let failed = error.is_some();
        *self.error.lock() = error;
        // Relaxed: the error itself is under its mutex.
        self.failed.store(failed, Ordering::Relaxed);
    }
}
