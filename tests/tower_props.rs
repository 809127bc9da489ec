//! The tower layer driven directly (no network) against limiters driven by hand on the same
//! `ManualClock`: for random policies and request sequences the layer admits exactly what the
//! core limiter decides, with the same header figures. Also: header content never panics, and
//! requests without a peer address get the configured outcome.
//!
//! Run with `cargo test --features tower --test tower_props`.

#![cfg(feature = "tower")]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::tower::{
    CheckBackend, CheckFuture, HeaderStyle, Key, Mode, Policy, QuotaInfo, RateLimitLayer, Verdict,
};
use tollgate::Algorithm;
use tollgate::{Decision, FixedWindow, Gcra, KeyedLimiter, MultiLimiter, Quota, SlidingWindow};
use tower_layer::Layer;
use tower_support::{call, ceil_secs, header, request, runtime, Ok200};

/// One request: advance the clock, then send from client `client` to `/a` (limited) or `/b`
/// (no policy).
#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    client: u8,
    limited: bool,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..700, 0u8..3, prop::bool::weighted(0.85)).prop_map(
            |(advance_ms, client, limited)| Step {
                advance_ms,
                client,
                limited,
            },
        ),
        1..60,
    )
}

/// How the random policy runs: its cost and whether it is in shadow mode.
#[derive(Debug, Clone, Copy)]
struct Run {
    cost: u64,
    shadow: bool,
}

/// Drives a layer over `backend` and `reference` (the same rules on the same clock) through
/// `steps`, and checks every response against the reference's decision.
fn agree(
    clock: &ManualClock,
    backend: impl CheckBackend,
    reference: impl Fn(&Key, u64) -> Decision,
    Run { cost, shadow }: Run,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mode = if shadow { Mode::Shadow } else { Mode::Enforce };
    let layer = RateLimitLayer::builder()
        .policy(
            Policy::new("p", backend)
                .path_prefix("/a")
                .cost(cost)
                .mode(mode),
        )
        .headers(HeaderStyle::Both)
        .build()
        .unwrap();
    let mut svc = layer.layer(Ok200);
    let rt = runtime();
    for step in steps {
        clock.advance(Duration::from_millis(step.advance_ms));
        let ip = IpAddr::from([192, 0, 2, step.client]);
        let path = if step.limited { "/a/x" } else { "/b" };
        let response = call(&rt, &mut svc, request(path, Some(ip), &[]));
        if !step.limited {
            prop_assert_eq!(response.status(), StatusCode::OK);
            prop_assert!(header(&response, "ratelimit").is_none());
            continue;
        }
        let want = reference(&Key::Ip(ip), cost);
        let status = if want.allowed() || shadow {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        prop_assert_eq!(response.status(), status);
        let reset = ceil_secs(want.reset_after()).to_string();
        prop_assert_eq!(
            header(&response, "x-ratelimit-limit"),
            Some(&*want.limit().to_string())
        );
        prop_assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            Some(&*want.remaining().to_string())
        );
        prop_assert_eq!(header(&response, "x-ratelimit-reset"), Some(&*reset));
        let current = header(&response, "ratelimit").unwrap();
        let suffix = format!(";r={};t={reset}", want.remaining());
        prop_assert!(current.ends_with(&suffix), "{} vs {}", current, suffix);
        if want.allowed() || shadow {
            prop_assert!(header(&response, "retry-after").is_none());
        } else {
            let retry = ceil_secs(want.retry_after()).max(1).to_string();
            prop_assert_eq!(header(&response, "retry-after"), Some(&*retry));
        }
    }
    Ok(())
}

fn single<A: Algorithm>(rule: A, run: Run, steps: &[Step]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let backend = KeyedLimiter::<Key, A, _>::with_clock(rule, clock.clone()).unwrap();
    let reference = KeyedLimiter::<Key, A, _>::with_clock(rule, clock.clone()).unwrap();
    agree(
        &clock,
        backend,
        |key, cost| reference.check_n(key, cost).unwrap(),
        run,
        steps,
    )
}

fn multi<A: Algorithm>(rules: [A; 2], run: Run, steps: &[Step]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let backend = MultiLimiter::<Key, A, _>::with_clock(rules, clock.clone()).unwrap();
    let reference = MultiLimiter::<Key, A, _>::with_clock(rules, clock.clone()).unwrap();
    agree(
        &clock,
        backend,
        |key, cost| reference.check_n(key, cost).unwrap(),
        run,
        steps,
    )
}

