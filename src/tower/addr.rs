//! Client addresses: the peer's, and through trusted proxies the client's, read from the
//! forwarding header hop by hop from the right (bytes a client wrote never pick its key).

use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use http::HeaderMap;

use super::cidr::{mask, Cidr};

/// The de facto proxy header, by a name built once (a `&str` name is parsed on every lookup).
pub(super) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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

impl AddrConfig {
    /// The forwarding header read from a trusted proxy's requests.
    pub(crate) fn forwarding_header(&self) -> &'static HeaderName {
        match self.header {
            ProxyHeader::XForwardedFor => &X_FORWARDED_FOR,
            ProxyHeader::Forwarded => &FORWARDED,
        }
    }
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

    pub(super) fn peer(&self) -> Option<IpAddr> {
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
    pub(super) fn group(&self, ip: IpAddr) -> IpAddr {
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
    let name = config.forwarding_header();
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
pub(super) mod tests {
    use http::HeaderName;

    use super::*;

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

    /// An address configuration for tests (also `key.rs`'s): IPv6 grouped to /56.
    pub(in crate::tower) fn config(trusted: &[&str], header: ProxyHeader) -> AddrConfig {
        AddrConfig {
            trusted: trusted.iter().map(|s| s.parse().unwrap()).collect(),
            header,
            ipv6_prefix: 56,
        }
    }

    pub(in crate::tower) fn ip(s: &str) -> IpAddr {
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
}
