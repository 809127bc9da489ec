//! The one place every atomic and lock is imported from.
//!
//! The library compiles against `std`/`parking_lot`; the `loom-tests` crate includes the same
//! state-machine files under its own `crate::sync` that re-exports loom's types, so the code
//! that is model-checked is the code that ships.

pub(crate) use std::hint::spin_loop;
use std::mem::MaybeUninit;

use crossbeam_epoch::Pointer;
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
pub(crate) use std::sync::Arc;
/// Made once, read lock-free after: a `String` table's wider tables (`word_table/texts.rs`).
pub(crate) use std::sync::OnceLock;

/// The hasher of the word tables the rules build (`Stored::new_store`): foldhash's, seeded at
/// random for each table. (The loom build's is foldhash's fixed one: a model's keys must take
/// the same slots in every execution loom replays.)
pub(crate) type StoreHasher = foldhash::fast::RandomState;

/// A sliding log's header: one 128-bit word (portable-atomic's; `cmpxchg16b` on x86_64).
pub(crate) use portable_atomic::AtomicU128;

/// Lets another thread run while a call waits for a key's log to finish changing size.
#[inline]
pub(crate) fn yield_now() {
    std::thread::yield_now();
}

/// A ring of 4-byte slots in one allocation (its length with it), not yet shared.
pub(crate) struct Slots(crossbeam_epoch::Owned<[MaybeUninit<AtomicU32>]>);

impl Slots {
    /// `len` slots, each 0.
    pub(crate) fn zeroed(len: usize) -> Slots {
        let mut slots = crossbeam_epoch::Owned::<[MaybeUninit<AtomicU32>]>::init(len);
        for slot in slots.iter_mut() {
            slot.write(AtomicU32::new(0));
        }
        Slots(slots)
    }

    pub(crate) fn as_slice(&self) -> &[AtomicU32] {
        assume_init(&self.0)
    }
}

/// Every ring's slots are written when it is made ([`Slots::zeroed`]).
#[allow(unsafe_code)]
fn assume_init(slots: &[MaybeUninit<AtomicU32>]) -> &[AtomicU32] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and every element was initialised by
    // `Slots::zeroed`, the only way a ring is made.
    unsafe { &*(slots as *const [MaybeUninit<AtomicU32>] as *const [AtomicU32]) }
}

/// A ring of slots replaced while lock-free readers may still read the old one, which is freed
/// once none can (crossbeam-epoch). Readers reach it only inside [`ReclaimedSlots::with`].
pub(crate) struct ReclaimedSlots(crossbeam_epoch::Atomic<[MaybeUninit<AtomicU32>]>);

#[allow(unsafe_code)]
impl ReclaimedSlots {
    pub(crate) fn null() -> Self {
        ReclaimedSlots(crossbeam_epoch::Atomic::null())
    }

    /// Runs `f` on the ring (`None` if there is none), which stays allocated while `f` runs.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&[AtomicU32]>) -> R) -> R {
        let guard = crossbeam_epoch::pin();
        // Acquire: pairs with `swap`'s release, so the ring is read as it was published.
        let shared = self.0.load(Ordering::Acquire, &guard);
        // SAFETY: a ring is only freed through `defer_destroy`, after it was unlinked, which
        // waits for every guard pinned before it, `guard` included, which lives until `f`
        // returns.
        f(unsafe { shared.as_ref() }.map(assume_init))
    }

    /// Publishes `new` (none if `None`); the old ring is freed once no reader holds it.
    pub(crate) fn replace(&self, new: Option<Slots>) {
        let guard = crossbeam_epoch::pin();
        let new = new.map_or(crossbeam_epoch::Shared::null(), |slots| {
            slots.0.into_shared(&guard)
        });
        self.swap(new, &guard);
    }

    /// Takes the ring out (the pointer is left empty), for [`ReclaimedSlots::attach`]
    /// elsewhere: readers that loaded it may go on reading it, so it is never freed meanwhile.
    pub(crate) fn detach(&self) -> Option<Detached> {
        let guard = crossbeam_epoch::pin();
        // AcqRel: as in `swap`.
        let old = self
            .0
            .swap(crossbeam_epoch::Shared::null(), Ordering::AcqRel, &guard);
        // Kept a pointer, never made an `Owned`: pinned readers may still hold it.
        (!old.is_null()).then(|| Detached(old.into_usize()))
    }

    /// Publishes a detached ring in place of the current one (freed once no reader holds it).
    pub(crate) fn attach(&self, ring: Detached) {
        let guard = crossbeam_epoch::pin();
        // SAFETY: `ring.into_shared` is `Detached`'s one way out but `Drop`, which this
        // skips (`ring` is consumed); the shared ring lives until a `swap` unlinks it and
        // defers its destruction past `guard` and every other pin.
        let ring = unsafe { ring.into_shared(&guard) };
        self.swap(ring, &guard);
    }

    fn swap<'g>(
        &self,
        new: crossbeam_epoch::Shared<'g, [MaybeUninit<AtomicU32>]>,
        guard: &'g crossbeam_epoch::Guard,
    ) {
        // AcqRel: release publishes the new ring to `with`; acquire takes the old one's
        // contents before it is freed.
        let old = self.0.swap(new, Ordering::AcqRel, guard);
        if !old.is_null() {
            // SAFETY: `old` is unlinked by the swap, so no reader can load it from now on; the
            // ones that loaded it before are pinned, and the destruction waits for them.
            unsafe { guard.defer_destroy(old) };
        }
    }
}

