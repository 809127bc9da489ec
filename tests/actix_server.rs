//! The actix-web example (`examples/actix_server.rs`) and the axum example
//! (`examples/server.rs`), both limited from `examples/policies.toml` and served on
//! 127.0.0.1:0, get the same requests from a real HTTP client and must give the same answers:
//! statuses, rate-limit fields, problem+json bodies. Limiters run on a `ManualClock` (one per
//! server): nothing refills during the test, so no answer depends on timing.
//!
//! Run with `cargo test --features actix,serde,tokio,metrics --test actix_server`.

#![cfg(all(
    feature = "actix",
    feature = "axum",
    feature = "serde",
    feature = "tokio",
    feature = "metrics"
))]

#[allow(dead_code)]
#[path = "../examples/actix_server.rs"]
mod actix_example;
#[allow(dead_code)]
#[path = "../examples/server.rs"]
mod axum_example;
#[path = "support/tower.rs"]
mod tower_support;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpServer};
use http::{Method, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::tower::config::LayerConfig;
use tollgate::tower::{Policy, RateLimitLayer};
use tower_support::{client, fetch, serve, Http};

/// The fields compared (besides the status and the body).
const FIELDS: [&str; 8] = [
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "content-type",
    "cache-control",
];

/// What a response is compared by: its status, the [`FIELDS`] it has, and its body.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    fields: Vec<(&'static str, String)>,
    body: String,
}

/// One request of a sequence: its method, path and header fields.
type Step<'a> = (Method, &'a str, &'a [(&'a str, &'a str)]);

async fn send(
    http: &Http,
    addr: SocketAddr,
    method: &Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let reply = fetch(http, addr, method.clone(), path, headers).await;
    let fields = FIELDS
        .iter()
        .filter_map(|name| Some((*name, reply.header(name)?.to_owned())))
        .collect();
    Answer {
        status: reply.status,
        fields,
        body: reply.body,
    }
}

/// The layer `examples/policies.toml` describes, on a clock of its own that never moves.
fn example_layer() -> RateLimitLayer {
    let config: LayerConfig =
        toml::from_str(include_str!("../examples/policies.toml")).expect("the file parses");
    config
        .builder_with_clock(ManualClock::new())
        .expect("valid policies")
        .build()
        .expect("a valid layer")
}

fn prometheus() -> metrics_exporter_prometheus::PrometheusHandle {
    // A recorder of its own (not installed globally), as in tests/example_server.rs.
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle()
}

/// Serves the `App`s `$factory` makes on 127.0.0.1:0, one worker, on an actix-web system of
/// its own thread (which ends with the test process): the server's address. (A macro: the
/// bounds `HttpServer::new` puts on an `App` factory are not worth spelling out.)
macro_rules! serve_actix {
    ($factory:expr) => {{
        let factory = $factory;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = HttpServer::new(factory)
                    .workers(1)
                    .disable_signals()
                    .bind(("127.0.0.1", 0))
                    .expect("binds a loopback port");
                tx.send(server.addrs()[0]).expect("the test waits");
                server.run().await.expect("serves");
            });
        });
        rx.recv().expect("the server started")
    }};
}

const BEHIND: &[(&str, &str)] = &[("x-forwarded-for", "203.0.113.5")];
const UNKNOWN: &[(&str, &str)] = &[("x-forwarded-for", "unknown")];
const PRO: &[(&str, &str)] = &[("x-api-key", "pro-key-1")];
const FREE: &[(&str, &str)] = &[("x-api-key", "free-key-1")];

