//! The layer built from configuration (feature `serde`): `examples/policies.toml` decides as
//! it says, on a `ManualClock`; bad configurations are errors naming the value, never panics.
//!
//! Run with `cargo test --features serde,tokio --test tower_config` (the example file has a
//! delay-mode policy, which needs `tokio`).

#![cfg(all(feature = "serde", feature = "tokio"))]

#[path = "support/tower.rs"]
mod tower_support;

use std::net::IpAddr;
use std::time::Duration;

use http::{Response, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::tower::config::LayerConfig;
use tollgate::tower::{ConfigError, RateLimit, RateLimitBody};
use tollgate::QuotaError;
use tower_layer::Layer;
use tower_support::{call, header, paused_runtime, request, runtime, status, Ok200};

const POLICIES: &str = include_str!("../examples/policies.toml");

struct Harness {
    svc: RateLimit<Ok200>,
    rt: tokio::runtime::Runtime,
}

impl Harness {
    fn new(config: LayerConfig, clock: &ManualClock) -> Harness {
        let layer = config
            .builder_with_clock(clock.clone())
            .expect("a valid configuration")
            .build()
            .expect("a valid layer");
        Harness {
            svc: layer.layer(Ok200),
            rt: runtime(),
        }
    }

    fn send(
        &mut self,
        path: &str,
        peer: [u8; 4],
        headers: &[(&str, &str)],
    ) -> Response<RateLimitBody<String>> {
        let request = request(path, Some(IpAddr::from(peer)), headers);
        call(&self.rt, &mut self.svc, request)
    }

    fn status(&mut self, path: &str, peer: [u8; 4], headers: &[(&str, &str)]) -> u16 {
        self.send(path, peer, headers).status().as_u16()
    }
}

fn example() -> LayerConfig {
    toml::from_str(POLICIES).expect("examples/policies.toml parses")
}

const CLIENT: [u8; 4] = [198, 51, 100, 7];

#[test]
fn the_example_api_policy_is_10_per_second_burst_20_per_client_ip() {
    let clock = ManualClock::new();
    let mut h = Harness::new(example(), &clock);
    let statuses: Vec<u16> = (0..21)
        .map(|_| h.status("/api/hello", CLIENT, &[]))
        .collect();
    assert_eq!(&statuses[..20], &[200; 20]);
    assert_eq!(statuses[20], 429);
    let denied = h.send("/api/hello", CLIENT, &[]);
    // Headers in both styles: the legacy ones and the draft's, named after the policy.
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&denied, "retry-after"), Some("1"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"api\";q=10;w=1")
    );
    // Another client has its own bucket; 100 ms later the first has one unit back.
    assert_eq!(h.status("/api/hello", [198, 51, 100, 8], &[]), 200);
    clock.advance(Duration::from_millis(100));
    assert_eq!(h.status("/api/hello", CLIENT, &[]), 200);
    assert_eq!(h.status("/api/hello", CLIENT, &[]), 429);
}

#[test]
fn the_example_trusts_127_0_0_1_and_charges_5_for_an_export() {
    let clock = ManualClock::new();
    let mut h = Harness::new(example(), &clock);
    let proxy = [127, 0, 0, 1];
    let xff = [("x-forwarded-for", "203.0.113.9")];
    // Four exports (20 units) empty the bucket of the client behind the proxy.
    for _ in 0..4 {
        assert_eq!(h.status("/api/export", proxy, &xff), 200);
    }
    assert_eq!(h.status("/api/hello", proxy, &xff), 429);
    // The proxy itself (no header) and a client claiming an address directly are other keys.
    assert_eq!(h.status("/api/hello", proxy, &[]), 200);
    assert_eq!(h.status("/api/hello", CLIENT, &xff), 200);
    // After 400 ms, 4 units are back: not enough for an export, enough for a hello.
    clock.advance(Duration::from_millis(400));
    assert_eq!(h.status("/api/export", proxy, &xff), 429);
    assert_eq!(h.status("/api/hello", proxy, &xff), 200);
}

