//! The layer's metrics (feature `metrics`) read back from `metrics-util`'s debugging recorder:
//! one counter per policy and outcome, and the delay-mode waits.
//!
//! Run with `cargo test --features metrics,tokio --test tower_metrics`.

#![cfg(all(feature = "metrics", feature = "tokio"))]

#[path = "support/tower.rs"]
mod tower_support;

use std::collections::BTreeMap;
use std::time::Duration;

use http::HeaderName;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::tower::{Fallback, Key, KeySource, Mode, Policy, RateLimitLayer};
use tollgate::wait::TokioClock;
use tollgate::{Gcra, KeyedLimiter, OverflowPolicy, Quota};
use tower_layer::Layer;
use tower_support::{gcra, paused_runtime, send, Ok200};

/// Counters by (policy, outcome), and histograms by policy.
#[allow(clippy::type_complexity)]
fn read(
    snapshotter: &Snapshotter,
) -> (BTreeMap<(String, String), u64>, BTreeMap<String, Vec<f64>>) {
    let mut counters = BTreeMap::new();
    let mut histograms = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        match (key.name(), value) {
            ("tollgate_requests_total", DebugValue::Counter(n)) => {
                counters.insert((label("policy"), label("outcome")), n);
            }
            ("tollgate_delay_seconds", DebugValue::Histogram(values)) => {
                histograms.insert(label("policy"), values.into_iter().map(|v| v.0).collect());
            }
            ("tollgate_keys", _) => {}
            (name, value) => panic!("unexpected metric {name}: {value:?}"),
        }
    }
    (counters, histograms)
}

#[test]
fn every_outcome_is_counted_per_policy() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = paused_runtime();
        rt.block_on(async {
            let clock = TokioClock::new();
            let per_hour = |n| Quota::per_hour(n).unwrap();
            let full_after_one =
                KeyedLimiter::<Key, _, _>::builder(Gcra::new(per_hour(5)).unwrap())
                    .clock(clock)
                    .max_keys(1, OverflowPolicy::Deny)
                    .build()
                    .unwrap();
            let layer = RateLimitLayer::builder()
                .policy(Policy::new("api", gcra(&clock, per_hour(2))).path_prefix("/api"))
                .policy(
                    Policy::new("beta", gcra(&clock, per_hour(1)))
                        .path_prefix("/beta")
                        .mode(Mode::Shadow),
                )
                .policy(
                    Policy::new(
                        "slow",
                        gcra(&clock, Quota::per_second(1).unwrap().with_burst(1).unwrap()),
                    )
                    .path_prefix("/slow")
                    .mode(Mode::Delay {
                        max_wait: Duration::from_secs(1),
                    }),
                )
                .policy(
                    Policy::new("keyed", gcra(&clock, per_hour(9)))
                        .path_prefix("/keyed")
                        .key(KeySource::header(HeaderName::from_static("x-api-key"))),
                )
                .policy(Policy::new("full", full_after_one).path_prefix("/full"))
                .on_missing_key(Fallback::Allow)
                .build()
                .unwrap();
            let svc = layer.layer(Ok200);
            for want in [200, 200, 429] {
                assert_eq!(send(&svc, "/api/x", 1, None).await, want);
            }
            // Shadow: never refused, but counted as what enforcement would have done.
            for _ in 0..3 {
                assert_eq!(send(&svc, "/beta/x", 1, None).await, 200);
            }
            let start = tokio::time::Instant::now();
            assert_eq!(send(&svc, "/slow", 1, None).await, 200);
            assert_eq!(send(&svc, "/slow", 1, None).await, 200);
            assert_eq!(start.elapsed(), Duration::from_secs(1));
            // Two requests without an API key pass (Fallback::Allow) and are counted.
            assert_eq!(send(&svc, "/keyed", 1, None).await, 200);
            assert_eq!(send(&svc, "/keyed", 1, None).await, 200);
            assert_eq!(send(&svc, "/keyed", 1, Some("k")).await, 200);
            // A second key does not fit: the backend's error (the default 503).
            assert_eq!(send(&svc, "/full", 1, None).await, 200);
            assert_eq!(send(&svc, "/full", 2, None).await, 503);
            // No policy: not counted.
            assert_eq!(send(&svc, "/elsewhere", 1, None).await, 200);
        });
    });
    let (counters, histograms) = read(&snapshotter);
    let want: BTreeMap<(String, String), u64> = [
        ("api", "allowed", 2),
        ("api", "denied", 1),
        ("beta", "allowed", 1),
        ("beta", "shadow_denied", 2),
        ("slow", "allowed", 1),
        ("slow", "delayed", 1),
        ("keyed", "no_key", 2),
        ("keyed", "allowed", 1),
        ("full", "allowed", 1),
        ("full", "table_full", 1),
    ]
    .into_iter()
    .map(|(p, o, n)| ((p.to_owned(), o.to_owned()), n))
    .collect();
    assert_eq!(counters, want);
    assert_eq!(histograms, BTreeMap::from([("slow".to_owned(), vec![1.0])]));
}

#[test]
fn gauges_report_the_keys_held_when_asked() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = paused_runtime();
        rt.block_on(async {
            let clock = TokioClock::new();
            let layer = RateLimitLayer::builder()
                .policy(
                    Policy::new("api", gcra(&clock, Quota::per_hour(5).unwrap()))
                        .path_prefix("/api"),
                )
                .build()
                .unwrap();
            let svc = layer.layer(Ok200);
            for ip in 1..=3 {
                assert_eq!(send(&svc, "/api/x", ip, None).await, 200);
            }
            layer.record_gauges();
        });
    });
    let gauges: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((key.key().name().to_owned(), v.0)),
            _ => None,
        })
        .collect();
    assert_eq!(gauges, [("tollgate_keys".to_owned(), 3.0)]);
}

/// The layer keeps each counter once registered, for the recorder it was registered with: a
/// request under another recorder (installed later, or a second local one) is counted there,
/// not into the first recorder's kept counter.
#[test]
fn each_recorder_counts_its_own_requests() {
    let (first, second) = (DebuggingRecorder::new(), DebuggingRecorder::new());
    let (first_counts, second_counts) = (first.snapshotter(), second.snapshotter());
    let rt = paused_runtime();
    let clock = TokioClock::new();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new(
            "api",
            gcra(&clock, Quota::per_hour(100).unwrap()),
        ))
        .build()
        .unwrap();
    let svc = layer.layer(Ok200);
    let serve = |times: u32| {
        rt.block_on(async {
            for _ in 0..times {
                assert_eq!(send(&svc, "/", 1, None).await, 200);
            }
        })
    };
    // A request with no recorder in place (the no-op one), then two under each recorder,
    // alternating: every count lands in the recorder in place when it was made.
    serve(1);
    metrics::with_local_recorder(&first, || serve(2));
    metrics::with_local_recorder(&second, || serve(1));
    metrics::with_local_recorder(&first, || serve(1));
    metrics::with_local_recorder(&second, || serve(2));
    let allowed = |counts: &Snapshotter| read(counts).0;
    let want = |n| BTreeMap::from([(("api".to_owned(), "allowed".to_owned()), n)]);
    assert_eq!(allowed(&first_counts), want(3));
    assert_eq!(allowed(&second_counts), want(3));
}
