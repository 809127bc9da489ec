//! What every limiter shares: the rule in force (replaceable at run time), the clock, and the
//! protocol that keeps the window counters' stored indices in range (sweep, then rebase).
//!
//! No dependency on quanta or dashmap: `loom-tests` compiles this file to model-check the
//! rebase racing decisions.

use std::cell::Cell;

use crate::clock::{Clock, Nanos};
use crate::quota::QuotaError;
use crate::state::{HighWater, ParamCell};
use crate::store::Stored;
use crate::sync::Mutex;

/// A clock must resolve at least this many steps per emission interval or window.
const MIN_TICKS_PER_PERIOD: u64 = 10;

/// What every limiter shares: its rule (replaceable at run time) and its clock.
#[derive(Debug)]
pub struct Engine<A, C> {
    params: ParamCell<A>,
    clock: C,
    /// The newest reading seen, for clocks that do not promise monotonic readings.
    high_water: Option<HighWater>,
    /// Serialises `set_quota`, sweeps and rebases (the parameter cell allows one writer at a
    /// time, and a sweep must judge every state against the rule in force).
    writer: Mutex<()>,
}

/// How a limiter sweeps its states: evicts (or resets) every one that is fresh at the given
/// time under the given rule; returns how many.
pub trait Sweep<A>: Fn(&A, Nanos) -> usize {}
impl<A, F: Fn(&A, Nanos) -> usize> Sweep<A> for F {}

/// One attempt at a call: the rule it loaded, and the clock as that rule may use it.
pub struct Attempt<'a, A, C> {
    engine: &'a Engine<A, C>,
    rule: A,
    /// Set when a reading passed the rule's sweep instant: the call sweeps once it is done
    /// (not here: the store may hold a lock the sweep needs).
    sweep_due: Cell<bool>,
    /// Set when a reading fell past what `rule` may write: the attempt changed nothing, and the
    /// call runs again once the rule is rebased.
    stale: Cell<bool>,
}

impl<A: Stored, C: Clock> Attempt<'_, A, C> {
    #[inline]
    pub fn rule(&self) -> &A {
        &self.rule
    }

    /// The current time ([`Engine::now`]), noting whether the rule's window indices need
    /// re-anchoring (a window counter, every 2^22 − 2 or 2^39 − 2 windows): the attempt then
    /// sweeps and rebases once its call is done ([`Engine::settle`]).
    #[inline(always)]
    pub fn now_noting_due(&self) -> Nanos {
        let now = self.engine.now();
        if now > self.rule.sweep_due() {
            self.past_due(now);
        }
        now
    }

    #[cold]
    #[inline(never)]
    fn past_due(&self, now: Nanos) {
        self.sweep_due.set(true);
        if self.rule.beyond_horizon(now) {
            self.stale.set(true);
        }
    }
}

impl<A: Stored, C: Clock> Engine<A, C> {
    pub fn new(rule: A, clock: C) -> Result<Self, QuotaError> {
        check_resolution(&rule, &clock)?;
        let high_water = (!clock.is_monotonic()).then(HighWater::new);
        // Window indices are anchored at the window of the first reading.
        let rule = rule.rebase(clock.now());
        Ok(Engine {
            params: ParamCell::new(rule.to_words()),
            clock,
            high_water,
            writer: Mutex::new(()),
        })
    }

    /// The current time, clamped so it never goes back (decision rules: time never goes backwards).
    #[inline]
    pub fn now(&self) -> Nanos {
        let reading = self.clock.now();
        // A constant for the crate's clocks, so the clamp's branch compiles away for them.
        if self.clock.is_monotonic() {
            return reading;
        }
        match &self.high_water {
            None => reading,
            Some(high) => high.clamp(reading),
        }
    }

