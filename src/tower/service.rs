//! The service the layer wraps around the application: each request's plan (which policy,
//! which key), its verdict, and the response future that answers it or passes it on.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::addr::{peer_addr, Addrs};
use super::answers::Fallback;
use super::backend::{CheckBackend, CheckError, Verdict};
use super::body::RateLimitBody;
use super::delay::policy_verdict;
use super::future::{Admitted, ResponseFuture, Stage};
use super::key::{Key, LongKey};
use super::layer::{Evaluation, RateLimitLayer, Shared};
use super::outcome::Outcome;
use super::path::client_path;
use super::policy::{Mode, Policy};
use super::response::{
    add_headers, grpc_code, grpc_response, is_grpc, problem, problem_response, retry_after_secs,
    set_retry_after, Denial, HeaderStyle, GRPC_RESOURCE_EXHAUSTED,
};
use super::response::{denial_detail, denial_problem, never_cached};
use super::stats;
use crate::decision::LimitError;
use crate::limiter::OwnedInFlightPermit;

/// The service [`RateLimitLayer`] wraps around `S`.
///
/// # Examples
/// ```
/// use tollgate::tower::{Key, Policy, RateLimitLayer};
/// use tollgate::{Gcra, KeyedLimiter, Quota};
/// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
/// use tollgate::tower::RateLimit;
/// use tower_layer::Layer;
/// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
/// // The service type users name when they store the wrapped service.
/// let service: RateLimit<()> = layer.layer(());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// What to do with a request, decided before any await.
pub(super) enum Plan {
    /// Pass it on, uncounted.
    Pass,
    /// Policy `policy` applies but the request is answered unchecked: it has no client key
    /// (`outcome` `NoKey`), or its key is too long and refused (`KeyTooLong`); `fallback`
    /// decides.
    Unchecked {
        policy: usize,
        outcome: Outcome,
        fallback: Fallback,
        /// The problem detail of a rejection.
        detail: &'static str,
    },
    /// Check `cost` for `key` against policy `policy`.
    Check { policy: usize, key: Key, cost: u64 },
}

