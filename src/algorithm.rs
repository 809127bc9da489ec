//! The algorithms of the decision rules (`docs/decision-rules.md`), one file each, as pure
//! functions.
//!
//! Each rule is a plain `Copy` value (its parameters) with a function from (state, now, cost)
//! to (decision, next state). Nothing here touches an atomic: [`crate::state`] stores the states
//! and runs the compare-and-swap loops, which is what makes the rules testable, fuzzable and
//! model-checkable on their own.
//!
//! ```
//! use tollgate::{algorithm::WordRule, FixedWindow, Quota};
//! // A rule on its own: no limiter, no atomics, no clock; times are plain nanoseconds.
//! let rule = FixedWindow::new(Quota::per_second(2)?)?;
//! let (d1, s) = rule.decide(0, 0, 1);
//! let (d2, s) = rule.decide(s, 100, 1);
//! let (d3, _) = rule.decide(s, 200, 1);
//! assert_eq!([d1.allowed(), d2.allowed(), d3.allowed()], [true, true, false]);
//! # Ok::<(), tollgate::QuotaError>(())
//! ```

// Explicit paths: `loom-tests` includes this file with `#[path]`, which makes rustc look for
// undecorated child modules beside it (`src/gcra.rs`); these resolve the same from both crates.
#[path = "algorithm/fixed_window.rs"]
pub mod fixed_window;
#[path = "algorithm/gcra.rs"]
pub mod gcra;
#[path = "algorithm/grid.rs"]
mod grid;
#[path = "algorithm/leaky_queue.rs"]
pub mod leaky_queue;
#[path = "algorithm/sliding_log.rs"]
pub mod sliding_log;
#[path = "algorithm/sliding_window.rs"]
pub mod sliding_window;

use crate::clock::Nanos;
use crate::decision::Decision;
use crate::quota::QuotaError;
use std::hash::Hash;

use crate::state::{AtomicWord, LogCell, Retired, Words};
use crate::store::{KeyedStore, WordTable};

/// GCRA and leaky-bucket TATs stay below `u64::MAX − 1` (`Gcra::decide_with_delay`).
pub(crate) const TAT_MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX - 1,
};

/// How far back `evict_if_idle` may judge, in periods: well within the window counters'
/// readable range (a quarter of the sliding window's 2^23 indices), and no limit in practice.
const IDLE_HORIZON: u64 = 1 << 20;

/// Both window states have impossible low bits: the fixed window's count (24 bits, `MAX_LIMIT`
/// = 2^24 − 2) and the sliding window's `cur` (21 bits, at most 2^20 − 1) never are all ones.
pub(crate) const WINDOW_MARKS: Retired = Retired {
    tombstone: u64::MAX,
    moved: u64::MAX >> 1,
};

pub use self::fixed_window::FixedWindow;
pub use self::gcra::Gcra;
pub use self::leaky_queue::LeakyQueue;
pub use self::sliding_log::SlidingLog;
pub use self::sliding_window::SlidingWindow;

/// The token bucket is GCRA (decision rules §1): the same decisions, kept as one number.
///
/// # Examples
/// ```
/// use tollgate::{algorithm::TokenBucket, Limiter, Quota};
/// // Refill 10 tokens a second into a bucket of 20.
/// let bucket = TokenBucket::new(Quota::per_second(10)?.with_burst(20)?)?;
/// let limiter = Limiter::new(bucket);
/// // A full bucket to start with: 20 at once, then it is empty.
/// assert!(limiter.check_n(20)?.allowed());
/// assert!(!limiter.check().allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type TokenBucket = Gcra;
/// The leaky bucket as a meter decides exactly as GCRA with `B = C` (decision rules §2).
///
/// # Examples
/// ```
/// use tollgate::{algorithm::LeakyBucket, Limiter, Quota};
/// // Leaks 5 a second; holds at most 5 (the burst is the bucket's capacity C).
/// let limiter = Limiter::new(LeakyBucket::new(Quota::per_second(5)?)?);
/// for _ in 0..5 {
///     assert!(limiter.check().allowed());
/// }
/// // Full: the next drop overflows until one leaks out (200 ms).
/// let d = limiter.check();
/// assert!(!d.allowed());
/// assert!(d.retry_after() <= std::time::Duration::from_millis(200));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type LeakyBucket = Gcra;

