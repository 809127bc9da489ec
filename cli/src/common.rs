//! What the replays share: the failure that ends a run, the output format, and small helpers
//! for the reports.

use std::io::{self, IsTerminal};

use clap::ValueEnum;
use tollgate::AlgorithmName;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Auto,
    Lines,
    Summary,
    Json,
}

impl Format {
    /// `auto` made concrete: a person at a terminal reads the summary, a pipe gets lines.
    pub(crate) fn resolve(self) -> Format {
        match self {
            Format::Auto if io::stdout().is_terminal() => Format::Summary,
            Format::Auto => Format::Lines,
            other => other,
        }
    }
}

/// Nanoseconds as milliseconds, exactly, as the library's replay prints a delay: `1500000` as
/// `1.5`, `1` as `0.000001`.
pub(crate) fn exact_millis(ns: u64) -> String {
    match (ns / 1_000_000, ns % 1_000_000) {
        (ms, 0) => ms.to_string(),
        (ms, rest) => format!("{ms}.{}", format!("{rest:06}").trim_end_matches('0')),
    }
}

pub(crate) fn parse_algorithm(text: &str) -> Result<AlgorithmName, String> {
    text.parse()
}

/// The `top` rows with the highest `score` (all of them for 0), ties by key.
pub(crate) fn most<'a, K: Ord, V>(
    mut rows: Vec<(&'a K, &'a V)>,
    score: impl Fn(&V) -> (u64, u64),
    top: usize,
) -> Vec<(&'a K, &'a V)> {
    rows.sort_by(|a, b| score(b.1).cmp(&score(a.1)).then_with(|| a.0.cmp(b.0)));
    if top > 0 {
        rows.truncate(top);
    }
    rows
}

/// A failure that ends the run with exit status 2.
pub(crate) struct Fatal(pub(crate) String);

impl<E: std::fmt::Display> From<E> for Fatal {
    fn from(e: E) -> Self {
        Fatal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn delays_print_as_exact_milliseconds() {
        assert_eq!(super::exact_millis(250_000_000), "250");
        assert_eq!(super::exact_millis(1_500_000), "1.5");
        assert_eq!(super::exact_millis(1), "0.000001");
        assert_eq!(super::exact_millis(0), "0");
    }
}
