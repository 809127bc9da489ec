//! The refill scheduler: one node's leases, the queue of refills asked for, and the two
//! background tasks: the refill task (every refill asked for since its last batch, in one
//! script call per Cluster slot) and the sweeper (units of idle keys and expired window leases
//! go back to Redis; what it decides is `sweep.rs`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::cell::Lease;
use super::config::{Counters, Terms};
use super::first_touch::{first_lease, void_provisional, Owed};
use super::grant::{install, prepare, seen_left};
use super::routes::Routes;
use super::sweep::{period, visit, Swept};
use super::word::{now_ms, units_of, usable};
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::redis::error::TierError;
use crate::redis::exact::units::wall_nanos;
use crate::redis::exact::{new_token, RedisConnection, RedisLimiter, Reply, UnitOp, Units};
use crate::redis::guard::{GuardMode, GuardedLimiter};

/// The leases of one node and what serves them.
pub(super) struct Node<C: RedisConnection> {
    pub exact: RedisLimiter<C>,
    pub guard: GuardedLimiter<C>,
    pub terms: Terms,
    pub leases: DashMap<Box<[u8]>, Arc<Lease>, foldhash::fast::RandomState>,
    /// What retired leases left behind, by key, until their keys' states are expected full
    /// again (see [`Owed`]): a key's next lease starts from it.
    owed: DashMap<Box<[u8]>, Owed, foldhash::fast::RandomState>,
    pub clock: QuantaClock,
    runtime: tokio::runtime::Handle,
    pub stats: Counters,
    /// Where checks go: leases, or the failure policy (see `route.rs`); on a Cluster, per
    /// slot owner (`routes.rs`).
    pub routes: Routes,
    /// Refills asked for and not yet sent; the refill task takes them all at once.
    queue: Mutex<Vec<Queued>>,
    wake: tokio::sync::Notify,
}

/// A refill asked for: the lease, and when (limiter clock, ns).
struct Queued {
    lease: Arc<Lease>,
    at: Nanos,
}

/// A return to send: the lease, its units, and the server time of their window's last grant.
type Return = (Arc<Lease>, u64, u64);

/// Aborts the background tasks (the sweeper and the refiller) when the last clone of the
/// limiter is dropped.
pub(super) struct Tasks([tokio::task::AbortHandle; 2]);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl<C: RedisConnection> Node<C> {
    /// A node, with its refill task and sweeper running on `runtime`.
    pub fn start(
        exact: RedisLimiter<C>,
        guard: GuardedLimiter<C>,
        terms: Terms,
        runtime: tokio::runtime::Handle,
    ) -> (Arc<Node<C>>, Tasks) {
        let node = Arc::new(Node {
            exact,
            guard,
            terms,
            leases: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            owed: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            clock: QuantaClock::new(),
            runtime,
            stats: Counters::default(),
            routes: Routes::new(C::CLUSTERED),
            queue: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        });
        let sweeper = node.runtime.spawn(sweep(Arc::downgrade(&node)));
        let refiller = node.runtime.spawn(refills(Arc::clone(&node)));
        let tasks = Tasks([sweeper.abort_handle(), refiller.abort_handle()]);
        (node, tasks)
    }

    /// Queues a refill of `lease` for the refill task unless one is already queued or in
    /// flight; after its backoff if it has one.
    pub fn request_refill(self: &Arc<Self>, lease: &Arc<Lease>) {
        if !lease.refill.claim() {
            return;
        }
        let now = self.clock.now();
        let not_before = lease.bg.lock().not_before;
        if not_before > now {
            let (node, lease) = (Arc::clone(self), Arc::clone(lease));
            self.runtime.spawn(async move {
                tokio::time::sleep(Duration::from_nanos(not_before - now)).await;
                let at = node.clock.now();
                node.enqueue(lease, at);
            });
        } else {
            self.enqueue(Arc::clone(lease), now);
        }
    }

    fn enqueue(&self, lease: Arc<Lease>, at: Nanos) {
        self.queue.lock().push(Queued { lease, at });
        // A permit is stored if the refill task is busy: no request is left waiting.
        self.wake.notify_one();
    }

    /// Whether `lease` is no longer the key's current lease (given back, or forgotten).
    fn retired(&self, lease: &Arc<Lease>) -> bool {
        self.leases
            .get(&lease.key)
            .is_none_or(|current| !Arc::ptr_eq(&current, lease))
    }

