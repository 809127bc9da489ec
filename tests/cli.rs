//! The `tollgate` binary: replay output, bad input (message naming the line, exit status 2),
//! summary, compare, bench, and `--redis` printing exactly what the in-process replay prints.
#![cfg(feature = "cli")]

#[cfg(feature = "redis")]
#[path = "support/redis_server.rs"]
mod redis_server;

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn tollgate(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tollgate binary runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn replay(algorithm: &str, limit: &str, window: &str, trace: &str) -> Output {
    tollgate(
        &[
            "replay",
            "--algorithm",
            algorithm,
            "--limit",
            limit,
            "--window",
            window,
        ],
        trace,
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn replays_the_spec_format() {
    let trace = "# header\n0,a\n0,a\n\n500,b,2\n1000,a\n1000,a,5\n";
    let o = replay("fixed-window", "2", "1s", trace);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "allow\nallow\nallow\nallow\nerror\n");
}

#[test]
fn leaky_queue_prints_delays_in_milliseconds() {
    let o = tollgate(
        &[
            "replay",
            "--algorithm",
            "leaky-queue",
            "--limit",
            "10",
            "--window",
            "1s",
            "--burst",
            "3",
        ],
        "0,k\n0,k\n0,k\n0,k\n",
    );
    assert_eq!(stdout(&o), "allow 0\nallow 100\nallow 200\ndeny\n");
}

#[test]
fn bad_lines_name_the_line_and_exit_2_after_printing_what_was_decided() {
    // (trace, the bad line, a word of the message, decisions printed before it)
    for (trace, line, what, printed) in [
        ("0,a\n5,a,x\n", 2, "cost", 1),
        ("0,a\n\n#\nsoon,a\n", 4, "time", 1),
        ("10,a\n5,a\n", 2, "backwards", 1),
        ("0,a\n1,a,1,1\n", 2, "too many", 1),
        ("-1,a\n", 1, "time", 0),
        ("0\n", 1, "expected", 0),
    ] {
        let o = replay("gcra", "10", "1s", trace);
        assert_eq!(o.status.code(), Some(2), "{trace:?}");
        let err = stderr(&o);
        assert!(err.contains(&format!("line {line}")), "{trace:?}: {err}");
        assert!(err.contains(what), "{trace:?}: {err}");
        assert_eq!(stdout(&o).lines().count(), printed, "{trace:?}");
    }
}

#[test]
fn bad_options_exit_2_with_a_message() {
    for args in [
        vec![
            "replay",
            "--algorithm",
            "nope",
            "--limit",
            "1",
            "--window",
            "1s",
        ],
        vec![
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "0",
            "--window",
            "1s",
        ],
        vec![
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1 parsec",
        ],
        vec![
            "replay",
            "--algorithm",
            "fixed-window",
            "--limit",
            "1",
            "--window",
            "1s",
            "--burst",
            "3",
        ],
        vec![
            "replay",
            "--algorithm",
            "sliding-log",
            "--limit",
            "1",
            "--window",
            "10us",
        ],
        vec!["replay", "--limit", "1", "--window", "1s"],
        vec![
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "/no/such/file",
        ],
    ] {
        let o = tollgate(&args, "");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&o).trim().is_empty(), "{args:?}");
    }
}

#[test]
fn summary_counts_per_key_and_in_total() {
    let o = tollgate(
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--summary",
        ],
        "0,a\n0,a\n0,b\n1000,a\n",
    );
    assert_eq!(
        stdout(&o),
        "key,allowed,denied,errors\na,2,1,0\nb,1,0,0\nTOTAL,3,1,0\n"
    );
}

#[test]
fn compare_runs_every_algorithm_against_the_sliding_log() {
    let o = tollgate(
        &["replay", "--compare", "--limit", "2", "--window", "1s"],
        "0,a\n0,a\n0,a\n600,a\n1000,a\n1500,a\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for name in [
        "gcra",
        "leaky-queue",
        "fixed-window",
        "sliding-window",
        "sliding-log",
    ] {
        assert!(out.contains(name), "{out}");
    }
    assert!(out.contains("6 requests"), "{out}");
}

