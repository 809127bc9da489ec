//! Limiters: a clock, a quota and a store of states, wired together.
//!
//! - [`Limiter`]: one state (a whole service, one connection, one tenant known up front).
//! - [`KeyedLimiter`]: one state per key, in a sharded concurrent map, with automatic eviction
//!   of keys that have become indistinguishable from fresh ones and an optional `max_keys`.

mod direct;
mod keyed;

pub use self::direct::Limiter;
pub use self::keyed::{KeyedLimiter, KeyedLimiterBuilder, OverflowPolicy};

use crate::algorithm::Algorithm;
use crate::clock::{Clock, Nanos};
use crate::quota::QuotaError;
use crate::state::{HighWater, ParamCell};
use crate::sync::Mutex;

/// A clock must resolve at least this many steps per emission interval or window.
const MIN_TICKS_PER_PERIOD: u64 = 10;

/// What every limiter shares: its rule (replaceable at run time) and its clock.
#[derive(Debug)]
pub(crate) struct Core<A, C> {
    params: ParamCell<A>,
    clock: C,
    /// The newest reading seen, for clocks that do not promise monotonic readings.
    high_water: Option<HighWater>,
    /// Serialises `set_quota` (the parameter cell allows one writer at a time).
    writer: Mutex<()>,
}

impl<A: Algorithm, C: Clock> Core<A, C> {
    pub(crate) fn new(rule: A, clock: C) -> Result<Self, QuotaError> {
        check_resolution(&rule, &clock)?;
        let high_water = (!clock.is_monotonic()).then(HighWater::new);
        Ok(Core {
            params: ParamCell::new(rule.to_words()),
            clock,
            high_water,
            writer: Mutex::new(()),
        })
    }

    /// The current time, clamped so it never goes back (SPEC: time never goes backwards).
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        let reading = self.clock.now();
        // A constant for the crate's clocks, so the clamp's branch compiles away for them.
        if self.clock.is_monotonic() {
            return reading;
        }
        match &self.high_water {
            None => reading,
            Some(high) => high.clamp(reading),
        }
    }

    #[inline]
    pub(crate) fn rule(&self) -> A {
        A::from_words(self.params.load())
    }

    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    pub(crate) fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        check_resolution(&rule, &self.clock)?;
        let _writer = self.writer.lock();
        let next = rule.take_over(&self.rule(), self.now());
        self.params.store(next.to_words());
        Ok(())
    }
}

fn check_resolution<A: Algorithm, C: Clock>(rule: &A, clock: &C) -> Result<(), QuotaError> {
    let resolution_nanos = clock.resolution();
    let period_nanos = rule.period();
    // A 1 ns clock resolves every quota: time itself is counted in nanoseconds.
    if resolution_nanos > 1 && resolution_nanos.saturating_mul(MIN_TICKS_PER_PERIOD) > period_nanos
    {
        return Err(QuotaError::ClockTooCoarse {
            resolution_nanos,
            period_nanos,
        });
    }
    Ok(())
}

impl<A: Algorithm, C: Clock> Core<A, C> {
    /// Refuses a cost that can never be admitted (SPEC: an error, not a denial). The clock is
    /// still read, so that every call sees time the same way whatever its outcome.
    #[inline]
    pub(crate) fn check_cost(&self, rule: &A, cost: u64) -> Result<(), crate::Error> {
        let capacity = rule.capacity();
        if cost > capacity {
            self.now();
            Err(crate::Error::CapacityExceeded { cost, capacity })
        } else {
            Ok(())
        }
    }
}
