//! The response side of the layer's service: the future that answers a request, and what an
//! admitted request's response still needs (its headers, a refund by status).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, Response, StatusCode};

use super::backend::Verdict;
use super::body::RateLimitBody;
use super::key::Key;
use super::layer::Shared;
use super::outcome::Outcome;
use super::response::add_headers;
use super::stats;
use crate::limiter::OwnedInFlightPermit;

pub(super) type BoxedResponse<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

/// What an admitted request's response still needs once the inner service answered: the
/// headers, and a refund by status.
pub(crate) struct Admitted {
    pub(super) shared: Arc<Shared>,
    pub(super) policy: usize,
    pub(super) key: Key,
    pub(super) cost: u64,
    pub(super) verdict: Verdict,
}

impl Admitted {
    /// The inner service's `response`, with what `admitted` adds to it (nothing for `None`).
    pub(super) fn finish<B>(
        admitted: Option<Admitted>,
        response: Response<B>,
    ) -> Response<RateLimitBody<B>> {
        let mut response = response.map(RateLimitBody::inner);
        if let Some(this) = admitted {
            let status = response.status();
            this.complete(status, response.headers_mut());
        }
        response
    }

    /// Refunds the request if its policy refunds responses of `status`, and adds the rate-limit
    /// fields to `headers` (a response's, of any framework: the actix-web middleware copies
    /// them over).
    pub(crate) fn complete(self, status: StatusCode, headers: &mut HeaderMap) {
        let policy = &self.shared.policies[self.policy];
        let mut verdict = self.verdict;
        if verdict.decision.allowed() && policy.refund.as_ref().is_some_and(|refund| refund(status))
        {
            // The headers then say what the client has once the units are back.
            let refunded = (policy.backend).refund_decided(&self.key, self.cost, &verdict.decision);
            if let Some(after) = refunded {
                verdict = after;
            }
            stats::record(policy, Outcome::Refunded);
        }
        add_headers(headers, self.shared.headers, policy, &verdict);
    }
}

pin_project_lite::pin_project! {
    /// The future of [`RateLimit`]'s responses: no allocation when the policy's backend decides
    /// at once ([`CheckBackend::check_now`]: the in-process limiters); a boxed future when it
    /// must wait (a network backend, delay mode).
    ///
    /// # Examples
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_hour(1)?)?);
    /// let mut app = RateLimitLayer::builder()
    ///     .policy(Policy::new("api", per_ip))
    ///     .build()?
    ///     .layer(Router::new().route("/", get(|| async { "ok" })));
    /// let mut statuses = Vec::new();
    /// for _ in 0..2 {
    ///     let mut request = Request::get("/").body(Body::empty())?;
    ///     request.extensions_mut().insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40000)));
    ///     std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx)).await?;
    ///     let future: tollgate::tower::ResponseFuture<_, _, _> = app.call(request);
    ///     statuses.push(future.await?.status());
    /// }
    /// // One an hour: the second is refused.
    /// assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        stage: Stage<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = StageProj]
    pub(super) enum Stage<F, B, E> {
        /// Answered without the inner service.
        Ready { response: Option<Response<RateLimitBody<B>>> },
        /// The inner service's future, and what its response still needs (its headers, and
        /// the request's in-flight place, which its body holds).
        Inner {
            #[pin]
            future: F,
            admitted: Option<Admitted>,
            place: Option<OwnedInFlightPermit<Key>>,
        },
        /// A decision that waits, and then the inner service.
        Boxed { future: BoxedResponse<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(super) fn stage(stage: Stage<F, B, E>) -> Self {
        ResponseFuture { stage }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().stage.project() {
            StageProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completion: a caller bug; stay pending rather than panic.
                None => Poll::Pending,
            },
            StageProj::Inner {
                future,
                admitted,
                place,
            } => {
                let response = std::task::ready!(future.poll(cx))?;
                let response = Admitted::finish(admitted.take(), response);
                Poll::Ready(Ok(response.map(|body| body.holding(place.take()))))
            }
            StageProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
