//! The layer's response body: the inner service's, or the layer's own (a denial), holding the
//! request's in-flight place until it ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::key::Key;
use crate::limiter::OwnedInFlightPermit;

pin_project_lite::pin_project! {
    /// The layer's response body: the inner service's body, or the layer's own (a denial).
    ///
    /// It implements [`http_body::Body`] when the inner body's `Data` is [`Bytes`] (as for
    /// axum, hyper and tonic).
    ///
    /// # Examples
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Body as _;
    /// use http_body_util::Full;
    /// use tollgate::tower::RateLimitBody;
    /// // The inner service's body passes through as it is; the layer's own is a known length.
    /// let body = RateLimitBody::<Full<Bytes>>::full(Bytes::from_static(b"{\"status\":429}"));
    /// assert_eq!(body.size_hint().exact(), Some(14));
    /// ```
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
        // The request's place under its policy's `max_in_flight`, held until the body ends
        // or is dropped.
        place: Option<OwnedInFlightPermit<Key>>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body.
    ///
    /// # Examples
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use tollgate::tower::RateLimitBody;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let body = RateLimitBody::inner(Full::new(Bytes::from("hello")));
    /// assert_eq!(body.collect().await?.to_bytes(), "hello");
    /// # Ok(())
    /// # }
    /// ```
    pub fn inner(body: B) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body },
            place: None,
        }
    }

    /// A body of `data`.
    ///
    /// # Examples
    /// ```
    /// use bytes::Bytes;
    /// use http_body::Body as _;
    /// use http_body_util::{BodyExt, Full};
    /// use tollgate::tower::RateLimitBody;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // The type parameter is the inner service's body type, which this body does not use.
    /// let body = RateLimitBody::<Full<Bytes>>::full(Bytes::from("slow down"));
    /// assert_eq!(body.collect().await?.to_bytes(), "slow down");
    /// // An empty body ends at once.
    /// assert!(RateLimitBody::<Full<Bytes>>::full(Bytes::new()).is_end_stream());
    /// # Ok(())
    /// # }
    /// ```
    pub fn full(data: Bytes) -> Self {
        RateLimitBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            place: None,
        }
    }
}

impl<B> RateLimitBody<B> {
    /// This body, holding `place` until it ends or is dropped.
    pub(crate) fn holding(mut self, place: Option<OwnedInFlightPermit<Key>>) -> Self {
        self.place = place;
        self
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { body } => f.debug_tuple("Inner").field(body).finish(),
            Kind::Full { data } => f.debug_tuple("Full").field(data).finish(),
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let frame = match this.kind.project() {
            KindProj::Inner { body } => std::task::ready!(body.poll_frame(cx)),
            KindProj::Full { data } => data.take().map(|d| Ok(Frame::data(d))),
        };
        if frame.is_none() {
            // The body ended: the request is no longer in flight.
            *this.place = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// The body of the actix-web middleware's responses (feature `actix`): the application's body
/// or the layer's own, holding the request's in-flight place as [`Body`] does.
#[cfg(feature = "actix")]
impl<B> actix_web::body::MessageBody for RateLimitBody<B>
where
    B: actix_web::body::MessageBody,
{
    type Error = B::Error;

    fn size(&self) -> actix_web::body::BodySize {
        match &self.kind {
            Kind::Inner { body } => body.size(),
            Kind::Full { data } => {
                actix_web::body::BodySize::Sized(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let chunk = match this.kind.project() {
            KindProj::Inner { body } => std::task::ready!(body.poll_next(cx)),
            KindProj::Full { data } => data.take().map(Ok),
        };
        if chunk.is_none() {
            // The body ended: the request is no longer in flight.
            *this.place = None;
        }
        Poll::Ready(chunk)
    }
}
