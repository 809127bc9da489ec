//! `InFlight`: never more than `N` held per key under contention, every permit released on
//! every path (drop, panic, a future dropped while it holds one), keys with permits never
//! evicted, and the counts against a plain model over random operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use tollgate::{InFlight, LimitError, OverflowPolicy};

/// Threads oversubscribe the cores on one key: at no instant do more than `N` hold a permit,
/// and the bound is reached (no spurious refusal keeps it below).
#[test]
fn never_more_than_n_at_once_under_contention() {
    const N: u64 = 3;
    let limit = InFlight::<u64>::new(N).unwrap();
    let (holding, most, admitted) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let start = Barrier::new(8);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                start.wait();
                for _ in 0..20_000 {
                    if let Some(permit) = limit.try_acquire(&7).unwrap() {
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::Relaxed);
                        std::hint::spin_loop();
                        holding.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                }
            });
        }
    });
    assert!(most.load(Ordering::SeqCst) <= N, "{most:?} held at once");
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(limit.in_flight(&7), 0, "every permit released");
}

/// A permit is released when a panic unwinds past it, and when the future holding it is
/// dropped before it completes (a timed-out or cancelled request).
#[test]
fn permits_are_released_on_panics_and_dropped_futures() {
    let limit = InFlight::<String>::new(2).unwrap();
    for _ in 0..10 {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _permit = limit.try_acquire("alice").unwrap().unwrap();
            panic!("the handler failed");
        }));
        assert!(result.is_err());
    }
    assert_eq!(limit.in_flight("alice"), 0);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        for _ in 0..10 {
            let request = async {
                let _permit = limit.try_acquire("alice").unwrap().unwrap();
                std::future::pending::<()>().await;
            };
            let timed_out = tokio::time::timeout(Duration::from_millis(1), request).await;
            assert!(timed_out.is_err());
        }
    });
    assert_eq!(limit.in_flight("alice"), 0);
}

/// Keys holding permits are never evicted, at the `max_keys` bound under a flood of new keys
/// or by `evict_idle`; keys with nothing in flight make room.
#[test]
fn keys_holding_permits_are_never_evicted() {
    for policy in [OverflowPolicy::Deny, OverflowPolicy::Shared] {
        let limit = InFlight::<u64>::with_max_keys(1, 1_000, policy).unwrap();
        let held: Vec<_> = (0..100)
            .map(|key| limit.try_acquire(&key).unwrap().unwrap())
            .collect();
        for key in 1_000..200_000u64 {
            // Each new key acquires and releases at once: idle, so it may make room.
            match limit.try_acquire(&key) {
                Ok(permit) => assert!(permit.is_some(), "{policy:?}: key {key} refused"),
                Err(LimitError::KeyTableFull { .. }) => panic!("{policy:?}: no room made"),
                Err(e) => panic!("{e}"),
            }
            if key % 10_000 == 0 {
                assert!(limit.evict_idle() <= 1_000);
            }
        }
        assert!(limit.len() <= 1_000, "{policy:?}: {} keys", limit.len());
        for key in 0..100 {
            assert_eq!(
                limit.in_flight(&key),
                1,
                "{policy:?}: key {key} kept its permit"
            );
            assert!(limit.try_acquire(&key).unwrap().is_none());
        }
        drop(held);
        for key in 0..100 {
            assert_eq!(limit.in_flight(&key), 0);
        }
    }
}

