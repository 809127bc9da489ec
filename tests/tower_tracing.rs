//! The layer's `tracing` events (feature `metrics`): denials, shadow denials and requests
//! without a key, at debug level under target `tollgate::tower`.
//!
//! Its own test binary, with one test: tracing caches per call site whether anyone listens,
//! and a layer driven on another thread without a subscriber (a parallel test) can race that
//! cache against the scoped subscriber here.
//!
//! Run with `cargo test --features metrics,tokio --test tower_tracing`.

#![cfg(all(feature = "metrics", feature = "tokio"))]

#[path = "support/tower.rs"]
mod tower_support;

use http::HeaderName;
use tollgate::tower::{Fallback, KeySource, Mode, Policy, RateLimitLayer};
use tollgate::wait::TokioClock;
use tollgate::Quota;
use tower_layer::Layer;
use tower_support::{gcra, paused_runtime, send, Ok200};

/// A `tracing` subscriber that keeps every event's message and fields as text.
#[derive(Default, Clone)]
struct Events(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={:?} ", field.name(), value));
            }
        }
        let mut text = Text(format!(
            "{} {} ",
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn denials_and_missing_keys_are_debug_events() {
    let events = Events::default();
    tracing::subscriber::with_default(events.clone(), || {
        let rt = paused_runtime();
        rt.block_on(async {
            let clock = TokioClock::new();
            let one = || gcra(&clock, Quota::per_hour(1).unwrap());
            let layer = RateLimitLayer::builder()
                .policy(Policy::new("api", one()).path_prefix("/api"))
                .policy(
                    Policy::new("beta", one())
                        .path_prefix("/beta")
                        .mode(Mode::Shadow),
                )
                .policy(
                    Policy::new("keyed", one())
                        .path_prefix("/keyed")
                        .key(KeySource::header(HeaderName::from_static("x-api-key"))),
                )
                .on_missing_key(Fallback::Allow)
                .build()
                .unwrap();
            let svc = layer.layer(Ok200);
            for path in ["/api", "/api", "/beta", "/beta", "/keyed"] {
                send(&svc, path, 7, None).await;
            }
        });
    });
    let events = events.0.lock().unwrap().clone();
    let ours: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("tollgate::tower"))
        .collect();
    assert_eq!(ours.len(), 3, "{events:#?}");
    assert!(ours[0].starts_with("DEBUG tollgate::tower message=rate limit denied"));
    assert!(ours[0].contains("policy=api") && ours[0].contains("key=192.0.2.7"));
    assert!(ours[0].contains("retry_after_ms=3600000"), "{}", ours[0]);
    assert!(ours[1].contains("would deny (shadow)") && ours[1].contains("policy=beta"));
    assert!(ours[2].contains("without a client key") && ours[2].contains("policy=keyed"));
}
