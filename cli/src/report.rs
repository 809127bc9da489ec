//! `tollgate replay`'s reports for people: the aligned summary (totals, the per-key table of
//! the top keys by denials, the peak admitted in one window against the limit) and the same
//! summary as one JSON object (`--format json`).
//!
//! The per-line `allow` / `deny` / `error` output (the decision rules' replay format) is not here: it is
//! printed as each request is decided, and never changes.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::time::Duration;

use tollgate::replay::{Request, TraceCost, TraceOutcome};
use tollgate::AlgorithmName;

/// What the report says about the run itself.
pub(crate) struct Setting {
    /// The rate, if any (an in-flight replay may run without one).
    pub(crate) algorithm: Option<AlgorithmName>,
    /// At most this many in flight per key (`--in-flight`), checked before the rate.
    pub(crate) in_flight: Option<u64>,
    pub(crate) limit: u64,
    pub(crate) window: Duration,
    pub(crate) burst: Option<u64>,
    /// The trace's name (its path, or `stdin`).
    pub(crate) source: String,
    /// How many keys the table shows; 0 for all.
    pub(crate) top: usize,
}

/// One key's figures.
#[derive(Default)]
struct KeyStats {
    requests: u64,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// Units admitted in the window ending at the key's latest request: `(t_ns, units)`
    /// entries newer than `t − W` (the decision rules' log rule: an entry at exactly `t − W` is gone).
    recent: VecDeque<(u64, u64)>,
    in_window: u64,
    /// The most units admitted in any one window of length `W`, and the time it was reached.
    peak: u64,
    peak_at_ns: u64,
}

impl KeyStats {
    fn add(&mut self, t_ns: u64, window_ns: u64, units: u64, outcome: TraceOutcome) {
        self.requests += 1;
        match outcome {
            TraceOutcome::Allow { .. } => self.allowed += 1,
            TraceOutcome::Deny => self.denied += 1,
            TraceOutcome::Error => self.errors += 1,
        }
        // Expire what left the window, then count what this request admitted.
        while let Some(&(t, units)) = self.recent.front() {
            if t.saturating_add(window_ns) > t_ns {
                break;
            }
            self.in_window -= units;
            self.recent.pop_front();
        }
        if outcome.is_allow() && units > 0 {
            match self.recent.back_mut() {
                Some((t, u)) if *t == t_ns => *u += units,
                _ => self.recent.push_back((t_ns, units)),
            }
            self.in_window += units;
            if self.in_window > self.peak {
                self.peak = self.in_window;
                self.peak_at_ns = t_ns;
            }
        }
    }
}

/// The running summary of one algorithm's replay.
pub(crate) struct Report {
    setting: Setting,
    window_ns: u64,
    keys: HashMap<String, KeyStats>,
    requests: u64,
    allowed: u64,
    denied: u64,
    errors: u64,
    units_admitted: u64,
    first_ms: Option<u64>,
    last_ms: u64,
}

impl Report {
    pub(crate) fn new(setting: Setting) -> Report {
        let window_ns = u64::try_from(setting.window.as_nanos()).unwrap_or(u64::MAX);
        Report {
            setting,
            window_ns,
            keys: HashMap::new(),
            requests: 0,
            allowed: 0,
            denied: 0,
            errors: 0,
            units_admitted: 0,
            first_ms: None,
            last_ms: 0,
        }
    }

    pub(crate) fn add(&mut self, request: &Request, outcome: TraceOutcome) {
        self.requests += 1;
        let units = match request.units() {
            TraceCost::Units(units) => units,
            TraceCost::Unbounded => 0,
        };
        match outcome {
            TraceOutcome::Allow { .. } => {
                self.allowed += 1;
                self.units_admitted = self.units_admitted.saturating_add(units);
            }
            TraceOutcome::Deny => self.denied += 1,
            TraceOutcome::Error => self.errors += 1,
        }
        self.first_ms.get_or_insert(request.t_ms);
        self.last_ms = request.t_ms;
        let t_ns = request.t_ms.saturating_mul(1_000_000);
        let window_ns = self.window_ns;
        match self.keys.get_mut(request.key) {
            Some(stats) => stats.add(t_ns, window_ns, units, outcome),
            None => {
                let mut stats = KeyStats::default();
                stats.add(t_ns, window_ns, units, outcome);
                self.keys.insert(request.key.to_owned(), stats);
            }
        }
    }

