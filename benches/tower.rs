//! The tower layer's own cost per request (the criterion part of its benches): what
//! `RateLimitLayer` adds to a request on top of the service it wraps, against tower-governor
//! (the peer to compare against) with the same quota and the same key.
//!
//! ```text
//! cargo bench --features axum,metrics --bench tower          # every row (about 1 minute)
//! cargo bench --features axum --bench tower                  # without `metrics` compiled in
//! ```
//!
//! Each iteration builds a fresh `Request<()>` (a static URI, cloned: a reference count; a
//! `ConnectInfo<SocketAddr>` extension, as axum's `into_make_service_with_connect_info` inserts
//! on every request: one small allocation for the extension map), calls the service once, polls
//! the returned future once with a no-op waker (every inner response is ready at once: no
//! runtime, no network) and drops the response. So `no_layer` is the floor every row pays: the
//! request, the inner service (an empty `axum::body::Body` response) and the drop; a row's
//! overhead is its figure minus `no_layer`'s.
//!
//! Keys: the peer IP (tollgate `KeySource::peer_ip()`, tower-governor `PeerIpKeyExtractor`),
//! drawn from 10 000 distinct IPv4 addresses in a pre-generated random order, so neither
//! library sees one warm key. Quotas (GCRA on both sides, one per group, the same for every
//! subject): `allow` = 1000/s, burst 1000 (a client comes back at most a few hundred times a
//! second here, so every request is allowed: the path most requests take); `deny` = 1/s, burst
//! 1 (a client's unit comes back once a second: at ~1M requests/s over 10k clients about 1 %
//! of requests are allowed, more right after a pause; tollgate's 429 with its
//! problem+json body and `Retry-After`, tower-governor's 429 with its text body); `proxied` =
//! `allow`'s quota with the load test's traffic: every request from the proxy 127.0.0.1 with
//! its client in `X-Forwarded-For` (tollgate `KeySource::client_ip()` behind that trusted
//! proxy, tower-governor `SmartIpKeyExtractor`; rows `no_layer`, `tollgate`,
//! `tollgate_no_headers`, `tollgate_both_headers`, `tower_governor`). Each subject
//! gets a fresh limiter. After its samples each subject serves 100 000 more requests and the
//! bench prints the share it allowed (and panics if the share does not fit the group, a guard
//! against a row measuring another path than it names); not under `cargo test --benches`.
//!
//! Subjects: `no_layer`; `tollgate` (default header style, the draft's `RateLimit-Policy` and
//! `RateLimit`); `tollgate_no_headers` (`HeaderStyle::None`); `tollgate_metrics` (only with
//! feature `metrics`: default headers, every request counted in metrics-util's
//! `DebuggingRecorder`, a real registry of atomic counters, installed as the thread's local
//! recorder for the row); `tower_governor` (0.8, `GovernorLayer`, no headers, its default);
//! `tower_governor_headers` (its `use_headers()`: `x-ratelimit-*` on every response). With
//! feature `metrics` compiled in, the rows other than `tollgate_metrics` count into the
//! `metrics` facade's no-op recorder (none is installed).
//!
//! Figures and the goals (≤ 1 µs per request, faster than tower-governor, with and without
//! metrics): `benches/README.md`, "tower layer".

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Uri};
use tollgate::tower::HeaderStyle;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::SmartIpKeyExtractor;
use tower_governor::GovernorLayer;
use tower_layer::Layer;
use tower_service::Service;

#[path = "support/clients.rs"]
mod clients;
use clients::{peers, poll_once, tollgate_layer, NoopWake, SEQUENCE};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Requests served after a row's samples to judge its share of allowed requests.
const GUARD_REQUESTS: usize = 100_000;

/// A quota of `limit` per second, bursts of `limit`, in both libraries' terms.
#[derive(Clone, Copy)]
struct Group {
    name: &'static str,
    per_second: u32,
    /// The share of allowed requests a subject must show.
    plausible: fn(f64) -> bool,
    /// Requests come from a reverse proxy on 127.0.0.1 naming the client in
    /// `X-Forwarded-For` (as in the load test): tollgate keys by the client IP behind the
    /// trusted proxy, tower-governor by its `SmartIpKeyExtractor`.
    proxied: bool,
}

const GROUPS: [Group; 3] = [
    Group {
        name: "allow",
        per_second: 1000,
        plausible: |share| share > 0.99,
        proxied: false,
    },
    Group {
        name: "deny",
        per_second: 1,
        plausible: |share| share < 0.2,
        proxied: false,
    },
    Group {
        name: "proxied",
        per_second: 1000,
        plausible: |share| share > 0.99,
        proxied: true,
    },
];

/// The inner service: answers at once with an empty 200.
#[derive(Clone, Copy)]
struct Inner;

impl Service<Request<()>> for Inner {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

/// Serves requests from the peers in turn: one fresh request each, the future polled once.
struct Driver<'a> {
    peers: &'a [SocketAddr],
    /// For a proxied group, each peer's address as an `X-Forwarded-For` value.
    forwarded: Option<Vec<HeaderValue>>,
    next: usize,
    uri: Uri,
    cx: Context<'static>,
}

impl<'a> Driver<'a> {
    fn new(peers: &'a [SocketAddr], waker: &'static Waker, proxied: bool) -> Self {
        let forwarded = proxied.then(|| {
            peers
                .iter()
                .map(|peer| HeaderValue::from_str(&peer.ip().to_string()).expect("an address"))
                .collect()
        });
        Driver {
            peers,
            forwarded,
            next: 0,
            uri: Uri::from_static("/api/hello"),
            cx: Context::from_waker(waker),
        }
    }

