//! Rate-limit headers, the 429 / gRPC denial, and the layer's response body.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Method, Response, StatusCode};

use super::backend::{CheckBackend, Verdict};
use super::body::RateLimitBody;
use super::policy::Policy;
use crate::Decision;

/// Which rate-limit header fields the layer adds to every response a policy decided
/// (allowed, denied, or passed in shadow mode).
///
/// Every number is taken from the [`Decision`]: `limit()` and `remaining()` as they are, and
/// durations in whole seconds **rounded up** (a client that waits that long is never early).
/// On a denial, `Retry-After` is always sent, whatever the style, and is at least 1.
///
/// | style | fields |
/// |---|---|
/// | `None` | none (`Retry-After` on denials only) |
/// | `Legacy` | `X-RateLimit-Limit: L`, `X-RateLimit-Remaining: r`, `X-RateLimit-Reset: ⌈reset_after⌉` (seconds from now) |
/// | `Draft` | `RateLimit-Policy: "name";q=L;w=⌈W⌉` (one item per quota), `RateLimit: "name";r=r;t=⌈reset_after⌉` (the IETF draft draft-ietf-httpapi-ratelimit-headers) |
/// | `Both` | `Legacy` and `Draft` |
///
/// A policy with several quotas names them `name-1`, `name-2`, … in `RateLimit-Policy`;
/// `RateLimit` and the legacy fields report the quota the decision is about (the refusing
/// one, or when admitted the one with the fewest units remaining).
///
/// # Examples
/// A request through a layer with the legacy fields (the client's address is a plain
/// `SocketAddr` extension here; a server sets it):
/// ```
/// use axum::{body::Body, routing::get, Router};
/// use http::{Request, StatusCode};
/// use tollgate::tower::{HeaderStyle, Key, Policy, RateLimitLayer};
/// use tollgate::{FixedWindow, KeyedLimiter, Quota};
/// use tower_layer::Layer;
/// use tower_service::Service;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_ip = KeyedLimiter::<Key, _>::new(FixedWindow::new(Quota::per_minute(100)?)?);
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::new("api", per_ip))
///     .headers(HeaderStyle::Legacy)
///     .build()?;
/// let mut app = layer.layer(Router::new().route("/", get(|| async { "ok" })));
/// let mut request = Request::get("/").body(Body::empty())?;
/// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
/// std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx)).await?;
/// let response = app.call(request).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// // 100 a minute, one spent.
/// assert_eq!(response.headers()["x-ratelimit-limit"], "100");
/// assert_eq!(response.headers()["x-ratelimit-remaining"], "99");
/// assert!(!response.headers().contains_key("ratelimit")); // the draft's fields: not asked for
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// No rate-limit fields.
    None,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    Legacy,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` (the default).
    #[default]
    Draft,
    /// Both sets.
    Both,
}

static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `d` in whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `Retry-After` of a denial: whole seconds rounded up, at least 1.
pub(crate) fn retry_after_secs(decision: &Decision) -> u64 {
    ceil_secs(decision.retry_after()).max(1)
}

/// `n` as a header value. Below [`STATIC_NUMBERS`] (most limits, remainders and resets) a
/// view of one string made once and kept for the program's life: no allocation and no
/// reference count per response (a value of its own costs a heap allocation and, often on
/// another thread, its free: measured under load, the legacy fields' three values cost more
/// than the decision).
fn number(n: u64) -> HeaderValue {
    static NUMBERS: std::sync::LazyLock<Box<[HeaderValue]>> = std::sync::LazyLock::new(|| {
        let mut text = String::new();
        let ends: Vec<usize> = (0..STATIC_NUMBERS)
            .map(|n| {
                push_decimal(&mut text, n);
                text.len()
            })
            .collect();
        // Once per process, about 3 KB.
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    match usize::try_from(n).ok().and_then(|i| NUMBERS.get(i)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}

/// Whether `bytes` are all visible ASCII or tabs: what `HeaderValue::to_str` reads and
/// `HeaderValue::from_static` takes.
pub(crate) fn is_visible_ascii(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// The detail of a denial's problem document: `Rate limit "api" exceeded: retry after 3 s.`
pub(crate) fn denial_detail(policy: &str, retry_after_secs: u64) -> String {
    let mut detail = String::with_capacity(48 + policy.len());
    detail.push_str("Rate limit \"");
    detail.push_str(policy);
    detail.push_str("\" exceeded: retry after ");
    push_decimal(&mut detail, retry_after_secs);
    detail.push_str(" s.");
    detail
}

/// The problem document of a denial by `policy`: what [`problem`] writes for status 429, the
/// [`denial_detail`] and `Retry-After`, with the detail written into the body (no string of
/// its own, no escaping of its constant parts).
pub(crate) fn denial_problem(policy: &str, retry_after_secs: u64) -> Bytes {
    problem_with(
        StatusCode::TOO_MANY_REQUESTS,
        Some(retry_after_secs),
        48 + policy.len(),
        |body| {
            body.push_str(r#"Rate limit \""#);
            json_escape(body, policy);
            body.push_str(r#"\" exceeded: retry after "#);
            push_decimal(body, retry_after_secs);
            body.push_str(" s.");
        },
    )
}

/// The numbers [`number`] keeps made.
const STATIC_NUMBERS: u64 = 1000;

/// Appends `n` in decimal: on every response, where `core::fmt` costs more than the digits.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// The name of quota `index` of a policy with `count` quotas.
fn quota_name(out: &mut String, policy: &str, index: usize, count: usize) {
    out.push('"');
    // Policy names are checked to be printable ASCII when the layer is built; escape the two
    // characters a structured-field string escapes.
    for c in policy.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    if count > 1 {
        out.push('-');
        push_decimal(out, index as u64 + 1);
    }
    out.push('"');
}

/// Adds the rate-limit fields of `style` for `verdict` of `policy`.
pub(crate) fn add_headers(
    headers: &mut HeaderMap,
    style: HeaderStyle,
    policy: &Policy,
    verdict: &Verdict,
) {
    let decision = &verdict.decision;
    let reset = ceil_secs(decision.reset_after());
    // Room for every field at once: the map grows once, not once per field. (A map at
    // `http`'s size limit takes no more fields: they are left out rather than a panic.)
    let _ = headers.try_reserve(match style {
        HeaderStyle::None => 0,
        HeaderStyle::Legacy => 3,
        HeaderStyle::Draft => 2,
        HeaderStyle::Both => 5,
    });
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let _ = headers.try_insert(X_LIMIT.clone(), number(decision.limit()));
        let _ = headers.try_insert(X_REMAINING.clone(), number(decision.remaining()));
        let _ = headers.try_insert(X_RESET.clone(), number(reset));
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        let name = policy.name();
        let backend = policy.backend.as_ref();
        let count = backend.quota_count().max(verdict.quota + 1);
        let Some(policy_field) = policy_field(policy, backend, count, decision, reset) else {
            return;
        };
        let mut current = String::with_capacity(name.len() + 48);
        quota_name(&mut current, name, verdict.quota, count);
        current.push_str(";r=");
        push_decimal(&mut current, decision.remaining());
        current.push_str(";t=");
        push_decimal(&mut current, reset);
        // Hands the string's buffer over: no copy.
        if let Ok(current) = HeaderValue::from_maybe_shared(Bytes::from(current)) {
            let _ = headers.try_insert(RATELIMIT_POLICY.clone(), policy_field);
            let _ = headers.try_insert(RATELIMIT.clone(), current);
        }
    }
}

/// The `RateLimit-Policy` value of `policy` (`count` quotas): the cached one while the
/// backend's quotas are those it was built from, else built (and cached when every quota is
/// known).
fn policy_field(
    policy: &Policy,
    backend: &dyn CheckBackend,
    count: usize,
    decision: &Decision,
    reset: u64,
) -> Option<HeaderValue> {
    let cache = &policy.policy_header.value;
    {
        // (Its own scope: the read guard is gone before the write below.) A poisoned lock
        // still holds a whole value: a writer only ever stores one.
        let read = cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((quotas, value)) = read.as_ref() {
            if quotas.len() == count
                && quotas
                    .iter()
                    .enumerate()
                    .all(|(i, q)| backend.quota(i).as_ref() == Some(q))
            {
                return Some(value.clone());
            }
        }
    }
    let name = policy.name();
    let mut field = String::new();
    let mut quotas = Vec::with_capacity(count);
    for index in 0..count {
        if !field.is_empty() {
            field.push_str(", ");
        }
        quota_name(&mut field, name, index, count);
        let (q, w) = match backend.quota(index) {
            Some(info) => {
                quotas.push(info);
                (info.limit, ceil_secs(info.window))
            }
            // Only the decision's own quota can be missing (a backend that reports fewer
            // quotas than it decides over): its limit is known, its window is not.
            None => (decision.limit(), reset),
        };
        let _ = write!(field, ";q={q};w={w}");
    }
    if quotas.len() < count {
        // Built from this decision (a quota the backend does not report): not cached.
        return HeaderValue::from_maybe_shared(Bytes::from(field)).ok();
    }
    // Kept for the program's life where it can be (see `interned`): a clone of a static value
    // writes no reference count, so responses on every thread share nothing. (Visible ASCII,
    // what `from_static` takes: policy names are checked to be printable ASCII when built.)
    if !is_visible_ascii(field.as_bytes()) {
        return None;
    }
    let value = match interned(&field) {
        Some(kept) => HeaderValue::from_static(kept),
        None => HeaderValue::from_maybe_shared(Bytes::from(field)).ok()?,
    };
    let mut write = cache
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *write = Some((quotas, value.clone()));
    Some(value)
}

/// `text`, kept once for the program's life: one copy per distinct `RateLimit-Policy` value the
/// process builds (a value depends only on a policy's name and quotas, so there are as many as
/// configurations, not requests), and at most [`INTERNED`] of them: a process that keeps
/// changing its quotas gets `None` past that (a value of its own, reference-counted).
fn interned(text: &str) -> Option<&'static str> {
    static KEPT: std::sync::Mutex<std::collections::BTreeSet<&'static str>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    // A poisoned set is still a set of whole strings.
    let mut kept = KEPT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&known) = kept.get(text) {
        return Some(known);
    }
    if kept.len() >= INTERNED {
        return None;
    }
    let text: &'static str = Box::leak(Box::from(text));
    kept.insert(text);
    Some(text)
}

/// How many `RateLimit-Policy` values [`interned`] keeps at most (a few hundred KB).
const INTERNED: usize = 4096;

/// What a user-supplied denial response is built from (see
/// [`RateLimitLayerBuilder::deny_with`](super::RateLimitLayerBuilder::deny_with)).
///
/// # Examples
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use tollgate::tower::Denial;
/// use tollgate::{Gcra, Limiter, Quota};
/// fn plain(denial: Denial<'_>) -> Response<Bytes> {
///     let text = format!("{}: {} left, retry in {} s\n", denial.policy, denial.decision.remaining(), denial.retry_after_secs);
///     Response::builder().status(StatusCode::TOO_MANY_REQUESTS).body(Bytes::from(text)).unwrap()
/// }
/// // A real refusal to feed it: the second request of a 1-per-minute limit.
/// let limiter = Limiter::new(Gcra::new(Quota::per_minute(1)?)?);
/// limiter.check();
/// let decision = limiter.check();
/// let denial = Denial { policy: "api", decision: &decision, retry_after_secs: 60, grpc: false };
/// assert_eq!(plain(denial).body(), "api: 0 left, retry in 60 s\n");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Denial<'a> {
    /// The refusing policy's name.
    pub policy: &'a str,
    /// The refusing decision.
    pub decision: &'a Decision,
    /// `Retry-After` in whole seconds (rounded up, at least 1): the layer sets this header on
    /// the response afterwards, with the rate-limit fields.
    pub retry_after_secs: u64,
    /// Whether the request is gRPC (`content-type: application/grpc…`).
    pub grpc: bool,
}

/// JSON string contents for `s`: runs without anything to escape are copied whole (a denial's
/// detail is one or two runs around a quoted policy name).
fn json_escape(out: &mut String, s: &str) {
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0..=0x1f => "\\u00",
            _ => continue,
        };
        // (`i` is at an ASCII byte: a character boundary.)
        out.push_str(s.get(run..i).unwrap_or_default());
        out.push_str(escape);
        if b < 0x20 {
            for nibble in [b >> 4, b & 0xf] {
                out.push(char::from(b"0123456789abcdef"[usize::from(nibble)]));
            }
        }
        run = i + 1;
    }
    out.push_str(s.get(run..).unwrap_or_default());
}

/// An RFC 9457 problem document.
pub(crate) fn problem(status: StatusCode, detail: &str, retry_after: Option<u64>) -> Bytes {
    problem_with(status, retry_after, detail.len(), |body| {
        json_escape(body, detail)
    })
}

/// An RFC 9457 problem document whose detail `write_detail` writes, already escaped (about
/// `detail_len` bytes). Written piece by piece, not with `core::fmt`: a denial's cost is
/// mostly its body (benches/README.md).
fn problem_with(
    status: StatusCode,
    retry_after: Option<u64>,
    detail_len: usize,
    write_detail: impl FnOnce(&mut String),
) -> Bytes {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut body = String::with_capacity(96 + title.len() + detail_len);
    body.push_str(r#"{"type":"about:blank","title":""#);
    // (A canonical reason phrase has nothing to escape: `reason_phrases_need_no_escape`.)
    body.push_str(title);
    body.push_str(r#"","status":"#);
    push_decimal(&mut body, u64::from(status.as_u16()));
    body.push_str(r#","detail":""#);
    write_detail(&mut body);
    body.push('"');
    if let Some(secs) = retry_after {
        body.push_str(r#","retry-after":"#);
        push_decimal(&mut body, secs);
    }
    body.push('}');
    Bytes::from(body)
}

static PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");
static GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// A response whose body is `body`, typed `application/problem+json`.
pub(crate) fn problem_response<B>(status: StatusCode, body: Bytes) -> Response<RateLimitBody<B>> {
    let mut response = Response::new(RateLimitBody::full(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    never_cached(headers);
    response
}

/// Marks a refusal of the layer's `no-store` (unless it says otherwise): it answers one
/// client at one moment, and a cache that kept it would refuse others, or keep a 200-status
/// gRPC refusal out of sight of monitoring.
pub(crate) fn never_cached(headers: &mut HeaderMap) {
    headers
        .entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

/// A gRPC "trailers-only" answer: HTTP 200, `grpc-status` and `grpc-message`, no body.
pub(crate) fn grpc_response<B>(code: u8, message: &str) -> Response<RateLimitBody<B>> {
    let mut response = Response::new(RateLimitBody::full(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, GRPC.clone());
    never_cached(headers);
    headers.insert(GRPC_STATUS.clone(), number(u64::from(code)));
    // grpc-message is percent-encoded outside printable ASCII (and for `%` itself).
    let mut encoded = String::new();
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            encoded.push(char::from(b));
        } else {
            let _ = write!(encoded, "%{b:02X}");
        }
    }
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert(GRPC_MESSAGE.clone(), value);
    }
    response
}

/// gRPC's RESOURCE_EXHAUSTED.
pub(crate) const GRPC_RESOURCE_EXHAUSTED: u8 = 8;
/// gRPC's INVALID_ARGUMENT, INTERNAL and UNAVAILABLE, for the no-key / error outcomes.
pub(crate) fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 3,
        429 => GRPC_RESOURCE_EXHAUSTED,
        503 => 14,
        _ => 13,
    }
}

/// Whether a request is gRPC: a POST whose `content-type` starts with `application/grpc`
/// (gRPC calls are POSTs; a GET with that content type is a browser or a probe, and its
/// denial must be a plain 429 that caches and monitors see).
pub(crate) fn is_grpc(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::POST
        && headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// Sets `Retry-After`.
pub(crate) fn set_retry_after(headers: &mut HeaderMap, secs: u64) {
    let _ = headers.try_insert(RETRY_AFTER, number(secs));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn decimals_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 42, 1_000_000, u64::MAX - 1, u64::MAX] {
            let mut out = String::from("x");
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    #[test]
    fn quota_names_are_structured_field_strings() {
        let name = |policy, index, count| {
            let mut out = String::new();
            quota_name(&mut out, policy, index, count);
            out
        };
        assert_eq!(name("api", 0, 1), r#""api""#);
        assert_eq!(name("api", 1, 2), r#""api-2""#);
        assert_eq!(name(r#"a"b\c"#, 0, 1), r#""a\"b\\c""#);
    }

    #[test]
    fn json_escapes_as_the_char_by_char_escape() {
        let reference = |s: &str| {
            let mut out = String::new();
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out
        };
        for s in [
            "",
            "plain",
            "\"",
            "a\"b\"",
            "\\",
            "é\"ü\u{1f}",
            "\u{0}\n\t\u{1f}x",
            "日本\\語",
        ] {
            let mut out = String::from(">");
            json_escape(&mut out, s);
            assert_eq!(out, format!(">{}", reference(s)), "{s:?}");
        }
    }

    #[test]
    fn denial_details_name_the_policy_and_the_wait() {
        for (policy, secs) in [("api", 1), ("a \"b\"", 0), ("x", u64::MAX)] {
            assert_eq!(
                denial_detail(policy, secs),
                format!("Rate limit \"{policy}\" exceeded: retry after {secs} s.")
            );
        }
    }

    #[test]
    fn policy_fields_are_kept_once_per_distinct_value() {
        let a = interned("\"interned-test\";q=1;w=1").unwrap();
        let b = interned("\"interned-test\";q=1;w=1").unwrap();
        let c = interned("\"interned-test\";q=2;w=1").unwrap();
        assert!(std::ptr::eq(a, b), "one copy of a value");
        assert_eq!(
            (a, c),
            ("\"interned-test\";q=1;w=1", "\"interned-test\";q=2;w=1")
        );
        // Past the bound, values are no longer kept (and nothing else grows).
        let mut past = 0;
        for q in 0..INTERNED + 1 {
            past += usize::from(interned(&format!("\"bound-test\";q={q};w=1")).is_none());
        }
        assert!(past > 0);
        assert!(
            interned("\"interned-test\";q=1;w=1").is_some(),
            "kept values stay"
        );
    }

    #[test]
    fn denial_problems_are_the_problem_of_their_detail() {
        for (policy, secs) in [("api", 1), ("a \"b\" \\", 7), ("x", u64::MAX)] {
            assert_eq!(
                denial_problem(policy, secs),
                problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    &denial_detail(policy, secs),
                    Some(secs)
                )
            );
        }
    }

    #[test]
    fn reason_phrases_need_no_escape() {
        for code in 100..=999 {
            let reason = StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Error");
            let mut escaped = String::new();
            json_escape(&mut escaped, reason);
            assert_eq!(escaped, reason, "{code}");
        }
    }

    #[test]
    fn problem_bodies_are_escaped_json() {
        let body = problem(StatusCode::TOO_MANY_REQUESTS, "a \"b\" \\ \n", Some(3));
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"a \"b\" \\ \u000a","retry-after":3}"#
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        let r = grpc_response::<()>(8, "100% é");
        assert_eq!(r.headers()["grpc-message"], "100%25 %C3%A9");
        assert_eq!(r.headers()["grpc-status"], "8");
        assert_eq!(r.status(), StatusCode::OK);
    }
}
