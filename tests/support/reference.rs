//! A reference model of SPEC.md, written straight from its formulas.
//!
//! Plain and slow on purpose: 128-bit integers, a `HashMap` of per-window counts, a `Vec` of
//! every admitted unit's time, no packing, no clever arithmetic. Tests (and the fuzz crate, which
//! includes this file with `#[path]`) compare every decision of the engine against it, figure by
//! figure. It depends on `std` only.
//!
//! What the model holds per key:
//! - GCRA, leaky bucket, leaky queue: the theoretical arrival time `TAT` (`None` = fresh key,
//!   which behaves as `TAT = t`).
//! - Fixed window and sliding window counter: units admitted per window index `k = t / W`.
//! - Sliding log: the time of every admitted unit, oldest first.
//!
//! Times are nanoseconds since the limiter's origin. Callers pass non-decreasing times to a
//! [`Model`]; [`Monotonic`] implements the SPEC's clamp for traces whose clock goes backwards.
//!
//! Refunds are not part of SPEC.md; [`Model::refund`] follows the engine's documented refund
//! rules (`Limiter::refund`) so that traces can interleave them.
//!
//! Include it with `#[path = ".../reference.rs"] #[allow(dead_code)] mod reference;`: a user
//! rarely needs every item.

use std::collections::HashMap;
use std::hash::Hash;

/// An algorithm of SPEC.md with its parameters (all durations in nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// §1 (and §2, which decides exactly as GCRA with `B = C`): `limit` per `window`, burst `B`.
    Gcra { limit: u64, window: u64, burst: u64 },
    /// §3: the leaky bucket as a queue, capacity `C`.
    LeakyQueue {
        limit: u64,
        window: u64,
        capacity: u64,
    },
    /// §4.
    FixedWindow { limit: u64, window: u64 },
    /// §5.
    SlidingWindow { limit: u64, window: u64 },
    /// §6. `tick` is the unit entry times are rounded *up* to before they are stored: 1 is the
    /// SPEC's exact log; the engine's `SlidingLog::tick_nanos()` models its storage (with request
    /// times that are multiples of the tick both are the same).
    SlidingLog { limit: u64, window: u64, tick: u64 },
}

/// The figures of one decision (SPEC "Result of a decision").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after: u128,
    pub reset_after: u128,
    pub delay: u128,
}

/// A request that can never be admitted (SPEC: an error, not a denial; changes nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefError {
    CapacityExceeded { cost: u64, capacity: u64 },
}

/// One key's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    /// GCRA / leaky: the theoretical arrival time; `None` for a fresh key.
    pub tat: Option<u128>,
    /// Window counters: units admitted in window `k`.
    pub counts: HashMap<u128, u128>,
    /// Sliding log: the (rounded) time of every admitted unit, oldest first.
    pub log: Vec<u128>,
}

impl Algo {
    /// `L`.
    pub fn limit(&self) -> u64 {
        match *self {
            Algo::Gcra { limit, .. }
            | Algo::LeakyQueue { limit, .. }
            | Algo::FixedWindow { limit, .. }
            | Algo::SlidingWindow { limit, .. }
            | Algo::SlidingLog { limit, .. } => limit,
        }
    }

    /// `W` in nanoseconds.
    pub fn window(&self) -> u64 {
        match *self {
            Algo::Gcra { window, .. }
            | Algo::LeakyQueue { window, .. }
            | Algo::FixedWindow { window, .. }
            | Algo::SlidingWindow { window, .. }
            | Algo::SlidingLog { window, .. } => window,
        }
    }

    /// The largest cost that can ever be admitted: `B` / `C` for GCRA and leaky, `L` otherwise.
    pub fn capacity(&self) -> u64 {
        match *self {
            Algo::Gcra { burst, .. } => burst,
            Algo::LeakyQueue { capacity, .. } => capacity,
            Algo::FixedWindow { limit, .. }
            | Algo::SlidingWindow { limit, .. }
            | Algo::SlidingLog { limit, .. } => limit,
        }
    }

    /// GCRA's emission interval `T = W / L`, rounded to the nearest ns (halves up), at least 1.
    pub fn interval(&self) -> u128 {
        let (w, l) = (self.window() as u128, self.limit() as u128);
        ((2 * w + l) / (2 * l)).max(1)
    }

