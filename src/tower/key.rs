//! Client keys: what a request is counted under.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use http::HeaderMap;

use super::cidr::{mask, Cidr};

/// The de facto proxy header, by a name built once (a `&str` name is parsed on every lookup).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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

/// A custom key function.
type KeyFn = dyn Fn(&Parts) -> Option<Key> + Send + Sync;

/// Where a policy takes its client key from.
///
/// | source | key | missing when |
/// |---|---|---|
/// | [`KeySource::peer_ip`] | the connection's address (grouped) | no peer address extension |
/// | [`KeySource::client_ip`] | the client behind trusted proxies (grouped) | as `peer_ip` |
/// | [`KeySource::header`] | the header's value | the header is absent or empty |
/// | [`KeySource::path`] | the request path | never |
/// | [`KeySource::constant`] | one shared key (a global limit) | never |
/// | [`KeySource::from_fn`] | what the closure returns | the closure returns `None` |
/// | [`KeySource::composite`] | all of its parts | any part is missing |
///
/// The peer address is read from axum's `ConnectInfo<SocketAddr>` extension (feature `axum`)
/// or a plain [`SocketAddr`] request extension (insert it yourself with hyper-util). IP keys
/// are grouped as the layer is configured: IPv4 per address, IPv6 per prefix (default /56, see
/// [`RateLimitLayerBuilder::ipv6_prefix`](super::RateLimitLayerBuilder::ipv6_prefix)).
///
/// # Examples
/// One request an hour per API key, run through the layer: each key has its own budget, and
/// a request without the header is refused with a 400 ("no key" is the client's mistake).
/// ```
/// use axum::{body::Body, routing::get, Router};
/// use http::{HeaderName, Request, StatusCode};
/// use tollgate::tower::{Fallback, Key, KeySource, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// use tower_layer::Layer;
/// use tower_service::Service;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_key = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", per_key).key(KeySource::header(HeaderName::from_static("x-api-key"))))
///     .on_missing_key(Fallback::Reject(StatusCode::BAD_REQUEST))
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

    /// The value of header `name` (e.g. `x-api-key`); missing when absent or empty. Of
    /// several lines of the header, the first counts.
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

    /// The request's path (without the query), normalised as policies match it (see
    /// [`normalized_path`](super::normalized_path)): `//a/./b` and `/a/%62` are the key `/a/b`.
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

    /// A key computed by `f` from the request's head; `None` means no key.
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

    /// The key of a request, or `None`; `path` is its normalised path.
    pub(crate) fn extract(&self, parts: &Parts, path: &str, addrs: &mut Addrs<'_>) -> Option<Key> {
        match &self.0 {
            Source::PeerIp => addrs.peer().map(|ip| Key::Ip(addrs.group(ip))),
            Source::ClientIp => addrs.client(parts).map(|ip| Key::Ip(addrs.group(ip))),
            Source::Header(name) => {
                let value = parts.headers.get(name)?.as_bytes();
                if value.is_empty() {
                    return None;
                }
                Some(match std::str::from_utf8(value) {
                    Ok(text) => Key::Text(text.into()),
                    Err(_) => Key::Bytes(value.into()),
                })
            }
            Source::Path => Some(Key::Text(path.into())),
            Source::Constant(key) => Some(key.clone()),
            Source::Fn(f) => f(parts),
            Source::Composite(sources) => sources
                .iter()
                .map(|source| source.extract(parts, path, addrs))
                .collect::<Option<Box<[Key]>>>()
                .map(Key::Composite),
        }
    }
}

/// Which forwarding header a trusted proxy writes.
///
/// # Examples
/// ```
/// use tollgate::tower::{ProxyHeader, RateLimitLayer};
/// assert_eq!(ProxyHeader::default(), ProxyHeader::XForwardedFor);
/// // A proxy that writes RFC 7239 `Forwarded: for=…` instead.
/// let layer = RateLimitLayer::builder()
///     .trusted_proxies(["10.0.0.0/8".parse()?])
///     .proxy_header(ProxyHeader::Forwarded)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1` (only the `for` parameter is read).
    Forwarded,
}

/// How the layer finds client addresses: trusted proxies, the header they write, the IPv6
/// grouping and how to read the peer address.
#[derive(Clone)]
pub(crate) struct AddrConfig {
    pub(crate) trusted: Vec<Cidr>,
    pub(crate) header: ProxyHeader,
    pub(crate) ipv6_prefix: u8,
}

/// The addresses of one request, worked out at most once each.
pub(crate) struct Addrs<'a> {
    config: &'a AddrConfig,
    peer: Option<Option<IpAddr>>,
    client: Option<Option<IpAddr>>,
}

