//! Waiters for a keyed concurrency limit's places: served first come, first served, each given
//! its units before it is woken, so none wakes to find nothing.
//!
//! The limit's counts stay lock-free; waiting takes this queue's lock, and only waiting does:
//! a release looks at the queue only while some waiter is queued (one counter, read without a
//! lock), and a check never does (a key with waiters refuses checks by a mark in its own word).
//!
//! # The protocol
//! - A waiter counts itself (`queued += 1`), then, under the lock, reserves its units through
//!   the limit ([`Places::reserve`]) or joins the back of its key's queue. A refused
//!   reservation marks the key's word *and always writes it* (the rule flips a bit).
//! - A release gives its units back (a write of the key's word), then reads `queued`; if
//!   any waiter is queued it serves the key's queue under the lock: the head reserves its
//!   units; granted, it is popped and woken, and the next one tries; refused, serving stops.
//! - Both writes are read-modify-writes of one word, so one comes first. If the release's
//!   does, the waiter's reservation sees the freed units. If the waiter's does, the release's
//!   read-modify-write reads it (or a later write), acquires the waiter's release, and so sees
//!   its count: it serves. A waiter queued behind others is served by whoever serves the head.
//! - A queue that empties clears its key's mark ([`Places::unqueue`]), under the lock, so a
//!   mark never outlives its waiters and a key without them is fresh again.
//! - A waiter that gives up (its future dropped, or its time out) leaves the queue, and if it
//!   was the head the next one tries at once; a waiter granted its units just before giving up
//!   hands them back to the limit ([`Waiters::cancel`] returns them), which serves the next.
//! - A service that a panic interrupts (the key's `Clone`, `Hash` or `Eq`, as the queue is
//!   looked up or the head's units reserved) may have freed the very units the head waits
//!   for, with no release left to come: the head keeps its waker, is marked owed a service
//!   ([`Owed::Interrupted`]) and woken, and its next poll serves the queue itself. (A lookup
//!   that panicked does not tell which queue it was for: the first waiter of each is marked.)

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::task::{Context, Poll, Waker};

use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};

/// What the limit answers a waiter's reservation.
pub enum Reserved<H, E> {
    /// The units are the waiter's.
    Taken(H),
    /// Not now: the key is marked queued, and a release will serve its queue.
    Queued,
    /// Never by waiting: an error (`Some`, e.g. a full key table), or the units were judged
    /// on a count no release of this key serves (`None`: the count keys over `max_keys`
    /// share).
    Refused(Option<E>),
}

/// The limit a queue serves.
pub trait Places<K> {
    /// Units taken for a key: given back by the limit when dropped by the queue's caller.
    type Held;
    /// Why a reservation can never succeed.
    type Error;
    /// Reserves `cost` units of `key`: taken if free, even while the key is marked queued;
    /// refused, the key is marked queued (and its word written).
    fn reserve(&self, key: &K, cost: u64) -> Reserved<Self::Held, Self::Error>;
    /// Clears `key`'s queued mark: its queue has emptied.
    fn unqueue(&self, key: &K);
}

/// A waiter's place in its key's queue.
pub struct Ticket<K, H, E> {
    key: K,
    seq: u64,
    slot: Arc<Slot<H, E>>,
}

/// What a queued waiter is owed, set under the queue's lock.
struct Slot<H, E> {
    cost: u64,
    state: Mutex<Owed<H, E>>,
}

enum Owed<H, E> {
    /// Still queued; the waker to wake once served.
    Waiting(Option<Waker>),
    /// Still queued, and owed a service: one reached it and was interrupted by a panic in its
    /// reservation (module docs). Woken then; its next poll serves its key's queue.
    Interrupted(Option<Waker>),
    /// Served: the units, for the waiter to take.
    Taken(H),
    /// Served with a refusal.
    Refused(Option<E>),
    /// Handed to the waiter, or the waiter gave up (a queue that reaches it drops it).
    Done,
}

/// What [`Waiters::enqueue`] did.
pub enum Enqueued<K, H, E> {
    /// Decided at once: the units, or why never.
    Now(Result<H, Option<E>>),
    /// Queued: poll the ticket.
    Waiting(Ticket<K, H, E>),
}

struct Queues<K, H, E> {
    /// The next waiter's arrival number (its place in its key's queue).
    next: u64,
    /// Each key's waiters; a key is here while it has some (or, after a panic in its `Hash`,
    /// with an empty queue, which counts as none).
    by_key: HashMap<K, Queue<K, H, E>>,
}

/// One key's waiters, in arrival order.
struct Queue<K, H, E> {
    key: K,
    waiters: BTreeMap<u64, Arc<Slot<H, E>>>,
}