#[test]
fn the_example_partner_policy_keys_by_api_key_and_shadow_never_rejects() {
    let clock = ManualClock::new();
    let mut h = Harness::new(example(), &clock);
    // No x-api-key: a 400, the default for a key the client did not send.
    assert_eq!(h.status("/partner/orders", CLIENT, &[]), 400);
    for _ in 0..100 {
        assert_eq!(
            h.status("/partner/orders", CLIENT, &[("x-api-key", "k1")]),
            200
        );
    }
    let denied = h.send("/partner/orders", CLIENT, &[("x-api-key", "k1")]);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // Two quotas, both in RateLimit-Policy; the per-minute one refused.
    // The tiers' quotas, all in RateLimit-Policy: free's two, then pro's; free's per-minute
    // one refused.
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"partner-1\";q=100;w=60, \"partner-2\";q=1000;w=3600, \"partner-3\";q=1000;w=60")
    );
    assert!(header(&denied, "ratelimit")
        .unwrap()
        .starts_with("\"partner-1\";r=0;"));
    // Another key, from the same address, is another bucket.
    assert_eq!(
        h.status("/partner/orders", CLIENT, &[("x-api-key", "k2")]),
        200
    );
    // A pro key (placed by the file) has 1000 a minute.
    for _ in 0..1000 {
        assert_eq!(
            h.status("/partner/orders", CLIENT, &[("x-api-key", "pro-key-1")]),
            200
        );
    }
    let denied = h.send("/partner/orders", CLIENT, &[("x-api-key", "pro-key-1")]);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&denied, "ratelimit")
        .unwrap()
        .starts_with("\"partner-3\";r=0;"));

    // Shadow: 2 a minute, never enforced, but the headers say what enforcement would do.
    for i in 0..5 {
        let response = h.send("/beta/feature", CLIENT, &[]);
        assert_eq!(response.status(), StatusCode::OK);
        let remaining = if i < 2 { 1 - i } else { 0 };
        assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            Some(&*remaining.to_string())
        );
        assert_eq!(header(&response, "retry-after"), None);
    }
    // /health is allow-listed; other paths have no policy.
    for _ in 0..50 {
        assert_eq!(h.status("/health", CLIENT, &[]), 200);
    }
    let other = h.send("/elsewhere", CLIENT, &[]);
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(header(&other, "ratelimit"), None);
}

#[test]
fn json_and_table_quotas_build_the_same_layer() {
    let json: LayerConfig = serde_json::from_str(
        r#"{
            "headers": "legacy",
            "on_missing_key": "allow",
            "policy": [{
                "name": "p",
                "algorithm": "fixed-window",
                "quota": { "limit": 3, "window": "1s" },
                "key": ["path", { "constant": "all" }],
                "methods": ["GET"]
            }]
        }"#,
    )
    .unwrap();
    let clock = ManualClock::new();
    let mut h = Harness::new(json, &clock);
    let statuses: Vec<u16> = (0..4)
        .map(|i| h.status("/x", [192, 0, 2, i], &[]))
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Another path is another composite key.
    assert_eq!(h.status("/y", CLIENT, &[]), 200);
    // The fixed window ends at 1 s.
    clock.advance(Duration::from_secs(1));
    assert_eq!(h.status("/x", CLIENT, &[]), 200);
}

