//! What the tests and loom models read and set of the word table: counts of its tables, a
//! shard's layout as the eviction hand sees it, a full audit, and the hooks that shrink a
//! drain step or chain a drain on demand.

use std::hash::{BuildHasher, Hash};

use super::super::cell::TableCell;
use super::shards::*;
use super::slots::*;

/// A shard as the eviction hand finds it ([`WordTable::hand_view`], for tests): `None` for a
/// slot without a key.
#[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
#[derive(Debug, PartialEq)]
pub(crate) struct HandView<T> {
    pub(crate) hand: usize,
    pub(crate) table: Vec<Option<T>>,
    /// Each drain's unvisited slots, in the order it visits them.
    pub(crate) drains: Vec<Vec<Option<T>>>,
}

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher, C: TableCell> WordTable<K, H, C> {
    /// Visits `slots` slots of a drain per call instead of [`DRAIN_STEP`]: for the loom models,
    /// whose 8-slot tables a whole step drains in one call.
    #[allow(dead_code)] // called by the loom models
    pub(crate) fn set_drain_step_for_model(&mut self, slots: usize) {
        self.drain_step = slots.max(1);
    }

    /// Makes each lookup let the model's other threads run between fetching its table and
    /// probing it (see `model_yield` in `loom-tests/src/sync.rs`). For the loom models only:
    /// the yield changes which schedules a bounded search reaches, so models opt in.
    #[allow(dead_code)] // called by the loom models
    pub(crate) fn yield_after_fetch_for_model(&mut self) {
        self.yield_after_fetch.turn_on();
    }

    /// Chains the table of `key`'s shard if a drain runs there, as an insert does when the
    /// table fills before its drain ends; returns the drains the shard then has. For the loom
    /// models: their tables are too small for a sizing estimate to fall short.
    #[allow(dead_code)] // called by the loom models
    pub(crate) fn chain_for_model(&self, key: &K) -> usize {
        let (_, index) = self.hash(key);
        let mut shard = self.shards[index].lock();
        if !shard.drains.is_empty() {
            let since = shard.filled_at;
            self.chain(&mut shard, since);
        }
        shard.drains.len()
    }

    /// The shard `key` belongs to (for tests that arrange keys in one shard).
    #[allow(dead_code)] // read by the unit tests
    pub(crate) fn shard_of(&self, key: &K) -> usize {
        self.hash(key).1
    }

    /// Tables shard `index` is draining (for tests).
    #[allow(dead_code)] // read by the unit tests
    pub(crate) fn drains_in(&self, index: usize) -> usize {
        self.shards[index].lock().drains.len()
    }
}

