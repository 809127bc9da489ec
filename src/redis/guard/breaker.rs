//! The guarded limiter's circuit breaker: closed (Redis decides), open (the failure policy
//! decides, and a probe looks for Redis now and then), half-open (still the policy, while a run
//! of probes, each answered, shows that Redis answers again for good).
//!
//! ```text
//!            a run of failures lasting `open_after`, or `failure_threshold` in a row,
//!            or `min_failures` making `failure_rate` of the calls over `failure_window`
//!   Closed ───────────────────────────────────────────────────────────────► Open
//!     ▲                                                                  │    ▲
//!     │ `half_open_successes` probes answered in a row     a probe answered │    │ a probe failed
//!     └────────────────────────────── HalfOpen ◄─────────────────────────────┘    │
//!                                         └──────────────────────────────────────┘
//! ```
//!
//! The rules are [`Machine`], a plain value moved by events that carry their time (ns on any
//! monotonic scale), unit-tested below; [`Breaker`] wraps it for threads: a mutex around the
//! machine, taken on failures, on probes, on the background task's tick and on answers only
//! while a run of failures is on; the hot path reads one flag.
//!
//! This file names nothing but `crate::sync`: the loom crate compiles it as it is
//! (`loom-tests/tests/models/breaker.rs`).

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// What opens and closes the breaker (see `FailureHandling`); times in ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Failures in a row (no answer between) that open it; `u32::MAX`: no such rule.
    pub threshold: u32,
    /// A run of failures (no answer between) whose first and latest are this far apart opens
    /// it.
    pub open_after: u64,
    /// The span of the failure-rate window.
    pub window: u64,
    /// The share of calls that must fail over the window, in millionths.
    pub rate_ppm: u32,
    /// The failures the window must hold before its rate counts.
    pub min_failures: u32,
    /// Probes answered in a row that close a half-open breaker.
    pub half_open_successes: u32,
}

/// Where the breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Redis decides.
    Closed,
    /// The policy decides; the next probe that Redis answers makes it half-open.
    Open,
    /// The policy still decides; `answered` probes in a row were answered so far.
    HalfOpen {
        /// Probes answered in a row.
        answered: u32,
    },
}

/// One window's tally: its index (time ÷ window), failures and answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Bucket {
    index: u64,
    failures: u64,
    answers: u64,
}

/// The breaker's rules, as a value: each event takes the time it happened at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    phase: Phase,
    /// Failures since the last answer, and when the first of them came.
    run: u32,
    run_since: u64,
    /// The failure-rate window: this window and the one before (a sliding window counter:
    /// the one before weighs what of it the sliding window still covers).
    cur: Bucket,
    prev: Bucket,
}

impl Default for Machine {
    fn default() -> Self {
        Machine::new()
    }
}

impl Machine {
    /// Closed, with nothing counted.
    pub const fn new() -> Self {
        Machine {
            phase: Phase::Closed,
            run: 0,
            run_since: 0,
            cur: Bucket {
                index: 0,
                failures: 0,
                answers: 0,
            },
            prev: Bucket {
                index: 0,
                failures: 0,
                answers: 0,
            },
        }
    }

    /// Where the breaker is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether a run of failures is on (the next answer ends it).
    pub fn in_a_run(&self) -> bool {
        self.run > 0
    }

    /// Moves the window to `now`'s (window length `window`, at least 1 ns).
    fn roll(&mut self, now: u64, window: u64) {
        let index = now / window.max(1);
        if index == self.cur.index {
            return;
        }
        self.prev = if index == self.cur.index.wrapping_add(1) {
            self.cur
        } else {
            Bucket::default()
        };
        self.cur = Bucket {
            index,
            failures: 0,
            answers: 0,
        };
    }

    /// `answers` calls that Redis answered, by `now`: a run of failures ends.
    pub fn answered(&mut self, now: u64, answers: u64, s: &Settings) {
        self.tally(now, answers, s);
        if answers > 0 {
            self.run = 0;
        }
    }

    /// Counts `answers` answers in `now`'s window, without ending a run (answers folded in
    /// late: they may have come before the run began).
    pub fn tally(&mut self, now: u64, answers: u64, s: &Settings) {
        self.roll(now, s.window);
        self.cur.answers = self.cur.answers.saturating_add(answers);
    }

