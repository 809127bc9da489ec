use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};

/// One packed 64-bit state, changed only by [`AtomicWord::update`]'s CAS loop.
///
/// 0 is a fresh key for every rule that uses it.
#[derive(Debug, Default)]
pub struct AtomicWord(AtomicU64);

impl AtomicWord {
    /// A cell holding `state`.
    pub fn new(state: u64) -> Self {
        AtomicWord(AtomicU64::new(state))
    }

    /// The current state.
    #[inline]
    pub fn load(&self) -> u64 {
        // Acquire: pairs with the Release of `update`'s CAS, so that a thread that sees a state
        // also sees every clock reading that happened before it was written (the limiter's
        // clamp for non-monotonic clocks lives in another atomic).
        self.0.load(Ordering::Acquire)
    }

    /// Runs `rule(state, now)` and stores its next state, retrying on conflict.
    ///
    /// The clock is read *after* the state is loaded, on every attempt: a state written by
    /// another thread was computed from a reading taken before that write, so with a monotonic
    /// clock the state is never newer than the time it is judged at. `rule` may run several
    /// times and must be pure. When it returns the state unchanged nothing is written.
    #[inline]
    pub fn update<R>(
        &self,
        now: impl Fn() -> Nanos,
        mut rule: impl FnMut(u64, Nanos) -> (R, u64),
    ) -> R {
        let mut state = self.load();
        loop {
            let (result, next) = rule(state, now());
            if next == state {
                return result;
            }
            // AcqRel on success: Release publishes the state with the reading it came from (see
            // `load`); Acquire keeps the same guarantee for the value we replaced.
            // Acquire on failure: we judge the value we just saw, as `load` does.
            match self
                .0
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return result,
                Err(seen) => {
                    state = seen;
                    crate::sync::spin_loop();
                }
            }
        }
    }
}
