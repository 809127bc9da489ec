//! tollgate's lock-free state machines, compiled from the library's own source files against
//! loom's atomics, for the models in `tests/models/`.
//!
//! Every `#[path]` module below is the very file the library compiles; only [`sync`] (loom's
//! atomics and mutex instead of std's and parking_lot's) and [`clock`] (just the time type:
//! loom cannot see quanta) are this crate's own; [`store`] is the library's minus its dashmap
//! store. The limiters (quanta), the dashmap store and the clocks are left out: loom cannot see
//! their locks or time sources.

#![forbid(unsafe_code)]

pub mod clock {
    //! The only item of tollgate's `clock` module the state machines use.

    /// Nanoseconds since a limiter's origin.
    pub type Nanos = u64;
}

pub(crate) mod sync;

#[path = "../../src/algorithm.rs"]
pub mod algorithm;
#[path = "../../src/decision.rs"]
pub mod decision;
#[path = "../../src/multi/all_or_nothing.rs"]
pub mod multi;
#[path = "../../src/quota.rs"]
pub mod quota;
#[path = "../../src/state.rs"]
pub mod state;

// The store files, included one by one and re-exported as `store`, the path they use for each
// other. The dashmap store compiles (the rules name it) but is not modelled: loom cannot see
// its locks.
#[path = "../../src/store/dashmap.rs"]
mod dashmap_store;
#[path = "../../src/store/keyed_store.rs"]
mod keyed_store;
#[path = "../../src/store/table.rs"]
mod table;
#[path = "../../src/store/word_table.rs"]
mod word_table;

pub mod store {
    //! The library's `store` module: the `KeyedStore` trait, the key table (`KeyTable`: key
    //! count, `max_keys`, overflow, eviction) written against it, and the lock-free word table
    //! over loom's atomics, mutex, `Arc` and per-thread values.

    pub use crate::dashmap_store::DashMapStore;
    pub use crate::keyed_store::KeyedStore;
    pub use crate::table::{KeyTable, OverflowPolicy};
    pub use crate::word_table::WordTable;
}

pub use algorithm::{Algorithm, FixedWindow, Gcra, LeakyQueue, SlidingLog, SlidingWindow};
pub use decision::{Decision, Error};
pub use quota::{Quota, QuotaError};