    /// Decides a request of `cost` at `t` against `state`; when `commit`, applies it. A denied
    /// request, a cost-0 request and a peek (`commit == false`) leave `state` as it was.
    pub fn decide(
        &self,
        state: &mut KeyState,
        t: u128,
        cost: u64,
        commit: bool,
    ) -> Result<Outcome, RefError> {
        let capacity = self.capacity();
        if cost > capacity {
            return Err(RefError::CapacityExceeded { cost, capacity });
        }
        let mut after = state.clone();
        let outcome = match *self {
            Algo::Gcra { burst, .. } => {
                self.gcra(&mut after, t, cost as u128, burst as u128, false)
            }
            Algo::LeakyQueue { capacity, .. } => {
                self.gcra(&mut after, t, cost as u128, capacity as u128, true)
            }
            Algo::FixedWindow { limit, window } => {
                fixed_window(&mut after, t, cost as u128, limit as u128, window as u128)
            }
            Algo::SlidingWindow { limit, window } => {
                sliding_window(&mut after, t, cost as u128, limit as u128, window as u128)
            }
            Algo::SlidingLog {
                limit,
                window,
                tick,
            } => sliding_log(
                &mut after,
                t,
                cost as u128,
                limit as u128,
                window as u128,
                tick as u128,
            ),
        };
        if !outcome.allowed || cost == 0 {
            // SPEC: a denied request, and a request of cost 0, change nothing.
            assert_eq!(
                &after, state,
                "model bug: a denied or free request changed state"
            );
        }
        if commit {
            *state = after;
        }
        Ok(outcome)
    }

    /// Gives back `cost` units at `t`, as the engine documents for `refund`.
    pub fn refund(&self, state: &mut KeyState, t: u128, cost: u64) {
        let cost = cost as u128;
        match *self {
            Algo::Gcra { .. } | Algo::LeakyQueue { .. } => {
                // TAT moves back by c·T, never before now; a full bucket stays as it is.
                if let Some(tat) = state.tat {
                    if tat > t {
                        let back = cost * self.interval();
                        state.tat = Some(tat.saturating_sub(back).max(t));
                    }
                }
            }
            Algo::FixedWindow { window, .. } => {
                let k = t / window as u128;
                let n = state.counts.entry(k).or_insert(0);
                *n -= cost.min(*n);
            }
            Algo::SlidingWindow { window, .. } => {
                // Off the current window first, then off the previous one.
                let k = t / window as u128;
                let cur = count(state, Some(k));
                let prev = count(state, k.checked_sub(1));
                let from_cur = cost.min(cur);
                let from_prev = (cost - from_cur).min(prev);
                state.counts.insert(k, cur - from_cur);
                if k > 0 {
                    state.counts.insert(k - 1, prev - from_prev);
                }
            }
            Algo::SlidingLog { window, .. } => {
                // The `cost` newest live entries go.
                let live = live_entries(state, t, window as u128).len() as u128;
                for _ in 0..cost.min(live) {
                    state.log.pop();
                }
            }
        }
    }

    /// Whether `state` is indistinguishable from a fresh key at `t`.
    pub fn is_fresh(&self, state: &KeyState, t: u128) -> bool {
        match *self {
            Algo::Gcra { .. } | Algo::LeakyQueue { .. } => {
                !matches!(state.tat, Some(tat) if tat > t)
            }
            Algo::FixedWindow { window, .. } => count(state, Some(t / window as u128)) == 0,
            Algo::SlidingWindow { window, .. } => {
                let k = t / window as u128;
                count(state, Some(k)) == 0 && count(state, k.checked_sub(1)) == 0
            }
            Algo::SlidingLog { window, .. } => live_entries(state, t, window as u128).is_empty(),
        }
    }

    /// SPEC §1 (and §3 with `queue`):
    ///
    /// ```text
    /// tat = max(TAT, t)
    /// allow iff tat + c·T − t ≤ B·T      then TAT := tat + c·T
    /// retry_after (denied) = tat + c·T − B·T − t
    /// reset_after = max(0, TAT' − t)
    /// remaining   = floor((B·T − max(0, TAT' − t)) / T)
    /// delay (queue, admitted) = tat − t
    /// ```
    fn gcra(&self, s: &mut KeyState, t: u128, c: u128, b: u128, queue: bool) -> Outcome {
        let tt = self.interval();
        let tat = s.tat.unwrap_or(t).max(t);
        // c = 0 is always allowed and changes nothing (the formula would allow it too).
        let allowed = c == 0 || tat + c * tt - t <= b * tt;
        if allowed && c > 0 {
            s.tat = Some(tat + c * tt);
        }
        let tat_after = s.tat.unwrap_or(t);
        let debt = tat_after.saturating_sub(t);
        Outcome {
            allowed,
            limit: self.limit(),
            // After a quota change the debt can exceed the new span: nothing remains.
            remaining: ((b * tt).saturating_sub(debt) / tt) as u64,
            retry_after: if allowed {
                0
            } else {
                tat + c * tt - b * tt - t
            },
            reset_after: debt,
            delay: if queue && allowed { tat - t } else { 0 },
        }
    }
}

