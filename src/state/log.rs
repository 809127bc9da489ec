//! The sliding log's per-key cell: a ring of 4-byte slots whose admissions are decided and
//! published by a CAS on one 128-bit header, with no lock on the check path.
//!
//! # Protocol
//! The header holds the ring's head and tail *positions* (in `[0, 2 × capacity)`: a slot's
//! index and which of two laps it is in), the latest time a change was decided at, the
//! entries' tick, the storage's generation and the cell's flags. A slot holds an entry's time
//! in ticks (31 bits, read as an age below the header's time) and one bit that says for which
//! lap it was written.
//!
//! - **A check** reads the header, then the slots from head to tail, and decides with the pure
//!   rule ([`SlidingLog::judge`]). An admission CASes the header (expired entries dropped from
//!   the head, `c` positions claimed at the tail, the time moved to the check's) and then writes
//!   its `c` slots. A slot whose lap bit is not its position's is *being written*: it counts as
//!   live, at the header's time (no earlier than its own), and the head never passes it. So no
//!   decision is more permissive than the exact rule, and every decision on a log whose slots are
//!   all written (every sequential trace) is the exact rule's. A denial or a peek writes nothing:
//!   it stands if the header did not change while the slots were read.
//! - **Time order**: a check decides at the later of its clock and the header's time, which
//!   every admission moves forward. So entries are appended in time order, as under a lock.
//! - **A slot is written once per lap**: the head never passes a slot being written, so the
//!   tail reaches it again only after its writer wrote it. A stale writer never overwrites a
//!   newer entry.
//! - **Exclusive changes**: growing or shrinking the ring, a refund, a quota change that
//!   changes the tick, and a move to another table *freeze* the header by CAS, wait until every
//!   claimed slot is written, rebuild the log, and publish the new header (new generation).
//!   Checks that meet a frozen header wait for it: these are the only waits, and they happen
//!   when a key's log changes size or gives units back, never between two admissions on a log
//!   that keeps its size.
//! - **Storage**: up to [`INLINE`] entries live in the cell; a longer log has a heap ring,
//!   replaced when it grows and freed once no reader holds it (epoch reclamation,
//!   `ReclaimedSlots`); a log back in the cell keeps a small ring idle for its next growth. A
//!   CAS by a call that read an old ring fails: the header's time and generation together
//!   never repeat (`Header::versioned`).
//!
//! In a keyed limiter the cell lives in the lock-free table, which evicts it (a tombstone, by
//! CAS, when its log is empty) or moves it (frozen, then marked moved), and a decision that
//! finds it retired returns `None` so that the table looks the key up again.

use crate::algorithm::sliding_log::{Entries, SlidingLog};
use crate::clock::Nanos;
use crate::decision::Decision;
use crate::sync::{
    fence, spin_loop, yield_now, AtomicU128, AtomicU32, Detached, Ordering, ReclaimedSlots, Slots,
};

/// Entries kept in the cell itself: 24 bytes, beside the 16-byte header and the heap pointer, so
/// that a log cell is 48 bytes and with a `u64` key fills one 64-byte cache line.
pub(crate) const INLINE: usize = 6;

/// A heap log moves back into the cell once it holds at most this many entries (below
/// [`INLINE`], so that a log hovering at the boundary does not move at every check).
const SHRINK_AT: u32 = 3;

/// The smallest heap ring.
const FIRST_HEAP: u32 = 16;

/// A heap ring a log moved back into its cell keeps, idle, for its next growth, if it has at
/// most this many slots (256 bytes).
const IDLE_MOST: usize = 64;

/// Whether a ring of `capacity` slots suits a log of `len` entries: they fit, and it is not four
/// times too large (unless it is the smallest ring).
fn suits(capacity: u32, len: u32) -> bool {
    capacity >= len && (capacity <= FIRST_HEAP || len * 4 > capacity)
}

/// A position is below `2 × capacity`, and a capacity at most [`SlidingLog::MAX_LIMIT`].
const POSITION_BITS: u32 = 21;
const POSITION_MASK: u32 = (1 << POSITION_BITS) - 1;
const GEN_MASK: u16 = (1 << 14) - 1;

/// A slot's time: the low 31 bits of its entry's time in ticks.
const TIME_MASK: u64 = (1 << 31) - 1;

/// Header flags.
const FROZEN: u8 = 1;
const TOMBSTONE: u8 = 2;
const MOVED: u8 = 4;
const HEAP: u8 = 8;

/// The header word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    /// The latest time (ns) a change was decided at: no decision is made before it (a key's
    /// time never goes backwards), no entry is after it, and every entry was live at it.
    at: u64,
    /// The oldest entry's position.
    head: u32,
    /// The position after the newest entry.
    tail: u32,
    /// The entries' tick ([`SlidingLog::tick_code`]); 0 until the first entry.
    tick: u8,
    flags: u8,
    /// Bumped by every exclusive change, modulo 2^14; with `at` above it, a version that no
    /// header repeats ([`Header::versioned`]), so that a CAS from before the change fails.
    generation: u16,
}

impl Header {
    fn pack(self) -> u128 {
        u128::from(self.at)
            | u128::from(self.head) << 64
            | u128::from(self.tail) << 85
            | u128::from(self.tick) << 106
            | u128::from(self.flags) << 110
            | u128::from(self.generation) << 114
    }

    fn unpack(word: u128) -> Header {
        Header {
            at: word as u64,
            head: (word >> 64) as u32 & POSITION_MASK,
            tail: (word >> 85) as u32 & POSITION_MASK,
            tick: (word >> 106) as u8 & 0xf,
            flags: (word >> 110) as u8 & 0xf,
            generation: (word >> 114) as u16 & GEN_MASK,
        }
    }

    fn retired(self) -> bool {
        self.flags & (TOMBSTONE | MOVED) != 0
    }

    /// The time an exclusive change of this (frozen) header decides at, given the time `t` it
    /// was asked to, and the generation it publishes.
    ///
    /// The pair (`at`, `generation`), compared in that order, never goes down: an admission, a
    /// tombstone and a revival move `at` forward or leave it and keep `generation`, and a moved cell is
    /// never live again. Every exclusive change makes it larger: `generation` goes up by one, and when
    /// it wraps to 0 `at` moves on, by the clock or else by 1 ns. So a live header equal to one
    /// a call read earlier is one that no exclusive change has published since (one under way
    /// shows `FROZEN`), and the storage the call read, the ring and every slot, is still the
    /// log's: its CAS from that header is sound. A 14-bit generation alone comes back after
    /// 16,384 changes within one clock reading (a coarse tick, a manual clock), and a check
    /// preempted that long could commit into a ring the log no longer has. The carry moves a key's
    /// time ahead of its clock only when the clock stood still over 16,384 exclusive changes of
    /// the key: by 1 ns each time. (At `u64::MAX` ns, where only a manual clock pushed there
    /// gets, there is no later time to move to.)
    fn versioned(self, t: Nanos) -> (Nanos, u16) {
        let generation = self.generation.wrapping_add(1) & GEN_MASK;
        let t = self.at.max(t);
        if generation == 0 && t == self.at {
            (t.saturating_add(1), generation)
        } else {
            (t, generation)
        }
    }
}

