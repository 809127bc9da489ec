//! Between actix-web's `http` 0.2 types and the layer's `http` 1 types, by bytes: a request's
//! head as the layer reads it, and the layer's answers and fields as actix-web sends them.

use std::cell::RefCell;

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::http::{StatusCode, Version};
use actix_web::HttpResponse;
use http::request::Parts;

use crate::tower::{RateLimitBody, RateLimitLayer};

/// Which of a request's header fields the middleware copies for the layer.
pub(super) enum Copied {
    /// Every field: a closure of the layer may read any of them.
    All,
    /// Only the fields the layer reads (what the layer says it reads), by actix-web's name and
    /// the layer's.
    Only(Box<[(HeaderName, http::HeaderName)]>),
}

impl Copied {
    /// What to copy for `layer`'s policies.
    pub(super) fn of(layer: &RateLimitLayer) -> Self {
        match layer.shared.read_headers() {
            None => Copied::All,
            Some(names) => Copied::Only(
                names
                    .into_iter()
                    // (Every `http` 1 name is one of `http` 0.2.)
                    .filter_map(|name| {
                        let theirs = HeaderName::from_bytes(name.as_str().as_bytes()).ok()?;
                        Some((theirs, name))
                    })
                    .collect(),
            ),
        }
    }
}

/// The head of `request` as the layer reads it: method, URI (path and query), version, and
/// the header fields `copied` says. With [`Copied::All`] (a closure may read the head) also
/// the peer's address as a `SocketAddr` extension; otherwise nothing reads extensions, and
/// the peer's address goes to the layer beside the head.
/// Nothing else of actix-web's request (its extensions, its match info) is carried over.
pub(super) fn parts(request: &ServiceRequest, copied: &Copied, scratch: &Scratch) -> Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    // Both crates accept the same method tokens: the fallback is never taken.
    parts.method =
        http::Method::from_bytes(request.method().as_str().as_bytes()).unwrap_or(http::Method::GET);
    parts.uri = scratch.uri(request.uri().path_and_query().map_or("/", |pq| pq.as_str()));
    parts.version = match request.version() {
        Version::HTTP_09 => http::Version::HTTP_09,
        Version::HTTP_10 => http::Version::HTTP_10,
        Version::HTTP_2 => http::Version::HTTP_2,
        Version::HTTP_3 => http::Version::HTTP_3,
        _ => http::Version::HTTP_11,
    };
    let headers = request.headers();
    match copied {
        Copied::All => {
            let mut map = http::HeaderMap::with_capacity(headers.len());
            for (name, value) in headers {
                let name = http::HeaderName::from_bytes(name.as_str().as_bytes());
                let value = http::HeaderValue::from_bytes(value.as_bytes());
                if let (Ok(name), Ok(value)) = (name, value) {
                    // (actix-web's parser bounds a request's fields far below the map's limit.)
                    let _ = map.try_append(name, value);
                }
            }
            parts.headers = map;
            if let Some(peer) = request.peer_addr() {
                parts.extensions.insert(peer);
            }
        }
        Copied::Only(names) => {
            // (An empty map does not allocate; the fields keep their order within a name.)
            for (theirs, ours) in names.iter() {
                for value in headers.get_all(theirs) {
                    if let Ok(value) = http::HeaderValue::from_bytes(value.as_bytes()) {
                        let _ = parts.headers.try_append(ours.clone(), value);
                    }
                }
            }
        }
    }
    parts
}

