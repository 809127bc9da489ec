//! Delay mode on backends that reserve (`CheckBackend::reserve`: GCRA, in one limiter or
//! several): waiters are served first come, first served, each charged once, and a reservation
//! that others pushed past `max_wait` is given back. On tokio's paused time.
//!
//! Run with `cargo test --features tower,tokio --test tower_delay`.

#![cfg(all(feature = "tower", feature = "tokio"))]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::tower::{CheckBackend, Key, Mode, Policy, RateLimitLayer};
use tollgate::wait::TokioClock;
use tollgate::{Gcra, KeyedLimiter, LeakyQueue, MultiLimiter, OverflowPolicy, Quota};
use tower_layer::Layer;
use tower_support::{gcra, paused_runtime, request, status, Ok200};

const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));

fn delayed(backend: impl CheckBackend, max_wait: Duration) -> tollgate::tower::RateLimit<Ok200> {
    let policy = Policy::new("p", backend).mode(Mode::Delay { max_wait });
    let layer = RateLimitLayer::builder()
        .default_policy(policy)
        .build()
        .unwrap();
    layer.layer(Ok200)
}

/// Requests `0..n`, sent 1 ms apart: each one's status and when it passed, in ms from the
/// start, in request order.
async fn burst(svc: &tollgate::tower::RateLimit<Ok200>, n: usize) -> Vec<(u16, u128)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..n {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i as u64)).await;
            let code = status(&svc, request("/", Some(CLIENT), &[])).await;
            (code, start.elapsed().as_millis())
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

#[test]
fn waiters_pass_in_the_order_they_came_each_at_its_own_slot() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        // 10 a second, burst 1: one at once, then one every 100 ms.
        let limiter = Arc::new(gcra(
            &clock,
            Quota::per_second(10).unwrap().with_burst(1).unwrap(),
        ));
        let svc = delayed(limiter.clone(), Duration::from_secs(1));
        let slots = burst(&svc, 5).await;
        // Request i came at i ms and took slot i·100 ms: in order, none re-checked past
        // another, none waiting longer than its place in the queue.
        assert_eq!(
            slots,
            [(200, 0), (200, 100), (200, 200), (200, 300), (200, 400)]
        );
        // Each charged once: the bucket's next slot is after the fifth.
        let next = limiter.peek(&Key::from(CLIENT), 1).unwrap();
        assert_eq!(next.retry_after(), Duration::from_millis(100));
    });
}

#[test]
fn a_wait_past_max_wait_is_refused_and_charges_nothing() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        let limiter = Arc::new(gcra(
            &clock,
            Quota::per_second(10).unwrap().with_burst(1).unwrap(),
        ));
        // Up to 250 ms: the first passes, the next two wait 100 and 200 ms, the rest are
        // refused at once.
        let svc = delayed(limiter.clone(), Duration::from_millis(250));
        let passed = burst(&svc, 5).await;
        let codes: Vec<_> = passed.iter().map(|&(code, _)| code).collect();
        assert_eq!(codes, [200, 200, 200, 429, 429]);
        assert_eq!(passed[2].1, 200);
        // The refused ones left nothing: the bucket is free again 100 ms after the third.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = limiter.peek(&Key::from(CLIENT), 1).unwrap();
        assert!(after.allowed(), "{after:?}");
    });
}

#[test]
fn several_quotas_reserve_on_each_and_wait_for_the_latest_slot() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        // 10 a second and 20 a second, bursts 1: the slower quota sets the slots.
        let rules = [
            Gcra::new(Quota::per_second(10).unwrap().with_burst(1).unwrap()).unwrap(),
            Gcra::new(Quota::per_second(20).unwrap().with_burst(1).unwrap()).unwrap(),
        ];
        let limiter = Arc::new(MultiLimiter::<Key, _, _>::with_clock(rules, clock).unwrap());
        let svc = delayed(limiter.clone(), Duration::from_secs(1));
        let slots = burst(&svc, 3).await;
        assert_eq!(slots, [(200, 0), (200, 100), (200, 200)]);
    });
}

#[test]
fn a_small_request_does_not_pass_a_large_one_that_came_first() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        // 10 a second, burst 3; the cost is the request's `x-cost`.
        let limiter = gcra(
            &clock,
            Quota::per_second(10).unwrap().with_burst(3).unwrap(),
        );
        let policy = Policy::new("p", limiter)
            .mode(Mode::Delay {
                max_wait: Duration::from_secs(1),
            })
            .cost_fn(|parts| {
                let cost = parts.headers.get("x-cost").and_then(|v| v.to_str().ok());
                cost.and_then(|c| c.parse().ok()).unwrap_or(1)
            });
        let layer = RateLimitLayer::builder()
            .default_policy(policy)
            .build()
            .unwrap();
        let svc = layer.layer(Ok200);
        let start = Instant::now();
        let send = |at: u64, cost: &'static str| {
            let svc = svc.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(at)).await;
                let request = request("/", Some(CLIENT), &[("x-cost", cost)]);
                (status(&svc, request).await, start.elapsed().as_millis())
            })
        };
        // The burst at once; then 3 units at 1 ms and 1 unit at 2 ms. Checking again after
        // each refusal, the single unit would be free first (at 100 ms) and pass the three
        // (due at 300 ms, then pushed to 400); in the queue, the three go first.
        let (all, large, small) = (send(0, "3"), send(1, "3"), send(2, "1"));
        assert_eq!(all.await.unwrap(), (200, 0));
        assert_eq!(large.await.unwrap(), (200, 300));
        assert_eq!(small.await.unwrap(), (200, 400));
    });
}

