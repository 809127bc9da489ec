//! Tiers: a key's limit follows its tier, keys move between tiers at run time, a closure
//! classifies keys the map does not hold. The layer is driven directly on a `ManualClock`.
//!
//! Run with `cargo test --features tower --test tower_tiers`.

#![cfg(feature = "tower")]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderName, Response};
use tollgate::clock::ManualClock;
use tollgate::tower::{
    CheckBackend, Key, KeySource, Policy, RateLimit, RateLimitBody, RateLimitLayer, Tiers,
};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tower_layer::Layer;
use tower_support::{call, gcra, request, runtime, Ok200};

fn send(svc: &mut RateLimit<Ok200>, api_key: &str) -> Response<RateLimitBody<String>> {
    let client = Some(IpAddr::from([192, 0, 2, 1]));
    call(
        &runtime(),
        svc,
        request("/", client, &[("x-api-key", api_key)]),
    )
}

fn admitted(svc: &mut RateLimit<Ok200>, api_key: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| send(svc, api_key).status().is_success())
        .count()
}

fn per_hour(n: u64, clock: &ManualClock) -> KeyedLimiter<Key, Gcra, ManualClock> {
    gcra(clock, Quota::per_hour(n).unwrap())
}

#[test]
fn keys_move_between_tiers_at_run_time() {
    let clock = ManualClock::new();
    let tiers = Tiers::builder("free", per_hour(2, &clock))
        .tier("pro", per_hour(5, &clock))
        .build()
        .unwrap();
    assert_eq!(tiers.quota_count(), 2);
    let layer = RateLimitLayer::builder()
        .default_policy(
            Policy::new("api", tiers).key(KeySource::header(HeaderName::from_static("x-api-key"))),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(Ok200);
    assert_eq!(admitted(&mut svc, "k", 10), 2);
    let response = send(&mut svc, "k");
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"api-1\";q=2;w=3600, \"api-2\";q=5;w=3600"
    );
    assert!(response.headers()["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"api-1\";r=0;"));
    // Upgraded while the server runs: the pro tier's own state for the key.
    let tiers = layer.tiers("api").expect("a tiered policy");
    tiers.assign(Key::from("k"), "pro").unwrap();
    assert!(tiers.assign(Key::from("k"), "gold").is_err());
    assert_eq!(admitted(&mut svc, "k", 10), 5);
    assert!(send(&mut svc, "k").headers()["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"api-2\";r=0;"));
    // Back to free: its state was kept (still empty).
    tiers.unassign(&Key::from("k"));
    assert_eq!(admitted(&mut svc, "k", 3), 0);
    // Other keys were never in another tier.
    assert_eq!(admitted(&mut svc, "other", 3), 2);
    assert!(layer.tiers("nope").is_none());
}

#[test]
fn a_closure_classifies_keys_the_map_does_not_hold() {
    let clock = ManualClock::new();
    let tiers = Tiers::builder("free", per_hour(1, &clock))
        .tier("pro", per_hour(3, &clock))
        .classify(|key| match key {
            Key::Text(text) if text.starts_with("pro_") => Some(Arc::from("pro")),
            Key::Text(text) if text.starts_with("x_") => Some(Arc::from("no such tier")),
            _ => None,
        })
        .build()
        .unwrap();
    let mut svc = RateLimitLayer::builder()
        .default_policy(
            Policy::new("api", tiers.clone())
                .key(KeySource::header(HeaderName::from_static("x-api-key"))),
        )
        .build()
        .unwrap()
        .layer(Ok200);
    assert_eq!(admitted(&mut svc, "pro_1", 5), 3);
    assert_eq!(admitted(&mut svc, "x_1", 5), 1);
    assert_eq!(admitted(&mut svc, "free_1", 5), 1);
    // The map wins over the closure.
    tiers.assign(Key::from("pro_2"), "free").unwrap();
    assert_eq!(admitted(&mut svc, "pro_2", 5), 1);
    assert_eq!(tiers.names().collect::<Vec<_>>(), ["free", "pro"]);
    assert!(Tiers::builder("a", per_hour(1, &clock))
        .tier("a", per_hour(1, &clock))
        .build()
        .is_err());
}
