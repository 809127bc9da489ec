//! Waiting for a place (feature `tokio`): `InFlight::acquire` and its kin, and the limit's
//! side of the waiter queue (`Places`).

use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::waiters::{Enqueued, Places, Reserved, Ticket};
use super::{Held, Idle, InFlight, InFlightPermit, OwnedInFlightPermit, NOW};
use crate::decision::LimitError;
use crate::limiter::error::WaitError;
use crate::store::table::Reserve;
use crate::store::Stored;

impl<K: Clone + Hash + Eq + Send + Sync> InFlight<K> {
    /// A permit for one unit of `key`, waiting at most `max_wait` for one to be released: the
    /// bounded wait of every limiter (see the [`wait`](crate::wait) module), with a permit
    /// where the rate limiters return a decision.
    ///
    /// Waiters are served first come, first served, and a waiter is woken only once its units
    /// are taken for it: none wakes to find nothing, and while a key has waiters a
    /// [`try_acquire`](InFlight::try_acquire) for it is refused (it would jump the queue).
    /// Dropping the future gives up its place, or, if it was served meanwhile, the units it
    /// was given, to the next waiter. The counts stay lock-free; waiting takes a lock of its
    /// own, and a release looks at it only while some caller is waiting.
    ///
    /// A key that has no place of its own ([`OverflowPolicy::Shared`](crate::OverflowPolicy),
    /// over `max_keys`) does not wait: the call answers at once, as `try_acquire` does
    /// ([`WaitError::TooLong`] if the shared count is full).
    ///
    /// # Errors
    /// [`WaitError::TooLong`] when no permit came within `max_wait` (at once for
    /// `max_wait = 0`), its `wait` being `max_wait`; [`WaitError::Limit`] at once as for
    /// [`InFlight::try_acquire`].
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::WaitError;
    /// use tollgate::InFlight;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = InFlight::<String>::new(1)?;
    /// let first = exports.acquire("alice", Duration::ZERO).await?; // free
    /// // Another export by alice waits for the first to end ...
    /// let (second, ()) = tokio::join!(exports.acquire("alice", Duration::from_secs(5)), async {
    ///     tokio::time::sleep(Duration::from_millis(10)).await;
    ///     drop(first); // ... which it does 10 ms later.
    /// });
    /// let second = second?; // the first ended within 5 s
    /// // Nothing ends within 100 ms now: the wait gives up.
    /// let late = exports.acquire("alice", Duration::from_millis(100)).await;
    /// assert!(matches!(late, Err(WaitError::TooLong { .. })));
    /// drop(second);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        max_wait: Duration,
    ) -> Result<InFlightPermit<'_, K>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_n(key, 1, max_wait).await
    }

    /// [`InFlight::acquire`] for `cost` units. A waiter that needs more units than are free
    /// waits, and so do the waiters behind it, even those that would fit (first come, first
    /// served).
    ///
    /// # Errors
    /// As for [`InFlight::acquire`]; a cost above `N` is [`WaitError::Limit`]
    /// ([`LimitError::CapacityExceeded`](crate::LimitError::CapacityExceeded)) at once.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::wait::WaitError;
    /// use tollgate::{InFlight, LimitError};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let exports = InFlight::<u64>::new(10)?;
    /// let big = exports.acquire_n(&1, 8, Duration::ZERO).await?;
    /// assert_eq!(big.remaining(), 2);
    /// let more = exports.acquire_n(&1, 3, Duration::from_millis(10)).await;
    /// assert!(matches!(more, Err(WaitError::TooLong { .. })));
    /// let never = exports.acquire_n(&1, 11, Duration::from_secs(1)).await;
    /// assert!(matches!(never, Err(WaitError::Limit(LimitError::CapacityExceeded { .. }))));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<InFlightPermit<'_, K>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let held = self.wait_for(key, cost, max_wait).await?;
        Ok(InFlightPermit { owner: self, held })
    }

    /// [`InFlight::acquire`] for a permit that owns a handle to the limit (`'static`, for a
    /// spawned task or a response body).
    ///
    /// # Errors
    /// As for [`InFlight::acquire`].
    pub async fn acquire_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
        max_wait: Duration,
    ) -> Result<OwnedInFlightPermit<K>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.acquire_n_owned(key, 1, max_wait).await
    }

    /// [`InFlight::acquire_n`] for a permit that owns a handle to the limit.
    ///
    /// # Errors
    /// As for [`InFlight::acquire_n`].
    pub async fn acquire_n_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<OwnedInFlightPermit<K>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let held = self.wait_for(key, cost, max_wait).await?;
        Ok(OwnedInFlightPermit {
            owner: Arc::clone(self),
            held,
        })
    }

    /// Units of `key`: now if free and nobody waits for them, else queued, for at most
    /// `max_wait`.
    async fn wait_for<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Held<K>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let waiting = match self.take_or_queue(key, cost, max_wait)? {
            Ok(held) => return Ok(held),
            Err(waiting) => waiting,
        };
        match tokio::time::timeout(max_wait, waiting).await {
            Ok(served) => served.map_err(|why| why.map_or(too_long(max_wait), WaitError::Limit)),
            // The waiting future was dropped: it left the queue, or gave its units back.
            Err(_elapsed) => Err(too_long(max_wait)),
        }
    }

    /// `wait_for` up to its timer: the units now if free and nobody waits for them
    /// (`Ok`), else the waiter queued for them (`Err`). `pub(crate)` for the loom model, which
    /// polls the waiter itself (tokio's timer is not modelled).
    pub(crate) fn take_or_queue<Q>(
        &self,
        key: &Q,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Result<Held<K>, Waiting<'_, K>>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(held) = self.take(key, cost)? {
            return Ok(Ok(held));
        }
        if max_wait.is_zero() {
            return Err(too_long(max_wait));
        }
        match self.waiters.enqueue(self, key, cost) {
            Enqueued::Now(Ok(held)) => Ok(Ok(held)),
            Enqueued::Now(Err(why)) => Err(why.map_or(too_long(max_wait), WaitError::Limit)),
            Enqueued::Waiting(ticket) => Ok(Err(Waiting {
                owner: self,
                ticket: Some(ticket),
            })),
        }
    }
}

