//! Client keys: what a request is counted under.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use http::header::HeaderName;
use http::request::Parts;

use super::addr::Addrs;
use super::answers::Fallback;

/// The key a request is counted under: what a [`CheckBackend`](super::CheckBackend) receives.
///
/// Use it as the key type of the limiters behind a layer, e.g. `KeyedLimiter<Key, Gcra>`.
///
/// # Examples
/// ```
/// use tollgate::tower::Key;
/// let ip = Key::from("203.0.113.7".parse::<std::net::IpAddr>()?);
/// let route_and_ip = Key::Composite(vec![Key::from("/api/export"), ip.clone()].into());
/// assert_eq!(route_and_ip.to_string(), "/api/export|203.0.113.7");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// A client address, already grouped: an IPv4 address, or an IPv6 prefix with its host
    /// bits cleared.
    Ip(IpAddr),
    /// A text value: a path, a header value, a constant.
    Text(Box<str>),
    /// A header value that is not valid UTF-8, byte for byte.
    Bytes(Box<[u8]>),
    /// Several keys together (e.g. route + client IP).
    Composite(Box<[Key]>),
}

/// An address, the key of nearly every request, is hashed in one write (a derived `Hash`
/// writes the enum's tag, the address family's tag, a length and the bytes: four calls into
/// the hasher); the other keys as a derived `Hash` would. Equal keys hash alike.
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            // (A v4 and a v6 address may hash alike by chance only: they are never equal.)
            Key::Ip(IpAddr::V4(ip)) => state.write_u32(ip.to_bits()),
            Key::Ip(IpAddr::V6(ip)) => state.write_u128(ip.to_bits()),
            Key::Text(text) => {
                state.write_u8(1);
                text.hash(state);
            }
            Key::Bytes(bytes) => {
                state.write_u8(2);
                bytes.hash(state);
            }
            Key::Composite(parts) => {
                state.write_u8(3);
                parts.hash(state);
            }
        }
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Key::Ip(ip)
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::Text(s.into())
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::Text(s.into_boxed_str())
    }
}

/// What the layer does with a request whose key has a text or byte part longer than the
/// layer's bound ([`RateLimitLayerBuilder::max_key_len`](super::RateLimitLayerBuilder::max_key_len),
/// default 256 bytes): a header or path of the client's choosing must not cost the server
/// memory (or Redis keys) by its length.
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::{LongKey, RateLimitLayer};
/// assert_eq!(LongKey::default(), LongKey::Digest);
/// // Refuse API keys over 128 bytes outright.
/// let layer = RateLimitLayer::builder()
///     .max_key_len(128)
///     .on_long_key(LongKey::Reject(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE))
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LongKey {
    /// Count the request under a digest of each long part (SHA-256, 128 bits kept): a key of
    /// fixed size, the same on every node (so a global limit holds), and no client can make
    /// its long key collide with another's. The default.
    #[default]
    Digest,
    /// Answer with this status (a 4xx or 5xx), uncounted (outcome
    /// [`KeyTooLong`](super::Outcome::KeyTooLong)).
    Reject(http::StatusCode),
}

/// The prefix of a digested key part: a NUL, which no header value or path can hold, so no
/// client can send a key equal to a digest.
const DIGEST_PREFIX: &[u8] = b"\0sha256:";

impl Key {
    /// The length of the longest text or byte part (0 for an address).
    pub(crate) fn longest_part(&self) -> usize {
        match self {
            Key::Ip(_) => 0,
            Key::Text(text) => text.len(),
            Key::Bytes(bytes) => bytes.len(),
            Key::Composite(parts) => parts.iter().map(Key::longest_part).max().unwrap_or(0),
        }
    }

    /// `self` with every text or byte part longer than `max` bytes replaced by its digest:
    /// `\0sha256:` and the first 16 bytes of its SHA-256 in hex, as [`Key::Bytes`] (a text
    /// and a byte part of the same bytes digest apart).
    pub(crate) fn digested(self, max: usize) -> Key {
        use sha2::{Digest, Sha256};
        let digest = |tag: &[u8], bytes: &[u8]| {
            let sum = Sha256::new()
                .chain_update(tag)
                .chain_update(bytes)
                .finalize();
            let mut out = DIGEST_PREFIX.to_vec();
            for b in &sum[..16] {
                out.extend_from_slice(format!("{b:02x}").as_bytes());
            }
            Key::Bytes(out.into_boxed_slice())
        };
        match self {
            Key::Text(text) if text.len() > max => digest(b"t", text.as_bytes()),
            Key::Bytes(bytes) if bytes.len() > max => digest(b"b", &bytes),
            Key::Composite(parts) => Key::Composite(
                parts
                    .into_vec()
                    .into_iter()
                    .map(|part| part.digested(max))
                    .collect(),
            ),
            key => key,
        }
    }
}

