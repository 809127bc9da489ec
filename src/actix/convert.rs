//! Between actix-web's `http` 0.2 types and the layer's `http` 1 types, by bytes: a request's
//! head as the layer reads it, and the layer's answers and fields as actix-web sends them.

use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::http::{StatusCode, Version};
use actix_web::HttpResponse;
use http::request::Parts;

use crate::tower::RateLimitBody;

/// The head of `request` as the layer reads it: method, URI (path and query), version,
/// headers, and the peer's address as a `SocketAddr` extension (where the layer looks for it).
/// Nothing else of actix-web's request (its extensions, its match info) is carried over.
pub(super) fn parts(request: &ServiceRequest) -> Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    // Both crates accept the same method tokens: the fallback is never taken.
    parts.method =
        http::Method::from_bytes(request.method().as_str().as_bytes()).unwrap_or(http::Method::GET);
    parts.uri = uri(request.uri().path_and_query().map_or("/", |pq| pq.as_str()));
    parts.version = match request.version() {
        Version::HTTP_09 => http::Version::HTTP_09,
        Version::HTTP_10 => http::Version::HTTP_10,
        Version::HTTP_2 => http::Version::HTTP_2,
        Version::HTTP_3 => http::Version::HTTP_3,
        _ => http::Version::HTTP_11,
    };
    let headers = request.headers();
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

fn name(name: &http::HeaderName) -> Option<HeaderName> {
    let text = name.as_str();
    match NAMES.iter().find(|known| known.as_str() == text) {
        Some(known) => Some(known.clone()),
        None => HeaderName::from_bytes(text.as_bytes()).ok(),
    }
}

/// Each field of `from` into `to`: replacing `to`'s values of its name (`replace`) or added to
/// them.
pub(super) fn copy_headers(from: &http::HeaderMap, to: &mut HeaderMap, replace: bool) {
    for (field, value) in from {
        let (Some(field), Ok(value)) = (name(field), HeaderValue::from_bytes(value.as_bytes()))
        else {
            continue;
        };
        if replace {
            to.insert(field, value);
        } else {
            to.append(field, value);
        }
    }
}

/// The layer's own answer to `request` (a denial, a rejection) as actix-web's response.
pub(super) fn respond<B>(
    request: ServiceRequest,
    response: http::Response<RateLimitBody<B>>,
) -> ServiceResponse<RateLimitBody<B>> {
    let (head, body) = response.into_parts();
    // The layer answers only statuses both crates know (4xx, 5xx, a gRPC 200).
    let status =
        StatusCode::from_u16(head.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, body);
    copy_headers(&head.headers, response.headers_mut(), false);
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
    fn the_layers_names_convert_without_loss() {
        for known in &NAMES {
            let mine = http::HeaderName::from_bytes(known.as_str().as_bytes()).unwrap();
            assert_eq!(name(&mine).as_ref(), Some(known));
        }
        let other = http::HeaderName::from_static("x-custom");
        assert_eq!(name(&other).unwrap().as_str(), "x-custom");
    }
}
