//! tollgate's lock-free state machines, compiled from the library's own source files against
//! loom's atomics, for the models in `tests/models/`.
//!
//! Every `#[path]` module below is the very file the library compiles; only [`sync`] (loom's
//! atomics and mutex instead of std's and parking_lot's, and a fixed hasher for the rules'
//! stores) is this crate's own; [`clock`] is the library's time type and `Clock` trait without
//! the clocks, [`limiter`] the limiters' `Engine` without the rate limiters, [`in_flight`] the
//! library's `InFlight` whole (with its waiter queue), [`store`] the library's stores minus
//! dashmap. The clocks (quanta), the dashmap store and the rate limiter types around `Engine`
//! are left out: loom cannot see their locks or time sources.

#![deny(unsafe_code)]

/// tollgate's time type and `Clock` trait (the clocks themselves read quanta or std time,
/// which loom cannot see; models bring a clock of their own).
#[path = "../../src/clock/time.rs"]
pub mod clock;

pub(crate) mod sync;
pub use sync::{keep_per_thread_values, locks_survive_panics};

#[path = "../../src/algorithm.rs"]
pub mod algorithm;
/// The one-word rules' pure functions (crate-private in the library), for the models.
pub use algorithm::rule::WordRule;
/// The guarded limiter's circuit breaker (`src/redis/guard/breaker.rs`): opened by a run of
/// transient failures, closed by a probe Redis answers, each move reported once.
#[path = "../../src/redis/guard/breaker.rs"]
pub mod breaker;
#[path = "../../src/decision.rs"]
pub mod decision;
/// A lease's refill state (`src/redis/lease/refill.rs`): one refill in flight per key, and
/// none once the lease is retired.
#[path = "../../src/redis/lease/refill.rs"]
pub mod lease_refill;
/// The leased tier's route (`src/redis/lease/route.rs`): leases, a one-time handover, the
/// failure policy.
#[path = "../../src/redis/lease/route.rs"]
pub mod lease_route;
/// The leased tier's lease word (`src/redis/lease/word.rs`): every unit a grant deposits leaves
/// it exactly once (`take`, `take_up_to`, `empty`, `expire`).
#[path = "../../src/redis/lease/word.rs"]
pub mod lease_word;
// The limiter files, included one by one and re-exported as `limiter`, the path they use for
// each other. `in_flight.rs` names its errors `super::error`: both sit at the root here.
#[path = "../../src/limiter/engine.rs"]
mod engine;
#[path = "../../src/limiter/error.rs"]
mod error;
#[path = "../../src/limiter/in_flight.rs"]
mod in_flight_limit;

pub mod limiter {
    //! `Engine` (`src/limiter/engine.rs`): the rule in force, the clock, and the sweep-then-rebase
    //! protocol of the window counters; the limiters' errors (`src/limiter/error.rs`).

    pub use crate::engine::*;
    pub(crate) use crate::error;
    pub use crate::error::{InFlightBoundError, WaitError};
}

pub mod in_flight {
    //! `InFlight` (`src/limiter/in_flight.rs`, with its waiter queue and `acquire`'s glue from
    //! `src/limiter/in_flight/{waiters,wait}.rs`): the library's own code, driven by the models
    //! through its public calls, and through [`acquire_n`] where `InFlight::acquire_n` would
    //! wait on tokio's timer (not modelled).

    use std::future::Future;
    use std::hash::Hash;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use crate::in_flight_limit::wait::Waiting;
    use crate::in_flight_limit::waiters::{Places, Reserved};
    pub use crate::in_flight_limit::{InFlight, InFlightPermit, OwnedInFlightPermit};
    use crate::{LimitError, WaitError};

    /// What [`acquire_n`] got.
    pub enum Acquired<'a, K: Clone + Hash + Eq + Send + Sync> {
        /// A permit at once: the units were free and nobody waited for them.
        Now(InFlightPermit<'a, K>),
        /// Queued: a permit once a release serves the waiter.
        Queued(Waiter<'a, K>),
    }

    /// `limit.acquire_n(key, cost, max_wait)` up to its timer (`InFlight::take_or_queue`,
    /// which `acquire_n` awaits under `tokio::time::timeout`): a permit now, or the queued
    /// waiter, which the model polls or drops (giving up) itself.
    ///
    /// # Errors
    /// As `InFlight::acquire_n` at once: `WaitError::TooLong` for a key over `max_keys` whose
    /// shared count is full, `WaitError::Limit` for a cost above `N` or a full table.
    pub fn acquire_n<'a, K: Clone + Hash + Eq + Send + Sync>(
        limit: &'a InFlight<K>,
        key: &K,
        cost: u64,
    ) -> Result<Acquired<'a, K>, WaitError> {
        // Any wait but zero (which answers at once): it is never timed here.
        let max_wait = Duration::from_secs(3600);
        Ok(match limit.take_or_queue(key, cost, max_wait)? {
            Ok(held) => Acquired::Now(InFlightPermit { owner: limit, held }),
            Err(waiting) => Acquired::Queued(Waiter {
                owner: limit,
                waiting,
            }),
        })
    }

    /// `InFlight::acquire_n`'s queued waiter (the library's `Waiting` future): ready with a
    /// permit once served; dropped, it gives up its place, or the units it was served.
    pub struct Waiter<'a, K: Clone + Hash + Eq + Send + Sync> {
        owner: &'a InFlight<K>,
        waiting: Waiting<'a, K>,
    }

    impl<'a, K: Clone + Hash + Eq + Send + Sync> Future for Waiter<'a, K> {
        type Output = Result<InFlightPermit<'a, K>, Option<LimitError>>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let owner = self.owner;
            Pin::new(&mut self.waiting)
                .poll(cx)
                .map(|served| served.map(|held| InFlightPermit { owner, held }))
        }
    }

    /// Leaves `key` marked queued with no waiter behind the mark: what a reservation that
    /// marked it leaves when its waiter's key panics before it is queued (loom cannot run
    /// that panic: its mutex poisons).
    pub fn leave_mark<K: Clone + Hash + Eq + Send + Sync>(limit: &InFlight<K>, key: &K) {
        assert!(
            matches!(limit.reserve(key, 1), Reserved::Queued),
            "a held key's reservation is refused and marks it"
        );
    }
}
#[path = "../../src/multi/all_or_nothing.rs"]
pub mod multi;
#[path = "../../src/quota.rs"]
pub mod quota;
#[path = "../../src/state.rs"]
pub mod state;

