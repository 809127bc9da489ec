//! Coalesced exact checks: concurrent checks that land on one Cluster slot (the whole server
//! when it is not a Cluster) share one script call, the batch script every check already runs.
//!
//! Each slot has a *lane*. A check that finds its lane idle has its call sent at once, alone,
//! as an uncoalesced check would: no timer. Checks that arrive while the lane is busy queue up
//! in arrival order; when the lane may start another call, the whole queue becomes one call
//! (split at `max_batch`; the *baton*), which a task of its own sends, answers every check in
//! it from, and hands the lane on. No caller's future holds any of the lane's state: each
//! check only waits for its answer.
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
//! the order holds through the reload. A call started but not yet on the connection when that
//! happens (its task not yet polled) is held back the same way: whether to hold it back and
//! putting it on the connection happen under one lock, with no reload between them. (Should another client load the script between two of
//! a lane's calls in flight, the later one runs first: that takes a script loss and a foreign
//! load within one round trip.)
//!
//! Only live and injected-time checks that count (`check_n`, `check_n_at`) coalesce, in
//! separate lanes (an injected time sets a TTL floor for a whole call); peeks go alone.
//!
//! Cancellation is the caller's own: a check whose caller gave up before its call was formed
//! is not sent; one given up after is decided (and charged) as if it had been waited for, and
//! its answer dropped. Nobody else's check fails, waits or is charged for it, and the lane
//! goes on, since a call runs on its own task whatever its callers do. Every wait is bounded:
//! a check answers within [`Lanes::deadline`] (its call and the calls ahead of it, each within
//! the limiter's timeout), or fails with [`TierError::Timeout`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use parking_lot::Mutex;
use redis::cluster_routing::Slot;
use tokio::sync::{oneshot, Notify};

use super::{Item, RedisConnection, RedisLimiter};
use crate::decision::Decision;
use crate::redis::error::TierError;

/// The calls a lane keeps in flight on a single server.
pub(crate) const PIPELINE: usize = 2;

/// A lane: a Cluster slot (`None` on a single server), and whether its checks carry injected
/// times.
type LaneId = (Option<Slot>, bool);

/// Sends a baton's call on a task of its own.
type Spawner = dyn Fn(Baton) + Send + Sync;

/// The busy lanes.
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<LaneId, Lane>>,
    /// The calls a lane may have in flight.
    depth: usize,
    /// Signalled when a call of a frozen lane returns.
    returned: Notify,
    /// Starts a call: set once, when the limiter is built (it holds a copy of the limiter
    /// without lanes, so that no cycle keeps either alive).
    spawner: OnceLock<Box<Spawner>>,
    /// The longest a check waits for its answer.
    deadline: Duration,
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

/// A queued check: the item, and where its answer goes.
struct Waiting {
    item: Item,
    tx: oneshot::Sender<Result<Decision, TierError>>,
}

/// One call of a lane, with the checks it carries. It frees its place in the lane when
/// dropped (its call returned, or its task ended), and lets the next call start once its own
/// reached the connection.
pub(crate) struct Baton {
    lanes: Arc<Lanes>,
    lane: LaneId,
    /// Its call's start number.
    seq: u64,
    batch: Vec<Waiting>,
    /// Whether its call has reached the connection.
    sent: bool,
}

impl Baton {
    /// Puts its call on the connection (the call's first poll queues it there), then lets the
    /// lane's next call start. Held back while the lane is frozen and a call started before
    /// it is still out: those are sent again (reloading the script) first. Whether to hold
    /// back and the queuing are done under the lanes' lock, so no reload comes between them:
    /// a call queued first runs before the reload (finding the script lost, it is sent again
    /// in its turn), one held back runs after it.
    async fn send<F: Future>(&mut self, mut call: Pin<&mut F>) -> F::Output {
        loop {
            let returned = self.lanes.returned.notified();
            let mut returned = std::pin::pin!(returned);
            // Registered before the check, so a return between the two is not missed.
            returned.as_mut().enable();
            let first = std::future::poll_fn(|cx| {
                let (poll, next) = {
                    let mut lanes = self.lanes.lanes.lock();
                    if let Some(lane) = lanes.get_mut(&self.lane) {
                        if lane.frozen && lane.in_flight.iter().any(|&s| s < self.seq) {
                            return Poll::Ready(None);
                        }
                        lane.sending = false;
                    }
                    let poll = call.as_mut().poll(cx);
                    self.sent = true;
                    (poll, self.lanes.hand_off(&mut lanes, self.lane))
                };
                self.lanes.start(next);
                Poll::Ready(Some(poll))
            })
            .await;
            match first {
                None => returned.await,
                Some(Poll::Ready(output)) => return output,
                Some(Poll::Pending) => return call.await,
            }
        }
    }