/// The requests both servers answer (in this order).
fn example_steps() -> Vec<Step<'static>> {
    let get = Method::GET;
    let mut steps: Vec<Step<'static>> = Vec::new();
    // /api/: a burst of 20, then an export (cost 5) refused; a client behind the trusted
    // proxy (127.0.0.1, the test's own address) has a bucket of its own; a hop that is no
    // address leaves the client unknown.
    steps.extend((0..20).map(|_| (get.clone(), "/api/hello", &[][..])));
    steps.push((get.clone(), "/api/export", &[]));
    steps.push((get.clone(), "/api/export", BEHIND));
    steps.push((get.clone(), "/api/hello", UNKNOWN));
    steps.push((get.clone(), "/api/no-such-route", BEHIND));
    // Shadow: decided and reported, never refused.
    steps.extend((0..4).map(|_| (get.clone(), "/beta/feature", &[][..])));
    // /partner/: no key, then a pro key and a free key (two quotas).
    steps.push((get.clone(), "/partner/orders", &[]));
    steps.push((get.clone(), "/partner/orders", PRO));
    steps.push((get.clone(), "/partner/orders", FREE));
    steps.push((get.clone(), "/partner/orders", FREE));
    // Never limited; the delay policy within its burst (the waiting path).
    steps.extend((0..3).map(|_| (get.clone(), "/health", &[][..])));
    steps.push((Method::POST, "/upload", &[]));
    steps.push((Method::POST, "/upload", &[]));
    steps.push((get, "/health/../api/hello", BEHIND));
    steps
}

/// [`example_steps`] sent to an axum server and an actix-web server of `layer()`'s policies:
/// the answers (the same from both, or a failed assertion).
async fn compare(layer: fn() -> RateLimitLayer) -> (Vec<Answer>, SocketAddr, SocketAddr) {
    let axum = serve(axum_example::app(layer(), prometheus())).await;
    let actix_layer = layer();
    let scrapes = actix_example::scrape_limit();
    let handle = prometheus();
    let actix = serve_actix!(move || actix_example::app(
        actix_layer.clone(),
        scrapes.clone(),
        handle.clone()
    ));
    let http = client();
    let mut answers = Vec::new();
    for (i, (method, path, headers)) in example_steps().iter().enumerate() {
        let from_axum = send(&http, axum, method, path, headers).await;
        let from_actix = send(&http, actix, method, path, headers).await;
        assert_eq!(
            from_actix, from_axum,
            "step {i}: {method} {path} {headers:?}"
        );
        answers.push(from_actix);
    }
    (answers, axum, actix)
}

#[tokio::test]
async fn the_actix_server_answers_as_the_axum_server_from_the_same_file() {
    let (answers, axum, actix) = compare(example_layer).await;
    let http = client();
    let get = Method::GET;
    // The answers compared are the ones the file promises (not two servers failing alike).
    let status = |i: usize| answers[i].status;
    assert!((0..20).all(|i| status(i) == StatusCode::OK));
    assert_eq!(answers[19].body, "hello\n");
    let denial = &answers[20];
    assert_eq!(denial.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(denial.body.contains("\"status\":429"), "{}", denial.body);
    assert!(denial.fields.contains(&("retry-after", "1".to_owned())));
    assert!(denial
        .fields
        .contains(&("content-type", "application/problem+json".to_owned())));
    assert_eq!(status(21), StatusCode::OK);
    assert_eq!(status(22), StatusCode::BAD_REQUEST);
    assert_eq!(status(23), StatusCode::NOT_FOUND);
    assert!((24..28).all(|i| status(i) == StatusCode::OK));
    assert!(answers[27].fields.iter().any(|(n, _)| *n == "ratelimit"));
    assert_eq!(status(28), StatusCode::BAD_REQUEST);
    assert!(answers[29].fields[0].1.starts_with("\"partner-3\";r=999;"));
    assert!((30..32).all(|i| status(i) == StatusCode::OK));
    assert!(
        !answers[32]
            .fields
            .iter()
            .any(|(n, _)| n.contains("ratelimit")),
        "/health: never limited"
    );
    assert_eq!(
        (status(35), answers[35].body.as_str()),
        (StatusCode::OK, "stored\n")
    );

    // /metrics: a limit of its own on both (a burst of 10); the bodies are each recorder's.
    for i in 0..12 {
        let from_axum = send(&http, axum, &get, "/metrics", &[]).await;
        let from_actix = send(&http, actix, &get, "/metrics", &[]).await;
        assert_eq!(
            (from_actix.status, &from_actix.fields[..0]),
            (from_axum.status, &from_axum.fields[..0]),
            "scrape {i}"
        );
        let limit: Vec<_> = (from_actix.fields.iter())
            .filter(|(n, _)| n.contains("ratelimit") || *n == "retry-after")
            .collect();
        let axum_limit: Vec<_> = (from_axum.fields.iter())
            .filter(|(n, _)| n.contains("ratelimit") || *n == "retry-after")
            .collect();
        assert_eq!(limit, axum_limit, "scrape {i}");
        assert_eq!(
            from_actix.status,
            if i < 10 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            }
        );
    }
}

