//! The sliding log's per-key state: entry times in ticks, oldest first, in a ring of 4-byte
//! slots that lives inside the state while it is short.

/// How many slots a ring keeps inside its own state. Seven fill the slots field (the size of a
/// boxed slice, its head and length, and the tag), so a short log costs no allocation.
pub(super) const INLINE: usize = 7;

/// A log on the heap moves back into its state once it holds at most this many entries. Below
/// `INLINE`, so that a log hovering around seven entries does not allocate and free on every
/// check.
const SHRINK_AT: u32 = 4;

/// Where a log's slots live, with the ring's head (index of the oldest entry) and length.
#[derive(Debug)]
enum Slots {
    /// Up to [`INLINE`] entries, in the state itself.
    Inline {
        head: u8,
        len: u8,
        entries: [u32; INLINE],
    },
    /// A longer log: a ring that grows by doubling, up to `L` slots.
    Heap {
        head: u32,
        len: u32,
        entries: Box<[u32]>,
    },
}

/// A key's log: entry times in ticks, oldest first, in a ring of 4-byte slots.
///
/// 40 bytes: a slot holds the low half of its entry's time, and the ring keeps only the high
/// half of the newest entry's (all the entries lie within 2^31 ticks of it).
#[derive(Debug)]
pub(crate) struct Ring {
    /// The high half of the newest entry's time in ticks; the low half is the newest slot.
    newest_high: u32,
    /// The tick the slots are counted in, in ns (at most 1 s); 0 until the first entry.
    pub(super) tick: u32,
    slots: Slots,
}

impl Default for Ring {
    fn default() -> Self {
        Ring {
            newest_high: 0,
            tick: 0,
            slots: Slots::Inline {
                head: 0,
                len: 0,
                entries: [0; INLINE],
            },
        }
    }
}

impl Ring {
    /// The index of the oldest entry and the number of entries.
    #[inline]
    fn head_len(&self) -> (u32, u32) {
        match &self.slots {
            Slots::Inline { head, len, .. } => (u32::from(*head), u32::from(*len)),
            Slots::Heap { head, len, .. } => (*head, *len),
        }
    }

    /// Sets the head and length (`head < capacity`, `len ≤ capacity`: they fit an inline
    /// ring's bytes).
    #[inline]
    fn set_head_len(&mut self, new_head: u32, new_len: u32) {
        match &mut self.slots {
            Slots::Inline { head, len, .. } => {
                (*head, *len) = (new_head as u8, new_len as u8);
            }
            Slots::Heap { head, len, .. } => (*head, *len) = (new_head, new_len),
        }
    }

    #[inline]
    fn slots(&self) -> &[u32] {
        match &self.slots {
            Slots::Inline { entries, .. } => entries,
            Slots::Heap { entries, .. } => entries,
        }
    }

    #[inline]
    fn slots_mut(&mut self) -> &mut [u32] {
        match &mut self.slots {
            Slots::Inline { entries, .. } => entries,
            Slots::Heap { entries, .. } => entries,
        }
    }

    /// The slot of the `i`-th oldest entry, for `i < capacity` (`head < capacity` too, so one
    /// subtraction wraps it; no division on the hot path).
    #[inline]
    fn index(&self, i: u32) -> usize {
        let (head, _) = self.head_len();
        let (at, capacity) = (head as usize + i as usize, self.slots().len());
        if at >= capacity {
            at - capacity
        } else {
            at
        }
    }

    /// The newest entry's time in ticks; 0 when the log is empty.
    #[inline]
    pub(super) fn newest(&self) -> u64 {
        match self.head_len().1 {
            0 => 0,
            len => u64::from(self.newest_high) << 32 | u64::from(self.slots()[self.index(len - 1)]),
        }
    }

    /// The time in ticks of the `i`-th oldest entry (`i < len`).
    #[inline]
    pub(super) fn entry(&self, i: u32) -> u64 {
        let newest = self.newest();
        let slot = self.slots()[self.index(i)];
        newest - (newest as u32).wrapping_sub(slot) as u64
    }

    #[inline]
    pub(super) fn push(&mut self, ticks: u64, limit: u64) {
        if self.head_len().1 as usize == self.slots().len() {
            self.grow(limit);
        }
        let (head, len) = self.head_len();
        let at = self.index(len);
        self.slots_mut()[at] = ticks as u32;
        self.set_head_len(head, len + 1);
        self.newest_high = (ticks >> 32) as u32;
    }