fn quota(limit: u64, window_ms: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_layer_admits_what_the_limiter_decides(
        algorithm in 0u8..3,
        limit in 3u64..8,
        window_ms in prop::sample::select(vec![100u64, 1_000, 2_500]),
        burst in prop::option::of(3u64..10),
        cost in 1u64..3,
        shadow in prop::bool::weighted(0.2),
        steps in steps(),
    ) {
        let q = quota(limit, window_ms);
        let run = Run { cost, shadow };
        match algorithm {
            0 => single(Gcra::new(burst.map_or(q, |b| q.with_burst(b).unwrap())).unwrap(), run, &steps)?,
            1 => single(FixedWindow::new(q).unwrap(), run, &steps)?,
            _ => single(SlidingWindow::new(q).unwrap(), run, &steps)?,
        }
    }

    #[test]
    fn several_quotas_admit_what_the_multi_limiter_decides(
        fast in 3u64..6,
        slow in 4u64..12,
        sliding in any::<bool>(),
        cost in 1u64..3,
        shadow in prop::bool::weighted(0.2),
        steps in steps(),
    ) {
        let run = Run { cost, shadow };
        if sliding {
            multi([SlidingWindow::new(quota(fast, 500)).unwrap(), SlidingWindow::new(quota(slow, 5_000)).unwrap()], run, &steps)?;
        } else {
            multi([Gcra::new(quota(fast, 500)).unwrap(), Gcra::new(quota(slow, 5_000)).unwrap()], run, &steps)?;
        }
    }

    /// Whatever the forwarding headers hold, from a trusted peer: no panic, and an IP key or
    /// none (a hop that is not an address leaves the client unknown: the missing-key answer).
    #[test]
    fn forwarding_headers_never_panic(
        xff in prop::collection::vec(any::<u8>(), 0..80),
        forwarded in "[ -~]{0,80}",
        texts in prop::collection::vec(
            prop::sample::select(vec!["1.2.3.4", "10.0.0.1", "[::1]:80", "::ffff:10.0.0.9", "for=", "\"", ";", ",", "unknown", "2001:db8::1"]),
            0..8,
        ),
        which in any::<bool>(),
    ) {
        let keys = Arc::new(Mutex::new(Vec::new()));
        let layer = RateLimitLayer::builder()
            .default_policy(Policy::new("p", Recorder(keys.clone())))
            .trusted_proxies(["127.0.0.0/8".parse().unwrap(), "10.0.0.0/8".parse().unwrap()])
            .proxy_header(if which { tollgate::tower::ProxyHeader::Forwarded } else { tollgate::tower::ProxyHeader::XForwardedFor })
            .build()
            .unwrap();
        let mut svc = layer.layer(Ok200);
        let rt = runtime();
        let mut req = request("/", Some(IpAddr::from([127, 0, 0, 1])), &[]);
        let joined = texts.join("");
        for (name, bytes) in [("x-forwarded-for", &xff[..]), ("forwarded", forwarded.as_bytes()), ("x-forwarded-for", joined.as_bytes()), ("forwarded", joined.as_bytes())] {
            if let Ok(value) = HeaderValue::from_bytes(bytes) {
                req.headers_mut().append(name, value);
            }
        }
        let response = call(&rt, &mut svc, req);
        let keys = keys.lock().unwrap();
        match keys.first() {
            // The peer is known: a forwarding header that names no client is the client's.
            None => prop_assert_eq!(response.status(), StatusCode::BAD_REQUEST),
            Some(key) => {
                prop_assert_eq!(response.status(), StatusCode::OK);
                prop_assert_eq!(keys.len(), 1);
                prop_assert!(matches!(key, Key::Ip(_)));
            }
        }
    }
}

/// A backend that records the keys it is asked about and admits everything: a backend of
/// one's own through the one trait.
struct Recorder(Arc<Mutex<Vec<Key>>>);

impl CheckBackend for Recorder {
    fn check<'a>(&'a self, key: &'a Key, _cost: u64) -> CheckFuture<'a> {
        self.0.lock().unwrap().push(key.clone());
        let limiter =
            KeyedLimiter::<Key, Gcra>::new(Gcra::new(Quota::per_second(1).unwrap()).unwrap());
        CheckFuture::boxed(async move {
            Ok(Verdict {
                decision: limiter.check(&Key::from("x")).unwrap(),
                quota: 0,
            })
        })
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, _: usize) -> Option<QuotaInfo> {
        None
    }
}

