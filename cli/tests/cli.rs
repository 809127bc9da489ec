//! The `tollgate` binary: replay output, bad input (message naming the line, exit status 2),
//! summary (CSV, for people, JSON; per-line output when piped), compare, `--redis` printing
//! exactly what the in-process replay prints, and `--config` deciding through the tower layer
//! a server builds from the same file. Files are named from the repository's root (`ROOT`),
//! which holds the traces, the configurations and the docs that quote the commands.

#[cfg(feature = "redis")]
#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// A path from the repository's root, this crate's parent.
macro_rules! root {
    ($path:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../", $path)
    };
}

/// The repository's root.
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn tollgate(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tollgate binary runs");
    let written = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    // A run refused for its options exits before it reads: its input pipe is then closed.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
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
        ("0,a\n1,a,1,1\n", 2, "method needs a path", 1),
        ("0,a\n1,a,1,GET,api\n", 2, "path", 1),
        ("0,a\n1,a,1,G@T,/api\n", 2, "method", 1),
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
            "--format",
            "json",
            "--redis",
            "redis://127.0.0.1:1",
        ],
        vec![
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--format",
            "yaml",
        ],
        vec![
            "replay",
            "--compare",
            "--limit",
            "1",
            "--window",
            "1s",
            "--format",
            "json",
        ],
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

const API_TRACE: &str = root!("examples/traces/api.csv");

/// The README's main job, up to its options and trace.
const MAIN_JOB: [&str; 9] = [
    "replay",
    "--algorithm",
    "gcra",
    "--limit",
    "10",
    "--window",
    "1s",
    "--burst",
    "20",
];

/// The README's main-job arguments, with `extra` before the trace.
fn main_job(extra: &[&str]) -> Output {
    let mut args = MAIN_JOB.to_vec();
    args.extend_from_slice(extra);
    args.push(API_TRACE);
    tollgate(&args, "")
}

/// (allowed, denied, errors) counted from the per-line output.
fn count_lines(out: &str) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for line in out.lines() {
        match line.split_whitespace().next() {
            Some("allow") => counts.0 += 1,
            Some("deny") => counts.1 += 1,
            Some("error") => counts.2 += 1,
            _ => panic!("not a decision line: {line:?}"),
        }
    }
    counts
}

/// The number after `label` at the start of a summary line.
fn summary_figure(out: &str, label: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("a '{label}' line: {out}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn piped_output_stays_one_line_per_request_and_nothing_on_stderr() {
    // `--format auto` (the default) and `--format lines` print the same stable format when
    // standard output is not a terminal; no progress bar reaches a stderr that is not one.
    let auto = main_job(&[]);
    let lines = main_job(&["--format", "lines"]);
    assert!(auto.status.success(), "{}", stderr(&auto));
    assert_eq!(stdout(&auto), stdout(&lines));
    assert_eq!(stderr(&auto), "");
    let trace_requests = std::fs::read_to_string(API_TRACE)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(stdout(&auto).lines().count(), trace_requests);
    let piped = tollgate(
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
        ],
        &"0,a\n".repeat(5000),
    );
    assert_eq!(
        (stdout(&piped).lines().count(), stderr(&piped)),
        (5000, String::new())
    );
}

#[test]
fn the_summary_for_people_has_totals_the_top_keys_and_the_peak() {
    let (allowed, denied, errors) = count_lines(&stdout(&main_job(&["--format", "lines"])));
    let o = main_job(&["--format", "summary", "--top", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(summary_figure(&out, "requests"), allowed + denied + errors);
    assert_eq!(summary_figure(&out, "allowed"), allowed);
    assert_eq!(summary_figure(&out, "denied"), denied);
    assert_eq!(summary_figure(&out, "errors"), errors);
    assert_eq!(summary_figure(&out, "limit"), 10);
    // GCRA admits at most a full bucket plus a window's refill in any one window.
    let peak = summary_figure(&out, "peak");
    assert!((10..=30).contains(&peak), "{out}");
    // The totals are aligned: every figure ends in the same column.
    let ends: Vec<usize> = ["requests", "allowed", "denied", "errors", "peak", "limit"]
        .iter()
        .map(|label| {
            let line = out
                .lines()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap();
            let start = line.find(label).unwrap() + label.len();
            let rest = &line[start..];
            let digits = rest.trim_start();
            start + (rest.len() - digits.len()) + digits.find(' ').unwrap_or(digits.len())
        })
        .collect();
    assert!(ends.windows(2).all(|w| w[0] == w[1]), "{ends:?}\n{out}");
    // The key table: a header, three keys, most denials first, mallory (the flood) on top.
    let header = out
        .lines()
        .position(|l| l.contains("key") && l.contains("denied"))
        .unwrap();
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(header + 1)
        .take(3)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][0], "mallory", "{out}");
    let denials: Vec<u64> = rows.iter().map(|r| r[3].parse().unwrap()).collect();
    assert!(denials.windows(2).all(|w| w[0] >= w[1]), "{out}");
    assert!(out.contains("more keys"), "{out}");
}