#[test]
fn a_leaky_queue_deeper_than_max_wait_refuses_and_gives_the_place_back() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        // One every 100 ms, a queue of 10: the check itself reserves a place in the queue.
        let rule = LeakyQueue::new(Quota::per_second(10).unwrap()).unwrap();
        let limiter = Arc::new(KeyedLimiter::<Key, _, _>::with_clock(rule, clock).unwrap());
        let svc = delayed(limiter.clone(), Duration::from_millis(250));
        let slots = burst(&svc, 5).await;
        // The fourth would wait 297 ms, the fifth as long: refused at once, places given back.
        assert_eq!(
            slots,
            [(200, 0), (200, 100), (200, 200), (429, 3), (429, 4)]
        );
        // Only the three admitted hold places: the next is due 100 ms after the third.
        let next = limiter.peek(&Key::from(CLIENT), 1).unwrap();
        assert_eq!(next.delay(), Duration::from_millis(100));
    });
}

const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8));
const THIRD: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));

/// A limiter of 10 a second, burst 1, holding one client: those that do not fit share one
/// state (`OverflowPolicy::Shared`).
fn one_place(clock: &TokioClock) -> Arc<KeyedLimiter<Key, Gcra, TokioClock>> {
    let rule = Gcra::new(Quota::per_second(10).unwrap().with_burst(1).unwrap()).unwrap();
    let limiter = KeyedLimiter::<Key, _>::builder(rule)
        .clock(*clock)
        .max_keys(1, OverflowPolicy::Shared)
        .build()
        .unwrap();
    Arc::new(limiter)
}

/// Sends a request from `client` and gives up on it after `after`.
async fn give_up(svc: &tollgate::tower::RateLimit<Ok200>, client: IpAddr, after: Duration) {
    let request = status(svc, request("/", Some(client), &[]));
    let answered = tokio::time::timeout(after, request).await;
    assert!(answered.is_err(), "still waiting when it gave up");
}

/// A client over `max_keys` waits on the state such clients share. If it gives up, its place
/// goes back to that state: not lost (its own key is absent), and not to its own state if it
/// found room since.
#[test]
fn a_reservation_on_the_shared_state_given_up_goes_back_there() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        let limiter = one_place(&clock);
        let svc = delayed(limiter.clone(), Duration::from_secs(1));
        // CLIENT holds the one place; OTHER spends the shared state's burst.
        assert_eq!(status(&svc, request("/", Some(CLIENT), &[])).await, 200);
        assert_eq!(status(&svc, request("/", Some(OTHER), &[])).await, 200);
        // OTHER again: the shared state's next slot is 100 ms away; it leaves after 10 ms.
        give_up(&svc, OTHER, Duration::from_millis(10)).await;
        // The slot is free again: a third client over the bound gets it, 90 ms on.
        let third = KeyedLimiter::check(&limiter, &Key::from(THIRD)).unwrap();
        assert_eq!(third.retry_after(), Duration::from_millis(90));
        assert_eq!(limiter.len(), 1, "OTHER never got a place of its own");
    });
}

#[test]
fn a_reservation_on_the_shared_state_never_credits_the_key_that_found_room_since() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        let limiter = one_place(&clock);
        let svc = delayed(limiter.clone(), Duration::from_secs(1));
        assert_eq!(status(&svc, request("/", Some(CLIENT), &[])).await, 200);
        assert_eq!(status(&svc, request("/", Some(OTHER), &[])).await, 200);
        // Two reservations of OTHER on the shared state: slots at 100 and 200 ms.
        let first = tokio::spawn({
            let svc = svc.clone();
            async move { status(&svc, request("/", Some(OTHER), &[])).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let second = tokio::spawn({
            let svc = svc.clone();
            async move { give_up(&svc, OTHER, Duration::from_millis(160)).await }
        });
        // At 150 ms CLIENT's state is fresh: OTHER's next request evicts it, takes the place,
        // and spends its own burst.
        tokio::time::sleep(Duration::from_millis(149)).await;
        assert_eq!(first.await.unwrap(), 200);
        assert_eq!(status(&svc, request("/", Some(OTHER), &[])).await, 200);
        assert_eq!(limiter.len(), 1);
        assert!(!limiter.peek(&Key::from(OTHER), 1).unwrap().allowed());
        // The second reservation is given up (at 161 ms): its slot goes back to the shared
        // state, and OTHER's own state stays spent until 250 ms.
        second.await.unwrap();
        let own = limiter.peek(&Key::from(OTHER), 1).unwrap();
        assert_eq!(own.retry_after(), Duration::from_millis(250 - 161));
        // The shared state's slot of 200 ms is free again (its next was at 300 ms).
        let shared = KeyedLimiter::check(&limiter, &Key::from(THIRD)).unwrap();
        assert_eq!(shared.retry_after(), Duration::from_millis(200 - 161));
    });
}

