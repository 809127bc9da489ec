//! How the layer asks its backend: through `check_now` when the backend decides at once (the
//! request then needs no boxed future), else through `check`; either way exactly once per
//! request, with the same responses.
//!
//! Run with `cargo test --features tower --test tower_backend`.

#![cfg(feature = "tower")]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::HeaderMap;
use tollgate::clock::ManualClock;
use tollgate::tower::{
    CheckBackend, CheckError, CheckFuture, Key, Policy, QuotaInfo, RateLimitLayer, Verdict,
};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tower_layer::Layer;
use tower_support::{call, gcra, request, runtime, Ok200};

/// A limiter that counts how it is asked; `at_once` says whether it answers `check_now`.
struct Counted {
    limiter: KeyedLimiter<Key, Gcra, ManualClock>,
    at_once: bool,
    checks: AtomicUsize,
    checks_now: AtomicUsize,
}

impl CheckBackend for Counted {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        // Boxed, as a network backend's answer is.
        CheckFuture::boxed(CheckBackend::check(&self.limiter, key, cost))
    }

    fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Verdict, CheckError>> {
        if !self.at_once {
            return None;
        }
        self.checks_now.fetch_add(1, Ordering::Relaxed);
        CheckBackend::check_now(&self.limiter, key, cost)
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        CheckBackend::quota(&self.limiter, index)
    }
}

/// Four requests from one client through a layer over `backend` (2 an hour): each response's
/// status and headers.
fn serve(backend: Arc<Counted>) -> Vec<(u16, HeaderMap)> {
    let mut svc = RateLimitLayer::builder()
        .policy(Policy::new("api", backend))
        .build()
        .unwrap()
        .layer(Ok200);
    let rt = runtime();
    (0..4)
        .map(|_| {
            let client = Some(IpAddr::from([192, 0, 2, 1]));
            let response = call(&rt, &mut svc, request("/", client, &[]));
            (response.status().as_u16(), response.headers().clone())
        })
        .collect()
}

fn counted(at_once: bool) -> Arc<Counted> {
    Arc::new(Counted {
        limiter: gcra(&ManualClock::default(), Quota::per_hour(2).unwrap()),
        at_once,
        checks: AtomicUsize::new(0),
        checks_now: AtomicUsize::new(0),
    })
}

#[test]
fn each_request_asks_the_backend_once_by_whichever_call_answers() {
    let now = counted(true);
    let later = counted(false);
    let served_now = serve(Arc::clone(&now));
    let served_later = serve(Arc::clone(&later));
    let statuses: Vec<u16> = served_now.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    // The same responses, headers included, on both paths.
    assert_eq!(served_now, served_later);
    assert_eq!(
        (
            now.checks_now.load(Ordering::Relaxed),
            now.checks.load(Ordering::Relaxed)
        ),
        (4, 0)
    );
    assert_eq!(
        (
            later.checks_now.load(Ordering::Relaxed),
            later.checks.load(Ordering::Relaxed)
        ),
        (0, 4)
    );
}
