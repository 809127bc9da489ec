//! `keyed_algos`: every tollgate algorithm per key at 100k uniformly random `u64` keys, one
//! thread, the precise (quanta) clock, GCRA as the baseline.
//!
//! Allowed rows (every timed check admitted):
//! - `gcra`, `leaky_queue`: 10^6/s, burst / capacity 10^9, each key charged 600 s of debt first
//!   (as in `keyed_gcra`; a leaky-queue admission then carries a delay, its normal path);
//! - `fixed_window`: 10^7 per hour; `sliding_window`: 10^6 per hour (near each state's maximum);
//! - `sliding_log`: L = 64 per W = 100 ms. At 100k keys a key comes round every 100k checks
//!   (20–40 ms at 200–400 ns a check), so its log holds a few live entries (Poisson, mean
//!   W / that period, about 2.5–5): a check typically prunes one expired entry and appends one,
//!   and the log mostly stays within the 6 entries a key's cell holds; a longer one moves to a
//!   heap ring, and back into the cell once it holds 3.
//!
//! Deny rows (`*_deny`): one per hour, spent before timing (`sliding_log_deny`: 64 per hour,
//! the log filled with 64 entries).

use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use tollgate::Algorithm;
use tollgate::{FixedWindow, Gcra, KeyedLimiter, LeakyQueue, Quota, SlidingLog, SlidingWindow};

use crate::common::{self, case, Driver, Keys};

const LABEL: &str = "100k";
const KEYS: usize = 100_000;

/// A keyed limiter on the precise clock holding every key, each charged `warm` units. Repeats
/// the warm-up pass until every key is held (a sweep during the first pass may evict keys
/// whose short window has already passed).
fn build<A: Algorithm>(rule: A, keys: &Keys, warm: u64) -> KeyedLimiter<u64, A> {
    let limiter = KeyedLimiter::<u64, A>::new(rule);
    for _pass in 0..4 {
        for key in &keys.keys {
            let decision = limiter
                .check_n(key, warm)
                .expect("no key bound, cost ≤ capacity");
            assert!(decision.allowed(), "warm-up is admitted");
        }
        if limiter.len() == keys.len() {
            return limiter;
        }
    }
    panic!(
        "{} keys held after warm-up, {} expected",
        limiter.len(),
        keys.len()
    );
}

fn run<A: Algorithm>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    keys: &Keys,
    rule: A,
    warm: u64,
    allowed: bool,
) {
    case(
        group,
        BenchmarkId::new(name, LABEL),
        Driver::One,
        keys,
        || build(rule, keys, warm),
        |limiter, key| common::admitted(limiter.check(&key)),
        |limiter| {
            assert_eq!(limiter.len(), keys.len(), "every key is still held");
            // A pass over the sequence at full speed, as timed: every check took the path the
            // row is named for (for the sliding log: its log never filled).
            let start = keys.advance(KEYS as u64);
            let admitted = (0..KEYS)
                .filter(|i| {
                    let key = keys.at(start.wrapping_add(*i));
                    limiter.check(&key).expect("no key bound").allowed()
                })
                .count();
            let expected = if allowed { KEYS } else { 0 };
            assert_eq!(
                admitted, expected,
                "{name}: the bench measured another path"
            );
        },
    );
}

fn quota(limit: u64, window: Duration) -> Quota {
    Quota::new(limit, window).expect("valid quota")
}

pub fn bench_all(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_algos");
    common::configure(&mut group);
    let keys = common::keys_for(KEYS);
    let hour = Duration::from_secs(3600);
    let warm = u64::from(common::WARM_COST);
    let bucket = Quota::per_second(u64::from(common::ALLOW_PER_SECOND))
        .and_then(|q| q.with_burst(u64::from(common::ALLOW_BURST)))
        .expect("valid quota");

    run(
        &mut group,
        "gcra",
        keys,
        Gcra::new(bucket).expect("valid"),
        warm,
        true,
    );
    run(
        &mut group,
        "leaky_queue",
        keys,
        LeakyQueue::new(bucket).expect("valid"),
        warm,
        true,
    );
    let fixed = FixedWindow::new(quota(10_000_000, hour)).expect("valid");
    run(&mut group, "fixed_window", keys, fixed, 1, true);
    let sliding = SlidingWindow::new(quota(1_000_000, hour)).expect("valid");
    run(&mut group, "sliding_window", keys, sliding, 1, true);
    let log = SlidingLog::new(quota(64, Duration::from_millis(100))).expect("valid");
    run(&mut group, "sliding_log", keys, log, 1, true);

    let one = quota(1, hour);
    run(
        &mut group,
        "gcra_deny",
        keys,
        Gcra::new(one).expect("valid"),
        1,
        false,
    );
    run(
        &mut group,
        "leaky_queue_deny",
        keys,
        LeakyQueue::new(one).expect("valid"),
        1,
        false,
    );
    run(
        &mut group,
        "fixed_window_deny",
        keys,
        FixedWindow::new(one).expect("valid"),
        1,
        false,
    );
    let sliding = SlidingWindow::new(one).expect("valid");
    run(&mut group, "sliding_window_deny", keys, sliding, 1, false);
    let log = SlidingLog::new(quota(64, hour)).expect("valid");
    run(&mut group, "sliding_log_deny", keys, log, 64, false);
    group.finish();
}