/// At most `per_key` requests of one key and `total` in all wait: the next are refused at
/// once, and a place is given back when its waiter passes. On a reserving backend (GCRA) and
/// on one that checks again (a fixed window).
#[test]
fn waiters_are_bounded_per_key_and_in_all() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        let backends = || -> [Arc<dyn CheckBackend>; 2] {
            let window = tollgate::FixedWindow::new(Quota::per_second(1).unwrap()).unwrap();
            [
                Arc::new(gcra(
                    &clock,
                    Quota::per_second(10).unwrap().with_burst(1).unwrap(),
                )),
                Arc::new(KeyedLimiter::<Key, _, _>::with_clock(window, clock).unwrap()),
            ]
        };
        let layer = |backend| {
            let policy = Policy::new("p", backend)
                .mode(Mode::Delay {
                    max_wait: Duration::from_secs(5),
                })
                .max_waiters(3, 2);
            let layer = RateLimitLayer::builder().default_policy(policy).build();
            layer.unwrap().layer(Ok200)
        };
        for backend in backends() {
            // One key: one passes at once, two wait, the fourth is refused at once; then the
            // places are free again.
            let svc = layer(backend);
            let statuses: Vec<u16> = burst(&svc, 4).await.iter().map(|r| r.0).collect();
            assert_eq!(statuses, [200, 200, 200, 429]);
            assert_eq!(burst(&svc, 1).await[0].0, 200, "places given back");
        }
        for backend in backends() {
            // A sends three, then B three: A's first and B's first pass at once, A's other two
            // and B's second take the three places, B's third is refused.
            let svc = layer(backend);
            let clients = [CLIENT, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8))];
            let mut tasks = Vec::new();
            for (i, client) in [0, 0, 0, 1, 1, 1].into_iter().enumerate() {
                let svc = svc.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(i as u64)).await;
                    status(&svc, request("/", Some(clients[client]), &[])).await
                }));
            }
            let mut statuses = Vec::new();
            for task in tasks {
                statuses.push(task.await.unwrap());
            }
            assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
        }
    });
}

/// A configured or built `max_wait` over 60 s is refused, as is a bound of no waiter.
#[test]
fn delay_bounds_are_checked() {
    let limiter =
        || KeyedLimiter::<Key, Gcra>::new(Gcra::new(Quota::per_second(1).unwrap()).unwrap());
    let build = |policy: Policy| RateLimitLayer::builder().default_policy(policy).build();
    let long = Mode::Delay {
        max_wait: Duration::from_secs(61),
    };
    assert!(build(Policy::new("p", limiter()).mode(long)).is_err());
    let minute = Mode::Delay {
        max_wait: Duration::from_secs(60),
    };
    assert!(build(Policy::new("p", limiter()).mode(minute)).is_ok());
    assert!(build(Policy::new("p", limiter()).max_waiters(0, 1)).is_err());
    assert!(build(Policy::new("p", limiter()).max_waiters(1, 0)).is_err());
}

/// Checks `inner`, noting when each check was made.
struct Noting<B> {
    inner: B,
    at: std::sync::Mutex<Vec<Instant>>,
}

impl<B: CheckBackend> CheckBackend for Noting<B> {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> tollgate::tower::CheckFuture<'a> {
        self.at.lock().unwrap().push(Instant::now());
        self.inner.check(key, cost)
    }

    fn quota_count(&self) -> usize {
        self.inner.quota_count()
    }

    fn quota(&self, index: usize) -> Option<tollgate::tower::QuotaInfo> {
        self.inner.quota(index)
    }
}

/// Waiters refused together by a window check again at instants spread over up to a quarter
/// of their wait, not all at the window's end.
#[test]
fn waiters_that_check_again_spread_their_wake_ups() {
    paused_runtime().block_on(async {
        let clock = TokioClock::new();
        let window = tollgate::FixedWindow::new(Quota::per_second(1).unwrap()).unwrap();
        let noting = Arc::new(Noting {
            inner: KeyedLimiter::<Key, _, _>::with_clock(window, clock).unwrap(),
            at: Default::default(),
        });
        let svc = delayed(noting.clone(), Duration::from_secs(30));
        let start = Instant::now();
        let statuses: Vec<u16> = burst(&svc, 8).await.iter().map(|r| r.0).collect();
        assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
        // The first recheck of each of the 7 waiters lies in [1 s, 1.25 s].
        let at = noting.at.lock().unwrap();
        let rechecks: std::collections::BTreeSet<u128> = at
            .iter()
            .map(|t| (*t - start).as_millis())
            .filter(|ms| (1_000..=1_250).contains(ms))
            .collect();
        assert!(rechecks.len() >= 4, "wake-ups at {rechecks:?} ms");
    });
}