/// The error message of a configuration that does not deserialize.
fn parse_error(toml_text: &str) -> String {
    match toml::from_str::<LayerConfig>(toml_text) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_values_are_errors_that_name_them() {
    let policy = |line: &str| format!("[[policy]]\nname = \"p\"\nquota = \"1/1s\"\n{line}\n");
    for (text, want) in [
        (
            "[[policy]]\nname = \"p\"\nquota = \"10/0s\"".to_owned(),
            "the window must be longer than zero",
        ),
        (
            "[[policy]]\nname = \"p\"\nquota = { limit = 10, window = \"0ms\" }".to_owned(),
            "the window must be longer than zero",
        ),
        (
            "[[policy]]\nname = \"p\"\nquota = \"0/1s\"".to_owned(),
            "the limit must be at least 1",
        ),
        (
            "[[policy]]\nname = \"p\"\nquota = \"10/1 parsec\"".to_owned(),
            "10/1 parsec",
        ),
        (
            "[[policy]]\nname = \"p\"\nquota = \"10/1s burst 0\"".to_owned(),
            "burst",
        ),
        (
            "[[policy]]\nname = \"p\"\nquota = []".to_owned(),
            "an empty list of quotas",
        ),
        (policy("algorithm = \"leaky\""), "unknown algorithm 'leaky'"),
        (
            "trusted_proxies = [\"10.0.0.0/33\"]".to_owned(),
            "10.0.0.0/33",
        ),
        (
            "trusted_proxies = [\"ten.0.0.0/8\"]".to_owned(),
            "ten.0.0.0/8",
        ),
        ("allow_cidrs = [\"::/129\"]".to_owned(), "::/129"),
        (
            "headers = \"fancy\"".to_owned(),
            "unknown header style \"fancy\"",
        ),
        ("proxy_header = \"x-real-ip\"".to_owned(), "x-real-ip"),
        (
            "on_error = 200".to_owned(),
            "status 200 is not a 4xx or 5xx",
        ),
        ("on_error = -1".to_owned(), "status -1"),
        ("on_error = \"maybe\"".to_owned(), "maybe"),
        ("ipv6_prefx = 64".to_owned(), "unknown field `ipv6_prefx`"),
        (policy("mode = \"loud\""), "unknown mode \"loud\""),
        (policy("key = \"cookie\""), "unknown key source \"cookie\""),
        (policy("key = { header = \"bad header\" }"), "bad header"),
        (
            policy("key = { header = \"a\", constant = \"b\" }"),
            "one entry",
        ),
        (policy("key = []"), "an empty composite key"),
        (policy("methods = [\"GE T\"]"), "GE T"),
        (policy("head_as_get = \"no\""), "head_as_get"),
        (
            "on_long_key = 200".to_owned(),
            "status 200 is not a 4xx or 5xx",
        ),
        (
            "on_long_key = \"hash\"".to_owned(),
            "unknown long-key answer \"hash\"",
        ),
        ("max_key_len = -1".to_owned(), "max_key_len"),
        (
            policy("on_missing_key = \"deny\""),
            "unknown fallback \"deny\"",
        ),
        (policy("burts = 3"), "unknown field `burts`"),
        (
            policy("tiers.pro = { quota = \"0/1s\" }"),
            "the limit must be at least 1",
        ),
        (
            policy("tiers.pro = { quota = \"1/1s\", keyz = [] }"),
            "unknown field `keyz`",
        ),
        (policy("refund = [\"6xx\"]"), "6xx"),
    ] {
        let message = parse_error(&text);
        assert!(message.contains(want), "{text:?}: {message}");
    }
}

#[test]
fn what_only_the_algorithm_or_the_layer_can_refuse_is_a_config_error() {
    let build = |text: &str| {
        toml::from_str::<LayerConfig>(text)
            .expect("parses")
            .build()
            .map(|_| ())
    };
    let e =
        build("[[policy]]\nname = \"w\"\nalgorithm = \"fixed-window\"\nquota = \"10/1s burst 5\"")
            .unwrap_err();
    assert!(
        matches!(e, ConfigError::Quota { ref policy, error: QuotaError::BurstNotSupported { .. } } if policy == "w"),
        "{e}"
    );
    let e = build("[[policy]]\nname = \"w\"\nalgorithm = \"sliding-window\"\nquota = \"10/500us\"")
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::Quota { ref policy, .. } if policy == "w"),
        "{e}"
    );
    let e = build("ipv6_prefix = 200").unwrap_err();
    assert_eq!(e, ConfigError::Ipv6Prefix(200));
    let e = build("[[policy]]\nname = \"a\"\nquota = \"1/1s\"\n[default_policy]\nname = \"a\"\nquota = \"1/1s\"")
        .unwrap_err();
    assert!(e.to_string().contains("used by another policy"), "{e}");
    let e =
        build("[[policy]]\nname = \"a\"\nquota = \"1/1s\"\npath = \"/a\"\npath_pattern = \"/a/*\"")
            .unwrap_err();
    assert!(e.to_string().contains("not both"), "{e}");
    build("[[policy]]\nname = \"a\"\nquota = [\"1/1s\", \"5/1m\"]\nmax_keys = 10")
        .expect("max_keys on several quotas");
    let e = build("[[policy]]\nname = \"t\"\nquota = \"1/1s\"\ntier = \"pro\"\ntiers.pro = { quota = \"5/1s\" }")
        .unwrap_err();
    assert!(e.to_string().contains("named twice"), "{e}");
    let e = build("[[policy]]\nname = \"t\"\nquota = \"1/1s\"\nalgorithm = \"fixed-window\"\ntiers.pro = { quota = \"5/1s burst 9\" }")
        .unwrap_err();
    assert!(e.to_string().contains("\"t/pro\""), "{e}");
    let e = build("[[policy]]\nname = \"\"\nquota = \"1/1s\"").unwrap_err();
    assert_eq!(e, ConfigError::PolicyName(String::new()));
    // A path that is empty, or does not start with `/`, would match every path or none.
    for (line, want) in [
        ("path = \"\"", "path prefix \"\" must start with `/`"),
        ("path = \"api\"", "path prefix \"api\" must start with `/`"),
        (
            "path_pattern = \"\"",
            "path pattern \"\" must start with `/`",
        ),
        (
            "cost_by_path = { \"\" = 2 }",
            "cost_by_path \"\" must start with `/`",
        ),
    ] {
        let e = build(&format!(
            "[[policy]]\nname = \"p\"\nquota = \"1/1s\"\n{line}"
        ))
        .unwrap_err();
        assert!(e.to_string().contains(want), "{line}: {e}");
    }
    build("max_key_len = 64\non_long_key = 431\n[[policy]]\nname = \"p\"\nquota = \"1/1s\"\non_missing_key = \"allow\"\nmax_waiters = [8, 2]")
        .expect("a key bound, a policy's own missing-key answer and waiter bounds");
    let e = build("[[policy]]\nname = \"p\"\nquota = \"1/1s\"\nmax_waiters = [8, 0]").unwrap_err();
    assert!(e.to_string().contains("max_waiters"), "{e}");
    let e = build("allow_paths = [\"/health\", \"\"]").unwrap_err();
    assert_eq!(e, ConfigError::AllowPath(String::new()));
}