/// A ring's capacity and its positions' arithmetic.
#[derive(Debug, Clone, Copy)]
struct Positions(u32);

impl Positions {
    fn advance(self, position: u32, n: u32) -> u32 {
        let p = position + n;
        if p >= 2 * self.0 {
            p - 2 * self.0
        } else {
            p
        }
    }

    fn between(self, head: u32, tail: u32) -> u32 {
        if tail >= head {
            tail - head
        } else {
            tail + 2 * self.0 - head
        }
    }

    fn index(self, position: u32) -> usize {
        (if position >= self.0 {
            position - self.0
        } else {
            position
        }) as usize
    }

    /// The lap bit a slot written at `position` holds: 1 in the first lap, 0 in the second, so
    /// that zeroed slots read as not yet written in the first.
    fn lap(self, position: u32) -> u32 {
        u32::from(position < self.0)
    }

    fn written(self, ticks: u64, position: u32) -> u32 {
        ((ticks & TIME_MASK) as u32) << 1 | self.lap(position)
    }

    fn holds(self, head: u32, tail: u32) -> bool {
        head < 2 * self.0 && tail < 2 * self.0
    }
}

/// A log's entries as a header and its slots show them.
struct View<'a> {
    slots: &'a [AtomicU32],
    positions: Positions,
    head: u32,
    count: u32,
    /// The header's time in ticks: every entry is at or before it, within 2^31 ticks.
    reference: u64,
}

impl<'a> View<'a> {
    #[inline]
    fn new(header: Header, slots: &'a [AtomicU32]) -> View<'a> {
        let positions = Positions(slots.len() as u32);
        let reference = match SlidingLog::tick_of(header.tick) {
            // The tick of every window up to 2.1 s: no division.
            Some(1) | None => header.at,
            Some(tick) => header.at.div_ceil(tick),
        };
        View {
            slots,
            positions,
            head: header.head,
            count: positions.between(header.head, header.tail),
            reference,
        }
    }
}

impl View<'_> {
    /// Waits until every entry is written: in a frozen log, the calls that claimed the slots
    /// did so before the freeze and are about to write them.
    fn wait_written(&self) {
        for i in 0..self.count {
            let mut round = 0;
            while self.ticks(i).is_none() {
                wait(&mut round);
            }
        }
    }
}

impl Entries for View<'_> {
    fn count(&self) -> u32 {
        self.count
    }

    #[inline(always)]
    fn ticks(&self, i: u32) -> Option<u64> {
        let position = self.positions.advance(self.head, i);
        // Acquire: keeps the reads after it (a denial's re-check of the header) after it, and
        // makes a slot an exclusive change rewrote after its fence carry the freeze to that
        // re-check, so that a decision that writes nothing stands only on slots read under
        // that header (the seqlock reader's fence(Acquire), one load at a time).
        let slot = self.slots[self.positions.index(position)].load(Ordering::Acquire);
        if slot & 1 != self.positions.lap(position) {
            return None;
        }
        let age = (self.reference & TIME_MASK).wrapping_sub(u64::from(slot >> 1)) & TIME_MASK;
        Some(self.reference.saturating_sub(age))
    }
}

/// A heap ring for `len` entries and room to grow (twice them, at least [`FIRST_HEAP`], at most
/// `limit`), holding `entries` from its first position.
fn heap_ring(len: u32, limit: u64, entries: impl Iterator<Item = u64>) -> Slots {
    let most = limit.clamp(u64::from(len), SlidingLog::MAX_LIMIT) as u32;
    let capacity = (len * 2).max(FIRST_HEAP).min(most).max(len);
    let slots = Slots::zeroed(capacity as usize);
    fill(slots.as_slice(), entries);
    slots
}

/// Writes `entries` into `slots` from the first position, and marks the others not written.
/// The caller holds the cell exclusively and publishes the slots with the header.
fn fill(slots: &[AtomicU32], entries: impl Iterator<Item = u64>) {
    let positions = Positions(slots.len() as u32);
    let mut entries = entries.fuse();
    for (i, slot) in slots.iter().enumerate() {
        let value = entries
            .next()
            .map_or(0, |ticks| positions.written(ticks, i as u32));
        // Relaxed: published by the header's release store.
        slot.store(value, Ordering::Relaxed);
    }
}

/// A frozen log's entries, re-expressed in a new tick when the quota changed it.
struct Rewritten<'a> {
    view: &'a View<'a>,
    /// The old tick, the new one, and the time in new ticks no entry may pass.
    retick: Option<(u64, u64, u64)>,
}

impl<'a> Rewritten<'a> {
    /// `view`'s entries in `rule`'s tick at `t`: as `Ring::retick`, rounded up, to no later
    /// than `t`.
    fn new(view: &'a View<'a>, header: Header, rule: &SlidingLog, t: Nanos) -> Rewritten<'a> {
        Rewritten {
            view,
            retick: SlidingLog::tick_of(header.tick)
                .filter(|_| header.tick != rule.tick_code())
                .map(|old| (old, rule.tick_nanos(), rule.ticks_ceil(t))),
        }
    }
}

impl Entries for Rewritten<'_> {
    fn count(&self) -> u32 {
        self.view.count
    }

    fn ticks(&self, i: u32) -> Option<u64> {
        let ticks = self.view.ticks(i)?;
        Some(match self.retick {
            Some((old, new, now)) => ticks.saturating_mul(old).div_ceil(new).min(now),
            None => ticks,
        })
    }
}

/// A live log taken out of a cell that moves to a new table: its header (positions, time,
/// tick) and its slots, the cell's copied or its heap ring handed over as it is (no copy, no
/// allocation).
#[derive(Debug)]
pub struct LogState {
    header: Header,
    slots: MovedSlots,
}

#[derive(Debug)]
enum MovedSlots {
    Inline([u32; INLINE]),
    Heap(Detached),
}

/// A sliding log's per-key state: a ring of entry times updated by CAS (module docs).
///
/// 48 bytes: the header, the heap ring's pointer and [`INLINE`] inline slots.
pub struct LogCell {
    header: AtomicU128,
    heap: ReclaimedSlots,
    inline: [AtomicU32; INLINE],
}