    /// Sends the grant requests of `batch` together (one script call per Cluster slot, per
    /// `max_batch` keys) and installs the grants. While the breaker is open, no request is
    /// sent: the policy decides, and the next check after recovery asks again.
    async fn refill_batch(&self, batch: Vec<Queued>) {
        let mut asks = Vec::with_capacity(batch.len());
        let mut done = Vec::with_capacity(batch.len());
        for Queued { lease, at } in batch {
            // On a Cluster, whether the key's own master answers.
            let global = self.guard.mode_of(&lease.key) == GuardMode::Global;
            if global && !self.retired(&lease) {
                if let Some(ask) = prepare(&self.terms, &lease, at) {
                    asks.push((lease, at, ask));
                    continue;
                }
            } else {
                // No grant will cover first-touch units: the policy decides from now on.
                let spent = self.void_provisional(&lease);
                self.guard.record_admitted(&lease.key, spent);
            }
            done.push(lease);
        }
        if !asks.is_empty() {
            let items: Vec<Units> = asks
                .iter()
                .map(|(lease, _, (want, _))| self.units(lease, UnitOp::Grant, *want))
                .collect();
            let (results, calls) = self.exact.move_units(self.terms.algo, &items).await;
            Counters::add(&self.stats.round_trips, calls);
            Counters::add(&self.stats.refills, items.len() as u64);
            let mut charges = Vec::new();
            let mut charged = Vec::new();
            for ((lease, t0, ask), result) in asks.into_iter().zip(results) {
                if let Some((op, units)) = self.finish(&lease, result, t0, ask) {
                    charges.push(self.units(&lease, op, units));
                    charged.push(Arc::clone(&lease));
                }
                done.push(lease);
            }
            if !charges.is_empty() {
                // First-touch units the grants did not cover: the state must count them. A
                // charge resent after a failure keeps the time it was formed at (a GCRA
                // charge's debt runs from there, not from when the failure was seen).
                let formed = wall_nanos();
                let (results, calls) = self.exact.move_units(self.terms.algo, &charges).await;
                Counters::add(&self.stats.round_trips, calls);
                for ((charge, lease), result) in charges.iter().zip(&charged).zip(results) {
                    match result {
                        Ok(_) => self.guard.answered(&lease.key),
                        Err(error) if error.is_transient() => {
                            // Sent again (the same charge, the same token) after the outage,
                            // if reconciliation is on: it may have run.
                            self.guard.resend_charge(&lease.key, charge, formed);
                            self.guard.transient_failure(&error, &lease.key);
                        }
                        Err(error) => tracing::warn!(%error, "charging an overdraft failed"),
                    }
                }
            }
        }
        let mut returns = Vec::new();
        for lease in done {
            // `finish` fails once the lease was retired: `retire` marks the refill before it
            // takes the lease's units and forgets it.
            if lease.refill.finish() {
                lease.refilled.notify_waiters();
            } else {
                // Retired while the grant was in flight: whatever it brought goes back, and
                // the lease is never refilled again.
                lease.refill.retire();
                let (units, since) = take_all(&self.terms, &lease, &self.clock);
                returns.push((lease, units, since));
            }
        }
        self.give_back(&returns).await;
        for (lease, _, _) in returns {
            lease.refilled.notify_waiters();
        }
    }

    fn units(&self, lease: &Lease, op: UnitOp, units: u64) -> Units {
        // A charge carries a token: sent again after a lost reply, it is applied once.
        let token = match op {
            UnitOp::Charge { .. } => new_token(),
            UnitOp::Grant | UnitOp::Return { .. } => 0,
        };
        Units {
            key: self.exact.redis_key(&lease.key),
            op,
            units,
            token,
        }
    }

    /// Takes back the first-touch units of `lease` that no grant will cover: how many were
    /// spent (admitted without Redis).
    pub fn void_provisional(&self, lease: &Lease) -> u64 {
        let mut bg = lease.bg.lock();
        let owed = bg.provisional;
        void_provisional(lease, &mut bg, owed, &self.stats)
    }