    /// A transient failure at `now`; whether it opened the breaker. Only a closed breaker
    /// opens: a failure met while it is open or half-open is a call sent before it opened
    /// (probes report through [`Machine::probe_failed`]).
    pub fn failed(&mut self, now: u64, s: &Settings) -> bool {
        self.roll(now, s.window);
        self.cur.failures = self.cur.failures.saturating_add(1);
        if self.phase != Phase::Closed {
            return false;
        }
        if self.run == 0 {
            self.run_since = now;
        }
        self.run = self.run.saturating_add(1);
        let lasting = self.run >= 2 && now.saturating_sub(self.run_since) >= s.open_after;
        if self.run >= s.threshold || lasting || self.rate_exceeded(now, s) {
            self.open();
            return true;
        }
        false
    }

    /// Whether the window's failures reach both `min_failures` and `rate_ppm` of its calls.
    fn rate_exceeded(&self, now: u64, s: &Settings) -> bool {
        let window = u128::from(s.window.max(1));
        // The part of the previous window the sliding window still covers, in ns.
        let covered = if self.prev.index.wrapping_add(1) == self.cur.index {
            window - u128::from(now % s.window.max(1))
        } else {
            0
        };
        // Scaled by the window's length: no division, no rounding.
        let failures =
            u128::from(self.cur.failures) * window + u128::from(self.prev.failures) * covered;
        let answers =
            u128::from(self.cur.answers) * window + u128::from(self.prev.answers) * covered;
        failures >= u128::from(s.min_failures) * window
            && failures * 1_000_000 >= u128::from(s.rate_ppm) * (failures + answers)
    }

    /// Opens the breaker (from any phase); whether it was closed.
    pub fn open(&mut self) -> bool {
        let was_closed = self.phase == Phase::Closed;
        self.phase = Phase::Open;
        self.run = 0;
        was_closed
    }

    /// A probe that Redis answered at `now`; whether it closed the breaker.
    pub fn probe_answered(&mut self, now: u64, s: &Settings) -> bool {
        let answered = match self.phase {
            Phase::Closed => return false,
            Phase::Open => 1,
            Phase::HalfOpen { answered } => answered.saturating_add(1),
        };
        if answered < s.half_open_successes {
            self.phase = Phase::HalfOpen { answered };
            return false;
        }
        // Closed with a clean slate: what failed before the outage ended says nothing now.
        *self = Machine::new();
        self.roll(now, s.window);
        true
    }

    /// A probe that failed: a half-open breaker opens again.
    pub fn probe_failed(&mut self) {
        if self.phase != Phase::Closed {
            self.phase = Phase::Open;
        }
    }
}

/// The breaker shared by a limiter's checks, its background task and the leased tier.
///
/// Relaxed everywhere: `open` is a mode flag that publishes no data, written under the mutex
/// (which orders the writes); a check that reads it a moment late decides one more request
/// the old way. `run_on` is a hint of the machine's run, also written under the mutex: an
/// answer that reads it late leaves a run on until the next answer ends it. `answers` is a
/// tally folded into the machine under the mutex.
#[derive(Debug)]
pub struct Breaker {
    /// Open or half-open: the failure policy decides.
    open: AtomicBool,
    /// A run of failures is on: an answer must end it (takes the mutex).
    run_on: AtomicBool,
    /// Answers not folded into the machine's window yet.
    answers: AtomicU64,
    machine: Mutex<Machine>,
    settings: Settings,
}

impl Breaker {
    /// A closed breaker moved by `settings`.
    pub fn new(settings: Settings) -> Self {
        Breaker {
            open: AtomicBool::new(false),
            run_on: AtomicBool::new(false),
            answers: AtomicU64::new(0),
            machine: Mutex::new(Machine::new()),
            settings,
        }
    }

    /// Whether the failure policy decides (open or half-open).
    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Where the breaker is.
    pub fn phase(&self) -> Phase {
        self.machine.lock().phase()
    }

