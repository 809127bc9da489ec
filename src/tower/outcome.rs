//! What happened to a request ([`Outcome`]), and the metric keys a policy keeps for each
//! outcome (feature `metrics`).

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
    /// Refused at once: the client key had as many requests in flight as the policy's
    /// [`max_in_flight`](super::Policy::max_in_flight) allows.
    InFlight,
    /// An admitted request given back by its response's status (counted as allowed or
    /// delayed too). Never the outcome of an evaluation, which has no response.
    Refunded,
    /// No policy applies, or the request is allow-listed: it passes uncounted (no metric).
    Passed,
}

impl Outcome {
    /// The name metrics and `tollgate replay --config` use: `allowed`, `denied`,
    /// `shadow_denied`, `delayed`, `no_key`, `key_too_long`, `table_full`, `error`,
    /// `in_flight`, `refunded` or `passed`.
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
            Outcome::InFlight => "in_flight",
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
/// Every outcome, in declaration order (`Outcome as usize` indexes [`MetricKeys`]).
#[cfg(feature = "metrics")]
const OUTCOMES: [Outcome; 11] = [
    Outcome::Allowed,
    Outcome::Denied,
    Outcome::ShadowDenied,
    Outcome::Delayed,
    Outcome::NoKey,
    Outcome::KeyTooLong,
    Outcome::TableFull,
    Outcome::Error,
    Outcome::InFlight,
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
    pub(super) requests: [::metrics::Key; OUTCOMES.len()],
    /// Each outcome's counter, and the address of the recorder it was registered with.
    pub(super) counters: [std::sync::OnceLock<(usize, ::metrics::Counter)>; OUTCOMES.len()],
    pub(super) delay: ::metrics::Key,
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
