use crate::algorithm::sliding_log::Ring;
use crate::clock::Nanos;
use crate::sync::Mutex;

/// A sliding log's ring buffer behind its own lock.
///
/// The log is the one state that does not fit a word: an admission appends up to `c` slots and
/// a check reads one, and no lock-free scheme keeps that exact with 4-byte slots (a slot written
/// late by a preempted thread would make a live entry look expired). The lock is per key, held
/// for O(c + expired entries) work, and the clock is read while it is held, so entries are
/// appended in time order.
#[derive(Debug, Default)]
pub struct LogCell(Mutex<Ring>);

impl LogCell {
    /// Runs `f` on the ring with the time read under the lock.
    pub fn with<R>(&self, now: impl Fn() -> Nanos, f: impl FnOnce(&mut Ring, Nanos) -> R) -> R {
        let mut ring = self.0.lock();
        let t = now();
        f(&mut ring, t)
    }
}