    /// Applies the answer to a grant request asked at `t0`. Returns the charge to send if
    /// first-touch units were spent that the grant did not cover.
    fn finish(
        &self,
        lease: &Lease,
        result: Result<Reply, TierError>,
        t0: Nanos,
        ask: (u64, u64),
    ) -> Option<(UnitOp, u64)> {
        match result {
            Ok(reply) => {
                self.guard.answered(&lease.key);
                lease.set_fatal(None);
                lease.set_unreachable(false);
                let now = self.clock.now();
                install(&self.terms, lease, &reply, (t0, now), ask, &self.stats)
            }
            Err(error) => {
                let wait = Terms::nanos(self.guard.probe_interval());
                lease.bg.lock().not_before = t0.saturating_add(wait);
                let spent = self.void_provisional(lease);
                if error.is_transient() {
                    // Admitted without a grant, as during an outage.
                    self.guard.record_admitted(&lease.key, spent);
                    if !lease.unreachable() {
                        // Until a refill succeeds, the policy decides what the lease cannot
                        // serve (the breaker opens only after a run of failures, and a client
                        // under its limit must not be refused meanwhile): `Local` starts the
                        // key from what this node last knew of it, as a handover would. The
                        // units the lease still holds stay its own (fewer than a check's cost).
                        let window_over = lease.bg.lock().window_over;
                        let seen = seen_left(&self.terms, lease, self.clock.now(), window_over);
                        self.guard.take_over(&lease.key, 0, seen);
                        lease.set_unreachable(true);
                    }
                    self.guard.transient_failure(&error, &lease.key);
                } else {
                    tracing::warn!(%error, "lease refill failed");
                    lease.set_fatal(Some(error));
                }
                None
            }
        }
    }

    /// Takes back every unit of `lease` and forgets it: what to give back to Redis. What
    /// its key owes (its state not full again yet) is kept for the key's next lease.
    pub fn retire(&self, lease: Arc<Lease>) -> Return {
        // A check that still holds the lease finds it empty, and never refilled.
        lease.refill.retire();
        let (units, since) = take_all(&self.terms, &lease, &self.clock);
        // Kept before the lease is forgotten: a first touch that finds no lease finds this.
        if let Some(owed) = Owed::of(&lease, self.clock.now()) {
            self.owed.insert(lease.key.clone(), owed);
        }
        self.leases
            .remove_if(&lease.key, |_, v| Arc::ptr_eq(v, &lease));
        (lease, units, since)
    }

    /// A new lease of `key`, a key this node holds no lease of: with `allowance`
    /// provisional units, or none and the hints a retired lease of the key left, while they
    /// hold (see [`Owed`]).
    pub fn new_lease(&self, key: &[u8], allowance: u64, now: Nanos) -> Lease {
        let owed = self.owed.remove(key).map(|(_, owed)| owed);
        first_lease(&self.terms, key, allowance, owed, now)
    }

    /// Returns `(lease, units, since)`: `units` of `lease`, granted in the window of server
    /// time `since`, to Redis, all in one batch (one script call per Cluster slot, per
    /// `max_batch` keys). Those of a window that is over change nothing (the script checks):
    /// a fixed window's count is gone, a sliding window's `prev` still takes them back.
    pub async fn give_back(&self, returns: &[Return]) {
        let (items, leases): (Vec<Units>, Vec<&Arc<Lease>>) = returns
            .iter()
            .filter(|(_, units, _)| *units > 0)
            .map(|(lease, units, since)| {
                let item = self.units(lease, UnitOp::Return { since: *since }, *units);
                (item, lease)
            })
            .unzip();
        if items.is_empty() {
            return;
        }
        let (results, calls) = self.exact.move_units(self.terms.algo, &items).await;
        Counters::add(&self.stats.round_trips, calls);
        for (result, lease) in results.into_iter().zip(leases) {
            match result {
                Ok(reply) => {
                    self.guard.answered(&lease.key);
                    Counters::add(&self.stats.returned, reply.units);
                }
                // The units stay counted: under-admission, never over-admission.
                Err(error) if error.is_transient() => {
                    self.guard.transient_failure(&error, &lease.key);
                }
                Err(error) => tracing::warn!(%error, "lease return failed"),
            }
        }
    }
}

/// The refill task: sends every refill asked for since its last batch at once (one script
/// call per Cluster slot), so that refills of many keys due together cost few round trips;
/// requests that arrive while a batch is in flight make the next batch.
async fn refills<C: RedisConnection>(node: Arc<Node<C>>) {
    loop {
        node.wake.notified().await;
        loop {
            let batch = std::mem::take(&mut *node.queue.lock());
            if batch.is_empty() {
                break;
            }
            node.refill_batch(batch).await;
        }
    }
}