impl Default for LogCell {
    fn default() -> Self {
        LogCell {
            header: AtomicU128::new(0),
            heap: ReclaimedSlots::null(),
            inline: Default::default(),
        }
    }
}

impl std::fmt::Debug for LogCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogCell")
            .field("header", &self.load())
            .finish_non_exhaustive()
    }
}

/// What an exclusive change does to the entries that are live at its time.
enum Change {
    /// Appends `cost` entries at `at` ticks (an admission that needs another ring).
    Append { cost: u64, at: u64 },
    /// Drops up to this many of the newest entries.
    Refund(u64),
    /// Re-expresses the entries in the rule's tick.
    Retick,
}

/// What one attempt of a check came to.
enum Step {
    Done(Decision),
    Retry,
    Exclusive { decision: Decision, at: u64 },
}

/// Waits for another thread's change to a log: spins briefly, then lets other threads run.
fn wait(round: &mut u32) {
    if *round < 16 {
        spin_loop();
    } else {
        yield_now();
    }
    *round = round.saturating_add(1);
}

impl LogCell {
    #[inline(always)]
    fn load(&self) -> Header {
        // Acquire: pairs with the CAS or store that published the header, so the slots it
        // covers are read as they were when it was published (or later).
        Header::unpack(self.header.load(Ordering::Acquire))
    }

    /// The header once no exclusive change holds it (waiting meanwhile); `None` if a keyed
    /// store retired the cell.
    #[inline(always)]
    fn settled(&self, round: &mut u32) -> Option<Header> {
        loop {
            let header = self.load();
            if header.retired() {
                return None;
            }
            if header.flags & FROZEN == 0 {
                return Some(header);
            }
            wait(round);
        }
    }

