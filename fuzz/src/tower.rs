//! The tower layer's fuzz targets (features `tower` and `serde` of the fuzz crate, on by
//! default; of the main crate when `tests/fuzz_corpus.rs` replays the corpus):
//!
//! - `client_ip`: arbitrary forwarding headers (`X-Forwarded-For`, `Forwarded`, several lines,
//!   any bytes) from an arbitrary peer, trusted or not, through a real layer: never a panic;
//!   an IP key, or (from a trusted peer only) a missing one; a peer outside the trusted
//!   networks is its own key whatever the headers say; and when a trusted peer appended a
//!   valid untrusted hop (as nginx's `$proxy_add_x_forwarded_for` does), that hop is the key,
//!   whatever bytes came before it.
//! - `config`: arbitrary text as a TOML layer configuration: parsed, built on a `ManualClock`
//!   and asked one request; an error or an answer, never a panic.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderValue, Request, Response};
use tollgate::clock::ManualClock;
use tollgate::tower::config::LayerConfig;
use tollgate::tower::{
    CheckBackend, CheckFuture, Cidr, Key, Mode, Policy, ProxyHeader, QuotaInfo, RateLimitLayer,
    Verdict,
};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tower_layer::Layer;
use tower_service::Service;

/// Polls `future` once with a waker that does nothing: every future here is ready at once
/// (in-process backends, an inner service that answers at once).
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    let mut cx = Context::from_waker(&waker);
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// An inner service that answers 200 at once.
#[derive(Clone)]
struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<()>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<()>, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new(())))
    }
}

/// Records the keys it is asked about; admits everything.
struct Recorder {
    keys: Arc<Mutex<Vec<Key>>>,
    limiter: KeyedLimiter<Key, Gcra, ManualClock>,
}

impl CheckBackend for Recorder {
    fn check<'a>(&'a self, key: &'a Key, _cost: u64) -> CheckFuture<'a> {
        if let Ok(mut keys) = self.keys.lock() {
            keys.push(key.clone());
        }
        match self.limiter.check(&Key::from("")) {
            Ok(decision) => CheckFuture::ready(Ok(Verdict { decision, quota: 0 })),
            Err(e) => CheckFuture::ready(Err(e.into())),
        }
    }

    fn quota_count(&self) -> usize {
        1
    }

    fn quota(&self, _: usize) -> Option<QuotaInfo> {
        None
    }
}

/// One `client_ip` input.
#[derive(Debug, Arbitrary)]
pub struct Forwarding {
    peer_v6: bool,
    peer: [u8; 16],
    /// Trusted networks: (address bytes, IPv6?, prefix).
    trusted: Vec<([u8; 16], bool, u8)>,
    forwarded: bool,
    ipv6_prefix: u8,
    /// Header lines: (which header, bytes).
    lines: Vec<(bool, Vec<u8>)>,
    /// A hop the peer appends to the header it is read by: (IPv6?, address, on a line of its
    /// own?).
    appended: Option<(bool, [u8; 16], bool)>,
}

fn ip(v6: bool, bytes: [u8; 16]) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

/// Prints a `client_ip` input.
pub fn show_client_ip(data: &[u8]) {
    println!(
        "{:#?}",
        Forwarding::arbitrary_take_rest(Unstructured::new(data))
    );
}