#[test]
fn a_request_without_a_peer_address_gets_the_configured_outcome() {
    let policy = Policy::new(
        "p",
        KeyedLimiter::<Key, Gcra>::new(Gcra::new(Quota::per_second(1).unwrap()).unwrap()),
    );
    let rt = runtime();
    let mut svc = RateLimitLayer::builder()
        .default_policy(policy.clone())
        .build()
        .unwrap()
        .layer(Ok200);
    let response = call(&rt, &mut svc, request("/", None, &[]));
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(header(&response, "cache-control"), Some("no-store"));
    // The body names what the server must do.
    let body = rt.block_on(async {
        use http_body_util::BodyExt;
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    });
    assert!(
        body.contains("into_make_service_with_connect_info"),
        "{body}"
    );
    // A gRPC call is a POST of `application/grpc`: its refusal is a gRPC status. A GET of
    // that content type is no gRPC call, and gets the plain HTTP refusal.
    let grpc = |method: http::Method| {
        let mut grpc = request("/", None, &[]);
        *grpc.method_mut() = method;
        grpc.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        grpc
    };
    let response = call(&rt, &mut svc, grpc(http::Method::POST));
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "grpc-status"), Some("13"));
    assert_eq!(header(&response, "cache-control"), Some("no-store"));
    let response = call(&rt, &mut svc, grpc(http::Method::GET));
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(header(&response, "grpc-status"), None);
}

