//! The loom half of tollgate's `sync` shim: the same names as `src/sync.rs`, backed by loom, so
//! that the state machines compiled here are the ones the library ships.

/// Every access to a table slot's key goes through it: loom checks that no write races a read.
pub(crate) use loom::cell::UnsafeCell;
pub(crate) use loom::hint::spin_loop;
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
/// std's `Arc`, not loom's: the word table builds `Arc<[Slot]>` from an iterator, which loom's
/// does not offer. Tables are published and taken under the shard's (loom) mutex, so the
/// happens-before edges loom checks are all there; only the reference count is not modelled.
pub(crate) use std::sync::Arc;

/// Lets the model's other threads run here. loom's DPOR keeps only the last access to each
/// atomic: when a thread loads a word and then stores it (an insert's probe, then its tag's
/// publication), its own load hides another thread's earlier load of that word, and loom never
/// tries the store before that load. A lookup of a store made with `yielding_after_fetch`
/// yields once between fetching its table and probing it, so that a model runs an insert into
/// that very table in between (without it, a Relaxed publication of a slot's tag failed no
/// model).
pub(crate) fn model_yield() {
    loom::thread::yield_now();
}

/// This build is the loom model (see `src/sync.rs`).
pub(crate) const MODEL_CHECKED: bool = true;

/// `src/sync.rs`'s per-thread value, without the caching: every call starts from a default
/// value. For the word table this means a reader loads its shard's table under the lock at each
/// lookup; what the cache adds in the library, a table that went stale between two lookups, is
/// the same race as a table replaced during one lookup, which the models do explore (loom
/// cannot hold a per-object, per-thread value of a generic type without `unsafe`).
pub(crate) struct PerThread<T>(std::marker::PhantomData<fn() -> T>);

impl<T: Send + Default> PerThread<T> {
    pub(crate) fn new() -> Self {
        PerThread(std::marker::PhantomData)
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&T::default())
    }
}

/// A mutex whose `lock` never fails, as `src/sync.rs` has it (there: parking_lot's).
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        // A model whose thread panicked under the lock has already failed; propagate it.
        self.0
            .lock()
            .expect("a loom model panicked while holding the lock")
    }

    pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutex").finish_non_exhaustive()
    }
}
