//! The trace format: one request a line, read and checked (see the module above for the
//! format itself).

use std::fmt;
use std::io::BufRead;

/// The cost field of a request.
///
/// # Examples
/// ```
/// use tollgate::replay::{TraceCost, TraceReader};
/// let mut reader = TraceReader::new("10,alice,3\n10,alice,99999999999999999999999\n".as_bytes());
/// assert_eq!(reader.next_request().unwrap()?.cost, Some(TraceCost::Units(3)));
/// // Too many digits for u64: kept (and decided as an error) rather than refused as a bad line.
/// assert_eq!(reader.next_request().unwrap()?.cost, Some(TraceCost::Unbounded));
/// # Ok::<(), tollgate::replay::TraceError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceCost {
    /// A cost that fits in `u64`.
    Units(u64),
    /// A cost written with more digits than `u64` holds: it can never be admitted.
    Unbounded,
}

/// One request of a trace, borrowing its key from the line it was read from.
///
/// # Examples
/// ```
/// use tollgate::replay::{TraceCost, TraceReader, Request};
/// let trace = "1500,alice\n1500,203.0.113.7,,POST,/api/export?fields=a,b\n1500+250,alice\n";
/// let mut reader = TraceReader::new(trace.as_bytes());
/// let request = reader.next_request().unwrap()?;
/// let expected = Request { line: 1, t_ms: 1500, duration_ms: None, key: "alice", cost: None, method: None, path: None };
/// assert_eq!(request, expected);
/// assert_eq!(request.units(), TraceCost::Units(1));
/// // With a method and a path (for `tollgate replay --config`), the cost may be left empty.
/// let routed = reader.next_request().unwrap()?;
/// assert_eq!((routed.cost, routed.method, routed.path), (None, Some("POST"), Some("/api/export?fields=a,b")));
/// // With how long it ran (for `tollgate replay --in-flight`): started at 1500 ms, took 250 ms.
/// assert_eq!(reader.next_request().unwrap()?.duration_ms, Some(250));
/// # Ok::<(), tollgate::replay::TraceError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The line number (from 1) the request came from.
    pub line: usize,
    /// Time in milliseconds since the trace's origin.
    pub t_ms: u64,
    /// How long the request ran, in milliseconds, if the line says (`t_ms+duration_ms`): how
    /// long an in-flight replay holds its place.
    pub duration_ms: Option<u64>,
    /// The key.
    pub key: &'a str,
    /// The cost, if the line gives one.
    pub cost: Option<TraceCost>,
    /// The HTTP method, if the line gives a route (always with a path).
    pub method: Option<&'a str>,
    /// The path and query, if the line gives a route (always with a method): as the client
    /// sent it, which is what a `--config` policy matches.
    pub path: Option<&'a str>,
}

impl Request<'_> {
    /// The cost, 1 unless the line gives one.
    pub fn units(&self) -> TraceCost {
        self.cost.unwrap_or(TraceCost::Units(1))
    }
}

/// A line that is not a valid request, or a time that went backwards.
///
/// # Examples
/// ```
/// use tollgate::replay::TraceReader;
/// let mut reader = TraceReader::new("100,a\n50,a\n".as_bytes());
/// assert!(reader.next_request().unwrap().is_ok());
/// let err = reader.next_request().unwrap().unwrap_err();
/// assert_eq!(err.line, 2); // time went backwards: the message names the line
/// assert!(reader.next_request().is_none()); // and reading stops there
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// The line number, from 1.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for TraceError {}

/// Parses one line. `Ok(None)` for a blank line or a comment.
pub(crate) fn parse_line(line: &str, number: usize) -> Result<Option<Request<'_>>, TraceError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.trim().is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let error = |message: String| TraceError {
        line: number,
        message,
    };
    const FORMAT: &str = "'t_ms[+duration_ms],key[,cost[,method,path]]'";
    // The path is the rest of the line: a query may hold commas.
    let mut fields = line.splitn(5, ',');
    let time = fields.next().unwrap_or_default().trim();
    let key = fields
        .next()
        .ok_or_else(|| error(format!("expected {FORMAT}, found '{line}'")))?
        .trim();
    let cost = fields.next().map(str::trim);
    let method = fields.next().map(str::trim);
    let path = fields.next().map(str::trim);
    let (time, duration) = match time.split_once('+') {
        Some((time, duration)) => (time, Some(duration)),
        None => (time, None),
    };
    let t_ms = parse_count(time)
        .ok_or_else(|| {
            error(format!(
                "time '{time}' is not a non-negative integer of milliseconds"
            ))
        })?
        .ok_or_else(|| error(format!("time '{time}' is too large")))?;
    let duration_ms = match duration {
        None => None,
        Some(text) => Some(
            parse_count(text)
                .ok_or_else(|| {
                    error(format!(
                        "duration '{text}' is not a non-negative integer of milliseconds"
                    ))
                })?
                .ok_or_else(|| error(format!("duration '{text}' is too large")))?,
        ),
    };
    let cost = match cost {
        None => None,
        // Left empty before a route: the policy's cost.
        Some("") if method.is_some() => None,
        Some(text) => Some(match parse_count(text) {
            Some(Some(units)) => TraceCost::Units(units),
            Some(None) => TraceCost::Unbounded,
            None => {
                return Err(error(format!(
                    "cost '{text}' is not a non-negative integer"
                )))
            }
        }),
    };
    let (method, path) = match (method, path) {
        (None, _) => (None, None),
        (Some(_), None) => {
            return Err(error(format!(
                "a method needs a path: expected {FORMAT}, found '{line}'"
            )))
        }
        (Some(method), Some(path)) => {
            if method.is_empty() || !method.bytes().all(is_token_byte) {
                return Err(error(format!("method '{method}' is not an HTTP method")));
            }
            if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(error(format!(
                    "path '{path}' does not start with '/', or holds a space or a control character"
                )));
            }
            (Some(method), Some(path))
        }
    };
    Ok(Some(Request {
        line: number,
        t_ms,
        duration_ms,
        key,
        cost,
        method,
        path,
    }))
}