mod sealed {
    pub trait Sealed {}
}

/// A rate-limiting algorithm a limiter can run: [`Gcra`] (alias [`TokenBucket`],
/// [`LeakyBucket`]), [`LeakyQueue`], [`FixedWindow`], [`SlidingWindow`], [`SlidingLog`].
///
/// The trait is sealed; its hidden methods are the glue between a rule and its stored state.
///
/// # Examples
/// Code generic over the rule, as a configuration loader or a report might be:
/// ```
/// use std::time::Duration;
/// use tollgate::{algorithm::Algorithm, FixedWindow, Gcra, KeyedLimiter, Quota};
/// fn describe<A: Algorithm>(rule: A) -> String {
///     format!("{}: {} per period, up to {} at once", A::NAME, rule.limit(), rule.capacity())
/// }
/// fn per_user<A: Algorithm>(rule: A) -> KeyedLimiter<u64, A> {
///     KeyedLimiter::new(rule)
/// }
/// let quota = Quota::per_minute(60)?;
/// assert_eq!(describe(Gcra::new(quota.with_burst(5)?)?), "gcra: 60 per period, up to 5 at once");
/// assert_eq!(describe(FixedWindow::new(quota)?), "fixed-window: 60 per period, up to 60 at once");
/// assert!(per_user(FixedWindow::new(quota)?).check(&7)?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Algorithm: Copy + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed {
    /// The canonical name, e.g. `"gcra"`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::{Algorithm, TokenBucket}, SlidingLog};
    /// assert_eq!(SlidingLog::NAME, "sliding-log");
    /// // An alias shares its rule's name.
    /// assert_eq!(TokenBucket::NAME, "gcra");
    /// ```
    const NAME: &'static str;

    /// The per-key state as stored in a limiter.
    #[doc(hidden)]
    type Cell: Default + Send + Sync;

    /// `L`, as reported in every decision.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Algorithm, Gcra, Quota};
    /// let rule = Gcra::new(Quota::per_second(10)?.with_burst(50)?)?;
    /// assert_eq!(Algorithm::limit(&rule), 10);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn limit(&self) -> u64;

    /// The largest cost that can ever be admitted (`B`, `C` or `L`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Algorithm, Gcra, Limiter, Quota};
    /// let rule = Gcra::new(Quota::per_second(10)?.with_burst(50)?)?;
    /// assert_eq!(Algorithm::capacity(&rule), 50);
    /// // A larger cost is an error, not a denial: waiting would never help.
    /// assert!(Limiter::new(rule).check_n(51).is_err());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn capacity(&self) -> u64;

    /// The interval the rule must resolve: `B·T` for GCRA and the leaky buckets, `W` for the
    /// windows. A clock whose resolution exceeds a tenth of it is refused.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::Algorithm, FixedWindow, Gcra, Quota};
    /// // Windows: W.
    /// assert_eq!(FixedWindow::new(Quota::per_minute(100)?)?.period(), 60_000_000_000);
    /// // GCRA: B·T = 50 × 100 ms = 5 s.
    /// assert_eq!(Gcra::new(Quota::per_second(10)?.with_burst(50)?)?.period(), 5_000_000_000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn period(&self) -> Nanos;

    /// Decides a request of `cost ≤ capacity()` against `cell`, committing it when `commit` and
    /// it is allowed. `now` is read after the state is loaded, so that a state written by another
    /// thread never looks newer than the time it is judged at.
    #[doc(hidden)]
    fn acquire<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Decision;

    /// Gives back `cost` units admitted earlier, as far as the rule allows.
    #[doc(hidden)]
    fn refund<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64);

    /// Reserves `cost ≤ capacity()` units: as [`Algorithm::acquire`] with `commit`, except
    /// that a rule that can ([`WordRule::reserve`]: GCRA) takes the units even when it would
    /// refuse them now, and the decision's delay says when they are due. What the waiting
    /// calls use, so that waiters are served in the order they reserved.
    #[doc(hidden)]
    #[inline]
    fn reserve<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64) -> Decision {
        self.acquire(cell, now, cost, true)
    }

    /// [`Algorithm::reserve`] in a keyed store: `None` if the cell was retired.
    #[doc(hidden)]
    #[inline]
    fn reserve_live<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
    ) -> Option<Decision> {
        self.acquire_live(cell, now, cost, true)
    }

    /// Whether `cell` can no longer be told apart from a fresh key at `now` (safe to evict).
    #[doc(hidden)]
    fn is_fresh(&self, cell: &Self::Cell, now: Nanos) -> bool;

    /// The keyed store this rule's cells live in by default: the lock-free [`WordTable`].
    #[doc(hidden)]
    type Store<K: Clone + Hash + Eq + Send + Sync>: KeyedStore<K, Self::Cell>;

    /// An empty default store.
    #[doc(hidden)]
    fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K>;

    /// [`Algorithm::acquire`] in a keyed store: `None` if the cell was retired (evicted or
    /// moved), so that the store looks the key up again.
    #[doc(hidden)]
    fn acquire_live<F: Fn() -> Nanos>(
        &self,
        cell: &Self::Cell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Option<Decision>;

    /// [`Algorithm::refund`] in a keyed store: `None` if the cell was retired.
    #[doc(hidden)]
    fn refund_live<F: Fn() -> Nanos>(&self, cell: &Self::Cell, now: F, cost: u64) -> Option<()>;

    /// Retires `cell` if it is fresh at `now`, atomically with respect to decisions on it
    /// (a decision lands before and the cell is kept, or sees the tombstone); whether it did.
    #[doc(hidden)]
    fn evict_if_fresh(&self, cell: &Self::Cell, now: Nanos) -> bool;

    /// Retires `cell` if it is fresh at `now` and already was at `since` (≤ `now`): a key left
    /// unused since then. Atomic as [`Algorithm::evict_if_fresh`]; whether it did. (`since` is
    /// clamped to at most 2^20 periods before `now`, within what the window counters can read.)
    #[doc(hidden)]
    fn evict_if_idle(&self, cell: &Self::Cell, since: Nanos, now: Nanos) -> bool;

    /// The rule that takes over from `previous` at `now` when the quota changes.
    #[doc(hidden)]
    fn take_over(self, previous: &Self, now: Nanos) -> Self;

    /// The window counters keep a window index in a few bits, anchored at a base the limiter
    /// moves up (see the index horizon in `algorithm/grid.rs`): the instant from which a
    /// limiter should sweep and call [`Algorithm::rebase`]. Never, for the other rules.
    #[doc(hidden)]
    #[inline]
    fn sweep_due(&self) -> Nanos {
        Nanos::MAX
    }

    /// Whether this rule may not store a state judged at `now` (a limiter must sweep and
    /// rebase first, then decide again). Rules refuse such writes: the state stays as it was.
    #[doc(hidden)]
    fn beyond_horizon(&self, _now: Nanos) -> bool {
        false
    }

    /// The rule re-anchored at `now`, once every state that is fresh at `now` is gone.
    #[doc(hidden)]
    fn rebase(self, _now: Nanos) -> Self {
        self
    }

    /// The anchor its states are written against: a store that re-anchors itself never hands
    /// a decision a cell of an older era ([`KeyedStore::with_existing`]). 0 for the rules
    /// whose states need none.
    #[doc(hidden)]
    #[inline(always)]
    fn era(&self) -> u64 {
        0
    }

    /// Re-encodes, in place, a cell written in era `from` for the later era `to` (see
    /// [`KeyedStore::set_carry`]): a state too old to be read in `to` is fresh, and becomes
    /// the fresh state. Nothing, for the rules whose states need no era.
    #[doc(hidden)]
    fn carry(_cell: &Self::Cell, _from: u64, _to: u64) {}

    /// Puts a cell that is fresh at `now` back to the fresh state (a direct limiter's sweep).
    #[doc(hidden)]
    fn reset_if_fresh(&self, _cell: &Self::Cell, _now: Nanos) {}

    #[doc(hidden)]
    fn to_words(&self) -> Words;
    #[doc(hidden)]
    fn from_words(words: Words) -> Self;
}