fn count(s: &KeyState, k: Option<u128>) -> u128 {
    k.and_then(|k| s.counts.get(&k).copied()).unwrap_or(0)
}

/// SPEC §4: windows `[k·W, (k+1)·W)`; allow iff `n + c ≤ L`, then `n += c`.
fn fixed_window(s: &mut KeyState, t: u128, c: u128, l: u128, w: u128) -> Outcome {
    let k = t / w;
    let end = (k + 1) * w;
    let n = count(s, Some(k));
    let allowed = n + c <= l;
    if allowed && c > 0 {
        s.counts.insert(k, n + c);
    }
    let n_after = count(s, Some(k));
    Outcome {
        allowed,
        limit: l as u64,
        remaining: l.saturating_sub(n_after) as u64,
        // Denied: the end of the window (c ≤ L, so the next window admits it).
        retry_after: if allowed { 0 } else { end - t },
        // The end of the window if anything was admitted in it.
        reset_after: if n_after > 0 { end - t } else { 0 },
        delay: 0,
    }
}

/// SPEC §5's inequality for a request of cost `c ≥ 1` at `t`, given the counts in `s`:
/// `(cur + c − 1)·W + prev·(W − e) < L·W`.
fn sliding_window_admits(s: &KeyState, t: u128, c: u128, l: u128, w: u128) -> bool {
    let k = t / w;
    let e = (t - k * w) as i128;
    let (cur, prev) = (
        count(s, Some(k)) as i128,
        count(s, k.checked_sub(1)) as i128,
    );
    let (c, l, w) = (c as i128, l as i128, w as i128);
    (cur + c - 1) * w + prev * (w - e) < l * w
}

/// SPEC §5: `est = cur + prev·(W − e)/W`; allow iff `est + c − 1 < L`, then `cur += c`.
fn sliding_window(s: &mut KeyState, t: u128, c: u128, l: u128, w: u128) -> Outcome {
    let k = t / w;
    let e = t - k * w;
    let allowed = c == 0 || sliding_window_admits(s, t, c, l, w);
    let cur = count(s, Some(k));
    if allowed && c > 0 {
        s.counts.insert(k, cur + c);
    }
    let cur_after = count(s, Some(k));
    let prev = count(s, k.checked_sub(1));
    // remaining = max(0, ceil(L − est)) = max(0, ceil((L·W − cur·W − prev·(W − e)) / W)).
    let headroom = (l * w) as i128 - (cur_after * w) as i128 - (prev * (w - e)) as i128;
    let remaining = if headroom <= 0 {
        0
    } else {
        (headroom as u128).div_ceil(w) as u64
    };
    // retry_after: the first instant the inequality holds, assuming no other request arrives.
    // The left side never grows as time passes (within a window prev's weight shrinks; at a
    // boundary cur becomes prev with weight ≤ 1 and the new cur is 0), so binary search the
    // first admitting instant in (t, (k+2)·W], where both windows have slid out and c ≤ L admits.
    let retry_after = if allowed {
        0
    } else {
        let (mut lo, mut hi) = (t, (k + 2) * w); // !admits(lo), admits(hi)
        assert!(sliding_window_admits(s, hi, c, l, w));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if sliding_window_admits(s, mid, c, l, w) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi - t
    };
    // reset_after: the end of the next window if cur > 0, else the end of this one if prev > 0.
    let reset_after = if cur_after > 0 {
        (k + 2) * w - t
    } else if prev > 0 {
        (k + 1) * w - t
    } else {
        0
    };
    Outcome {
        allowed,
        limit: l as u64,
        remaining,
        retry_after,
        reset_after,
        delay: 0,
    }
}

/// The entries that count at `t`: time `> t − W`.
fn live_entries(s: &KeyState, t: u128, w: u128) -> Vec<u128> {
    s.log.iter().copied().filter(|&e| e + w > t).collect()
}