#[test]
fn bench_prints_a_table_with_the_floor() {
    let o = tollgate(
        &[
            "bench",
            "--keys",
            "1000",
            "--duration",
            "20ms",
            "--algorithm",
            "gcra,sliding-log",
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("floor") && out.contains("gcra") && out.contains("bytes/key"),
        "{out}"
    );
}

#[test]
fn bench_regime_prints_throughput_and_with_latency_a_tails_table() {
    let o = tollgate(
        &[
            "bench",
            "--regime",
            "returning",
            "--latency",
            "--keys",
            "1000",
            "--duration",
            "20ms",
            "--checks",
            "20000",
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let id = "returning/u64/1k/uniform/1t/precise";

    // Throughput: the row's ID, ns/check, Mops/s, allowed share (values not judged).
    let line = out
        .lines()
        .find(|l| l.starts_with(id) && !l.contains('|'))
        .unwrap_or_else(|| panic!("a throughput line for {id}: {out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{line}");
    assert!(fields[1].parse::<f64>().is_ok() && fields[2].parse::<f64>().is_ok());
    assert!(fields[3].ends_with('%'), "{line}");

    // Tails: a header naming every column, then the row: five durations, the count over
    // 10 µs, the share allowed.
    let header = out
        .lines()
        .find(|l| l.starts_with("row") && l.contains("p50"))
        .unwrap_or_else(|| panic!("a tails header: {out}"));
    let columns: Vec<&str> = header.split_whitespace().collect();
    for column in ["p50", "p99", "p99.9", "p99.99", "max", ">10µs", "allowed"] {
        assert!(columns.contains(&column), "{header}");
    }
    let line = out
        .lines()
        .find(|l| l.starts_with(id) && l.contains('|'))
        .unwrap_or_else(|| panic!("a tails line for {id}: {out}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    assert_eq!(cells.len(), 3, "{line}");
    let tokens: Vec<&str> = cells[1].split_whitespace().collect();
    assert_eq!(tokens.len(), 11, "{line}");
    for pair in tokens[..10].chunks(2) {
        assert!(pair[0].parse::<f64>().is_ok(), "{line}");
        assert!(["ns", "µs", "ms", "s"].contains(&pair[1]), "{line}");
    }
    assert!(tokens[10].parse::<u64>().is_ok(), "{line}");
    assert!(cells[2].parse::<f64>().is_ok(), "{line}");

    // The regime options are checked.
    for bad in [
        &["bench", "--latency"][..],
        &["bench", "--regime", "sometimes"],
        &["bench", "--regime", "api", "--key-type", "uuid"],
        &["bench", "--regime", "api", "--algorithm", "gcra"],
    ] {
        let o = tollgate(bad, "");
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stdout(&o));
    }
}

#[cfg(feature = "redis")]
#[test]
fn replay_through_redis_prints_what_in_process_prints() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let trace = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/traces/api.csv"
    ))
    .unwrap();
    for algorithm in [
        "gcra",
        "leaky-queue",
        "fixed-window",
        "sliding-window",
        "sliding-log",
    ] {
        let local = replay(algorithm, "10", "1s", &trace);
        let url = server.url();
        let remote = tollgate(
            &[
                "replay",
                "--algorithm",
                algorithm,
                "--limit",
                "10",
                "--window",
                "1s",
                "--redis",
                &url,
            ],
            &trace,
        );
        assert!(remote.status.success(), "{algorithm}: {}", stderr(&remote));
        assert_eq!(stdout(&remote), stdout(&local), "{algorithm}");
    }
}

#[cfg(feature = "redis")]
#[test]
fn bench_redis_prints_one_json_object_per_process() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let url = server.url();
    for mode in ["exact", "coalesced", "leased"] {
        let o = tollgate(
            &[
                "bench",
                "--redis",
                &url,
                "--mode",
                mode,
                "--duration",
                "300ms",
                "--limit",
                "1000",
                "--window",
                "1s",
                "--json",
            ],
            "",
        );
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
        let out = stdout(&o);
        for field in [
            "\"checks\":",
            "\"admitted\":",
            "\"round_trips\":",
            "\"seconds\":",
        ] {
            assert!(out.contains(field), "{mode}: {out}");
        }
        let admitted: u64 = out
            .split("\"admitted\":")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        // Burst 1000 plus 300 ms at 1000/s, whatever the mode.
        assert!(admitted <= 1000 + 300 + 5, "{mode}: admitted {admitted}");
    }
}