/// A rule whose whole per-key state is one `u64` (0 = a fresh key): the pure decision
/// function, usable on its own (tests, simulations, a store of your own).
///
/// # Examples
/// ```
/// use tollgate::{algorithm::WordRule, FixedWindow, Quota};
/// let rule = FixedWindow::new(Quota::per_second(1)?)?;
/// let (first, state) = rule.decide(0, 0, 1);
/// assert!(first.allowed());
/// assert!(!rule.decide(state, 10, 1).0.allowed());
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
pub trait WordRule: Copy {
    /// (decision, next state). The next state equals `state` when denied or `cost == 0`. A cost
    /// above the rule's capacity is denied with `retry_after` = `u64::MAX` ns (never), the state
    /// unchanged (limiters refuse such a cost with [`crate::Error::CapacityExceeded`] instead).
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::WordRule, Gcra, Quota};
    /// let rule = Gcra::new(Quota::per_second(2)?)?; // T = 500 ms, burst 2
    /// let (d, state) = rule.decide(0, 0, 2);
    /// assert!(d.allowed());
    /// // Denied: the state is unchanged, and the next unit is due in T.
    /// let (d, after) = rule.decide(state, 0, 1);
    /// assert_eq!((d.allowed(), after), (false, state));
    /// assert_eq!(d.retry_after().as_millis(), 500);
    /// // Above the capacity: denied for ever, not an error at this level.
    /// assert_eq!(rule.decide(0, 0, 3).0.retry_after().as_nanos(), u64::MAX as u128);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn decide(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64);
    /// The state after giving back `cost` units at `now`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::WordRule, FixedWindow, Quota};
    /// let rule = FixedWindow::new(Quota::per_second(1)?)?;
    /// let (_, spent) = rule.decide(0, 0, 1);
    /// assert!(!rule.decide(spent, 10, 1).0.allowed());
    /// // The request failed downstream: give its unit back, and the next one is admitted.
    /// let state = rule.refunded(spent, 10, 1);
    /// assert!(rule.decide(state, 10, 1).0.allowed());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn refunded(&self, state: u64, now: Nanos, cost: u64) -> u64;
    /// (decision, next state) of a reservation of `cost` units at `now`: by default the same
    /// as [`WordRule::decide`]. GCRA takes the units even when it would refuse them now
    /// (`TAT := max(TAT, t) + c·T`) and admits them with a delay, the instant its check would:
    /// waiters that reserve are served in the order they reserved, each charged once.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::WordRule, Gcra, Quota};
    /// let rule = Gcra::new(Quota::per_second(2)?)?; // T = 500 ms, burst 2
    /// let (_, spent) = rule.decide(0, 0, 2);
    /// // A check now is refused; a reservation is admitted, due in 500 ms, and the next one
    /// // queues behind it.
    /// assert!(!rule.decide(spent, 0, 1).0.allowed());
    /// let (d, first) = rule.reserve(spent, 0, 1);
    /// assert_eq!((d.allowed(), d.delay().as_millis()), (true, 500));
    /// let (d, _) = rule.reserve(first, 0, 1);
    /// assert_eq!(d.delay().as_millis(), 1000);
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn reserve(&self, state: u64, now: Nanos, cost: u64) -> (Decision, u64) {
        self.decide(state, now, cost)
    }
    /// Whether `state` behaves as a fresh key at `now`.
    ///
    /// # Examples
    /// ```
    /// use tollgate::{algorithm::WordRule, Gcra, Quota};
    /// let rule = Gcra::new(Quota::per_second(2)?)?; // T = 500 ms
    /// let (_, state) = rule.decide(0, 0, 1);
    /// assert!(!rule.is_fresh(state, 0));
    /// // One unit refills in T: the key is then as good as new, and a store may forget it.
    /// assert!(rule.is_fresh(state, 500_000_000));
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    fn is_fresh(&self, state: u64, now: Nanos) -> bool;
}

