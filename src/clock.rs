//! Time sources. Every limiter reads time as nanoseconds since its own origin.
//!
//! | clock | cost per read | resolution | use it when |
//! |---|---|---|---|
//! | [`QuantaClock`] (default) | one TSC read (~10–20 ns) | ~1 ns | always correct |
//! | [`CoarseClock`] | one relaxed load (~1 ns) | its tick (default 1 ms) | the tick is far below the quota's emission interval or window |
//! | [`ManualClock`] | one load | 1 ns | tests and trace replay |
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, ManualClock, QuantaClock};
//! let precise = QuantaClock::new();
//! let (a, b) = (precise.now(), precise.now());
//! assert!(b >= a); // nanoseconds since the clock's origin, never backwards
//! let manual = ManualClock::new();
//! manual.advance(Duration::from_secs(2));
//! assert_eq!(manual.now(), 2_000_000_000);
//! ```

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