/// Why a wait of at most `max_wait` gave up. An in-flight limit cannot tell when a permit comes
/// back: what it knows of the wait is that it lasted `max_wait`.
fn too_long(max_wait: Duration) -> WaitError {
    WaitError::TooLong {
        wait: max_wait,
        max_wait,
    }
}

/// A queued waiter: ready once served; dropped unserved, it leaves the queue. `pub(crate)` for
/// the loom model, which polls and drops it.
pub(crate) struct Waiting<'a, K: Clone + Hash + Eq + Send + Sync> {
    owner: &'a InFlight<K>,
    /// `None` once served.
    ticket: Option<Ticket<K, Held<K>, LimitError>>,
}

// Nothing in a waiter relies on staying in place (no field is pinned).
impl<K: Clone + Hash + Eq + Send + Sync> Unpin for Waiting<'_, K> {}

impl<K: Clone + Hash + Eq + Send + Sync> Future for Waiting<'_, K> {
    type Output = Result<Held<K>, Option<LimitError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(ticket) = &self.ticket else {
            return Poll::Ready(Err(None));
        };
        let served = self.owner.waiters.poll(self.owner, ticket, cx);
        if served.is_ready() {
            self.ticket = None;
        }
        served
    }
}

impl<K: Clone + Hash + Eq + Send + Sync> Drop for Waiting<'_, K> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            if let Some(held) = self.owner.waiters.cancel(self.owner, &ticket) {
                // Served just before giving up: the units go back, to the next waiter.
                self.owner.release(&held);
            }
        }
    }
}

impl<K: Clone + Hash + Eq + Send + Sync> Places<K> for InFlight<K> {
    type Held = Held<K>;
    type Error = LimitError;

    fn reserve(&self, key: &K, cost: u64) -> Reserved<Held<K>, LimitError> {
        // The key copied first: once the units are taken, no user code runs before they are
        // the waiter's.
        let owned = key.clone();
        // A key that waiters queue for is held (its mark keeps it from being fresh), so a
        // release serving them finds it without the table's upkeep, which runs other keys'
        // code: their panic would interrupt the service of the units the release gave back.
        // A first reservation of a key evicted since its check inserts it again.
        let decision = match self
            .table
            .check_held(key, &self.rule, || NOW, cost, Reserve)
        {
            Some(decision) => Ok(decision),
            None => self
                .table
                .check_key(key, &self.rule, || NOW, cost, &Idle(self), Reserve),
        };
        match decision {
            Err(e) => Reserved::Refused(Some(e)),
            Ok(decision) if decision.allowed() => Reserved::Taken(Held {
                key: owned,
                cost,
                decision,
            }),
            Ok(decision) if decision.charged_shared_state() => {
                // Judged on the count keys over `max_keys` share, which no release of this
                // key serves: no waiting there, and the mark the refusal left goes at once
                // (under the queue's lock, like every reservation).
                self.rule
                    .unqueuing()
                    .refund(self.table.overflow(), || NOW, 0);
                Reserved::Refused(None)
            }
            Ok(_) => Reserved::Queued,
        }
    }

    fn unqueue(&self, key: &K) {
        self.table.refund(key, &self.rule.unqueuing(), || NOW, 0);
    }
}
