//! The one place every atomic and lock is imported from.
//!
//! The library compiles against `std`/`parking_lot`; the `loom-tests` crate includes the same
//! state-machine files under its own `crate::sync` that re-exports loom's types, so the code
//! that is model-checked is the code that ships.

pub(crate) use std::hint::spin_loop;
/// The Redis tier's breaker counts failures in 32 bits.
#[cfg(feature = "redis")]
pub(crate) use std::sync::atomic::AtomicU32;
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
pub(crate) use std::sync::Arc;

/// A point where a loom model lets other threads run (see `loom-tests/src/sync.rs`); nothing
/// here.
#[inline(always)]
pub(crate) fn model_yield() {}

/// Whether this build is the loom model (`loom-tests`), where a retried step only multiplies
/// the interleavings loom must explore (see `HAND_TRIES`).
pub(crate) const MODEL_CHECKED: bool = false;

/// One value per thread and per owner (the `thread_local` crate: a lookup by thread id, no
/// shared write).
pub(crate) struct PerThread<T: Send>(thread_local::ThreadLocal<T>);

impl<T: Send + Default> PerThread<T> {
    pub(crate) fn new() -> Self {
        PerThread(thread_local::ThreadLocal::new())
    }

    /// Runs `f` on this thread's value (a default one on the thread's first call).
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(self.0.get_or_default())
    }
}

/// A cell accessed through raw pointers, each access inside a closure: std's `UnsafeCell`
/// here, loom's in the models, where the same closures let loom check that no write races a
/// read. (Dereferencing the pointers is the caller's `unsafe`.)
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A mutex whose `lock` never fails (parking_lot does not poison).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(parking_lot::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        self.0.lock()
    }

    pub(crate) fn try_lock(&self) -> Option<parking_lot::MutexGuard<'_, T>> {
        self.0.try_lock()
    }
}
