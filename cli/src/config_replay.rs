//! `tollgate replay --config FILE`: a trace decided by the tower layer a server builds from the
//! same configuration (`tollgate::tower::config`, TOML or JSON), through the layer's own code
//! ([`RateLimitLayer::evaluate`]): the policy a line's method and path match, the key that
//! policy reads, tiers, costs, the allow-list, shadow and delay modes.
//!
//! - A line's path is the path the client sent, as the layer matches it wherever a server puts
//!   it (`tower::client_path`: under axum's `nest`, the full path, prefix included): a request
//!   here carries no `OriginalUri`, so its URI is that path.
//! - The trace's key is the client: its address when it is an IP address (the peer's, as a
//!   server sees it without a proxy), and the value of every header a policy keys by.
//! - A line's cost replaces the policy's; without one (or with an empty one) the policy's
//!   cost applies.
//! - Every policy runs in process, a Redis one too: a replay never leaves the machine.
//! - Time is the trace's: the layer runs on tokio's paused clock, so a delayed request's
//!   wait passes at once in real time, and the requests that arrive meanwhile are decided in
//!   their order, as a server would decide them.
//! - A policy's `in_flight` bound holds each request's place from the time it passed (its line's
//!   time, plus any delay-mode wait) for the line's duration (`t_ms+duration_ms`; none: 0 ms).
//!   A place that ends at `t` is free for a line at `t`.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tokio::sync::mpsc;
use tollgate::replay::{Request as Line, TraceCost, TraceReader};
use tollgate::tower::config::LayerConfig;
use tollgate::tower::{Evaluation, Key, Outcome};
use tollgate::wait::TokioClock;
use tollgate::OwnedInFlightPermit;

use crate::common::{exact_millis, Fatal, Format};
use crate::in_flight::HeldUntil;

/// What the run reads and prints.
pub(crate) struct Options<'a> {
    pub(crate) config: &'a Path,
    pub(crate) source: String,
    /// `Lines`, `Summary` or `Json` (resolved).
    pub(crate) format: Format,
    pub(crate) top: usize,
}

/// Decides every line of `input` through the layer `options.config` describes, printing to
/// `out`. A bad line ends the reading: it is returned after what came before is printed.
pub(crate) fn replay(
    options: &Options<'_>,
    input: Box<dyn BufRead>,
    out: &mut impl Write,
) -> Result<(), Fatal> {
    let config = load(options.config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(run(config, options, input, out))
}

fn load(path: &Path) -> Result<LayerConfig, Fatal> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Fatal(format!("cannot read {}: {e}", path.display())))?;
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        toml::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| Fatal(format!("{}: {e}", path.display())))
}

/// One decided line.
struct Decided {
    key: String,
    evaluation: Evaluation,
    /// Its place under its policy's in-flight bound, and when (trace ms) the place ends.
    place: Option<(u64, OwnedInFlightPermit<Key>)>,
}

/// In-flight places held, each until its end (trace ms), then dropped.
type Places = HeldUntil<OwnedInFlightPermit<Key>>;

/// Lines spawned before the reader lets them run: bounds the tasks a trace whose lines share
/// one millisecond holds at once.
const SPAWN_BATCH: u64 = 1024;