/// A full key table refuses new keys with its own answer (default 503), whatever
/// `on_error` says: an attacker who fills `max_keys` gets no key through uncounted, on one
/// quota or several.
#[test]
fn max_keys_bounds_a_configured_policy() {
    for quota in ["\"1/1h\"", "[\"1/1h\", \"5/1d\"]"] {
        for (layer, full) in [("", 503), ("on_table_full = 429\n", 429)] {
            let text = format!(
                "on_error = \"allow\"\n{layer}[[policy]]\nname = \"p\"\nquota = {quota}\nmax_keys = 1\noverflow = \"deny\""
            );
            let config: LayerConfig = toml::from_str(&text).unwrap();
            let clock = ManualClock::new();
            let mut h = Harness::new(config, &clock);
            assert_eq!(h.status("/", [192, 0, 2, 1], &[]), 200, "{text}");
            for client in 2..10 {
                assert_eq!(h.status("/", [192, 0, 2, client], &[]), full, "{text}");
            }
            // The key it holds is unaffected.
            assert_eq!(h.status("/", [192, 0, 2, 1], &[]), 429, "{text}");
        }
    }
    // Shared overflow: new keys share one state, counted.
    let config: LayerConfig = toml::from_str(
        "[[policy]]\nname = \"p\"\nquota = [\"1/1h\", \"5/1d\"]\nmax_keys = 1\noverflow = \"shared\"",
    )
    .unwrap();
    let clock = ManualClock::new();
    let mut h = Harness::new(config, &clock);
    let statuses: Vec<u16> = (1..5).map(|c| h.status("/", [192, 0, 2, c], &[])).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
}

/// Sends one request through `svc` (a clone: each call its own service, as a server's
/// connections have).
async fn send_async(svc: &RateLimit<Ok200>, path: &str, peer: [u8; 4]) -> u16 {
    status(svc, request(path, Some(IpAddr::from(peer)), &[])).await
}

