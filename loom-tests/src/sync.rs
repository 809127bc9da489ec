//! The loom half of tollgate's `sync` shim: the same names as `src/sync.rs`, backed by loom, so
//! that the state machines compiled here are the ones the library ships.

pub(crate) use loom::hint::spin_loop;
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

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
