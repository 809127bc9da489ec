//! `ParamCell`, the sequence lock `set_quota` stores a rule's parameters through.

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::state::ParamCell;

use crate::explore;

/// Parameter set `k`: every word tells which set it came from.
fn set(k: u64) -> [u64; 5] {
    [k, 10 + k, 20 + k, 30 + k, 40 + k]
}

/// Which set `words` is, if it is one set and not a torn mix.
fn which(words: [u64; 5]) -> Option<u64> {
    (0..3).find(|&k| words == set(k))
}

/// One writer stores set 1 then set 2 (writers are serialised by the caller, as `Engine` does
/// with its lock) while a reader loads twice: every snapshot is one whole set, and the reader
/// never goes back to an older set. (Readers never write, so a second reader adds no race
/// this one lacks; with a second one, loom had not finished after 15 minutes.)
#[test]
fn param_cell_never_torn() {
    explore("param_cell_never_torn", || {
        let cell = Arc::new(ParamCell::<()>::new(set(0)));
        let writer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                cell.store(set(1));
                cell.store(set(2));
            })
        };
        let reader = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || [cell.load(), cell.load()])
        };
        let [first, second] = reader.join().unwrap();
        writer.join().unwrap();
        for words in [first, second] {
            assert!(which(words).is_some(), "torn parameters: {words:?}");
        }
        assert!(
            which(first) <= which(second),
            "a reader went back from {first:?} to {second:?}"
        );
        assert_eq!(which(cell.load()), Some(2));
    });
}
