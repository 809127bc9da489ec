//! Keyed stores: where a keyed limiter keeps one state cell per key.
//!
//! The limiter talks to a store only through the crate's store protocol (sealed by
//! [`KeyedStore`]), so a faster table can replace the dashmap one without touching the
//! algorithms. What a keyed limiter does *around* the store (counting keys, the `max_keys`
//! bound, the sweeps of a store that does not evict on its own) is `table.rs`, written against
//! that protocol and `crate::sync` only, so that `loom-tests` can model-check it.
//!
//! ```
//! use tollgate::{store::DashMapStore, Gcra, KeyedLimiter, Quota};
//! let rule = Gcra::new(Quota::per_second(5)?)?;
//! // The default store (the lock-free word table), and the dashmap one: the same decisions.
//! let default = KeyedLimiter::<u64, _>::new(rule);
//! let dashmap = KeyedLimiter::<u64, _>::builder(rule).build_with_store(DashMapStore::new())?;
//! assert_eq!(default.check(&1).unwrap().remaining(), dashmap.check(&1).unwrap().remaining());
//! # Ok::<(), tollgate::QuotaError>(())
//! ```

// Explicit paths: `loom-tests` includes `keyed_store.rs` and `table.rs` with `#[path]` (without
// dashmap); see `algorithm.rs` for why undecorated children would not resolve there.
#[path = "store/cell.rs"]
pub(crate) mod cell;
#[path = "store/dashmap.rs"]
mod dashmap;
#[path = "store/keyed_store.rs"]
mod keyed_store;
#[path = "store/stored.rs"]
mod stored;
#[path = "store/table.rs"]
pub(crate) mod table;
#[path = "store/word_table.rs"]
pub(crate) mod word_table;
#[cfg(test)]
#[path = "store/word_table_tests.rs"]
mod word_table_tests;

pub use self::dashmap::DashMapStore;
pub(crate) use self::keyed_store::Evictor;
pub use self::keyed_store::KeyedStore;
#[cfg(test)]
pub(crate) use self::keyed_store::{KeepAll, StoreProtocol};
pub(crate) use self::stored::Stored;
#[cfg(test)]
pub(crate) use self::stored::{TAT_MARKS, WINDOW_MARKS};
pub use self::word_table::DEFAULT_EVICT_ABOVE;

/// The cell a rule's per-key state is stored in: what a [`KeyedStore`] holds for a limiter of
/// rule `A`. Its type is the crate's own business (opaque), so a store is written generic over
/// its cells, as [`DashMapStore`] is.
///
/// # Examples
/// ```
/// use tollgate::store::{CellOf, DashMapStore};
/// use tollgate::{clock::QuantaClock, Gcra, KeyedLimiter, Quota};
/// // A field's type names the store, and so the cells it holds.
/// struct Server {
///     per_user: KeyedLimiter<u64, Gcra, QuantaClock, DashMapStore<u64, CellOf<Gcra>>>,
/// }
/// let rule = Gcra::new(Quota::per_second(5)?)?;
/// let builder = KeyedLimiter::<u64, _>::builder(rule);
/// let server = Server { per_user: builder.build_with_store(DashMapStore::new())? };
/// assert!(server.per_user.check(&1)?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type CellOf<A> = <A as Stored>::Cell;