#[test]
fn json_prints_the_summary_as_one_object() {
    let (allowed, denied, errors) = count_lines(&stdout(&main_job(&["--format", "lines"])));
    let o = main_job(&["--format", "json", "--top", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["algorithm"], "gcra");
    assert_eq!(
        (
            v["limit"].as_u64(),
            v["window_ms"].as_u64(),
            v["burst"].as_u64()
        ),
        (Some(10), Some(1000), Some(20))
    );
    assert_eq!(v["allowed"].as_u64(), Some(allowed));
    assert_eq!(v["denied"].as_u64(), Some(denied));
    assert_eq!(v["errors"].as_u64(), Some(errors));
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys.len() as u64, v["key_count"].as_u64().unwrap());
    let sum = |field: &str| keys.iter().map(|k| k[field].as_u64().unwrap()).sum::<u64>();
    assert_eq!(
        (sum("allowed"), sum("denied"), sum("errors")),
        (allowed, denied, errors)
    );
    assert_eq!(v["peak"]["key"], "mallory");
    // A key with a quote and a backslash survives the round trip.
    let o = tollgate(
        &[
            "replay",
            "--algorithm",
            "fixed-window",
            "--limit",
            "1",
            "--window",
            "1s",
            "--format",
            "json",
        ],
        "0,a\"b\\c\n",
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["keys"][0]["key"], "a\"b\\c");
}

#[test]
fn a_bad_line_still_prints_the_summary_of_what_was_decided() {
    let o = tollgate(
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--format",
            "json",
        ],
        "0,a\n0,a\n5,a,x\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 3"), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (v["allowed"].as_u64(), v["denied"].as_u64()),
        (Some(1), Some(1))
    );
}

/// On a terminal (a pty from util-linux's `script`), the default is the summary. Skipped where
/// `script` is missing.
#[test]
fn a_terminal_gets_the_summary_by_default() {
    let bin = env!("CARGO_BIN_EXE_tollgate");
    let command =
        format!("'{bin}' replay --algorithm gcra --limit 10 --window 1s --burst 20 '{API_TRACE}'");
    let Ok(o) = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output()
    else {
        eprintln!("no `script` here: the terminal case is not checked");
        return;
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("requests") && out.contains("top 10 keys by denials"),
        "{out}"
    );
    assert!(!out.lines().any(|l| l.trim() == "deny"), "{out}");
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

#[cfg(feature = "redis")]
#[test]
fn replay_through_redis_prints_what_in_process_prints() {
    let Some(server) = redis_server::RedisServer::start() else {
        return;
    };
    let trace = std::fs::read_to_string(API_TRACE).unwrap();
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

/// A file of this test run's own in the temporary directory, removed when the test is done
/// with it, a failed assertion included.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!("tollgate-cli-{}-{name}", std::process::id())))
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a temporary path in UTF-8")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}

/// A fresh path for an SVG in the system's temporary directory.
fn svg_path(name: &str) -> TempFile {
    TempFile::new(&format!("{name}.svg"))
}

/// The plot's data series (polylines of more than two points: axes, ticks, legend marks and
/// the limit have two) and the texts of its legend, read from the SVG as XML.
fn read_svg(file: &TempFile) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(&file.0).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the plot is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let series = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
                > 2
        })
        .count();
    let texts = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_owned())
        .collect();
    (series, texts)
}

