//! Where per-key state lives: every atomic of the crate is in this module and in
//! [`crate::store`].
//!
//! - [`AtomicWord`]: one `u64` updated by a compare-and-swap loop around a pure rule.
//! - [`LogCell`]: the sliding log's ring buffer behind a per-key lock.
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
pub use self::log::LogCell;
pub use self::params::{ParamCell, Words, WORDS};
pub use self::word::{AtomicWord, Retired};
