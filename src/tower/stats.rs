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

use super::backend::{CheckError, Verdict};
use super::key::{Key, Missing};
use super::outcome::Outcome;
use super::policy::Policy;

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
            if policy.mode == super::policy::Mode::Shadow {
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

/// Emits a debug event for a request of `policy` without a key, `missing` saying why (feature
/// `metrics`).
#[inline]
pub(crate) fn trace_no_key(policy: &Policy, missing: Missing) {
    #[cfg(feature = "metrics")]
    match missing {
        Missing::FromClient => {
            tracing::debug!(target: "tollgate::tower", policy = %policy.name, "request without a client key");
        }
        Missing::PeerAddr => {
            tracing::debug!(
                target: "tollgate::tower",
                policy = %policy.name,
                "request without a client key: no peer address (with axum, serve with \
                 `into_make_service_with_connect_info::<SocketAddr>()`)"
            );
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (policy, missing);
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