#[test]
fn compare_plots_one_admitted_series_per_algorithm_with_the_tables_counts() {
    let path = svg_path("compare");
    let trace = root!("examples/traces/boundary.csv");
    let o = tollgate(
        &[
            "replay",
            "--compare",
            "--limit",
            "10",
            "--window",
            "1s",
            "--bucket",
            "100ms",
            "--plot",
            path.path(),
            trace,
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (series, texts) = read_svg(&path);
    let table = stdout(&o);
    let rows: Vec<(String, String)> = table
        .lines()
        .skip(1)
        .filter(|l| !l.contains("requests"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[1].to_owned())
        })
        .collect();
    assert_eq!(rows.len(), 5, "{table}");
    assert_eq!(series, rows.len(), "{texts:?}");
    for (algorithm, allowed) in rows {
        let label = format!("{algorithm}: {allowed} admitted");
        assert!(texts.contains(&label), "{label} in {texts:?}");
    }
    assert!(
        texts.contains(&"limit: 10 per 1s per key".to_owned()),
        "{texts:?}"
    );
}

#[test]
fn plot_of_one_algorithm_shows_admitted_denied_and_the_limit_as_the_summary_counts() {
    let path = svg_path("main-job");
    let o = main_job(&["--format", "json", "--plot", path.path()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let (series, texts) = read_svg(&path);
    assert_eq!(series, 2, "{texts:?}");
    let admitted = format!("gcra: {} admitted", v["allowed"]);
    let denied = format!(
        "denied: {} (errors, not drawn: {})",
        v["denied"], v["errors"]
    );
    for label in [
        admitted.as_str(),
        denied.as_str(),
        "limit: 10 per 1s per key",
    ] {
        assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
    }

    // One key: its own counts, and the limit is that key's.
    let path = svg_path("one-key");
    let o = main_job(&[
        "--format",
        "json",
        "--top",
        "0",
        "--plot",
        path.path(),
        "--key",
        "mallory",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mallory = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "mallory")
        .unwrap();
    let (series, texts) = read_svg(&path);
    assert_eq!(series, 2, "{texts:?}");
    let admitted = format!("gcra: {} admitted", mallory["allowed"]);
    let denied = format!("denied: {}", mallory["denied"]);
    for label in [admitted.as_str(), denied.as_str(), "limit: 10 per 1s"] {
        assert!(texts.iter().any(|t| t == label), "{label} in {texts:?}");
    }
}

#[test]
fn plot_options_are_checked() {
    let unwritable = "/no/such/dir/plot.svg";
    for args in [
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--key",
            "a",
        ][..],
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--plot",
            unwritable,
        ],
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--bucket",
            "1s",
        ],
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "1s",
            "--plot",
            "x.svg",
            "--bucket",
            "soon",
        ],
    ] {
        // No input: a refused option exits before reading it (writing it could break the pipe).
        let o = tollgate(args, "");
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&o).trim().is_empty(), "{args:?}");
    }
    // An empty trace still plots (an empty chart with the limit).
    let path = svg_path("empty");
    let o = tollgate(
        &[
            "replay",
            "--algorithm",
            "gcra",
            "--limit",
            "1",
            "--window",
            "10us",
            "--plot",
            path.path(),
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (series, texts) = read_svg(&path);
    assert!(
        series <= 2 && texts.iter().any(|t| t == "gcra: 0 admitted"),
        "{texts:?}"
    );
}

/// The plots shipped in docs/ are what the commands quoted next to them draw today.
#[test]
fn the_shipped_plots_are_current() {
    for (shipped, args) in [
        ("api.svg", MAIN_JOB.to_vec()),
        (
            "boundary.svg",
            vec![
                "replay",
                "--compare",
                "--limit",
                "10",
                "--window",
                "1s",
                "--bucket",
                "100ms",
                "--key",
                "edge",
            ],
        ),
    ] {
        let path = svg_path(shipped);
        let mut args = args;
        args.extend(["--plot", path.path()]);
        // The title names the trace as given: the commands use repository-relative paths.
        let trace = if shipped == "api.svg" {
            "examples/traces/api.csv"
        } else {
            "examples/traces/boundary.csv"
        };
        args.push(trace);
        let o = tollgate_at_root(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let drawn = std::fs::read_to_string(&path.0).unwrap();
        let expected = std::fs::read_to_string(format!("{ROOT}/docs/{shipped}")).unwrap();
        assert!(
            drawn == expected,
            "docs/{shipped} is stale: redraw it with tollgate {}",
            args.join(" ")
        );
    }
}

/// On a terminal, a long input draws a progress bar on standard error (cleared before the
/// report); the same input with standard error on a pipe draws nothing. Skipped where
/// util-linux's `script` is missing.
#[test]
fn a_progress_bar_only_on_a_terminal() {
    let path = TempFile::new("long.csv");
    let mut trace = String::new();
    let mut t = 0u64;
    while trace.len() < 4 << 20 {
        trace.push_str(&format!("{t},key-{}\n", t % 1000));
        t += 1;
    }
    std::fs::write(&path.0, &trace).unwrap();
    let args = [
        "replay",
        "--algorithm",
        "gcra",
        "--limit",
        "10",
        "--window",
        "1s",
        "--format",
        "json",
        path.path(),
    ];
    let piped = tollgate(&args, "");
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert_eq!(stderr(&piped), "");
    let command = format!(
        "'{}' {} > /dev/null",
        env!("CARGO_BIN_EXE_tollgate"),
        args.map(|a| format!("'{a}'")).join(" ")
    );
    let on_a_terminal = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::null())
        .output();
    let Ok(o) = on_a_terminal else {
        eprintln!("no `script` here: the terminal case is not checked");
        return;
    };
    let err = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("MiB"), "a bar counting bytes: {err:?}");
}

