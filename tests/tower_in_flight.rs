//! The tower layer's `max_in_flight`: a client's requests beyond the bound are refused while
//! the admitted ones' response bodies are open, with the configured status and a problem+json
//! body; a place comes back when its body ends or is dropped; a request the rate refuses takes
//! none; under cancellation by many clients, no place is lost or given back twice. A policy of
//! an in-flight bound alone (`Policy::in_flight`) bounds a real axum server's running requests
//! and sends no rate-limit field.

#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::future::Ready;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tollgate::tower::{Key, Policy, RateLimitLayer};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tower_layer::Layer;
use tower_service::Service;

#[path = "support/tower.rs"]
mod tower_support;
use tower_support::{request, respond};

/// A response body that stays open until the test sends its last chunk or drops its sender.
struct OpenBody(mpsc::UnboundedReceiver<Bytes>);

impl Body for OpenBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|data| Ok(Frame::data(data))))
    }
}

/// An inner service whose every response streams a body the test holds the sender of.
#[derive(Clone, Default)]
struct Streams(Arc<Mutex<Vec<mpsc::UnboundedSender<Bytes>>>>);

impl Service<Request<String>> for Streams {
    type Response = Response<OpenBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<OpenBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        let (send, receive) = mpsc::unbounded_channel();
        self.0.lock().unwrap().push(send);
        std::future::ready(Ok(Response::new(OpenBody(receive))))
    }
}

const ALICE: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
const BOB: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)));

fn policy(per_minute: u64) -> Policy {
    let rate =
        KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(per_minute).unwrap()).unwrap());
    Policy::new("downloads", rate).max_in_flight(2)
}

#[tokio::test]
async fn places_are_held_until_the_body_ends_or_is_dropped() {
    let streams = Streams::default();
    let layer = RateLimitLayer::builder()
        .policy(policy(1000))
        .build()
        .unwrap();
    let mut svc = layer.layer(streams.clone());
    let first = respond(&mut svc, request("/a", ALICE, &[])).await;
    let second = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    // Two bodies open: a third request of the same client is refused at once.
    let third = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let content_type = third.headers().get(http::header::CONTENT_TYPE).unwrap();
    assert_eq!(content_type, "application/problem+json");
    let body = third.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("in flight"), "{text}");
    // Another client is not affected.
    assert_eq!(
        respond(&mut svc, request("/a", BOB, &[])).await.status(),
        StatusCode::OK
    );
    // The first body ends (its last chunk, then the end): its place comes back.
    let mut senders = std::mem::take(&mut *streams.0.lock().unwrap()).into_iter();
    let last = senders.next().unwrap();
    last.send(Bytes::from_static(b"done")).unwrap();
    drop(last);
    let collected = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&collected[..], b"done");
    let fourth = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(fourth.status(), StatusCode::OK);
    let over = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    // A client that hangs up: the second body is dropped unread, and its place comes back.
    drop(second);
    let fifth = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(fifth.status(), StatusCode::OK);
    drop((fourth, fifth));
}

#[tokio::test]
async fn a_request_the_rate_refuses_takes_no_place_and_503_is_configurable() {
    let streams = Streams::default();
    let policy = policy(1).in_flight_status(StatusCode::SERVICE_UNAVAILABLE);
    let layer = RateLimitLayer::builder().policy(policy).build().unwrap();
    let mut svc = layer.layer(streams.clone());
    let admitted = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    // The rate (1 a minute) refuses the next ones: they take no place, so the bound of 2 is
    // never what refuses them.
    for _ in 0..3 {
        let refused = respond(&mut svc, request("/a", ALICE, &[])).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.headers().get(http::header::RETRY_AFTER).is_some());
    }
    drop(admitted);
    // With the rate spent but places free, and then the bound: a second policy shows 503.
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1000).unwrap()).unwrap());
    let busy = Policy::new("busy", rate)
        .max_in_flight(1)
        .in_flight_status(StatusCode::SERVICE_UNAVAILABLE);
    let mut svc = RateLimitLayer::builder()
        .policy(busy)
        .build()
        .unwrap()
        .layer(Streams::default());
    let held = respond(&mut svc, request("/a", ALICE, &[])).await;
    let over = respond(&mut svc, request("/a", ALICE, &[])).await;
    assert_eq!(
        (held.status(), over.status()),
        (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE)
    );
}

