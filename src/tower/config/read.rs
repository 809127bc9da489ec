//! How the configuration reads: compact quotas (`"100/1m burst 20"`), durations, and the
//! serde impls of the layer's own types (modes, key sources, fallbacks, CIDRs, ...).

use super::*;

/// Parses a compact quota: `LIMIT/WINDOW`, optionally followed by `burst B`; the window is a
/// duration (`250ms`, `1s`, `1m`, `1h`), or a bare unit (`10/s` is `10/1s`).
///
/// # Errors
/// A message naming the value and what is wrong.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::tower::config::parse_quota;
/// let q = parse_quota("100/1m burst 20")?;
/// assert_eq!((q.limit(), q.window(), q.burst()), (100, Duration::from_secs(60), 20));
/// assert_eq!(parse_quota("10/s")?.window(), Duration::from_secs(1));
/// assert!(parse_quota("10/0s").is_err());
/// assert!(parse_quota("ten per second").is_err());
/// # Ok::<(), String>(())
/// ```
pub fn parse_quota(text: &str) -> Result<Quota, String> {
    let bad =
        |why: &str| format!("invalid quota {text:?}: {why} (expected e.g. \"100/1m burst 20\")");
    let (limit, rest) = text
        .split_once('/')
        .ok_or_else(|| bad("no `/` between limit and window"))?;
    let limit = limit.trim();
    if limit.is_empty() || !limit.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the limit is not a whole number"));
    }
    let limit: u64 = limit.parse().map_err(|_| bad("the limit is too large"))?;
    let mut words = rest.split_whitespace();
    let window = words.next().ok_or_else(|| bad("no window"))?;
    let window = if window.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(window)
    } else {
        parse_duration(&format!("1{window}"))
    }
    .map_err(|e| bad(&e))?;
    let mut quota = Quota::new(limit, window).map_err(|e| bad(&e.to_string()))?;
    match (words.next(), words.next(), words.next()) {
        (None, _, _) => {}
        (Some("burst"), Some(burst), None) => {
            let burst: u64 = burst
                .parse()
                .map_err(|_| bad("the burst is not a whole number"))?;
            quota = quota.with_burst(burst).map_err(|e| bad(&e.to_string()))?;
        }
        _ => return Err(bad("only `burst B` may follow the window")),
    }
    Ok(quota)
}

/// A quota as a table: `{ limit = 10, window = "1s", burst = 20 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaTable {
    limit: u64,
    window: DurationText,
    #[serde(default)]
    burst: Option<u64>,
}

/// A duration written as text (`250ms`).
struct DurationText(Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(DurationText)
            .map_err(de::Error::custom)
    }
}

/// A quota: compact text (`"100/1m burst 20"`, see [`parse_quota`]) or a table
/// (`{ limit = 100, window = "1m", burst = 20 }`).
impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuotaVisitor)
    }
}

struct QuotaVisitor;

impl<'de> Visitor<'de> for QuotaVisitor {
    type Value = Quota;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a quota such as \"100/1m burst 20\" or { limit = 100, window = \"1m\" }")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quota, E> {
        parse_quota(v).map_err(E::custom)
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Quota, M::Error> {
        let table = QuotaTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let fail = |e: QuotaError| {
            de::Error::custom(format!(
                "invalid quota {{ limit = {}, window = {:?} }}: {e}",
                table.limit, table.window.0
            ))
        };
        let quota = Quota::new(table.limit, table.window.0).map_err(fail)?;
        match table.burst {
            Some(burst) => quota.with_burst(burst).map_err(fail),
            None => Ok(quota),
        }
    }
}

/// One quota or a list of them.
pub(super) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Quota>, D::Error> {
    struct Many;
    impl<'de> Visitor<'de> for Many {
        type Value = Vec<Quota>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a quota or a list of quotas")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<Quota>, E> {
            QuotaVisitor.visit_str(v).map(|q| vec![q])
        }

        fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Vec<Quota>, M::Error> {
            QuotaVisitor.visit_map(map).map(|q| vec![q])
        }

        fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<Quota>, S::Error> {
            let mut quotas = Vec::new();
            while let Some(q) = seq.next_element::<Quota>()? {
                quotas.push(q);
            }
            if quotas.is_empty() {
                return Err(de::Error::custom("an empty list of quotas"));
            }
            Ok(quotas)
        }
    }
    d.deserialize_any(Many)
}

/// An algorithm by its canonical name (`gcra`, `fixed-window`, …).
impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(de::Error::custom)
    }
}

/// A network (`10.0.0.0/8`) or a single address (`127.0.0.1`).
impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| de::Error::custom(format!("invalid network {text:?}: {e}")))
    }
}

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let standard = [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::CONNECT,
            Method::OPTIONS,
            Method::TRACE,
            Method::PATCH,
        ];
        if let Some(method) = standard
            .iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(&text))
        {
            return Ok(MethodName(method.clone()));
        }
        Method::from_bytes(text.as_bytes())
            .map(MethodName)
            .map_err(|_| de::Error::custom(format!("invalid HTTP method {text:?}")))
    }
}

/// `none`, `legacy`, `draft` or `both`.
impl<'de> Deserialize<'de> for HeaderStyle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "none" => Ok(HeaderStyle::None),
            "legacy" => Ok(HeaderStyle::Legacy),
            "draft" => Ok(HeaderStyle::Draft),
            "both" => Ok(HeaderStyle::Both),
            _ => Err(de::Error::custom(format!(
                "unknown header style {text:?} (expected none, legacy, draft or both)"
            ))),
        }
    }
}