    /// One request through `service`: its status. (Never inlined: a profile counts this
    /// function alone, e.g. `valgrind --tool=callgrind --toggle-collect='*Driver*serve*'`.)
    #[inline(never)]
    fn serve<S, B>(&mut self, service: &mut S) -> StatusCode
    where
        S: Service<Request<()>, Response = Response<B>>,
        S::Error: std::fmt::Debug,
    {
        let (mut peer, at) = (self.peers[self.next], self.next);
        self.next = (self.next + 1) & (SEQUENCE - 1);
        let mut request = Request::new(());
        *request.uri_mut() = self.uri.clone();
        if let Some(forwarded) = &self.forwarded {
            // (A clone of a shared value: a reference count.)
            request
                .headers_mut()
                .insert(&X_FORWARDED_FOR, forwarded[at].clone());
            peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 40_000));
        }
        request.extensions_mut().insert(ConnectInfo(peer));
        let ready = service.poll_ready(&mut self.cx);
        debug_assert!(ready.is_ready());
        poll_once(service.call(request), &mut self.cx)
            .expect("the inner service never fails")
            .status()
    }
}

/// tower-governor's config for the same GCRA quota: one cell every `1/per_second` s, bursts of
/// `per_second`.
macro_rules! governor_config {
    ($per_second:expr $(, $option:ident $(($argument:expr))?)*) => {{
        let per_second: u32 = $per_second;
        let mut builder = GovernorConfigBuilder::default();
        builder
            .period(Duration::from_nanos(1_000_000_000 / u64::from(per_second)))
            .burst_size(per_second);
        builder$(.$option($($argument)?))*.finish().expect("a valid governor config")
    }};
}

/// Times `service` in the group, then judges its share of allowed requests. False when a
/// filter skipped the row.
fn row<S, B>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    spec: Group,
    name: &str,
    driver: &mut Driver<'_>,
    mut service: S,
) -> bool
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut timed = false;
    group.bench_function(name, |b| {
        timed = true;
        b.iter(|| black_box(driver.serve(&mut service)));
    });
    // Only for a row criterion timed (not one a filter skipped), and not under `cargo test
    // --benches` (no `--bench`), where criterion runs each row once: one request says nothing
    // about a share, and 100 000 debug-build requests a row would only slow the tests down.
    if !timed || !std::env::args().any(|arg| arg == "--bench") {
        return timed;
    }
    let allowed = (0..GUARD_REQUESTS)
        .filter(|_| driver.serve(&mut service) == StatusCode::OK)
        .count();
    let share = allowed as f64 / GUARD_REQUESTS as f64;
    println!(
        "tower/{}/{name}: {:.1} % of {GUARD_REQUESTS} requests allowed after the samples",
        spec.name,
        share * 100.0
    );
    if name != "no_layer" {
        assert!(
            (spec.plausible)(share),
            "tower/{}/{name}: a share of {share} allowed does not fit the group",
            spec.name
        );
    }
    true
}

fn bench_all(c: &mut Criterion) {
    let peers = peers();
    let waker: &'static Waker = Box::leak(Box::new(Waker::from(Arc::new(NoopWake))));
    for spec in GROUPS {
        let mut group = c.benchmark_group(format!("tower/{}", spec.name));
        group
            .warm_up_time(Duration::from_millis(800))
            .measurement_time(Duration::from_secs(3))
            .sample_size(30)
            .throughput(Throughput::Elements(1));
        let mut driver = Driver::new(&peers, waker, spec.proxied);
        let per_second = spec.per_second;
        row(&mut group, spec, "no_layer", &mut driver, Inner);
        row(
            &mut group,
            spec,
            "tollgate",
            &mut driver,
            tollgate_layer(spec.per_second, spec.proxied, HeaderStyle::default()).layer(Inner),
        );
        row(
            &mut group,
            spec,
            "tollgate_no_headers",
            &mut driver,
            tollgate_layer(spec.per_second, spec.proxied, HeaderStyle::None).layer(Inner),
        );
        if spec.proxied {
            row(
                &mut group,
                spec,
                "tollgate_both_headers",
                &mut driver,
                tollgate_layer(spec.per_second, spec.proxied, HeaderStyle::Both).layer(Inner),
            );
            row(
                &mut group,
                spec,
                "tower_governor",
                &mut driver,
                GovernorLayer::new(governor_config!(
                    per_second,
                    key_extractor(SmartIpKeyExtractor)
                ))
                .layer(Inner),
            );
            group.finish();
            continue;
        }
        #[cfg(feature = "metrics")]
        {
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            let timed = metrics::with_local_recorder(&recorder, || {
                row(
                    &mut group,
                    spec,
                    "tollgate_metrics",
                    &mut driver,
                    tollgate_layer(spec.per_second, spec.proxied, HeaderStyle::default())
                        .layer(Inner),
                )
            });
            let counted: u64 = snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter_map(|(_, _, _, value)| match value {
                    metrics_util::debugging::DebugValue::Counter(n) => Some(n),
                    _ => None,
                })
                .sum();
            assert!(
                !timed || counted > 0,
                "the recorder counted the row's requests"
            );
        }
        row(
            &mut group,
            spec,
            "tower_governor",
            &mut driver,
            GovernorLayer::new(governor_config!(per_second)).layer(Inner),
        );
        row(
            &mut group,
            spec,
            "tower_governor_headers",
            &mut driver,
            GovernorLayer::new(governor_config!(per_second, use_headers)).layer(Inner),
        );
        group.finish();
    }
}

criterion_group!(benches, bench_all);
criterion_main!(benches);