impl Shared {
    /// The request header fields the layer's decisions can read (policies' key headers, the
    /// forwarding header when proxies are trusted, `content-type` for gRPC), or `None` when a
    /// closure (`allow_if`, an allow-listed path, `peer_addr`, `KeySource::from_fn`,
    /// `Policy::cost_fn`) may read any of the head. For a server that must copy a request's
    /// head to hand it to [`gate`](Shared::gate) (actix-web): copying only these gives the
    /// same answers.
    #[cfg(feature = "actix")]
    pub(crate) fn read_headers(&self) -> Option<Vec<http::HeaderName>> {
        if self.peer.is_some() || self.allow_if.is_some() {
            return None;
        }
        let mut names = vec![http::header::CONTENT_TYPE];
        if !self.addrs.trusted.is_empty() {
            names.push(self.addrs.forwarding_header().clone());
        }
        for policy in &self.policies {
            if policy.key.has_fn() || matches!(policy.cost, super::Cost::Fn(_)) {
                return None;
            }
            for name in policy.key.headers() {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        Some(names)
    }
}

impl Shared {
    /// `peer`: the peer's address when the server has it outside the request's extensions
    /// (actix-web); `None` to read it there.
    pub(super) fn plan(&self, parts: &Parts, peer: Option<IpAddr>) -> Plan {
        let last = self.policies.len();
        let path = client_path(parts);
        let index = match (self.policies.iter()).position(|p| p.matches(&parts.method, &path)) {
            Some(i) if !(self.has_default && i + 1 == last) => i,
            _ if self.has_default => last - 1,
            _ => return Plan::Pass,
        };
        let policy = &self.policies[index];
        let peer = match &self.peer {
            Some(peer_fn) => peer_fn(parts),
            None => peer.or_else(|| peer_addr(parts)),
        };
        let mut addrs = Addrs::new(&self.addrs).with_peer(peer);
        if !self.allow_cidrs.is_empty() {
            if let Some(ip) = addrs.client(parts) {
                if self.allow_cidrs.iter().any(|net| net.contains(ip)) {
                    return Plan::Pass;
                }
            }
        }
        if self.allow_if.as_ref().is_some_and(|allow| allow(parts)) {
            return Plan::Pass;
        }
        let mut key = match policy.key.extract(parts, &path, &mut addrs) {
            Ok(key) => key,
            Err(missing) => {
                stats::record(policy, Outcome::NoKey);
                stats::trace_no_key(policy, missing);
                let fallback = (policy.on_missing_key.or(self.on_missing_key))
                    .unwrap_or_else(|| missing.default_fallback());
                return Plan::Unchecked {
                    policy: index,
                    outcome: Outcome::NoKey,
                    fallback,
                    detail: missing.detail(),
                };
            }
        };
        if key.longest_part() > self.max_key_len {
            match self.on_long_key {
                LongKey::Digest => key = key.digested(self.max_key_len),
                LongKey::Reject(status) => {
                    stats::record(policy, Outcome::KeyTooLong);
                    return Plan::Unchecked {
                        policy: index,
                        outcome: Outcome::KeyTooLong,
                        fallback: Fallback::Reject(status),
                        detail: LONG_KEY_DETAIL,
                    };
                }
            }
        }
        Plan::Check {
            policy: index,
            key,
            cost: policy.cost.of(parts),
        }
    }

    /// The fallback answer `status` to a request.
    pub(super) fn reject<B>(
        &self,
        status: StatusCode,
        detail: &str,
        grpc: bool,
    ) -> Response<RateLimitBody<B>> {
        if grpc {
            grpc_response(grpc_code(status), detail)
        } else {
            problem_response(status, problem(status, detail, None))
        }
    }

    /// The answer to a request `policy` refused with `verdict`.
    pub(super) fn deny<B>(
        &self,
        policy: &Policy,
        verdict: &Verdict,
        grpc: bool,
    ) -> Response<RateLimitBody<B>> {
        let secs = retry_after_secs(&verdict.decision);
        let mut response = match &self.deny_with {
            Some(f) => f(&Denial {
                policy: policy.name(),
                decision: &verdict.decision,
                retry_after_secs: secs,
                grpc,
            })
            .map(RateLimitBody::full),
            None => {
                if grpc {
                    let detail = denial_detail(policy.name(), secs);
                    grpc_response(GRPC_RESOURCE_EXHAUSTED, &detail)
                } else {
                    let body = denial_problem(policy.name(), secs);
                    problem_response(StatusCode::TOO_MANY_REQUESTS, body)
                }
            }
        };
        set_retry_after(response.headers_mut(), secs);
        never_cached(response.headers_mut());
        add_headers(response.headers_mut(), self.headers, policy, verdict);
        response
    }
}

/// The detail of the answer to a request whose key is too long.
const LONG_KEY_DETAIL: &str = "The request's client key for rate limiting is too long.";

/// What `decided` means for a request of `policy`.
pub(super) fn outcome(
    policy: &Policy,
    decided: &Result<(Verdict, std::time::Duration), CheckError>,
) -> Outcome {
    match decided {
        Err(CheckError::Limit(LimitError::KeyTableFull { .. })) => Outcome::TableFull,
        Err(_) => Outcome::Error,
        Ok((verdict, waited)) => match (verdict.decision.allowed(), policy.mode) {
            (true, _) if waited.is_zero() => Outcome::Allowed,
            (true, _) => Outcome::Delayed,
            (false, Mode::Shadow) => Outcome::ShadowDenied,
            (false, _) => Outcome::Denied,
        },
    }
}

/// Counts what `decided` means for a request of `policy` (feature `metrics`).
pub(super) fn record_outcome(
    policy: &Policy,
    key: &Key,
    decided: &Result<(Verdict, std::time::Duration), CheckError>,
) {
    stats::trace(policy, key, decided);
    let outcome = outcome(policy, decided);
    if let (Outcome::Delayed, Ok((_, waited))) = (outcome, decided) {
        stats::record_wait(policy, *waited);
    }
    stats::record(policy, outcome);
}

/// What becomes of a checked request.
pub(super) enum Next<B> {
    /// This answer, without calling the inner service (a denial, a rejection).
    Respond(Response<RateLimitBody<B>>),
    /// The inner service's answer, finished by `Admitted` when there is anything to add.
    Call(Option<Admitted>),
}

/// Counts what policy `index` `decided` for `key`, and what the request (with `headers`) gets
/// for it. Whether it is a gRPC request is read only when the layer answers it itself.
pub(super) fn next<B>(
    shared: &Arc<Shared>,
    index: usize,
    key: Key,
    cost: u64,
    decided: Result<(Verdict, std::time::Duration), CheckError>,
    grpc: bool,
) -> Next<B> {
    let policy = &shared.policies[index];
    record_outcome(policy, &key, &decided);
    let verdict = match decided {
        Ok((verdict, _)) => verdict,
        Err(_) if policy.mode == Mode::Shadow => return Next::Call(None),
        Err(CheckError::Limit(LimitError::CapacityExceeded { cost, capacity })) => {
            let detail = format!(
                "Rate limit \"{}\": a cost of {cost} exceeds the capacity {capacity}; this request can never be admitted.",
                policy.name()
            );
            return Next::Respond(if grpc {
                grpc_response(GRPC_RESOURCE_EXHAUSTED, &detail)
            } else {
                let status = StatusCode::TOO_MANY_REQUESTS;
                problem_response(status, problem(status, &detail, None))
            });
        }
        Err(error) => {
            let (fallback, detail) = match error {
                CheckError::Limit(LimitError::KeyTableFull { .. }) => (
                    shared.on_table_full,
                    "The rate limiter holds as many clients as it may; try again later.",
                ),
                _ => (
                    shared.on_error,
                    "The rate limiter could not decide this request.",
                ),
            };
            return match fallback {
                Fallback::Allow => Next::Call(None),
                Fallback::Reject(status) => Next::Respond(shared.reject(status, detail, grpc)),
            };
        }
    };
    if !verdict.decision.allowed() && policy.mode != Mode::Shadow {
        return Next::Respond(shared.deny(policy, &verdict, grpc));
    }
    if shared.headers == HeaderStyle::None && policy.refund.is_none() {
        // Nothing to add to the response: it passes as it is.
        return Next::Call(None);
    }
    Next::Call(Some(Admitted {
        shared: Arc::clone(shared),
        policy: index,
        key,
        cost,
        verdict,
    }))
}

/// What the layer does with a request, decided from its head alone (no server framework's
/// types): the tower service and the actix-web middleware (feature `actix`) both start every
/// request with [`Shared::gate`], and differ only in how they call the application and carry
/// the answer.
pub(crate) enum Gate<B> {
    /// This answer, without calling the application (a denial, a rejection).
    Respond(Response<RateLimitBody<B>>),
    /// Call the application, and finish its response with [`Pass`].
    Pass(Pass),
    /// The decision waits (delay mode, a network backend): [`Wait::decide`].
    Wait(Wait),
}

/// What an admitted request's response still needs: its headers and refund
/// ([`Admitted`], none when there is nothing to add), and the request's in-flight place, for
/// the response body to hold until it ends.
#[derive(Default)]
pub(crate) struct Pass {
    pub(crate) admitted: Option<Admitted>,
    pub(crate) place: Option<OwnedInFlightPermit<Key>>,
}

/// A checked request whose decision waits: its policy, key and cost, whether it is gRPC, and
/// its in-flight place (held while it waits; given back if it is refused).
pub(crate) struct Wait {
    shared: Arc<Shared>,
    index: usize,
    key: Key,
    cost: u64,
    grpc: bool,
    place: Option<OwnedInFlightPermit<Key>>,
}

impl Wait {
    /// Waits for the decision (in delay mode, for the slot): the request passes, or gets the
    /// answer given.
    pub(crate) async fn decide<B>(self) -> Result<Pass, Response<RateLimitBody<B>>> {
        let Wait {
            shared,
            index,
            key,
            cost,
            grpc,
            place,
        } = self;
        let decided = policy_verdict(&shared.policies[index], &key, cost).await;
        match next(&shared, index, key, cost, decided, grpc) {
            Next::Respond(response) => Err(response),
            Next::Call(admitted) => Ok(Pass { admitted, place }),
        }
    }
}

impl Shared {
    /// What becomes of a request with head `parts`: its plan, its place under the policy's
    /// in-flight bound and, when the backend decides at once, its check and answer. `peer`: the
    /// peer's address when the server has it outside `parts`' extensions (actix-web), which
    /// are read otherwise.
    pub(crate) fn gate<B>(self: &Arc<Self>, parts: &Parts, peer: Option<IpAddr>) -> Gate<B> {
        let grpc = || is_grpc(&parts.method, &parts.headers);
        let (index, key, cost) = match self.plan(parts, peer) {
            Plan::Pass => return Gate::Pass(Pass::default()),
            Plan::Unchecked {
                fallback, detail, ..
            } => {
                return match fallback {
                    Fallback::Allow => Gate::Pass(Pass::default()),
                    Fallback::Reject(status) => Gate::Respond(self.reject(status, detail, grpc())),
                }
            }
            Plan::Check { policy, key, cost } => (policy, key, cost),
        };
        let policy = &self.policies[index];
        // The request's place under the policy's in-flight bound, taken before the rate is
        // charged (a request refused here costs nothing) and given back if the rate refuses.
        let Ok(place) = take_place(policy, &key) else {
            let detail = format!(
                "Rate limit \"{}\": this client has as many requests in flight as it may.",
                policy.name()
            );
            return Gate::Respond(self.reject(policy.in_flight_status, &detail, grpc()));
        };
        if !policy.rate {
            // An in-flight bound alone: no rate to check, and no figure to show.
            stats::record(policy, Outcome::Allowed);
            return Gate::Pass(Pass {
                admitted: None,
                place,
            });
        }
        // Delay mode may sleep: it always waits.
        let decided = match policy.mode {
            #[cfg(feature = "tokio")]
            Mode::Delay { .. } => None,
            _ => policy.backend.check_now(&key, cost),
        };
        let Some(decided) = decided else {
            return Gate::Wait(Wait {
                shared: Arc::clone(self),
                index,
                key,
                cost,
                grpc: grpc(),
                place,
            });
        };
        let decided = decided.map(|verdict| (verdict, std::time::Duration::ZERO));
        match next(self, index, key, cost, decided, grpc()) {
            Next::Respond(response) => Gate::Respond(response),
            Next::Call(admitted) => Gate::Pass(Pass { admitted, place }),
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqBody: Send + 'static,
    ResBody: 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let gate = self.shared.gate(&parts, None);
        let request = Request::from_parts(parts, body);
        let wait = match gate {
            Gate::Respond(response) => {
                return ResponseFuture::stage(Stage::Ready {
                    response: Some(response),
                })
            }
            Gate::Pass(Pass { admitted, place }) => {
                return ResponseFuture::stage(Stage::Inner {
                    future: self.inner.call(request),
                    admitted,
                    place,
                })
            }
            Gate::Wait(wait) => wait,
        };
        // The inner service is called later, from the future: the one polled ready goes with
        // it, and a fresh clone stays behind (called at once above, it needs no clone: an
        // axum route's clone is an allocation).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let future = Box::pin(async move {
            // (Matched before the next await: a denial holds a response body, which need not
            // be `Send`.)
            let Pass { admitted, place } = match wait.decide().await {
                Ok(pass) => pass,
                Err(response) => return Ok(response),
            };
            let response = inner.call(request).await?;
            let response = Admitted::finish(admitted, response);
            Ok(response.map(|body| body.holding(place)))
        });
        ResponseFuture::stage(Stage::Boxed { future })
    }
}

impl RateLimitLayer {
    /// Decides `parts` as the layer's service would, without a service: the policy that
    /// applies, the key it derives, its check (in delay mode, the wait for the slot) and
    /// whether the request would reach the inner service. It charges the backend and counts the
    /// metrics exactly as a request would; with no response, a refund by status does not apply.
    /// `cost` replaces the policy's cost when given (a cost the server computes by other means).
    /// A policy's in-flight bound is checked too, and the place given back at once: see
    /// [`RateLimitLayer::evaluate_held`] to hold it while the request would run.
    ///
    /// # Examples
    /// ```
    /// use http::Request;
    /// use tollgate::tower::{Key, Outcome, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let layer = RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?;
    /// let mut request = Request::get("/api/x").body(())?;
    /// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
    /// let (parts, ()) = request.into_parts();
    /// let first = layer.evaluate(&parts, None).await;
    /// assert_eq!((first.outcome, first.passes), (Outcome::Allowed, true));
    /// assert_eq!(first.key.unwrap().to_string(), "192.0.2.1");
    /// let second = layer.evaluate(&parts, None).await;
    /// assert_eq!((second.outcome, second.passes), (Outcome::Denied, false));
    /// assert_eq!(second.policy.as_deref(), Some("api"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn evaluate(&self, parts: &Parts, cost: Option<u64>) -> Evaluation {
        self.evaluate_held(parts, cost).await.0
    }