/// For logs; composite parts are joined with `|`, bytes written as `\xNN` escapes. Not
/// injective (a text part may contain `|`): never use it as a storage key.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Ip(ip) => write!(f, "{ip}"),
            Key::Text(s) => f.write_str(s),
            Key::Bytes(b) => write!(f, "{}", b.escape_ascii()),
            Key::Composite(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("|")?;
                    }
                    write!(f, "{part}")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a request has no key: what decides its answer when no `on_missing_key` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// Something the client sends is absent or unusable: a header, what a closure reads, a
    /// forwarding hop that is not an address. The request is at fault: 400.
    FromClient,
    /// The peer address: the server does not put it where the layer reads it. The server is
    /// at fault, whatever the client sends: 500.
    PeerAddr,
}

impl Missing {
    /// The answer when neither the policy nor the layer sets one.
    pub(crate) fn default_fallback(self) -> Fallback {
        Fallback::Reject(match self {
            Missing::FromClient => http::StatusCode::BAD_REQUEST,
            Missing::PeerAddr => http::StatusCode::INTERNAL_SERVER_ERROR,
        })
    }

    /// The problem detail of a refusal.
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Missing::FromClient => "The request carries no client key for rate limiting.",
            Missing::PeerAddr => {
                "The server cannot read the client's address, which this rate limit keys \
                 requests by: it is misconfigured (with axum, serve the application with \
                 `into_make_service_with_connect_info::<SocketAddr>()`)."
            }
        }
    }
}

/// A custom key function.
type KeyFn = dyn Fn(&Parts) -> Option<Key> + Send + Sync;

/// Where a policy takes its client key from.
///
/// | source | key | missing when | default answer |
/// |---|---|---|---|
/// | [`KeySource::peer_ip`] | the connection's address (grouped) | no peer address extension | 500 |
/// | [`KeySource::client_ip`] | the client behind trusted proxies (grouped) | as `peer_ip`; a forwarding hop that is not an address | 500; 400 |
/// | [`KeySource::header`] | the header's value | the header is absent or empty | 400 |
/// | [`KeySource::path`] | the request path | never | |
/// | [`KeySource::constant`] | one shared key (a global limit) | never | |
/// | [`KeySource::from_fn`] | what the closure returns | the closure returns `None` | 400 |
/// | [`KeySource::composite`] | all of its parts | any part is missing | 500 if a peer address is missing, else 400 |
///
/// A request without a key is answered by the policy's
/// [`on_missing_key`](super::Policy::on_missing_key), else the layer's
/// [`on_missing_key`](super::RateLimitLayerBuilder::on_missing_key), else by why it is missing:
/// `400 Bad Request` when the client did not send what the key is made of (its mistake), `500
/// Internal Server Error` when the server gave the layer no peer address (a misconfiguration,
/// which the problem body names: with axum, serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`).
///
/// The peer address is read from axum's `ConnectInfo<SocketAddr>` extension (feature `axum`)
/// or a plain [`SocketAddr`](std::net::SocketAddr) request extension (insert it yourself with hyper-util). IP keys
/// are grouped as the layer is configured: IPv4 per address, IPv6 per prefix (default /56, see
/// [`RateLimitLayerBuilder::ipv6_prefix`](super::RateLimitLayerBuilder::ipv6_prefix)).
///
/// # Examples
/// One request an hour per API key, run through the layer: each key has its own budget, and
/// a request without the header is refused with a 400 by default ("no key" is the client's
/// mistake).
/// ```
/// use axum::{body::Body, routing::get, Router};
/// use http::{HeaderName, Request, StatusCode};
/// use tollgate::tower::{Key, KeySource, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// use tower_layer::Layer;
/// use tower_service::Service;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_key = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", per_key).key(KeySource::header(HeaderName::from_static("x-api-key"))))
///     .build()?;
/// let mut app = layer.layer(Router::new().route("/", get(|| async { "ok" })));
/// let mut statuses = Vec::new();
/// for api_key in [Some("alice"), Some("alice"), Some("bob"), None] {
///     let mut request = Request::get("/");
///     if let Some(k) = api_key {
///         request = request.header("x-api-key", k);
///     }
///     std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx)).await?;
///     statuses.push(app.call(request.body(Body::empty())?).await?.status());
/// }
/// use StatusCode as S;
/// assert_eq!(statuses, [S::OK, S::TOO_MANY_REQUESTS, S::OK, S::BAD_REQUEST]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KeySource(Source);