/// Delay mode on tokio's paused time: the limiter reads tokio's clock, so a wait of 500 ms is
/// exactly 500 ms of (virtual) time.
#[test]
fn the_example_upload_policy_waits_up_to_500ms_then_refuses() {
    let rt = paused_runtime();
    rt.block_on(async {
        use tokio::time::{timeout, Instant};
        let layer = example()
            .builder_with_clock(tollgate::wait::TokioClock::new())
            .unwrap()
            .build()
            .unwrap();
        let svc = layer.layer(Ok200);
        let start = Instant::now();
        // 2 a second, bursts of 2 (T = 500 ms): two at once.
        assert_eq!(send_async(&svc, "/upload", CLIENT).await, 200);
        assert_eq!(send_async(&svc, "/upload", CLIENT).await, 200);
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The third waits for its slot, 500 ms, and passes.
        assert_eq!(send_async(&svc, "/upload", CLIENT).await, 200);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        // Two together: both wait 500 ms; one unit is back, the other would wait 500 ms more,
        // over its bound: refused then.
        let (a, b) = tokio::join!(
            send_async(&svc, "/upload", CLIENT),
            send_async(&svc, "/upload", CLIENT)
        );
        let mut both = [a, b];
        both.sort_unstable();
        assert_eq!(both, [200, 429]);
        assert_eq!(start.elapsed(), Duration::from_millis(1_000));
        // A client that gives up while waiting costs nothing: after it left (200 ms into a
        // 500 ms wait), the next request waits only the 300 ms left, not 500 ms more.
        let before = Instant::now();
        assert!(timeout(
            Duration::from_millis(200),
            send_async(&svc, "/upload", CLIENT)
        )
        .await
        .is_err());
        assert_eq!(send_async(&svc, "/upload", CLIENT).await, 200);
        assert_eq!(before.elapsed(), Duration::from_millis(500));
        // Other clients and policies never waited.
        let before = Instant::now();
        assert_eq!(send_async(&svc, "/upload", [192, 0, 2, 1]).await, 200);
        assert_eq!(before.elapsed(), Duration::ZERO);
    });
}

#[test]
fn delay_mode_reads_from_configuration() {
    let mode = |text: &str| {
        toml::from_str::<LayerConfig>(&format!(
            "[[policy]]\nname = \"p\"\nquota = \"1/1s\"\nmode = {text}"
        ))
        .map(|c| c.policies[0].mode)
    };
    assert_eq!(
        mode("{ delay = \"250ms\" }").unwrap(),
        tollgate::tower::Mode::Delay {
            max_wait: Duration::from_millis(250)
        }
    );
    for (bad, want) in [
        ("\"delay\"", "needs its longest wait"),
        ("{ delay = \"soon\" }", "soon"),
        ("{ wait = \"1s\" }", "unknown mode \"wait\""),
    ] {
        let message = mode(bad).unwrap_err().to_string();
        assert!(message.contains(want), "{bad}: {message}");
    }
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    /// Values, some valid and many not, for every setting.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"10/1s burst 20\"".to_owned()),
            Just("[\"1/1ms\", \"18446744073709551615/1d\"]".to_owned()),
            Just("{ limit = 0, window = \"1s\" }".to_owned()),
            Just("\"fixed-window\"".to_owned()),
            Just("\"sliding-log\"".to_owned()),
            Just("{ delay = \"1ms\" }".to_owned()),
            Just("[\"client-ip\", { header = \"x\" }]".to_owned()),
            Just("[\"::/0\", \"10.0.0.0/8\"]".to_owned()),
            Just("18446744073709551615".to_owned()),
            Just("-1".to_owned()),
            Just("[]".to_owned()),
            Just("{}".to_owned()),
            "\"[ -~]{0,12}\"",
            "[0-9]{1,22}",
        ]
    }

    fn field() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "quota",
            "algorithm",
            "mode",
            "key",
            "cost",
            "max_keys",
            "refund",
            "path",
            "path_pattern",
            "methods",
            "tier",
            "tiers.pro",
            "cost_by_path",
            "overflow",
        ])
    }

    fn top() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "headers",
            "trusted_proxies",
            "proxy_header",
            "ipv6_prefix",
            "allow_cidrs",
            "allow_paths",
            "on_missing_key",
            "on_error",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Whatever a file holds, parsing and building answer with a value or an error; a
        /// layer built from it answers a request with a status of its own or one the file
        /// configured, and a refusal says why. (Each setting is written once, and a policy
        /// has a valid quota unless one is drawn: about one file in ten builds.)
        #[test]
        fn any_configuration_parses_and_builds_without_panicking(
            globals in prop::collection::vec((top(), value()), 0..3),
            fields in prop::collection::vec((field(), value()), 0..6),
        ) {
            let mut text = String::new();
            for (name, v) in &globals {
                text.push_str(&format!("{name} = {v}\n"));
            }
            text.push_str("[[policy]]\nname = \"p\"\n");
            let mut written = Vec::new();
            for (name, v) in &fields {
                if !written.contains(name) {
                    written.push(*name);
                    text.push_str(&format!("{name} = {v}\n"));
                }
            }
            if !written.contains(&"quota") {
                text.push_str("quota = \"10/1s burst 20\"\n");
            }
            if let Ok(config) = toml::from_str::<LayerConfig>(&text) {
                match config.builder_with_clock(ManualClock::new()).and_then(|b| b.build()) {
                    Ok(layer) => {
                        let mut h = Harness { svc: layer.layer(Ok200), rt: runtime() };
                        for _ in 0..2 {
                            let status = h.status("/", CLIENT, &[]);
                            prop_assert!(
                                [200, 400, 429, 431, 503].contains(&status)
                                    || text.contains(&status.to_string()),
                                "{text}: answered {status}"
                            );
                        }
                    }
                    Err(error) => prop_assert!(!error.to_string().is_empty(), "{text}"),
                }
            }
        }
    }
}