/// Every queued waiter of one limit.
pub struct Waiters<K, H, E> {
    /// Waiters counted, queued or about to be: what a release reads to know whether to look.
    queued: AtomicUsize,
    queues: Mutex<Queues<K, H, E>>,
}

impl<K: Hash + Eq + Clone, H, E> Waiters<K, H, E> {
    pub fn new() -> Self {
        Waiters {
            queued: AtomicUsize::new(0),
            queues: Mutex::new(Queues {
                next: 0,
                by_key: HashMap::new(),
            }),
        }
    }

    /// After a release's write of `key`'s word: serves the key's queue if any waiter may be
    /// queued.
    #[inline]
    pub fn released<P, Q>(&self, places: &P, key: &Q)
    where
        P: Places<K, Held = H, Error = E>,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Relaxed: the ordering comes from the key's word. This load follows the release's
        // read-modify-write of it (AcqRel), which acquired any waiter's mark-writing
        // reservation, made after that waiter's count (module docs).
        if self.queued.load(Ordering::Relaxed) > 0 {
            self.serve(places, key);
        }
    }

    /// Waits for `cost` units of `key`: reserved now if free and nobody is queued ahead, else
    /// queued behind the key's waiters.
    ///
    /// User code (the key's `Clone`, `Hash`, `Eq`) runs only before the waiter is queued: a
    /// panic leaves no waiter behind that nobody polls, nor a count that stays up.
    pub fn enqueue<P, Q>(&self, places: &P, key: &Q, cost: u64) -> Enqueued<K, H, E>
    where
        P: Places<K, Held = H, Error = E>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let key = key.to_owned();
        let (mapped, queued) = (key.clone(), key.clone());
        let counted = Counted::new(&self.queued);
        let mut queues = self.queues.lock();
        // Room first, so that the insert below rehashes no key.
        queues.by_key.reserve(1);
        let seq = queues.next;
        let slot = Arc::new(Slot {
            cost,
            state: Mutex::new(Owed::Waiting(None)),
        });
        match queues.by_key.entry(mapped) {
            // Waiters ahead: the head is refused until a release serves it, and every release
            // after its refusal sees the count (module docs), so this one just queues.
            Entry::Occupied(mut queue) if !queue.get().waiters.is_empty() => {
                queue.get_mut().waiters.insert(seq, Arc::clone(&slot));
            }
            entry => match places.reserve(&key, cost) {
                Reserved::Queued => {
                    let mut queue = Queue {
                        key: queued,
                        waiters: BTreeMap::new(),
                    };
                    queue.waiters.insert(seq, Arc::clone(&slot));
                    match entry {
                        Entry::Occupied(mut empty) => *empty.get_mut() = queue,
                        Entry::Vacant(vacant) => {
                            vacant.insert(queue);
                        }
                    }
                }
                Reserved::Taken(held) => return Enqueued::Now(Ok(held)),
                Reserved::Refused(why) => return Enqueued::Now(Err(why)),
            },
        }
        queues.next += 1;
        counted.keep();
        Enqueued::Waiting(Ticket { key, seq, slot })
    }

    /// Serves `key`'s queue: its waiters take what is free, in turn.
    fn serve<P, Q>(&self, places: &P, key: &Q)
    where
        P: Places<K, Held = H, Error = E>,
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Declared before the lock: a lookup that unwinds lets the lock go first.
        let mut owed = HeadsOwed {
            waiters: self,
            found: false,
        };
        let mut queues = self.queues.lock();
        let queue = queues.by_key.get_mut(key);
        owed.found = true;
        if let Some(queue) = queue {
            if self.serve_queue(places, queue) {
                queues.by_key.remove(key);
            }
        }
    }

    /// Clears `key`'s queued mark if no waiter is queued for it: for a check refused by a mark
    /// with the units free, which a panic in user code may have left behind (a reservation
    /// that marked the key, then failed before its waiter was queued).
    /// Whether it did (then a check may be tried again).
    pub fn heal<P, Q>(&self, places: &P, key: &Q) -> bool
    where
        P: Places<K, Held = H, Error = E>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let queues = self.queues.lock();
        let none = queues.by_key.get(key).is_none_or(|q| q.waiters.is_empty());
        if none {
            places.unqueue(&key.to_owned());
        }
        none
    }

    /// Whether `ticket`'s waiter was served; registers `cx`'s waker if not. A waiter owed a
    /// service ([`Owed::Interrupted`]) serves its key's queue first, through `places`.
    pub fn poll<P>(
        &self,
        places: &P,
        ticket: &Ticket<K, H, E>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<H, Option<E>>>
    where
        P: Places<K, Held = H, Error = E>,
    {
        loop {
            let mut owed = ticket.slot.state.lock();
            match std::mem::replace(&mut *owed, Owed::Done) {
                Owed::Waiting(waker) => {
                    let waker = match waker {
                        Some(w) if w.will_wake(cx.waker()) => w,
                        _ => cx.waker().clone(),
                    };
                    *owed = Owed::Waiting(Some(waker));
                    return Poll::Pending;
                }
                Owed::Interrupted(_) => {
                    // Queued again before the service, so that a service that is interrupted
                    // once more marks it again; the slot's lock let go, as a service takes it.
                    *owed = Owed::Waiting(Some(cx.waker().clone()));
                    drop(owed);
                    self.serve(places, &ticket.key);
                }
                Owed::Taken(held) => return Poll::Ready(Ok(held)),
                Owed::Refused(why) => return Poll::Ready(Err(why)),
                Owed::Done => return Poll::Ready(Err(None)),
            }
        }
    }

    /// `ticket`'s waiter gives up: it leaves its queue (the next waiter tries at once if it was
    /// the head), or, served meanwhile, returns the units it was given, for the caller to
    /// release.
    ///
    /// The waiter is marked as gone before its key's `Hash` or `Eq` runs: if they panic, the
    /// queue drops it when it reaches it, and reserves nothing for it.
    pub fn cancel<P>(&self, places: &P, ticket: &Ticket<K, H, E>) -> Option<H>
    where
        P: Places<K, Held = H, Error = E>,
    {
        match std::mem::replace(&mut *ticket.slot.state.lock(), Owed::Done) {
            Owed::Waiting(_) | Owed::Interrupted(_) => {}
            Owed::Taken(held) => return Some(held),
            Owed::Refused(_) | Owed::Done => return None,
        }
        // As in `serve`: the next waiter may be owed the units if this one was the head.
        let mut owed = HeadsOwed {
            waiters: self,
            found: false,
        };
        let mut queues = self.queues.lock();
        let queue = queues.by_key.get_mut(&ticket.key);
        owed.found = true;
        let queue = queue?;
        let was_head = queue.waiters.keys().next() == Some(&ticket.seq);
        // Not there: dropped by a serving release already.
        queue.waiters.remove(&ticket.seq)?;
        self.uncount();
        let emptied = if queue.waiters.is_empty() {
            places.unqueue(&queue.key);
            true
        } else {
            was_head && self.serve_queue(places, queue)
        };
        if emptied {
            queues.by_key.remove(&ticket.key);
        }
        None
    }

    /// Serves a key's queue, under the lock: the head reserves its units, and so on, until
    /// one is refused. Whether the queue emptied (its key's mark is then cleared; the caller
    /// removes the queue, after: a panic in the key's `Hash` there leaves an empty queue,
    /// which counts as none).
    fn serve_queue<P>(&self, places: &P, queue: &mut Queue<K, H, E>) -> bool
    where
        P: Places<K, Held = H, Error = E>,
    {
        while let Some(entry) = queue.waiters.first_entry() {
            let slot = Arc::clone(entry.get());
            // Held across the reservation: the waiter gives up before it (and is dropped here,
            // with nothing reserved) or after it (and is handed the units).
            let mut owed = slot.state.lock();
            let mut waker = None;
            if let Owed::Waiting(_) | Owed::Interrupted(_) = &*owed {
                // The waker stays in the slot until the answer: a reservation that panics
                // leaves the waiter to be woken.
                let mut reserving = Reserving {
                    owed: &mut owed,
                    answered: false,
                };
                let answer = places.reserve(&queue.key, slot.cost);
                reserving.answered = true;
                let served = match answer {
                    Reserved::Queued => {
                        // Refused, the key marked: a later release serves it, so an
                        // interrupted waiter is owed nothing more.
                        if let Owed::Interrupted(w) = reserving.owed {
                            *reserving.owed = Owed::Waiting(w.take());
                        }
                        return false;
                    }
                    Reserved::Taken(held) => Owed::Taken(held),
                    Reserved::Refused(why) => Owed::Refused(why),
                };
                if let Owed::Waiting(w) | Owed::Interrupted(w) =
                    std::mem::replace(reserving.owed, served)
                {
                    waker = w;
                }
            }
            drop(owed);
            entry.remove();
            self.uncount();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        places.unqueue(&queue.key);
        true
    }

    fn uncount(&self) {
        // Relaxed: a waiter leaves under the lock; what a release needs ordered is the count
        // going up (see `enqueue`).
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The head waiter's slot while its units are reserved: a reservation that unwinds (a panic in
/// its key's `Clone`, `Hash` or `Eq`) leaves it [`Owed::Interrupted`], and wakes it (under the
/// slot's lock, as unwinding holds it: a waker must not poll in `wake`), so that its next poll
/// serves the queue the panic left unserved.
struct Reserving<'a, H, E> {
    owed: &'a mut Owed<H, E>,
    answered: bool,
}

impl<H, E> Drop for Reserving<'_, H, E> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.owed.interrupt();
    }
}

