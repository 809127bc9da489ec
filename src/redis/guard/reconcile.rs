//! Reconciliation after an outage: the units the failure policy admitted while Redis was
//! unreachable, counted per key, and charged to Redis once it answers again.
//!
//! What is kept per key is what the global state would still remember of those admissions:
//! - **Window counters**: the units admitted in each of the last two windows (epoch-aligned
//!   by the node's wall clock, as the server aligns them by its own), with the time of the
//!   newest. The charge adds each to the count of its window if the state still remembers
//!   that window (the script decides by the server's clock); older usage changes nothing.
//! - **GCRA / leaky buckets**: the theoretical arrival time of those admissions alone, at the
//!   global emission interval `T`, from an empty bucket. The charge adds the debt it still
//!   carries (`TAT − now`, rounded up to whole units) to the global state's: units that the
//!   bucket would have refilled since are not charged.
//! - **Sliding log**: as the window counters, the units of the last two windows with the time
//!   of the newest; each window's units are appended to the log as one entry at that time (or
//!   at the log's newest entry's, if later), unless they have expired already.
//!
//! Charges are never denied: a state may pass the limit (up to `2^52 − 1`), and the key is
//! then denied until the excess has drained.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use dashmap::DashMap;

use crate::redis::error::Error;
use crate::redis::exact::{Algo, LogCharge, RedisConnection, RedisLimiter, UnitOp, Units};
use crate::redis::rule::RedisRule;

/// The wall clock, ns since the Unix epoch (the server's `TIME` on a synchronised fleet).
pub(crate) fn wall_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What one key owes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Owed {
    /// GCRA: the theoretical arrival time (wall ns) of the owed admissions alone.
    tat: u64,
    /// Windows: the window index of `cur` (wall ns ÷ W), the units admitted in it and the
    /// time of the newest; the same for the window before.
    k: u64,
    cur: u64,
    cur_at: u64,
    prev: u64,
    prev_at: u64,
    /// Every unit recorded (what settling this entry takes off `Ledger::owed`).
    units: u64,
    /// Units the node may still admit without owing them: a leased node's lease, granted
    /// before the outage and handed over to the local limiter.
    credit: u64,
}

impl Owed {
    /// Adds `units` admitted at `at` in window `k`; windows older than the one before the
    /// newest are forgotten, as the state forgets them.
    fn add_window(&mut self, k: u64, units: u64, at: u64) {
        if self.cur == 0 && self.prev == 0 {
            self.k = k;
        }
        if k == self.k {
            self.cur = self.cur.saturating_add(units);
            self.cur_at = self.cur_at.max(at);
        } else if k.checked_add(1) == Some(self.k) {
            self.prev = self.prev.saturating_add(units);
            self.prev_at = self.prev_at.max(at);
        } else if k > self.k {
            let adjacent = k - self.k == 1;
            (self.prev, self.prev_at) = if adjacent {
                (self.cur, self.cur_at)
            } else {
                (0, 0)
            };
            (self.k, self.cur, self.cur_at) = (k, units, at);
        }
    }
}

/// The state charges go to.
#[derive(Debug, Clone, Copy)]
enum Target {
    Units(Algo),
    Log { window: u64 },
}

/// The units the policy admitted while the breaker was open, per key, until charged.
pub(super) struct Ledger {
    target: Target,
    owed: DashMap<Box<[u8]>, Owed, foldhash::fast::RandomState>,
    // Counters. Relaxed: statistics that publish nothing.
    pending: AtomicU64,
    charged: AtomicU64,
}

impl Ledger {
    /// A ledger for `rule`'s state (every algorithm).
    pub(super) fn new(rule: &RedisRule) -> Ledger {
        let target = match Algo::of(rule) {
            Some(algo) => Target::Units(algo),
            // The sliding log (window ≥ 1 ms).
            None => Target::Log {
                window: rule.window_nanos().max(1),
            },
        };
        Ledger {
            target,
            owed: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            pending: AtomicU64::new(0),
            charged: AtomicU64::new(0),
        }
    }