/// The `client_ip` target.
pub fn client_ip(data: &[u8]) {
    let Ok(input) = Forwarding::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let trusted: Vec<Cidr> = input
        .trusted
        .iter()
        .filter_map(|&(bytes, v6, prefix)| Cidr::new(ip(v6, bytes), prefix).ok())
        .collect();
    // Mostly a valid prefix (/32 ..= /64), now and then a refused one.
    let ipv6_prefix = match input.ipv6_prefix {
        p @ 0..224 => 32 + p % 33,
        p => p,
    };
    let keys = Arc::new(Mutex::new(Vec::new()));
    let limiter = KeyedLimiter::with_clock(
        Gcra::new(Quota::per_second(1).expect("a valid quota")).expect("a valid rule"),
        ManualClock::new(),
    )
    .expect("the manual clock serves any quota");
    let built = RateLimitLayer::builder()
        .default_policy(Policy::new(
            "p",
            Recorder {
                keys: Arc::clone(&keys),
                limiter,
            },
        ))
        .trusted_proxies(trusted.iter().copied())
        .proxy_header(if input.forwarded {
            ProxyHeader::Forwarded
        } else {
            ProxyHeader::XForwardedFor
        })
        .ipv6_prefix(ipv6_prefix)
        .build();
    let Ok(layer) = built else {
        assert!(
            !(32..=64).contains(&ipv6_prefix),
            "only an IPv6 prefix outside /32 ..= /64 is refused"
        );
        return;
    };
    let peer = ip(input.peer_v6, input.peer);
    let mut lines: Vec<(&str, Vec<u8>)> = input
        .lines
        .iter()
        .filter(|(_, bytes)| HeaderValue::from_bytes(bytes).is_ok())
        .map(|(xff, bytes)| {
            let name = if *xff { "x-forwarded-for" } else { "forwarded" };
            (name, bytes.clone())
        })
        .collect();
    let read = if input.forwarded {
        "forwarded"
    } else {
        "x-forwarded-for"
    };
    let appended = input.appended.map(|(v6, bytes, own_line)| {
        let hop = ip(v6, bytes);
        let text = match (hop, input.forwarded) {
            (IpAddr::V6(v6), true) => format!("for=\"[{v6}]\""),
            (hop, true) => format!("for={hop}"),
            (hop, false) => hop.to_string(),
        };
        match lines.iter_mut().rev().find(|(name, _)| *name == read) {
            Some((_, line)) if !own_line => line.extend_from_slice(format!(", {text}").as_bytes()),
            _ => lines.push((read, text.into_bytes())),
        }
        hop.to_canonical()
    });
    let mut request = Request::new(());
    for (name, bytes) in &lines {
        let value = HeaderValue::from_bytes(bytes).expect("checked above, and a hop is ASCII");
        request.headers_mut().append(*name, value);
    }
    request.extensions_mut().insert(SocketAddr::new(peer, 1));
    let mut svc = layer.layer(Ok200);
    let response = poll_once(svc.call(request))
        .expect("an in-process layer answers at once")
        .expect("infallible");
    let keys = keys.lock().expect("not poisoned");
    let peer = peer.to_canonical();
    let trusted_ip = |ip: IpAddr| trusted.iter().any(|net| net.contains(ip));
    let group = |ip: IpAddr| match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(_) => Cidr::new(ip, ipv6_prefix).expect("a valid prefix").addr(),
    };
    let Some(key) = keys.first() else {
        // No key: the default answer to a forwarding header that names no client (the
        // peer is known: what is missing is the client's), and only behind a trusted peer.
        assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
        assert!(trusted_ip(peer), "an untrusted peer is always its own key");
        assert!(
            appended.is_none_or(trusted_ip),
            "an appended untrusted hop left the client unknown"
        );
        return;
    };
    assert_eq!(response.status(), http::StatusCode::OK);
    assert_eq!(keys.len(), 1, "one check per request");
    let Key::Ip(key) = *key else {
        panic!("a client key is an IP: {key:?}");
    };
    if !trusted_ip(peer) {
        assert_eq!(key, group(peer), "an untrusted peer chose its key");
    } else if let Some(hop) = appended.filter(|&hop| !trusted_ip(hop)) {
        assert_eq!(
            key,
            group(hop),
            "bytes before the appended hop chose the key"
        );
    }
}

/// The `config` target.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(config) = toml::from_str::<LayerConfig>(&text) else {
        return;
    };
    // Delay mode (the main crate's `tokio` feature, on when `cargo test --all-features`
    // replays the corpus) sleeps on tokio's timer, which needs a runtime: not here.
    if config
        .policies
        .iter()
        .chain(&config.default_policy)
        .any(|p| !matches!(p.mode, Mode::Enforce | Mode::Shadow))
    {
        return;
    }
    let Ok(builder) = config.builder_with_clock(ManualClock::new()) else {
        return;
    };
    let Ok(layer) = builder.build() else {
        return;
    };
    let mut request = Request::new(());
    request
        .extensions_mut()
        .insert(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 1));
    let mut svc = layer.layer(Ok200);
    let response = poll_once(svc.call(request)).expect("an in-process layer answers at once");
    let status = response.expect("infallible").status();
    assert!(
        status.is_success() || status.is_client_error() || status.is_server_error(),
        "status {status}"
    );
}
