//! The layer's metrics (feature `metrics`), through the `metrics` facade: the application
//! installs the recorder and exporter it wants (Prometheus, StatsD, …).
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `tollgate_requests_total` | counter | `policy`, `outcome` | every request a policy decided or could not decide |
//! | `tollgate_delay_seconds` | histogram | `policy` | how long each delayed request waited (delay mode) |
//! | `tollgate_keys` | gauge | `policy` | keys the policy's backend holds (set by `record_gauges`) |
//! | `tollgate_backend_degraded` | gauge | `policy` | 1 while a Redis backend decides by its failure policy, else 0 |
//!
//! `outcome` is one of `allowed`, `denied`, `shadow_denied` (refused by a shadow policy, let
//! through), `delayed` (admitted after waiting, delay mode), `no_key` (no client key could be
//! extracted) and `error` (the backend could not decide, or the cost can never be admitted);
//! `refunded` counts admitted requests given back by their response status (they were
//! counted as `allowed` or `delayed` too).
//! Allow-listed requests and requests no policy matches are not counted.
//!
//! Without the feature every function here is empty.

use std::time::Duration;

use super::{CheckError, Key, Policy, Verdict};

/// What happened to a request: the `outcome` label of `tollgate_requests_total`, and what
/// [`RateLimitLayer::evaluate`](super::RateLimitLayer::evaluate) reports.
///
/// # Examples
/// ```
/// use tollgate::tower::Outcome;
/// assert_eq!(Outcome::ShadowDenied.label(), "shadow_denied");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted at once.
    Allowed,
    /// Refused: the layer answered 429 (or gRPC status 8).
    Denied,
    /// Refused by a shadow policy, and let through.
    ShadowDenied,
    /// Admitted after waiting for its slot (delay mode).
    Delayed,
    /// No client key could be extracted: the policy's (or the layer's) missing-key fallback
    /// decided.
    NoKey,
    /// The key was longer than the layer's bound and refused
    /// ([`LongKey::Reject`](super::LongKey::Reject)).
    KeyTooLong,
    /// A full key table refused the request's new key
    /// ([`on_table_full`](super::RateLimitLayerBuilder::on_table_full) decided).
    TableFull,
    /// The backend could not decide, or the cost can never be admitted.
    Error,
    /// An admitted request given back by its response's status (counted as allowed or
    /// delayed too). Never the outcome of an evaluation, which has no response.
    Refunded,
    /// No policy applies, or the request is allow-listed: it passes uncounted (no metric).
    Passed,
}

impl Outcome {
    /// The name metrics and `tollgate replay --config` use: `allowed`, `denied`,
    /// `shadow_denied`, `delayed`, `no_key`, `key_too_long`, `table_full`, `error`,
    /// `refunded` or `passed`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::Delayed => "delayed",
            Outcome::NoKey => "no_key",
            Outcome::KeyTooLong => "key_too_long",
            Outcome::TableFull => "table_full",
            Outcome::Error => "error",
            Outcome::Refunded => "refunded",
            Outcome::Passed => "passed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A key as the debug events show it: characters other than printable ASCII escaped (as
/// `str::escape_default` does), and cut after [`Logged::MAX`] characters. A client's header
/// must not write lines or terminal escapes into the server's logs, nor fill them.
#[cfg(feature = "metrics")]
struct Logged<'a>(&'a Key);

#[cfg(feature = "metrics")]
impl Logged<'_> {
    const MAX: usize = 64;
}

#[cfg(feature = "metrics")]
impl std::fmt::Display for Logged<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        let mut escaped = text.escape_default();
        for c in escaped.by_ref().take(Self::MAX) {
            std::fmt::Write::write_char(f, c)?;
        }
        if escaped.next().is_some() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// Emits a debug event for a refusal or an error of `policy` on `key` (feature `metrics`).
