//! What the tower layer's tests share: an inner service that answers 200, requests from a peer
//! address, drivers that call a service directly (no network), header reading, and for the
//! tests on a real server, an axum server on a loopback port and an HTTP client.
//!
//! Include it with `#[path = "support/tower.rs"] mod tower_support;`.

#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::{poll_fn, Ready};
use std::net::{IpAddr, SocketAddr};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tollgate::clock::Clock;
use tollgate::tower::{Key, RateLimit};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tower_service::Service;

/// An inner service that answers 200 ("ok") at once.
#[derive(Clone)]
pub struct Ok200;

impl Service<Request<String>> for Ok200 {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// A request for `path` with `headers`, from `peer` (port 40 000, as the `SocketAddr`
/// extension the layer reads) or from no known peer.
pub fn request(path: &str, peer: Option<IpAddr>, headers: &[(&str, &str)]) -> Request<String> {
    let mut request = Request::builder().uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(String::new()).unwrap();
    if let Some(ip) = peer {
        request.extensions_mut().insert(SocketAddr::new(ip, 40_000));
    }
    request
}

/// Waits until `svc` is ready, then calls it with `request`.
pub async fn respond<S>(svc: &mut S, request: Request<String>) -> S::Response
where
    S: Service<Request<String>>,
    S::Error: Debug,
{
    poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    svc.call(request).await.unwrap()
}

/// [`respond`] from synchronous code, on `rt`.
pub fn call<S>(rt: &tokio::runtime::Runtime, svc: &mut S, request: Request<String>) -> S::Response
where
    S: Service<Request<String>>,
    S::Error: Debug,
{
    rt.block_on(respond(svc, request))
}

/// The status of the response to `request` from a clone of `svc` (each call its own service,
/// as a server's connections have).
pub async fn status<S, B>(svc: &S, request: Request<String>) -> u16
where
    S: Service<Request<String>, Response = Response<B>> + Clone,
    S::Error: Debug,
{
    respond(&mut svc.clone(), request).await.status().as_u16()
}

/// One request for `path` from 192.0.2.`ip`, with `api_key` in `x-api-key` if given, through a
/// clone of `svc`: its status.
pub async fn send(svc: &RateLimit<Ok200>, path: &str, ip: u8, api_key: Option<&str>) -> u16 {
    let api_key = api_key.map(|k| ("x-api-key", k));
    let client = Some(IpAddr::from([192, 0, 2, ip]));
    status(svc, request(path, client, api_key.as_slice())).await
}

/// A current-thread runtime without timers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
}

/// A current-thread runtime on tokio's paused time: a wait takes no real time.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

/// The value of `response`'s header `name`, if it has one.
pub fn header<'a, B>(response: &'a Response<B>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Whole seconds, rounded up (as the layer's headers give them).
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A GCRA limiter per key for `quota` on `clock`.
pub fn gcra<C: Clock + Clone>(clock: &C, quota: Quota) -> KeyedLimiter<Key, Gcra, C> {
    KeyedLimiter::with_clock(Gcra::new(quota).unwrap(), clock.clone()).unwrap()
}

/// An HTTP/1 client for [`serve`]'s servers.
pub type Http = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Serves `app` on 127.0.0.1:0 with `ConnectInfo`; the server task ends with the test's runtime.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds a loopback port");
    let addr = listener.local_addr().expect("a local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serves");
    });
    addr
}

/// A response read whole by [`fetch`].
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// The header field `name`, if present (visible ASCII).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII"))
    }
}

/// Sends `method path` with `headers` to the server at `addr` and reads the reply whole.
pub async fn fetch(
    http: &Http,
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = http
        .request(request.body(Full::new(Bytes::new())).expect("a request"))
        .await
        .expect("the server answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("a body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).expect("UTF-8"),
    }
}
