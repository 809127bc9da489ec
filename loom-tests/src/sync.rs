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
/// std's (loom has none): it makes a `String` table's wider tables, which no model builds.
pub(crate) use std::sync::OnceLock;

/// `src/sync.rs`'s hasher of the word tables the rules build, with foldhash's fixed seed instead
/// of a random one: loom replays executions, so a key must take the same slot in every one.
pub(crate) type StoreHasher = foldhash::fast::FixedState;

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

/// `src/sync.rs`'s 128-bit atomic, modelled by a loom atomic with the very orderings the library
/// asks for, so that loom may show a load an older header where the hardware may (a lock in
/// its place would order every access, and hide a missing fence).
///
/// loom has no 128-bit atomic: the word holds the index of its value in a table of the values
/// the atomic has held or been compared with, one index per value, so that comparing indices
/// is comparing values. The table is plain data behind a `std` mutex, which loom does not see
/// and which is never held across a loom operation: it adds no ordering of its own.
pub(crate) struct AtomicU128 {
    index: loom::sync::atomic::AtomicUsize,
    values: std::sync::Mutex<Vec<u128>>,
}

impl Default for AtomicU128 {
    fn default() -> Self {
        AtomicU128::new(0)
    }
}

impl AtomicU128 {
    pub(crate) fn new(value: u128) -> Self {
        AtomicU128 {
            index: loom::sync::atomic::AtomicUsize::new(0),
            values: std::sync::Mutex::new(vec![value]),
        }
    }

    /// `value`'s index, given it on first sight.
    fn index_of(&self, value: u128) -> usize {
        let mut values = self.values.lock().expect("never held across a panic");
        values.iter().position(|&v| v == value).unwrap_or_else(|| {
            values.push(value);
            values.len() - 1
        })
    }

    fn value_at(&self, index: usize) -> u128 {
        self.values.lock().expect("never held across a panic")[index]
    }

    pub(crate) fn load(&self, order: Ordering) -> u128 {
        self.value_at(self.index.load(order))
    }

    pub(crate) fn store(&self, value: u128, order: Ordering) {
        self.index.store(self.index_of(value), order);
    }

    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        let (current, new) = (self.index_of(current), self.index_of(new));
        self.index
            .compare_exchange(current, new, success, failure)
            .map(|index| self.value_at(index))
            .map_err(|index| self.value_at(index))
    }
}

/// Lets the model's other threads run (a wait for a log being resized).
pub(crate) fn yield_now() {
    loom::thread::yield_now();
}

/// `src/sync.rs`'s ring of slots, not yet shared.
pub(crate) struct Slots(Box<[AtomicU32]>);

impl Slots {
    pub(crate) fn zeroed(len: usize) -> Slots {
        Slots((0..len).map(|_| AtomicU32::new(0)).collect())
    }

    pub(crate) fn as_slice(&self) -> &[AtomicU32] {
        &self.0
    }
}

/// `src/sync.rs`'s reclaimed ring, over a loom atomic pointer. Rings are leaked, not freed:
/// the models check the protocol around them; the reclamation is crossbeam-epoch's (and Miri
/// runs the library's tests of it).
pub(crate) struct ReclaimedSlots(loom::sync::atomic::AtomicPtr<Box<[AtomicU32]>>);

#[allow(unsafe_code)]
impl ReclaimedSlots {
    pub(crate) fn null() -> Self {
        ReclaimedSlots(loom::sync::atomic::AtomicPtr::new(std::ptr::null_mut()))
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&[AtomicU32]>) -> R) -> R {
        let ring = self.0.load(Ordering::Acquire);
        // SAFETY: rings are never freed while the model runs (leaked when replaced).
        f(unsafe { ring.as_ref() }.map(|ring| &ring[..]))
    }

    pub(crate) fn replace(&self, new: Option<Slots>) {
        let new = new.map_or(std::ptr::null_mut(), |slots| {
            Box::into_raw(Box::new(slots.0))
        });
        self.0.swap(new, Ordering::AcqRel);
    }

    pub(crate) fn detach(&self) -> Option<Detached> {
        let old = self.0.swap(std::ptr::null_mut(), Ordering::AcqRel);
        (!old.is_null()).then_some(Detached(old))
    }

    pub(crate) fn attach(&self, ring: Detached) {
        self.0.swap(ring.0, Ordering::AcqRel);
    }
}

