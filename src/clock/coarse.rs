use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use super::time::{Clock, Nanos};

/// The tick of the process-wide coarse time source.
pub const COARSE_TICK: Duration = Duration::from_millis(1);

/// Nanoseconds on the shared quanta time line, refreshed every [`COARSE_TICK`] by one thread.
static NOW: AtomicU64 = AtomicU64::new(0);
static UPKEEP: OnceLock<()> = OnceLock::new();

fn precise_raw_nanos() -> u64 {
    let clock = super::quanta::shared();
    clock.delta_as_nanos(0, clock.raw())
}

fn start_upkeep() {
    UPKEEP.get_or_init(|| {
        // Relaxed: NOW is a lone number; no other memory is published through it.
        NOW.fetch_max(precise_raw_nanos(), Ordering::Relaxed);
        std::thread::Builder::new()
            .name("tollgate-coarse-clock".into())
            .spawn(|| loop {
                std::thread::sleep(COARSE_TICK);
                // Relaxed: as above; fetch_max keeps the value monotonic.
                NOW.fetch_max(precise_raw_nanos(), Ordering::Relaxed);
            })
            .expect("spawning the coarse clock thread");
    });
}

/// A cheap clock: a reading is one relaxed load of a value that a background thread refreshes
/// every `COARSE_TICK` (1 ms).
///
/// Its resolution is the tick, so it is correct only for quotas whose bucket span `B·T` (GCRA,
/// leaky) or window is far longer than 1 ms: a 1 ms tick cannot enforce 100 000/s with a burst of
/// 1 (a span of 10 µs). Limiters refuse a clock whose tick exceeds a tenth of that span or window
/// ([`QuotaError::ClockTooCoarse`](crate::QuotaError::ClockTooCoarse)).
///
/// # Caveats
/// The first `CoarseClock::new()` in a process starts one thread named `tollgate-coarse-clock`
/// that lives as long as the process.
///
/// # Examples
/// ```
/// use tollgate::clock::{Clock, CoarseClock};
/// let clock = CoarseClock::new();
/// assert_eq!(clock.resolution(), 1_000_000);
/// let _ = clock.now();
/// ```
#[derive(Debug, Clone)]
pub struct CoarseClock {
    origin: u64,
}

impl CoarseClock {
    /// A coarse clock whose origin is now; starts the upkeep thread if none runs.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{clock::CoarseClock, Gcra, KeyedLimiter, Quota};
    /// // 10 a minute: a 1 ms tick is far below the 6 s between units, so reading it is safe.
    /// let limiter = KeyedLimiter::<u64, _>::builder(Gcra::new(Quota::per_minute(10)?)?)
    ///     .clock(CoarseClock::new())
    ///     .build()?;
    /// assert!(limiter.check(&1).unwrap().allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn new() -> Self {
        start_upkeep();
        CoarseClock {
            // Relaxed: see `start_upkeep`.
            origin: NOW.load(Ordering::Relaxed),
        }
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        // Relaxed: see `start_upkeep`; the value only ever grows.
        NOW.load(Ordering::Relaxed).saturating_sub(self.origin)
    }

    fn resolution(&self) -> Nanos {
        COARSE_TICK.as_nanos() as u64
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}
