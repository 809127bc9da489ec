//! `tollgate replay`: deciding a trace of requests, line by line, in the trace's own time.
//!
//! The format (the `tollgate replay` trace format): one request a line,
//! `t_ms[+duration_ms],key[,cost[,method,path]]`; `t_ms` a non-negative integer of
//! milliseconds, non-decreasing; `duration_ms`, how long the request ran, read only by an
//! in-flight replay (`tollgate replay --in-flight`); cost defaults to 1 (under
//! `tollgate replay --config`: to the policy's cost), and may be left empty before a method
//! and path; the method is an HTTP method token and the path starts with `/` (the rest of the
//! line: it may hold commas). Blank lines and lines starting with `#` are skipped. The origin is `t = 0` of the trace; no wall clock.
//!
//! Everything here streams: a [`Replayer`] holds one keyed limiter whose idle keys are evicted
//! as it goes, so a trace of millions of lines runs in memory proportional to the keys that
//! still hold state, not to the trace.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use tollgate::AlgorithmName;
//! use tollgate::replay::{Replayer, TraceReader};
//! let trace = "0,alice\n0,alice\n# a comment\n1000,alice,1\n";
//! let mut replayer = Replayer::new(AlgorithmName::FixedWindow, 1, Duration::from_secs(1), None)?;
//! let mut reader = TraceReader::new(trace.as_bytes());
//! let mut out = Vec::new();
//! while let Some(request) = reader.next_request() {
//!     let request = request.expect("a valid trace");
//!     out.push(replayer.decide(&request).to_string());
//! }
//! assert_eq!(out, ["allow", "deny", "allow"]);
//! # Ok::<(), tollgate::QuotaError>(())
//! ```

use std::fmt;
use std::time::Duration;

mod trace;

pub use self::trace::{Request, TraceCost, TraceError, TraceReader};

use crate::clock::ManualClock;
use crate::limiter::any::AnyKeyed;
use crate::{AlgorithmName, Quota, QuotaError};

/// Parses a duration such as `250ms`, `1s`, `60s`, `1m`, `1h` (also `ns`, `us`, `d`).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::replay::parse_duration;
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
/// assert!(parse_duration("1 parsec").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || format!("invalid duration '{text}' (expected e.g. 250ms, 1s, 60s, 1m, 1h)");
    if digits.is_empty() {
        return Err(bad());
    }
    let value: u64 = digits.parse().map_err(|_| bad())?;
    let nanos_per_unit: u64 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return Err(bad()),
    };
    value
        .checked_mul(nanos_per_unit)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("duration '{text}' is too long (over 584 years)"))
}

/// Nanoseconds printed as milliseconds, exactly: `1500000` as `1.5`, `1` as `0.000001`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Millis(u64);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ms, rest) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if rest == 0 {
            write!(f, "{ms}")
        } else {
            let fraction = format!("{rest:06}");
            write!(f, "{ms}.{}", fraction.trim_end_matches('0'))
        }
    }
}

/// The decision printed for one request.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::AlgorithmName;
/// use tollgate::replay::{TraceOutcome, Replayer, TraceReader};
/// let mut queue = Replayer::new(AlgorithmName::LeakyQueue, 10, Duration::from_secs(1), None)?;
/// let mut reader = TraceReader::new("0,a\n0,a\n".as_bytes());
/// let first = queue.decide(&reader.next_request().unwrap()?);
/// let second = queue.decide(&reader.next_request().unwrap()?);
/// assert_eq!(first, TraceOutcome::Allow { delay_nanos: Some(0) });
/// assert_eq!(second, TraceOutcome::Allow { delay_nanos: Some(100_000_000) }); // printed `allow 100`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOutcome {
    /// Admitted; for `leaky-queue`, with its delay in nanoseconds.
    Allow {
        /// The shaping delay, for `leaky-queue` only.
        delay_nanos: Option<u64>,
    },
    /// Denied.
    Deny,
    /// The cost can never be admitted.
    Error,
}

