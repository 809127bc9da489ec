//! The middleware: actix-web's `Transform` (what `App::wrap` takes) and the service it wraps
//! around the application, on the tower layer's per-request gate.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::Error;

use super::convert::{copy_headers, parts, respond, Copied, Scratch};
use crate::tower::service::{Gate, Pass};
use crate::tower::{RateLimitBody, RateLimitLayer};

/// The actix-web middleware: a [`RateLimitLayer`]'s policies, keys, headers and denials in an
/// actix-web `App` (see the [module docs](crate::actix)).
///
/// Cloning it is one reference count; clones share their limiters, and with the layer it was
/// made from (whose [`tiers`](RateLimitLayer::tiers) and
/// [`record_gauges`](RateLimitLayer::record_gauges) serve both).
///
/// # Examples
/// ```
/// use actix_web::{web, App, HttpResponse};
/// use tollgate::actix::RateLimit;
/// use tollgate::prelude::*;
/// let api = Policy::gcra("api", Quota::per_second(10)?.with_burst(20)?).path_prefix("/api/");
/// let layer = RateLimitLayer::builder().policy(api).build()?;
/// let limit = RateLimit::new(layer.clone()); // `layer` stays for `tiers`, `record_gauges`
/// let app = App::new()
///     .wrap(limit)
///     .route("/api/hello", web::get().to(|| async { HttpResponse::Ok().body("hello") }));
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimit {
    layer: RateLimitLayer,
}

impl RateLimit {
    /// The middleware of `layer` (built with [`RateLimitLayer::builder`], or from a
    /// configuration file with feature `serde`).
    ///
    /// # Examples
    /// ```
    /// use tollgate::actix::RateLimit;
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let limit = RateLimit::new(RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?);
    /// assert!(limit.layer().tiers("api").is_none()); // not a tiered policy
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(layer: RateLimitLayer) -> Self {
        RateLimit { layer }
    }

    /// The layer this middleware runs: its tiers, its gauges, [`RateLimitLayer::evaluate`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::actix::RateLimit;
    /// use tollgate::tower::{Key, Policy, RateLimitLayer};
    /// use tollgate::{Gcra, KeyedLimiter, Quota};
    /// let per_ip = KeyedLimiter::<Key, _>::new(Gcra::new(Quota::per_second(10)?)?);
    /// let limit = RateLimit::new(RateLimitLayer::builder().policy(Policy::new("api", per_ip)).build()?);
    /// limit.layer().record_gauges(); // e.g. before rendering /metrics
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn layer(&self) -> &RateLimitLayer {
        &self.layer
    }
}

impl From<RateLimitLayer> for RateLimit {
    fn from(layer: RateLimitLayer) -> Self {
        RateLimit::new(layer)
    }
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimit").field(&self.layer).finish()
    }
}

impl<S, B> Transform<S, ServiceRequest> for RateLimit
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<RateLimitBody<B>>;
    type Error = Error;
    type Transform = RateLimitService<S>;
    type InitError = ();
    type Future = Ready<Result<RateLimitService<S>, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            copied: Copied::of(&self.layer),
            scratch: Rc::default(),
            layer: self.layer.clone(),
        }))
    }
}

/// The service [`RateLimit`] wraps around the application (one per actix-web worker).
///
/// # Examples
/// ```
/// use actix_web::{test, web, App, HttpResponse};
/// use tollgate::actix::RateLimit;
/// use tollgate::prelude::*;
/// # #[actix_web::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder().policy(Policy::gcra("api", Quota::per_hour(1)?)).build()?;
/// let app = test::init_service(
///     App::new().wrap(RateLimit::new(layer)).route("/", web::get().to(HttpResponse::Ok)),
/// )
/// .await;
/// let request = || test::TestRequest::get().uri("/").peer_addr("192.0.2.1:40000".parse().unwrap());
/// assert_eq!(test::call_service(&app, request().to_request()).await.status(), 200);
/// // One an hour: the second is refused.
/// assert_eq!(test::call_service(&app, request().to_request()).await.status(), 429);
/// # Ok(())
/// # }
/// ```
pub struct RateLimitService<S> {
    service: Rc<S>,
    layer: RateLimitLayer,
    /// The request header fields the layer reads (worked out once per worker).
    copied: Copied,
    /// What its responses reuse.
    scratch: Rc<Scratch>,
}