/// `path_and_query` as an `http` 1 URI. A path that crate would refuse (`http` 0.2 is more
/// lenient with a few bytes) is percent-escaped instead, which the layer's path
/// normalisation decodes again: the policies see the path the client sent, never a
/// substitute that a limit on it would miss.
fn uri(path_and_query: &str) -> http::Uri {
    if let Ok(uri) = http::Uri::try_from(path_and_query) {
        return uri;
    }
    let mut escaped = String::with_capacity(path_and_query.len() * 3);
    for b in path_and_query.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b) {
            escaped.push(char::from(b));
        } else {
            escaped.push('%');
            escaped.push(char::from(HEX[usize::from(b >> 4)]));
            escaped.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    if !escaped.starts_with('/') {
        escaped.insert(0, '/');
    }
    http::Uri::try_from(escaped).unwrap_or_else(|_| http::Uri::from_static("/"))
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The names the layer writes, made once (a name of `http` 0.2 made from bytes outside its
/// standard set is an allocation).
static NAMES: [HeaderName; 7] = [
    HeaderName::from_static("ratelimit"),
    HeaderName::from_static("ratelimit-policy"),
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
    HeaderName::from_static("grpc-status"),
    HeaderName::from_static("grpc-message"),
];

/// What one worker's middleware keeps between responses: the map the layer writes an admitted
/// response's fields into (emptied, its room kept), and for each of [`NAMES`] the last value
/// converted (a policy's `RateLimit-Policy` is the same on each of its responses: a copy of a
/// reference, not an allocation). Never borrowed across a call out: a borrow that fails
/// (it cannot) would only cost the conversion without them.
pub(super) struct Scratch {
    /// The last request's URI (a request for the same path and query shares it).
    uri: RefCell<Option<http::Uri>>,
    fields: RefCell<http::HeaderMap>,
    values: RefCell<[Option<(http::HeaderValue, HeaderValue)>; NAMES.len()]>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            uri: RefCell::new(None),
            fields: RefCell::new(http::HeaderMap::new()),
            values: RefCell::new(std::array::from_fn(|_| None)),
        }
    }
}

impl Scratch {
    /// [`uri`] of `path_and_query`: the last one's when it is for the same bytes.
    fn uri(&self, path_and_query: &str) -> http::Uri {
        let Ok(mut last) = self.uri.try_borrow_mut() else {
            return uri(path_and_query);
        };
        if let Some(last) = last.as_ref() {
            if last.path_and_query().map(|pq| pq.as_str()) == Some(path_and_query) {
                return last.clone();
            }
        }
        let made = uri(path_and_query);
        *last = Some(made.clone());
        made
    }

    /// An empty map for the layer's fields (the last response's, its room kept).
    pub(super) fn fields(&self) -> http::HeaderMap {
        self.fields
            .try_borrow_mut()
            .map(|mut fields| std::mem::take(&mut *fields))
            .unwrap_or_default()
    }

    /// `fields` back, emptied, for the next response.
    fn keep(&self, mut fields: http::HeaderMap) {
        fields.clear();
        if let Ok(mut kept) = self.fields.try_borrow_mut() {
            *kept = fields;
        }
    }
}

/// Each field of `from` into `to`: replacing `to`'s values of its name (`replace`) or added to
/// them. `from` is handed back to `scratch`, emptied.
pub(super) fn copy_headers(
    mut from: http::HeaderMap,
    to: &mut HeaderMap,
    replace: bool,
    scratch: &Scratch,
) {
    let mut values = scratch.values.try_borrow_mut().ok();
    // (`drain` names a field's first value only.)
    let mut field: Option<(Option<usize>, Option<HeaderName>)> = None;
    for (name, value) in from.drain() {
        if let Some(name) = name {
            let text = name.as_str();
            field = Some(
                match NAMES.iter().position(|known| known.as_str() == text) {
                    Some(i) => (Some(i), Some(NAMES[i].clone())),
                    None => (None, HeaderName::from_bytes(text.as_bytes()).ok()),
                },
            );
        }
        let Some((known, Some(name))) = &field else {
            continue;
        };
        let cached = known.and_then(|i| values.as_deref_mut()?.get_mut(i));
        let value = match cached {
            Some(Some((mine, theirs))) if *mine == value => theirs.clone(),
            Some(slot) => {
                let Ok(theirs) = HeaderValue::from_bytes(value.as_bytes()) else {
                    continue;
                };
                *slot = Some((value, theirs.clone()));
                theirs
            }
            None => match HeaderValue::from_bytes(value.as_bytes()) {
                Ok(theirs) => theirs,
                Err(_) => continue,
            },
        };
        if replace {
            to.insert(name.clone(), value);
        } else {
            to.append(name.clone(), value);
        }
    }
    drop(values);
    scratch.keep(from);
}

