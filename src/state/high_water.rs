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

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn highwater_example() {
        use crate::state::HighWater;
        // Readings from two cores whose clocks disagree by a little.
        let newest = HighWater::new();
        let seen: Vec<u64> = [100, 250, 240, 300]
            .iter()
            .map(|&r| newest.clamp(r))
            .collect();
        assert_eq!(seen, [100, 250, 250, 300]); // never backwards
    }

    #[test]
    fn new_example() {
        use crate::state::HighWater;
        // Before any reading, the first one passes as it is.
        assert_eq!(HighWater::new().clamp(5), 5);
    }

    #[test]
    fn clamp_example() {
        use crate::state::HighWater;
        let newest = HighWater::new();
        assert_eq!(newest.clamp(1_000), 1_000);
        // A clock that stepped back is read as the newest time seen: time never goes backwards.
        assert_eq!(newest.clamp(900), 1_000);
        assert_eq!(newest.clamp(1_200), 1_200);
    }
}