// The store files, included one by one and re-exported as `store`, the path they use for each
// other. The dashmap store compiles (the rules name it) but is not modelled: loom cannot see
// its locks.
#[path = "../../src/store/cell.rs"]
mod cell;
#[path = "../../src/store/dashmap.rs"]
mod dashmap_store;
#[path = "../../src/store/keyed_store.rs"]
mod keyed_store;
#[path = "../../src/store/stored.rs"]
mod stored;
#[path = "../../src/store/table.rs"]
mod table;
// Under loom every lookup helps release a retired table (`HELP_EVERY` is 1): `n % 1`; and
// `is_multiple_of` is newer than the library's MSRV (1.85).
#[allow(clippy::modulo_one, clippy::manual_is_multiple_of)]
#[path = "../../src/store/word_table.rs"]
mod word_table;

pub mod store {
    //! The library's `store` module: the `StoreProtocol` trait, the key table (`KeyTable`: key
    //! count, `max_keys`, overflow, eviction) written against it, and the lock-free word table
    //! over loom's atomics, mutex, `Arc` and per-thread values.

    pub(crate) use crate::cell;
    pub use crate::cell::TableCell;
    pub use crate::dashmap_store::DashMapStore;
    pub use crate::keyed_store::{Carry, Evictor, Inserted, KeyedStore, StoreProtocol};
    pub use crate::stored::Stored;
    pub(crate) use crate::table;
    pub use crate::table::{Check, KeyTable, OverflowPolicy, Reserve};
    pub use crate::word_table::WordTable;

    /// A word table whose drains visit `slots` slots a call (`DRAIN_STEP` in the library): a
    /// model's 8-slot tables then drain over several calls.
    pub fn with_drain_step<K, H>(mut store: WordTable<K, H>, slots: usize) -> WordTable<K, H>
    where
        K: Clone + std::hash::Hash + Eq + Send + Sync,
        H: std::hash::BuildHasher,
    {
        store.set_drain_step_for_model(slots);
        store
    }

    /// An empty word table of cells marked retired by `marks`, hashing with `hasher`
    /// (`WordTable::new`, crate-private in the library).
    pub fn word_table<K: Send + Sync, H, C: TableCell>(
        marks: C::Marks,
        hasher: H,
    ) -> WordTable<K, H, C> {
        WordTable::new(marks, hasher)
    }

    /// A word table whose lookups let the model's other threads run between fetching a table
    /// and probing it (see `model_yield` in `sync.rs`).
    pub fn yielding_after_fetch<K, H, C>(mut store: WordTable<K, H, C>) -> WordTable<K, H, C>
    where
        K: Clone + std::hash::Hash + Eq + Send + Sync,
        H: std::hash::BuildHasher,
        C: TableCell,
    {
        store.yield_after_fetch_for_model();
        store
    }

    /// Chains the table of `key`'s shard if a drain runs there (`WordTable::chain`, which an
    /// insert reaches only when a table's size was estimated too low); returns the shard's
    /// drains.
    pub fn chain<K, H>(store: &WordTable<K, H>, key: &K) -> usize
    where
        K: Clone + std::hash::Hash + Eq + Send + Sync,
        H: std::hash::BuildHasher,
    {
        store.chain_for_model(key)
    }

    /// Spares the store's shards reused as their next table.
    pub fn spares_reused<K: Send + Sync, H>(store: &WordTable<K, H>) -> usize {
        store.spares_reused()
    }

    /// Slots of the store's retired tables not released yet (a table a thread still caches is
    /// never released).
    pub fn retired_slots<K: Send + Sync, H>(store: &WordTable<K, H>) -> usize {
        store.retired_slots()
    }

    /// Checks each shard's counts against its tables (`WordTable::audit`: `used`, each drain's
    /// `left`, `live`), with no call running; panics on a mismatch.
    pub fn audit<K: Send + Sync, H>(store: &WordTable<K, H>) {
        store.audit();
    }

    /// Tables the store's shards began building ahead and freed unused (a table that filled
    /// before its next one was built: the build is abandoned and its slots freed).
    pub fn builds_abandoned<K: Send + Sync, H>(store: &WordTable<K, H>) -> usize {
        store.built_unused()
    }
}

pub use algorithm::{FixedWindow, Gcra, LeakyQueue, Rule, SlidingLog, SlidingWindow};
pub use decision::{Decision, LimitError};
pub use error::WaitError;
pub use quota::{Quota, QuotaError};
pub use store::Stored;
