//! The limiters of a traffic row, built as each library's users build them: shared by the
//! criterion group `traffic` (`limiters/traffic.rs`) and the latency bench (`latency.rs`,
//! which includes this file with `#[path]`). The rows themselves (quotas, keys, sequences)
//! are the `tollgate-traffic` dev crate's (`benches/traffic/`); this file adds governor, which
//! only the benches link.
//!
//! Subjects: `tollgate` (a `KeyedLimiter` on its default store; past the default
//! `evict_above`, also `tollgate_fixed`: the same with that bound fixed), `governor` (a keyed
//! `RateLimiter` on its default `DashMap` store, never trimmed) and `governor_retain` (the
//! same with `retain_recent()` every [`RETAIN_EVERY`] on a background thread, which is how
//! servers bound governor's memory). Every subject is primed alike (`Regime::prime_cost`).

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use governor::clock::Clock as GovernorClock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::RateLimiter;
use tollgate::clock::Clock;
use tollgate::{Gcra, KeyedLimiter};

use crate::regime::{self, Rate, Regime, Row, TrafficKey};

/// governor's keyed limiter with its default store and hasher.
pub type Governor<K, C> =
    RateLimiter<K, DashMapStateStore<K>, C, NoOpMiddleware<<C as GovernorClock>::Instant>>;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

/// The same quota in governor's terms: `per_second` cells a second, bursts of `burst`.
pub fn governor_quota(rate: Rate) -> governor::Quota {
    governor::Quota::per_second(nz(rate.per_second)).allow_burst(nz(rate.burst))
}

/// A tollgate keyed limiter for `row` on `clock`, every key of `keys` primed.
pub fn tollgate<K: TrafficKey, C: Clock>(
    row: &Row,
    clock: C,
    keys: &[K],
) -> KeyedLimiter<K, Gcra, C> {
    tollgate_bounded(row, clock, keys, None)
}

/// [`tollgate`] with `evict_above` set to its default value: a fixed bound, which no
/// working set of returning keys raises (as every bound was before the default one followed
/// them). The `tollgate_fixed` subject of the traffic matrix's rows past the default bound.
#[allow(dead_code)] // not a subject of the latency bench, which includes this file
pub fn tollgate_fixed<K: TrafficKey, C: Clock>(
    row: &Row,
    clock: C,
    keys: &[K],
) -> KeyedLimiter<K, Gcra, C> {
    let bound = tollgate::store::DEFAULT_EVICT_ABOVE;
    tollgate_bounded(row, clock, keys, Some(bound))
}

fn tollgate_bounded<K: TrafficKey, C: Clock>(
    row: &Row,
    clock: C,
    keys: &[K],
    evict_above: Option<usize>,
) -> KeyedLimiter<K, Gcra, C> {
    let builder = KeyedLimiter::<K, Gcra>::builder(row.rate().gcra()).clock(clock);
    let builder = match evict_above {
        Some(keys) => builder.evict_above(keys),
        None => builder,
    };
    let limiter = builder.build().expect("the clock suits the regime's quota");
    regime::prime(keys, row.regime.prime_cost(), |key, cost| {
        let decision = limiter
            .check_n(key.lookup(), u64::from(cost))
            .expect("no key bound, cost ≤ burst");
        assert!(decision.allowed(), "a key's first check is admitted");
    });
    if row.regime == Regime::Warm {
        // The warm-keys trick holds only if no key was swept while priming.
        assert_eq!(limiter.len(), keys.len(), "no key was swept while priming");
    }
    limiter
}

/// What a server reads from a tollgate check: the verdict (as `common::admitted`).
#[inline(always)]
pub fn tollgate_check<K: TrafficKey, C: Clock>(
    limiter: &KeyedLimiter<K, Gcra, C>,
    key: &K,
) -> bool {
    limiter.check(key.lookup()).is_ok_and(|d| d.allowed())
}

/// A governor keyed limiter for `row` on `clock`, every key of `keys` primed.
pub fn governor<K: TrafficKey, C: GovernorClock>(
    row: &Row,
    clock: C,
    keys: &[K],
) -> Governor<K, C> {
    let limiter = RateLimiter::dashmap_with_clock(governor_quota(row.rate()), clock);
    regime::prime(keys, row.regime.prime_cost(), |key, cost| {
        let decision = limiter.check_key_n(key, nz(cost)).expect("cost ≤ burst");
        assert!(decision.is_ok(), "a key's first check is admitted");
    });
    limiter
}

/// How often `governor_retain` trims its map: every 100 ms, as a server's maintenance task
/// would (governor's documentation leaves the period to its users; shorter trims more often
/// under the map's shard write locks, longer lets the map grow further).
pub const RETAIN_EVERY: Duration = Duration::from_millis(100);

/// governor with a background thread calling `retain_recent()` every [`RETAIN_EVERY`]; the
/// thread stops when this drops.
pub struct Retained<K: TrafficKey, C: GovernorClock> {
    pub limiter: Arc<Governor<K, C>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<K: TrafficKey, C: GovernorClock + Send + Sync + 'static> Retained<K, C> {
    pub fn new(limiter: Governor<K, C>) -> Self {
        let limiter = Arc::new(limiter);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("governor-retain".into())
                .spawn(move || {
                    let mut due = Instant::now() + RETAIN_EVERY;
                    // Relaxed: a stop flag; `Drop` unparks this thread after setting it.
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if now >= due {
                            limiter.retain_recent();
                            due += RETAIN_EVERY;
                        } else {
                            std::thread::park_timeout(due - now);
                        }
                    }
                })
                .expect("spawning the retain thread")
        };
        Retained {
            limiter,
            stop,
            thread: Some(thread),
        }
    }
}

impl<K: TrafficKey, C: GovernorClock> Drop for Retained<K, C> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            thread.join().expect("the retain thread ends");
        }
    }
}

/// A governor check read the way a server reads it.
#[inline(always)]
pub fn governor_check<K: TrafficKey, C: GovernorClock>(limiter: &Governor<K, C>, key: &K) -> bool {
    limiter.check_key(key).is_ok()
}