impl<'a> Addrs<'a> {
    pub(crate) fn new(config: &'a AddrConfig) -> Self {
        Addrs {
            config,
            peer: None,
            client: None,
        }
    }

    /// Seeds the peer address (read from the request's extensions by the service).
    pub(crate) fn with_peer(mut self, peer: Option<IpAddr>) -> Self {
        self.peer = Some(peer.map(|ip| ip.to_canonical()));
        self
    }

    fn peer(&self) -> Option<IpAddr> {
        self.peer.flatten()
    }

    /// The client address (see [`client_ip`]): `None` without a peer address, or when the
    /// forwarding header leaves the client unknown.
    pub(crate) fn client(&mut self, parts: &Parts) -> Option<IpAddr> {
        if let Some(client) = self.client {
            return client;
        }
        let client = self
            .peer()
            .and_then(|peer| client_ip(peer, &parts.headers, self.config));
        self.client = Some(client);
        client
    }

    /// `ip` grouped: IPv4 as is, IPv6 to the configured prefix.
    fn group(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(_) => mask(ip, self.config.ipv6_prefix),
        }
    }
}

/// The peer address of a request: axum's `ConnectInfo<SocketAddr>` (feature `axum`), else a
/// plain `SocketAddr` extension.
pub(crate) fn peer_addr(parts: &Parts) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    parts.extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

/// The client address of a request from `peer`: `peer` itself unless it is a trusted proxy;
/// then the forwarding header is read right to left, hop by hop, and each hop taken while the
/// hop to its right was trusted: the first untrusted hop is the client. Only trusted hops up
/// to the header's start: the leftmost one (a request from inside the trusted networks).
/// Empty list elements are skipped (RFC 9110 §5.6.1).
///
/// A hop that is not an address (`unknown`, an obfuscated name, bytes that are not ASCII, an
/// unclosed quote), reached while every hop to its right is trusted, leaves the client
/// unknown: `None`, never the trusted address reached so far. Only a client can have written
/// such a hop, and its bytes must not key it as the proxy (which would put it in the proxy's
/// own bucket, or in an allow-listed network). A proxy that appends the address it saw
/// (nginx's `$proxy_add_x_forwarded_for`, `Forwarded: for=…`) puts a valid hop right of
/// anything the client wrote, so such a client is keyed by that hop.
///
/// A peer outside the trusted list has its forwarding headers ignored entirely, so a client
/// cannot choose its own key.
pub(crate) fn client_ip(peer: IpAddr, headers: &HeaderMap, config: &AddrConfig) -> Option<IpAddr> {
    let trusted = |ip: IpAddr| config.trusted.iter().any(|net| net.contains(ip));
    let mut client = peer.to_canonical();
    if !trusted(client) {
        return Some(client);
    }
    let name = match config.header {
        ProxyHeader::XForwardedFor => &X_FORWARDED_FOR,
        ProxyHeader::Forwarded => &FORWARDED,
    };
    // Later header lines were appended later: walk the lines backwards, and each line's hops
    // backwards. Bytes, not `to_str`: bytes a client wrote left of a hop do not spoil the hop.
    for line in headers.get_all(name).iter().rev() {
        let mut rest = Some(line.as_bytes());
        while let Some(hops) = rest {
            let (left, hop) = match config.header {
                ProxyHeader::XForwardedFor => last_element(hops, |_| false),
                ProxyHeader::Forwarded => last_element(hops, |b| b == b'"'),
            };
            rest = left;
            let hop = hop.trim_ascii();
            if hop.is_empty() {
                continue;
            }
            client = match config.header {
                ProxyHeader::XForwardedFor => parse_node(hop),
                ProxyHeader::Forwarded => std::str::from_utf8(hop)
                    .ok()
                    .and_then(forwarded_for)
                    .and_then(|node| parse_node(node.as_bytes())),
            }?;
            if !trusted(client) {
                return Some(client);
            }
        }
    }
    Some(client)
}

/// The last element of a comma-separated list, and what lies left of its comma (`None` when
/// it is the first). A comma between two bytes for which `quote` holds does not separate
/// (`Forwarded` quotes values): quotes are counted from the right, so an unclosed quote that
/// a client wrote never swallows an element appended after it.
fn last_element(list: &[u8], quote: impl Fn(u8) -> bool) -> (Option<&[u8]>, &[u8]) {
    let mut quoted = false;
    for (i, &b) in list.iter().enumerate().rev() {
        if quote(b) {
            quoted = !quoted;
        } else if b == b',' && !quoted {
            return (Some(&list[..i]), &list[i + 1..]);
        }
    }
    (None, list)
}