#[test]
fn bad_bounds_are_refused_when_the_layer_is_built() {
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10).unwrap()).unwrap());
    let zero = Policy::new("zero", rate).max_in_flight(0);
    let error = RateLimitLayer::builder().policy(zero).build().unwrap_err();
    assert!(error.to_string().contains("max_in_flight 0"), "{error}");
    assert!(error.to_string().contains("at least 1"), "{error}");
    // Too large for a key's count: said so, not "at least 1".
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10).unwrap()).unwrap());
    let huge = Policy::new("huge", rate).max_in_flight(u64::MAX);
    let error = RateLimitLayer::builder().policy(huge).build().unwrap_err();
    assert!(error.to_string().contains("exceeds the largest"), "{error}");
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(10).unwrap()).unwrap());
    let ok_status = Policy::new("ok", rate)
        .max_in_flight(1)
        .in_flight_status(StatusCode::OK);
    assert!(RateLimitLayer::builder().policy(ok_status).build().is_err());
}

/// `in_flight` and `in_flight_status` in the configuration file.
#[cfg(feature = "serde")]
#[tokio::test]
async fn the_bound_is_read_from_the_configuration() {
    use tollgate::tower::config::LayerConfig;
    let config: LayerConfig = toml::from_str(
        r#"
        [[policy]]
        name = "exports"
        quota = "100/1m"
        in_flight = 1
        in_flight_status = 503
        "#,
    )
    .unwrap();
    let layer = config.builder().unwrap().build().unwrap();
    let mut svc = layer.layer(Streams::default());
    let held = respond(&mut svc, request("/x", ALICE, &[])).await;
    let over = respond(&mut svc, request("/x", ALICE, &[])).await;
    assert_eq!(
        (held.status(), over.status()),
        (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE)
    );
    for bad in [
        "in_flight = 0",
        "in_flight = 1\nin_flight_status = 200",
        "in_flight = 1\nin_flight_status = 1000",
    ] {
        let text = format!("[[policy]]\nname = \"p\"\nquota = \"1/1s\"\n{bad}\n");
        let config: LayerConfig = toml::from_str(&text).unwrap();
        let built = config.builder().and_then(|builder| builder.build());
        assert!(built.is_err(), "{bad}: accepted");
    }
}

/// `in_flight` without a quota is a bound with no rate: no rate-limit field, any number of
/// requests one after another; with neither, or with tiers, the policy is refused.
#[tokio::test]
async fn a_configured_bound_without_a_quota_has_no_rate() {
    use tollgate::tower::config::LayerConfig;
    let text = "headers = \"both\"\n[[policy]]\nname = \"exports\"\nin_flight = 1\n";
    let config: LayerConfig = toml::from_str(text).unwrap();
    let layer = config.builder().unwrap().build().unwrap();
    let mut svc = layer.layer(Streams::default());
    let held = respond(&mut svc, request("/x", ALICE, &[])).await;
    let over = respond(&mut svc, request("/x", ALICE, &[])).await;
    assert_eq!(
        (held.status(), over.status()),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
    assert!(held.headers().get("ratelimit-policy").is_none());
    assert!(held.headers().get("x-ratelimit-limit").is_none());
    drop(held); // its body ends: the place comes back
    for _ in 0..100 {
        let next = respond(&mut svc, request("/x", ALICE, &[])).await;
        assert_eq!(next.status(), StatusCode::OK);
    }
    for (bad, why) in [
        ("", "no quota"),
        ("in_flight = 1\ntiers.pro = { quota = \"1/1s\" }", "tiers"),
    ] {
        let text = format!("[[policy]]\nname = \"p\"\n{bad}\n");
        let config: LayerConfig = toml::from_str(&text).unwrap();
        let built = config.builder().and_then(|builder| builder.build());
        let message = built.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains(why), "{bad:?}: {message:?}");
    }
}

