use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};

/// The newest clock reading a limiter has seen, for clocks that do not promise monotonic
/// readings: the decision rules' "a reading older than the newest one seen is treated as the newest one".
#[derive(Debug, Default)]
pub struct HighWater(AtomicU64);

impl HighWater {
    /// No reading seen yet.
    pub fn new() -> Self {
        HighWater(AtomicU64::new(0))
    }

    /// The time `reading` stands for: the newest reading seen, this one included.
    #[inline]
    pub fn clamp(&self, reading: Nanos) -> Nanos {
        // Relaxed: the clamp needs only this location's modification order; a thread that sees
        // a state another thread wrote also sees that thread's update here, because states are
        // published with Release and loaded with Acquire (see `AtomicWord`).
        self.0.fetch_max(reading, Ordering::Relaxed).max(reading)
    }
}