/// Keys over `max_keys` under `Shared` share one count: together they hold at most `N`, and
/// a permit taken there is released there even if its key found room meanwhile.
#[test]
fn the_shared_overflow_count_is_released_where_it_was_taken() {
    let limit = InFlight::<u64>::with_max_keys(2, 1, OverflowPolicy::Shared).unwrap();
    let own = limit.try_acquire(&1).unwrap().unwrap();
    let a = limit.try_acquire(&2).unwrap().unwrap(); // overflow: 1 of 2
    let b = limit.try_acquire(&3).unwrap().unwrap(); // overflow: 2 of 2
    assert!(
        limit.try_acquire(&4).unwrap().is_none(),
        "the overflow count is full"
    );
    drop(own);
    assert_eq!(limit.evict_idle(), 1); // key 1 goes, and key 2 finds room of its own
    let a2 = limit.try_acquire(&2).unwrap().unwrap();
    assert_eq!(limit.in_flight(&2), 1);
    drop(a); // taken from the overflow count: given back there, not to key 2
    assert_eq!(limit.in_flight(&2), 1);
    drop(b);
    let c = limit.try_acquire(&5).unwrap().unwrap();
    let d = limit.try_acquire(&6).unwrap().unwrap();
    assert_eq!(
        (c.remaining(), d.remaining()),
        (1, 0),
        "the overflow count was given back"
    );
    assert!(limit.try_acquire(&7).unwrap().is_none());
    drop(a2);
    assert_eq!(limit.in_flight(&2), 0);
}

/// Random acquires, releases and sweeps on a few keys, against a map of counts.
#[test]
fn counts_match_a_model_over_random_operations() {
    const N: u64 = 5;
    let limit = InFlight::<u32>::new(N).unwrap();
    assert_eq!(limit.max(), N);
    assert_eq!(format!("{limit:?}"), "InFlight { max: 5, .. }");
    let mut model: HashMap<u32, u64> = HashMap::new();
    let mut permits = Vec::new();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for step in 0..50_000 {
        match next(10) {
            0..=4 => {
                let (key, cost) = (next(8) as u32, next(N + 2));
                let held = model.get(&key).copied().unwrap_or(0);
                match limit.try_acquire_n(&key, cost) {
                    Err(LimitError::CapacityExceeded { .. }) => assert!(cost > N, "step {step}"),
                    Err(e) => panic!("step {step}: {e}"),
                    Ok(Some(permit)) => {
                        assert!(held + cost <= N, "step {step}: admitted past the bound");
                        assert_eq!(permit.remaining(), N - held - cost);
                        *model.entry(key).or_default() += cost;
                        permits.push(permit);
                    }
                    Ok(None) => assert!(held + cost > N, "step {step}: refused below the bound"),
                }
            }
            5..=8 if !permits.is_empty() => {
                let permit = permits.swap_remove(next(permits.len() as u64) as usize);
                *model.entry(*permit.key()).or_default() -= permit.cost();
            }
            _ => {
                let idle = model.values().filter(|&&held| held == 0).count();
                assert!(limit.evict_idle() <= idle + 8, "step {step}");
                model.retain(|_, held| *held > 0);
                // Every key left holds units.
                assert_eq!(limit.len(), model.len(), "step {step}");
                assert_eq!(limit.is_empty(), model.is_empty(), "step {step}");
            }
        }
        for (key, held) in &model {
            assert_eq!(limit.in_flight(key), *held, "step {step}, key {key}");
        }
    }
}

/// Owned permits move into spawned tasks; a task aborted while it holds one gives it back.
#[test]
fn owned_permits_are_released_when_their_task_is_aborted() {
    let limit = std::sync::Arc::new(InFlight::<u64>::new(3).unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let permit = limit.try_acquire_owned(&9).unwrap().unwrap();
                tokio::spawn(async move {
                    let _held = permit;
                    std::future::pending::<()>().await;
                })
            })
            .collect();
        assert!(limit.try_acquire_owned(&9).unwrap().is_none(), "3 held");
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            assert!(task.await.unwrap_err().is_cancelled());
        }
    });
    assert_eq!(
        limit.in_flight(&9),
        0,
        "every aborted task's permit released"
    );
    let permit = limit.try_acquire_n_owned(&9, 3).unwrap().unwrap();
    assert_eq!(
        (permit.key(), permit.cost(), permit.remaining()),
        (&9, 3, 0)
    );
}