    /// The keys the table shows: most denials first, then most requests, then by name.
    fn top_keys(&self) -> Vec<(&String, &KeyStats)> {
        let keys = self.keys.iter().collect();
        crate::common::most(keys, |k| (k.denied, k.requests), self.setting.top)
    }

    /// The key with the highest peak (first by name on a tie).
    fn peak(&self) -> Option<(&String, &KeyStats)> {
        self.keys
            .iter()
            .max_by(|a, b| a.1.peak.cmp(&b.1.peak).then_with(|| b.0.cmp(a.0)))
    }

    /// What was replayed: the rate and its quota, and the in-flight bound.
    fn setting_text(&self) -> String {
        let s = &self.setting;
        let mut parts = Vec::new();
        if let Some(algorithm) = s.algorithm {
            let mut text = format!(
                "{algorithm}, {} per {} per key",
                s.limit,
                duration_text(s.window)
            );
            if let Some(burst) = s.burst {
                let name = match algorithm {
                    AlgorithmName::LeakyBucket | AlgorithmName::LeakyQueue => "capacity",
                    _ => "burst",
                };
                text.push_str(&format!(", {name} {burst}"));
            }
            parts.push(text);
        }
        if let Some(n) = s.in_flight {
            parts.push(format!("at most {n} in flight per key"));
        }
        parts.join("; ")
    }

    /// The aligned summary for a person.
    pub(crate) fn print_text(&self, out: &mut impl Write) -> io::Result<()> {
        let s = &self.setting;
        let window = duration_text(s.window);
        writeln!(
            out,
            "tollgate replay: {} ({})",
            self.setting_text(),
            s.source
        )?;
        writeln!(out)?;
        let span = self
            .first_ms
            .map(|first| seconds_text(self.last_ms - first))
            .unwrap_or_else(|| "0 s".into());
        let peak = self.peak().filter(|(_, k)| k.peak > 0);
        let peak_units = peak.map_or(0, |(_, k)| k.peak);
        let width = [self.requests, peak_units, s.limit]
            .iter()
            .map(|n| n.to_string().len())
            .max()
            .unwrap_or(1);
        let share = |n: u64| percent(n, self.requests);
        let keys = match self.keys.len() {
            1 => "1 key".to_owned(),
            n => format!("{n} keys"),
        };
        writeln!(
            out,
            "  requests  {:>width$}   {keys}, over {span}",
            self.requests
        )?;
        let line = format!(
            "  allowed   {:>width$}   {}",
            self.allowed,
            share(self.allowed)
        );
        writeln!(out, "{}", line.trim_end())?;
        let line = format!(
            "  denied    {:>width$}   {}",
            self.denied,
            share(self.denied)
        );
        writeln!(out, "{}", line.trim_end())?;
        if self.errors == 0 {
            writeln!(out, "  errors    {:>width$}", 0)?;
        } else {
            writeln!(
                out,
                "  errors    {:>width$}   {}   a cost above what the quota can ever admit",
                self.errors,
                share(self.errors)
            )?;
        }
        let Some(algorithm) = s.algorithm else {
            // No rate: no window to count a peak in.
            return self.print_keys(out, None);
        };
        match peak {
            Some((key, k)) => writeln!(
                out,
                "  peak      {:>width$}   units admitted in one {window} window (key {key}, \
                 window ending at {})",
                k.peak,
                seconds_text(k.peak_at_ns / 1_000_000),
            )?,
            None => writeln!(out, "  peak      {:>width$}   no units admitted", 0)?,
        }
        let bound = match s.burst {
            Some(b) if algorithm.has_burst() => format!(
                "; a full bucket of {b} plus what refills in {window}: at most {} in one window",
                b.saturating_add(s.limit)
            ),
            _ => String::new(),
        };
        writeln!(
            out,
            "  limit     {:>width$}   per {window} per key{bound}",
            s.limit
        )?;
        self.print_keys(out, Some(&window))
    }