/// What a held handler shares with the test: it says when it is entered, and answers once
/// released.
#[derive(Clone)]
struct Held {
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Held {
    fn new() -> (Self, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let (entered, rx) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        (Held { entered, release }, rx)
    }

    async fn hold(&self) -> &'static str {
        let _ = self.entered.send(());
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
        "an export\n"
    }
}

/// The first request for /export from `addr` (held in its handler), a second one while it is
/// in flight, then the first's answer once released.
async fn in_flight_answers(
    http: &Http,
    addr: SocketAddr,
    held: &Held,
    entered: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> (Answer, Answer) {
    let first = tokio::spawn({
        let http = http.clone();
        async move { send(&http, addr, &Method::GET, "/export", &[]).await }
    });
    entered
        .recv()
        .await
        .expect("the first request reaches its handler");
    let second = send(http, addr, &Method::GET, "/export", &[]).await;
    held.release.add_permits(1);
    (first.await.expect("the first request ends"), second)
}

#[tokio::test]
async fn in_flight_bounds_answer_alike() {
    // One export at a time per client: the second, while the first runs, is refused.
    let layer = || {
        RateLimitLayer::builder()
            .policy(Policy::in_flight("exports", 1).path_prefix("/export"))
            .build()
            .expect("a valid layer")
    };
    let (axum_held, mut axum_entered) = Held::new();
    let held = axum_held.clone();
    let axum_app = axum::Router::new()
        .route(
            "/export",
            axum::routing::get(move || {
                let held = held.clone();
                async move { held.hold().await }
            }),
        )
        .layer(layer());
    let axum = serve(axum_app).await;
    let (actix_held, mut actix_entered) = Held::new();
    let (limit, held) = (layer(), actix_held.clone());
    let actix = serve_actix!(move || {
        let held = held.clone();
        App::new()
            .wrap(tollgate::actix::RateLimit::new(limit.clone()))
            .route(
                "/export",
                web::get().to(move || {
                    let held = held.clone();
                    async move { held.hold().await }
                }),
            )
    });
    let http = client();
    let from_axum = in_flight_answers(&http, axum, &axum_held, &mut axum_entered).await;
    let from_actix = in_flight_answers(&http, actix, &actix_held, &mut actix_entered).await;
    assert_eq!(from_actix, from_axum);
    let (first, second) = from_actix;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::OK, "an export\n")
    );
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS, "{second:?}");
    assert!(second.body.contains("in flight"), "{}", second.body);
}

/// `examples/policies.toml` without its allow-listed path and its cost by path (closures: with
/// them the middleware copies every header field): the middleware then copies only the fields
/// the policies read (the forwarding header, `x-api-key`, `content-type`), and the answers
/// stay the same.
#[tokio::test]
async fn copying_only_the_fields_the_policies_read_keeps_the_answers() {
    fn layer() -> RateLimitLayer {
        let text = include_str!("../examples/policies.toml")
            .replace("allow_paths", "# ")
            .replace("cost_by_path", "# ");
        let config: LayerConfig = toml::from_str(&text).expect("the file parses");
        config
            .builder_with_clock(ManualClock::new())
            .expect("valid policies")
            .build()
            .expect("a valid layer")
    }
    let (answers, _, _) = compare(layer).await;
    let status = |i: usize| answers[i].status;
    assert_eq!(status(20), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        status(21),
        StatusCode::OK,
        "behind the proxy: a bucket of its own"
    );
    assert_eq!(status(22), StatusCode::BAD_REQUEST, "an unknown hop");
    assert_eq!(status(28), StatusCode::BAD_REQUEST, "no x-api-key");
    assert!(answers[29].fields[0].1.starts_with("\"partner-3\";r=999;"));
}