    #[inline]
    pub fn rule(&self) -> A {
        A::from_words(self.params.load())
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    pub fn set_quota(&self, rule: A) -> Result<(), QuotaError> {
        check_resolution(&rule, &self.clock)?;
        let _writer = self.writer.lock();
        let next = rule.take_over(&self.rule(), self.now());
        self.params.store(next.to_words());
        Ok(())
    }

    /// A new attempt at a call, under the rule in force. A call runs
    /// `loop { let at = core.attempt(); let r = …; if core.settle(&at, &sweep) { return r } }`:
    /// almost always once. (A loop in each caller rather than a method taking the call as a
    /// closure: that closure was not inlined, and the decision it returned was copied through
    /// its frame: +3 ns direct, +14–19 ns keyed at 1k keys.)
    #[inline(always)]
    pub fn attempt(&self) -> Attempt<'_, A, C> {
        Attempt {
            engine: self,
            rule: self.rule(),
            sweep_due: Cell::new(false),
            stale: Cell::new(false),
        }
    }

    /// Whether `attempt`'s result stands. If one of its readings asked for it, sweeps and
    /// rebases first; `false` if the attempt was stale and the call must run again.
    #[inline(always)]
    pub fn settle(&self, attempt: &Attempt<'_, A, C>, sweep: &impl Sweep<A>) -> bool {
        if !attempt.sweep_due.get() {
            return true;
        }
        self.catch_up(attempt.stale.get(), sweep);
        !attempt.stale.get()
    }

    /// Sweeps with the rule in force and a reading taken under the writer lock, so that no
    /// rebase runs meanwhile; rebases too if it is due. Returns what `sweep` evicted.
    pub fn sweep(&self, sweep: &impl Sweep<A>) -> usize {
        let _writer = self.writer.lock();
        self.sweep_locked(sweep)
    }

    /// Runs `judge` with the rule in force and a reading, holding off quota changes and
    /// rebases meanwhile; `None` if one is running (never waits: a store calls this under its
    /// own lock, which a sweep holding the writer lock may be waiting for) or if the reading
    /// is past the rule's sweep instant (the rebase's own sweep will judge).
    pub fn try_judge<R>(&self, judge: impl FnOnce(&A, Nanos) -> R) -> Option<R> {
        let _writer = self.writer.try_lock()?;
        let rule = self.rule();
        let now = self.now();
        (now <= rule.sweep_due()).then(|| judge(&rule, now))
    }

    fn sweep_locked(&self, sweep: &impl Sweep<A>) -> usize {
        let rule = self.rule();
        let now = self.now();
        let evicted = sweep(&rule, now);
        if now > rule.sweep_due() {
            // Every state the rebased rule may read is at most a window behind `now` (or
            // ahead of it), so within its range: `sweep` left no other where it can read it
            // (a store that re-anchors itself keeps older states in tables of an older era,
            // which no decision under the new rule reads before carrying them over).
            self.params.store(rule.rebase(now).to_words());
        }
        evicted
    }

    /// A reading was past the rule's sweep instant. Before the rule's horizon, one caller
    /// sweeps and rebases while the others go on; past it (`wait`), every caller waits for the
    /// rebase, then decides again.
    #[cold]
    #[inline(never)]
    fn catch_up(&self, wait: bool, sweep: &impl Sweep<A>) {
        let _writer = if wait {
            self.writer.lock()
        } else {
            match self.writer.try_lock() {
                Some(writer) => writer,
                None => return,
            }
        };
        // Another caller may have rebased meanwhile.
        if self.now() > self.rule().sweep_due() {
            self.sweep_locked(sweep);
        }
    }
}

fn check_resolution<A: Stored, C: Clock>(rule: &A, clock: &C) -> Result<(), QuotaError> {
    let resolution_nanos = clock.resolution();
    let period_nanos = rule.period();
    // A 1 ns clock resolves every quota: time itself is counted in nanoseconds.
    if resolution_nanos > 1 && resolution_nanos.saturating_mul(MIN_TICKS_PER_PERIOD) > period_nanos
    {
        return Err(QuotaError::ClockTooCoarse {
            resolution_nanos,
            period_nanos,
        });
    }
    Ok(())
}

impl<A: Stored, C: Clock> Engine<A, C> {
    /// Refuses a cost that can never be admitted (decision rules: an error, not a denial). The clock is
    /// still read, so that every call sees time the same way whatever its outcome.
    #[inline]
    pub fn check_cost(&self, rule: &A, cost: u64) -> Result<(), crate::decision::LimitError> {
        let capacity = rule.capacity();
        if cost > capacity {
            self.now();
            Err(crate::decision::LimitError::CapacityExceeded { cost, capacity })
        } else {
            Ok(())
        }
    }
}