macro_rules! word_algorithm {
    ($ty:ty, $name:literal, $marks:expr $(, $windowed:ident)?) => {
        impl sealed::Sealed for $ty {}
        impl Algorithm for $ty {
            const NAME: &'static str = $name;
            type Cell = AtomicWord;
            type Store<K: Clone + Hash + Eq + Send + Sync> =
                WordTable<K, foldhash::fast::RandomState>;

            fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K> {
                WordTable::new($marks, foldhash::fast::RandomState::default())
            }

            fn limit(&self) -> u64 {
                self.limit()
            }
            fn capacity(&self) -> u64 {
                self.capacity()
            }
            fn period(&self) -> Nanos {
                self.period()
            }
            #[inline]
            fn acquire<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
                commit: bool,
            ) -> Decision {
                if commit {
                    cell.update(now, |state, t| WordRule::decide(self, state, t, cost))
                } else {
                    WordRule::decide(self, cell.load(), now(), cost).0
                }
            }
            fn refund<F: Fn() -> Nanos>(&self, cell: &AtomicWord, now: F, cost: u64) {
                cell.update(now, |state, t| {
                    ((), WordRule::refunded(self, state, t, cost))
                })
            }
            fn reserve<F: Fn() -> Nanos>(&self, cell: &AtomicWord, now: F, cost: u64) -> Decision {
                cell.update(now, |state, t| WordRule::reserve(self, state, t, cost))
            }
            fn reserve_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
            ) -> Option<Decision> {
                let marks: Retired = $marks;
                cell.try_update(
                    now,
                    |state, t| WordRule::reserve(self, state, t, cost),
                    |state| marks.any(state),
                )
                .ok()
            }
            fn is_fresh(&self, cell: &AtomicWord, now: Nanos) -> bool {
                WordRule::is_fresh(self, cell.load(), now)
            }
            #[inline]
            fn acquire_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
                commit: bool,
            ) -> Option<Decision> {
                let marks: Retired = $marks;
                if commit {
                    cell.try_update(
                        now,
                        |state, t| WordRule::decide(self, state, t, cost),
                        |state| marks.any(state),
                    )
                    .ok()
                } else {
                    let state = cell.load();
                    (!marks.any(state)).then(|| WordRule::decide(self, state, now(), cost).0)
                }
            }
            fn refund_live<F: Fn() -> Nanos>(
                &self,
                cell: &AtomicWord,
                now: F,
                cost: u64,
            ) -> Option<()> {
                let marks: Retired = $marks;
                cell.try_update(
                    now,
                    |state, t| ((), WordRule::refunded(self, state, t, cost)),
                    |state| marks.any(state),
                )
                .ok()
            }
            fn evict_if_fresh(&self, cell: &AtomicWord, now: Nanos) -> bool {
                let marks: Retired = $marks;
                cell.retire_if(marks.tombstone, |state| {
                    !marks.any(state) && WordRule::is_fresh(self, state, now)
                })
                .is_some()
            }
            fn evict_if_idle(&self, cell: &AtomicWord, since: Nanos, now: Nanos) -> bool {
                let marks: Retired = $marks;
                let since = since
                    .max(now.saturating_sub(self.period().saturating_mul(IDLE_HORIZON)))
                    .min(now);
                cell.retire_if(marks.tombstone, |state| {
                    !marks.any(state)
                        && WordRule::is_fresh(self, state, now)
                        && WordRule::is_fresh(self, state, since)
                })
                .is_some()
            }
            fn take_over(self, previous: &Self, now: Nanos) -> Self {
                self.take_over(previous, now)
            }
            fn reset_if_fresh(&self, cell: &AtomicWord, now: Nanos) {
                cell.retire_if(0, |state| {
                    state != 0 && WordRule::is_fresh(self, state, now)
                });
            }
            $(
                #[inline]
                fn sweep_due(&self) -> Nanos {
                    let $windowed = self.horizon();
                    $windowed.sweep_due()
                }
                fn beyond_horizon(&self, now: Nanos) -> bool {
                    self.horizon().beyond_horizon(now)
                }
                fn rebase(self, now: Nanos) -> Self {
                    self.rebase(now)
                }
                #[inline(always)]
                fn era(&self) -> u64 {
                    self.horizon().base
                }
                fn carry(cell: &AtomicWord, from: u64, to: u64) {
                    let $windowed = <Self>::carried(cell.load(), from, to);
                    cell.init($windowed);
                }
            )?
            fn to_words(&self) -> Words {
                self.to_words()
            }
            fn from_words(words: Words) -> Self {
                Self::from_words(words)
            }
        }
    };
}