    /// A call that Redis answered; `now` is read only if a run of failures is on.
    #[inline]
    pub fn answered(&self, now: impl FnOnce() -> u64) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        if self.run_on.load(Ordering::Relaxed) {
            self.end_run(now());
        }
    }

    #[cold]
    fn end_run(&self, now: u64) {
        let mut machine = self.machine.lock();
        let answers = self.answers.swap(0, Ordering::Relaxed);
        machine.answered(now, answers, &self.settings);
        self.run_on.store(machine.in_a_run(), Ordering::Relaxed);
    }

    /// A transient failure at `now`; whether this call opened the breaker (one caller per
    /// opening: the mutex elects it, for the one log line that reports it).
    pub fn failed(&self, now: u64) -> bool {
        let mut machine = self.machine.lock();
        // Answers since the last fold: in the window, but not after this failure's run began.
        let answers = self.answers.swap(0, Ordering::Relaxed);
        machine.tally(now, answers, &self.settings);
        let opened = machine.failed(now, &self.settings);
        self.run_on.store(machine.in_a_run(), Ordering::Relaxed);
        if opened {
            self.open.store(true, Ordering::Relaxed);
        }
        opened
    }

    /// Folds the answers counted so far into the window at `now` (the background task, every
    /// probe interval: answers are placed in time to that precision).
    pub fn tick(&self, now: u64) {
        let mut machine = self.machine.lock();
        let answers = self.answers.swap(0, Ordering::Relaxed);
        machine.tally(now, answers, &self.settings);
    }

    /// Opens the breaker whatever it counted (a limiter starting while Redis does not
    /// answer); whether it was closed.
    pub fn force_open(&self) -> bool {
        let mut machine = self.machine.lock();
        let opened = machine.open();
        self.run_on.store(false, Ordering::Relaxed);
        self.open.store(true, Ordering::Relaxed);
        opened
    }

    /// A probe that Redis answered at `now`; whether this call closed the breaker (one caller
    /// per closing).
    pub fn probe_answered(&self, now: u64) -> bool {
        let mut machine = self.machine.lock();
        let closed = machine.probe_answered(now, &self.settings);
        if closed {
            // Answers of calls sent before the outage ended say nothing of the new window.
            self.answers.store(0, Ordering::Relaxed);
            self.run_on.store(false, Ordering::Relaxed);
            self.open.store(false, Ordering::Relaxed);
        }
        closed
    }

    /// A probe that failed: a half-open breaker opens again.
    pub fn probe_failed(&self) {
        self.machine.lock().probe_failed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// The defaults of `FailureHandling`.
    fn defaults() -> Settings {
        Settings {
            threshold: u32::MAX,
            open_after: 250 * MS,
            window: 1_000 * MS,
            rate_ppm: 500_000,
            min_failures: 20,
            half_open_successes: 3,
        }
    }

    /// A machine that saw `answers` answers a ms for the second before `at`.
    fn busy_until(at: u64, answers: u64, s: &Settings) -> Machine {
        let mut m = Machine::new();
        for t in (at.saturating_sub(1_000 * MS)..at).step_by(MS as usize) {
            m.answered(t, answers, s);
        }
        m
    }

    /// A 60 ms stall with a 50 ms timeout under load: every call in flight fails at about the
    /// same time (here 64 at once, then the calls sent in the stall's last 10 ms), then Redis
    /// answers. Neither the run (10 ms long) nor the rate (64 of thousands) opens it.
    #[test]
    fn a_short_stall_under_load_does_not_open_it() {
        let s = defaults();
        let t0 = 5_000 * MS;
        let mut m = busy_until(t0, 5, &s);
        for i in 0..64 {
            assert!(!m.failed(t0 + 50 * MS + i * 10_000, &s));
        }
        for t in 51..=60 {
            assert!(!m.failed(t0 + t * MS, &s));
        }
        m.answered(t0 + 61 * MS, 1, &s);
        assert_eq!(m.phase(), Phase::Closed);
        assert!(!m.in_a_run());
        // The next stall starts a new run.
        assert!(!m.failed(t0 + 400 * MS, &s));
        assert!(!m.failed(t0 + 460 * MS, &s));
        assert_eq!(m.phase(), Phase::Closed);
    }

    /// A server that stops answering: the run of failures opens the breaker once it has lasted
    /// `open_after`, however few calls met it; a single failure never does.
    #[test]
    fn a_lasting_run_of_failures_opens_it() {
        let s = defaults();
        let t0 = 5_000 * MS;
        let mut m = busy_until(t0, 5, &s);
        assert!(!m.failed(t0 + 50 * MS, &s));
        assert!(!m.failed(t0 + 299 * MS, &s), "249 ms of failures");
        assert!(m.failed(t0 + 300 * MS, &s), "250 ms of failures");
        assert_eq!(m.phase(), Phase::Open);
        assert!(!m.failed(t0 + 301 * MS, &s), "opened once");
        // A quiet node: one failure, then nothing for a minute, then another.
        let mut quiet = Machine::new();
        assert!(!quiet.failed(t0, &s));
        assert!(quiet.failed(t0 + 60_000 * MS, &s));
    }

    /// Failures interleaved with answers (a server that drops half its calls) open it by the
    /// rate, once the window holds `min_failures`; below the rate they never do.
    #[test]
    fn a_failure_rate_over_the_window_opens_it() {
        let s = defaults();
        let mut half = Machine::new();
        let mut opened_at = None;
        for i in 0..200u64 {
            let t = 1_000 * MS + i * MS;
            half.answered(t, 1, &s);
            if half.failed(t, &s) {
                opened_at = Some(i);
                break;
            }
        }
        assert_eq!(opened_at, Some(19), "at the 20th failure, half the calls");
        let mut some = Machine::new();
        for i in 0..5_000u64 {
            let t = 1_000 * MS + i * MS;
            some.answered(t, 2, &s);
            assert!(!some.failed(t, &s), "a third of the calls fail");
        }
        // The previous window counts for what the sliding window still covers of it.
        let mut sliding = Machine::new();
        sliding.answered(1_000 * MS, 100, &s);
        for i in 0..19 {
            assert!(!sliding.failed(1_999 * MS, &s), "{i}");
            sliding.answered(1_999 * MS, 1, &s);
        }
        // At 2.5 s, half of the previous window's 19 failures and 119 answers still count:
        // the 50th failure then makes half of the calls (59.5 of 119).
        let opened = (1..=100).find(|_| sliding.failed(2_500 * MS, &s));
        assert_eq!(opened, Some(50));
    }

    /// `failure_threshold`: that many failures in a row open it, as before the other rules.
    #[test]
    fn failures_in_a_row_open_it_when_a_threshold_is_set() {
        let s = Settings {
            threshold: 3,
            ..defaults()
        };
        let mut m = busy_until(5_000 * MS, 5, &s);
        assert!(!m.failed(5_000 * MS, &s));
        assert!(!m.failed(5_000 * MS, &s));
        m.answered(5_001 * MS, 1, &s);
        assert!(!m.failed(5_002 * MS, &s));
        assert!(!m.failed(5_002 * MS, &s));
        assert!(m.failed(5_002 * MS, &s));
        let one = Settings {
            threshold: 1,
            ..defaults()
        };
        assert!(Machine::new().failed(0, &one));
    }

    /// Open → half-open on an answered probe → closed after `half_open_successes` in a row;
    /// a failed probe in between opens it again, and the run starts over.
    #[test]
    fn it_closes_only_after_a_half_open_run_of_answered_probes() {
        let s = defaults();
        let mut m = Machine::new();
        assert!(m.open());
        assert!(!m.open(), "already open");
        assert!(!m.probe_answered(10 * MS, &s));
        assert_eq!(m.phase(), Phase::HalfOpen { answered: 1 });
        assert!(!m.probe_answered(20 * MS, &s));
        m.probe_failed();
        assert_eq!(m.phase(), Phase::Open);
        // Calls sent before it opened may still fail: they move nothing.
        assert!(!m.failed(25 * MS, &s));
        for (i, t) in [30, 40].into_iter().enumerate() {
            assert!(!m.probe_answered(t * MS, &s));
            assert_eq!(
                m.phase(),
                Phase::HalfOpen {
                    answered: i as u32 + 1
                }
            );
        }
        assert!(m.probe_answered(50 * MS, &s));
        assert_eq!(m.phase(), Phase::Closed);
        assert!(!m.probe_answered(60 * MS, &s), "closed already");
        // A clean slate: the failures before the outage's end do not count.
        assert!(!m.failed(70 * MS, &s));
        assert!(!m.in_a_run() || m.phase() == Phase::Closed);
        let once = Settings {
            half_open_successes: 1,
            ..defaults()
        };
        let mut m = Machine::new();
        m.open();
        assert!(m.probe_answered(0, &once), "one probe closes it");
    }

    /// The shared breaker: an answer ends a run only through the mutex while one is on, the
    /// flag follows the machine, and answers folded late count in the window but end no run.
    #[test]
    fn the_shared_breaker_follows_its_machine() {
        let s = defaults();
        let b = Breaker::new(s);
        assert!(!b.is_open());
        for _ in 0..1_000 {
            b.answered(|| unreachable!("no run: the clock is not read"));
        }
        assert!(!b.failed(1_000 * MS));
        b.answered(|| 1_001 * MS);
        assert!(!b.failed(1_100 * MS));
        assert!(!b.failed(1_349 * MS));
        assert!(b.failed(1_350 * MS));
        assert!(b.is_open());
        assert_eq!(b.phase(), Phase::Open);
        assert!(!b.probe_answered(1_400 * MS));
        assert!(b.is_open(), "half-open: the policy still decides");
        b.probe_failed();
        assert_eq!(b.phase(), Phase::Open);
        assert!(!b.probe_answered(1_500 * MS));
        assert!(!b.probe_answered(1_550 * MS));
        assert!(b.probe_answered(1_600 * MS));
        assert!(!b.is_open());
        assert!(b.force_open());
        assert!(!b.force_open());
        b.tick(1_700 * MS);
    }
}