/// A lookup of a key's queue for a service (a release's, or a head's leaving): if it unwinds
/// (a panic in the key's `Hash` or `Eq`), which queue it was for is not known, so the first
/// waiter still queued in each queue is owed a service ([`Owed::Interrupted`]), and woken.
struct HeadsOwed<'a, K, H, E> {
    waiters: &'a Waiters<K, H, E>,
    found: bool,
}

impl<K, H, E> Drop for HeadsOwed<'_, K, H, E> {
    fn drop(&mut self) {
        if self.found {
            return;
        }
        let queues = self.waiters.queues.lock();
        for queue in queues.by_key.values() {
            for slot in queue.waiters.values() {
                let mut owed = slot.state.lock();
                if owed.interrupt() {
                    break;
                }
            }
        }
    }
}

impl<H, E> Owed<H, E> {
    /// Marks a queued waiter owed a service, and wakes it (with the slot's lock held, as an
    /// unwinding call holds it: a waker must not poll in `wake`); whether it was queued.
    fn interrupt(&mut self) -> bool {
        let (Owed::Waiting(waker) | Owed::Interrupted(waker)) = self else {
            return false;
        };
        let waker = waker.take();
        if let Some(waker) = &waker {
            waker.wake_by_ref();
        }
        *self = Owed::Interrupted(waker);
        true
    }
}

