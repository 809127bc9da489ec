//! Releases that meet other keys' code: a key type whose `Drop` panics for one chosen key,
//! whose copy sits in a table the release's shard is about to free.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::InFlight;
use crate::store::cell::TableCell;
use crate::store::table::{Check, KeyTable};
use crate::store::word_table::WordTable;
use crate::store::{KeepAll, Stored};

thread_local! {
    /// The key whose next drop panics (once), if any. Thread-local: each test runs on its own
    /// thread, and every call it makes into its table runs on that thread.
    static DOOMED: Cell<Option<u64>> = const { Cell::new(None) };
    /// Whether that drop panics even while a panic unwinds (which aborts the process).
    static EVEN_UNWINDING: Cell<bool> = const { Cell::new(false) };
}

/// A key with drop glue (so that a retired table's keys are dropped a step at a time) whose
/// `Drop` panics once for the key [`DOOMED`] names (not while a panic unwinds, unless
/// [`EVEN_UNWINDING`]).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key(u64);

impl Drop for Key {
    fn drop(&mut self) {
        let unwinding = std::thread::panicking() && !EVEN_UNWINDING.with(Cell::get);
        if !unwinding && DOOMED.with(Cell::get) == Some(self.0) {
            DOOMED.with(|d| d.set(None));
            panic!("planted panic in the drop of key {}", self.0);
        }
    }
}

/// Fills the shard of key 0 of `store` until its first table is replaced: first a key of that
/// shard (returned: the key to doom), then `hold` (which must insert key 0), then other keys
/// of the shard through `insert`. Afterwards the first table (8 slots, holding a copy of both
/// keys) is being drained, none of its slots visited, and no thread but the shard holds it:
/// the next locked lookup in the shard ends the drain in one step, retires the table and
/// frees it in the same call, dropping every key it holds.
fn arrange<H: std::hash::BuildHasher, C: TableCell>(
    store: &WordTable<Key, H, C>,
    hold: impl FnOnce(),
    insert: impl Fn(&Key),
) -> u64 {
    let shard = store.shard_of(&Key(0));
    let mut same = (1..).filter(|&i| store.shard_of(&Key(i)) == shard);
    let doomed = same.next().expect("a key in the shard");
    insert(&Key(doomed));
    hold();
    while store.drains_in(shard) == 0 {
        insert(&Key(same.next().expect("a key in the shard")));
    }
    doomed
}

#[test]
fn a_release_is_not_lost_to_another_keys_drop_panicking_as_a_table_is_freed() {
    let limit = InFlight::<Key>::new(3).unwrap();
    let mut permit = None;
    let doomed = arrange(
        limit.table.store(),
        || permit = limit.try_acquire_n(&Key(0), 2).unwrap(),
        |key| drop(limit.try_acquire(key).unwrap()),
    );
    // (No lookup of key 0 here: a lookup ends the drain and frees the table.)
    DOOMED.with(|d| d.set(Some(doomed)));
    let released = catch_unwind(AssertUnwindSafe(|| drop(permit.take())));
    let panicked = DOOMED.with(|d| d.take()).is_none();
    assert_eq!(
        limit.in_flight(&Key(0)),
        0,
        "the release's units (its call panicked: {}, the doomed key dropped: {panicked})",
        released.is_err(),
    );
    assert!(limit.try_acquire_n(&Key(0), 3).unwrap().is_some());
}

/// The same through the key table's refund, which `KeyedLimiter::refund` calls: a rate
/// limiter's units given back are not lost either.
#[test]
fn a_refund_is_not_lost_to_another_keys_drop_panicking_as_a_table_is_freed() {
    let rule = crate::algorithm::Gcra::new(crate::quota::Quota::per_hour(10).unwrap()).unwrap();
    let table = KeyTable::new(crate::algorithm::Gcra::new_store::<Key>(), None);
    let now = || 1_000_000_000;
    let check = |key: &Key, cost| {
        table
            .check_key(key, &rule, now, cost, &KeepAll, Check)
            .unwrap()
    };
    let doomed = arrange(
        table.store(),
        || assert_eq!(check(&Key(0), 4).remaining(), 6),
        |key| assert!(check(key, 1).allowed()),
    );
    DOOMED.with(|d| d.set(Some(doomed)));
    let refunded = catch_unwind(AssertUnwindSafe(|| table.refund(&Key(0), &rule, now, 4)));
    DOOMED.with(|d| d.set(None));
    assert_eq!(
        table.peek(&Key(0), &rule, now, 0).remaining(),
        10,
        "the units refunded (the refund panicked: {})",
        refunded.is_err()
    );
}

/// With a waiter: the release that meets the panicking drop still serves it.
#[cfg(feature = "tokio")]
#[test]
fn a_waiter_is_served_by_a_release_that_meets_another_keys_panicking_drop() {
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    #[derive(Default)]
    struct Wakes(AtomicUsize);
    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            // SeqCst: the test's own count.
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _runtime = runtime.enter();
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(Arc::clone(&wakes));
    let mut cx = Context::from_waker(&waker);
    let limit = InFlight::<Key>::new(1).unwrap();
    let mut permit = None;
    let key = Key(0);
    let mut waiter = Box::pin(limit.acquire(&key, std::time::Duration::from_secs(3600)));
    let doomed = arrange(
        limit.table.store(),
        || {
            permit = limit.try_acquire(&Key(0)).unwrap();
            assert!(waiter.as_mut().poll(&mut cx).is_pending());
        },
        |key| drop(limit.try_acquire(key).unwrap()),
    );
    DOOMED.with(|d| d.set(Some(doomed)));
    let released = catch_unwind(AssertUnwindSafe(|| drop(permit.take())));
    DOOMED.with(|d| d.set(None));
    // SeqCst: the test's own count.
    let woken = wakes.0.load(Ordering::SeqCst);
    let served = waiter.as_mut().poll(&mut cx);
    assert!(
        matches!(served, Poll::Ready(Ok(_))),
        "the waiter served (woken {woken} times; the release panicked: {})",
        released.is_err()
    );
    assert_eq!(woken, 1, "the waiter woken once, when served");
    assert_eq!(limit.in_flight(&Key(0)), 1, "the waiter's unit");
    drop(served);
    assert_eq!(limit.in_flight(&Key(0)), 0);
}

/// A permit dropped while a panic unwinds (the request's own panic) releases its units: its
/// release ran a panicking drop of another key, and a second panic while unwinding aborts the
/// process. Run in a child process (this test binary again), whose exit the test reads.
#[test]
fn a_permit_dropped_as_a_panic_unwinds_releases_without_aborting() {
    const CHILD: &str = "TOLLGATE_TEST_UNWINDING_RELEASE";
    if std::env::var_os(CHILD).is_none() {
        let name = "limiter::in_flight::tests::a_permit_dropped_as_a_panic_unwinds_releases_without_aborting";
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the child process ended with {status}");
        return;
    }
    let limit = InFlight::<Key>::new(1).unwrap();
    let mut permit = None;
    let doomed = arrange(
        limit.table.store(),
        || permit = limit.try_acquire(&Key(0)).unwrap(),
        |key| drop(limit.try_acquire(key).unwrap()),
    );
    DOOMED.with(|d| d.set(Some(doomed)));
    EVEN_UNWINDING.with(|e| e.set(true));
    let request = catch_unwind(AssertUnwindSafe(|| {
        let _permit = permit.take();
        panic!("the request failed");
    }));
    DOOMED.with(|d| d.set(None));
    assert!(request.is_err());
    assert_eq!(limit.in_flight(&Key(0)), 0, "released on the way out");
}