impl TraceOutcome {
    /// Whether the request was admitted.
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::TraceOutcome;
    /// assert!(TraceOutcome::Allow { delay_nanos: None }.is_allow());
    /// assert!(!TraceOutcome::Deny.is_allow());
    /// assert!(!TraceOutcome::Error.is_allow()); // an impossible cost is not admitted either
    /// ```
    pub fn is_allow(&self) -> bool {
        matches!(self, TraceOutcome::Allow { .. })
    }
}

impl fmt::Display for TraceOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceOutcome::Allow { delay_nanos: None } => f.write_str("allow"),
            TraceOutcome::Allow {
                delay_nanos: Some(ns),
            } => write!(f, "allow {}", Millis(*ns)),
            TraceOutcome::Deny => f.write_str("deny"),
            TraceOutcome::Error => f.write_str("error"),
        }
    }
}

/// Decides requests for one algorithm and quota, in the trace's time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::AlgorithmName;
/// use tollgate::replay::{TraceOutcome, Replayer, TraceReader};
/// // "What would 2 per second per key have done to this traffic?"
/// let mut replayer = Replayer::new(AlgorithmName::FixedWindow, 2, Duration::from_secs(1), None)?;
/// let mut reader = TraceReader::new("0,a\n1,a\n2,a\n3,b\n".as_bytes());
/// let mut allowed = 0;
/// while let Some(request) = reader.next_request() {
///     allowed += usize::from(replayer.decide(&request?).is_allow());
/// }
/// assert_eq!(allowed, 3); // a's third request is denied; b has its own window
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Replayer {
    algorithm: AlgorithmName,
    limiter: AnyKeyed<String, ManualClock>,
    /// The trace's time: set to each request's before it is decided.
    clock: ManualClock,
}

impl Replayer {
    /// A replayer for `algorithm` with `limit` per `window` and an optional burst (`B` / `C`).
    ///
    /// # Errors
    /// Any [`QuotaError`] the algorithm's constructor gives, e.g. a burst for a window
    /// algorithm or a window under 1 ms.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::AlgorithmName;
    /// use tollgate::replay::Replayer;
    /// use tollgate::QuotaError;
    /// assert!(Replayer::new(AlgorithmName::Gcra, 10, Duration::from_secs(1), Some(20)).is_ok());
    /// // The same refusals as the limiters: a window algorithm has no burst.
    /// let refused = Replayer::new(AlgorithmName::FixedWindow, 10, Duration::from_secs(1), Some(20));
    /// assert!(matches!(refused, Err(QuotaError::BurstNotSupported { .. })));
    /// ```
    pub fn new(
        algorithm: AlgorithmName,
        limit: u64,
        window: Duration,
        burst: Option<u64>,
    ) -> Result<Replayer, QuotaError> {
        let mut quota = Quota::new(limit, window)?;
        if let Some(burst) = burst {
            quota = quota.with_burst(burst)?;
        }
        let clock = ManualClock::new();
        let limiter = AnyKeyed::new(algorithm, quota, clock.clone())?;
        Ok(Replayer {
            algorithm,
            limiter,
            clock,
        })
    }

    /// The algorithm this replayer runs.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::AlgorithmName;
    /// use tollgate::replay::Replayer;
    /// let replayer = Replayer::new(AlgorithmName::TokenBucket, 5, Duration::from_secs(1), None)?;
    /// assert_eq!(replayer.algorithm().as_str(), "token-bucket"); // the name asked for, for reports
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn algorithm(&self) -> AlgorithmName {
        self.algorithm
    }

