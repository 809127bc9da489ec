//! What the HTTP benches (`tower.rs`, `actix.rs`) share: the clients they draw their requests
//! from, the no-op waker they poll with, and tollgate's layer. Included with
//! `#[path = "support/clients.rs"] mod clients;`.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};

use tollgate::tower::{HeaderStyle, Key, KeySource, Policy, RateLimitLayer};
use tollgate::{Gcra, KeyedLimiter, Quota};

/// Distinct client IPs.
pub const CLIENTS: usize = 10_000;
/// Length of the visiting order (a power of two, random draws from the clients).
pub const SEQUENCE: usize = 1 << 16;

/// A waker that does nothing: every response in these benches is ready at its first poll.
pub struct NoopWake;

impl Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// The visiting order: `SEQUENCE` peer addresses drawn at random from `CLIENTS` distinct ones.
pub fn peers() -> Vec<SocketAddr> {
    // Distinct: multiplying by an odd constant is a bijection of the low 24 bits.
    let clients: Vec<SocketAddr> = (0..CLIENTS as u32)
        .map(|i| {
            let ip = Ipv4Addr::from(0x0A00_0000 | (i.wrapping_mul(0x9E37_79B1) & 0x00FF_FFFF));
            SocketAddr::from((ip, 40_000 + (i % 20_000) as u16))
        })
        .collect();
    let mut state = 0x5EED_u64;
    (0..SEQUENCE)
        .map(|_| {
            // splitmix64
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            clients[((z ^ (z >> 31)) % CLIENTS as u64) as usize]
        })
        .collect()
}

/// The output of `future`, which these benches' services make ready at its first poll.
pub fn poll_once<F: Future>(future: F, cx: &mut Context<'_>) -> F::Output {
    match pin!(future).poll(cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("every response here is ready at once"),
    }
}

/// tollgate's layer for the benches: GCRA, `per_second` a second in bursts of `per_second`,
/// keyed by the peer's IP, or with `proxied` by the client IP behind a trusted proxy on
/// 127.0.0.1.
pub fn tollgate_layer(per_second: u32, proxied: bool, headers: HeaderStyle) -> RateLimitLayer {
    let per_second = u64::from(per_second);
    let quota = Quota::per_second(per_second)
        .and_then(|q| q.with_burst(per_second))
        .expect("a valid quota");
    let limiter = KeyedLimiter::<Key, _>::new(Gcra::new(quota).expect("a valid rule"));
    let (key, trusted) = if proxied {
        (
            KeySource::client_ip(),
            vec!["127.0.0.1".parse().expect("a CIDR")],
        )
    } else {
        (KeySource::peer_ip(), Vec::new())
    };
    RateLimitLayer::builder()
        .policy(Policy::new("api", limiter).key(key))
        .trusted_proxies(trusted)
        .headers(headers)
        .build()
        .expect("a valid layer")
}
