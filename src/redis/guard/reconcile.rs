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
//!   carries (`TAT − now`, rounded up to whole units, at most the burst `B`) to the global
//!   state's: units that the bucket would have refilled since are not charged.
//! - **Sliding log**: the units of the last window, in parts of at most a sixteenth of a
//!   window each ([`LOG_PARTS`]) with the time of the newest of them; each part is inserted
//!   in the log at that time (among the entries Redis admitted meanwhile), unless it has
//!   expired already. So each unit expires less than `W/16` after a window from its
//!   admission (late, never early: the key is refused that much longer at most).
//!
//! Charges are never denied: a state may pass the limit (up to `2^52 − 1`), and the key is
//! then denied until the excess has drained.
//!
//! Charges are applied exactly once. When a settle starts, what an entry owes becomes charges,
//! each with a token of its own ([`new_token`]), kept in the entry until Redis answers them:
//! a charge whose call failed (a timeout, a dropped connection, the task stopped mid-call) is
//! sent again, with the same token, at the next settle, and the script applies a token once.
//! So a charge that timed out but ran is not counted twice, and none is lost before Redis
//! answered it.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::redis::error::TierError;
use crate::redis::exact::units::wall_nanos;
use crate::redis::exact::{
    new_token, Algo, LogCharge, RedisConnection, RedisLimiter, UnitOp, Units,
};
use crate::redis::rule::RedisRule;

/// A charge formed and not yet answered by Redis: sent (again) with its token until it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    /// When the units were admitted (wall ns); GCRA: when its debt was measured (`None` =
    /// when the script runs, for a charge of the leased tier's).
    pub at: Option<u64>,
    pub units: u64,
    pub token: u64,
    /// The units recorded that this charge settles (for [`Ledger::pending`]).
    pub counted: u64,
}

/// Charges sent in one go (then the next slice, unless one failed).
const SLICE: usize = 1024;

/// The parts a sliding log's window of admissions is kept in: units within `W/16` of a part's
/// first are charged with it, at its newest (a unit lands at most that late), so a key keeps
/// at most 17 parts however much the policy admitted.
const LOG_PARTS: u64 = 16;

/// Sliding log: units admitted from `first` to `at` (wall ns), charged at `at`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LogPart {
    first: u64,
    at: u64,
    units: u64,
}

/// What one key owes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// Sliding log: the last window's admissions, oldest first.
    log: Vec<LogPart>,
    /// Every unit recorded (what settling this entry takes off `Ledger::owed`).
    units: u64,
    /// Units the node may still admit without owing them: a leased node's lease, granted
    /// before the outage and handed over to the local limiter.
    credit: u64,
    /// Charges formed and not yet answered.
    sending: Vec<Charge>,
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