word_algorithm!(Gcra, "gcra", TAT_MARKS);
word_algorithm!(LeakyQueue, "leaky-queue", TAT_MARKS);
word_algorithm!(FixedWindow, "fixed-window", WINDOW_MARKS, windowed);
word_algorithm!(SlidingWindow, "sliding-window", WINDOW_MARKS, windowed);

impl sealed::Sealed for SlidingLog {}
impl Algorithm for SlidingLog {
    const NAME: &'static str = "sliding-log";
    type Cell = LogCell;

    fn limit(&self) -> u64 {
        self.limit()
    }
    fn capacity(&self) -> u64 {
        self.limit()
    }
    fn period(&self) -> Nanos {
        self.window()
    }
    fn acquire<F: Fn() -> Nanos>(
        &self,
        cell: &LogCell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Decision {
        cell.with(now, |ring, t| self.decide(ring, t, cost, commit))
    }
    fn refund<F: Fn() -> Nanos>(&self, cell: &LogCell, now: F, cost: u64) {
        cell.with(now, |ring, t| self.refund(ring, t, cost))
    }
    fn is_fresh(&self, cell: &LogCell, now: Nanos) -> bool {
        // A retired cell holds no state; its ring must stay marked (no prune on it).
        cell.with_live(|| now, |ring, t| self.is_empty_at(ring, t))
            .unwrap_or(true)
    }
    type Store<K: Clone + Hash + Eq + Send + Sync> =
        WordTable<K, foldhash::fast::RandomState, LogCell>;
    fn new_store<K: Clone + Hash + Eq + Send + Sync>() -> Self::Store<K> {
        WordTable::new((), foldhash::fast::RandomState::default())
    }
    #[inline]
    fn acquire_live<F: Fn() -> Nanos>(
        &self,
        cell: &LogCell,
        now: F,
        cost: u64,
        commit: bool,
    ) -> Option<Decision> {
        cell.with_live(now, |ring, t| self.decide(ring, t, cost, commit))
    }
    fn refund_live<F: Fn() -> Nanos>(&self, cell: &LogCell, now: F, cost: u64) -> Option<()> {
        cell.with_live(now, |ring, t| self.refund(ring, t, cost))
    }
    /// Under the cell's lock, so no decision runs between the judgement and the tombstone.
    fn evict_if_fresh(&self, cell: &LogCell, now: Nanos) -> bool {
        cell.evict_if(|ring| self.is_empty_at(ring, now))
    }
    /// Empty at `since` means no entry after `since − W`, so empty at `now ≥ since` too.
    fn evict_if_idle(&self, cell: &LogCell, since: Nanos, now: Nanos) -> bool {
        cell.evict_if(|ring| self.is_empty_at(ring, since.min(now)))
    }
    fn take_over(self, _previous: &Self, _now: Nanos) -> Self {
        // Entries are absolute times: a new window or limit applies to them as they are.
        self
    }
    fn to_words(&self) -> Words {
        self.to_words()
    }
    fn from_words(words: Words) -> Self {
        Self::from_words(words)
    }
}

/// Refuses a quota with an explicit burst for an algorithm that has none.
pub(crate) fn no_burst(quota: &crate::Quota, algorithm: &'static str) -> Result<(), QuotaError> {
    if quota.has_burst() {
        Err(QuotaError::BurstNotSupported { algorithm })
    } else {
        Ok(())
    }
}

/// Refuses windows under 1 ms (decision rules: `W ≥ 1 ms` for windows).
pub(crate) fn window_at_least_1ms(quota: &crate::Quota) -> Result<u64, QuotaError> {
    let window_nanos = quota.window_nanos();
    if window_nanos < 1_000_000 {
        Err(QuotaError::WindowTooShort { window_nanos })
    } else {
        Ok(window_nanos)
    }
}

/// Refuses a limit above `max`.
pub(crate) fn limit_at_most(quota: &crate::Quota, max: u64) -> Result<u64, QuotaError> {
    let limit = quota.limit();
    if limit > max {
        Err(QuotaError::TooLarge {
            what: "limit",
            value: limit,
            max,
        })
    } else {
        Ok(limit)
    }
}