/// The text of `file` (a path from the repository's root) from the end of `after` (the first
/// place it appears) to the end of its code block.
fn quote(file: &str, after: &str) -> String {
    let text = std::fs::read_to_string(format!("{ROOT}/{file}")).unwrap();
    let start = text
        .find(after)
        .unwrap_or_else(|| panic!("{file} has {after:?}"))
        + after.len();
    text[start..start + text[start..].find("```").unwrap()].to_owned()
}

/// The README's text from the end of `after` to the end of its code block.
fn readme_quote(after: &str) -> String {
    quote("README.md", after)
}

/// The binary run from the repository's root (the README's commands name files from there).
fn tollgate_at_root(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(ROOT)
        .args(args)
        .output()
        .unwrap()
}

/// README's sample of the main job's summary is what the command prints today (run from the
/// repository's root, as README says).
#[test]
fn the_readme_shows_what_the_main_job_prints() {
    // The quote starts with the summary's first line, inside its ```text block.
    let quoted = format!(
        "tollgate replay: gcra{}",
        readme_quote("```text\ntollgate replay: gcra")
    );
    let mut args = MAIN_JOB.to_vec();
    args.extend(["--format", "summary", "examples/traces/api.csv"]);
    let o = tollgate_at_root(&args);
    assert_eq!(stdout(&o), quoted);
}

/// `tollgate replay --config FILE` on `trace`, with `extra` options.
fn replay_config(config: &str, extra: &[&str], trace: &str) -> Output {
    let mut args = vec!["replay", "--config", config];
    args.extend_from_slice(extra);
    tollgate(&args, trace)
}

const POLICIES: &str = root!("examples/policies.toml");