/// The sweeper: every [`period`], sweeps the node's leases and sends every return in
/// one batch (a script call per Cluster slot). It ends with the node.
async fn sweep<C: RedisConnection>(node: Weak<Node<C>>) {
    loop {
        let Some(period) = node.upgrade().map(|node| period(&node.terms)) else {
            return;
        };
        tokio::time::sleep(period).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        let now = node.clock.now();
        let mut idle_leases = Vec::new();
        let mut returns = Vec::new();
        for entry in node.leases.iter() {
            match visit(&node.terms, entry.value(), now) {
                Swept::Kept => {}
                Swept::Idle => idle_leases.push(Arc::clone(entry.value())),
                Swept::Expired { units, since } => {
                    returns.push((Arc::clone(entry.value()), units, since));
                }
            }
        }
        for lease in idle_leases {
            if lease.refill.retire_idle() {
                returns.push(node.retire(lease));
            }
        }
        // A key whose state is expected full again owes nothing: forgotten.
        node.owed.retain(|_, owed| owed.live(now));
        node.give_back(&returns).await;
    }
}

/// Empties `lease`: the units to give back and what the return needs to place them (the
/// server time of their window's last grant; for GCRA, their grant's TAT), read together
/// under the lock that installs grants (the clock too, so that no install comes between).
fn take_all(terms: &Terms, lease: &Lease, clock: &impl Clock) -> (u64, u64) {
    let mut bg = lease.bg.lock();
    let now = clock.now();
    let decay = terms.decay();
    let parked = bg.parked_units(now, decay);
    let word = lease.hot.word.empty(now_ms(now));
    if terms.window().is_some() {
        // Expired or not: the script takes back what the state still counts of the grant's
        // window (a sliding window's `prev` does). First-touch units were never granted:
        // nothing of them goes back.
        return (units_of(word).saturating_sub(bg.provisional), bg.grant_time);
    }
    let held = usable(word, now, decay).saturating_sub(bg.provisional);
    // GCRA: only the latest grant's units can go back; a parked one's, if any (the word's are
    // then void).
    let had_parked = bg.parked.take().is_some();
    let units = if had_parked { parked } else { held };
    (units, std::mem::take(&mut bg.grant_end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::redis::lease::word::MS;
    use crate::redis::RedisRule;

    /// A lease with 10 units until 100 ms, 3 of them first-touch units, its last grant at
    /// server time 42 (a window's start) ending at 99 (a GCRA grant's TAT).
    fn granted() -> Lease {
        let lease = Lease::new(b"k");
        lease.hot.word.deposit(10, false, 100);
        let mut bg = lease.bg.lock();
        (bg.provisional, bg.grant_time, bg.grant_end) = (3, 42, 99);
        drop(bg);
        lease
    }

    /// What goes back of a lease: its granted units (not the first-touch ones), with the
    /// window's grant time, or for GCRA the units still usable and the grant's TAT, or a
    /// parked grant's units in place of the word's; the lease is left empty.
    #[test]
    fn a_lease_gives_back_its_granted_units_once() {
        let clock = ManualClock::new();
        clock.set(95 * MS);
        for rule in [RedisRule::fixed_window, RedisRule::sliding_window] {
            let (terms, lease) = (Terms::thousand_a_second(rule), granted());
            assert_eq!(
                take_all(&terms, &lease, &clock),
                (7, 42),
                "{:?}",
                terms.algo
            );
            assert_eq!(units_of(lease.hot.word.load()), 0);
        }

        let gcra = Terms::thousand_a_second(RedisRule::gcra);
        let lease = granted();
        // 5 ms left at 1 ms a unit: 5 usable, less the 3 first-touch ones.
        assert_eq!(take_all(&gcra, &lease, &clock), (2, 99));
        assert_eq!(units_of(lease.hot.word.load()), 0);
        assert_eq!(take_all(&gcra, &lease, &clock), (0, 0), "once");

        let lease = granted();
        lease.bg.lock().parked = Some((4, 200));
        assert_eq!(
            take_all(&gcra, &lease, &clock),
            (4, 99),
            "the parked grant's"
        );
        assert_eq!(lease.bg.lock().parked, None);
        assert_eq!(units_of(lease.hot.word.load()), 0);
    }
}