#[test]
fn extreme_values_build_or_are_refused() {
    for extra in [
        "max_keys = 18446744073709551615",
        "algorithm = \"sliding-log\"\nquota = \"1048575/1s\"",
        "algorithm = \"sliding-log\"\nquota = \"18446744073709551615/1d\"",
        "quota = \"18446744073709551615/1ns\"",
        "cost = 18446744073709551615",
    ] {
        let text = format!("[[policy]]\nname = \"p\"\n{extra}\n");
        let text = if extra.contains("quota") {
            text
        } else {
            format!("{text}quota = \"1/1s\"\n")
        };
        let config: LayerConfig = toml::from_str(&text).expect(&text);
        let built = config
            .builder_with_clock(ManualClock::new())
            .and_then(|b| b.build());
        if let Ok(layer) = built {
            // A request still gets an answer.
            let mut h = Harness {
                svc: layer.layer(Ok200),
                rt: tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap(),
            };
            let status = h.status("/", CLIENT, &[]);
            assert!([200, 429].contains(&status), "{extra}: {status}");
        }
    }
}

/// Delay mode over a leaky queue: requests are served in arrival order, one every 100 ms, and
/// one that gives up before its slot hands the slot back.
#[test]
fn a_queued_request_that_gives_up_returns_its_slot() {
    let rt = paused_runtime();
    rt.block_on(async {
        use tokio::time::{timeout, Instant};
        let config: LayerConfig = toml::from_str(
            "[[policy]]\nname = \"q\"\nalgorithm = \"leaky-queue\"\nquota = \"10/1s burst 5\"\nmode = { delay = \"1s\" }",
        )
        .unwrap();
        let svc = config
            .builder_with_clock(tollgate::wait::TokioClock::new())
            .unwrap()
            .build()
            .unwrap()
            .layer(Ok200);
        let start = Instant::now();
        let done = std::sync::Mutex::new(Vec::new());
        let request = |name: &'static str| {
            let (svc, done) = (&svc, &done);
            async move {
                assert_eq!(send_async(svc, "/", CLIENT).await, 200);
                done.lock().unwrap().push((name, start.elapsed().as_millis()));
            }
        };
        tokio::join!(request("a"), request("b"), request("c"));
        assert_eq!(
            done.lock().unwrap().clone(),
            [("a", 0), ("b", 100), ("c", 200)]
        );
        // The next slot is at 300 ms (100 ms from now): a request takes it and leaves after
        // 50 ms; the next one gets that slot, 50 ms later, not the one after it.
        let start = Instant::now();
        assert!(timeout(Duration::from_millis(50), send_async(&svc, "/", CLIENT))
            .await
            .is_err());
        assert_eq!(send_async(&svc, "/", CLIENT).await, 200);
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    });
}