    /// Records `cost` units admitted for `key` at the wall time `now` without Redis.
    pub(super) fn record(&self, key: &[u8], cost: u64, now: u64) {
        if cost == 0 {
            return;
        }
        // A known key's entry without allocating its key again.
        let mut owed = match self.owed.get_mut(key) {
            Some(owed) => owed,
            None => self.owed.entry(key.into()).or_default(),
        };
        let covered = owed.credit.min(cost);
        owed.credit -= covered;
        let cost = cost - covered;
        if cost == 0 {
            return;
        }
        // Relaxed: a statistic. Counted while the entry is locked and before it holds the
        // units, so that a settle never takes off more than was counted.
        self.pending.fetch_add(cost, Ordering::Relaxed);
        match self.target {
            Target::Units(Algo::Gcra { interval, .. }) => {
                owed.tat = owed
                    .tat
                    .max(now)
                    .saturating_add(cost.saturating_mul(interval));
            }
            Target::Units(Algo::Fixed { window } | Algo::Sliding { window })
            | Target::Log { window } => {
                owed.add_window(now / window, cost, now);
            }
        }
        owed.units = owed.units.saturating_add(cost);
    }

    /// Lets `key` admit `units` more without owing them (units granted before the outage, now
    /// spent by the policy). The credit ends with the entry: when it is settled.
    pub(super) fn credit(&self, key: &[u8], units: u64) {
        if units == 0 {
            return;
        }
        let mut owed = self.owed.entry(key.into()).or_default();
        owed.credit = owed.credit.saturating_add(units);
    }

    /// Units recorded and not yet settled (charged, or found to change nothing).
    pub(super) fn pending(&self) -> u64 {
        // Relaxed: a statistic.
        self.pending.load(Ordering::Relaxed)
    }

