//! A key type whose `Hash`, `Eq`, `Clone` or `Drop` panics on chosen calls, swept over the
//! calls of a pass of many keys through a keyed limiter (growing tables, drains over several
//! calls, eviction at the `evict_above` bound, `max_keys`). Each panic is caught around its
//! `check`; afterwards:
//! - every key value ever made is dropped exactly once (no double drop, no leak once the
//!   limiter is gone);
//! - no key is decided in two cells: under a quota of one unit per key per hour, no key is
//!   admitted twice;
//! - `len()` is the number of distinct keys the limiter holds.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use tollgate::clock::ManualClock;
use tollgate::{
    Algorithm, FixedWindow, Gcra, KeyedLimiter, LimitError, OverflowPolicy, Quota, SlidingLog,
    SlidingWindow,
};

/// Which user call panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Hash,
    Eq,
    Clone,
    Drop,
}

const CALLS: [Call; 4] = [Call::Hash, Call::Eq, Call::Clone, Call::Drop];

/// What the keys of one run share: call counters, the schedule of panics, and the serials of
/// the key values alive.
struct Plan {
    counts: [AtomicU64; 4],
    /// The call that panics, and every how many of its calls (0: never).
    panics: Mutex<Option<(Call, u64)>>,
    next_serial: AtomicU64,
    alive: Mutex<HashSet<u64>>,
    /// Drops of a value whose serial was not alive: a double drop.
    double_drops: AtomicU64,
}

impl Plan {
    fn new() -> Arc<Plan> {
        Arc::new(Plan {
            counts: Default::default(),
            panics: Mutex::new(None),
            next_serial: AtomicU64::new(0),
            alive: Mutex::new(HashSet::new()),
            double_drops: AtomicU64::new(0),
        })
    }

    /// Counts a call and panics if the schedule says so.
    fn call(&self, call: Call) {
        if std::thread::panicking() {
            // A panic while unwinding aborts the process, whatever the library does.
            return;
        }
        let n = self.counts[call as usize].fetch_add(1, Ordering::Relaxed) + 1;
        let panics = *self.panics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((which, every)) = panics {
            if which == call && n % every == 0 {
                panic!("planted panic in {call:?} (call {n})");
            }
        }
    }

    fn born(self: &Arc<Self>, id: u64) -> Touchy {
        let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
        self.alive.lock().unwrap().insert(serial);
        Touchy {
            id,
            serial,
            exempt: false,
            plan: self.clone(),
        }
    }

    fn double_drops(&self) -> u64 {
        self.double_drops.load(Ordering::Relaxed)
    }

    fn alive(&self) -> usize {
        self.alive.lock().unwrap().len()
    }
}

/// A key whose trait impls call into its [`Plan`].
struct Touchy {
    id: u64,
    serial: u64,
    /// A value of the test's own, whose drop never panics.
    exempt: bool,
    plan: Arc<Plan>,
}

impl Touchy {
    fn exempt(mut self) {
        self.exempt = true;
    }
}

impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.plan.call(Call::Hash);
        self.id.hash(state);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        self.plan.call(Call::Eq);
        self.id == other.id
    }
}

impl Eq for Touchy {}

impl Clone for Touchy {
    fn clone(&self) -> Self {
        self.plan.call(Call::Clone);
        self.plan.born(self.id)
    }
}

impl Drop for Touchy {
    fn drop(&mut self) {
        if !self.plan.alive.lock().unwrap().remove(&self.serial) {
            self.plan.double_drops.fetch_add(1, Ordering::Relaxed);
        }
        if !self.exempt {
            self.plan.call(Call::Drop);
        }
    }
}

fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planted = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|s| s.starts_with("planted panic"));
            if !planted {
                default(info);
            }
        }));
    });
}

/// How the limiter of a run is built.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// Tables grow: every drain moves every key.
    Growing,
    /// A small `evict_above`: drains evict the fresh keys.
    Evicting,
    /// A small `max_keys`: new keys make room by eviction, or are refused.
    Bounded,
}

/// Hot keys: each is admitted once (its hour never passes) and then holds state.
const HOT: u64 = 1_000;
/// Fresh keys checked (at cost 0) after each hot key, each new: a flood that grows, drains
/// and evicts the tables around the hot keys.
const FLOOD: u64 = 10;

