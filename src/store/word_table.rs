//! The lock-free keyed store for the rules whose state is one word (GCRA, leaky bucket, both
//! window counters): a lookup of an existing key takes no lock and writes nothing but the key's
//! own state word.
//!
//! # Design
//! Keys are spread over [`SHARDS`] shards; each shard owns an open-addressing table (linear
//! probing) of slots `{ state word, key set once }`. Only inserts, evictions and rebuilds lock
//! their shard. Three rules make lock-free lookups safe without `unsafe` or epochs:
//!
//! 1. **A slot's key never changes** within a table (a `OnceLock`), so a reader that matched a
//!    key can never act on another key's state (no ABA through slot reuse).
//! 2. **A cell is retired by one CAS** from a live state: eviction writes the rule's tombstone
//!    (only if the state is fresh), a rebuild writes the rule's `moved` mark (whatever the live
//!    state) and copies the state it replaced. A decision's CAS therefore lands either before the
//!    retirement (which then re-reads and judges or copies the new state) or fails and sees it:
//!    no admission is lost to an eviction or a move. Rules never produce either mark
//!    (`WordRule::RETIRED`).
//! 3. **Tables are reference-counted and each thread caches its shard tables** (a thread-local
//!    per store), so the hot path reads the cached table without touching any shared counter.
//!    A stale cached table is still safe: every live slot of a replaced table is `moved`, so a
//!    reader that meets one refreshes its cache (under the shard lock) and retries; a key
//!    missing or tombstoned there is looked up again on the insert path, under the lock.
//!
//! A tombstoned key is revived in place if it comes back; other tombstones are dropped when the
//! shard is rebuilt (when it fills up, or after a sweep left more tombstones than live keys).
//!
//! # Caveats
//! - A thread that stops calling keeps the tables it cached alive until it calls again (an
//!   exited thread's cache passes to the next thread that gets its id): at most one replaced
//!   table per shard per thread.
//! - Keys are cloned when a shard is rebuilt (`K: Clone`).
//! - Only cells that are one [`AtomicWord`]: the sliding log keeps the dashmap store.

use std::borrow::Borrow;
use std::cell::Cell;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;

use crate::state::{AtomicWord, Retired};
use crate::store::KeyedStore;
use crate::sync::{Arc, Mutex, PerThread};

/// Shards: inserts, evictions and rebuilds of different shards never wait for each other.
pub const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// The smallest table a shard holds.
const MIN_CAPACITY: usize = 8;
/// A shard is rebuilt before its used slots (live keys and tombstones) exceed 7/8 of its
/// table, into a table that the live keys fill to 5/8 ...
const FULL: (usize, usize) = (7, 8);
const REFILL: (usize, usize) = (5, 8);
/// ... except a small table, which stays at most half full (rebuilt before 1/2, refilled to
/// 1/4): its slots stay in cache whatever their number, and a lookup's probe then nearly always
/// ends at the home slot, so the probe loop's exit is predicted (1k keys: 217 → 206
/// instructions, about 33 → 28 ns a check). A large table's lookups are bound by the miss on
/// the slot, and a fuller table holds more keys per byte (1M keys: 32.6 bytes each).
const SMALL_FULL: (usize, usize) = (1, 2);
const SMALL_REFILL: (usize, usize) = (1, 4);
/// The largest small table, in slots (64 shards of it: 1.5 MiB of 24-byte slots).
const SMALL_SLOTS: usize = 1024;

/// Whether a table of `len` slots must be rebuilt before it holds `used` used slots.
fn over_full(used: usize, len: usize) -> bool {
    let (num, den) = if len <= SMALL_SLOTS { SMALL_FULL } else { FULL };
    used * den > len * num
}

/// The slots of a table rebuilt for `keys` live keys: small while the small refill fits, else
/// larger than any small table (so that `over_full` judges it by the large rule).
fn sized_for(keys: usize) -> usize {
    let small = keys * SMALL_REFILL.1 / SMALL_REFILL.0 + 1;
    if small <= SMALL_SLOTS {
        small
    } else {
        (keys * REFILL.1 / REFILL.0 + 1).max(SMALL_SLOTS + 1)
    }
}

