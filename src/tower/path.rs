//! The path policies match and key on: the path the client sent (not what a router left of
//! it), as a server that decodes and normalises it would route it, so that neither where the
//! layer sits nor spelling a path another way changes which limit applies.

use std::borrow::Cow;

use http::request::Parts;

/// The path the client sent, normalised ([`normalized_path`]): what policies, path keys
/// ([`KeySource::path`](super::KeySource::path)) and a configuration's `allow_paths` and
/// `cost_by_path` match, wherever the layer sits.
///
/// A router that mounts routes under a prefix may strip it from the URI its routes see: axum's
/// `Router::nest("/api", …)` hands `/login` to the routes, and to any layer on them, for a
/// request of `/api/login`. With feature `axum`, the path is read from axum's
/// `OriginalUri` request extension (which axum's routers set before routing), else from the
/// request's URI: a policy on `/api/login` then covers that request whether the layer wraps the
/// whole application, the nested router, or its routes (`route_layer`). Without `axum`, the
/// URI is the path the server received. Use it in an
/// [`allow_if`](super::RateLimitLayerBuilder::allow_if) predicate or a key or cost function
/// so that they see the path the policies see.
///
/// # Examples
/// ```
/// use tollgate::tower::client_path;
/// let (parts, ()) = http::Request::get("//api/./health").body(())?.into_parts();
/// assert_eq!(client_path(&parts), "/api/health");
/// # Ok::<(), http::Error>(())
/// ```
/// axum keeps the path a nested router's routes no longer see:
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::extract::OriginalUri;
/// use tollgate::tower::client_path;
/// // What a layer inside `Router::nest("/api", …)` gets for `/api/login`.
/// let mut request = http::Request::post("/login").body(()).unwrap();
/// request.extensions_mut().insert(OriginalUri("/api/login".parse().unwrap()));
/// let (parts, ()) = request.into_parts();
/// assert_eq!(client_path(&parts), "/api/login");
/// # }
/// ```
pub fn client_path(parts: &Parts) -> Cow<'_, str> {
    normalized_path(sent_path(parts))
}

/// The path of the URI the client sent, as it is: axum's `OriginalUri` when a router set one
/// (feature `axum`), else the request's own.
fn sent_path(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return original.0.path();
    }
    parts.uri.path()
}

/// `path` normalised, as policies match it and [`KeySource::path`](super::KeySource::path)
/// keys it: percent-escapes decoded once (`%2F` is a `/`, `%61` an `a`), then empty
/// segments (`//`) and `.` segments dropped and `..` segments resolved (never above the
/// root); a trailing `/` is kept. A path that needs none of this (nearly every one) is
/// returned as it is, without a copy. Bytes that are not UTF-8 once decoded become U+FFFD.
///
/// Normalising can only make two spellings of one resource match alike: `/health/../api`
/// is `/api` (an allow-listed `/health` does not cover it), `//api`, `/./api` and `/%61pi`
/// are `/api`. Use it in an [`allow_if`](super::RateLimitLayerBuilder::allow_if) predicate
/// or a key function so that they see paths as the policies do.
///
/// # Examples
/// ```
/// use tollgate::tower::normalized_path;
/// assert_eq!(normalized_path("/health/../api/export"), "/api/export");
/// assert_eq!(normalized_path("//api/%2e%2E/v1/x"), "/v1/x");
/// assert_eq!(normalized_path("/api/"), "/api/");
/// ```
pub fn normalized_path(path: &str) -> Cow<'_, str> {
    if is_normal(path.as_bytes()) {
        return Cow::Borrowed(path);
    }
    let decoded = percent_decoded(path.as_bytes());
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    let ends_in_a_dir =
        decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    if out.is_empty() || (ends_in_a_dir && !segments.is_empty()) {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Whether `path` is already normal: starts with `/`, has no `%`, no empty segment (bar a
/// trailing `/`), and no `.` or `..` segment.
fn is_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') || path.contains(&b'%') {
        return false;
    }
    let body = &path[1..];
    let body = body.strip_suffix(b"/").unwrap_or(body);
    if body.is_empty() {
        return path.len() == 1;
    }
    body.split(|&b| b == b'/')
        .all(|segment| !matches!(segment, b"" | b"." | b".."))
}

/// `path` with every `%XX` escape (two hex digits) decoded; a `%` not followed by two hex
/// digits is kept as it is.
fn percent_decoded(path: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' {
            if let (Some(&h), Some(&l)) = (path.get(i + 1), path.get(i + 2)) {
                if let (Some(h), Some(l)) = (hex(h), hex(l)) {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(path[i]);
        i += 1;
    }
    out
}

/// Which paths a policy covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathMatch {
    Any,
    /// Whole segments: `/api` covers `/api`, `/api/` and `/api/x`, not `/apix`.
    Prefix(String),
    /// Segments; `*` is any one segment, a final `**` any rest (including none).
    Pattern(Vec<String>),
}

impl PathMatch {
    pub(crate) fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Any => true,
            PathMatch::Prefix(prefix) => match path.strip_prefix(prefix.as_str()) {
                None => false,
                Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
            },
            PathMatch::Pattern(pattern) => {
                let mut segments = path.split('/');
                for (i, want) in pattern.iter().enumerate() {
                    if want == "**" && i + 1 == pattern.len() {
                        return true;
                    }
                    match segments.next() {
                        Some(seg) if want == "*" || want == seg => {}
                        _ => return false,
                    }
                }
                segments.next().is_none()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_path_normalise_alike() {
        for (raw, normal) in [
            ("/api/x", "/api/x"),
            ("/", "/"),
            ("/api/", "/api/"),
            ("//api/x", "/api/x"),
            ("/api//x", "/api/x"),
            ("/./api/x", "/api/x"),
            ("/health/../api/export", "/api/export"),
            ("/../../api", "/api"),
            ("/api/x/..", "/api/"),
            ("/api/x/.", "/api/x/"),
            ("/api%2Fexport", "/api/export"),
            ("/api%2fexport", "/api/export"),
            ("/%61pi", "/api"),
            ("/health%2F..%2Fapi", "/api"),
            ("/a%zz", "/a%zz"),
            ("/a%", "/a%"),
            ("/a%C3%A9", "/aé"),
            ("/a%FF", "/a\u{FFFD}"),
            ("", "/"),
            ("api", "/api"),
            ("/..", "/"),
            ("/.hidden/..x", "/.hidden/..x"),
        ] {
            assert_eq!(normalized_path(raw), normal, "{raw}");
        }
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        for path in [
            "/",
            "/api",
            "/api/",
            "/api/x.json",
            "/.well-known/x",
            "/a..b",
        ] {
            assert!(matches!(normalized_path(path), Cow::Borrowed(_)), "{path}");
        }
        for path in ["//", "/a//b", "/a/./b", "/a/%41", "x", "/a/.."] {
            assert!(matches!(normalized_path(path), Cow::Owned(_)), "{path}");
        }
    }
}