/// Whether `b` may appear in an HTTP token (RFC 9110 `tchar`), such as a method.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `None`: not all digits; `Some(None)`: digits that overflow `u64`.
fn parse_count(text: &str) -> Option<Option<u64>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().ok())
}

/// Reads a trace from any `BufRead`, one request at a time, checking that time never goes
/// backwards. Stops at the first error (the caller reports it and exits). Each request borrows
/// the reader's line buffer, so reading allocates nothing per line.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::AlgorithmName;
/// use tollgate::replay::{TraceOutcome, Replayer, TraceReader};
/// let trace = "# t_ms,key[,cost]\n0,alice\n10,alice\n20,bob,2\n";
/// let mut replayer = Replayer::new(AlgorithmName::Gcra, 1, Duration::from_secs(1), None)?;
/// let mut reader = TraceReader::new(trace.as_bytes());
/// let mut outcomes = Vec::new();
/// while let Some(request) = reader.next_request() {
///     outcomes.push(replayer.decide(&request?));
/// }
/// assert_eq!(outcomes, [TraceOutcome::Allow { delay_nanos: None }, TraceOutcome::Deny, TraceOutcome::Error]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TraceReader<R> {
    input: R,
    line: usize,
    last_ms: u64,
    buffer: Vec<u8>,
    failed: bool,
}

impl<R: BufRead> TraceReader<R> {
    /// A reader over `input`.
    ///
    /// # Examples
    /// ```
    /// use std::io::BufReader;
    /// use tollgate::replay::TraceReader;
    /// // Any `BufRead`: a file, standard input's lock, or bytes in memory.
    /// let mut reader = TraceReader::new(BufReader::new("0,alice\n".as_bytes()));
    /// assert_eq!(reader.next_request().unwrap()?.key, "alice");
    /// # Ok::<(), tollgate::replay::TraceError>(())
    /// ```
    pub fn new(input: R) -> Self {
        TraceReader {
            input,
            line: 0,
            last_ms: 0,
            buffer: Vec::new(),
            failed: false,
        }
    }

    /// The next request; `None` at the end of the input or after an error.
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::TraceReader;
    /// // Blank lines and `#` comments are skipped; a request borrows the reader's buffer, so take
    /// // what you need from it before reading the next one.
    /// let mut reader = TraceReader::new("\n# header\n5,bob,2\n".as_bytes());
    /// let request = reader.next_request().unwrap()?;
    /// assert_eq!((request.line, request.t_ms, request.key), (3, 5, "bob"));
    /// assert!(reader.next_request().is_none());
    /// # Ok::<(), tollgate::replay::TraceError>(())
    /// ```
    #[allow(clippy::should_implement_trait)] // a lending iterator: items borrow the reader
    pub fn next_request(&mut self) -> Option<Result<Request<'_>, TraceError>> {
        if self.failed {
            return None;
        }
        // Find the next line that is not blank or a comment. The request is kept as numbers and
        // its fields' places in the buffer, because a borrow cannot leave this loop.
        let (t_ms, duration_ms, cost, [key, method, path]) = loop {
            self.buffer.clear();
            self.line += 1;
            match self.input.read_until(b'\n', &mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => return self.fail(format!("cannot read the input: {e}")),
            }
            let Ok(text) = std::str::from_utf8(&self.buffer) else {
                return self.fail("the line is not valid UTF-8".into());
            };
            let text = text.strip_suffix('\n').unwrap_or(text);
            match parse_line(text, self.line) {
                Ok(None) => continue,
                Ok(Some(request)) if request.t_ms < self.last_ms => {
                    let message = format!(
                        "time goes backwards: {} ms after {} ms",
                        request.t_ms, self.last_ms
                    );
                    return self.fail(message);
                }
                Ok(Some(r)) => {
                    let place = |field: &str| {
                        let start = field.as_ptr() as usize - text.as_ptr() as usize;
                        start..start + field.len()
                    };
                    let route = |field: Option<&str>| field.map(place);
                    break (
                        r.t_ms,
                        r.duration_ms,
                        r.cost,
                        [Some(place(r.key)), route(r.method), route(r.path)],
                    );
                }
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        };
        self.last_ms = t_ms;
        // The fields' bytes were checked as UTF-8 with the rest of the line.
        let field = |place: Option<std::ops::Range<usize>>| {
            place.map(|place| std::str::from_utf8(&self.buffer[place]).unwrap_or_default())
        };
        Some(Ok(Request {
            line: self.line,
            t_ms,
            duration_ms,
            key: field(key).unwrap_or_default(),
            cost,
            method: field(method),
            path: field(path),
        }))
    }

    fn fail(&mut self, message: String) -> Option<Result<Request<'static>, TraceError>> {
        self.failed = true;
        Some(Err(TraceError {
            line: self.line,
            message,
        }))
    }
}
