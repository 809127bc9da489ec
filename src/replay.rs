//! `tollgate replay`: deciding a trace of requests, line by line, in the trace's own time.
//!
//! The format (the `tollgate replay` trace format): one request a line,
//! `t_ms[+duration_ms],key[,cost[,method,path]]`; `t_ms` a non-negative integer of
//! milliseconds, non-decreasing; `duration_ms`, how long the request ran, read only by an
//! in-flight replay ([`InFlightReplayer`]); cost defaults to 1 (`tollgate replay --config`: to the policy's cost), and
//! may be left empty before a method and path; the method is an HTTP method token and the path
//! starts with `/` (the rest of the line: it may hold commas). Blank lines and lines starting
//! with `#` are skipped. The origin is `t = 0` of the trace; no wall clock.
//!
//! Everything here streams: a [`Replayer`] holds one keyed limiter whose idle keys are evicted
//! as it goes, so a trace of millions of lines runs in memory proportional to the keys that
//! still hold state, not to the trace.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use tollgate::replay::{AlgorithmName, Replayer, TraceReader};
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
use std::str::FromStr;
use std::time::Duration;

mod in_flight;
mod trace;

pub use self::in_flight::{HeldUntil, InFlightReplayer};
pub use self::trace::{parse_line, Request, TraceCost, TraceError, TraceReader};

use crate::clock::ManualClock;
use crate::limiter::Algorithm;
use crate::limiter::KeyedLimiter;
use crate::{FixedWindow, Gcra, LeakyQueue, Quota, QuotaError, SlidingLog, SlidingWindow};

/// The algorithms by the names of [`docs::decision_rules`](crate::docs::decision_rules).
///
/// # Examples
/// ```
/// use tollgate::replay::AlgorithmName;
/// // The names `tollgate replay --algorithm` and configuration files accept.
/// let name: AlgorithmName = "sliding-window".parse()?;
/// assert_eq!(name, AlgorithmName::SlidingWindow);
/// assert!("round-robin".parse::<AlgorithmName>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmName {
    /// `gcra`
    Gcra,
    /// `token-bucket` (decides as `gcra`)
    TokenBucket,
    /// `leaky-bucket` (decides as `gcra` with `B = C`)
    LeakyBucket,
    /// `leaky-queue`
    LeakyQueue,
    /// `fixed-window`
    FixedWindow,
    /// `sliding-window`
    SlidingWindow,
    /// `sliding-log`
    SlidingLog,
}

impl AlgorithmName {
    /// Every algorithm, in the order of the decision rules.
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::AlgorithmName;
    /// // What `--compare` runs.
    /// let names: Vec<&str> = AlgorithmName::ALL.iter().map(|a| a.as_str()).collect();
    /// assert_eq!(names[0], "gcra");
    /// assert_eq!(names.len(), 7);
    /// ```
    pub const ALL: [AlgorithmName; 7] = [
        AlgorithmName::Gcra,
        AlgorithmName::TokenBucket,
        AlgorithmName::LeakyBucket,
        AlgorithmName::LeakyQueue,
        AlgorithmName::FixedWindow,
        AlgorithmName::SlidingWindow,
        AlgorithmName::SlidingLog,
    ];

    /// The name, as `tollgate replay --algorithm` takes it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::AlgorithmName;
    /// assert_eq!(AlgorithmName::LeakyQueue.as_str(), "leaky-queue");
    /// assert_eq!(AlgorithmName::LeakyQueue.as_str().parse(), Ok(AlgorithmName::LeakyQueue));
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmName::Gcra => "gcra",
            AlgorithmName::TokenBucket => "token-bucket",
            AlgorithmName::LeakyBucket => "leaky-bucket",
            AlgorithmName::LeakyQueue => "leaky-queue",
            AlgorithmName::FixedWindow => "fixed-window",
            AlgorithmName::SlidingWindow => "sliding-window",
            AlgorithmName::SlidingLog => "sliding-log",
        }
    }

    /// Whether the algorithm takes a burst / capacity.
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::AlgorithmName;
    /// // Whether `--burst` means anything: window algorithms refuse one.
    /// assert!(AlgorithmName::Gcra.has_burst());
    /// assert!(!AlgorithmName::FixedWindow.has_burst());
    /// ```
    pub fn has_burst(self) -> bool {
        matches!(
            self,
            AlgorithmName::Gcra
                | AlgorithmName::TokenBucket
                | AlgorithmName::LeakyBucket
                | AlgorithmName::LeakyQueue
        )
    }
}

