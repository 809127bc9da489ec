//! Time sources. Every limiter reads time as nanoseconds since its own origin.
//!
//! | clock | cost per read | resolution | use it when |
//! |---|---|---|---|
//! | [`QuantaClock`] (default) | one TSC read (~10–20 ns) | ~1 ns | always correct |
//! | [`CoarseClock`] | one relaxed load (~1 ns) | its tick (default 1 ms) | the tick is far below the quota's emission interval or window |
//! | [`ManualClock`] | one load | 1 ns | tests and trace replay |

mod coarse;
mod manual;
mod quanta;
// Explicit path: `loom-tests` includes `time.rs` on its own (see `algorithm.rs`).
#[path = "clock/time.rs"]
mod time;

pub use self::coarse::CoarseClock;
pub use self::manual::ManualClock;
pub use self::quanta::QuantaClock;
pub use self::time::{Clock, Nanos};