impl<K: Send + Sync, H, C: TableCell> WordTable<K, H, C> {
    /// Shards with a table being drained (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn draining(&self) -> usize {
        self.shards
            .iter()
            .filter(|shard| !shard.lock().drains.is_empty())
            .count()
    }

    /// Tables of more than [`BUILD_ABOVE`] slots made in one call, not built ahead (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn allocated_large(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().allocated_large.get())
            .sum()
    }

    /// Shards whose table is in pages mapped for it alone (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn mapped_tables(&self) -> usize {
        self.shards
            .iter()
            .filter(|shard| shard.lock().table.slots.is_mapped())
            .count()
    }

    /// Keys of the shards' tables kept inline as text (`text.rs`; for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn inline_texts(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let table = &shard.lock().table;
                (0..table.len())
                    .filter(|&i| matches!(table.key(i), Some(super::text::Held::Text(_))))
                    .count()
            })
            .sum()
    }

    /// Spares reused as a shard's next table (for the loom models).
    #[allow(dead_code)] // read by the loom models
    pub(crate) fn spares_reused(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().spares_reused.get())
            .sum()
    }

    /// Tables built ahead, or being built, that a replacement could not use (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn built_unused(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().built_unused.get())
            .sum()
    }

    /// Shards building their next table ahead, or holding it built and not used yet (for
    /// tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn building(&self) -> usize {
        self.shards
            .iter()
            .filter(|shard| shard.lock().next.is_some())
            .count()
    }

    /// Shards part-way through building their next table (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn part_built(&self) -> usize {
        self.shards
            .iter()
            .filter(|shard| {
                shard
                    .lock()
                    .next
                    .as_ref()
                    .is_some_and(|next| !next.is_built())
            })
            .count()
    }

    /// Slots of tables being built ahead, or built and not used yet (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn built_ahead(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().next.as_ref().map_or(0, |next| next.len))
            .sum()
    }

    /// Slots of retired tables not released yet (for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn retired_slots(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard.lock();
                let retiring: usize = shard.retiring.iter().map(|table| table.len()).sum();
                let freeing = shard.freeing.iter().map(|f| f.slots.len());
                retiring + freeing.sum::<usize>()
            })
            .sum::<usize>()
            + self.texts.get().map_or(0, |texts| {
                texts.mid.retired_slots() + texts.long.retired_slots()
            })
    }

    /// Shard `index` as the eviction hand finds it (for tests, with no call running): where its
    /// hand stands, what `f` reads of each slot of its table that holds a key, and the same of
    /// each drain's unvisited slots in the order the drain visits them.
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn hand_view<T>(&self, index: usize, f: impl Fn(&C) -> T) -> HandView<T> {
        let shard = self.shards[index].lock();
        let read = |table: &Table<K, C>, i: usize| table.key(i).map(|_| f(&table[i].state));
        let table = &shard.table;
        HandView {
            hand: shard.hand,
            table: (0..table.len()).map(|i| read(table, i)).collect(),
            drains: (shard.drains.iter())
                .map(|d| (d.next..d.from.len()).map(|i| read(&d.from, d.index(i))))
                .map(Iterator::collect)
                .collect(),
        }
    }

    /// Checks each shard's counts against its tables (for tests, with no call running): `used`
    /// is the keys set in its table, within its fill bound; each drain's `left` the live keys it
    /// has not visited; and `live` those of the table and of the drains. Panics on a mismatch, naming the shard.
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn audit(&self) {
        let retired = self.retired;
        for (index, shard) in self.shards.iter().enumerate() {
            let shard = shard.lock();
            let (mut tagged, mut live) = (0, 0);
            let mut set = TagWords::new(&shard.table.tags);
            for (i, slot) in shard.table.iter().enumerate() {
                if set.is_set(i) {
                    tagged += 1;
                    live += usize::from(slot.state.is_live(retired));
                }
            }
            assert_eq!(shard.used, tagged, "shard {index}: used");
            let len = shard.table.len();
            assert!(
                !over_full(shard.used, len),
                "shard {index}: {tagged} keys in {len} slots"
            );
            for (d, drain) in shard.drains.iter().enumerate() {
                let mut set = TagWords::new(&drain.from.tags);
                let unvisited = (drain.next..drain.from.len())
                    .map(|i| drain.index(i))
                    .filter(|&at| set.is_set(at) && drain.from[at].state.is_live(retired))
                    .count();
                assert_eq!(drain.left, unvisited, "shard {index}, drain {d}: left");
                live += drain.left;
            }
            assert_eq!(shard.live, live, "shard {index}: live");
        }
        if let Some(texts) = self.texts.get() {
            texts.mid.audit();
            texts.long.audit();
        }
    }

    /// Keys in the wider tables of a table of `String` keys, of 24 to 39 bytes and of 40 to
    /// 71 (`texts.rs`; for tests).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn wider_texts(&self) -> (usize, usize) {
        self.texts
            .get()
            .map_or((0, 0), |texts| (texts.mid.own_len(), texts.long.own_len()))
    }

    /// Slots in all current tables (for tests of the sizing).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().table.len())
            .sum()
    }
}
