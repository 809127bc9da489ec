use std::marker::PhantomData;

use crate::algorithm::{Words, WORDS};
use crate::sync::{fence, AtomicU64, Ordering};

/// A rule's parameters, read on every check and replaced by `set_quota`: a sequence lock over
/// atomic words, so readers never write shared memory and never block.
///
/// `seq` is even when the words are stable and odd while a writer is storing them; a reader
/// retries when `seq` was odd or changed under it. Writers must be serialised by the caller.
#[derive(Debug)]
pub struct ParamCell<P> {
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
    _params: PhantomData<P>,
}

impl<P> ParamCell<P> {
    /// A cell holding `words`.
    pub fn new(words: Words) -> Self {
        ParamCell {
            seq: AtomicU64::new(0),
            words: words.map(AtomicU64::new),
            _params: PhantomData,
        }
    }

    /// A consistent snapshot of the words.
    #[inline]
    pub fn load(&self) -> Words {
        loop {
            // Acquire: pairs with the writer's final Release, so the words it stored are visible.
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                // Relaxed: the seq re-check below decides whether these reads are kept.
                let words: Words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
                // Acquire fence: orders the word reads before the re-read of `seq`, so a writer
                // that started meanwhile is seen (pairs with the writer's Release fence).
                fence(Ordering::Acquire);
                // Relaxed: ordered by the fence above.
                if self.seq.load(Ordering::Relaxed) == before {
                    return words;
                }
            }
            crate::sync::spin_loop();
        }
    }

    /// Replaces the words. Callers serialise writers (the limiter holds a lock).
    pub fn store(&self, words: Words) {
        // Relaxed: only writers change `seq`, and they are serialised by the caller's lock.
        let seq = self.seq.load(Ordering::Relaxed);
        // Relaxed store + Release fence: readers that see any new word below also see the odd
        // `seq` (the fence orders this store before the word stores).
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (slot, word) in self.words.iter().zip(words) {
            // Relaxed: published by the Release store of `seq` below.
            slot.store(word, Ordering::Relaxed);
        }
        // Release: publishes the words to readers that Acquire-load the even `seq`.
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod examples {
    //! The examples of this file's items (crate-private, so not doctests).

    #[test]
    fn paramcell_example() {
        use crate::state::ParamCell;
        // The type parameter says what the words encode (here: nothing in particular).
        let cell = ParamCell::<()>::new([10, 0, 0, 0, 0]);
        cell.store([20, 0, 0, 0, 0]); // a quota change, under the caller's lock
        assert_eq!(cell.load()[0], 20);
    }

    #[test]
    fn new_example() {
        use crate::state::ParamCell;
        // The type parameter names what the words encode; it is not stored.
        let cell = ParamCell::<u8>::new([1, 2, 3, 4, 5]);
        assert_eq!(cell.load(), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn load_example() {
        use crate::state::ParamCell;
        use std::sync::Mutex;
        let cell = ParamCell::<()>::new([1; 5]);
        let writer = Mutex::new(()); // writers must be serialised by the caller
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in 2..100 {
                    let _guard = writer.lock().unwrap();
                    cell.store([n; 5]);
                }
            });
            for _ in 0..1_000 {
                // Never a mix of two stores: all five words come from one.
                let words = cell.load();
                assert!(words.iter().all(|&w| w == words[0]));
            }
        });
    }

    #[test]
    fn store_example() {
        use crate::state::ParamCell;
        let cell = ParamCell::<()>::new([0; 5]);
        cell.store([7, 7, 7, 7, 7]);
        assert_eq!(cell.load(), [7; 5]);
    }
}