async fn run(
    config: LayerConfig,
    options: &Options<'_>,
    input: Box<dyn BufRead>,
    out: &mut impl Write,
) -> Result<(), Fatal> {
    let (mut names, mut headers) = (Vec::new(), Vec::<HeaderName>::new());
    for policy in config.policies.iter().chain(&config.default_policy) {
        names.push(policy.name.clone());
        for name in policy.key.headers() {
            if !headers.contains(name) {
                headers.push(name.clone());
            }
        }
    }
    // The clock is paused: the origin and the layer's clock read the same instant.
    let origin = tokio::time::Instant::now();
    let layer = config
        .builder_with_clock(TokioClock::new())
        .and_then(|builder| builder.build())
        .map_err(|e| Fatal(format!("{}: {e}", options.config.display())))?;
    let mut printer = Printer::new(options, names);
    let (done, mut decided) = mpsc::unbounded_channel::<(u64, Decided)>();
    let mut reader = TraceReader::new(input);
    let (mut spawned, mut now_ms) = (0u64, 0u64);
    let mut places = Places::new();
    let mut failure = None;
    while let Some(line) = reader.next_request() {
        let line = match line.map_err(|e| Fatal(e.to_string())) {
            Ok(line) => line,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        if line.t_ms > now_ms {
            now_ms = line.t_ms;
            // Past tokio's range (about 30 years from now): no later time can be waited for.
            let Some(at) = origin.checked_add(Duration::from_millis(now_ms)) else {
                let message = format!("line {}: time {} ms is too far away", line.line, now_ms);
                failure = Some(Fatal(message));
                break;
            };
            tokio::time::sleep_until(at).await;
            // The lines decided by now hand over their places; those that ended go back
            // before this line is decided.
            printer.add_decided(&mut decided, &mut places, out)?;
            places.release_until(now_ms);
        } else if spawned % SPAWN_BATCH == 0 {
            tokio::task::yield_now().await;
        }
        let parts = match request(&line, &headers) {
            Ok(parts) => parts,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let cost = line.cost.map(|cost| match cost {
            TraceCost::Units(units) => units,
            // More than any capacity: the layer reports it as an error, as it would a
            // cost too large for the quota.
            TraceCost::Unbounded => u64::MAX,
        });
        let (layer, done, seq) = (layer.clone(), done.clone(), spawned);
        let key = line.key.to_owned();
        let (t_ms, duration_ms) = (line.t_ms, line.duration_ms.unwrap_or(0));
        tokio::spawn(async move {
            let (evaluation, place) = layer.evaluate_held(&parts, cost).await;
            let waited = u64::try_from(evaluation.waited.as_millis()).unwrap_or(u64::MAX);
            let ends = t_ms.saturating_add(waited).saturating_add(duration_ms);
            let place = place.map(|place| (ends, place));
            // The receiver lives until every sender is gone.
            let _ = done.send((
                seq,
                Decided {
                    key,
                    evaluation,
                    place,
                },
            ));
        });
        spawned += 1;
        printer.add_decided(&mut decided, &mut places, out)?;
    }
    drop(done);
    // The lines still waiting (delay mode) finish as the paused clock moves on.
    while let Some((seq, line)) = decided.recv().await {
        printer.add(seq, line, &mut places, out)?;
    }
    printer.finish(out)?;
    failure.map_or(Ok(()), Err)
}

/// The request a line stands for: its method and path (`GET /` without a route), its key as
/// the peer's address (when it is an IP address) and as every header in `headers`.
fn request(line: &Line<'_>, headers: &[HeaderName]) -> Result<http::request::Parts, Fatal> {
    let bad = |what: String| Fatal(format!("line {}: {what}", line.line));
    let mut builder = http::Request::builder()
        .method(line.method.unwrap_or("GET"))
        .uri(line.path.unwrap_or("/"));
    if !headers.is_empty() {
        let value = HeaderValue::from_str(line.key).map_err(|_| {
            bad(format!(
                "key '{}' cannot be a header value (a policy keys by a header)",
                line.key
            ))
        })?;
        for name in headers {
            builder = builder.header(name, value.clone());
        }
    }
    let mut request = builder
        .body(())
        .map_err(|e| bad(format!("not a request: {e}")))?;
    if let Ok(ip) = line.key.parse::<IpAddr>() {
        request.extensions_mut().insert(SocketAddr::new(ip, 0));
    }
    Ok(request.into_parts().0)
}

/// Per policy: how many requests had each outcome.
#[derive(Default)]
struct Tally {
    requests: u64,
    outcomes: BTreeMap<&'static str, u64>,
}

/// A key's requests and refusals (denied, or denied in shadow) under one policy.
#[derive(Default, Clone, Copy)]
struct KeyTally {
    requests: u64,
    refused: u64,
}

/// The outcomes a summary lists, in its columns' order.
const COLUMNS: [Outcome; 8] = [
    Outcome::Allowed,
    Outcome::Delayed,
    Outcome::Denied,
    Outcome::ShadowDenied,
    Outcome::NoKey,
    Outcome::KeyTooLong,
    Outcome::TableFull,
    Outcome::Error,
];

/// Prints lines in the trace's order (a delayed one finishes after later ones), or counts
/// them for the summary.
struct Printer<'a> {
    options: &'a Options<'a>,
    /// Lines decided ahead of one still waiting.
    pending: BTreeMap<u64, Decided>,
    next: u64,
    names: Vec<String>,
    policies: HashMap<Arc<str>, Tally>,
    keys: HashMap<(Arc<str>, Key), KeyTally>,
    passed: u64,
    requests: u64,
}

impl<'a> Printer<'a> {
    fn new(options: &'a Options<'a>, names: Vec<String>) -> Self {
        Printer {
            options,
            pending: BTreeMap::new(),
            next: 0,
            names,
            policies: HashMap::new(),
            keys: HashMap::new(),
            passed: 0,
            requests: 0,
        }
    }

    /// [`Printer::add`]s the lines decided by now (those the channel holds).
    fn add_decided(
        &mut self,
        decided: &mut mpsc::UnboundedReceiver<(u64, Decided)>,
        places: &mut Places,
        out: &mut impl Write,
    ) -> io::Result<()> {
        while let Ok((seq, line)) = decided.try_recv() {
            self.add(seq, line, places, out)?;
        }
        Ok(())
    }

    /// Prints the lines decided so far in order; a line's in-flight place goes to `places`,
    /// held until it ends.
    fn add(
        &mut self,
        seq: u64,
        mut line: Decided,
        places: &mut Places,
        out: &mut impl Write,
    ) -> io::Result<()> {
        if let Some((ends_ms, place)) = line.place.take() {
            places.hold(ends_ms, place);
        }
        self.pending.insert(seq, line);
        while let Some(line) = self.pending.remove(&self.next) {
            self.next += 1;
            self.emit(line, out)?;
        }
        Ok(())
    }

    fn emit(&mut self, line: Decided, out: &mut impl Write) -> io::Result<()> {
        let e = line.evaluation;
        if self.options.format == Format::Lines {
            write!(out, "{}", e.outcome)?;
            if let Some(policy) = &e.policy {
                write!(out, " {policy}")?;
            }
            if e.outcome == Outcome::Delayed {
                let waited = u64::try_from(e.waited.as_nanos()).unwrap_or(u64::MAX);
                write!(out, " {}", exact_millis(waited))?;
            }
            return writeln!(out);
        }
        self.requests += 1;
        let Some(policy) = e.policy else {
            self.passed += 1;
            return Ok(());
        };
        let tally = self.policies.entry(Arc::clone(&policy)).or_default();
        tally.requests += 1;
        *tally.outcomes.entry(e.outcome.label()).or_default() += 1;
        // A request without a key is counted under the trace's key.
        let key = e.key.unwrap_or_else(|| Key::from(line.key.as_str()));
        let refused = matches!(e.outcome, Outcome::Denied | Outcome::ShadowDenied);
        let key = self.keys.entry((policy, key)).or_default();
        key.requests += 1;
        key.refused += u64::from(refused);
        Ok(())
    }

    /// The keys with the most refusals (then the most requests, then by policy and key).
    fn top(&self) -> Vec<(&(Arc<str>, Key), &KeyTally)> {
        let keys = self.keys.iter().filter(|(_, t)| t.refused > 0).collect();
        crate::common::most(keys, |k| (k.refused, k.requests), self.options.top)
    }

    fn finish(&self, out: &mut impl Write) -> io::Result<()> {
        match self.options.format {
            Format::Json => self.print_json(out),
            Format::Summary => self.print_text(out),
            _ => Ok(()),
        }
    }

    fn count(&self, policy: &str, outcome: Outcome) -> u64 {
        self.policies
            .get(policy)
            .and_then(|t| t.outcomes.get(outcome.label()))
            .copied()
            .unwrap_or(0)
    }

    fn print_text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "tollgate replay --config {} ({})",
            self.options.config.display(),
            self.options.source
        )?;
        writeln!(
            out,
            "{} requests; {} passed with no policy (none matched, or allow-listed)",
            self.requests, self.passed
        )?;
        let width = self.names.iter().map(String::len).max().unwrap_or(0).max(6);
        write!(out, "\n{:<width$} {:>10}", "policy", "requests")?;
        for outcome in COLUMNS {
            write!(out, " {:>13}", outcome.label())?;
        }
        writeln!(out)?;
        for name in &self.names {
            let requests = self.policies.get(name.as_str()).map_or(0, |t| t.requests);
            write!(out, "{name:<width$} {requests:>10}")?;
            for outcome in COLUMNS {
                write!(out, " {:>13}", self.count(name, outcome))?;
            }
            writeln!(out)?;
        }
        let top = self.top();
        if top.is_empty() {
            return writeln!(out, "\nno key was refused");
        }
        writeln!(
            out,
            "\nkeys with the most refusals (denied, or denied in shadow):"
        )?;
        writeln!(
            out,
            "{:<width$} {:<40} {:>10} {:>10}",
            "policy", "key", "requests", "refused"
        )?;
        for ((policy, key), t) in top {
            writeln!(
                out,
                "{policy:<width$} {:<40} {:>10} {:>10}",
                key.to_string(),
                t.requests,
                t.refused
            )?;
        }
        Ok(())
    }

    fn print_json(&self, out: &mut impl Write) -> io::Result<()> {
        use serde_json::{json, Map, Value};
        let policies: Vec<Value> = self
            .names
            .iter()
            .map(|name| {
                let mut policy = Map::new();
                policy.insert("name".into(), json!(name));
                let requests = self.policies.get(name.as_str()).map_or(0, |t| t.requests);
                policy.insert("requests".into(), json!(requests));
                for outcome in COLUMNS {
                    policy.insert(outcome.label().into(), json!(self.count(name, outcome)));
                }
                Value::Object(policy)
            })
            .collect();
        let top: Vec<Value> = self
            .top()
            .into_iter()
            .map(|((policy, key), t)| {
                json!({
                    "policy": &**policy,
                    "key": key.to_string(),
                    "requests": t.requests,
                    "refused": t.refused,
                })
            })
            .collect();
        let report = json!({
            "config": self.options.config.display().to_string(),
            "source": self.options.source,
            "requests": self.requests,
            "passed": self.passed,
            "policies": policies,
            "top_keys": top,
        });
        writeln!(out, "{report}")
    }
}