#[derive(Clone)]
enum Source {
    PeerIp,
    ClientIp,
    Header(HeaderName),
    Path,
    Constant(Key),
    Fn(Arc<KeyFn>),
    Composite(Arc<[KeySource]>),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::PeerIp => f.write_str("PeerIp"),
            Source::ClientIp => f.write_str("ClientIp"),
            Source::Header(name) => f.debug_tuple("Header").field(name).finish(),
            Source::Path => f.write_str("Path"),
            Source::Constant(key) => f.debug_tuple("Constant").field(key).finish(),
            Source::Fn(_) => f.write_str("Fn(..)"),
            Source::Composite(parts) => f.debug_tuple("Composite").field(parts).finish(),
        }
    }
}

impl KeySource {
    /// The peer's address (the TCP connection's), ignoring every forwarding header.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // A service reached directly (no proxy in front): a forwarding header could only be forged.
    /// let policy = Policy::new("direct", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .key(KeySource::peer_ip());
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn peer_ip() -> Self {
        KeySource(Source::PeerIp)
    }

    /// The client's address behind the layer's trusted proxies: the peer's address, or, when
    /// the peer is a trusted proxy, the forwarding header read right to left past every trusted
    /// hop (see [`RateLimitLayerBuilder::trusted_proxies`](super::RateLimitLayerBuilder::trusted_proxies)).
    /// The default source.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Behind a load balancer in 10.0.0.0/8: the client is read from its X-Forwarded-For.
    /// let policy = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?))
    ///     .key(KeySource::client_ip()); // the default, spelled out
    /// let layer = RateLimitLayer::builder()
    ///     .policy(policy)
    ///     .trusted_proxies(["10.0.0.0/8".parse()?])
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client_ip() -> Self {
        KeySource(Source::ClientIp)
    }

    /// The value of header `name` (e.g. `x-api-key`); missing when absent or empty (a 400 by
    /// default). Of several lines of the header, the first counts.
    ///
    /// # Examples
    /// ```
    /// use http::HeaderName;
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Per customer, whatever address they call from (a run of it is on [`KeySource`]).
    /// let policy = Policy::new("api", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(600)?)?))
    ///     .key(KeySource::header(HeaderName::from_static("x-api-key")));
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn header(name: HeaderName) -> Self {
        KeySource(Source::Header(name))
    }

    /// The headers this source reads a key from, its parts' included (a closure's are
    /// unknown): what a tool that builds requests for it must set.
    ///
    /// # Examples
    /// ```
    /// use http::HeaderName;
    /// use tollgate::tower::KeySource;
    /// let api_key = HeaderName::from_static("x-api-key");
    /// let source = KeySource::composite([KeySource::path(), KeySource::header(api_key.clone())]);
    /// assert_eq!(source.headers(), [&api_key]);
    /// assert!(KeySource::client_ip().headers().is_empty());
    /// ```
    pub fn headers(&self) -> Vec<&HeaderName> {
        match &self.0 {
            Source::Header(name) => vec![name],
            Source::Composite(parts) => parts.iter().flat_map(KeySource::headers).collect(),
            _ => Vec::new(),
        }
    }

    /// The request's path (without the query) as the client sent it, normalised as policies
    /// match it (see [`client_path`](super::client_path)): `//a/./b` and `/a/%62` are the key
    /// `/a/b`, and a route nested under axum's `Router::nest("/api", …)` is keyed `/api/…`
    /// wherever the layer sits.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Protect each expensive report page, whoever asks: 5 renders a second per path.
    /// let policy = Policy::new("reports", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(5)?)?))
    ///     .path_prefix("/reports")
    ///     .key(KeySource::path());
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn path() -> Self {
        KeySource(Source::Path)
    }

    /// One key for every request: the policy's limit is then global to it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // The upstream search service takes 100 requests a second in all, from everyone.
    /// let policy = Policy::new("search", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(100)?)?))
    ///     .path_prefix("/search")
    ///     .key(KeySource::constant("search"));
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn constant(key: impl Into<Key>) -> Self {
        KeySource(Source::Constant(key.into()))
    }