    /// [`RateLimitLayer::evaluate`], and the request's place under its policy's in-flight
    /// bound ([`Policy::max_in_flight`](super::Policy::max_in_flight)) when it passes, for the
    /// caller to hold while the request would run: dropping it gives the place back. A request
    /// over the bound is [`Outcome::InFlight`] and does not pass. This is what
    /// `tollgate replay --config` runs for every line of a trace (holding the place until the
    /// line's time plus its duration).
    ///
    /// # Examples
    /// ```
    /// use http::Request;
    /// use tollgate::tower::{Key, Outcome, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(100)?)?);
    /// let policy = Policy::new("exports", per_ip).max_in_flight(1);
    /// let layer = RateLimitLayer::builder().policy(policy).build()?;
    /// let mut request = Request::get("/export").body(())?;
    /// request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
    /// let (parts, ()) = request.into_parts();
    /// let (first, place) = layer.evaluate_held(&parts, None).await;
    /// assert!(first.passes && place.is_some());
    /// // While the first export runs, a second is over the bound.
    /// let (second, _) = layer.evaluate_held(&parts, None).await;
    /// assert_eq!((second.outcome, second.passes), (Outcome::InFlight, false));
    /// drop(place); // the first ended
    /// assert!(layer.evaluate_held(&parts, None).await.0.passes);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn evaluate_held(
        &self,
        parts: &Parts,
        cost: Option<u64>,
    ) -> (Evaluation, Option<OwnedInFlightPermit<Key>>) {
        let shared = &self.shared;
        let unchecked = |policy: Option<usize>, outcome, passes| Evaluation {
            policy: policy.map(|i| Arc::clone(&shared.policies[i].name)),
            key: None,
            cost: 0,
            outcome,
            decision: None,
            waited: std::time::Duration::ZERO,
            passes,
        };
        let (index, key, policy_cost) = match shared.plan(parts, None) {
            Plan::Pass => return (unchecked(None, Outcome::Passed, true), None),
            Plan::Unchecked {
                policy,
                outcome,
                fallback,
                ..
            } => {
                let passes = fallback == Fallback::Allow;
                return (unchecked(Some(policy), outcome, passes), None);
            }
            Plan::Check { policy, key, cost } => (policy, key, cost),
        };
        let cost = cost.unwrap_or(policy_cost);
        let policy = &shared.policies[index];
        let Ok(place) = take_place(policy, &key) else {
            let mut refused = unchecked(Some(index), Outcome::InFlight, false);
            refused.key = Some(key);
            refused.cost = cost;
            return (refused, None);
        };
        if !policy.rate {
            // An in-flight bound alone: the request passes with its place, unchecked.
            stats::record(policy, Outcome::Allowed);
            let mut passed = unchecked(Some(index), Outcome::Allowed, true);
            passed.key = Some(key);
            passed.cost = cost;
            return (passed, place);
        }
        let decided = policy_verdict(policy, &key, cost).await;
        let outcome = outcome(policy, &decided);
        let (decision, waited) = match &decided {
            Ok((verdict, waited)) => (Some(verdict.decision), *waited),
            Err(_) => (None, std::time::Duration::ZERO),
        };
        let next = next::<()>(
            shared,
            index,
            key.clone(),
            cost,
            decided,
            is_grpc(&parts.method, &parts.headers),
        );
        let passes = matches!(next, Next::Call(_));
        let evaluation = Evaluation {
            policy: Some(Arc::clone(&policy.name)),
            key: Some(key),
            cost,
            outcome,
            decision,
            waited,
            passes,
        };
        // A request that does not pass holds no place.
        (evaluation, place.filter(|_| passes))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The request's place under the policy's in-flight bound, for `key`: `Ok(None)` without a
/// bound, or for a shadow policy over it (counted, let through); `Err(())` when it is
/// refused (counted as `Outcome::InFlight`).
fn take_place(policy: &Policy, key: &Key) -> Result<Option<OwnedInFlightPermit<Key>>, ()> {
    let Some(limit) = policy.in_flight_limit() else {
        return Ok(None);
    };
    match limit.try_acquire_owned(policy.in_flight_key.as_ref().unwrap_or(key)) {
        Ok(Some(place)) => Ok(Some(place)),
        // No key bound, a cost of 1: an error cannot happen; refused either way.
        Ok(None) | Err(_) => {
            stats::record(policy, Outcome::InFlight);
            // A shadow policy counts the refusal and lets the request through.
            if policy.mode == Mode::Shadow {
                Ok(None)
            } else {
                Err(())
            }
        }
    }
}
