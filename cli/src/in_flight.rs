//! `replay --in-flight N`: a concurrency limit replayed. Each admitted line holds its place from
//! its time until its time plus its duration (`t_ms+duration_ms`), on the library's own
//! [`InFlight`]; a place that ends at `t` is free for a request at `t`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tollgate::replay::{Request, TraceCost, TraceOutcome};
use tollgate::{InFlight, InFlightBoundError, OwnedInFlightPermit};

/// Decides a trace under "at most `N` requests in flight per key": answers "what would a
/// bound on concurrent requests have refused?" from a log that records how long each request
/// ran. A line without a duration holds its place for 0 ms: admitted if there is room at that
/// instant, it takes none after.
#[derive(Debug)]
pub(crate) struct InFlightReplayer {
    limit: Arc<InFlight<String>>,
    /// Places held, until the trace time they end at.
    held: HeldUntil<OwnedInFlightPermit<String>>,
}

/// Values held until a trace time, then dropped, earliest end first (then the order they were
/// held in): the places a replay gives back as its trace's time moves on.
#[derive(Debug)]
pub(crate) struct HeldUntil<T> {
    /// By (end in trace ms, order held).
    values: BTreeMap<(u64, u64), T>,
    next: u64,
}

impl<T> HeldUntil<T> {
    /// Nothing held.
    pub(crate) fn new() -> Self {
        HeldUntil {
            values: BTreeMap::new(),
            next: 0,
        }
    }

    /// Holds `value` until trace time `until_ms`.
    pub(crate) fn hold(&mut self, until_ms: u64, value: T) {
        self.values.insert((until_ms, self.next), value);
        self.next += 1;
    }

    /// Drops every value held until `now_ms` or earlier.
    pub(crate) fn release_until(&mut self, now_ms: u64) {
        while self
            .values
            .first_key_value()
            .is_some_and(|(&(until, _), _)| until <= now_ms)
        {
            self.values.pop_first();
        }
    }

    /// How many values are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.values.len()
    }
}

impl InFlightReplayer {
    /// At most `max` requests (units) in flight per key; `max = 0` is
    /// [`InFlightBoundError::Zero`].
    pub(crate) fn new(max: u64) -> Result<InFlightReplayer, InFlightBoundError> {
        Ok(InFlightReplayer {
            limit: Arc::new(InFlight::new(max)?),
            held: HeldUntil::new(),
        })
    }

    /// Decides one request at its trace time: the places of requests that ended by then are
    /// free again; admitted if its key has room for its cost. `Error` for a cost above `N`.
    pub(crate) fn decide(&mut self, request: &Request) -> TraceOutcome {
        self.decide_then(request, || TraceOutcome::Allow { delay_nanos: None })
    }

    /// [`InFlightReplayer::decide`], then, once the request has its place, `then` decides it
    /// (a rate, say): a request `then` refuses gives its place back at once, as the tower
    /// layer's does (the place is taken first, so a request refused here costs the rate
    /// nothing).
    pub(crate) fn decide_then(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::replay::{Replayer, TraceReader};
    use tollgate::AlgorithmName;

    use super::*;

    /// Each line of `trace` decided by `decide`, as printed.
    fn outcomes(trace: &str, mut decide: impl FnMut(&Request) -> TraceOutcome) -> Vec<String> {
        let mut reader = TraceReader::new(trace.as_bytes());
        let mut out = Vec::new();
        while let Some(request) = reader.next_request() {
            out.push(decide(&request.expect("a valid trace")).to_string());
        }
        out
    }

    #[test]
    fn places_end_at_their_requests_end() {
        // Uploads of 300 ms, at most 2 at once per client: the third starts while the first
        // two run; the fourth starts as the first ends.
        let trace = "0+300,alice\n100+300,alice\n200+300,alice\n300+300,alice\n";
        let mut replayer = InFlightReplayer::new(2).unwrap();
        let got = outcomes(trace, |r| replayer.decide(r));
        assert_eq!(got, ["allow", "allow", "deny", "allow"]);
    }

    #[test]
    fn a_bound_of_zero_is_an_error_and_a_cost_above_it_is_refused_as_error() {
        assert_eq!(
            InFlightReplayer::new(0).unwrap_err(),
            InFlightBoundError::Zero
        );
        let mut replayer = InFlightReplayer::new(2).unwrap();
        assert_eq!(
            outcomes("0,k,3\n0,k,2\n", |r| replayer.decide(r)),
            ["error", "allow"]
        );
    }

    /// At most `max` in flight per key, then a fixed window of `limit` per 10 s.
    fn both(max: u64, limit: u64, trace: &str) -> Vec<String> {
        let window = Duration::from_secs(10);
        let mut rate = Replayer::new(AlgorithmName::FixedWindow, limit, window, None).unwrap();
        let mut in_flight = InFlightReplayer::new(max).unwrap();
        outcomes(trace, |r| in_flight.decide_then(r, || rate.decide(r)))
    }

    #[test]
    fn a_request_the_bound_refuses_costs_the_rate_nothing() {
        // The second is refused while the first runs; charged, it would leave the third no
        // unit of the window.
        let got = both(1, 2, "0+1000,k\n500,k\n1000,k\n");
        assert_eq!(got, ["allow", "deny", "allow"]);
    }

    #[test]
    fn a_request_the_rate_refuses_gives_its_place_back() {
        // The second is refused by the rate (1 a window); holding its place until 20100, it
        // would leave the third, in the rate's next window, no place of the 2.
        let got = both(2, 1, "0+20000,k\n100+20000,k\n10000,k\n");
        assert_eq!(got, ["allow", "deny", "allow"]);
    }

    #[test]
    fn held_values_are_released_earliest_end_first() {
        let mut held = HeldUntil::new();
        held.hold(300, "upload");
        held.hold(100, "search");
        held.release_until(100); // a place that ends at t is free at t
        assert_eq!(held.len(), 1);
        held.release_until(299);
        assert_eq!(held.len(), 1);
        held.release_until(300);
        assert_eq!(held.len(), 0);
    }
}
