//! The guarded limiter's circuit breaker: closed (Redis decides) until `threshold` transient
//! failures in a row open it (the failure policy decides), until a probe that Redis answers
//! closes it again.
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/breaker.rs`).
//!
//! Relaxed everywhere: the breaker is a mode flag that publishes no data. A check that reads
//! it a moment late decides one more request the old way; a failure counted as the breaker
//! closes may open it again, and the next probe closes it.

use crate::sync::{AtomicBool, AtomicU32, Ordering};

/// Whether Redis is considered reachable, and the transient failures in a row that say not.
#[derive(Debug)]
pub struct Breaker {
    open: AtomicBool,
    /// Transient failures in a row while closed.
    failures: AtomicU32,
    threshold: u32,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` (at least 1) failures in a row.
    pub fn new(threshold: u32) -> Self {
        Breaker {
            open: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            threshold: threshold.max(1),
        }
    }

    /// Whether the failure policy decides.
    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// A call that Redis answered: the failures in a row start again from 0.
    pub fn answered(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A transient failure; whether this call opened the breaker (one caller per opening:
    /// the `swap` elects it, for the one log line that reports it).
    pub fn failed(&self) -> bool {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        failures >= self.threshold && !self.open.swap(true, Ordering::Relaxed)
    }

    /// A probe that Redis answered: closes the breaker; whether this call closed it (one
    /// caller per closing).
    pub fn recovered(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.open.swap(false, Ordering::Relaxed)
    }
}
