//! The one place every atomic and lock is imported from.
//!
//! The library compiles against `std`/`parking_lot`; the `loom-tests` crate includes the same
//! state-machine files under its own `crate::sync` that re-exports loom's types, so the code
//! that is model-checked is the code that ships.

pub(crate) use std::hint::spin_loop;
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
}