/// A waiter counted in `queued`, uncounted again unless it is queued (also when a key's
/// `Clone`, `Hash` or `Eq` panics on the way).
struct Counted<'a> {
    queued: &'a AtomicUsize,
    kept: bool,
}

impl<'a> Counted<'a> {
    fn new(queued: &'a AtomicUsize) -> Self {
        // Counted before the reservation that may mark the key (module docs). Relaxed: that
        // reservation's write, after this in the same thread, is what publishes it.
        queued.fetch_add(1, Ordering::Relaxed);
        Counted {
            queued,
            kept: false,
        }
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if !self.kept {
            // Relaxed: as `Waiters::uncount`.
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The waiter count (`Waiters::queued`) on a limit of one key, by hand.

    use std::cell::Cell;
    use std::task::{Context, Poll, Waker};

    use super::{Enqueued, Ordering, Places, Reserved, Waiters};

    /// One key's free units: a cost above 10 is refused for good, a cost above the free
    /// units marks the key queued.
    struct Free {
        free: Cell<u64>,
        marked: Cell<bool>,
    }

    impl Places<u64> for Free {
        type Held = u64;
        type Error = ();

        fn reserve(&self, _: &u64, cost: u64) -> Reserved<u64, ()> {
            if cost > 10 {
                Reserved::Refused(None)
            } else if cost <= self.free.get() {
                self.free.set(self.free.get() - cost);
                Reserved::Taken(cost)
            } else {
                self.marked.set(true);
                Reserved::Queued
            }
        }

        fn unqueue(&self, _: &u64) {
            self.marked.set(false);
        }
    }

    fn counted(waiters: &Waiters<u64, u64, ()>) -> usize {
        waiters.queued.load(Ordering::Relaxed)
    }

    /// A waiter answered at once (units taken, or refused for good) is uncounted as it
    /// returns, and a queued one once a release serves it: with nobody left waiting, a
    /// release does not look at the queue.
    #[test]
    fn waiters_answered_at_once_leave_the_count_at_zero() {
        let places = Free {
            free: Cell::new(2),
            marked: Cell::new(false),
        };
        let waiters = Waiters::new();
        assert!(matches!(
            waiters.enqueue(&places, &7, 2),
            Enqueued::Now(Ok(2))
        ));
        assert_eq!(counted(&waiters), 0, "taken at once");
        assert!(matches!(
            waiters.enqueue(&places, &7, 11),
            Enqueued::Now(Err(None))
        ));
        assert_eq!(counted(&waiters), 0, "refused at once");
        // None free: queued, and counted until served.
        let Enqueued::Waiting(ticket) = waiters.enqueue(&places, &7, 1) else {
            panic!("no units free: the waiter queues");
        };
        assert_eq!(counted(&waiters), 1);
        assert!(places.marked.get());
        places.free.set(2);
        waiters.released(&places, &7);
        assert_eq!(counted(&waiters), 0, "served");
        assert!(!places.marked.get());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            waiters.poll(&places, &ticket, &mut cx),
            Poll::Ready(Ok(1))
        ));
        // Taken at once again, with the key's queue gone.
        assert!(matches!(
            waiters.enqueue(&places, &7, 1),
            Enqueued::Now(Ok(1))
        ));
        assert_eq!(counted(&waiters), 0);
    }
}