    #[inline(always)]
    fn cas(&self, current: Header, new: Header) -> bool {
        // AcqRel: release publishes what came before (a rebuilt ring's slots, a frozen log's
        // entries); acquire orders this call's slot writes after the previous owner's reads.
        self.header
            .compare_exchange(
                current.pack(),
                new.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Runs `f` on the slots `header` describes; `None` if they are gone (a heap ring replaced
    /// since the header was read: the caller reads the header again).
    #[inline]
    fn with_slots<R>(&self, header: Header, f: impl FnOnce(&[AtomicU32]) -> R) -> Option<R> {
        if header.flags & HEAP == 0 {
            Some(f(&self.inline))
        } else {
            self.heap.with(|ring| ring.map(f))
        }
    }

    /// Decides a request of `cost` at the time `now` reads (the later of it and the log's
    /// time), appending its entries when `commit` and allowed; `None` if a keyed store retired
    /// the cell.
    #[inline]
    pub(crate) fn decide(
        &self,
        rule: &SlidingLog,
        now: impl Fn() -> Nanos,
        cost: u64,
        commit: bool,
    ) -> Option<Decision> {
        self.decide_at(rule, now, cost, commit)
            .map(|(decision, _)| decision)
    }

    /// [`LogCell::decide`], and the time it decided at (what the loom models check the
    /// window invariant against).
    #[inline]
    pub fn decide_at(
        &self,
        rule: &SlidingLog,
        now: impl Fn() -> Nanos,
        cost: u64,
        commit: bool,
    ) -> Option<(Decision, Nanos)> {
        let tick = rule.tick_code();
        let mut round = 0;
        loop {
            let header = self.settled(&mut round)?;
            let t = now().max(header.at);
            if header.tick != tick && header.tick != 0 && header.head != header.tail {
                self.exclusive(header, rule, t, Change::Retick);
                continue;
            }
            let step = self.with_slots(header, |slots| {
                self.attempt(header, slots, rule, tick, t, cost, commit)
            });
            match step {
                Some(Step::Done(decision)) => return Some((decision, t)),
                Some(Step::Exclusive { decision, at }) => {
                    if self.exclusive(header, rule, t, Change::Append { cost, at }) {
                        return Some((decision, t));
                    }
                }
                Some(Step::Retry) | None => {}
            }
        }
    }

    /// One attempt of [`LogCell::decide`] on the slots `header` describes.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn attempt(
        &self,
        header: Header,
        slots: &[AtomicU32],
        rule: &SlidingLog,
        tick: u8,
        t: Nanos,
        cost: u64,
        commit: bool,
    ) -> Step {
        let positions = Positions(slots.len() as u32);
        if !positions.holds(header.head, header.tail) {
            return Step::Retry;
        }
        let view = View::new(header, slots);
        let judged = rule.judge(&view, t, view.reference, cost, commit);
        let Some(at) = judged.append else {
            // Nothing to write: the decision stands if the header did not change meanwhile.
            return if self.load() == header {
                Step::Done(judged.decision)
            } else {
                Step::Retry
            };
        };
        // `cost ≤ L < 2^20` once allowed.
        let kept = view.count - judged.expired;
        let len = kept + cost as u32;
        if len > positions.0 || (header.flags & HEAP != 0 && len <= SHRINK_AT) {
            return Step::Exclusive {
                decision: judged.decision,
                at,
            };
        }
        let next = Header {
            at: t,
            head: positions.advance(header.head, judged.expired),
            tail: positions.advance(header.tail, cost as u32),
            tick,
            ..header
        };
        if !self.cas(header, next) {
            return Step::Retry;
        }
        let mut position = header.tail;
        for _ in 0..cost {
            // Relaxed: the slot's one word (time and lap bit) is all it publishes; that no
            // later lap overwrites it first is the header's doing (the head never passes a
            // slot not read as written, and the tail reaches it again only past the head).
            slots[positions.index(position)]
                .store(positions.written(at, position), Ordering::Relaxed);
            position = positions.advance(position, 1);
        }
        Step::Done(judged.decision)
    }

    /// Gives back up to `cost` of the newest live entries; `None` if the cell was retired.
    pub fn refund(&self, rule: &SlidingLog, now: impl Fn() -> Nanos, cost: u64) -> Option<()> {
        let mut round = 0;
        loop {
            let header = self.settled(&mut round)?;
            // Read even when there is nothing to give back: a limiter's clock clamps on it.
            let t = now().max(header.at);
            if cost == 0 || header.head == header.tail {
                return Some(());
            }
            if self.exclusive(header, rule, t, Change::Refund(cost)) {
                return Some(());
            }
        }
    }

    /// Whether no entry counts at `now` (`None` if the cell was retired). An entry being
    /// written counts. (The tests' reading of what `evict_if_empty` judges.)
    #[cfg(test)]
    pub(crate) fn is_empty_at(&self, rule: &SlidingLog, now: Nanos) -> Option<bool> {
        loop {
            let header = self.load();
            if header.retired() {
                return None;
            }
            if let Some(empty) = self.judged_empty(header, rule, now) {
                return Some(empty);
            }
        }
    }

    /// Whether `header`'s log is empty at `now`; `None` if the header changed while it was read.
    fn judged_empty(&self, header: Header, rule: &SlidingLog, now: Nanos) -> Option<bool> {
        if header.head == header.tail {
            return Some(true);
        }
        if header.flags & FROZEN != 0 {
            // Changing: judged by the next call.
            return Some(false);
        }
        let t = now.max(header.at);
        let judged = self.with_slots(header, |slots| {
            let positions = Positions(slots.len() as u32);
            positions.holds(header.head, header.tail).then(|| {
                let view = View::new(header, slots);
                let entries = Rewritten::new(&view, header, rule, t);
                rule.judge(&entries, t, view.reference, 0, false).expired == view.count
            })
        })??;
        (self.load() == header).then_some(judged)
    }

    /// Retires a live cell as a tombstone if its log is empty at `now`; whether it did.
    pub(crate) fn evict_if_empty(&self, rule: &SlidingLog, now: Nanos) -> bool {
        loop {
            let header = self.load();
            if header.retired() {
                return false;
            }
            match self.judged_empty(header, rule, now) {
                Some(false) => return false,
                None => continue,
                Some(true) => {
                    let tombstone = Header {
                        at: header.at.max(now),
                        head: header.tail,
                        flags: header.flags | TOMBSTONE,
                        ..header
                    };
                    if self.cas(header, tombstone) {
                        return true;
                    }
                }
            }
        }
    }

    /// Makes a tombstone live (and empty) again; whether it was one.
    pub(crate) fn revive(&self) -> bool {
        loop {
            let header = self.load();
            if header.flags & TOMBSTONE == 0 {
                return false;
            }
            let live = Header {
                flags: header.flags & !TOMBSTONE,
                ..header
            };
            if self.cas(header, live) {
                return true;
            }
        }
    }

    /// Whether a keyed store retired the cell, and how: `Some(true)` moved, `Some(false)` a
    /// tombstone.
    pub(crate) fn retired(&self) -> Option<bool> {
        let header = self.load();
        header.retired().then_some(header.flags & MOVED != 0)
    }

    /// Marks a live cell moved and returns its log; `None` for a tombstone.
    pub(crate) fn take_to_move(&self) -> Option<LogState> {
        let mut round = 0;
        loop {
            let header = self.load();
            if header.flags & TOMBSTONE != 0 {
                return None;
            }
            if header.flags & FROZEN != 0 {
                wait(&mut round);
                continue;
            }
            let frozen = Header {
                flags: header.flags | FROZEN,
                ..header
            };
            if !self.cas(header, frozen) {
                continue;
            }
            // Every claimed slot written, so no writer touches the slots once they move.
            let slots = self.with_slots(frozen, |slots| {
                View::new(frozen, slots).wait_written();
                (frozen.flags & HEAP == 0).then(|| {
                    // Relaxed: the frozen header's acquire ordered these after their writes.
                    std::array::from_fn(|i| self.inline[i].load(Ordering::Relaxed))
                })
            });
            let slots = match slots.flatten() {
                Some(inline) => MovedSlots::Inline(inline),
                // Readers that loaded the ring may go on reading it: it is handed over, not
                // copied or freed.
                None => match self.heap.detach() {
                    Some(ring) => MovedSlots::Heap(ring),
                    None => MovedSlots::Inline([0; INLINE]),
                },
            };
            // Release: ordered as the header's other stores (no reader reads a moved cell's
            // slots).
            self.header.store(
                Header {
                    flags: MOVED,
                    ..header
                }
                .pack(),
                Ordering::Release,
            );
            return Some(LogState {
                header: frozen,
                slots,
            });
        }
    }

    /// Stores a moved log in a cell no decision has reached yet.
    pub(crate) fn put(&self, state: LogState) {
        let generation = self.load().generation.wrapping_add(1) & GEN_MASK;
        let flags = match state.slots {
            MovedSlots::Inline(slots) => {
                for (slot, value) in self.inline.iter().zip(slots) {
                    // Relaxed: published by the header's release store below.
                    slot.store(value, Ordering::Relaxed);
                }
                0
            }
            MovedSlots::Heap(ring) => {
                self.heap.attach(ring);
                HEAP
            }
        };
        let next = Header {
            flags,
            generation,
            ..state.header
        };
        // Release: publishes the slots (the table publishes the cell after this anyway).
        self.header.store(next.pack(), Ordering::Release);
    }

    /// Freezes the log from `header`, waits for its claimed slots to be written, applies
    /// `change` at `t` to the entries live then, and publishes the result in a new generation:
    /// in place when the log keeps its storage, else in the storage its new size asks for.
    /// False if the header had changed (nothing done). Allocates only a heap ring for a log
    /// that outgrows its storage.
    fn exclusive(&self, header: Header, rule: &SlidingLog, t: Nanos, change: Change) -> bool {
        let frozen = Header {
            flags: header.flags | FROZEN,
            ..header
        };
        if !self.cas(header, frozen) {
            return false;
        }
        // Release, as a seqlock's writer after its odd store: a call whose Acquire load of a
        // slot reads one of the relaxed stores below then sees the freeze (or later) when it
        // reads the header again, so that no denial or peek stands on half-rewritten slots
        // beside the header they were rewritten from (the CAS's release orders only what came
        // before it).
        fence(Ordering::Release);
        let (t, generation) = frozen.versioned(t);
        let tick = rule.tick_code();
        let heap = frozen.flags & HEAP != 0;
        let rebuilt = self.with_slots(frozen, |slots| {
            let positions = Positions(slots.len() as u32);
            let view = View::new(frozen, slots);
            view.wait_written();
            let entries = Rewritten::new(&view, frozen, rule, t);
            let expired = rule.judge(&entries, t, 0, 0, false).expired;
            let live = view.count - expired;
            let (kept, appended, at) = match change {
                Change::Append { cost, at } => (live, cost as u32, at),
                Change::Refund(cost) => (live - cost.min(u64::from(live)) as u32, 0, 0),
                Change::Retick => (live, 0, 0),
            };
            let len = kept + appended;
            let new_entries = (expired..expired + kept)
                .filter_map(|i| entries.ticks(i))
                .chain((0..appended).map(|_| at));
            let stays = if heap {
                len > SHRINK_AT && suits(positions.0, len)
            } else {
                len as usize <= INLINE
            };
            if stays {
                // In place: the kept entries keep their positions (rewritten if re-ticked);
                // the refunded ones read as not written again.
                let head = positions.advance(frozen.head, expired);
                let tail = positions.advance(head, len);
                let mut position = head;
                for ticks in new_entries {
                    // Relaxed: published by the header's release store.
                    slots[positions.index(position)]
                        .store(positions.written(ticks, position), Ordering::Relaxed);
                    position = positions.advance(position, 1);
                }
                while position != frozen.tail {
                    slots[positions.index(position)]
                        .store(positions.lap(position) ^ 1, Ordering::Relaxed);
                    position = positions.advance(position, 1);
                }
                (head, tail, frozen.flags & HEAP, None)
            } else if len <= SHRINK_AT {
                // A heap log back into the cell (a log in the cell stays there while it fits,
                // above); the heap ring stays, idle, for the log's next growth.
                fill(&self.inline, new_entries);
                (0, len, 0, None)
            } else {
                // Out of the cell: into the idle ring a shrink left, if it suits the size (no
                // allocation, no reclamation for a log that comes and goes across the cell's
                // size), else a new ring.
                let idle = self.heap.with(|ring| {
                    ring.filter(|ring| !heap && suits(ring.len() as u32, len))
                        .map(|ring| fill(ring, new_entries.clone()))
                });
                match idle {
                    Some(()) => (0, len, HEAP, None),
                    None => (
                        0,
                        len,
                        HEAP,
                        Some(heap_ring(len, rule.limit(), new_entries)),
                    ),
                }
            }
        });
        // Frozen: its storage is not replaced before this call publishes the next header.
        let (head, tail, flags, ring) =
            rebuilt.unwrap_or((frozen.head, frozen.tail, frozen.flags & HEAP, None));
        if ring.is_some() {
            self.heap.replace(ring);
        } else if heap
            && flags & HEAP == 0
            && self.heap.with(|ring| ring.map_or(0, <[_]>::len)) > IDLE_MOST
        {
            // A large ring is not kept idle. Released while the log is still frozen: once the
            // next header is out, another change may move the log into the idle ring, and a
            // release after it left a heap header with no ring (checks retried for ever).
            self.heap.replace(None);
        }
        let next = Header {
            at: t,
            head,
            tail,
            tick: if head == tail { frozen.tick } else { tick },
            flags: (frozen.flags & !(FROZEN | HEAP)) | flags,
            generation,
        };
        // Release: publishes the slots written above (and a new ring's pointer before it).
        self.header.store(next.pack(), Ordering::Release);
        true
    }

    /// Where the log lives: whether on the heap, and the heap ring's address and length (a ring
    /// kept idle too), for the tests of the rings' sizes.
    #[cfg(test)]
    fn storage(&self) -> (bool, Option<(*const AtomicU32, usize)>) {
        let ring = self
            .heap
            .with(|ring| ring.map(|ring| (ring.as_ptr(), ring.len())));
        (self.load().flags & HEAP != 0, ring)
    }

    /// The log's entries, written or not (read by the tests and the loom models).
    #[allow(dead_code)]
    pub fn entries(&self) -> usize {
        let header = self.load();
        self.with_slots(header, |slots| {
            Positions(slots.len() as u32).between(header.head, header.tail) as usize
        })
        .unwrap_or(0)
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    use crate::state::LogCell;
    use crate::{Quota, SlidingLog};

    /// A small deterministic generator (xorshift) for the differential tests.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// One thread's calls on a cell decide exactly as the reference ring does (`Ring`, the
    /// pure rule), through every storage move (in the cell, a heap ring growing, shrinking and
    /// rewritten in place), refunds, peeks, time standing still or jumping, and quota changes
    /// that change the tick. Run under Miri too (the heap rings are freed by epoch).
    #[test]
    fn a_cell_decides_as_the_reference_ring() {
        use crate::algorithm::sliding_log::Ring;
        use std::time::Duration;
        const MS: u64 = 1_000_000;
        let steps = if cfg!(miri) { 400 } else { 200_000 };
        let windows = [MS, 3_000 * MS, 3_600_000 * MS];
        let limits = [1, 3, 6, 7, 13, 40];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let rule = |rng: &mut Rng| {
            let w = windows[rng.below(3) as usize];
            let l = limits[rng.below(6) as usize];
            SlidingLog::new(Quota::new(l, Duration::from_nanos(w)).unwrap()).unwrap()
        };
        let (cell, mut ring) = (LogCell::default(), Ring::default());
        let (mut now, mut r) = (5 * MS, rule(&mut rng));
        // Whether the last call wrote: the cell drops expired entries when it writes, the ring
        // on every call, so only then do both hold the same entries, and a quota change of
        // window (under which an entry expired under the old one may count again) is compared.
        let mut synced = true;
        for step in 0..steps {
            now += match rng.below(9) {
                0..=2 => 0,
                3 | 4 => rng.below(r.window() / 8 + 1),
                5 => r.window() - r.window() / 8 + rng.below(r.window() / 4 + 1),
                6 => rng.below(5 * r.window()),
                // To exactly where the entries of a moment ago expire (`t − W` no longer counts).
                7 => r.window(),
                _ => rng.below(7),
            };
            // Times on the tick, where the ring is exact (off the tick both round up alike),
            // and never back (a limiter clamps its clock; the cell does too, the ring not).
            now = now.div_ceil(r.tick_nanos()) * r.tick_nanos();
            let t = now;
            match rng.below(20) {
                0 if synced => {
                    r = rule(&mut rng);
                    synced = false;
                }
                0 => {}
                1 | 2 => {
                    let cost = rng.below(r.limit() + 1);
                    cell.refund(&r, || t, cost).unwrap();
                    r.refund(&mut ring, t, cost);
                    synced = cost > 0;
                }
                k => {
                    let cost = rng
                        .below(r.limit() + 1)
                        .min(if k < 10 { 1 } else { u64::MAX });
                    let commit = k % 4 != 0;
                    let got = cell.decide(&r, || t, cost, commit).unwrap();
                    let want = r.decide(&mut ring, t, cost, commit);
                    synced = commit && cost > 0 && want.allowed();
                    assert_eq!(
                        (
                            got.allowed(),
                            got.remaining(),
                            got.retry_after(),
                            got.reset_after()
                        ),
                        (
                            want.allowed(),
                            want.remaining(),
                            want.retry_after(),
                            want.reset_after()
                        ),
                        "step {step}: cost {cost} commit {commit} at {t} on {r:?}"
                    );
                }
            }
            // The cell drops expired entries when it writes, the ring on every call: both are
            // empty at the same instants (what eviction judges).
            let empty = r.is_empty_at(&mut ring, t);
            assert_eq!(cell.is_empty_at(&r, t), Some(empty), "step {step}");
        }
    }

    /// Threads oversubscribing the cores on one cell, with costs that move its log between the
    /// cell and heap rings of several sizes, and a clock that moves: no window of length W
    /// holds more than L admitted units (taken at the times the cell decided at), and a window
    /// after the last call the log is empty (no entry claimed and never written). Refunds are
    /// in the reference test and the models.
    #[test]
    fn threads_on_one_cell_never_pass_the_limit() {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        const W: u64 = 1_000_000;
        let limit = 24;
        let rule = SlidingLog::new(Quota::new(limit, std::time::Duration::from_nanos(W)).unwrap())
            .unwrap();
        let (cell, clock) = (LogCell::default(), AtomicU64::new(W));
        let calls = if cfg!(miri) { 40 } else { 20_000 };
        let admitted: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..6u64)
                .map(|seed| {
                    let (cell, clock, rule) = (&cell, &clock, &rule);
                    s.spawn(move || {
                        let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ (seed + 1));
                        let mut admitted = Vec::new();
                        for _ in 0..calls {
                            if rng.below(4) == 0 {
                                clock.fetch_add(rng.below(W / 16), Relaxed);
                            }
                            let cost = [1, 1, 2, 5, 9][rng.below(5) as usize];
                            let now = || clock.load(Relaxed);
                            let (d, t) = cell.decide_at(rule, now, cost, true).unwrap();
                            if d.allowed() {
                                admitted.push((t, cost));
                            }
                        }
                        admitted
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut all: Vec<(u64, u64)> = admitted.into_iter().flatten().collect();
        all.sort_unstable();
        // Every window ending at an admitted entry, by two pointers over the sorted entries.
        let (mut start, mut held) = (0, 0);
        for &(x, cost) in &all {
            held += cost;
            while all[start].0 + W <= x {
                held -= all[start].1;
                start += 1;
            }
            assert!(held <= limit, "{held} units in the window ending at {x}");
        }
        let end = clock.load(Relaxed) + W;
        assert_eq!(cell.is_empty_at(&rule, end), Some(true));
        if !cfg!(miri) {
            assert!(all.len() > 100, "admissions: {}", all.len());
        }
    }

    /// Admits `n` entries of one unit each at time 0, one check at a time (each check is a
    /// growth step of the log).
    fn admit_at_zero(cell: &LogCell, rule: &SlidingLog, n: usize) {
        for _ in 0..n {
            assert!(cell.decide(rule, || 0, 1, true).unwrap().allowed());
        }
    }

    /// A heap ring is twice its log (at least 16 slots, at most L), is replaced by a smaller one
    /// once its log fills a quarter of it or less, and stays idle for the log's next growth once
    /// the log is back in the cell.
    #[test]
    fn heap_rings_are_sized_to_their_log() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(40)?)?;
        let cell = LogCell::default();
        let admit = |n| admit_at_zero(&cell, &rule, n);
        let ring_len = || cell.storage().1.map(|(_, len)| len);
        admit(6);
        assert_eq!(cell.storage(), (false, None));
        admit(1);
        let (heap, Some((first, 16))) = cell.storage() else {
            panic!("7 entries: a ring of 16, got {:?}", cell.storage());
        };
        assert!(heap);
        admit(9);
        assert_eq!(cell.storage(), (true, Some((first, 16))));
        admit(1);
        assert_eq!(ring_len(), Some(34));
        admit(17);
        assert_eq!(ring_len(), Some(34));
        admit(1);
        // Twice 35 is more than L: the ring holds L.
        assert_eq!(ring_len(), Some(40));
        // 10 of 40 is a quarter: a ring for them, 20 slots.
        cell.refund(&rule, || 0, 25).unwrap();
        assert_eq!(cell.entries(), 10);
        assert_eq!(ring_len(), Some(20));
        // 6 of 20 stays; 3 is back in the cell, the ring kept idle.
        cell.refund(&rule, || 0, 4).unwrap();
        assert_eq!(ring_len(), Some(20));
        assert!(cell.storage().0);
        cell.refund(&rule, || 0, 3).unwrap();
        let (heap, Some((idle, 20))) = cell.storage() else {
            panic!(
                "3 entries: in the cell, the ring idle, got {:?}",
                cell.storage()
            );
        };
        assert!(!heap);
        // The next growth takes the idle ring, no allocation.
        admit(4);
        assert_eq!(cell.storage(), (true, Some((idle, 20))));
        assert_eq!(cell.entries(), 7);
        Ok(())
    }

    /// A log back in its cell keeps a ring of at most 64 slots idle for its next growth; a
    /// larger ring is freed (a key that once held many entries does not hold their memory).
    #[test]
    fn a_large_ring_is_not_kept_idle() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(200)?)?;
        let cell = LogCell::default();
        admit_at_zero(&cell, &rule, 60);
        let Some((_, len)) = cell.storage().1 else {
            panic!("60 entries: a heap ring, got {:?}", cell.storage());
        };
        assert!(len > 64, "a ring of {len} for 60 entries");
        cell.refund(&rule, || 0, 57).unwrap();
        assert_eq!(cell.entries(), 3);
        assert_eq!(cell.storage(), (false, None));
        Ok(())
    }

    /// A heap log that shrinks to 4-6 entries, which its ring no longer suits, takes the
    /// smallest ring, not the cell (it would fit there): only at 3 entries does it move back,
    /// so that a log hovering at the cell's size does not move at every check.
    #[test]
    fn a_heap_log_moves_back_into_its_cell_only_at_three_entries(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(40)?)?;
        let cell = LogCell::default();
        admit_at_zero(&cell, &rule, 40);
        assert_eq!(cell.storage().1.map(|(_, len)| len), Some(40));
        cell.refund(&rule, || 0, 35).unwrap();
        assert_eq!(cell.entries(), 5);
        let (heap, Some((_, 16))) = cell.storage() else {
            panic!("5 entries: a ring of 16, got {:?}", cell.storage());
        };
        assert!(heap);
        cell.refund(&rule, || 0, 2).unwrap();
        assert!(!cell.storage().0, "3 entries: back in the cell");
        assert_eq!(cell.entries(), 3);
        Ok(())
    }