/// `RateLimitLayer::evaluate` (what `tollgate replay --config` runs) decides as the service
/// does: two layers from one configuration, one request sequence, the same answers.
#[test]
fn evaluate_decides_as_the_service_does() {
    use tollgate::tower::Outcome;
    let (clock, twin_clock) = (ManualClock::new(), ManualClock::new());
    let mut served = Harness::new(example(), &clock);
    let evaluated = example()
        .builder_with_clock(twin_clock.clone())
        .expect("a valid configuration")
        .build()
        .expect("a valid layer");
    let paths = [
        "/api/items",
        "/api/export",
        "/partner/x",
        "/beta/x",
        "/health",
        "/other",
    ];
    let keys = [None, Some("pro-key-1"), Some("free-1")];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut outcomes = std::collections::HashSet::new();
    for _ in 0..3000 {
        let step = Duration::from_millis(next(40));
        clock.advance(step);
        twin_clock.advance(step);
        let path = paths[next(paths.len() as u64) as usize];
        let peer = [192, 0, 2, 1 + next(3) as u8];
        let api_key = keys[next(keys.len() as u64) as usize];
        let headers: Vec<(&str, &str)> = api_key.iter().map(|k| ("x-api-key", *k)).collect();
        let status = served.status(path, peer, &headers);
        let (parts, _) = request(path, Some(IpAddr::from(peer)), &headers).into_parts();
        let evaluation = served.rt.block_on(evaluated.evaluate(&parts, None));
        outcomes.insert(evaluation.outcome);
        let expected = match (evaluation.passes, evaluation.outcome) {
            (true, _) => 200,
            (false, Outcome::Denied) => 429,
            (false, Outcome::NoKey) => 400,
            (false, other) => panic!("{path}: {other} does not pass"),
        };
        assert_eq!(
            status, expected,
            "{path} from {peer:?} with {api_key:?}: {evaluation:?}"
        );
    }
    // The sequence met every outcome this configuration has without delay mode.
    for outcome in [
        Outcome::Allowed,
        Outcome::Denied,
        Outcome::ShadowDenied,
        Outcome::NoKey,
        Outcome::Passed,
    ] {
        assert!(outcomes.contains(&outcome), "never {outcome}: {outcomes:?}");
    }
}

/// The builder's `allow_paths` is the configuration's: the same paths bypass every policy the
/// same way (whole segments of the client's path, normalised), beside an `allow_if`, which no
/// longer replaces a configuration's `allow_paths`.
#[test]
fn the_builders_allow_paths_is_the_configurations() {
    use tollgate::tower::{Policy, RateLimitLayer};
    use tollgate::Quota;
    let clock = ManualClock::new();
    let internal = |parts: &http::request::Parts| parts.headers.contains_key("x-internal");
    let config: LayerConfig =
        toml::from_str("allow_paths = [\"/health\"]\n[[policy]]\nname = \"p\"\nquota = \"1/1h\"")
            .unwrap();
    let configured = config
        .builder_with_clock(clock.clone())
        .unwrap()
        .allow_if(internal)
        .build()
        .unwrap();
    let per_hour = tower_support::gcra(&clock, Quota::per_hour(1).unwrap());
    let built = RateLimitLayer::builder()
        .policy(Policy::new("p", per_hour))
        .allow_paths(["/health"])
        .allow_if(internal)
        .build()
        .unwrap();
    let rt = runtime();
    for (name, layer) in [("configured", configured), ("built", built)] {
        let mut svc = layer.layer(Ok200);
        let mut status = |path: &str, headers: &[(&str, &str)]| {
            let request = request(path, Some(IpAddr::from([192, 0, 2, 1])), headers);
            call(&rt, &mut svc, request).status().as_u16()
        };
        for path in [
            "/health",
            "/health/",
            "/health/live",
            "//health",
            "/x/../health",
            "/%68ealth",
        ] {
            for _ in 0..3 {
                assert_eq!(status(path, &[]), 200, "{name}: {path}");
            }
        }
        for _ in 0..3 {
            assert_eq!(
                status("/api", &[("x-internal", "1")]),
                200,
                "{name}: allow_if"
            );
        }
        assert_eq!(status("/healthz", &[]), 200, "{name}: the one unit");
        assert_eq!(status("/health/../api", &[]), 429, "{name}: not /health");
        assert_eq!(status("/healthz", &[]), 429, "{name}: not /health");
    }
    let bad = RateLimitLayer::builder()
        .allow_paths(["/ok", "health"])
        .build();
    assert_eq!(bad.err(), Some(ConfigError::AllowPath("health".to_owned())));
}
