//! Replaying a concurrency limit: each admitted line holds its place from its time until its
//! time plus its duration (`t_ms+duration_ms`), on the crate's own [`InFlight`].

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Request, TraceCost, TraceOutcome};
use crate::{InFlight, InFlightBoundError, OwnedInFlightPermit};

/// Decides a trace under "at most `N` requests in flight per key": answers "what would a
/// bound on concurrent requests have refused?" from a log that records how long each request
/// ran.
///
/// A line's place is held from `t_ms` until `t_ms + duration_ms` (a line without a duration
/// holds it for 0 ms: it is admitted if there is room at that instant and takes none after).
/// A place that ends at `t` is free for a request at `t`.
///
/// # Examples
/// ```
/// use tollgate::replay::{InFlightReplayer, TraceOutcome, TraceReader};
/// // Uploads of 300 ms, at most 2 at once per client.
/// let trace = "0+300,alice\n100+300,alice\n200+300,alice\n300+300,alice\n";
/// let mut replayer = InFlightReplayer::new(2)?;
/// let mut reader = TraceReader::new(trace.as_bytes());
/// let mut outcomes = Vec::new();
/// while let Some(request) = reader.next_request() {
///     outcomes.push(replayer.decide(&request?).to_string());
/// }
/// // The third starts while the first two run; the fourth starts as the first ends.
/// assert_eq!(outcomes, ["allow", "allow", "deny", "allow"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct InFlightReplayer {
    limit: Arc<InFlight<String>>,
    /// Places held, until the trace time they end at.
    held: HeldUntil<OwnedInFlightPermit<String>>,
}

/// Values held until a trace time, then dropped, earliest end first (then the order they were
/// held in): the places a replay gives back as its trace's time moves on.
///
/// # Examples
/// ```
/// use tollgate::replay::HeldUntil;
/// let mut held = HeldUntil::new();
/// held.hold(300, "upload");
/// held.hold(100, "search");
/// held.release_until(100); // a place that ends at t is free at t
/// assert_eq!(held.len(), 1);
/// held.release_until(299);
/// assert_eq!(held.len(), 1);
/// held.release_until(300);
/// assert!(held.is_empty());
/// ```
#[derive(Debug)]
pub struct HeldUntil<T> {
    /// By (end in trace ms, order held).
    values: BTreeMap<(u64, u64), T>,
    next: u64,
}

impl<T> Default for HeldUntil<T> {
    fn default() -> Self {
        HeldUntil {
            values: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<T> HeldUntil<T> {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `value` until trace time `until_ms`.
    pub fn hold(&mut self, until_ms: u64, value: T) {
        self.values.insert((until_ms, self.next), value);
        self.next += 1;
    }

    /// Drops every value held until `now_ms` or earlier.
    pub fn release_until(&mut self, now_ms: u64) {
        while self
            .values
            .first_key_value()
            .is_some_and(|(&(until, _), _)| until <= now_ms)
        {
            self.values.pop_first();
        }
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl InFlightReplayer {
    /// At most `max` requests (units) in flight per key.
    ///
    /// # Errors
    /// As for [`InFlight::new`]: `max = 0` is [`InFlightBoundError::Zero`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::replay::InFlightReplayer;
    /// assert!(InFlightReplayer::new(4).is_ok());
    /// assert!(InFlightReplayer::new(0).is_err());
    /// ```
    pub fn new(max: u64) -> Result<InFlightReplayer, InFlightBoundError> {
        Ok(InFlightReplayer {
            limit: Arc::new(InFlight::new(max)?),
            held: HeldUntil::new(),
        })
    }

    /// `N`.
    pub fn max(&self) -> u64 {
        self.limit.max()
    }

    /// Decides one request at its trace time: the places of requests that ended by then are
    /// free again; admitted if its key has room for its cost. `Error` for a cost above `N`.
    pub fn decide(&mut self, request: &Request) -> TraceOutcome {
        self.decide_then(request, || TraceOutcome::Allow { delay_nanos: None })
    }

    /// [`InFlightReplayer::decide`], then, once the request has its place, `then` decides it
    /// (a rate, say): a request `then` refuses gives its place back at once, as the tower
    /// layer's does (the place is taken first, so a request refused here costs the rate
    /// nothing).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::AlgorithmName;
    /// use tollgate::replay::{parse_line, InFlightReplayer, Replayer};
    /// let mut rate = Replayer::new(AlgorithmName::FixedWindow, 1, Duration::from_secs(1), None)?;
    /// let mut in_flight = InFlightReplayer::new(1)?;
    /// let first = parse_line("0+5000,k", 1)?.unwrap();
    /// assert!(in_flight.decide_then(&first, || rate.decide(&first)).is_allow());
    /// // Refused by the bound while the first runs: the rate is not charged ...
    /// let second = parse_line("1500,k", 2)?.unwrap();
    /// assert!(!in_flight.decide_then(&second, || rate.decide(&second)).is_allow());
    /// // ... so a request after the first ended gets the rate's unit of its window.
    /// let third = parse_line("5000,k", 3)?.unwrap();
    /// assert!(in_flight.decide_then(&third, || rate.decide(&third)).is_allow());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide_then(
        &mut self,
        request: &Request,
        then: impl FnOnce() -> TraceOutcome,
    ) -> TraceOutcome {
        let TraceCost::Units(cost) = request.units() else {
            return TraceOutcome::Error;
        };
        self.held.release_until(request.t_ms);
        let permit = match self.limit.try_acquire_n_owned(request.key, cost) {
            Ok(Some(permit)) => permit,
            Ok(None) => return TraceOutcome::Deny,
            Err(_) => return TraceOutcome::Error,
        };
        let outcome = then();
        if outcome.is_allow() {
            let ends_ms = request
                .t_ms
                .saturating_add(request.duration_ms.unwrap_or(0));
            self.held.hold(ends_ms, permit);
        }
        outcome
    }
}