    /// Doubles the slots (at most `limit`, at least `len + 1`).
    fn grow(&mut self, limit: u64) {
        let capacity = self.slots().len();
        self.resize((capacity * 2).min((limit as usize).max(capacity + 1)));
    }

    /// Moves the entries, oldest first, to `capacity ≥ len` slots: into the state when they
    /// fit, else to the heap.
    #[cold]
    #[inline(never)]
    fn resize(&mut self, capacity: usize) {
        let (_, len) = self.head_len();
        let mut slots = if capacity <= INLINE {
            Slots::Inline {
                head: 0,
                len: 0,
                entries: [0; INLINE],
            }
        } else {
            Slots::Heap {
                head: 0,
                len: 0,
                entries: vec![0u32; capacity].into_boxed_slice(),
            }
        };
        let to = match &mut slots {
            Slots::Inline { entries, .. } => &mut entries[..],
            Slots::Heap { entries, .. } => &mut entries[..],
        };
        for (i, to) in to.iter_mut().take(len as usize).enumerate() {
            *to = self.slots()[self.index(i as u32)];
        }
        self.slots = slots;
        self.set_head_len(0, len);
    }

    /// Brings a heap log that has become short back into the state.
    #[inline]
    fn shrink_if_short(&mut self) {
        if let Slots::Heap { len, .. } = self.slots {
            if len <= SHRINK_AT {
                self.resize(INLINE);
            }
        }
    }

    /// Drops the entries at or before `last_expired` ticks: the oldest ones, as the log is in
    /// time order. Compares ages (`newest − time`, each below 2^31 ticks) in 32 bits, so the
    /// loop is a load, a subtraction and a comparison per dropped entry.
    #[inline]
    pub(super) fn expire_through(&mut self, last_expired: u64) {
        let (head, len) = self.head_len();
        if len == 0 {
            return;
        }
        let newest = self.newest();
        if newest <= last_expired {
            self.set_head_len(0, 0);
        } else {
            // An entry is live iff its age is below `max_age`; the newest (age 0) always is,
            // so the loop stops before the log is empty.
            let max_age = newest - last_expired;
            let (mut head, mut len) = (head as usize, len);
            let slots = self.slots();
            while u64::from((newest as u32).wrapping_sub(slots[head])) >= max_age {
                head += 1;
                if head == slots.len() {
                    head = 0;
                }
                len -= 1;
            }
            self.set_head_len(head as u32, len);
        }
        self.shrink_if_short();
    }

    pub(super) fn pop_back(&mut self) {
        let (head, len) = self.head_len();
        if len > 1 {
            self.newest_high = (self.entry(len - 2) >> 32) as u32;
        }
        self.set_head_len(head, len - 1);
    }

    /// Re-expresses the entries in another tick (after `set_quota` changed the window), rounding
    /// up, but to no later than `now` (in the new tick): no entry is logged after the time it
    /// was admitted at was read, so none expires before its admission plus `W`. Entries at or
    /// before `last_expired` (new ticks) are dropped here: the slots read ages below 2^31
    /// ticks, and in a finer tick an entry live under the old window may lie further back.
    #[cold]
    #[inline(never)]
    pub(super) fn retick(&mut self, tick: u64, now: u64, last_expired: Option<u64>) {
        let (_, len) = self.head_len();
        if len > 0 && self.tick != 0 {
            let times: Vec<u64> = (0..len)
                .map(|i| {
                    self.entry(i)
                        .saturating_mul(u64::from(self.tick))
                        .div_ceil(tick)
                        .min(now)
                })
                .filter(|&t| last_expired.is_none_or(|last| t > last))
                .collect();
            self.set_head_len(0, 0);
            for t in times {
                self.push(t, u64::MAX);
            }
        }
        // A rule's tick is one of `TICKS`, at most 1 s: it fits.
        self.tick = tick as u32;
    }

    /// The number of entries; for tests and memory accounting.
    pub fn len(&self) -> usize {
        self.head_len().1 as usize
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of slot storage on the heap (0 while the log fits in its state).
    pub fn slot_bytes(&self) -> usize {
        match &self.slots {
            Slots::Inline { .. } => 0,
            Slots::Heap { entries, .. } => entries.len() * 4,
        }
    }
}
