//! The window counters' index horizon: a state keeps its window index in 23 bits (sliding
//! counter) or 40 bits (fixed window), and a limiter re-anchors those indices as time goes on,
//! so that decisions stay exact however long a key sits idle and however far the clock jumps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Algorithm, FixedWindow, KeyedLimiter, Limiter, Quota, SlidingWindow};

const MS: u64 = 1_000_000;

fn sliding(limit: u64) -> SlidingWindow {
    SlidingWindow::new(Quota::new(limit, Duration::from_millis(1)).unwrap()).unwrap()
}

fn fixed(limit: u64) -> FixedWindow {
    FixedWindow::new(Quota::new(limit, Duration::from_millis(1)).unwrap()).unwrap()
}

/// Checks `key` at each time (ms) in turn; what each check got.
fn keyed_trace<A: Algorithm>(rule: A, times_ms: &[u64]) -> Vec<bool> {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u8, A, _>::with_clock(rule, clock.clone()).unwrap();
    times_ms
        .iter()
        .map(|&t| {
            clock.set(t * MS);
            limiter.check(&1).unwrap().allowed()
        })
        .collect()
}

fn direct_trace<A: Algorithm>(rule: A, times_ms: &[u64]) -> Vec<bool> {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(rule, clock.clone()).unwrap();
    times_ms
        .iter()
        .map(|&t| {
            clock.set(t * MS);
            limiter.check().allowed()
        })
        .collect()
}

#[test]
fn a_key_idle_for_a_multiple_of_the_index_range_is_fresh() {
    // 2^23 windows of 1 ms: the sliding counter's stored index is the same as at t = 0.
    let wrap = 1 << 23;
    for times in [
        vec![0, wrap, wrap + 2],
        vec![5, 5 + wrap, 5 + 3 * wrap],
        vec![0, wrap - 3, 2 * wrap - 3, 2 * wrap - 1],
    ] {
        // Every check is at least two windows after the one before: each finds a fresh key.
        let want = vec![true; times.len()];
        assert_eq!(keyed_trace(sliding(1), &times), want, "keyed {times:?}");
        assert_eq!(direct_trace(sliding(1), &times), want, "direct {times:?}");
    }
    // The fixed window's 40-bit index: 2^40 ms is 35 years.
    let times = [0, 1 << 40, (1 << 40) + 1, 3 << 40, 5 << 40];
    assert_eq!(keyed_trace(fixed(1), &times), [true; 5]);
    assert_eq!(direct_trace(fixed(1), &times), [true; 5]);
}

#[test]
fn a_full_window_stays_full_across_a_re_anchoring() {
    // Checks every 2^20 windows: the limiter re-anchors (every 2^22 − 2) between some of them, and a
    // window filled just before a check is still full just after it.
    let mut times = vec![];
    for k in 0..40u64 {
        let t = k << 20;
        times.extend([t, t, t + 1]);
    }
    let got = keyed_trace(fixed(1), &times);
    let want: Vec<bool> = (0..40).flat_map(|_| [true, false, true]).collect();
    assert_eq!(got, want);
    let got = direct_trace(sliding(1), &times);
    // Sliding, L = 1: the unit at t weighs (W − e)/W in the next window: at t + 1 (e = 0) it
    // still weighs fully.
    let want: Vec<bool> = (0..40).flat_map(|_| [true, false, false]).collect();
    assert_eq!(got, want);
}

#[test]
fn a_fresh_key_just_below_the_index_range_starts_in_its_own_window() {
    // A fresh state (0) carries index 0, which within 16 windows below 2^23 once read as a
    // window *ahead*: the key then counted in a window that had not begun.
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u8, _, _>::with_clock(sliding(2), clock.clone()).unwrap();
    clock.set(((1 << 23) - 5) * MS + MS / 2);
    let d = limiter.check(&1).unwrap();
    assert!(d.allowed());
    // Counted in the current window: back to full at the end of the next one (1.5 ms).
    assert_eq!(d.reset_after_nanos(), MS + MS / 2);
}

/// Two threads check one key while a third moves the clock by about 2^21 windows (a
/// re-anchoring every other round: the period is 2^22 − 2) between rounds: every round is a new window far from the last, so
/// exactly `L` checks are admitted in each, never more, with the sweep and the rebase racing
/// the checks.
#[test]
fn concurrent_checks_across_re_anchorings_admit_exactly_the_limit() {
    const LIMIT: u64 = 10;
    const ROUNDS: u64 = 40;
    fn run<A: Algorithm>(rule: A) {
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::<u8, A, _>::with_clock(rule, clock.clone()).unwrap();
        let barrier = Barrier::new(2);
        let admitted: Vec<AtomicU64> = (0..ROUNDS).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for thread in 0..2u64 {
                let (limiter, barrier, admitted, clock) = (&limiter, &barrier, &admitted, &clock);
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        if thread == 0 {
                            clock.set((round * ((1 << 21) + 7) + 3) * MS);
                        }
                        barrier.wait();
                        for _ in 0..25 {
                            if limiter.check(&(round as u8 % 3)).unwrap().allowed() {
                                admitted[round as usize].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        barrier.wait();
                    }
                });
            }
        });
        for (round, n) in admitted.iter().enumerate() {
            assert_eq!(n.load(Ordering::Relaxed), LIMIT, "round {round}");
        }
    }
    run(fixed(LIMIT));
    run(sliding(LIMIT));
}

/// `String` keys of every length the table keeps apart (inline in its own slots, in a wider
/// table, on the heap) decide across re-anchorings as a `u8` key does: each of the tables
/// carries its states into the new era.
#[test]
fn text_keys_of_every_length_keep_their_windows_across_re_anchorings() {
    // Checks in the windows around each re-anchoring (every 2^22 − 2 windows), twice each.
    let mut times = vec![];
    for m in 1..=3u64 {
        let at = m * ((1 << 22) - 2);
        times.extend((at - 3..at + 3).flat_map(|t| [t, t]));
    }
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<String, _, _>::with_clock(sliding(1), clock.clone()).unwrap();
    let keys = [10, 36, 60, 100].map(|n| "k".repeat(n));
    let mut got = vec![vec![]; keys.len()];
    for &t in &times {
        clock.set(t * MS);
        for (key, got) in keys.iter().zip(&mut got) {
            got.push(limiter.check(key.as_str()).unwrap().allowed());
        }
    }
    let want = keyed_trace(sliding(1), &times);
    assert!(want.contains(&false));
    for (key, got) in keys.iter().zip(got) {
        assert_eq!(got, want, "a key of {} bytes", key.len());
    }
}