#[inline]
pub(crate) fn trace(policy: &Policy, key: &Key, decided: &Result<(Verdict, Duration), CheckError>) {
    #[cfg(feature = "metrics")]
    match decided {
        Ok((verdict, _)) if !verdict.decision.allowed() => {
            let retry_after_ms = verdict.decision.retry_after().as_millis();
            if policy.mode == super::Mode::Shadow {
                tracing::debug!(target: "tollgate::tower", policy = %policy.name, key = %Logged(key), retry_after_ms, "rate limit would deny (shadow)");
            } else {
                tracing::debug!(target: "tollgate::tower", policy = %policy.name, key = %Logged(key), retry_after_ms, "rate limit denied");
            }
        }
        Ok(_) => {}
        Err(error) => {
            tracing::debug!(target: "tollgate::tower", policy = %policy.name, key = %Logged(key), %error, "rate limit could not decide");
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, key, decided);
}

/// Emits a debug event for a request of `policy` without a key (feature `metrics`).
#[inline]
pub(crate) fn trace_no_key(policy: &Policy) {
    #[cfg(feature = "metrics")]
    tracing::debug!(target: "tollgate::tower", policy = %policy.name, "request without a client key");
    #[cfg(not(feature = "metrics"))]
    let _ = policy;
}

/// Every outcome, in declaration order (`Outcome as usize` indexes [`MetricKeys`]).
#[cfg(feature = "metrics")]
const OUTCOMES: [Outcome; 10] = [
    Outcome::Allowed,
    Outcome::Denied,
    Outcome::ShadowDenied,
    Outcome::Delayed,
    Outcome::NoKey,
    Outcome::KeyTooLong,
    Outcome::TableFull,
    Outcome::Error,
    Outcome::Refunded,
    Outcome::Passed,
];

/// A policy's per-request metric keys, built once: a request hands the recorder a ready key
/// (labels allocated, sorted and hashed once) instead of building one, which the macros do on
/// every call when a label is not a literal (an allocation, a sort and a hash a request).
///
/// Each outcome's counter is also kept once registered, as the `metrics` crate advises: a
/// recorder's registration is a lookup in its registry on every call (Prometheus's clones the
/// key: an allocation a request). A kept counter is used only while the recorder in place is
/// the one it was registered with (the same address); under another one (a recorder
/// installed after the first request, a test's local recorder) every request registers its
/// counter again, as the macros do.
#[cfg(feature = "metrics")]
pub(crate) struct MetricKeys {
    requests: [::metrics::Key; OUTCOMES.len()],
    /// Each outcome's counter, and the address of the recorder it was registered with.
    counters: [std::sync::OnceLock<(usize, ::metrics::Counter)>; OUTCOMES.len()],
    delay: ::metrics::Key,
}

#[cfg(feature = "metrics")]
impl MetricKeys {
    pub(crate) fn new(policy: &std::sync::Arc<str>) -> Self {
        use ::metrics::{Key, Label};
        let label = || Label::new("policy", std::sync::Arc::clone(policy));
        MetricKeys {
            requests: OUTCOMES.map(|outcome| {
                let labels = vec![label(), Label::new("outcome", outcome.label())];
                Key::from_parts("tollgate_requests_total", labels)
            }),
            counters: Default::default(),
            delay: Key::from_parts("tollgate_delay_seconds", vec![label()]),
        }
    }
}

/// What the `metrics` macros would pass as the metadata of this module's metrics.
#[cfg(feature = "metrics")]
static METADATA: ::metrics::Metadata<'static> =
    ::metrics::Metadata::new(module_path!(), ::metrics::Level::INFO, Some(module_path!()));

/// Counts one request of `policy`.
#[inline]
pub(crate) fn record(policy: &Policy, outcome: Outcome) {
    #[cfg(feature = "metrics")]
    {
        let keys = &policy.metric_keys;
        let (key, kept) = (
            &keys.requests[outcome as usize],
            &keys.counters[outcome as usize],
        );
        ::metrics::with_recorder(|recorder| {
            let address = std::ptr::from_ref(recorder).cast::<()>() as usize;
            let (registered_with, counter) =
                kept.get_or_init(|| (address, recorder.register_counter(key, &METADATA)));
            if *registered_with == address {
                counter.increment(1);
            } else {
                recorder.register_counter(key, &METADATA).increment(1);
            }
        });
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, outcome);
}

/// Records how long a delayed request of `policy` waited.
#[inline]
pub(crate) fn record_wait(policy: &Policy, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let key = &policy.metric_keys.delay;
        ::metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
            .record(waited.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, waited);
}

/// Sets the gauges of `policy`: the keys its backend holds, and whether it is degraded.
pub(crate) fn record_gauges(policy: &Policy) {
    #[cfg(feature = "metrics")]
    {
        let backend = &policy.backend;
        if let Some(keys) = backend.keys_held() {
            ::metrics::gauge!("tollgate_keys", "policy" => std::sync::Arc::clone(&policy.name))
                .set(keys as f64);
        }
        if let Some(degraded) = backend.degraded() {
            ::metrics::gauge!(
                "tollgate_backend_degraded",
                "policy" => std::sync::Arc::clone(&policy.name)
            )
            .set(if degraded { 1.0 } else { 0.0 });
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = policy;
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_indexes_its_own_key() {
        let keys = MetricKeys::new(&std::sync::Arc::from("api"));
        for (i, outcome) in OUTCOMES.into_iter().enumerate() {
            assert_eq!(outcome as usize, i);
            let labels: Vec<_> = keys.requests[i]
                .labels()
                .map(|l| l.value().to_owned())
                .collect();
            assert_eq!(labels, ["api", outcome.label()]);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod logged_tests {
    use super::*;

    #[test]
    fn logged_keys_are_escaped_and_cut() {
        let shown = |key: Key| Logged(&key).to_string();
        assert_eq!(shown(Key::from("alice")), "alice");
        assert_eq!(shown(Key::from("a\nb\u{1b}[31m")), "a\\nb\\u{1b}[31m");
        let long = shown(Key::from("x".repeat(100)));
        assert_eq!(long, "x".repeat(64) + "...");
        assert_eq!(shown(Key::from("x".repeat(64))), "x".repeat(64));
    }
}