struct Slot<K> {
    state: AtomicWord,
    key: OnceLock<K>,
}

/// One shard's table: the slots themselves behind the `Arc` (one pointer less to follow on
/// a lookup than a struct holding a boxed slice). Never shrinks or grows in place: a rebuild
/// makes a new one.
type Table<K> = [Slot<K>];

fn new_table<K>(capacity: usize) -> Arc<Table<K>> {
    (0..capacity.max(MIN_CAPACITY))
        .map(|_| Slot {
            state: AtomicWord::new(0),
            key: OnceLock::new(),
        })
        .collect()
}

/// Where a hash's probe starts: the low 32 bits scaled to the table (any length).
#[inline]
fn home<K>(table: &Table<K>, hash: u64) -> usize {
    ((hash as u32 as u64 * table.len() as u64) >> 32) as usize
}

/// The slot holding `key`, or the first empty slot of its probe (`Err`). A table always has
/// an empty slot (rebuilds keep used slots below 7/8), so the probe ends.
#[inline]
fn find<'t, K, Q>(table: &'t Table<K>, hash: u64, key: &Q) -> Result<&'t Slot<K>, usize>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let mut i = home(table, hash);
    loop {
        let slot = &table[i];
        match slot.key.get() {
            None => return Err(i),
            Some(held) if held.borrow() == key => return Ok(slot),
            Some(_) => {}
        }
        i += 1;
        if i == table.len() {
            i = 0;
        }
    }
}

struct Shard<K> {
    table: Arc<Table<K>>,
    /// Slots with a key (live or tombstoned) in `table`.
    used: usize,
    /// Slots with a live key.
    live: usize,
}

/// Each thread's cached table per shard (see the module docs, rule 3). A lookup takes its
/// shard's table out of the cell and puts it back when done; a lookup nested in it (a clock
/// that calls its own limiter) finds the cell empty and fetches the table itself.
struct Cache<K>([Cell<Option<Arc<Table<K>>>>; SHARDS]);

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Cache(std::array::from_fn(|_| Cell::new(None)))
    }
}

/// The lock-free keyed store for one-word cells. Built by [`KeyedLimiter`]'s builder for
/// the word rules; see the module documentation for the protocol.
///
/// [`KeyedLimiter`]: crate::KeyedLimiter
pub struct WordTable<K: Send + Sync, H> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: H,
    retired: Retired,
    cache: PerThread<Cache<K>>,
}

impl<K: Send + Sync, H> std::fmt::Debug for WordTable<K, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordTable")
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

impl<K: Send + Sync, H> WordTable<K, H> {
    /// An empty store whose cells use `retired`'s marks, hashing with `hasher`. The marks must
    /// be those of the rule the store will serve (states that rule never produces), so build
    /// one through [`KeyedLimiterBuilder::build`](crate::KeyedLimiterBuilder::build) (or
    /// `Algorithm::new_store`); this constructor is public for the loom models.
    #[doc(hidden)]
    pub fn new(retired: Retired, hasher: H) -> Self {
        WordTable {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        table: new_table(MIN_CAPACITY),
                        used: 0,
                        live: 0,
                    })
                })
                .collect(),
            hasher,
            retired,
            cache: PerThread::new(),
        }
    }

    /// The shard's current table (under its lock): off the fast path.
    #[cold]
    #[inline(never)]
    fn current(&self, shard: usize) -> Arc<Table<K>> {
        self.shards[shard].lock().table.clone()
    }
}

impl<K: Send + Sync, H: BuildHasher> WordTable<K, H> {
    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, (hash >> (64 - SHARD_BITS)) as usize)
    }
}

