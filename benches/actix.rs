//! The actix-web middleware's cost per request: what `tollgate::actix::RateLimit` adds to a
//! request on top of the `App` it wraps, against actix-governor (the middleware actix-web
//! users have) with the same quota and the same key, in one run.
//!
//! ```text
//! cargo bench --features actix --bench actix          # every row (about 1 minute)
//! ```
//!
//! Each iteration builds a fresh request for `GET /api/hello` from one of 10 000
//! peer addresses (`actix_web::test::TestRequest`, its `peer_addr`), calls the service made by
//! `actix_web::test::init_service` once, polls the returned future once with a no-op waker
//! (every answer here is ready at once: no network) and drops the response. `no_middleware`
//! is the floor every row pays (the request, the `App`'s routing, the handler's empty 200 and
//! the drop); a row's overhead is its figure minus `no_middleware`'s.
//!
//! Keys: the peer IP (tollgate `KeySource::peer_ip()`, actix-governor's default
//! `PeerIpKeyExtractor`), 10 000 distinct IPv4 addresses in a pre-generated random order.
//! Quotas (GCRA on both sides, the same for every subject): `allow` = 1000/s, burst 1000
//! (every request allowed); `deny` = 1/s, burst 1 (mostly denied: tollgate's 429 with its
//! problem+json body, actix-governor's 429 with its text body). After its samples each
//! subject serves 100 000 more requests and the bench prints the share it allowed (and panics
//! if it does not fit the group); not under `cargo test --benches`.
//!
//! Subjects: `no_middleware`; `tollgate` (default header style: `RateLimit-Policy`,
//! `RateLimit`); `tollgate_no_headers` (`HeaderStyle::None`); `actix_governor` (0.10, no
//! headers, its default); `actix_governor_headers` (its `use_headers()`: `x-ratelimit-*`).
//! Figures: `benches/README.md`, "actix-web middleware".

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use actix_governor::{Governor, GovernorConfigBuilder};
use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::{test, web, App, HttpResponse};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use tollgate::actix::RateLimit;
use tollgate::tower::HeaderStyle;

#[path = "support/clients.rs"]
mod clients;
use clients::{peers, poll_once, tollgate_layer, NoopWake, SEQUENCE};

/// Requests served after a row's samples to judge its share of allowed requests.
const GUARD_REQUESTS: usize = 100_000;

/// A quota of `per_second` a second, bursts of `per_second`, and the share of allowed
/// requests a subject must show.
#[derive(Clone, Copy)]
struct Group {
    name: &'static str,
    per_second: u32,
    plausible: fn(f64) -> bool,
}

const GROUPS: [Group; 2] = [
    Group {
        name: "allow",
        per_second: 1000,
        plausible: |share| share > 0.99,
    },
    Group {
        name: "deny",
        per_second: 1,
        // (Below a half: a subject whose denial is slow visits each client less often, so more
        // of its clients have their unit back: actix-governor's tens of µs.)
        plausible: |share| share < 0.5,
    },
];

/// Serves requests from the peers in turn: one fresh request each, the future polled once.
struct Driver<'a> {
    peers: &'a [SocketAddr],
    next: usize,
    cx: Context<'static>,
}

impl Driver<'_> {
    /// One request through `service`: its status. (Never inlined: a profile can count this
    /// function alone.)
    #[inline(never)]
    fn serve<S, B>(&mut self, service: &S) -> u16
    where
        S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    {
        let peer = self.peers[self.next];
        self.next = (self.next + 1) & (SEQUENCE - 1);
        let request = test::TestRequest::get()
            .uri("/api/hello")
            .peer_addr(peer)
            .to_request();
        poll_once(service.call(request), &mut self.cx)
            .expect("no row fails")
            .status()
            .as_u16()
    }
}

/// actix-governor's config for the same GCRA quota: one cell every `1/per_second` s, bursts
/// of `per_second`.
macro_rules! governor_config {
    ($per_second:expr $(, $option:ident)*) => {{
        let per_second: u32 = $per_second;
        let mut builder = GovernorConfigBuilder::default();
        builder
            .period(Duration::from_nanos(1_000_000_000 / u64::from(per_second)))
            .burst_size(per_second);
        builder$(.$option())*.finish().expect("a valid governor config")
    }};
}

/// The bench's `App` (one route, an empty 200) wrapped in `$middleware`, as a service.
macro_rules! app {
    () => {
        test::init_service(App::new().route("/api/hello", web::get().to(HttpResponse::Ok))).await
    };
    ($middleware:expr) => {
        test::init_service(
            App::new()
                .wrap($middleware)
                .route("/api/hello", web::get().to(HttpResponse::Ok)),
        )
        .await
    };
}

/// Times `service` in the group, then judges its share of allowed requests.
fn row<S, B>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    spec: Group,
    name: &str,
    driver: &mut Driver<'_>,
    service: S,
) where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let mut timed = false;
    group.bench_function(name, |b| {
        timed = true;
        b.iter(|| black_box(driver.serve(&service)));
    });
    // Only for a row criterion timed, and not under `cargo test --benches` (no `--bench`).
    if !timed || !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let allowed = (0..GUARD_REQUESTS)
        .filter(|_| driver.serve(&service) == 200)
        .count();
    let share = allowed as f64 / GUARD_REQUESTS as f64;
    println!(
        "actix/{}/{name}: {:.1} % of {GUARD_REQUESTS} requests allowed after the samples",
        spec.name,
        share * 100.0
    );
    if name != "no_middleware" {
        assert!(
            (spec.plausible)(share),
            "actix/{}/{name}: a share of {share} allowed does not fit the group",
            spec.name
        );
    }
}

fn bench_all(c: &mut Criterion) {
    let peers = peers();
    let waker: &'static Waker = Box::leak(Box::new(Waker::from(Arc::new(NoopWake))));
    // Services are made (and their futures polled) inside actix-web's runtime, as a worker
    // would.
    actix_web::rt::System::new().block_on(async {
        for spec in GROUPS {
            let mut group = c.benchmark_group(format!("actix/{}", spec.name));
            group
                .warm_up_time(Duration::from_millis(800))
                .measurement_time(Duration::from_secs(3))
                .sample_size(30)
                .throughput(Throughput::Elements(1));
            let mut driver = Driver {
                peers: &peers,
                next: 0,
                cx: Context::from_waker(waker),
            };
            let per_second = spec.per_second;
            row(&mut group, spec, "no_middleware", &mut driver, app!());
            let limit = RateLimit::new(tollgate_layer(
                spec.per_second,
                false,
                HeaderStyle::default(),
            ));
            row(&mut group, spec, "tollgate", &mut driver, app!(limit));
            let limit = RateLimit::new(tollgate_layer(spec.per_second, false, HeaderStyle::None));
            row(
                &mut group,
                spec,
                "tollgate_no_headers",
                &mut driver,
                app!(limit),
            );
            let governor = Governor::new(&governor_config!(per_second));
            row(
                &mut group,
                spec,
                "actix_governor",
                &mut driver,
                app!(governor),
            );
            let governor = Governor::new(&governor_config!(per_second, use_headers));
            let name = "actix_governor_headers";
            row(&mut group, spec, name, &mut driver, app!(governor));
            group.finish();
        }
    });
}

criterion_group!(benches, bench_all);
criterion_main!(benches);