/// Under `InFlightScope::Policy` every client shares the one bound.
#[tokio::test]
async fn a_policy_wide_bound_is_shared_by_every_client() {
    use tollgate::tower::InFlightScope;
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1000).unwrap()).unwrap());
    let policy = Policy::new("reports", rate)
        .max_in_flight(1)
        .in_flight_scope(InFlightScope::Policy);
    let mut svc = RateLimitLayer::builder()
        .policy(policy)
        .build()
        .unwrap()
        .layer(Streams::default());
    let alice = respond(&mut svc, request("/r", ALICE, &[])).await;
    let bob = respond(&mut svc, request("/r", BOB, &[])).await;
    assert_eq!(
        (alice.status(), bob.status()),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
    drop(alice);
    assert_eq!(
        respond(&mut svc, request("/r", BOB, &[])).await.status(),
        StatusCode::OK
    );
    #[cfg(feature = "serde")]
    {
        let config: tollgate::tower::config::PolicyConfig = toml::from_str(
            "name = \"r\"\nquota = \"1/1s\"\nin_flight = 2\nin_flight_scope = \"policy\"",
        )
        .unwrap();
        assert_eq!(config.in_flight_scope, InFlightScope::Policy);
    }
}

/// A shadow policy counts a request over the bound and lets it through.
#[tokio::test]
async fn a_shadow_policy_lets_requests_over_the_bound_through() {
    use tollgate::tower::Mode;
    let rate = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(1000).unwrap()).unwrap());
    let policy = Policy::new("trial", rate)
        .max_in_flight(1)
        .mode(Mode::Shadow);
    let mut svc = RateLimitLayer::builder()
        .policy(policy)
        .build()
        .unwrap()
        .layer(Streams::default());
    let first = respond(&mut svc, request("/t", ALICE, &[])).await;
    let second = respond(&mut svc, request("/t", ALICE, &[])).await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
}

/// The requests of one client now inside the inner service or its body (a guard a request
/// holds from the inner `call` until its body ends or is dropped, or its future is dropped
/// before it answered): what `max_in_flight` bounds. The layer gives a place back only after
/// the inner future or body is gone, so this never reads above the bound.
#[derive(Clone, Default)]
struct Inside(Arc<Mutex<std::collections::HashMap<IpAddr, (u64, u64)>>>);

struct Guard {
    inside: Inside,
    client: IpAddr,
}

impl Inside {
    fn enter(&self, client: IpAddr) -> Guard {
        let mut map = self.0.lock().unwrap();
        let (now, most) = map.entry(client).or_default();
        *now += 1;
        *most = (*most).max(*now);
        Guard {
            inside: self.clone(),
            client,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut map = self.inside.0.lock().unwrap();
        map.get_mut(&self.client).unwrap().0 -= 1;
    }
}

/// A body of one chunk after a short pause, that leaves (drops its guard) as it ends.
struct Pausing {
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    guard: Option<Guard>,
}

impl Body for Pausing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(pause) = &mut self.pause {
            std::task::ready!(std::future::Future::poll(pause.as_mut(), cx));
            self.pause = None;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))));
        }
        // Ends: out of the service before the layer sees the end.
        self.guard = None;
        Poll::Ready(None)
    }
}

/// An inner service that takes a moment to answer, then streams a pausing body.
#[derive(Clone)]
struct Slow(Inside);

impl Service<Request<String>> for Slow {
    type Response = Response<Pausing>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Response<Pausing>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let client = request
            .extensions()
            .get::<std::net::SocketAddr>()
            .unwrap()
            .ip();
        let micros: u64 = request.uri().query().unwrap().parse().unwrap();
        let guard = self.0.enter(client);
        Box::pin(async move {
            let pause = std::time::Duration::from_micros(micros);
            tokio::time::sleep(pause).await;
            Ok(Response::new(Pausing {
                pause: Some(Box::pin(tokio::time::sleep(pause))),
                guard: Some(guard),
            }))
        })
    }
}