/// `src/sync.rs`'s detached ring: a pointer, leaked as replaced rings are.
pub(crate) struct Detached(*mut Box<[AtomicU32]>);

// SAFETY: a moved ring, as a `Box` of atomics is Send.
#[allow(unsafe_code)]
unsafe impl Send for Detached {}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Detached")
    }
}

/// This build is the loom model (see `src/sync.rs`).
pub(crate) const MODEL_CHECKED: bool = true;

/// `src/sync.rs`'s count for tests and models: counted here.
#[derive(Default, Debug)]
pub(crate) struct Tally(usize);

impl Tally {
    pub(crate) fn add(&mut self, n: usize) {
        self.0 += n;
    }

    pub(crate) fn get(&self) -> usize {
        self.0
    }
}

/// `src/sync.rs`'s model switch: a flag here.
#[derive(Debug)]
pub(crate) struct ModelSwitch(bool);

impl ModelSwitch {
    pub(crate) const OFF: ModelSwitch = ModelSwitch(false);

    pub(crate) fn turn_on(&mut self) {
        self.0 = true;
    }

    pub(crate) fn is_on(&self) -> bool {
        self.0
    }
}

/// `src/sync.rs`'s per-thread value. By default without the caching: every call starts from
/// a default value, so the word table's reader loads its shard's table under the lock at each
/// lookup, and a stale table is modelled as a table replaced *during* a lookup. A model that
/// calls [`keep_per_thread_values`] first gets one value per loom thread, kept across calls as
/// the library's `thread_local::ThreadLocal` keeps it: a thread's cache then holds a table
/// from one lookup to the next while other threads replace, drain and free it. The kept
/// values are boxed behind a `std` mutex (plain data, which loom does not see and which is
/// never held across a loom operation or the caller's closure) and dropped with the
/// `PerThread`, as the library's are.
pub(crate) struct PerThread<T> {
    /// `None`: a fresh value each call.
    kept: Option<std::sync::Mutex<Kept<T>>>,
}

/// Each loom thread's value, by its id.
type Kept<T> = Vec<(loom::thread::ThreadId, Box<T>)>;

std::thread_local! {
    static KEEP_PER_THREAD_VALUES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the `PerThread` values created after it on this (test) thread keep one value per
/// loom thread across calls (`false`: back to a fresh value each call).
pub fn keep_per_thread_values(keep: bool) {
    KEEP_PER_THREAD_VALUES.with(|flag| flag.set(keep));
}

// SAFETY: as `thread_local::ThreadLocal<T: Send>` is `Sync`: each kept value is reached only
// by the loom thread whose id it is stored under (`with`), so no two threads share a `&T`;
// `T: Send` lets whichever thread drops the `PerThread` drop every value.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for PerThread<T> {}

impl<T: Send + Default> PerThread<T> {
    pub(crate) fn new() -> Self {
        let keep = KEEP_PER_THREAD_VALUES.with(std::cell::Cell::get);
        PerThread {
            kept: keep.then(|| std::sync::Mutex::new(Vec::new())),
        }
    }

    #[allow(unsafe_code)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let Some(kept) = &self.kept else {
            return f(&T::default());
        };
        let me = loom::thread::current().id();
        let value: *const T = {
            let mut values = kept.lock().expect("never held across a panic");
            match values.iter().position(|(id, _)| *id == me) {
                Some(i) => &*values[i].1,
                None => {
                    values.push((me, Box::default()));
                    &*values[values.len() - 1].1
                }
            }
        };
        // SAFETY: the value is boxed, and no box is removed or replaced while `self` lives
        // (entries are only pushed), so the pointer stays valid although the `Vec` may move
        // its entries; only this thread ever reaches this value (see the `Sync` impl).
        f(unsafe { &*value })
    }
}