#[test]
fn config_replay_decides_as_the_example_server_would() {
    let trace = "\
# t_ms,key[,cost[,method,path]]
0,203.0.113.7,,GET,/api/items
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/items
0,2001:db8:0:1::1,,GET,/api/items
0,pro-key-1,,GET,/partner/x
0,free-key,,GET,/partner/x
0,203.0.113.9,,GET,/beta/x
0,203.0.113.9,,GET,/beta/x
0,203.0.113.9,,GET,/beta/x
0,203.0.113.9,,GET,/health
0,203.0.113.9,,GET,/elsewhere
20,alice
";
    let o = replay_config(POLICIES, &[], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = [
        // 10/s, burst 20 per IP: 1 + 5 + 5 + 5 = 16, a fourth export would make 21.
        "allowed api",
        "allowed api",
        "allowed api",
        "allowed api",
        "denied api",
        "allowed api",
        "allowed api",
        // Keyed by the x-api-key header: the trace's key.
        "allowed partner",
        "allowed partner",
        // Sliding window, 2 a minute, shadow: the third would be denied, and passes.
        "allowed beta",
        "allowed beta",
        "shadow_denied beta",
        // Allow-listed, no policy matches, and no route (GET /): uncounted.
        "passed",
        "passed",
        "passed",
    ];
    assert_eq!(stdout(&o).lines().collect::<Vec<_>>(), expected);
    assert!(stderr(&o).is_empty());
}

#[test]
fn config_replay_waits_in_the_traces_time_and_prints_in_its_order() {
    // /upload: 2 a second per client (burst 2), delay mode up to 500 ms. The third request's
    // slot is 500 ms away: it waits (in the trace's time: the replay does not sleep) and the
    // lines after it are decided meanwhile, printed after it.
    let trace = "\
0,192.0.2.1,,POST,/upload
0,192.0.2.1,,POST,/upload
0,192.0.2.1,,POST,/upload
100,192.0.2.1,,POST,/upload
100,192.0.2.2,,POST,/upload
600,192.0.2.1,,POST,/upload
";
    let o = replay_config(POLICIES, &["--format", "lines"], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "allowed upload\nallowed upload\ndelayed upload 500\ndenied upload\n\
         allowed upload\ndelayed upload 400\n"
    );

    // A rule without reservations (a fixed window) sleeps until its window opens and checks
    // again, each waiter a little later than the window's start (up to a quarter of its
    // wait, from the policy's own sequence: the same on every replay): the second and third
    // requests both wait for the next window; the third wakes first (at 1,146 ms) and takes
    // it, the second waits for the window after (2 s, its bound); the fourth, at 2.5 s, for
    // the window after that (511 ms: 3 s and its spread).
    let config = TempFile::new("window.toml");
    std::fs::write(
        &config.0,
        "[[policy]]\nname = \"w\"\nalgorithm = \"fixed-window\"\nquota = \"1/1s\"\nmode = { delay = \"2s\" }\n",
    )
    .unwrap();
    let o = replay_config(config.path(), &[], "0,::1\n0,::1\n0,::1\n2500,::1\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "allowed w\ndelayed w 2000\ndelayed w 1146\ndelayed w 511\n"
    );
}

/// A policy's `in_flight` bound in a configuration replay: each admitted line holds its place
/// for its duration (`t_ms+duration_ms`), in the trace's time; a place that ends at `t` is free
/// at `t`; a line the rate refuses takes none.
#[test]
fn config_replay_holds_in_flight_places_for_each_lines_duration() {
    let config = TempFile::new("in_flight.toml");
    std::fs::write(
        &config.0,
        "[[policy]]\nname = \"up\"\nalgorithm = \"fixed-window\"\nquota = \"3/1s\"\nin_flight = 1\n",
    )
    .unwrap();
    let trace =
        "0+300,::1\n100,::1\n300+50,::1\n310,::1\n360,::1\n370+1000,::1\n1000,::1\n1001,::2\n";
    let o = replay_config(config.path(), &["--format", "lines"], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    // 0 runs until 300; 100 is over the bound; 300 starts as 0 ends (runs until 350); 310 is
    // over it; 360 takes the window's third unit; 370 is refused by the rate and holds no
    // place, so 1000 (a new window) gets one; ::2 is another client.
    assert_eq!(
        stdout(&o),
        "allowed up\nin_flight up\nallowed up\nin_flight up\nallowed up\ndenied up\nallowed up\nallowed up\n"
    );
}

#[test]
fn config_replay_costs_come_from_the_line_or_else_the_policy() {
    // The export costs 5 by the configuration; a line's own cost replaces it.
    let trace = "\
0,198.51.100.1,,GET,/api/export
0,198.51.100.1,15,GET,/api/items
0,198.51.100.1,,GET,/api/items
0,198.51.100.2,21,GET,/api/items
0,198.51.100.2,99999999999999999999999,GET,/api/items
";
    let o = replay_config(POLICIES, &[], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    // 5 + 15 = 20: the burst is spent. A cost above the burst, or past u64, is an error.
    assert_eq!(
        stdout(&o),
        "allowed api\nallowed api\ndenied api\nerror api\nerror api\n"
    );
}

#[test]
fn config_replay_summary_and_json_count_per_policy() {
    let trace = "\
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,203.0.113.7,,GET,/api/export
0,,,GET,/partner/x
0,203.0.113.9,,GET,/health
";
    let o = replay_config(POLICIES, &["--format", "summary"], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("7 requests; 1 passed"), "{out}");
    let row = |name: &str| -> Vec<String> {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {out}"));
        line.split_whitespace().skip(1).map(str::to_owned).collect()
    };
    // requests, allowed, delayed, denied, shadow_denied, no_key, key_too_long, table_full,
    // error
    assert_eq!(row("api"), ["5", "4", "0", "1", "0", "0", "0", "0", "0"]);
    // An empty key is no x-api-key header: the configured 400, counted as no_key.
    assert_eq!(
        row("partner"),
        ["1", "0", "0", "0", "0", "1", "0", "0", "0"]
    );
    assert_eq!(row("upload"), ["0", "0", "0", "0", "0", "0", "0", "0", "0"]);
    assert!(out.contains("203.0.113.7"), "{out}");

    let o = replay_config(POLICIES, &["--format", "json"], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(json["requests"], 7);
    assert_eq!(json["passed"], 1);
    assert_eq!(json["policies"][0]["name"], "api");
    assert_eq!(json["policies"][0]["denied"], 1);
    assert_eq!(json["policies"][1]["no_key"], 1);
    assert_eq!(json["top_keys"][0]["key"], "203.0.113.7");
    assert_eq!(json["top_keys"][0]["refused"], 1);
}

#[test]
fn config_replay_reads_json_and_reports_bad_configurations_and_lines() {
    let json = TempFile::new("policies.json");
    std::fs::write(
        &json.0,
        r#"{ "policy": [ { "name": "api", "quota": "1/1m", "key": { "header": "x-api-key" } } ] }"#,
    )
    .unwrap();
    let o = replay_config(json.path(), &[], "0,k1\n0,k1\n0,k2\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "allowed api\ndenied api\nallowed api\n");

    let bad = TempFile::new("bad.toml");
    std::fs::write(&bad.0, "[[policy]]\nname = \"a\"\nquota = \"0/1s\"\n").unwrap();
    let o = replay_config(bad.path(), &[], "0,k\n");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("bad.toml") && err.contains("\"0/1s\""),
        "{err}"
    );

    let o = replay_config("/nonexistent/policies.toml", &[], "0,k\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));

    // A bad line: what came before is printed, the message names the line, exit status 2.
    let o = replay_config(json.path(), &[], "0,k1\n5,k1,1,GET\n");
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "allowed api\n");
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));
    // A key no header can carry, for a policy keyed by a header.
    let o = replay_config(json.path(), &[], "0,k1\n5,a\u{1}b\n");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));

    // The algorithm's options belong to the other replay.
    let o = replay_config(POLICIES, &["--limit", "5"], "0,k\n");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn the_cli_guides_config_replay_is_what_the_command_prints() {
    let shown = quote("docs/cli.md", "$ cargo run --release -p tollgate-cli -- replay --config examples/policies.toml --format summary examples/traces/server.csv\n");
    let o = tollgate_at_root(&[
        "replay",
        "--config",
        "examples/policies.toml",
        "--format",
        "summary",
        "examples/traces/server.csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), shown);
}

/// `--in-flight N`: each admitted line holds its place until `t + duration`; alone or before a
/// rate (a request the rate refuses gives its place back); bad durations and bounds refused.
#[test]
fn in_flight_replays_each_lines_duration() {
    // Uploads: 300 ms each, at most 2 at once per client; bob's line has no duration.
    let trace = "0+300,alice\n100+300,alice\n200+300,alice\n300+300,alice\n300,bob\n300,bob\n";
    let o = tollgate(&["replay", "--in-flight", "2"], trace);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "allow\nallow\ndeny\nallow\nallow\nallow\n");

    // Before a rate of 1 per second: alice's second is refused by the rate and gives its place
    // back, so her third (in flight with the first only) is refused by the rate too, not the
    // bound; the fourth, a second later, fits both.
    let trace = "0+5000,alice\n100+5000,alice\n200,alice\n1000+10,alice\n";
    let o = tollgate(
        &[
            "replay",
            "--in-flight",
            "2",
            "--algorithm",
            "fixed-window",
            "--limit",
            "1",
            "--window",
            "1s",
            "--format",
            "lines",
        ],
        trace,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "allow\ndeny\ndeny\nallow\n");

    let o = tollgate(
        &["replay", "--in-flight", "2", "--format", "summary"],
        "0+5,a\n1+5,a\n2,a\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("tollgate replay: at most 2 in flight per key (stdin)"),
        "{out}"
    );
    assert_eq!(
        (
            summary_figure(&out, "allowed"),
            summary_figure(&out, "denied")
        ),
        (2, 1)
    );

    for (args, input, message) in [
        (
            &["replay", "--in-flight", "0"][..],
            "0,a\n",
            "--in-flight 0",
        ),
        (
            &["replay", "--in-flight", "2"][..],
            "0+x,a\n",
            "line 1: duration 'x'",
        ),
        (
            &["replay", "--in-flight", "2"][..],
            "0+,a\n",
            "line 1: duration ''",
        ),
        (
            &["replay", "--in-flight", "2", "--plot", "/tmp/x.svg"][..],
            "0,a\n",
            "--plot",
        ),
        (
            &["replay", "--in-flight", "2", "--compare"][..],
            "0,a\n",
            "--compare",
        ),
    ] {
        let o = tollgate(args, input);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
    }
}