    /// Freezes the lane (its call found the server without the script) and waits until every
    /// call of the lane started before this one has returned (each within its timeout).
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
        let next = {
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
            self.lanes.hand_off(&mut lanes, self.lane)
        };
        self.lanes.start(next);
        // Checks never answered (the task ended early): their waiters see the sender dropped.
    }
}

impl Lanes {
    /// Lanes that keep up to `depth` calls in flight each, for a limiter whose calls time out
    /// after `timeout`.
    pub(crate) fn new(depth: usize, timeout: Duration) -> Lanes {
        let depth = depth.max(1);
        Lanes {
            lanes: Mutex::new(HashMap::new()),
            depth,
            returned: Notify::new(),
            spawner: OnceLock::new(),
            deadline: Self::deadline(depth, timeout),
        }
    }

    /// The longest a check waits: the calls a lane keeps in flight ahead of its own, and its
    /// own call twice (sent again after a script reload), each within `timeout`.
    pub(crate) fn deadline(depth: usize, timeout: Duration) -> Duration {
        let calls = u32::try_from(depth).unwrap_or(u32::MAX).saturating_add(2);
        timeout.saturating_mul(calls)
    }

    /// Sets how calls are sent (once; later calls change nothing).
    pub(crate) fn set_spawner(&self, spawner: Box<Spawner>) {
        let _ = self.spawner.set(spawner);
    }

    /// Sends `baton`'s call on a task of its own. Without a tokio runtime to spawn it on, the
    /// checks it carries fail at once (a transient error), rather than wait for nothing.
    fn start(&self, baton: Option<Baton>) {
        let Some(baton) = baton else {
            return;
        };
        match self.spawner.get() {
            Some(spawn) if tokio::runtime::Handle::try_current().is_ok() => spawn(baton),
            _ => {
                let mut baton = baton;
                for waiting in std::mem::take(&mut baton.batch) {
                    let error = TierError::Timeout {
                        timeout: Duration::ZERO,
                    };
                    let _ = waiting.tx.send(Err(error));
                }
            }
        }
    }

    /// `lane`'s next call if it may start one (no call is on its way to the connection, the
    /// lane is not frozen, fewer than `depth` are in flight): the queue, without the checks
    /// whose callers gave up (they are not sent). Forgets the lane once it is idle. The
    /// caller starts the call with [`Lanes::start`] once it released the lanes' lock (a
    /// baton dropped under it would take the lock again).
    fn hand_off(self: &Arc<Self>, lanes: &mut HashMap<LaneId, Lane>, id: LaneId) -> Option<Baton> {
        let lane = lanes.get_mut(&id)?;
        lane.queue.retain(|waiting| !waiting.tx.is_closed());
        if lane.queue.is_empty() {
            if lane.in_flight.is_empty() && !lane.sending {
                lanes.remove(&id);
            }
            return None;
        }
        if !lane.may_start(self.depth) {
            return None;
        }
        let batch = std::mem::take(&mut lane.queue);
        let seq = lane.start();
        Some(Baton {
            lanes: Arc::clone(self),
            lane: id,
            seq,
            batch,
            sent: false,
        })
    }
}

impl<C: RedisConnection> RedisLimiter<C> {
    /// Decides `item` (a counting check), sharing a script call with the checks of its lane
    /// that arrive while the lane is busy.
    pub(super) async fn coalesced(&self, item: Item) -> Result<Decision, TierError> {
        let slot = C::CLUSTERED.then(|| Slot::for_key(&item.key));
        let id = (slot, item.at.is_some());
        let Some(lanes) = &self.lanes else {
            return self.decide_one(item, true).await;
        };
        let (tx, rx) = oneshot::channel();
        let call = {
            let mut map = lanes.lanes.lock();
            map.entry(id).or_default().queue.push(Waiting { item, tx });
            lanes.hand_off(&mut map, id)
        };
        lanes.start(call);
        // The answer comes from the call that carries this check, on its own task, within the
        // deadline: the calls ahead of it and its own, each within the limiter's timeout.
        match tokio::time::timeout(lanes.deadline, rx).await {
            Ok(Ok(result)) => result,
            // The call's task ended without an answer (its runtime shut down).
            Ok(Err(_)) => Err(self.timed_out()),
            Err(_) => Err(TierError::Timeout {
                timeout: lanes.deadline,
            }),
        }
    }