std::thread_local! {
    static LOCKS_SURVIVE_PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the [`Mutex`]es created after it on this (test) thread locks that a panic does not
/// poison, as parking_lot's (the library's) are not (`false`: back to loom's mutex). loom's own
/// `Mutex` wraps a `std` one: a thread that panics holding it poisons it, and every later
/// `lock` panics, so a model in which a key's code panics under a shard's lock (its `Hash` in a
/// drain, its `Drop` as a table is released) could not go on past the panic. Opt-in: the spin
/// lock below has more interleavings than loom's mutex, and the other models' counts are
/// measured on loom's.
pub fn locks_survive_panics(survive: bool) {
    LOCKS_SURVIVE_PANICS.with(|flag| flag.set(survive));
}

/// A mutex whose `lock` never fails, as `src/sync.rs` has it (there: parking_lot's, which has
/// no poisoning). loom's by default; a [`SpinLock`] in a store made after
/// [`locks_survive_panics`].
pub(crate) struct Mutex<T>(Lock<T>);

enum Lock<T> {
    Loom(loom::sync::Mutex<T>),
    Spin(SpinLock<T>),
}

/// A held [`Mutex`].
pub(crate) enum MutexGuard<'a, T> {
    Loom(loom::sync::MutexGuard<'a, T>),
    Spin(SpinGuard<'a, T>),
}

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(if LOCKS_SURVIVE_PANICS.with(std::cell::Cell::get) {
            Lock::Spin(SpinLock::new(value))
        } else {
            Lock::Loom(loom::sync::Mutex::new(value))
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        match &self.0 {
            // Never an `Err` in loom 0.7: a lock a panic poisoned panics inside loom's `lock`
            // (it unwraps the `std` lock it wraps), hence `locks_survive_panics`.
            Lock::Loom(lock) => MutexGuard::Loom(
                lock.lock()
                    .expect("a loom model panicked while holding the lock"),
            ),
            Lock::Spin(lock) => MutexGuard::Spin(lock.lock()),
        }
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match &self.0 {
            Lock::Loom(lock) => lock.try_lock().ok().map(MutexGuard::Loom),
            Lock::Spin(lock) => lock.try_lock().map(MutexGuard::Spin),
        }
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            MutexGuard::Loom(guard) => guard,
            MutexGuard::Spin(guard) => guard,
        }
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self {
            MutexGuard::Loom(guard) => &mut *guard,
            MutexGuard::Spin(guard) => &mut *guard,
        }
    }
}

/// A lock that stands in for parking_lot's `Mutex` where a model lets user code panic under
/// it: a loom `AtomicBool` taken by a CAS (spinning with a yield, which loom's scheduler reads
/// as "let the others run") and released by a store, whatever way the guard is dropped, so a
/// panic neither poisons it nor leaves it held. The value is in a loom `UnsafeCell`, borrowed
/// mutably for as long as a guard lives: loom checks that no two guards ever overlap, which a
/// broken lock would let happen.
pub(crate) struct SpinLock<T> {
    held: AtomicBool,
    value: loom::cell::UnsafeCell<T>,
}

// SAFETY: as `std::sync::Mutex<T: Send>`: the value is reached only through a guard, and the
// CAS on `held` lets one guard live at a time (loom's cell checks it), so no two threads
// share a `&T` or `&mut T` at once; `T: Send` lets whichever thread takes the lock use it.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// A held [`SpinLock`]: the lock's value borrowed mutably (loom tracks the borrow) until it
/// is dropped, then the lock released.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// `None` only in `drop`, which ends the borrow before it releases the lock.
    value: Option<loom::cell::MutPtr<T>>,
}

impl<T> SpinLock<T> {
    fn new(value: T) -> Self {
        SpinLock {
            held: AtomicBool::new(false),
            value: loom::cell::UnsafeCell::new(value),
        }
    }

    fn lock(&self) -> SpinGuard<'_, T> {
        loop {
            if let Some(guard) = self.try_lock() {
                return guard;
            }
            loom::thread::yield_now();
        }
    }

    fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // Acquire: takes what the last holder wrote before its Release store below.
        // Relaxed on failure: nothing is read then.
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(SpinGuard {
            lock: self,
            value: Some(self.value.get_mut()),
        })
    }
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;

    #[allow(unsafe_code)]
    fn deref(&self) -> &T {
        let value = self.value.as_ref().expect("borrowed until the guard drops");
        // SAFETY: this guard is the lock's only one (the CAS in `try_lock`), and its `MutPtr`
        // points into the lock, which outlives it.
        unsafe { value.deref() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut T {
        let value = self.value.as_ref().expect("borrowed until the guard drops");
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow through the guard.
        unsafe { value.deref() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        // The borrow ends first: the next holder's begins after the store below.
        drop(self.value.take());
        // Release: publishes what the holder wrote to the next one's Acquire CAS.
        self.lock.held.store(false, Ordering::Release);
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