#[allow(unsafe_code)]
impl Drop for ReclaimedSlots {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other access to the pointer, which is only compared to null
        // here, not read through (no pin needed, so a cell without a ring drops without
        // registering its thread with the collector, an allocation).
        let ring = self
            .0
            .load(Ordering::Relaxed, unsafe { crossbeam_epoch::unprotected() });
        if !ring.is_null() {
            // Deferred, not freed at once: a ring attached here may have been detached from
            // another cell whose readers still read it.
            drop(self.detach());
        }
    }
}

/// A ring taken out of a [`ReclaimedSlots`] that readers may still be reading: held, never
/// read through, and freed only once no reader can hold it (`defer_destroy`, never at once).
///
/// It keeps the ring's pointer (crossbeam-epoch's `Shared::into_usize`), not an `Owned`: an
/// `Owned` asserts that nothing else refers to the ring, while pinned readers of the cell it
/// came from may still be reading it.
pub(crate) struct Detached(usize);

#[allow(unsafe_code)]
impl Detached {
    /// The ring as a `Shared` under `guard`, leaving `Detached` without running its `Drop`.
    ///
    /// # Safety
    /// The caller publishes or destroys the ring, through `defer_destroy` only.
    unsafe fn into_shared<'g>(
        self,
        _guard: &'g crossbeam_epoch::Guard,
    ) -> crossbeam_epoch::Shared<'g, [MaybeUninit<AtomicU32>]> {
        let data = std::mem::ManuallyDrop::new(self).0;
        // SAFETY: `data` came from `Shared::into_usize` of a ring that is still allocated (it
        // is freed only by a `defer_destroy` of it, which `Detached` has not run), and it is
        // turned back once: `self` is consumed without its `Drop`.
        unsafe { crossbeam_epoch::Shared::from_usize(data) }
    }
}

#[allow(unsafe_code)]
impl Drop for Detached {
    fn drop(&mut self) {
        let guard = crossbeam_epoch::pin();
        // SAFETY: `self.0` came from `Shared::into_usize` of a ring still allocated, and this
        // is its one conversion back (the other, `into_shared`, skips this `Drop`). Readers
        // that loaded the ring before it was detached are pinned, and the destruction waits
        // for them; no one else holds it.
        unsafe {
            guard.defer_destroy(
                crossbeam_epoch::Shared::<[MaybeUninit<AtomicU32>]>::from_usize(self.0),
            )
        };
    }
}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Detached")
    }
}

/// A point where a loom model lets other threads run (see `loom-tests/src/sync.rs`); nothing
/// here.
#[inline(always)]
pub(crate) fn model_yield() {}

/// Whether this build is the loom model (`loom-tests`), where a retried step only multiplies
/// the interleavings loom must explore (see `HAND_TRIES`).
pub(crate) const MODEL_CHECKED: bool = false;

/// A count only the unit tests and the loom models read (tables a call made, built and not
/// used, spares reused): kept in the unit tests' build and in `loom-tests`' shim, and nothing
/// (no field, no add) in the library a user builds.
#[derive(Default, Debug)]
pub(crate) struct Tally(#[cfg(test)] usize);

impl Tally {
    #[inline(always)]
    pub(crate) fn add(&mut self, n: usize) {
        #[cfg(test)]
        {
            self.0 += n;
        }
        let _ = n;
    }

    #[allow(dead_code)] // read by the unit tests
    pub(crate) fn get(&self) -> usize {
        #[cfg(test)]
        return self.0;
        #[cfg(not(test))]
        0
    }
}

/// A switch only the loom models turn on (the word table's yield between fetching a table and
/// probing it): always off, and nothing, here.
#[derive(Debug)]
pub(crate) struct ModelSwitch;

impl ModelSwitch {
    pub(crate) const OFF: ModelSwitch = ModelSwitch;

    #[allow(dead_code)] // turned on by the loom models
    pub(crate) fn turn_on(&mut self) {}

    #[inline(always)]
    pub(crate) fn is_on(&self) -> bool {
        false
    }
}

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

/// How long a lock is waited for by spinning before the thread sleeps on it: a few times the
/// longest hold, a word table shard's (a drain step, a page of a table built ahead: 2-3 µs;
/// the crate's other locks are held for less), and under the wake-up a sleeper pays on a VM
/// (tens of µs). parking_lot alone spins for a few µs.
const SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(20);

/// A mutex whose `lock` never fails (parking_lot does not poison).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(parking_lot::Mutex::new(value))
    }

    #[inline]
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, T> {
        if let Some(guard) = self.0.try_lock() {
            return guard;
        }
        self.lock_contended()
    }

    /// Spins for up to [`SPIN_FOR`], then sleeps until the lock is free.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> parking_lot::MutexGuard<'_, T> {
        let start = std::time::Instant::now();
        while start.elapsed() < SPIN_FOR {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
            if let Some(guard) = self.0.try_lock() {
                return guard;
            }
        }
        self.0.lock()
    }

    pub(crate) fn try_lock(&self) -> Option<parking_lot::MutexGuard<'_, T>> {
        self.0.try_lock()
    }
}
