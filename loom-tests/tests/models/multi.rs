//! The all-or-nothing protocol of `MultiLimiter` over two limits.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate_loom_tests::clock::Nanos;
use tollgate_loom_tests::multi::{all_or_nothing, Limit};
use tollgate_loom_tests::state::AtomicWord;
use tollgate_loom_tests::{Decision, FixedWindow, LimitError, Quota, Stored};

use crate::{explore, MS};

const NOW: Nanos = MS / 2;

/// One limit for one key: a fixed window of 1 per 1 ms, at a frozen instant.
struct OneKey {
    rule: FixedWindow,
    cell: AtomicWord,
}

impl OneKey {
    fn new() -> Self {
        OneKey {
            rule: FixedWindow::new(Quota::new(1, Duration::from_millis(1)).unwrap()).unwrap(),
            cell: AtomicWord::new(0),
        }
    }

    /// Units counted in the window now.
    fn held(&self) -> u64 {
        1 - self.rule.acquire(&self.cell, || NOW, 0, false).remaining()
    }
}

impl Limit<()> for OneKey {
    fn peek(&self, _: &(), cost: u64) -> Result<Decision, LimitError> {
        Ok(self.rule.acquire(&self.cell, || NOW, cost, false))
    }

    fn charge(&self, _: &(), cost: u64) -> Result<Decision, LimitError> {
        Ok(self.rule.acquire(&self.cell, || NOW, cost, true))
    }

    fn refund(&self, _: &(), cost: u64, _: &Decision) {
        self.rule.refund(&self.cell, || NOW, cost);
    }
}

/// Two all-or-nothing requests on limits [X, Y] (1 unit each) race a plain check on Y, so a
/// request can pass both peeks, charge X, and find Y taken. Neither limit ever holds more
/// than 1; X holds exactly the admitted multi-requests (a refused one leaves nothing behind);
/// Y, which is never refunded, ends with exactly one unit, taken by whoever charged it first.
#[test]
fn multi_limit_all_or_nothing() {
    explore("multi_limit_all_or_nothing", || {
        let limits = Arc::new([OneKey::new(), OneKey::new()]);
        let multis: Vec<_> = (0..2)
            .map(|_| {
                let limits = Arc::clone(&limits);
                thread::spawn(move || all_or_nothing(&limits[..], &(), 1).unwrap().0)
            })
            .collect();
        let direct = {
            let limits = Arc::clone(&limits);
            thread::spawn(move || limits[1].charge(&(), 1).unwrap())
        };
        let multis: Vec<Decision> = multis.into_iter().map(|m| m.join().unwrap()).collect();
        let direct = direct.join().unwrap();

        let admitted = multis.iter().filter(|d| d.allowed()).count() as u64;
        let [x, y] = [limits[0].held(), limits[1].held()];
        assert!(admitted <= 1, "X admitted {admitted} > 1: {multis:?}");
        assert_eq!(
            x, admitted,
            "a refused request left a unit on X: {multis:?}"
        );
        assert_eq!(
            y,
            admitted + u64::from(direct.allowed()),
            "Y's count disagrees with its admissions: {multis:?}, direct {direct:?}"
        );
        assert_eq!(
            y, 1,
            "Y was left unused or overfilled: {multis:?}, {direct:?}"
        );
    });
}