impl fmt::Display for AlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlgorithmName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        AlgorithmName::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = AlgorithmName::ALL.iter().map(|a| a.as_str()).collect();
                format!(
                    "unknown algorithm '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

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
///
/// # Examples
/// ```
/// use tollgate::replay::Millis;
/// assert_eq!(Millis(250_000_000).to_string(), "250");
/// assert_eq!(Millis(1_500_000).to_string(), "1.5");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis(pub u64);

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
/// use tollgate::replay::{AlgorithmName, TraceOutcome, Replayer, TraceReader};
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

/// One algorithm's keyed limiter on a clock the trace drives.
#[derive(Debug)]
struct Engine<A: Algorithm> {
    limiter: KeyedLimiter<String, A, ManualClock>,
    clock: ManualClock,
}

impl<A: Algorithm> Engine<A> {
    fn new(rule: A) -> Result<Self, QuotaError> {
        let clock = ManualClock::new();
        Ok(Engine {
            limiter: KeyedLimiter::with_clock(rule, clock.clone())?,
            clock,
        })
    }

    fn outcome_at(&self, t_nanos: u64, key: &str, cost: u64, shaper: bool) -> TraceOutcome {
        self.clock.set(t_nanos);
        match self.limiter.check_n(key, cost) {
            Ok(d) if d.allowed() => TraceOutcome::Allow {
                delay_nanos: shaper.then(|| d.delay_nanos()),
            },
            Ok(_) => TraceOutcome::Deny,
            Err(_) => TraceOutcome::Error,
        }
    }
}

#[derive(Debug)]
enum AnyEngine {
    Gcra(Engine<Gcra>),
    LeakyQueue(Engine<LeakyQueue>),
    FixedWindow(Engine<FixedWindow>),
    SlidingWindow(Engine<SlidingWindow>),
    SlidingLog(Engine<SlidingLog>),
}

/// Decides requests for one algorithm and quota, in the trace's time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::replay::{AlgorithmName, TraceOutcome, Replayer, TraceReader};
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
    engine: AnyEngine,
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
    /// use tollgate::replay::{AlgorithmName, Replayer};
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
        let engine = match algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                AnyEngine::Gcra(Engine::new(Gcra::new(quota)?)?)
            }
            AlgorithmName::LeakyQueue => {
                AnyEngine::LeakyQueue(Engine::new(LeakyQueue::new(quota)?)?)
            }
            AlgorithmName::FixedWindow => {
                AnyEngine::FixedWindow(Engine::new(FixedWindow::new(quota)?)?)
            }
            AlgorithmName::SlidingWindow => {
                AnyEngine::SlidingWindow(Engine::new(SlidingWindow::new(quota)?)?)
            }
            AlgorithmName::SlidingLog => {
                AnyEngine::SlidingLog(Engine::new(SlidingLog::new(quota)?)?)
            }
        };
        Ok(Replayer { algorithm, engine })
    }

    /// The algorithm this replayer runs.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::replay::{AlgorithmName, Replayer};
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
    /// use tollgate::replay::{parse_line, AlgorithmName, TraceOutcome, Replayer};
    /// let mut replayer = Replayer::new(AlgorithmName::Gcra, 1, Duration::from_secs(1), None)?;
    /// let first = parse_line("0,k", 1)?.unwrap();
    /// assert_eq!(replayer.decide(&first), TraceOutcome::Allow { delay_nanos: None });
    /// assert_eq!(replayer.decide(&parse_line("999,k", 2)?.unwrap()), TraceOutcome::Deny);
    /// // The trace's time, not the wall clock: a second later in the trace, admitted again.
    /// assert!(replayer.decide(&parse_line("1000,k", 3)?.unwrap()).is_allow());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide(&mut self, request: &Request) -> TraceOutcome {
        let TraceCost::Units(cost) = request.units() else {
            return TraceOutcome::Error;
        };
        // A time past 2^64 ns (584 years) cannot be represented: such a request is judged at
        // the end of time, where nothing more can be admitted.
        let t = request.t_ms.saturating_mul(1_000_000);
        let key = request.key;
        match &self.engine {
            AnyEngine::Gcra(e) => e.outcome_at(t, key, cost, false),
            AnyEngine::LeakyQueue(e) => e.outcome_at(t, key, cost, true),
            AnyEngine::FixedWindow(e) => e.outcome_at(t, key, cost, false),
            AnyEngine::SlidingWindow(e) => e.outcome_at(t, key, cost, false),
            AnyEngine::SlidingLog(e) => e.outcome_at(t, key, cost, false),
        }
    }
}

#[cfg(test)]
mod tests {
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