/// A policy's own missing-key answer overrides the layer's for that policy only: an
/// optional-header policy lets requests without the header pass, while an IP-keyed policy
/// still refuses a request without a peer address.
#[test]
fn the_missing_key_answer_is_per_policy() {
    use tollgate::tower::{Fallback, KeySource};
    let limiter =
        || KeyedLimiter::<Key, Gcra>::new(Gcra::new(Quota::per_hour(1).unwrap()).unwrap());
    let api_key = http::HeaderName::from_static("x-api-key");
    let rt = runtime();
    let mut svc = RateLimitLayer::builder()
        .policy(
            Policy::new("users", limiter())
                .path_prefix("/users")
                .key(KeySource::header(api_key))
                .on_missing_key(Fallback::Allow),
        )
        .default_policy(Policy::new("site", limiter()))
        .build()
        .unwrap()
        .layer(Ok200);
    let peer = Some(IpAddr::from([192, 0, 2, 1]));
    for _ in 0..3 {
        let anonymous = call(&rt, &mut svc, request("/users/x", peer, &[]));
        assert_eq!(anonymous.status(), StatusCode::OK);
    }
    let no_peer = call(&rt, &mut svc, request("/other", None, &[]));
    assert_eq!(no_peer.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// A header key longer than the bound is counted under its digest (fixed size, one per
/// value), or refused when so configured; short keys are untouched.
#[test]
fn long_keys_are_digested_or_refused() {
    use tollgate::tower::{KeySource, LongKey, Outcome};
    let keys = Arc::new(Mutex::new(Vec::new()));
    let api_key = http::HeaderName::from_static("x-api-key");
    let builder = || {
        RateLimitLayer::builder().default_policy(
            Policy::new("p", Recorder(keys.clone())).key(KeySource::header(api_key.clone())),
        )
    };
    let rt = runtime();
    let mut svc = builder().max_key_len(64).build().unwrap().layer(Ok200);
    let peer = Some(IpAddr::from([192, 0, 2, 1]));
    let long_a = "a".repeat(10_000);
    let long_b = format!("{}b", "a".repeat(9_999));
    let short = "k".repeat(64);
    for value in [&long_a, &long_b, &long_a, &short] {
        let response = call(&rt, &mut svc, request("/", peer, &[("x-api-key", value)]));
        assert_eq!(response.status(), StatusCode::OK);
    }
    let seen = keys.lock().unwrap().clone();
    let Key::Bytes(digest) = &seen[0] else {
        panic!("a long key is digested: {:?}", seen[0]);
    };
    assert_eq!(digest.len(), 8 + 32, "\\0sha256: and 32 hex digits");
    assert!(digest.starts_with(b"\0sha256:"));
    assert_ne!(seen[0], seen[1], "two long values, two keys");
    assert_eq!(seen[0], seen[2], "one long value, one key");
    assert_eq!(
        seen[3],
        Key::from(short.as_str()),
        "a key at the bound is kept"
    );
    // Refused: a 431, uncounted.
    let layer = builder()
        .on_long_key(LongKey::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE))
        .build()
        .unwrap();
    let (parts, _) = request("/", peer, &[("x-api-key", &long_a)]).into_parts();
    let evaluation = rt.block_on(layer.evaluate(&parts, None));
    assert_eq!(evaluation.outcome, Outcome::KeyTooLong);
    assert!(!evaluation.passes);
    let mut svc = layer.layer(Ok200);
    let before = keys.lock().unwrap().len();
    let response = call(&rt, &mut svc, request("/", peer, &[("x-api-key", &long_a)]));
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(
        keys.lock().unwrap().len(),
        before,
        "a refused key is never checked"
    );
    assert!(RateLimitLayer::builder()
        .on_long_key(LongKey::Reject(StatusCode::OK))
        .build()
        .is_err());
}

#[test]
fn invalid_configurations_are_refused() {
    let policy = |name: &str| {
        Policy::new(
            name,
            KeyedLimiter::<Key, Gcra>::new(Gcra::new(Quota::per_second(1).unwrap()).unwrap()),
        )
    };
    for prefix in [0, 31, 65, 128, 129] {
        assert!(RateLimitLayer::builder()
            .ipv6_prefix(prefix)
            .build()
            .is_err());
    }
    for prefix in [32, 48, 56, 64] {
        assert!(RateLimitLayer::builder()
            .ipv6_prefix(prefix)
            .build()
            .is_ok());
    }
    assert!(RateLimitLayer::builder()
        .policy(policy(""))
        .build()
        .is_err());
    assert!(RateLimitLayer::builder()
        .policy(policy("a\nb"))
        .build()
        .is_err());
    assert!(RateLimitLayer::builder()
        .on_missing_key(tollgate::tower::Fallback::Reject(StatusCode::OK))
        .build()
        .is_err());
    assert!(RateLimitLayer::builder()
        .policy(policy("ok \"quoted\""))
        .build()
        .is_ok());
}

/// A full key table's answer is its own (`on_table_full`, default 503), and a shadow policy
/// passes such a request.
#[test]
fn a_full_table_gets_the_configured_outcome_and_shadow_passes() {
    use tollgate::tower::Fallback;
    use tollgate::OverflowPolicy;
    let full_after_one = || {
        KeyedLimiter::<Key, _>::builder(Gcra::new(Quota::per_second(1).unwrap()).unwrap())
            .max_keys(1, OverflowPolicy::Deny)
            .build()
            .unwrap()
    };
    let rt = runtime();
    let one = Some(IpAddr::from([192, 0, 2, 1]));
    let two = Some(IpAddr::from([192, 0, 2, 2]));
    for (fallback, mode, want) in [
        (None, Mode::Enforce, StatusCode::SERVICE_UNAVAILABLE),
        (
            Some(Fallback::Reject(StatusCode::INTERNAL_SERVER_ERROR)),
            Mode::Enforce,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (Some(Fallback::Allow), Mode::Enforce, StatusCode::OK),
        (None, Mode::Shadow, StatusCode::OK),
    ] {
        let mut builder =
            RateLimitLayer::builder().default_policy(Policy::new("p", full_after_one()).mode(mode));
        if let Some(fallback) = fallback {
            builder = builder.on_table_full(fallback);
        }
        let mut svc = builder.build().unwrap().layer(Ok200);
        assert_eq!(
            call(&rt, &mut svc, request("/", one, &[])).status(),
            StatusCode::OK
        );
        // A second key does not fit: the limiter answers KeyTableFull.
        let response = call(&rt, &mut svc, request("/", two, &[]));
        assert_eq!(response.status(), want, "{fallback:?} {mode:?}");
        assert!(header(&response, "ratelimit").is_none());
    }
}

#[test]
fn the_policy_field_follows_a_quota_changed_at_run_time() {
    let clock = ManualClock::new();
    let limiter = Arc::new(
        KeyedLimiter::<Key, Gcra, _>::with_clock(Gcra::new(quota(5, 1_000)).unwrap(), clock)
            .unwrap(),
    );
    let mut svc = RateLimitLayer::builder()
        .default_policy(Policy::new("p", Arc::clone(&limiter)))
        .build()
        .unwrap()
        .layer(Ok200);
    let rt = runtime();
    let ip = Some(IpAddr::from([192, 0, 2, 1]));
    for _ in 0..2 {
        let response = call(&rt, &mut svc, request("/", ip, &[]));
        assert_eq!(header(&response, "ratelimit-policy"), Some("\"p\";q=5;w=1"));
    }
    limiter
        .set_quota(Gcra::new(quota(7, 2_000)).unwrap())
        .unwrap();
    let response = call(&rt, &mut svc, request("/", ip, &[]));
    assert_eq!(header(&response, "ratelimit-policy"), Some("\"p\";q=7;w=2"));
}
