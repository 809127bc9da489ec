//! Coalesced exact checks: concurrent checks that land on one Cluster slot (the whole server
//! when it is not a Cluster) share one script call, the batch script every check already runs.
//!
//! Each slot has a *lane*. A check that finds its lane idle sends its call at once, alone, as
//! an uncoalesced check would: no timer, no added latency when idle. Checks that arrive while
//! that call is in flight queue up in arrival order; when it returns, its sender hands the
//! whole queue to the first queued check (the *baton*), which sends it as one call (split at
//! `max_batch`), answers every check in it, and hands the next queue on. The script decides the
//! items of a call in order, and calls of one lane never overlap, so each key's checks are
//! decided in arrival order, exactly as one call per check would decide them.
//!
//! Only live and injected-time checks that count (`check_n`, `check_n_at`) coalesce, in
//! separate lanes (an injected time sets a TTL floor for a whole call); peeks go alone.
//!
//! Cancellation: a queued check whose caller gives up is skipped; a baton dropped before its
//! call returned (its caller gave up) passes the lane on, and the checks it carried get a
//! transient error, as a call that timed out would give them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use redis::cluster_routing::Slot;
use tokio::sync::oneshot;

use super::{Item, RedisConnection, RedisLimiter};
use crate::decision::Decision;
use crate::redis::error::Error;

/// A lane: a Cluster slot (`None` on a single server), and whether its checks carry injected
/// times.
type LaneId = (Option<Slot>, bool);

/// The lanes with a call in flight, and the checks queued behind each.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<LaneId, Vec<Waiting>>>,
}

/// A queued check: the item, and where its answer (or the baton) goes. `None`: the check that
/// holds the baton.
struct Waiting {
    item: Item,
    tx: Option<oneshot::Sender<Msg>>,
}

/// What a check does on arrival: lead its lane's next call, or wait behind the call in flight.
enum Turn {
    Lead(Item),
    Wait(oneshot::Receiver<Msg>),
}

enum Msg {
    Done(Result<Decision, Error>),
    Lead(Baton),
}

/// The right to send a lane's next call, with the checks it carries. Dropped, it hands the
/// lane on to the first check queued since (or leaves the lane idle).
struct Baton {
    lanes: Arc<Lanes>,
    lane: LaneId,
    batch: Vec<Waiting>,
    /// Whether dropping it passes the lane on (not when it is being handed over).
    armed: bool,
}

impl Drop for Baton {
    fn drop(&mut self) {
        if self.armed {
            self.lanes.pass(self.lane);
        }
    }
}

impl Lanes {
    /// Hands `lane` to the first check queued behind the call that just ended, skipping checks
    /// whose callers gave up; marks the lane idle if none is left.
    fn pass(self: &Arc<Self>, lane: LaneId) {
        let mut lanes = self.lanes.lock();
        loop {
            let Some(queue) = lanes.get_mut(&lane) else {
                return;
            };
            if queue.is_empty() {
                lanes.remove(&lane);
                return;
            }
            let mut batch = std::mem::take(queue);
            let Some(tx) = batch[0].tx.take() else {
                // Never queued without a sender; treat it as gone.
                batch.remove(0);
                *queue = batch;
                continue;
            };
            let baton = Baton {
                lanes: Arc::clone(self),
                lane,
                batch,
                armed: true,
            };
            match tx.send(Msg::Lead(baton)) {
                Ok(()) => return,
                Err(Msg::Lead(mut baton)) => {
                    // Its caller gave up: the next check leads, without this one.
                    baton.armed = false;
                    let mut batch = std::mem::take(&mut baton.batch);
                    batch.remove(0);
                    if let Some(queue) = lanes.get_mut(&lane) {
                        *queue = batch;
                    }
                }
                Err(Msg::Done(_)) => return,
            }
        }
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// Decides `item` (a counting check), sharing a script call with the checks of its lane
    /// that arrive while another call of the lane is in flight.
    pub(super) async fn coalesced(&self, item: Item) -> Result<Decision, Error> {
        let slot = C::CLUSTERED.then(|| Slot::for_key(&item.key));
        let lane = (slot, item.at.is_some());
        let Some(lanes) = &self.lanes else {
            return self.decide_one(item, true).await;
        };
        let turn = {
            let mut map = lanes.lanes.lock();
            match map.get_mut(&lane) {
                Some(queue) => {
                    let (tx, rx) = oneshot::channel();
                    queue.push(Waiting { item, tx: Some(tx) });
                    Turn::Wait(rx)
                }
                None => {
                    map.insert(lane, Vec::new());
                    Turn::Lead(item)
                }
            }
        };
        let rx = match turn {
            Turn::Wait(rx) => rx,
            // The lane was idle: this check is sent at once.
            Turn::Lead(item) => {
                let baton = Baton {
                    lanes: Arc::clone(lanes),
                    lane,
                    batch: vec![Waiting { item, tx: None }],
                    armed: true,
                };
                return self.lead(baton).await;
            }
        };
        // Our turn comes when the call in flight returns (within its timeout): the answer, or
        // the baton for the next call (within ours). No timeout of our own here: a check that
        // gave up waiting while the server still answers in time would be a spurious failure.
        match rx.await {
            Ok(Msg::Done(result)) => result,
            Ok(Msg::Lead(baton)) => self.lead(baton).await,
            // The baton that carried this check was dropped: its caller gave up.
            Err(_) => Err(self.timed_out()),
        }
    }

    /// Sends the baton's checks as one call (split at `max_batch`), answers each, then passes
    /// the lane on. The result of the check that holds the baton.
    async fn lead(&self, mut baton: Baton) -> Result<Decision, Error> {
        let (items, txs): (Vec<Item>, Vec<Option<oneshot::Sender<Msg>>>) =
            std::mem::take(&mut baton.batch)
                .into_iter()
                .map(|w| (w.item, w.tx))
                .unzip();
        let results = self.decide(items, true).await;
        // The next call of the lane goes out before anyone is answered.
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