impl Owed {
    /// Adds `units` admitted at `at` to a sliding log's parts of window `window`; parts a
    /// window old are forgotten, as the log forgets them.
    fn add_log(&mut self, window: u64, units: u64, at: u64) {
        let width = (window / LOG_PARTS).max(1);
        match self.log.last_mut() {
            // A clock stepped back joins the last part too: charged at that part's time, later
            // than admitted (counted a little longer, never shorter), so the parts stay at 17.
            Some(last) if at < last.first.saturating_add(width) => {
                last.units = last.units.saturating_add(units);
                last.at = last.at.max(at);
            }
            _ => self.log.push(LogPart {
                first: at,
                at,
                units,
            }),
        }
        self.log.retain(|part| at.saturating_sub(part.at) < window);
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
            Target::Units(Algo::Fixed { window } | Algo::Sliding { window }) => {
                owed.add_window(now / window, cost, now);
            }
            Target::Log { window } => owed.add_log(window, cost, now),
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

    /// Adds a charge already formed (with its token) whose call failed: sent again, with the
    /// same token, at the next settle.
    pub(crate) fn resend(&self, key: &[u8], charge: Charge) {
        // Relaxed: a statistic.
        self.pending.fetch_add(charge.counted, Ordering::Relaxed);
        self.owed
            .entry(key.into())
            .or_default()
            .sending
            .push(charge);
    }

    /// Turns what `owed` has recorded into charges with tokens of their own (at the wall time
    /// `now`); the credit ends here. Units that change nothing (a GCRA debt the bucket has
    /// refilled) are settled at once.
    fn form_charges(&self, owed: &mut Owed, now: u64) {
        let counted = std::mem::take(&mut owed.units);
        owed.credit = 0;
        if counted == 0 {
            return;
        }
        let parts: Vec<(Option<u64>, u64)> = match self.target {
            Target::Units(Algo::Gcra { interval, span }) => {
                // Measured now: sent again later, the charge leaves out what the bucket
                // refilled since (and so its token need outlive it only by its debt).
                let debt = std::mem::take(&mut owed.tat).saturating_sub(now);
                let interval = interval.max(1);
                // At most the burst, what the rule can owe: `FailOpen` admits without bound,
                // and charged in full a busy key would be denied for days (up to 52).
                let units = debt.div_ceil(interval).min(span / interval);
                vec![(Some(now), units)]
            }
            Target::Units(Algo::Fixed { .. } | Algo::Sliding { .. }) => {
                let parts = vec![
                    (Some(owed.prev_at), owed.prev),
                    (Some(owed.cur_at), owed.cur),
                ];
                (owed.k, owed.cur, owed.cur_at, owed.prev, owed.prev_at) = (0, 0, 0, 0, 0);
                parts
            }
            Target::Log { .. } => std::mem::take(&mut owed.log)
                .into_iter()
                .map(|part| (Some(part.at), part.units))
                .collect(),
        };
        let mut counted = Some(counted);
        for (at, units) in parts {
            if units > 0 {
                let counted = counted.take().unwrap_or(0);
                let token = new_token();
                owed.sending.push(Charge {
                    at,
                    units,
                    token,
                    counted,
                });
            }
        }
        if let Some(settled) = counted {
            // Relaxed: a statistic.
            self.pending.fetch_sub(settled, Ordering::Relaxed);
        }
    }

    /// Charges everything owed to Redis, one script call per Cluster slot. Charges whose call
    /// fails transiently stay for the next attempt (with their tokens); the first such error
    /// is returned.
    pub(super) async fn settle<C: RedisConnection>(
        &self,
        exact: &RedisLimiter<C>,
    ) -> Result<(), TierError> {
        let now = wall_nanos();
        let mut batch: Vec<(Box<[u8]>, Charge)> = Vec::new();
        for mut entry in self.owed.iter_mut() {
            let (key, owed) = entry.pair_mut();
            self.form_charges(owed, now);
            batch.extend(owed.sending.iter().map(|c| (key.clone(), *c)));
        }
        self.owed
            .retain(|_, owed| owed.units > 0 || !owed.sending.is_empty() || owed.credit > 0);
        if batch.is_empty() {
            return Ok(());
        }
        // A slice at a time, stopping at the first transient failure: after an outage, a
        // large ledger does not flood a server that may still be slow (calls that time out
        // keep it busy all the same).
        let mut first_error = None;
        for slice in batch.chunks(SLICE) {
            self.charge(exact, slice, now, &mut first_error).await;
            if first_error.is_some() {
                break;
            }
        }
        self.owed
            .retain(|_, owed| owed.units > 0 || !owed.sending.is_empty() || owed.credit > 0);
        match first_error {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Sends `slice` and settles each charge Redis answered (or refused for good); the first
    /// transient error goes to `first_error`.
    async fn charge<C: RedisConnection>(
        &self,
        exact: &RedisLimiter<C>,
        slice: &[(Box<[u8]>, Charge)],
        now: u64,
        first_error: &mut Option<TierError>,
    ) {
        let results: Vec<Result<u64, TierError>> = match self.target {
            Target::Units(algo) => {
                let items: Vec<Units> = slice
                    .iter()
                    .map(|(key, c)| Units {
                        key: exact.redis_key(key),
                        op: UnitOp::Charge { at: c.at },
                        units: c.units,
                        token: c.token,
                    })
                    .collect();
                let (results, _) = exact.move_units(algo, &items).await;
                results
                    .into_iter()
                    .map(|r| r.map(|reply| reply.units))
                    .collect()
            }
            Target::Log { .. } => {
                let items: Vec<LogCharge> = slice
                    .iter()
                    .map(|(key, c)| LogCharge {
                        key: exact.redis_key(key),
                        units: c.units,
                        at: c.at.unwrap_or(now),
                        token: c.token,
                    })
                    .collect();
                exact.charge_log(&items).await.0
            }
        };
        for ((key, charge), result) in slice.iter().zip(results) {
            match result {
                Err(error) if error.is_transient() => {
                    first_error.get_or_insert(error);
                    continue;
                }
                // Relaxed: a statistic.
                Ok(units) => {
                    self.charged.fetch_add(units, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::warn!(%error, "reconciliation: a charge failed; its units are dropped");
                }
            }
            // Answered: done with it.
            // Relaxed: a statistic.
            self.pending.fetch_sub(charge.counted, Ordering::Relaxed);
            if let Some(mut owed) = self.owed.get_mut(key) {
                owed.sending.retain(|c| c.token != charge.token);
            }
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
    fn a_log_keeps_its_window_in_parts_of_a_sixteenth() {
        let mut o = Owed::default();
        // W = 1600: parts of 100.
        o.add_log(1_600, 2, 1_000);
        o.add_log(1_600, 1, 1_099);
        o.add_log(1_600, 3, 1_100);
        let part = |first, at, units| LogPart { first, at, units };
        assert_eq!(o.log, [part(1_000, 1_099, 3), part(1_100, 1_100, 3)]);
        // A clock stepped back joins the last part; a window later the first parts go.
        o.add_log(1_600, 1, 900);
        assert_eq!(o.log, [part(1_000, 1_099, 3), part(1_100, 1_100, 4)]);
        o.add_log(1_600, 4, 2_699);
        assert_eq!(o.log, [part(1_100, 1_100, 4), part(2_699, 2_699, 4)]);
        // However often the clock steps back, the parts stay within 17.
        let mut o = Owed::default();
        for i in 0..10_000u64 {
            o.add_log(1_600, 1, 1_000_000 - (i % 7) * 150 + i / 7);
        }
        assert!(o.log.len() <= 17, "{} parts", o.log.len());
        assert_eq!(o.log.iter().map(|p| p.units).sum::<u64>(), 10_000);
        o.add_log(1_600, 1, u64::MAX);
        assert_eq!(o.log, [part(u64::MAX, u64::MAX, 1)]);
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
        let owed = ledger.owed.get(&b"k"[..]).unwrap().clone();
        assert_eq!((owed.tat, owed.units), (1_050, 5));
        // Much later: the bucket has refilled; a new admission starts from `now`.
        ledger.record(b"k", 1, 5_000);
        assert_eq!(ledger.owed.get(&b"k"[..]).unwrap().tat, 5_010);
        assert_eq!(ledger.pending(), 6);
        ledger.record(b"k", u64::MAX, u64::MAX);
        assert_eq!(ledger.owed.get(&b"k"[..]).unwrap().tat, u64::MAX);
    }
}
