//! Where per-key state lives: every atomic of the crate is in this module and in
//! [`crate::store`].
//!
//! - [`AtomicWord`]: one `u64` updated by a compare-and-swap loop around a pure rule.
//! - [`LogCell`]: the sliding log's ring buffer, updated by a CAS on its 128-bit header.
//! - [`ParamCell`]: the limiter's quota, replaceable at run time without a lock on the read path.
//! - [`HighWater`]: the clamp that keeps a non-monotonic clock from going back.

// Explicit paths: see `algorithm.rs` (the same file is compiled by `loom-tests`).
#[path = "state/high_water.rs"]
mod high_water;
#[path = "state/log.rs"]
mod log;
#[path = "state/params.rs"]
mod params;
#[path = "state/word.rs"]
mod word;

pub use self::high_water::HighWater;
pub use self::log::{LogCell, LogState};
pub use self::params::ParamCell;
pub use self::word::{AtomicWord, Retired};

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn module_example() -> Result<(), Box<dyn std::error::Error>> {
        use crate::{
            algorithm::WordRule,
            state::{AtomicWord, HighWater},
            Gcra, Quota,
        };
        // What a limiter does on each check of a word rule: clamp the reading, CAS the state.
        let rule = Gcra::new(Quota::per_second(1)?)?;
        let (cell, newest) = (AtomicWord::default(), HighWater::new());
        let d = cell.update(
            || newest.clamp(1_000),
            |state, now| rule.decide(state, now, 1),
        );
        assert!(d.allowed());
        Ok(())
    }
}