impl<K: Clone + Hash + Eq + Send + Sync, H: BuildHasher> WordTable<K, H> {
    /// Replaces `shard`'s table by one sized for its live keys plus `room`, moving every live
    /// cell (rule 2) and dropping tombstones.
    fn rebuild(&self, shard: &mut Shard<K>, room: usize) {
        let wanted = sized_for(shard.live + room);
        let next = new_table::<K>(wanted);
        let retired = self.retired;
        let mut live = 0;
        for slot in shard.table.iter() {
            let Some(key) = slot.key.get() else { continue };
            let Some(state) = slot.state.retire_if(retired.moved, |s| !retired.any(s)) else {
                continue; // a tombstone: dropped
            };
            let (hash, _) = self.hash(key);
            if let Err(empty) = find(&next, hash, key) {
                let moved = &next[empty];
                moved.state.retire_if(state, |_| true);
                let _ = moved.key.set(key.clone());
                live += 1;
            }
        }
        shard.table = next;
        shard.used = live;
        shard.live = live;
    }
}

impl<K, H> KeyedStore<K, AtomicWord> for WordTable<K, H>
where
    K: Clone + Hash + Eq + Send + Sync,
    H: BuildHasher + Send + Sync,
{
    #[inline]
    fn with_existing<Q, R>(&self, key: &Q, mut f: impl FnMut(&AtomicWord) -> Option<R>) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (hash, shard) = self.hash(key);
        let shard = shard % SHARDS;
        let moved = self.retired.moved;
        self.cache.with(|cache| {
            let cached = &cache.0[shard];
            let mut table = cached.take();
            // One loop and one call of `f`, so that its result stays in registers: a second
            // path returning it through memory made the compiler copy every decision through
            // the stack, and the copy stalled on store forwarding (benches/README.md).
            let result = loop {
                if let Some(table) = table.as_deref() {
                    match find(table, hash, key) {
                        Err(_) => break None,
                        Ok(slot) => {
                            let result = f(&slot.state);
                            // Moved is final: the table is stale. A tombstone (or a key revived
                            // since): absent here; the insert path looks again under the lock.
                            if result.is_some() || slot.state.load() != moved {
                                break result;
                            }
                        }
                    }
                }
                // No table of the shard cached yet, or a stale one.
                table = Some(self.current(shard));
            };
            cached.set(table);
            result
        })
    }

    fn with_inserted<Q, R>(&self, key: &Q, f: impl FnOnce(&AtomicWord) -> R) -> (R, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hash, index) = self.hash(key);
        let mut shard = self.shards[index].lock();
        let tombstone = self.retired.tombstone;
        let (result, inserted) = match find(&shard.table, hash, key) {
            Ok(slot) => {
                // A tombstoned key comes back in place, fresh (rule 1: same key).
                let revived = slot.state.retire_if(0, |s| s == tombstone).is_some();
                (f(&slot.state), revived)
            }
            Err(_) => {
                if over_full(shard.used + 1, shard.table.len()) {
                    self.rebuild(&mut shard, 1);
                }
                shard.used += 1;
                let table = &shard.table;
                // Absent under the lock, so `find` ends at an empty slot.
                let slot = match find(table, hash, key) {
                    Err(empty) => &table[empty],
                    Ok(slot) => slot,
                };
                let _ = slot.key.set(key.to_owned());
                (f(&slot.state), true)
            }
        };
        if inserted {
            shard.live += 1;
        }
        let table = shard.table.clone();
        drop(shard);
        // This thread just paid for the lock: leave its cache current.
        self.cache
            .with(|cache| cache.0[index % SHARDS].set(Some(table)));
        (result, inserted)
    }

    fn retain(&self, mut keep: impl FnMut(&AtomicWord) -> bool) -> usize {
        let retired = self.retired;
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let mut gone = 0;
            for slot in shard.table.iter() {
                if slot.key.get().is_some() && !retired.any(slot.state.load()) && !keep(&slot.state)
                {
                    gone += 1;
                }
            }
            shard.live -= gone;
            removed += gone;
            // Reclaim tombstones once they outnumber the live keys.
            if shard.used - shard.live > shard.live.max(MIN_CAPACITY) {
                self.rebuild(&mut shard, 0);
            }
        }
        removed
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().live).sum()
    }
}

impl<K: Send + Sync, H> WordTable<K, H> {
    /// Slots in all current tables (for tests of the sizing).
    #[allow(dead_code)] // read by the unit tests in `word_table_tests.rs`
    pub(crate) fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().table.len())
            .sum()
    }
}
