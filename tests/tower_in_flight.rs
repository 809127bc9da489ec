//! The tower layer's `max_in_flight`: a client's requests beyond the bound are refused while
//! the admitted ones' response bodies are open, with the configured status and a problem+json
//! body; a place comes back when its body ends or is dropped; a request the rate refuses takes
//! none.

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
    assert!(error.to_string().contains("max_in_flight"), "{error}");
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