/// The layer's own answer to `request` (a denial, a rejection) as actix-web's response.
pub(super) fn respond<B>(
    request: ServiceRequest,
    response: http::Response<RateLimitBody<B>>,
    scratch: &Scratch,
) -> ServiceResponse<RateLimitBody<B>> {
    let (head, body) = response.into_parts();
    // The layer answers only statuses both crates know (4xx, 5xx, a gRPC 200).
    let status =
        StatusCode::from_u16(head.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, body);
    copy_headers(head.headers, response.headers_mut(), false, scratch);
    let (request, _) = request.into_parts();
    ServiceResponse::new(request, response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_http_1_refuses_is_escaped_not_replaced() {
        assert_eq!(uri("/api/x?q=1").to_string(), "/api/x?q=1");
        // `http` 1 refuses this byte in a path; escaped, it decodes back to the same path.
        let odd = uri("/api/\u{7f}x");
        assert_eq!(odd.path(), "/api/%7Fx");
        assert_eq!(crate::tower::normalized_path(odd.path()), "/api/\u{7f}x");
    }

    #[test]
    fn the_last_uri_is_shared_only_for_the_same_bytes() {
        let scratch = Scratch::default();
        for sent in [
            "/a?x=1",
            "/a?x=1",
            "/a",
            "/a?x=2",
            "/api/\u{7f}x",
            "/api/\u{7f}x",
            "/a",
        ] {
            assert_eq!(scratch.uri(sent), uri(sent), "{sent}");
        }
    }

    #[test]
    fn only_the_fields_the_policies_read_are_copied_unless_a_closure_reads() {
        use crate::tower::{KeySource, Policy};
        use crate::{Gcra, KeyedLimiter, Quota};
        let policy = |key| {
            let rule = Gcra::new(Quota::per_second(1).unwrap()).unwrap();
            Policy::new("p", KeyedLimiter::<crate::tower::Key, _>::new(rule)).key(key)
        };
        let api_key = http::HeaderName::from_static("x-api-key");
        let layer = RateLimitLayer::builder()
            .policy(policy(KeySource::header(api_key.clone())))
            .policy(policy(KeySource::client_ip()).path_prefix("/b/"))
            .trusted_proxies(["127.0.0.1".parse().unwrap()])
            .build()
            .unwrap();
        let Copied::Only(names) = Copied::of(&layer) else {
            panic!("no closure reads the head");
        };
        let names: Vec<_> = names.iter().map(|(theirs, _)| theirs.as_str()).collect();
        assert_eq!(names, ["content-type", "x-forwarded-for", "x-api-key"]);
        let layer = RateLimitLayer::builder()
            .policy(policy(KeySource::from_fn(|_| None)))
            .build()
            .unwrap();
        assert!(matches!(Copied::of(&layer), Copied::All));
        let layer = RateLimitLayer::builder()
            .policy(policy(KeySource::peer_ip()).cost_fn(|_| 1))
            .build()
            .unwrap();
        assert!(matches!(Copied::of(&layer), Copied::All));
        let layer = (RateLimitLayer::builder().policy(policy(KeySource::peer_ip())))
            .allow_if(|_| false)
            .build()
            .unwrap();
        assert!(matches!(Copied::of(&layer), Copied::All));
    }

    #[test]
    fn fields_convert_without_loss_and_cached_values_stay_right() {
        let scratch = Scratch::default();
        for round in 0..3 {
            let mut from = scratch.fields();
            for known in &NAMES {
                let mine = http::HeaderName::from_bytes(known.as_str().as_bytes()).unwrap();
                let value = if known == "ratelimit" {
                    format!("r={round}")
                } else {
                    "1".into()
                };
                from.append(mine, http::HeaderValue::from_str(&value).unwrap());
            }
            from.append("x-custom", http::HeaderValue::from_static("a"));
            from.append("x-custom", http::HeaderValue::from_static("b"));
            let mut to = HeaderMap::new();
            to.insert(NAMES[1].clone(), HeaderValue::from_static("app's"));
            copy_headers(from, &mut to, round != 1, &scratch);
            for known in &NAMES[2..] {
                assert_eq!(to.get(known).unwrap(), "1");
            }
            assert_eq!(to.get("ratelimit").unwrap(), format!("r={round}").as_str());
            let policy: Vec<_> = to.get_all("ratelimit-policy").collect();
            let custom: Vec<_> = to.get_all("x-custom").collect();
            if round == 1 {
                assert_eq!(policy, ["app's", "1"]);
                assert_eq!(custom, ["a", "b"]);
            } else {
                assert_eq!(policy, ["1"]);
                assert_eq!(custom, ["b"]); // (replacing: the last one stays, as before)
            }
        }
    }
}
