//! Whether a shard's evicted keys come back: the signal that raises a shard's share of the
//! default `evict_above` bound.
//!
//! At its share a shard evicts keys that are fresh and unused since its table last filled.
//! That holds a flood of keys seen once to the bound, but a working set of clients larger than
//! the bound (millions of returning clients, each back to a full bucket between visits) is
//! evicted and inserted again on every visit: each check pays an insert. The two differ in one
//! thing the shard can see: whether the keys it inserts are keys it evicted. So the shard
//! remembers a sample of the keys it evicts (a 16-bit fingerprint of one key in
//! [`SAMPLE_ONE_IN`], direct-mapped: a newer eviction overwrites an older one), counts how many
//! of the sampled keys it inserts it remembers, and raises its share (doubling it, at most
//! [`MOST_RAISES`] times) when at least one in [`RAISE_AT`] of them came back. A flood never
//! raises it (its keys are new, and a fingerprint matches a new key about once in 65,536).
//! A share once raised stays: a working set just over the raised share would otherwise
//! flip between evicting and keeping its keys. An explicit `evict_above` is never raised.

/// One key in this many is sampled, by four bits of its hash that its tag holds (so a drain
/// tells a sampled key from its tag, and hashes only those).
pub(super) const SAMPLE_ONE_IN: usize = 16;
/// The shard raises its share when at least one in this many sampled inserts found its key
/// remembered. A working set twice the share finds about 60 % of them (the figure is what
/// survives overwriting), four times about 37 %; a flood, none.
pub(super) const RAISE_AT: usize = 8;
/// Doublings of a shard's share at most: by default up to 2^24 keys (16.8M).
pub(crate) const MOST_RAISES: u32 = 3;
/// Sampled inserts a shard counts before it judges (fewer say nothing).
const JUDGED_FROM: usize = 32;

/// Whether a key of hash `hash` is sampled: its tag's four low bits (bits 32-35 of the hash,
/// which `tag` keeps in every table) are zero.
#[inline]
pub(super) fn sampled(hash: u64) -> bool {
    (hash >> 32) & (SAMPLE_ONE_IN as u64 - 1) == 0
}

/// Whether a slot's tag is a sampled key's.
#[inline]
pub(super) fn sampled_tag(tag: u8) -> bool {
    tag & (SAMPLE_ONE_IN as u8 - 1) == 0
}

/// A shard's memory of the keys it evicted, and what its inserts found in it.
#[derive(Default)]
pub(super) struct Returns {
    /// Fingerprints of sampled evicted keys, at bits 40.. of their hash (0: none). Empty until
    /// the shard first evicts.
    evicted: Box<[u16]>,
    /// Sampled keys inserted since the shard last judged its share.
    inserted: usize,
    /// Of them, keys remembered as evicted.
    returned: usize,
    /// Times the shard's share was doubled.
    pub(super) raises: u32,
}

impl Returns {
    /// Remembers a sampled key evicted (`share`: the shard's share, which sizes the memory on
    /// first use: a quarter of a fingerprint per key of it, enough for about four tables'
    /// sampled evictions).
    pub(super) fn evicted(&mut self, hash: u64, share: usize) {
        if self.evicted.is_empty() {
            let len = (share / 4).next_power_of_two().max(64);
            self.evicted = vec![0; len].into_boxed_slice();
        }
        let (at, print) = self.place(hash);
        self.evicted[at] = print;
    }

    /// Counts a sampled key inserted; `revived`: it came back to its tombstone (known to
    /// return without looking).
    pub(super) fn inserted(&mut self, hash: u64, revived: bool) {
        self.inserted += 1;
        let (at, print) = self.place(hash);
        // A key found is forgotten, so that it counts once.
        let remembered = self.evicted.get_mut(at).filter(|slot| **slot == print);
        let returned = remembered.is_some() || revived;
        if let Some(slot) = remembered {
            *slot = 0;
        }
        if returned {
            self.returned += 1;
        }
    }

    /// Whether the keys inserted since the shard last judged its share came back often enough
    /// to raise it (and it may be raised again).
    pub(super) fn returning(&self) -> bool {
        self.raises < MOST_RAISES
            && self.inserted >= JUDGED_FROM
            && self.returned * RAISE_AT >= self.inserted
    }

    /// The shard, full at its share, judged whether to raise it: the counts start again.
    pub(super) fn judged(&mut self) {
        self.inserted = 0;
        self.returned = 0;
    }

    /// `hash`'s slot in the memory and its fingerprint (never 0).
    fn place(&self, hash: u64) -> (usize, u16) {
        let at = (hash >> 40) as usize & self.evicted.len().wrapping_sub(1);
        (at, (hash as u16) | 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampled hashes: bits 32-35 zero, the rest from a counter's mix.
    fn sampled_hashes() -> impl Iterator<Item = u64> {
        (1u64..)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .filter(|&h| sampled(h))
    }

    #[test]
    fn keys_seen_once_never_raise_a_share_keys_that_come_back_do() {
        let share = 32_768;
        let mut flood = Returns::default();
        let mut keys = sampled_hashes();
        for _ in 0..4 {
            for hash in keys.by_ref().take(share / SAMPLE_ONE_IN) {
                flood.evicted(hash, share);
            }
            for hash in keys.by_ref().take(share / SAMPLE_ONE_IN) {
                flood.inserted(hash, false);
            }
            assert!(!flood.returning(), "new keys read as returning");
            flood.judged();
        }
        // The same keys evicted, then inserted again after as many others' evictions.
        let mut back = Returns::default();
        let first: Vec<u64> = sampled_hashes().take(share / SAMPLE_ONE_IN).collect();
        let others = sampled_hashes().skip(first.len()).take(first.len());
        first.iter().for_each(|&hash| back.evicted(hash, share));
        others.for_each(|hash| back.evicted(hash, share));
        first.iter().for_each(|&hash| back.inserted(hash, false));
        assert!(
            back.returning(),
            "{} of {} came back",
            back.returned,
            back.inserted
        );
        // Counted once: a key found is forgotten.
        back.judged();
        first.iter().for_each(|&hash| back.inserted(hash, false));
        assert_eq!(back.returned, 0);
        // Revived keys return without being remembered; raises stop at the most.
        back.judged();
        (0..JUDGED_FROM as u64).for_each(|hash| back.inserted(hash << 36, true));
        assert!(back.returning());
        back.raises = MOST_RAISES;
        assert!(!back.returning(), "raised past the most");
    }

    #[test]
    fn a_sampled_tag_is_a_sampled_hash() {
        for hash in [
            0u64,
            1 << 32,
            0xF << 32,
            0x10 << 32,
            u64::MAX,
            0xABCD_0000_0000,
        ] {
            let tag = (hash >> 32) as u8 | 0x80;
            assert_eq!(sampled_tag(tag), sampled(hash), "{hash:#x}");
        }
    }
}
