//! Limiters: a clock, a quota and a store of states, wired together.
//!
//! - [`Limiter`]: one state (a whole service, one connection, one tenant known up front).
//! - [`KeyedLimiter`]: one state per key, in a sharded concurrent map, with automatic eviction
//!   of keys that have become indistinguishable from fresh ones and an optional `max_keys`.
//! - [`InFlight`]: at most `N` requests in flight at once per key (a concurrency limit, not a
//!   rate), each admission a permit released when dropped.
//!
//! With feature `tokio` they wait with one vocabulary (the `wait` module's table): `check` /
//! `check_n` (`try_acquire` / `try_acquire_n` for `InFlight`) decide now, `until_ready` /
//! `until_ready_n` wait as long as it takes, `acquire` / `acquire_n` wait at most `max_wait`
//! and give up with `wait::WaitError`.
//!
//! ```
//! use tollgate::{limiter::{KeyedLimiter, Limiter}, FixedWindow, Quota};
//! let global = Limiter::new(FixedWindow::new(Quota::per_second(100)?)?);
//! let per_user = KeyedLimiter::<u64, _>::new(FixedWindow::new(Quota::per_second(5)?)?);
//! // Admitted only if the user's limit and the global one both admit.
//! let admitted = per_user.check(&7).unwrap().allowed() && global.check().allowed();
//! assert!(admitted);
//! # Ok::<(), tollgate::QuotaError>(())
//! ```

// Explicit path: `loom-tests` includes `core.rs` on its own (see `algorithm.rs`).
mod algorithm;
pub(crate) mod any;
mod direct;
#[path = "limiter/engine.rs"]
pub(crate) mod engine;
pub(crate) mod error;
mod in_flight;
mod keyed;

pub use self::algorithm::Algorithm;
pub use self::direct::Limiter;
pub use self::error::InFlightBoundError;
pub use self::in_flight::{InFlight, InFlightPermit, OwnedInFlightPermit};
pub use self::keyed::builder::KeyedLimiterBuilder;
pub use self::keyed::{KeyedLimiter, OverflowPolicy};