    /// Units Redis has counted so far.
    pub(super) fn charged(&self) -> u64 {
        // Relaxed: a statistic.
        self.charged.load(Ordering::Relaxed)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// Puts back an entry whose charge failed, merged with what was recorded since.
    fn restore(&self, key: Box<[u8]>, back: Owed, now: u64) {
        let mut owed = self.owed.entry(key).or_default();
        match self.target {
            Target::Units(Algo::Gcra { .. }) => {
                // The two debts add up (conservative: as if one stream followed the other).
                let debt = back.tat.saturating_sub(now);
                owed.tat = owed.tat.max(now).saturating_add(debt);
            }
            Target::Units(Algo::Fixed { .. } | Algo::Sliding { .. }) | Target::Log { .. } => {
                if back.prev > 0 {
                    owed.add_window(back.k.saturating_sub(1), back.prev, back.prev_at);
                }
                owed.add_window(back.k, back.cur, back.cur_at);
            }
        }
        owed.units = owed.units.saturating_add(back.units);
    }

    /// Charges everything owed to Redis, one script call per Cluster slot. Entries whose call
    /// fails transiently are kept for the next attempt; the first such error is returned.
    pub(super) async fn settle<C: RedisConnection>(
        &self,
        exact: &RedisLimiter<C>,
    ) -> Result<(), Error> {
        let keys: Vec<Box<[u8]>> = self.owed.iter().map(|e| e.key().clone()).collect();
        let drained: Vec<(Box<[u8]>, Owed)> = keys
            .into_iter()
            .filter_map(|key| self.owed.remove(&key))
            .collect();
        if drained.is_empty() {
            return Ok(());
        }
        let now = wall_nanos();
        // The index into `drained` of each item sent.
        let mut owner: Vec<usize> = Vec::new();
        let results: Vec<Result<u64, Error>> = match self.target {
            Target::Units(algo) => {
                let mut items: Vec<Units> = Vec::new();
                for (i, (key, owed)) in drained.iter().enumerate() {
                    let key = exact.redis_key(key);
                    let mut push = |op: UnitOp, units: u64| {
                        if units > 0 {
                            let key = key.clone();
                            items.push(Units { key, op, units });
                            owner.push(i);
                        }
                    };
                    match algo {
                        Algo::Gcra { interval, .. } => {
                            let debt = owed.tat.saturating_sub(now);
                            push(UnitOp::Charge { at: None }, debt.div_ceil(interval.max(1)));
                        }
                        Algo::Fixed { .. } | Algo::Sliding { .. } => {
                            push(
                                UnitOp::Charge {
                                    at: Some(owed.prev_at),
                                },
                                owed.prev,
                            );
                            push(
                                UnitOp::Charge {
                                    at: Some(owed.cur_at),
                                },
                                owed.cur,
                            );
                        }
                    }
                }
                let (results, _) = exact.move_units(algo, &items).await;
                results
                    .into_iter()
                    .map(|r| r.map(|reply| reply.units))
                    .collect()
            }
            Target::Log { .. } => {
                let mut items: Vec<LogCharge> = Vec::new();
                for (i, (key, owed)) in drained.iter().enumerate() {
                    let key = exact.redis_key(key);
                    for (units, at) in [(owed.prev, owed.prev_at), (owed.cur, owed.cur_at)] {
                        if units > 0 {
                            let key = key.clone();
                            items.push(LogCharge { key, units, at });
                            owner.push(i);
                        }
                    }
                }
                exact.charge_log(&items).await.0
            }
        };
        let mut failed = vec![false; drained.len()];
        let mut first_error = None;
        for (result, &i) in results.into_iter().zip(&owner) {
            match result {
                // Relaxed: a statistic.
                Ok(units) => {
                    self.charged.fetch_add(units, Ordering::Relaxed);
                }
                Err(error) if error.is_transient() => {
                    failed[i] = true;
                    first_error.get_or_insert(error);
                }
                Err(error) => {
                    tracing::warn!(%error, "reconciliation: a charge failed; its units are dropped");
                }
            }
        }
        for ((key, owed), failed) in drained.into_iter().zip(failed) {
            if failed {
                self.restore(key, owed, now);
            } else {
                // Relaxed: a statistic.
                self.pending.fetch_sub(owed.units, Ordering::Relaxed);
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_keep_the_last_two_and_forget_older_ones() {
        let mut o = Owed::default();
        o.add_window(10, 3, 100);
        o.add_window(10, 2, 105);
        assert_eq!((o.k, o.cur, o.cur_at, o.prev), (10, 5, 105, 0));
        o.add_window(11, 1, 110);
        assert_eq!((o.k, o.cur, o.prev, o.prev_at), (11, 1, 5, 105));
        // A late record of the window before still counts there; older ones are forgotten.
        o.add_window(10, 1, 107);
        o.add_window(9, 7, 90);
        assert_eq!((o.k, o.cur, o.prev, o.prev_at), (11, 1, 6, 107));
        o.add_window(14, 4, 140);
        assert_eq!((o.k, o.cur, o.prev), (14, 4, 0));
        o.add_window(u64::MAX, 1, u64::MAX);
        assert_eq!((o.k, o.cur, o.prev), (u64::MAX, 1, 0));
    }

    #[test]
    fn gcra_owes_the_debt_left_from_an_empty_bucket() {
        let ledger = Ledger {
            target: Target::Units(Algo::Gcra {
                interval: 10,
                span: 100,
            }),
            owed: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            pending: AtomicU64::new(0),
            charged: AtomicU64::new(0),
        };
        ledger.record(b"k", 3, 1_000);
        ledger.record(b"k", 2, 1_005);
        let owed = *ledger.owed.get(&b"k"[..]).unwrap();
        assert_eq!((owed.tat, owed.units), (1_050, 5));
        // Much later: the bucket has refilled; a new admission starts from `now`.
        ledger.record(b"k", 1, 5_000);
        assert_eq!(ledger.owed.get(&b"k"[..]).unwrap().tat, 5_010);
        assert_eq!(ledger.pending(), 6);
        ledger.record(b"k", u64::MAX, u64::MAX);
        assert_eq!(ledger.owed.get(&b"k"[..]).unwrap().tat, u64::MAX);
    }
}