/// Many clients, each with several tasks, on two worker threads: requests whose futures are
/// dropped before the answer (a timeout), bodies read to the end, dropped unread, or dropped
/// after their first chunk. No client ever has more than the bound inside the service, and
/// once every task is done each client gets exactly the bound again: no place lost, none
/// given back twice.
#[test]
fn places_survive_cancellation_by_many_clients() {
    const BOUND: u64 = 3;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let inside = Inside::default();
    let rate =
        KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(1_000_000).unwrap()).unwrap());
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("work", rate).max_in_flight(BOUND))
        .build()
        .unwrap();
    let svc = layer.layer(Slow(inside.clone()));
    let clients: Vec<IpAddr> = (1..=12).map(|i| IpAddr::from([198, 51, 100, i])).collect();
    let (admitted, refused) = runtime.block_on(async {
        let tasks: Vec<_> = clients
            .iter()
            .flat_map(|&client| (0..5u64).map(move |task| (client, task)))
            .map(|(client, task)| {
                let mut svc = svc.clone();
                tokio::spawn(async move {
                    let (mut admitted, mut refused) = (0u64, 0u64);
                    for round in 0..200u64 {
                        let spin = (task * 7 + round * 13) % 11;
                        let path = format!("/work?{}", 50 + spin * 40);
                        let call = respond(&mut svc, request(&path, Some(client), &[]));
                        // Some callers give up before the answer.
                        let wait = std::time::Duration::from_micros(100 + spin * 60);
                        let Ok(response) = tokio::time::timeout(wait, call).await else {
                            continue;
                        };
                        if response.status() != StatusCode::OK {
                            refused += 1;
                            continue;
                        }
                        admitted += 1;
                        let mut body = response.into_body();
                        match spin % 3 {
                            0 => drop(body.collect().await.unwrap()),
                            1 => drop(body),
                            _ => drop(body.frame().await),
                        }
                    }
                    (admitted, refused)
                })
            })
            .collect();
        let mut totals = (0, 0);
        for task in tasks {
            let (a, r) = task.await.unwrap();
            totals = (totals.0 + a, totals.1 + r);
        }
        totals
    });
    let map = inside.0.lock().unwrap().clone();
    for client in &clients {
        let (now, most) = map.get(client).copied().unwrap_or_default();
        assert_eq!(now, 0, "{client}: every request has left the service");
        assert!(
            most <= BOUND,
            "{client}: {most} inside at once, bound {BOUND}"
        );
    }
    assert!(
        admitted > 0 && refused > 0,
        "admitted {admitted}, refused {refused}"
    );
    // Every place came back: each client gets exactly the bound again, with bodies held open.
    runtime.block_on(async {
        let mut svc = svc.clone();
        for client in &clients {
            let mut open = Vec::new();
            for _ in 0..BOUND {
                let response = respond(&mut svc, request("/work?100000", Some(*client), &[])).await;
                assert_eq!(response.status(), StatusCode::OK, "{client}");
                open.push(response);
            }
            let over = respond(&mut svc, request("/work?100000", Some(*client), &[])).await;
            assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS, "{client}");
        }
    });
}

/// What an axum server answered: status, headers, body.
#[cfg(feature = "axum")]
struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