    /// A check that read a header before its heap ring was replaced by a smaller one may meet
    /// positions past the ring's end: it retries (the header is read again) and reads no slot.
    #[test]
    fn a_header_whose_positions_outrun_the_ring_is_retried(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use super::{Header, Step, HEAP};
        let rule = SlidingLog::new(Quota::per_second(40)?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 0, 10, true).unwrap().allowed());
        let current = cell.load();
        assert!(current.flags & HEAP != 0);
        // The ring holds 20 slots: positions are below 40 (40 itself is past the end).
        for (head, tail) in [(70, 75), (70, 5), (5, 70), (40, 5), (5, 40), (40, 40)] {
            let stale = Header {
                head,
                tail,
                ..current
            };
            let step = cell
                .with_slots(stale, |slots| {
                    assert_eq!(slots.len(), 20);
                    cell.attempt(stale, slots, &rule, rule.tick_code(), 0, 1, true)
                })
                .unwrap();
            assert!(matches!(step, Step::Retry), "head {head}, tail {tail}");
        }
        // Nothing was written: the log still holds its 10 entries.
        assert_eq!(cell.load(), current);
        assert_eq!(cell.entries(), 10);
        Ok(())
    }

    /// A check preempted between reading its header and its CAS, while the log changes
    /// exclusively 16,384 times at one instant (8,192 growths into a new ring and refunds into
    /// another: every generation once), must fail its CAS: positions, time, tick and flags are
    /// back to the ones it read, and its ring is no longer the log's. Committed, it would claim
    /// a slot of the new ring and write the old one: an entry no refund could wait out.
    #[test]
    // 16,384 ring replacements while the test's pin keeps every one allocated: more than Miri
    // finishes (the rings' reclamation is run under Miri by the tests above).
    #[cfg_attr(miri, ignore)]
    fn a_check_stale_across_every_generation_fails_its_cas(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use super::{Step, HEAP};
        let rule = SlidingLog::new(Quota::per_second(40)?)?;
        let cell = LogCell::default();
        admit_at_zero(&cell, &rule, 7);
        let stale = cell.load();
        assert!(stale.flags & HEAP != 0);
        let step = cell
            .with_slots(stale, |slots| {
                assert_eq!(slots.len(), 16);
                for _ in 0..8_192 {
                    assert!(cell.decide(&rule, || 0, 10, true).unwrap().allowed());
                    cell.refund(&rule, || 0, 10).unwrap();
                }
                cell.attempt(stale, slots, &rule, rule.tick_code(), 0, 1, true)
            })
            .unwrap();
        assert!(
            matches!(step, Step::Retry),
            "a check stale across 16,384 exclusive changes committed"
        );
        // The generation wrapped at one instant: the log's time moved on by 1 ns.
        assert_eq!(
            (cell.load().at, cell.load().generation),
            (1, stale.generation)
        );
        // The log holds its 7 entries, every one written: a refund of them all returns, and
        // the log is empty after it (a peek of one unit leaves 39 of 40).
        assert_eq!(cell.entries(), 7);
        cell.refund(&rule, || 0, 7).unwrap();
        assert_eq!(cell.decide(&rule, || 0, 1, false).unwrap().remaining(), 39);
        Ok(())
    }

    #[test]
    fn a_log_cell_is_48_bytes() {
        // The 16-byte header, the heap ring's pointer and six inline slots.
        assert_eq!(std::mem::size_of::<LogCell>(), 48);
    }

    #[test]
    fn logcell_example() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(100)?)?;
        let cell = LogCell::default();
        // Four threads, 50 requests each at the same instant: exactly L = 100 admitted.
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..50)
                            .filter(|_| {
                                cell.decide(&rule, || 0, 1, true)
                                    .is_some_and(|d| d.allowed())
                            })
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        assert_eq!(cell.entries(), 100);
        Ok(())
    }

    #[test]
    fn evict_if_empty_example() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(2)?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 0, 1, true).unwrap().allowed());
        // A sweep at 0.5 s: the entry still counts, the key keeps its state.
        assert!(!cell.evict_if_empty(&rule, 500_000_000));
        // At 1 s it has expired: evicted, and decisions on the cell find it retired.
        assert!(cell.evict_if_empty(&rule, 1_000_000_000));
        assert!(cell.decide(&rule, || 1_000_000_000, 1, true).is_none());
        // A tombstone is not evicted twice, and comes back empty.
        assert!(!cell.evict_if_empty(&rule, 2_000_000_000));
        assert!(cell.revive());
        assert_eq!(cell.entries(), 0);
        Ok(())
    }

    #[test]
    fn a_tombstone_keeps_its_time_and_comes_back_live() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(1)?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 0, 1, true).unwrap().allowed());
        // A live cell is not revived: an insert that finds its key live (another thread put it
        // there since the insert's lookup) must not count it again.
        assert!(!cell.revive());
        assert!(cell.evict_if_empty(&rule, 1_000_000_000));
        // A tombstone, not a moved cell.
        assert_eq!(cell.retired(), Some(false));
        assert!(cell.revive());
        assert_eq!(cell.retired(), None);
        // The sweep decided at 1 s: a later check that read an earlier clock decides at 1 s,
        // not before (a key's time never goes backwards, eviction included).
        let (decision, at) = cell.decide_at(&rule, || 500_000_000, 1, true).unwrap();
        assert!(decision.allowed());
        assert_eq!(at, 1_000_000_000);
        Ok(())
    }

    #[test]
    fn take_to_move_example() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(20)?)?;
        let old = LogCell::default();
        // Twelve entries: a heap ring.
        assert!(old.decide(&rule, || 7, 12, true).unwrap().allowed());
        let state = old.take_to_move().unwrap();
        assert_eq!(old.retired(), Some(true));
        let new = LogCell::default();
        new.put(state);
        assert_eq!(new.entries(), 12);
        // The moved log decides as the old one would have.
        let d = new.decide(&rule, || 7, 9, true).unwrap();
        assert!(!d.allowed());
        assert_eq!(d.retry_after().as_nanos(), 1_000_000_000);
        Ok(())
    }

    /// Makes the CAS of a check at `at` that claims `n` positions at the tail (dropping
    /// `expired` entries from the head), without writing the claimed slots: the log as a check
    /// preempted between its CAS and its writes leaves it. The log is in the cell.
    fn claim_unwritten(cell: &LogCell, rule: &SlidingLog, at: u64, expired: u32, n: u32) {
        use super::{Header, Positions, HEAP, INLINE};
        let header = cell.load();
        assert_eq!(header.flags & HEAP, 0);
        let positions = Positions(INLINE as u32);
        let claimed = Header {
            at,
            head: positions.advance(header.head, expired),
            tail: positions.advance(header.tail, n),
            tick: rule.tick_code(),
            ..header
        };
        assert!(cell.cas(header, claimed));
    }

    /// Writes the slot at `position` of a log in the cell as the check that claimed it does.
    fn write_claimed(cell: &LogCell, position: u32, ticks: u64) {
        use super::{Positions, INLINE};
        use std::sync::atomic::Ordering::Relaxed;
        let positions = Positions(INLINE as u32);
        cell.inline[positions.index(position)].store(positions.written(ticks, position), Relaxed);
    }

    /// A slot claimed by a check's CAS but not written yet counts as live, whichever lap its
    /// position is in: a zeroed slot in the first lap, a slot still holding the first lap's
    /// entry in the second (its lap bit tells them apart). Read as written, either would be an
    /// expired entry at the head, and a second unit admitted under L = 1. It stays live, however
    /// late the check, until it is written; then it expires a window after its time.
    #[test]
    fn a_claimed_slot_counts_as_live_until_written_in_either_lap(
    ) -> Result<(), Box<dyn std::error::Error>> {
        const MS: u64 = 1_000_000;
        let rule = SlidingLog::new(Quota::new(1, std::time::Duration::from_millis(1))?)?;
        assert_eq!(rule.tick_nanos(), 1);
        let peek = |cell: &LogCell, t: u64| cell.decide(&rule, || t, 1, false).unwrap();
        // The first lap: position 0 of an empty log, its slot zeroed.
        let first = LogCell::default();
        claim_unwritten(&first, &rule, 5 * MS, 0, 1);
        assert_eq!(first.entries(), 1);
        for t in [5 * MS, 6 * MS, 50 * MS] {
            assert!(!peek(&first, t).allowed(), "first lap, unwritten, at {t}");
        }
        write_claimed(&first, 0, 5 * MS);
        assert!(!peek(&first, 5 * MS).allowed());
        assert!(
            peek(&first, 6 * MS).allowed(),
            "written at 5 ms: expired at 6 ms"
        );
        // The second lap: six entries a window apart went once round the cell's six slots;
        // position 6 is slot 0 again, which still holds the entry at 0 ms.
        let second = LogCell::default();
        for i in 0..6 {
            assert!(second.decide(&rule, || i * MS, 1, true).unwrap().allowed());
        }
        claim_unwritten(&second, &rule, 6 * MS, 1, 1);
        assert_eq!(second.entries(), 1);
        for t in [6 * MS, 7 * MS, 50 * MS] {
            assert!(!peek(&second, t).allowed(), "second lap, unwritten, at {t}");
        }
        write_claimed(&second, 6, 6 * MS);
        assert!(!peek(&second, 6 * MS).allowed());
        assert!(
            peek(&second, 7 * MS).allowed(),
            "written at 6 ms: expired at 7 ms"
        );
        Ok(())
    }

    /// A slot a refund gives back is marked not written in its lap: a check that claims it
    /// again and has not written it yet counts it as live. Marked as written (its time bits
    /// zero), it would read as an expired entry at the head, and a second unit be admitted
    /// under L = 1 (the loom model of a refund racing two checks, made by hand).
    #[test]
    fn a_slot_freed_by_a_refund_reads_as_not_written_when_claimed_again(
    ) -> Result<(), Box<dyn std::error::Error>> {
        const MS: u64 = 1_000_000;
        let rule = SlidingLog::new(Quota::new(1, std::time::Duration::from_millis(1))?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 5 * MS, 1, true).unwrap().allowed());
        cell.refund(&rule, || 5 * MS, 1).unwrap();
        assert_eq!(cell.entries(), 0);
        let freed = cell.load().tail;
        claim_unwritten(&cell, &rule, 5 * MS, 0, 1);
        assert_eq!(cell.load().tail, freed + 1, "the freed slot claimed again");
        assert!(!cell.decide(&rule, || 5 * MS, 1, false).unwrap().allowed());
        Ok(())
    }

    /// A refund with nothing to give back (a cost of 0, or an empty log) changes nothing: no
    /// exclusive change, so no check waits for it (the header, generation included, is as it
    /// was).
    #[test]
    fn a_refund_with_nothing_to_give_back_leaves_the_header(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(10)?)?;
        let cell = LogCell::default();
        let empty = cell.load();
        cell.refund(&rule, || 7, 3).unwrap();
        assert_eq!(cell.load(), empty, "a refund on an empty log");
        assert!(cell.decide(&rule, || 7, 2, true).unwrap().allowed());
        let two = cell.load();
        cell.refund(&rule, || 9, 0).unwrap();
        assert_eq!(cell.load(), two, "a refund of 0");
        cell.refund(&rule, || 9, 1).unwrap();
        let one = cell.load();
        assert_eq!(
            (one.tail, one.generation),
            (two.tail - 1, two.generation + 1)
        );
        Ok(())
    }

    /// A log in the cell moves with its slots copied: the new cell decides as the old one
    /// would, its entries expiring a window after their time, also when the old cell keeps an
    /// idle heap ring (which stays behind: it is not the log's storage).
    #[test]
    fn a_log_in_the_cell_moves_with_its_slots() -> Result<(), Box<dyn std::error::Error>> {
        const S: u64 = 1_000_000_000;
        let rule = SlidingLog::new(Quota::per_second(20)?)?;
        let plain = LogCell::default();
        assert!(plain.decide(&rule, || 7, 2, true).unwrap().allowed());
        let idle = LogCell::default();
        assert!(idle.decide(&rule, || 7, 12, true).unwrap().allowed());
        idle.refund(&rule, || 7, 10).unwrap();
        let (false, Some(_)) = idle.storage() else {
            panic!(
                "2 entries: in the cell, a ring idle, got {:?}",
                idle.storage()
            );
        };
        for old in [plain, idle] {
            let new = LogCell::default();
            new.put(old.take_to_move().unwrap());
            assert_eq!(new.storage(), (false, None));
            assert_eq!(new.entries(), 2);
            assert_eq!(new.decide(&rule, || 7, 0, false).unwrap().remaining(), 18);
            assert_eq!(
                new.decide(&rule, || 7 + S, 0, false).unwrap().remaining(),
                20
            );
        }
        Ok(())
    }

    /// A log back in its cell keeps a ring of exactly 64 slots idle (only a larger one is
    /// freed).
    #[test]
    fn a_ring_of_64_slots_is_kept_idle() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(200)?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 0, 100, true).unwrap().allowed());
        // 32 of 200 is less than a quarter: a ring for them, 64 slots.
        cell.refund(&rule, || 0, 68).unwrap();
        assert_eq!(cell.storage().1.map(|(_, len)| len), Some(64));
        cell.refund(&rule, || 0, 29).unwrap();
        assert_eq!(cell.entries(), 3);
        let (false, Some((_, 64))) = cell.storage() else {
            panic!(
                "3 entries: in the cell, the ring of 64 idle, got {:?}",
                cell.storage()
            );
        };
        Ok(())
    }

    /// A cell's `Debug` shows its header.
    #[test]
    fn a_log_cell_debugs_as_its_header() -> Result<(), Box<dyn std::error::Error>> {
        let rule = SlidingLog::new(Quota::per_second(10)?)?;
        let cell = LogCell::default();
        assert!(cell.decide(&rule, || 7, 2, true).unwrap().allowed());
        let header = cell.load();
        assert_eq!((header.at, header.tail), (7, 2));
        assert_eq!(
            format!("{cell:?}"),
            format!("LogCell {{ header: {header:?}, .. }}")
        );
        Ok(())
    }
}
