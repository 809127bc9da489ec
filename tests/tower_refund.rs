//! Refunds by response status: failures not charged, or only failures charged (a login
//! throttle). The layer is driven directly on a `ManualClock` (nothing refills).
//!
//! Run with `cargo test --features tower --test tower_refund` (add `serde` for the
//! configuration case).

#![cfg(feature = "tower")]

#[path = "support/tower.rs"]
mod tower_support;

use std::convert::Infallible;
use std::future::Ready;
use std::net::IpAddr;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::tower::{
    CheckBackend, CheckFuture, ConfigError, Key, Policy, QuotaInfo, RateLimit, RateLimitLayer,
};
use tollgate::{Gcra, KeyedLimiter, MultiLimiter, Quota};
use tower_layer::Layer;
use tower_service::Service;
use tower_support::{call, gcra, request, runtime};

/// Answers with the status named by the path's last segment (`/x/500` → 500).
#[derive(Clone)]
struct StatusFromPath;

impl Service<Request<String>> for StatusFromPath {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let status = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::OK);
        let mut response = Response::new(String::new());
        *response.status_mut() = status;
        std::future::ready(Ok(response))
    }
}

/// The layer's response to one request for `path` from one client.
fn respond(
    svc: &mut RateLimit<StatusFromPath>,
    path: &str,
) -> <RateLimit<StatusFromPath> as Service<Request<String>>>::Response {
    let client = Some(IpAddr::from([192, 0, 2, 1]));
    call(&runtime(), svc, request(path, client, &[]))
}

fn statuses(svc: &mut RateLimit<StatusFromPath>, paths: &[&str]) -> Vec<u16> {
    paths
        .iter()
        .map(|path| respond(svc, path).status().as_u16())
        .collect()
}

fn two_an_hour(clock: &ManualClock) -> KeyedLimiter<Key, Gcra, ManualClock> {
    gcra(clock, Quota::per_hour(2).unwrap())
}

#[test]
fn server_errors_are_not_charged() {
    let clock = ManualClock::new();
    let mut svc = RateLimitLayer::builder()
        .default_policy(
            Policy::new("api", two_an_hour(&clock)).refund_when(|s| s.is_server_error()),
        )
        .build()
        .unwrap()
        .layer(StatusFromPath);
    assert_eq!(
        statuses(
            &mut svc,
            &["/500", "/503", "/500", "/200", "/404", "/200", "/500"]
        ),
        // Three 5xx refunded; 200 and 404 charged; then the limit refuses even a would-be 500.
        [500, 503, 500, 200, 404, 429, 429]
    );
}

/// The response of a refunded request carries the state after the refund: its units are back
/// in `X-RateLimit-Remaining`, for one quota and for the tightest of several.
#[test]
fn headers_after_a_refund_show_the_units_given_back() {
    use tollgate::tower::HeaderStyle;
    fn remaining(svc: &mut RateLimit<StatusFromPath>, path: &str) -> (u16, String) {
        let response = respond(svc, path);
        let header = response.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_owned();
        (response.status().as_u16(), header)
    }
    let clock = ManualClock::new();
    let three = gcra(&clock, Quota::per_hour(3).unwrap());
    let mut svc = RateLimitLayer::builder()
        .default_policy(Policy::new("api", three).refund_when(|s| s.is_server_error()))
        .headers(HeaderStyle::Legacy)
        .build()
        .unwrap()
        .layer(StatusFromPath);
    assert_eq!(remaining(&mut svc, "/200"), (200, "2".to_owned()));
    // Admitted with 1 left, then refunded: the client still has 2.
    assert_eq!(remaining(&mut svc, "/500"), (500, "2".to_owned()));
    assert_eq!(remaining(&mut svc, "/200"), (200, "1".to_owned()));

    let both = MultiLimiter::<Key, _, _>::with_clock(
        [
            Gcra::new(Quota::per_hour(4).unwrap()).unwrap(),
            Gcra::new(Quota::per_minute(2).unwrap()).unwrap(),
        ],
        clock.clone(),
    )
    .unwrap();
    let mut svc = RateLimitLayer::builder()
        .default_policy(Policy::new("multi", both).refund_when(|s| s.is_server_error()))
        .headers(HeaderStyle::Legacy)
        .build()
        .unwrap()
        .layer(StatusFromPath);
    // The per-minute quota is the tightest: 1 left after one request, 1 again after a refund.
    assert_eq!(remaining(&mut svc, "/200"), (200, "1".to_owned()));
    assert_eq!(remaining(&mut svc, "/503"), (503, "1".to_owned()));
    assert_eq!(remaining(&mut svc, "/200"), (200, "0".to_owned()));
}

#[test]
fn a_login_throttle_charges_only_failures() {
    let clock = ManualClock::new();
    // Two failed logins an hour on every quota of a multi-limiter.
    let both = MultiLimiter::<Key, _, _>::with_clock(
        [
            Gcra::new(Quota::per_hour(2).unwrap()).unwrap(),
            Gcra::new(Quota::per_minute(5).unwrap()).unwrap(),
        ],
        clock.clone(),
    )
    .unwrap();
    let mut svc = RateLimitLayer::builder()
        .default_policy(Policy::new("login", both).refund_when(|s| s.is_success()))
        .build()
        .unwrap()
        .layer(StatusFromPath);
    assert_eq!(
        statuses(
            &mut svc,
            &["/200", "/200", "/401", "/200", "/200", "/401", "/200", "/401"]
        ),
        [200, 200, 401, 200, 200, 401, 429, 429]
    );
}

/// A backend that cannot refund (as the Redis tier's limiters).
struct NoRefunds(KeyedLimiter<Key, Gcra>);

impl CheckBackend for NoRefunds {
    fn check<'a>(&'a self, key: &'a Key, cost: u64) -> CheckFuture<'a> {
        CheckBackend::check(&self.0, key, cost)
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, index: usize) -> Option<QuotaInfo> {
        CheckBackend::quota(&self.0, index)
    }
}

#[test]
fn refunds_on_a_backend_that_cannot_refund_are_refused() {
    let backend = NoRefunds(KeyedLimiter::new(
        Gcra::new(Quota::per_hour(2).unwrap()).unwrap(),
    ));
    let e = RateLimitLayer::builder()
        .policy(Policy::new("r", backend).refund_when(|s| s.is_server_error()))
        .build()
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::Policy { ref policy, .. } if policy == "r"),
        "{e}"
    );
}

#[cfg(feature = "serde")]
#[test]
fn refunds_read_from_configuration() {
    use tollgate::tower::config::LayerConfig;
    let config: LayerConfig =
        toml::from_str("[[policy]]\nname = \"api\"\nquota = \"2/1h\"\nrefund = [\"5xx\", 404]")
            .unwrap();
    let clock = ManualClock::new();
    let mut svc = config
        .builder_with_clock(clock)
        .unwrap()
        .build()
        .unwrap()
        .layer(StatusFromPath);
    assert_eq!(
        statuses(&mut svc, &["/502", "/404", "/401", "/200", "/404"]),
        [502, 404, 401, 200, 429]
    );
    for (bad, want) in [
        ("[\"6xx\"]", "6xx"),
        ("[99]", "invalid status 99"),
        ("[\"5x\"]", "5x"),
    ] {
        let e = toml::from_str::<LayerConfig>(&format!(
            "[[policy]]\nname = \"api\"\nquota = \"2/1h\"\nrefund = {bad}"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
}
