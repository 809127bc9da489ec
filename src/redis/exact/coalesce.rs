//! Coalesced exact checks: concurrent checks that land on one Cluster slot (the whole server
//! when it is not a Cluster) share one script call, the batch script every check already runs.
//!
//! Each slot has a *lane*. A check that finds its lane idle sends its call at once, alone, as
//! an uncoalesced check would: no timer, no added latency when idle. Checks that arrive while
//! the lane is busy queue up in arrival order; when the lane may start another call, the whole
//! queue goes to the first queued check (the *baton*), which sends it as one call (split at
//! `max_batch`), answers every check in it, and hands the lane on.
//!
//! On a single server a lane keeps up to [`PIPELINE`] calls in flight, so that the server
//! decides one batch while the next forms and goes out (with one, client and server took turns
//! and each idled half the time). Order still holds: a call may start only once the lane's
//! previous call has reached the connection (its first poll: redis-rs queues the command
//! there), a connection's commands reach the server in the order they were queued, and Redis
//! runs them in that order; the script decides the items of a call in order. So each key's
//! checks are decided in arrival order, exactly as one call per check would decide them. A
//! Cluster routes each call on its own, so there a lane keeps one call in flight.
//!
//! A server that lost its scripts (first use, restart, failover, `SCRIPT FLUSH`) answers each
//! call in flight `NOSCRIPT`. The lane then starts no call until those have returned, and each
//! is sent again (loading the script) only once the calls started before it have returned, so
//! the order holds through the reload. (Should another client load the script between two of
//! a lane's calls in flight, the later one runs first: that takes a script loss and a foreign
//! load within one round trip.)
//!
//! Only live and injected-time checks that count (`check_n`, `check_n_at`) coalesce, in
//! separate lanes (an injected time sets a TTL floor for a whole call); peeks go alone.
//!
//! Cancellation: a queued check whose caller gives up is skipped; a baton dropped before its
//! call returned (its caller gave up) frees its place in the lane, and the checks it carried
//! get a transient error, as a call that timed out would give them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use redis::cluster_routing::Slot;
use tokio::sync::{oneshot, Notify};

use super::{Item, RedisConnection, RedisLimiter};
use crate::decision::Decision;
use crate::redis::error::Error;

/// The calls a lane keeps in flight on a single server.
pub(crate) const PIPELINE: usize = 2;

/// A lane: a Cluster slot (`None` on a single server), and whether its checks carry injected
/// times.
type LaneId = (Option<Slot>, bool);

/// The busy lanes.
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<LaneId, Lane>>,
    /// The calls a lane may have in flight.
    depth: usize,
    /// Signalled when a call of a frozen lane returns.
    returned: Notify,
}

/// A busy lane.
#[derive(Default)]
struct Lane {
    /// Checks waiting for a call, in arrival order.
    queue: Vec<Waiting>,
    /// The start numbers of the calls started and not yet returned.
    in_flight: Vec<u64>,
    /// The next call's start number.
    started: u64,
    /// A call started has not reached the connection yet: none may start before it does.
    sending: bool,
    /// A call found the server without its script: none starts until those in flight return.
    frozen: bool,
}

impl Lane {
    fn may_start(&self, depth: usize) -> bool {
        !self.sending && !self.frozen && self.in_flight.len() < depth
    }

    /// Starts a call: its start number.
    fn start(&mut self) -> u64 {
        let seq = self.started;
        self.started += 1;
        self.in_flight.push(seq);
        self.sending = true;
        seq
    }

    /// The call `seq` returned (or never went out).
    fn end(&mut self, seq: u64) {
        self.in_flight.retain(|&s| s != seq);
        if self.in_flight.is_empty() {
            self.frozen = false;
        }
    }
}

/// A queued check: the item, and where its answer (or the baton) goes. `None`: the check that
/// holds the baton.
struct Waiting {
    item: Item,
    tx: Option<oneshot::Sender<Msg>>,
}

/// What a check does on arrival: lead a call of its lane now, or wait.
enum Turn {
    /// With its call's start number.
    Lead(Item, u64),
    Wait(oneshot::Receiver<Msg>),
}

enum Msg {
    Done(Result<Decision, Error>),
    Lead(Baton),
}

/// The right to send one call of a lane, with the checks it carries. It frees its place in
/// the lane when dropped (the call returned, or its caller gave up), and lets the next call
/// start once its own reached the connection.
struct Baton {
    lanes: Arc<Lanes>,
    lane: LaneId,
    /// Its call's start number.
    seq: u64,
    batch: Vec<Waiting>,
    /// Whether its call has reached the connection.
    sent: bool,
    /// Whether dropping it frees its place (not when it is being handed over).
    armed: bool,
}

impl Baton {
    /// Its call reached the connection: the lane's next call may start.
    fn mark_sent(&mut self) {
        if !self.sent {
            self.sent = true;
            let mut lanes = self.lanes.lanes.lock();
            if let Some(lane) = lanes.get_mut(&self.lane) {
                lane.sending = false;
            }
            self.lanes.hand_off(&mut lanes, self.lane);
        }
    }

    /// Freezes the lane (its call found the server without the script) and waits until every
    /// call of the lane started before this one has returned.
    async fn after_earlier_calls(&self) {
        loop {
            let returned = self.lanes.returned.notified();
            let mut returned = std::pin::pin!(returned);
            // Registered before the check, so a return between the two is not missed.
            returned.as_mut().enable();
            {
                let mut lanes = self.lanes.lanes.lock();
                let Some(lane) = lanes.get_mut(&self.lane) else {
                    return;
                };
                lane.frozen = true;
                if lane.in_flight.iter().all(|&s| s >= self.seq) {
                    return;
                }
            }
            returned.await;
        }
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        if self.armed {
            let mut lanes = self.lanes.lanes.lock();
            if let Some(lane) = lanes.get_mut(&self.lane) {
                if !self.sent {
                    lane.sending = false;
                }
                lane.end(self.seq);
                if lane.frozen {
                    self.lanes.returned.notify_waiters();
                }
            }
            self.lanes.hand_off(&mut lanes, self.lane);
        }
    }
}