impl<S> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for RateLimitService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<RateLimitBody<B>>;
    type Error = Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let head = parts(&request, &self.copied, &self.scratch);
        let peer = request.peer_addr().map(|peer| peer.ip());
        let stage = match self.layer.shared.gate(&head, peer) {
            Gate::Respond(response) => Stage::Ready {
                response: Some(respond(request, response, &self.scratch)),
            },
            Gate::Pass(pass) => Stage::Inner {
                future: self.service.call(request),
                pass: Some(pass),
                scratch: Rc::clone(&self.scratch),
            },
            Gate::Wait(wait) => {
                // The application is called once the decision is in.
                let service = Rc::clone(&self.service);
                let scratch = Rc::clone(&self.scratch);
                Stage::Boxed {
                    future: Box::pin(async move {
                        match wait.decide().await {
                            Err(response) => Ok(respond(request, response, &scratch)),
                            Ok(pass) => Ok(finish(pass, service.call(request).await?, &scratch)),
                        }
                    }),
                }
            }
        };
        ResponseFuture { stage }
    }
}

/// The application's `response`, with what `pass` adds: the rate-limit fields (after a refund
/// by status), and the in-flight place its body holds.
fn finish<B>(
    pass: Pass,
    response: ServiceResponse<B>,
    scratch: &Scratch,
) -> ServiceResponse<RateLimitBody<B>> {
    let Pass { admitted, place } = pass;
    let mut response = response.map_body(|_, body| RateLimitBody::inner(body).holding(place));
    if let Some(admitted) = admitted {
        // Every status actix-web holds (100–999) is one `http` 1 holds.
        if let Ok(status) = http::StatusCode::from_u16(response.status().as_u16()) {
            let mut fields = scratch.fields();
            admitted.complete(status, &mut fields);
            copy_headers(fields, response.headers_mut(), true, scratch);
        }
    }
    response
}

type Boxed<B> = Pin<Box<dyn Future<Output = Result<ServiceResponse<RateLimitBody<B>>, Error>>>>;

pin_project_lite::pin_project! {
    /// The future of [`RateLimitService`]'s responses: no allocation when the policy's backend
    /// decides at once (the in-process limiters); a boxed future when it must wait (a network
    /// backend, delay mode).
    ///
    /// # Examples
    /// ```
    /// use actix_web::dev::{Service, ServiceResponse};
    /// use actix_web::{test, web, App, HttpResponse};
    /// use tollgate::actix::{RateLimit, ResponseFuture};
    /// use tollgate::prelude::*;
    /// # #[actix_web::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder().policy(Policy::gcra("api", Quota::per_hour(1)?)).build()?;
    /// let app = test::init_service(
    ///     App::new().wrap(RateLimit::new(layer)).route("/", web::get().to(HttpResponse::Ok)),
    /// )
    /// .await;
    /// let request = test::TestRequest::get().peer_addr("192.0.2.1:40000".parse()?).to_request();
    /// let response = app.call(request).await.map_err(|e| e.to_string())?;
    /// let policy = response.headers().get("ratelimit-policy").map(|v| v.to_str().unwrap());
/// assert_eq!(policy, Some("\"api\";q=1;w=3600"));
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseFuture<F, B> {
        #[pin]
        stage: Stage<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = StageProj]
    enum Stage<F, B> {
        /// Answered without the application.
        Ready { response: Option<ServiceResponse<RateLimitBody<B>>> },
        /// The application's future, and what its response still needs.
        Inner { #[pin] future: F, pass: Option<Pass>, scratch: Rc<Scratch> },
        /// A decision that waits, and then the application.
        Boxed { future: Boxed<B> },
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<F, B> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
{
    type Output = Result<ServiceResponse<RateLimitBody<B>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().stage.project() {
            // (Polled again after completion, a caller bug: pending rather than a panic.)
            StageProj::Ready { response } => response
                .take()
                .map_or(Poll::Pending, |r| Poll::Ready(Ok(r))),
            StageProj::Inner {
                future,
                pass,
                scratch,
            } => future
                .poll(cx)
                .map_ok(|response| finish(pass.take().unwrap_or_default(), response, scratch)),
            StageProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}