/// A GET of `path` on the server at `addr`.
#[cfg(feature = "axum")]
async fn fetch(http: tower_support::Http, addr: std::net::SocketAddr, path: &str) -> Reply {
    let request = Request::get(format!("http://{addr}{path}"))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let response = http.request(request).await.expect("the server answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("a body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// The rate-limit fields of every style, and `Retry-After`: what a policy without a rate must
/// never send (it has no quota to show, nor a wait to promise).
#[cfg(feature = "axum")]
const RATE_FIELDS: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

#[cfg(feature = "axum")]
#[tokio::test]
async fn an_in_flight_bound_alone_limits_an_axum_server_without_rate_fields() {
    use axum::{routing::get, Router};
    use tollgate::tower::HeaderStyle;

    // Each export tells the test it started, then runs until the test lets it finish.
    let (started, mut starts) = mpsc::unbounded_channel::<()>();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let export = {
        let gate = Arc::clone(&gate);
        move || {
            let (gate, started) = (Arc::clone(&gate), started.clone());
            async move {
                started.send(()).unwrap();
                gate.acquire().await.unwrap().forget();
                "exported"
            }
        }
    };
    let layer = RateLimitLayer::builder()
        .policy(Policy::in_flight("exports", 2).path_prefix("/export"))
        .headers(HeaderStyle::Both)
        .build()
        .unwrap();
    let app = Router::new().route("/export", get(export)).layer(layer);
    let addr = tower_support::serve(app).await;
    let http = tower_support::client();

    // Two exports run at once (from one client, 127.0.0.1); a third is refused at once.
    let running: Vec<_> = (0..2)
        .map(|_| tokio::spawn(fetch(http.clone(), addr, "/export")))
        .collect();
    starts.recv().await.unwrap();
    starts.recv().await.unwrap();
    let over = fetch(http.clone(), addr, "/export").await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        over.headers.get("content-type").unwrap(),
        "application/problem+json"
    );
    assert!(over.body.contains("in flight"), "{}", over.body);
    for field in RATE_FIELDS {
        assert!(
            over.headers.get(field).is_none(),
            "the refusal sent {field}"
        );
    }
    assert!(starts.try_recv().is_err(), "the refused export never ran");

    // The two finish: admitted, without a rate field although the layer sends both styles.
    gate.add_permits(2);
    for reply in running {
        let reply = reply.await.unwrap();
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (StatusCode::OK, "exported")
        );
        for field in RATE_FIELDS {
            assert!(
                reply.headers.get(field).is_none(),
                "an admitted export sent {field}"
            );
        }
    }

    // Their places came back when their bodies ended (the server drops a body a moment after
    // the client has read it: retried within a bound). No rate: any number, one after another.
    gate.add_permits(1_000);
    for n in 0..20 {
        let mut tries = 0;
        loop {
            let reply = fetch(http.clone(), addr, "/export").await;
            if reply.status == StatusCode::OK {
                break;
            }
            tries += 1;
            assert!(tries < 200, "export {n}: still refused: {}", reply.status);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test]
async fn an_in_flight_bound_alone_is_evaluated_unchecked_and_refuses_rate_settings() {
    use tollgate::tower::{ConfigError, Outcome};
    let layer = RateLimitLayer::builder()
        .policy(Policy::in_flight("exports", 1))
        .build()
        .unwrap();
    let peer = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    let (parts, _) = request("/export", peer, &[]).into_parts();
    let (first, place) = layer.evaluate_held(&parts, None).await;
    assert_eq!((first.outcome, first.passes), (Outcome::Allowed, true));
    assert_eq!(first.decision, None, "no rate: no decision");
    assert!(place.is_some());
    let (second, _) = layer.evaluate_held(&parts, None).await;
    assert_eq!((second.outcome, second.passes), (Outcome::InFlight, false));
    drop(place);
    assert!(layer.evaluate_held(&parts, None).await.0.passes);

    // Refunds give a rate's units back, and delay mode waits for a rate's slot: neither has
    // anything to work on here.
    let refunds = Policy::in_flight("r", 1).refund_when(|s| s.is_server_error());
    let refused = RateLimitLayer::builder().policy(refunds).build();
    assert!(
        matches!(&refused, Err(ConfigError::Policy { problem, .. }) if problem.contains("in-flight bound alone")),
        "{refused:?}"
    );
    #[cfg(feature = "tokio")]
    {
        let delay = tollgate::tower::Mode::Delay {
            max_wait: std::time::Duration::from_secs(1),
        };
        let delayed = Policy::in_flight("d", 1).mode(delay);
        assert!(RateLimitLayer::builder().policy(delayed).build().is_err());
    }
}