/// Runs the hot keys and the flood through a limiter of `rule`, three passes, the first two
/// with `call` panicking every `every`th time, then checks the invariants.
fn run<A: Algorithm>(rule: A, shape: Shape, call: Call, every: u64) {
    quiet_panics();
    let plan = Plan::new();
    let clock = ManualClock::new();
    let builder = KeyedLimiter::<Touchy, A>::builder(rule).clock(clock.clone());
    let builder = match shape {
        Shape::Growing => builder,
        Shape::Evicting => builder.evict_above(2_000),
        // (Deny: a key refused is not admitted, where the shared state would admit it once
        // and its own state again once it finds room.)
        Shape::Bounded => builder.max_keys(3_000, OverflowPolicy::Deny),
    };
    let limiter = builder.build().unwrap();
    let what = format!("{} {shape:?}, {call:?} panics every {every}", A::NAME);
    let mut admitted = vec![0u32; HOT as usize];
    let (mut panicked, mut fresh_id) = (0, HOT);
    let mut check = |id: u64, cost: u64| {
        let key = plan.born(id);
        let outcome = catch_unwind(AssertUnwindSafe(|| limiter.check_n(&key, cost)));
        // The test's own key is dropped here, never panicking: the planted panics are the
        // limiter's calls'.
        key.exempt();
        match outcome {
            Ok(Ok(decision)) => decision.allowed(),
            Ok(Err(LimitError::KeyTableFull { .. })) => false,
            Ok(Err(e)) => panic!("{what}: check failed: {e}"),
            Err(_) => {
                panicked += 1;
                false
            }
        }
    };
    for pass in 0..3 {
        *plan.panics.lock().unwrap() = (pass < 2).then_some((call, every));
        for id in 0..HOT {
            admitted[id as usize] += u32::from(check(id, 1));
            for _ in 0..FLOOD {
                check(fresh_id, 0);
                fresh_id += 1;
            }
            clock.advance(std::time::Duration::from_millis(1));
        }
    }
    *plan.panics.lock().unwrap() = None;
    assert!(panicked > 0, "{what}: no panic was planted");
    assert_eq!(
        plan.double_drops(),
        0,
        "{what}: a key value was dropped twice"
    );
    // A check that panicked decided nothing, so a hot key admitted twice was decided in two
    // cells (or its state was lost).
    let twice: Vec<_> = (0..HOT).filter(|&id| admitted[id as usize] > 1).collect();
    assert!(
        twice.is_empty(),
        "{what}: hot keys admitted twice: {twice:?}"
    );
    let held = admitted.iter().filter(|&&n| n == 1).count();
    if !matches!(shape, Shape::Bounded) {
        // The last pass, without panics, admitted every hot key not admitted before (at the
        // `max_keys` bound, one the eviction hand found no room for is refused).
        assert_eq!(held, HOT as usize, "{what}: hot keys never admitted");
    }
    if let Shape::Growing = shape {
        // Nothing is evicted below `evict_above`: every key checked without a panic is held
        // (the check of a key that panicked may or may not have inserted it).
        let len = limiter.len() as u64;
        assert!(
            len <= fresh_id,
            "{what}: len() {len} over the {fresh_id} keys"
        );
        assert!(len + panicked >= fresh_id, "{what}: len() {len} lost keys");
    }
    // Every flood key is fresh: an explicit sweep leaves the hot keys that hold state.
    limiter.evict_fresh();
    assert_eq!(
        limiter.len(),
        held,
        "{what}: len() after evicting the fresh keys"
    );
    assert!(plan.alive() >= held, "{what}: hot key values dropped");
    drop(limiter);
    assert_eq!(plan.alive(), 0, "{what}: key values never dropped");
    assert_eq!(
        plan.double_drops(),
        0,
        "{what}: a key value was dropped twice"
    );
}

fn hourly() -> Quota {
    Quota::per_hour(1).unwrap()
}

/// Every `every` in a spread of periods, so that panics land on many different calls: the
/// periods are primes. A pass makes tens of thousands of each call but `Eq` (a lookup compares
/// keys only when their tags match): a few thousand of those.
fn periods(call: Call) -> [u64; 3] {
    match call {
        Call::Eq => [7, 61, 499],
        _ => [997, 4_999, 20_011],
    }
}

#[test]
fn growing_tables_survive_panics_in_every_trait_call() {
    for call in CALLS {
        for every in periods(call) {
            run(Gcra::new(hourly()).unwrap(), Shape::Growing, call, every);
        }
    }
}

#[test]
fn evicting_drains_survive_panics_in_every_trait_call() {
    for call in CALLS {
        for every in periods(call) {
            run(Gcra::new(hourly()).unwrap(), Shape::Evicting, call, every);
        }
    }
}

#[test]
fn bounded_stores_survive_panics_in_every_trait_call() {
    for call in CALLS {
        for every in periods(call) {
            run(Gcra::new(hourly()).unwrap(), Shape::Bounded, call, every);
        }
    }
}

#[test]
fn window_and_log_keys_survive_panics_in_every_trait_call() {
    for call in CALLS {
        run(
            FixedWindow::new(hourly()).unwrap(),
            Shape::Evicting,
            call,
            1_009,
        );
        run(
            SlidingWindow::new(hourly()).unwrap(),
            Shape::Evicting,
            call,
            1_009,
        );
        run(
            SlidingLog::new(hourly()).unwrap(),
            Shape::Evicting,
            call,
            1_009,
        );
    }
}