impl Lanes {
    /// Lanes that keep up to `depth` calls in flight each.
    pub(crate) fn new(depth: usize) -> Lanes {
        Lanes {
            lanes: Mutex::new(HashMap::new()),
            depth: depth.max(1),
            returned: Notify::new(),
        }
    }

    /// Starts `lane`'s next call if it may (no call is on its way to the connection, the lane
    /// is not frozen, fewer than `depth` are in flight): hands the queue to its first check,
    /// skipping checks whose callers gave up. Forgets the lane once it is idle.
    fn hand_off(self: &Arc<Self>, lanes: &mut HashMap<LaneId, Lane>, id: LaneId) {
        loop {
            let Some(lane) = lanes.get_mut(&id) else {
                return;
            };
            if lane.queue.is_empty() {
                if lane.in_flight.is_empty() && !lane.sending {
                    lanes.remove(&id);
                }
                return;
            }
            if !lane.may_start(self.depth) {
                return;
            }
            let mut batch = std::mem::take(&mut lane.queue);
            let Some(tx) = batch[0].tx.take() else {
                // Never queued without a sender; treat it as gone.
                batch.remove(0);
                lane.queue = batch;
                continue;
            };
            let seq = lane.start();
            let baton = Baton {
                lanes: Arc::clone(self),
                lane: id,
                seq,
                batch,
                sent: false,
                armed: true,
            };
            match tx.send(Msg::Lead(baton)) {
                Ok(()) => return,
                Err(Msg::Lead(mut baton)) => {
                    // Its caller gave up: the next check leads, without this one.
                    baton.armed = false;
                    let mut batch = std::mem::take(&mut baton.batch);
                    batch.remove(0);
                    if let Some(lane) = lanes.get_mut(&id) {
                        lane.end(seq);
                        lane.sending = false;
                        lane.queue = batch;
                    }
                }
                Err(Msg::Done(_)) => return,
            }
        }
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// Decides `item` (a counting check), sharing a script call with the checks of its lane
    /// that arrive while the lane is busy.
    pub(super) async fn coalesced(&self, item: Item) -> Result<Decision, Error> {
        let slot = C::CLUSTERED.then(|| Slot::for_key(&item.key));
        let id = (slot, item.at.is_some());
        let Some(lanes) = &self.lanes else {
            return self.decide_one(item, true).await;
        };
        let turn = {
            let mut map = lanes.lanes.lock();
            let lane = map.entry(id).or_default();
            if lane.queue.is_empty() && lane.may_start(lanes.depth) {
                Turn::Lead(item, lane.start())
            } else {
                let (tx, rx) = oneshot::channel();
                lane.queue.push(Waiting { item, tx: Some(tx) });
                Turn::Wait(rx)
            }
        };
        let rx = match turn {
            Turn::Wait(rx) => rx,
            // The lane had room: this check is sent at once.
            Turn::Lead(item, seq) => {
                let baton = Baton {
                    lanes: Arc::clone(lanes),
                    lane: id,
                    seq,
                    batch: vec![Waiting { item, tx: None }],
                    sent: false,
                    armed: true,
                };
                return self.lead(baton).await;
            }
        };
        // Our turn comes when a call of the lane returns or reaches the connection (within
        // its timeout): the answer, or the baton for the next call (within ours). No timeout
        // of our own here: a check that gave up waiting while the server still answers in
        // time would be a spurious failure.
        match rx.await {
            Ok(Msg::Done(result)) => result,
            Ok(Msg::Lead(baton)) => self.lead(baton).await,
            // The baton that carried this check was dropped: its caller gave up.
            Err(_) => Err(self.timed_out()),
        }
    }

    /// Sends the baton's checks as one call (split at `max_batch`), answers each, then frees
    /// its place in the lane. The result of the check that holds the baton.
    async fn lead(&self, mut baton: Baton) -> Result<Decision, Error> {
        let (items, txs): (Vec<Item>, Vec<Option<oneshot::Sender<Msg>>>) =
            std::mem::take(&mut baton.batch)
                .into_iter()
                .map(|w| (w.item, w.tx))
                .unzip();
        let mut call = std::pin::pin!(self.decide(&items, true, false));
        // The first poll queues the call on the connection (every part of a split batch, in
        // order); only then may the lane's next call start.
        let mut results = std::future::poll_fn(|cx| {
            let poll = call.as_mut().poll(cx);
            baton.mark_sent();
            poll
        })
        .await;
        let lost: Vec<usize> = (0..results.len())
            .filter(|&i| matches!(&results[i], Err(e) if e.is_no_script()))
            .collect();
        if !lost.is_empty() {
            // The calls in flight before this one are sent again first (they were decided
            // first, or lost their script too).
            baton.after_earlier_calls().await;
            let again: Vec<Item> = lost.iter().map(|&i| items[i].clone()).collect();
            for (i, result) in lost.into_iter().zip(self.decide(&again, true, true).await) {
                results[i] = result;
            }
        }
        // The lane's next call goes out before anyone is answered.
        drop(baton);
        let mut own = Err(Error::bad_reply("no result for the check".into()));
        for (tx, result) in txs.into_iter().zip(results) {
            match tx {
                // A check that gave up meanwhile: nobody to tell.
                Some(tx) => drop(tx.send(Msg::Done(result))),
                None => own = result,
            }
        }
        own
    }
}