    /// Sends the baton's checks as one call (split at `max_batch`), then frees its place in
    /// the lane and answers each check. Runs on a task of its own.
    pub(super) async fn lead(&self, mut baton: Baton) {
        let (items, txs): (Vec<Item>, Vec<oneshot::Sender<Result<Decision, TierError>>>) =
            std::mem::take(&mut baton.batch)
                .into_iter()
                .map(|w| (w.item, w.tx))
                .unzip();
        let call = std::pin::pin!(self.call_items(&items, true, false));
        let mut results = baton.send(call).await;
        let lost: Vec<usize> = (0..results.len())
            .filter(|&i| matches!(&results[i], Err(e) if e.is_no_script()))
            .collect();
        if !lost.is_empty() {
            // The calls in flight before this one are sent again first (they were decided
            // first, or lost their script too).
            baton.after_earlier_calls().await;
            let again: Vec<Item> = lost.iter().map(|&i| items[i].clone()).collect();
            for (i, result) in lost
                .into_iter()
                .zip(self.call_items(&again, true, true).await)
            {
                results[i] = result;
            }
        }
        // The lane's next call goes out before anyone is answered.
        drop(baton);
        for (tx, result) in txs.into_iter().zip(results) {
            // A check that gave up meanwhile: nobody to tell.
            let _ = tx.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Waker};

    use super::*;

    const LANE: LaneId = (None, false);

    /// Starts a call of `LANE`, as `hand_off` does.
    fn started(lanes: &Arc<Lanes>) -> Baton {
        let seq = lanes.lanes.lock().entry(LANE).or_default().start();
        Baton {
            lanes: Arc::clone(lanes),
            lane: LANE,
            seq,
            batch: Vec::new(),
            sent: false,
        }
    }

    /// A call whose task is polled only after an earlier call came back `NOSCRIPT` is not put
    /// on the connection before that call's reload returned: sent earlier, it would run
    /// before the reload (the earlier call sent again as `EVAL`), ahead of the earlier checks.
    #[test]
    fn a_call_not_yet_sent_waits_for_an_earlier_calls_reload() {
        let lanes = Arc::new(Lanes::new(PIPELINE, Duration::from_secs(1)));
        let mut cx = Context::from_waker(Waker::noop());
        let polls = AtomicUsize::new(0);
        let call = || {
            std::future::poll_fn(|_| {
                polls.fetch_add(1, Ordering::Relaxed);
                Poll::Ready(())
            })
        };
        let mut first = started(&lanes);
        assert!(std::pin::pin!(first.send(std::pin::pin!(call())))
            .poll(&mut cx)
            .is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        // The next call starts; its task has not run yet when the first comes back NOSCRIPT.
        let mut second = started(&lanes);
        assert!(std::pin::pin!(first.after_earlier_calls())
            .poll(&mut cx)
            .is_ready());
        let held = std::pin::pin!(call());
        let mut send = std::pin::pin!(second.send(held));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 1, "held back");
        // The first call's reload returned.
        drop(first);
        assert!(send.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    /// A call on an unfrozen lane goes out at its first poll, and the lane's next call may
    /// start at once.
    #[test]
    fn a_call_goes_out_at_its_first_poll() {
        let lanes = Arc::new(Lanes::new(PIPELINE, Duration::from_secs(1)));
        let mut cx = Context::from_waker(Waker::noop());
        let mut first = started(&lanes);
        let call = std::pin::pin!(std::future::poll_fn(|_| Poll::<()>::Pending));
        let mut send = std::pin::pin!(first.send(call));
        assert!(send.as_mut().poll(&mut cx).is_pending());
        let lane = |lanes: &Lanes| {
            let map = lanes.lanes.lock();
            let lane = &map[&LANE];
            lane.may_start(lanes.depth)
        };
        assert!(lane(&lanes), "the next call may start");
    }
}