/// The `for` parameter of one RFC 7239 forwarded-element, unquoted (escapes removed only if
/// there are none to remove: a node never needs one, so a value with a backslash is refused).
fn forwarded_for(element: &str) -> Option<&str> {
    let mut found = None;
    for pair in split_unquoted(element, ';') {
        let (name, value) = pair.split_once('=')?;
        if name.trim().eq_ignore_ascii_case("for") {
            if found.is_some() {
                return None; // a parameter given twice: malformed
            }
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(rest) => rest.strip_suffix('"')?,
                None => value,
            };
            if value.contains(['"', '\\']) {
                return None;
            }
            found = Some(value);
        }
    }
    found
}

/// `s` split at every `sep` outside a double-quoted string (a backslash escapes the next
/// character inside one).
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// One hop's address: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`. Anything else (`unknown`, `_hidden`, garbage) is `None`.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    // IPv4 read in place; the rest by the standard parsers.
    if let Some(ip) = parse_ipv4(node) {
        return Some(IpAddr::V4(ip));
    }
    let node = std::str::from_utf8(node).ok()?;
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip().to_canonical());
    }
    let inner = node.strip_prefix('[')?.strip_suffix(']')?;
    inner
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

/// A dotted-quad IPv4 address exactly as `Ipv4Addr`'s parser accepts it (four decimal octets
/// of one to three digits, no leading zero, each at most 255), or `None` for anything else,
/// which the general parser then judges: the common hop in a fraction of its time.
fn parse_ipv4(text: &[u8]) -> Option<std::net::Ipv4Addr> {
    let (mut octets, mut at) = ([0u8; 4], 0);
    for (i, octet) in octets.iter_mut().enumerate() {
        if i > 0 {
            if text.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
        let (start, mut value) = (at, 0u16);
        while let Some(digit) = text.get(at).filter(|b| b.is_ascii_digit()) {
            if at - start == 3 {
                return None;
            }
            value = value * 10 + u16::from(digit - b'0');
            at += 1;
        }
        let digits = at - start;
        if digits == 0 || (digits > 1 && text[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(value).ok()?;
    }
    (at == text.len()).then(|| std::net::Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    /// The `X-Forwarded-For` walk on `str`s (lossy UTF-8, `rsplit`, `trim`): the byte walk of
    /// [`client_ip`] must agree with it on every header.
    fn client_ip_on_strs(peer: IpAddr, headers: &HeaderMap, config: &AddrConfig) -> Option<IpAddr> {
        let trusted = |ip: IpAddr| config.trusted.iter().any(|net| net.contains(ip));
        let mut client = peer.to_canonical();
        if !trusted(client) {
            return Some(client);
        }
        for line in headers.get_all(&X_FORWARDED_FOR).iter().rev() {
            let line = String::from_utf8_lossy(line.as_bytes());
            for hop in line.rsplit(',').map(str::trim_ascii) {
                if !hop.is_empty() {
                    client = parse_node(hop.as_bytes())?;
                    if !trusted(client) {
                        return Some(client);
                    }
                }
            }
        }
        Some(client)
    }

    #[test]
    fn the_forwarded_for_byte_walk_agrees_with_the_str_walk() {
        let pieces: [&[u8]; 16] = [
            b"10.0.0.1",
            b"10.0.0.2",
            b"192.0.2.7",
            b"2001:db8::1",
            b"[2001:db8::2]:443",
            b"10.0.0.3:80",
            b"unknown",
            b",",
            b", ",
            b" ",
            b"\t",
            b"",
            b"\xc3\xa9",
            b"\x7f",
            b"::ffff:10.0.0.4",
            b"1.2.3",
        ];
        let config = AddrConfig {
            trusted: vec![
                "10.0.0.0/8".parse().unwrap(),
                "2001:db8::/32".parse().unwrap(),
            ],
            header: ProxyHeader::XForwardedFor,
            ipv6_prefix: 56,
        };
        let peer = IpAddr::from([10, 9, 9, 9]);
        let mut state = 0x5EED_u64;
        let mut next = |n: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as usize % n
        };
        for _ in 0..20_000 {
            let mut headers = HeaderMap::new();
            for _ in 0..1 + next(3) {
                let line: Vec<u8> = (0..next(6))
                    .flat_map(|_| pieces[next(pieces.len())].iter().copied())
                    .collect();
                if let Ok(value) = http::HeaderValue::from_bytes(&line) {
                    headers.append(&X_FORWARDED_FOR, value);
                }
            }
            assert_eq!(
                client_ip(peer, &headers, &config),
                client_ip_on_strs(peer, &headers, &config),
                "{headers:?}"
            );
        }
    }

    #[test]
    fn the_ipv4_fast_path_agrees_with_the_standard_parser() {
        let mut cases: Vec<String> = [
            "0.0.0.0",
            "255.255.255.255",
            "256.1.1.1",
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1..2.3",
            "1.2.3.4 ",
            "+1.2.3.4",
            "1.2.3.-4",
            "1.2.3.4:80",
            "1.2.3.a",
            "",
            ".",
            "1.2.3.",
            "::1",
            "1.2.3.0004",
            "10.0.0.255",
            "99.99.99.99",
            "100.200.250.255",
            "٣.1.1.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every octet shape, in every position.
        for octet in [
            "0", "00", "1", "9", "10", "99", "100", "199", "249", "255", "256", "999", "1000",
        ] {
            for position in 0..4 {
                let mut quad = ["1", "2", "3", "4"];
                quad[position] = octet;
                cases.push(quad.join("."));
            }
        }
        // And random strings over the alphabet that matters.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 17) as usize;
            let case: String = (0..len)
                .map(|i| b"0123456789..1.2"[((seed >> (i * 4)) % 15) as usize] as char)
                .collect();
            cases.push(case);
        }
        for case in &cases {
            let std = case.parse::<std::net::Ipv4Addr>().ok();
            let fast = parse_ipv4(case.as_bytes());
            // The fast path may decline (the general parser then decides) but never differs.
            assert!(
                fast.is_none() || fast == std,
                "{case:?}: {fast:?} vs {std:?}"
            );
            assert_eq!(fast.is_some(), std.is_some(), "{case:?}");
        }
    }

    fn config(trusted: &[&str], header: ProxyHeader) -> AddrConfig {
        AddrConfig {
            trusted: trusted.iter().map(|s| s.parse().unwrap()).collect(),
            header,
            ipv6_prefix: 56,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, lines: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in lines {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(line).unwrap(),
            );
        }
        map
    }

    fn xff(peer: &str, trusted: &[&str], lines: &[&str]) -> Option<IpAddr> {
        let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        client_ip(
            ip(peer),
            &headers("x-forwarded-for", &lines),
            &config(trusted, ProxyHeader::XForwardedFor),
        )
    }

    fn fwd(peer: &str, trusted: &[&str], lines: &[&str]) -> Option<IpAddr> {
        let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        client_ip(
            ip(peer),
            &headers("forwarded", &lines),
            &config(trusted, ProxyHeader::Forwarded),
        )
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        assert_eq!(
            xff("198.51.100.9", &[], &["1.1.1.1"]),
            Some(ip("198.51.100.9"))
        );
        assert_eq!(
            xff("198.51.100.9", &["10.0.0.0/8"], &["1.1.1.1, 10.0.0.2"]),
            Some(ip("198.51.100.9"))
        );
        assert_eq!(
            fwd("198.51.100.9", &["10.0.0.0/8"], &["for=1.1.1.1"]),
            Some(ip("198.51.100.9"))
        );
    }

    #[test]
    fn a_trusted_chain_is_read_right_to_left_up_to_the_first_untrusted_hop() {
        let trusted = ["10.0.0.0/8", "127.0.0.1"];
        // The client put a fake address first; proxies appended the real client and themselves.
        assert_eq!(
            xff("127.0.0.1", &trusted, &["6.6.6.6, 203.0.113.7, 10.0.0.2"]),
            Some(ip("203.0.113.7"))
        );
        // Several header lines, later lines appended later.
        assert_eq!(
            xff(
                "127.0.0.1",
                &trusted,
                &["6.6.6.6, 203.0.113.7", "10.0.0.3, 10.0.0.2"]
            ),
            Some(ip("203.0.113.7"))
        );
        // Only trusted hops: the leftmost one reached.
        assert_eq!(
            xff("127.0.0.1", &trusted, &["10.0.0.3,10.0.0.2"]),
            Some(ip("10.0.0.3"))
        );
        // No header: the peer.
        assert_eq!(xff("127.0.0.1", &trusted, &[]), Some(ip("127.0.0.1")));
        // Ports and brackets.
        assert_eq!(
            xff("127.0.0.1", &trusted, &["[2001:db8::1]:443"]),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            xff("127.0.0.1", &trusted, &["203.0.113.7:8080"]),
            Some(ip("203.0.113.7"))
        );
        // A mapped peer is its IPv4 address.
        assert_eq!(
            xff("::ffff:127.0.0.1", &trusted, &["203.0.113.7"]),
            Some(ip("203.0.113.7"))
        );
    }

    /// A hop that is not an address, reached from a trusted one, leaves the client unknown:
    /// never the trusted address reached before it. Empty elements are skipped.
    #[test]
    fn an_unreadable_hop_leaves_the_client_unknown() {
        let trusted = ["10.0.0.0/8"];
        assert_eq!(
            xff("10.0.0.1", &trusted, &["203.0.113.7, garbage, 10.0.0.2"]),
            None
        );
        assert_eq!(xff("10.0.0.1", &trusted, &["unknown"]), None);
        assert_eq!(xff("10.0.0.1", &trusted, &[""]), Some(ip("10.0.0.1")));
        assert_eq!(xff("10.0.0.1", &trusted, &[",,,"]), Some(ip("10.0.0.1")));
        assert_eq!(
            xff("10.0.0.1", &trusted, &[" , 203.0.113.7,"]),
            Some(ip("203.0.113.7"))
        );
        assert_eq!(
            fwd("10.0.0.1", &trusted, &["for=unknown, for=10.0.0.2"]),
            None
        );
        assert_eq!(fwd("10.0.0.1", &trusted, &["for=_hidden"]), None);
    }

    /// What a client writes left of the hop its proxy appended never spoils that hop, and a
    /// malformed line from a proxy that appends nothing never keys the client as the proxy.
    #[test]
    fn bytes_a_client_wrote_never_key_it_as_the_proxy() {
        let trusted = ["10.0.0.0/8"];
        let peer = ip("10.0.0.1");
        let walk = |name: &str, header, lines: &[&[u8]]| {
            client_ip(peer, &headers(name, lines), &config(&trusted, header))
        };
        let xff = |lines: &[&[u8]]| walk("x-forwarded-for", ProxyHeader::XForwardedFor, lines);
        let fwd = |lines: &[&[u8]]| walk("forwarded", ProxyHeader::Forwarded, lines);
        let client = Some(ip("203.0.113.7"));
        // Appended by the proxy (`$proxy_add_x_forwarded_for`): the client's bytes, then its hop.
        assert_eq!(xff(&[b"\x80, 203.0.113.7"]), client);
        assert_eq!(xff(&[b"\xff\xfe, 10.0.0.2 , 203.0.113.7"]), client);
        assert_eq!(xff(&[b"\x80", b"203.0.113.7"]), client);
        assert_eq!(fwd(&[b"for=\"", b"for=203.0.113.7"]), client);
        assert_eq!(fwd(&[b"for=\", for=203.0.113.7"]), client);
        assert_eq!(fwd(&[b"for=\x80, for=203.0.113.7"]), client);
        assert_eq!(
            fwd(&[b"for=\"1.1.1.1, for=\"[2001:db8::7]:80\""]),
            Some(ip("2001:db8::7"))
        );
        // Passed through untouched: the client is unknown, not the proxy.
        assert_eq!(xff(&[b"\x80"]), None);
        assert_eq!(xff(&[b"1.1.1.1, \xff\xfe"]), None);
        assert_eq!(xff(&[b"10.0.0.2 junk"]), None);
        assert_eq!(fwd(&[b"for=\""]), None);
        assert_eq!(fwd(&[b"for=10.0.0.2, for=\""]), None);
        assert_eq!(fwd(&[b"for=\xc3\xa9"]), None);
    }

    #[test]
    fn forwarded_elements_params_and_quotes() {
        let trusted = ["10.0.0.0/8"];
        assert_eq!(
            fwd(
                "10.0.0.1",
                &trusted,
                &[
                    r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https;by=10.0.0.1, For=10.0.0.9"#
                ]
            ),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(
            fwd("10.0.0.1", &trusted, &["proto=http;for=192.0.2.60;by=x"]),
            Some(ip("192.0.2.60"))
        );
        // A comma inside quotes does not split elements; the quoted value is no address.
        assert_eq!(
            fwd("10.0.0.1", &trusted, &[r#"for="1.1.1.1, 2.2.2.2""#]),
            None
        );
        // An element without `for`, or with it twice, is not an address.
        assert_eq!(
            fwd("10.0.0.1", &trusted, &["for=1.1.1.1, proto=http"]),
            None
        );
        assert_eq!(
            fwd("10.0.0.1", &trusted, &["for=1.1.1.1;for=2.2.2.2"]),
            None
        );
    }

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
            source.extract(
                &parts,
                &crate::tower::normalized_path(parts.uri.path()),
                addrs,
            )
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
}