    /// Decides one request at its trace time.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::AlgorithmName;
    /// use tollgate::replay::{TraceOutcome, TraceReader, Replayer};
    /// let mut replayer = Replayer::new(AlgorithmName::Gcra, 1, Duration::from_secs(1), None)?;
    /// let mut reader = TraceReader::new("0,k\n999,k\n1000,k\n".as_bytes());
    /// let mut outcomes = Vec::new();
    /// while let Some(request) = reader.next_request() {
    ///     outcomes.push(replayer.decide(&request?));
    /// }
    /// let allow = TraceOutcome::Allow { delay_nanos: None };
    /// // The trace's time, not the wall clock: a second later in the trace, admitted again.
    /// assert_eq!(outcomes, [allow, TraceOutcome::Deny, allow]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide(&mut self, request: &Request) -> TraceOutcome {
        let TraceCost::Units(cost) = request.units() else {
            return TraceOutcome::Error;
        };
        // A time past 2^64 ns (584 years) cannot be represented: such a request is judged at
        // the end of time, where nothing more can be admitted.
        let t = request.t_ms.saturating_mul(1_000_000);
        self.clock.set(t);
        match self.limiter.check_n(request.key, cost) {
            Ok(d) if d.allowed() => TraceOutcome::Allow {
                delay_nanos: self.limiter.shapes().then(|| d.delay_nanos()),
            },
            Ok(_) => TraceOutcome::Deny,
            Err(_) => TraceOutcome::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::trace::parse_line;
    use super::*;

    #[test]
    fn parses_and_rejects_lines() {
        assert_eq!(parse_line("", 1), Ok(None));
        assert_eq!(parse_line("   ", 1), Ok(None));
        assert_eq!(parse_line("#x,y", 1), Ok(None));
        let r = parse_line("5,k\r", 1).unwrap().unwrap();
        assert_eq!((r.t_ms, r.key, r.units()), (5, "k", TraceCost::Units(1)));
        let r = parse_line("5,k,99999999999999999999999", 1)
            .unwrap()
            .unwrap();
        assert_eq!(r.cost, Some(TraceCost::Unbounded));
        let r = parse_line("5,k,,get,/a?b=c,d", 1).unwrap().unwrap();
        assert_eq!(
            (r.cost, r.method, r.path),
            (None, Some("get"), Some("/a?b=c,d"))
        );
        let r = parse_line("5,k,2,PATCH,/", 1).unwrap().unwrap();
        assert_eq!(
            (r.units(), r.method, r.path),
            (TraceCost::Units(2), Some("PATCH"), Some("/"))
        );
        let r = parse_line("5+250,k", 1).unwrap().unwrap();
        assert_eq!((r.t_ms, r.duration_ms, r.key), (5, Some(250), "k"));
        assert_eq!(parse_line("5,k", 1).unwrap().unwrap().duration_ms, None);
        for bad in [
            "5+,k",
            "+5,k",
            "5+-1,k",
            "5+1.5,k",
            "5+1+2,k",
            "5+99999999999999999999999,k",
            "5",
            "-1,k",
            "1.5,k",
            "5,k,-2",
            "5,k,1,2",
            "5,k,",
            "5,k,1,GET",
            "5,k,1,,/a",
            "5,k,1,G(T,/a",
            "5,k,1,GET,a",
            "5,k,1,GET,/a b",
            "5,k,1,GET,",
            ",k",
            "99999999999999999999999,k",
        ] {
            let err = parse_line(bad, 7).unwrap_err();
            assert_eq!(err.line, 7, "{bad}");
        }
    }

    #[test]
    fn reader_refuses_time_going_backwards_and_names_the_line() {
        let trace = "10,a\n\n# c\n5,a\n20,a\n";
        let mut reader = TraceReader::new(trace.as_bytes());
        assert!(reader.next_request().unwrap().is_ok());
        let err = reader.next_request().unwrap().unwrap_err();
        assert!(reader.next_request().is_none());
        assert_eq!(err.line, 4);
        assert!(err.message.contains("backwards"));
    }

    #[test]
    fn delays_print_in_milliseconds() {
        let allow = |ns| TraceOutcome::Allow {
            delay_nanos: Some(ns),
        };
        assert_eq!(allow(100_000_000).to_string(), "allow 100");
        assert_eq!(allow(0).to_string(), "allow 0");
        assert_eq!(allow(1_500_000).to_string(), "allow 1.5");
        assert_eq!(allow(1).to_string(), "allow 0.000001");
    }
}