    /// A key computed by `f` from the request's head; `None` means no key, which is the
    /// client's to send (a 400 by default).
    ///
    /// # Examples
    /// ```
    /// use http::request::Parts;
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // The tenant is the first label of the host name: `acme.example.com` → `acme`.
    /// fn tenant(parts: &Parts) -> Option<Key> {
    ///     let host = parts.headers.get(http::header::HOST)?.to_str().ok()?;
    ///     host.split_once('.').map(|(tenant, _)| Key::from(tenant))
    /// }
    /// let (parts, ()) = http::Request::get("/").header("host", "acme.example.com").body(())?.into_parts();
    /// assert_eq!(tenant(&parts), Some(Key::from("acme")));
    /// let policy = Policy::new("tenant", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(50)?)?))
    ///     .key(KeySource::from_fn(tenant));
    /// # let _ = policy;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_fn(f: impl Fn(&Parts) -> Option<Key> + Send + Sync + 'static) -> Self {
        KeySource(Source::Fn(Arc::new(f)))
    }

    /// All of `parts` together, as a [`Key::Composite`] (e.g. `[path(), client_ip()]`); missing
    /// if any part is.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::{Key, KeySource, Policy};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// // Each client gets 2 logins a minute on each login form (the key is path + client IP).
    /// let policy = Policy::new("login", KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_minute(2)?)?))
    ///     .path_pattern("/*/login")
    ///     .key(KeySource::composite([KeySource::path(), KeySource::client_ip()]));
    /// # let _ = policy;
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn composite(parts: impl IntoIterator<Item = KeySource>) -> Self {
        KeySource(Source::Composite(parts.into_iter().collect()))
    }

    /// Whether a closure (`from_fn`) takes part: it may read any of the request's head.
    #[cfg(feature = "actix")]
    pub(crate) fn has_fn(&self) -> bool {
        match &self.0 {
            Source::Fn(_) => true,
            Source::Composite(parts) => parts.iter().any(KeySource::has_fn),
            _ => false,
        }
    }

    /// The key of a request, or why it has none; `path` is its normalised path.
    pub(crate) fn extract(
        &self,
        parts: &Parts,
        path: &str,
        addrs: &mut Addrs<'_>,
    ) -> Result<Key, Missing> {
        match &self.0 {
            Source::PeerIp => addrs
                .peer()
                .map(|ip| Key::Ip(addrs.group(ip)))
                .ok_or(Missing::PeerAddr),
            Source::ClientIp => match addrs.client(parts) {
                Some(ip) => Ok(Key::Ip(addrs.group(ip))),
                None if addrs.peer().is_none() => Err(Missing::PeerAddr),
                // A peer, but its forwarding header names no client.
                None => Err(Missing::FromClient),
            },
            Source::Header(name) => {
                let value = parts.headers.get(name).map(|v| v.as_bytes());
                let value = value.filter(|v| !v.is_empty()).ok_or(Missing::FromClient)?;
                Ok(match std::str::from_utf8(value) {
                    Ok(text) => Key::Text(text.into()),
                    Err(_) => Key::Bytes(value.into()),
                })
            }
            Source::Path => Ok(Key::Text(path.into())),
            Source::Constant(key) => Ok(key.clone()),
            Source::Fn(f) => f(parts).ok_or(Missing::FromClient),
            Source::Composite(sources) => {
                let mut keys = Vec::with_capacity(sources.len());
                let mut missing = None;
                for source in sources.iter() {
                    match source.extract(parts, path, addrs) {
                        Ok(key) => keys.push(key),
                        // The server's fault outweighs the client's: its answer must say so
                        // even when a header is missing too.
                        Err(Missing::PeerAddr) => return Err(Missing::PeerAddr),
                        Err(Missing::FromClient) => missing = Some(Missing::FromClient),
                    }
                }
                match missing {
                    Some(missing) => Err(missing),
                    None => Ok(Key::Composite(keys.into())),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::addr::tests::{config, ip};
    use super::super::addr::{Addrs, ProxyHeader};
    use super::*;
    use http::Request;

    #[test]
    fn only_long_parts_are_digested_and_text_and_bytes_apart() {
        let long = "x".repeat(300);
        let ip = Key::Ip(ip("192.0.2.1"));
        let composite =
            Key::Composite(vec![Key::from("/a"), Key::from(long.as_str()), ip.clone()].into());
        assert_eq!(composite.longest_part(), 300);
        let Key::Composite(parts) = composite.digested(256) else {
            panic!("still a composite");
        };
        assert_eq!(parts[0], Key::from("/a"));
        assert_eq!(parts[2], ip);
        assert_eq!(parts[1].longest_part(), 40);
        let text = Key::from(long.as_str()).digested(256);
        let bytes = Key::Bytes(long.as_bytes().into()).digested(256);
        assert_ne!(text, bytes);
        assert_eq!(text, Key::from(long.as_str()).digested(10));
        assert_eq!(Key::from("short").digested(256), Key::from("short"));
        let shown = text.to_string();
        assert!(
            shown.starts_with("\\x00sha256:"),
            "the NUL shown escaped: {shown}"
        );
        assert_eq!(shown.len(), 11 + 32);
    }

    #[test]
    fn sources_extract_grouped_keys() {
        let config = config(&[], ProxyHeader::XForwardedFor);
        let (parts, ()) = Request::builder()
            .uri("/a/b?q=1")
            .header("x-api-key", "k1")
            .header("x-bin", &b"\xffab"[..])
            .header("x-empty", "")
            .body(())
            .unwrap()
            .into_parts();
        let mut addrs = Addrs::new(&config).with_peer(Some(ip("2001:db8:1:2ff::1")));
        let key = |source: KeySource, addrs: &mut Addrs<'_>| {
            source
                .extract(
                    &parts,
                    &crate::tower::normalized_path(parts.uri.path()),
                    addrs,
                )
                .ok()
        };
        assert_eq!(
            key(KeySource::client_ip(), &mut addrs),
            Some(Key::Ip(ip("2001:db8:1:200::")))
        );
        assert_eq!(
            key(
                KeySource::header(HeaderName::from_static("x-api-key")),
                &mut addrs
            ),
            Some(Key::from("k1"))
        );
        assert_eq!(
            key(
                KeySource::header(HeaderName::from_static("x-bin")),
                &mut addrs
            ),
            Some(Key::Bytes(b"\xffab"[..].into()))
        );
        assert_eq!(
            key(
                KeySource::header(HeaderName::from_static("x-empty")),
                &mut addrs
            ),
            None
        );
        assert_eq!(
            key(
                KeySource::composite([KeySource::path(), KeySource::peer_ip()]),
                &mut addrs
            ),
            Some(Key::Composite(
                vec![Key::from("/a/b"), Key::Ip(ip("2001:db8:1:200::"))].into()
            ))
        );
        let mut none = Addrs::new(&config).with_peer(None);
        assert_eq!(key(KeySource::client_ip(), &mut none), None);
        assert_eq!(
            key(
                KeySource::composite([KeySource::path(), KeySource::peer_ip()]),
                &mut none
            ),
            None
        );
        assert_eq!(
            key(
                KeySource::from_fn(|p| Some(Key::from(p.method.as_str()))),
                &mut none
            ),
            Some(Key::from("GET"))
        );
    }

    #[test]
    fn a_missing_key_says_whose_mistake_it_is() {
        let api_key = || KeySource::header(HeaderName::from_static("x-api-key"));
        let proxied = config(&["10.0.0.0/8"], ProxyHeader::XForwardedFor);
        let (parts, ()) = Request::builder()
            .uri("/a")
            .header("x-forwarded-for", "unknown")
            .body(())
            .unwrap()
            .into_parts();
        let missing = |source: KeySource, peer: Option<&str>| {
            let mut addrs = Addrs::new(&proxied).with_peer(peer.map(ip));
            source.extract(&parts, "/a", &mut addrs).err()
        };
        let (from_client, from_server) = (Some(Missing::FromClient), Some(Missing::PeerAddr));
        assert_eq!(missing(api_key(), Some("192.0.2.1")), from_client);
        assert_eq!(missing(KeySource::from_fn(|_| None), None), from_client);
        assert_eq!(missing(KeySource::peer_ip(), None), from_server);
        assert_eq!(missing(KeySource::client_ip(), None), from_server);
        // A trusted proxy's forwarding header names no client: what the client wrote.
        assert_eq!(
            missing(KeySource::client_ip(), Some("10.0.0.1")),
            from_client
        );
        assert_eq!(missing(KeySource::client_ip(), Some("192.0.2.1")), None);
        // Whichever part comes first, a missing peer address is the answer.
        let both = KeySource::composite([api_key(), KeySource::peer_ip()]);
        assert_eq!(missing(both.clone(), None), from_server);
        assert_eq!(missing(both, Some("192.0.2.1")), from_client);
        assert_eq!(
            Missing::PeerAddr.default_fallback(),
            Fallback::Reject(http::StatusCode::INTERNAL_SERVER_ERROR)
        );
        assert_eq!(
            Missing::FromClient.default_fallback(),
            Fallback::Reject(http::StatusCode::BAD_REQUEST)
        );
        assert!(Missing::PeerAddr
            .detail()
            .contains("into_make_service_with_connect_info"));
    }
}