    /// The per-key table, with each key's peak in one `window` if there is a rate.
    fn print_keys(&self, out: &mut impl Write, window: Option<&str>) -> io::Result<()> {
        let keys = self.top_keys();
        if keys.is_empty() {
            return Ok(());
        }
        writeln!(out)?;
        let title = if keys.len() < self.keys.len() {
            format!("top {} keys by denials", keys.len())
        } else {
            "keys by denials".to_owned()
        };
        writeln!(out, "  {title}")?;
        let peak_column = window.map(|window| format!("peak/{window}"));
        let mut header = vec!["key", "requests", "allowed", "denied", "errors"];
        header.extend(peak_column.as_deref());
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(|(key, k)| {
                let mut row = vec![
                    (*key).clone(),
                    k.requests.to_string(),
                    k.allowed.to_string(),
                    k.denied.to_string(),
                    k.errors.to_string(),
                ];
                row.extend(window.map(|_| k.peak.to_string()));
                row
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[&str]| {
            let mut text = String::from("  ");
            for (i, (cell, &w)) in cells.iter().zip(&widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if i == 0 {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                } else {
                    text.push_str("  ");
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                }
            }
            text
        };
        writeln!(out, "  {}", line(&header))?;
        for row in &rows {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            writeln!(out, "  {}", line(&cells))?;
        }
        let more = self.keys.len() - keys.len();
        if more > 0 {
            writeln!(out, "    … {more} more keys (--top 0 shows all)")?;
        }
        Ok(())
    }

    /// The summary as one JSON object on one line.
    pub(crate) fn print_json(&self, out: &mut impl Write) -> io::Result<()> {
        use serde_json::{json, Value};
        let s = &self.setting;
        let keys: Vec<Value> = self
            .top_keys()
            .into_iter()
            .map(|(key, k)| {
                json!({
                    "key": key,
                    "requests": k.requests,
                    "allowed": k.allowed,
                    "denied": k.denied,
                    "errors": k.errors,
                    "peak": s.algorithm.map(|_| k.peak),
                })
            })
            .collect();
        let peak = self.peak().filter(|_| s.algorithm.is_some()).map(
            |(key, k)| json!({ "key": key, "admitted": k.peak, "at_ms": k.peak_at_ns / 1_000_000 }),
        );
        let rate = s.algorithm.is_some();
        let value = json!({
            "algorithm": s.algorithm.map(AlgorithmName::as_str),
            "limit": rate.then_some(s.limit),
            "window_ms": rate.then(|| u64::try_from(s.window.as_millis()).unwrap_or(u64::MAX)),
            "burst": s.burst,
            "in_flight": s.in_flight,
            "source": s.source,
            "requests": self.requests,
            "allowed": self.allowed,
            "denied": self.denied,
            "errors": self.errors,
            "units_admitted": self.units_admitted,
            "key_count": self.keys.len(),
            "first_ms": self.first_ms,
            "last_ms": self.first_ms.map(|_| self.last_ms),
            "peak": peak,
            "keys": keys,
        });
        writeln!(out, "{value}")
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return String::new();
    }
    format!("{:5.1} %", 100.0 * part as f64 / whole as f64)
}

/// Milliseconds as seconds with three decimals: `59.909 s`.
fn seconds_text(ms: u64) -> String {
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}

/// A duration as the CLI takes it: `1s`, `250ms`, `1m`.
pub(crate) fn duration_text(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, size) in [
        ("d", 86_400_000_000_000u128),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if ns >= size && ns % size == 0 {
            return format!("{}{unit}", ns / size);
        }
    }
    format!("{ns}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_follows_the_logs_window_rule() {
        let w = 1_000_000_000;
        let mut k = KeyStats::default();
        let allow = TraceOutcome::Allow { delay_nanos: None };
        // Two at 0, one at 0.5 s, then at exactly 1 s the two at 0 have left the window.
        k.add(0, w, 1, allow);
        k.add(0, w, 1, allow);
        k.add(w / 2, w, 1, allow);
        assert_eq!(k.peak, 3);
        k.add(w, w, 1, allow);
        assert_eq!(k.in_window, 2);
        k.add(w, w, 5, TraceOutcome::Deny);
        assert_eq!((k.in_window, k.peak, k.denied), (2, 3, 1));
    }

    #[test]
    fn durations_print_as_they_are_typed() {
        assert_eq!(duration_text(Duration::from_secs(1)), "1s");
        assert_eq!(duration_text(Duration::from_millis(250)), "250ms");
        assert_eq!(duration_text(Duration::from_secs(120)), "2m");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1500ms");
    }
}