/// SPEC §6: allow iff `count + c ≤ L`, then append `c` entries at `t` (rounded up to `tick`).
fn sliding_log(s: &mut KeyState, t: u128, c: u128, l: u128, w: u128, tick: u128) -> Outcome {
    let live = live_entries(s, t, w);
    let count = live.len() as u128;
    let allowed = count + c <= l;
    let stamp = t.div_ceil(tick) * tick;
    let stamp = s.log.last().map_or(stamp, |&newest| stamp.max(newest));
    if allowed && c > 0 {
        for _ in 0..c {
            s.log.push(stamp);
        }
    }
    // `s` is the state after the decision (for a peek too: `decide` works on a copy).
    let live_after = live_entries(s, t, w);
    // Denied: the (count + c − L)-th oldest live entry must expire.
    let retry_after = if allowed {
        0
    } else {
        live[(count + c - l - 1) as usize] + w - t
    };
    Outcome {
        allowed,
        limit: l as u64,
        remaining: l.saturating_sub(live_after.len() as u128) as u64,
        retry_after,
        // The newest live entry + W − t; zero when the log is empty.
        reset_after: live_after.last().map_or(0, |&newest| newest + w - t),
        delay: 0,
    }
}

/// A keyed model: one [`KeyState`] per key, each decided independently.
#[derive(Debug, Clone)]
pub struct Model<K> {
    pub algo: Algo,
    pub keys: HashMap<K, KeyState>,
}

impl<K: Hash + Eq + Clone> Model<K> {
    pub fn new(algo: Algo) -> Self {
        Model {
            algo,
            keys: HashMap::new(),
        }
    }

    /// Decides and, if allowed, counts a request of `cost` for `key` at `t`. Like the engine's
    /// keyed limiter, any request that is not an error makes the key known (see [`Model::holds`]).
    pub fn check(&mut self, key: &K, t: u128, cost: u64) -> Result<Outcome, RefError> {
        if cost > self.algo.capacity() {
            return Err(RefError::CapacityExceeded {
                cost,
                capacity: self.algo.capacity(),
            });
        }
        let state = self.keys.entry(key.clone()).or_default();
        self.algo.decide(state, t, cost, true)
    }

    /// A reservation of `cost` for `key` at `t`: a check, except that GCRA takes the units of
    /// a refused request anyway (`TAT := max(TAT, t) + c·T`) and admits it with the delay
    /// `TAT − B·T − t`, the instant a check would admit it. The other rules reserve as they check.
    pub fn reserve(&mut self, key: &K, t: u128, cost: u64) -> Result<Outcome, RefError> {
        let outcome = self.check(key, t, cost)?;
        let Algo::Gcra { burst, .. } = self.algo else {
            return Ok(outcome);
        };
        if outcome.allowed {
            return Ok(outcome);
        }
        let tt = self.algo.interval();
        let state = self.keys.entry(key.clone()).or_default();
        let tat = state.tat.unwrap_or(t).max(t) + cost as u128 * tt;
        state.tat = Some(tat);
        Ok(Outcome {
            allowed: true,
            limit: self.algo.limit(),
            remaining: 0,
            retry_after: 0,
            reset_after: tat - t,
            delay: tat - t - burst as u128 * tt,
        })
    }

    /// The decision a request would get at `t`; changes nothing.
    pub fn peek(&self, key: &K, t: u128, cost: u64) -> Result<Outcome, RefError> {
        let mut state = self.keys.get(key).cloned().unwrap_or_default();
        self.algo.decide(&mut state, t, cost, false)
    }

    /// Gives back `cost` units of `key` at `t` (nothing for an unknown key).
    pub fn refund(&mut self, key: &K, t: u128, cost: u64) {
        if let Some(state) = self.keys.get_mut(key) {
            self.algo.refund(state, t, cost);
        }
    }

    /// Whether a (non-error) check was ever made for `key`.
    pub fn holds(&self, key: &K) -> bool {
        self.keys.contains_key(key)
    }

    /// Whether `key` is indistinguishable from a fresh key at `t`.
    pub fn is_fresh(&self, key: &K, t: u128) -> bool {
        match self.keys.get(key) {
            Some(state) => self.algo.is_fresh(state, t),
            None => true,
        }
    }
}

/// SPEC: "a reading older than the newest one seen is treated as the newest one".
#[derive(Debug, Clone, Copy, Default)]
pub struct Monotonic {
    newest: u128,
}

impl Monotonic {
    /// The time a reading of `t` stands for, remembering it as seen.
    pub fn see(&mut self, t: u128) -> u128 {
        self.newest = self.newest.max(t);
        self.newest
    }

    /// The newest reading seen.
    pub fn newest(&self) -> u128 {
        self.newest
    }
}