/// `x-forwarded-for` or `forwarded`.
impl<'de> Deserialize<'de> for ProxyHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ProxyHeader::XForwardedFor),
            "forwarded" => Ok(ProxyHeader::Forwarded),
            _ => Err(de::Error::custom(format!(
                "unknown proxy header {text:?} (expected x-forwarded-for or forwarded)"
            ))),
        }
    }
}

/// `"enforce"`, `"shadow"`, or `{ delay = "500ms" }` (feature `tokio`).
impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ModeVisitor)
    }
}

struct ModeVisitor;

impl<'de> Visitor<'de> for ModeVisitor {
    type Value = Mode;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"enforce\", \"shadow\" or { delay = MAX_WAIT }")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Mode, E> {
        match v {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            "delay" => Err(E::custom(
                "delay mode needs its longest wait: mode = { delay = \"500ms\" }",
            )),
            _ => Err(E::custom(format!(
                "unknown mode {v:?} (expected enforce, shadow or {{ delay = MAX_WAIT }})"
            ))),
        }
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Mode, M::Error> {
        let Some((kind, value)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom("an empty mode"));
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("a mode table has one entry"));
        }
        if kind != "delay" {
            return Err(de::Error::custom(format!(
                "unknown mode {kind:?} (expected enforce, shadow or {{ delay = MAX_WAIT }})"
            )));
        }
        let max_wait = parse_duration(&value).map_err(de::Error::custom)?;
        #[cfg(feature = "tokio")]
        let mode = {
            let most = crate::tower::policy::MAX_DELAY;
            if max_wait > most {
                return Err(de::Error::custom(format!(
                    "a delay of {max_wait:?} is longer than the most a request may wait, {most:?}"
                )));
            }
            Ok(Mode::Delay { max_wait })
        };
        #[cfg(not(feature = "tokio"))]
        let mode = Err(de::Error::custom(format!(
            "delay mode (max wait {max_wait:?}) needs tollgate's `tokio` feature"
        )));
        mode
    }
}

/// `v` as a client or server error status (what a configured refusal may answer).
fn error_status<E: de::Error>(v: impl TryInto<u16> + fmt::Display + Copy) -> Result<StatusCode, E> {
    v.try_into()
        .ok()
        .and_then(|v| StatusCode::from_u16(v).ok())
        .filter(|s| s.is_client_error() || s.is_server_error())
        .ok_or_else(|| E::custom(format!("status {v} is not a 4xx or 5xx status")))
}

/// `"digest"` or a 4xx/5xx status.
impl<'de> Deserialize<'de> for LongKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct LongKeyVisitor;
        impl Visitor<'_> for LongKeyVisitor {
            type Value = LongKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"digest\" or a 4xx/5xx status")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LongKey, E> {
                match v {
                    "digest" => Ok(LongKey::Digest),
                    _ => Err(E::custom(format!(
                        "unknown long-key answer {v:?} (expected \"digest\" or a 4xx/5xx status)"
                    ))),
                }
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LongKey, E> {
                error_status(v).map(LongKey::Reject)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LongKey, E> {
                error_status(v).map(LongKey::Reject)
            }
        }
        d.deserialize_any(LongKeyVisitor)
    }
}

/// `"allow"`, or a 4xx/5xx status number to reject with.
impl<'de> Deserialize<'de> for Fallback {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FallbackVisitor;
        impl Visitor<'_> for FallbackVisitor {
            type Value = Fallback;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"allow\" or a 4xx/5xx status")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Fallback, E> {
                match v {
                    "allow" => Ok(Fallback::Allow),
                    _ => Err(E::custom(format!(
                        "unknown fallback {v:?} (expected \"allow\" or a 4xx/5xx status)"
                    ))),
                }
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fallback, E> {
                error_status(v).map(Fallback::Reject)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fallback, E> {
                error_status(v).map(Fallback::Reject)
            }
        }
        d.deserialize_any(FallbackVisitor)
    }
}

/// `"client-ip"`, `"peer-ip"`, `"path"`, `{ header = "x-api-key" }`, `{ constant = "all" }`, or
/// a list of these (a composite key).
impl<'de> Deserialize<'de> for KeySource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KeySourceVisitor)
    }
}

struct KeySourceVisitor;

impl<'de> Visitor<'de> for KeySourceVisitor {
    type Value = KeySource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a key source: \"client-ip\", \"peer-ip\", \"path\", { header = NAME }, \
             { constant = TEXT }, or a list of these",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeySource, E> {
        match v {
            "client-ip" => Ok(KeySource::client_ip()),
            "peer-ip" => Ok(KeySource::peer_ip()),
            "path" => Ok(KeySource::path()),
            _ => Err(E::custom(format!(
                "unknown key source {v:?} (expected client-ip, peer-ip, path, \
                 {{ header = NAME }} or {{ constant = TEXT }})"
            ))),
        }
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<KeySource, M::Error> {
        let Some((kind, value)) = map.next_entry::<String, String>()? else {
            return Err(de::Error::custom("an empty key source"));
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(
                "a key source table has one entry (use a list for a composite key)",
            ));
        }
        match kind.as_str() {
            "header" => HeaderName::from_bytes(value.as_bytes())
                .map(KeySource::header)
                .map_err(|_| de::Error::custom(format!("invalid header name {value:?}"))),
            "constant" => Ok(KeySource::constant(value)),
            _ => Err(de::Error::custom(format!(
                "unknown key source {kind:?} (expected header or constant)"
            ))),
        }
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<KeySource, S::Error> {
        let mut parts = Vec::new();
        while let Some(part) = seq.next_element::<KeySource>()? {
            parts.push(part);
        }
        if parts.is_empty() {
            return Err(de::Error::custom("an empty composite key"));
        }
        Ok(KeySource::composite(parts))
    }
}
