//! What a program that limits requests usually names, in one import:
//! `use tollgate::prelude::*;`.
//!
//! The limiters ([`Limiter`], [`KeyedLimiter`], [`MultiLimiter`], [`InFlight`]), the
//! algorithms, [`Quota`], [`Decision`] and the errors; with feature `tower`, the layer, its
//! [`Policy`] and [`KeySource`], and what a server sets on them; with `tokio`, [`WaitError`].
//! A glob import never shadows a name of your own: a type of yours named `Key` or `Mode` wins.
//!
//! # Examples
//! A server's whole limit, with `axum` (feature `axum`):
//! ```
//! # #[cfg(feature = "axum")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::get, Router};
//! use tollgate::prelude::*;
//!
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::gcra("api", Quota::per_second(10)?.with_burst(20)?).path_prefix("/api/"))
//!     .headers(HeaderStyle::Both)
//!     .build()?;
//! let app: Router = Router::new().route("/api/hello", get(|| async { "hello" })).layer(layer);
//! # let _ = app;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//! In process:
//! ```
//! use tollgate::prelude::*;
//!
//! let limiter: KeyedLimiter<String, Gcra> = KeyedLimiter::new(Gcra::new(Quota::per_second(2)?)?);
//! assert!(limiter.check("alice")?.allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Listed as re-exports, as std's prelude is: each type's page stays where it is defined.
#[doc(no_inline)]
pub use crate::algorithm::{
    FixedWindow, Gcra, LeakyBucket, LeakyQueue, Rule, SlidingLog, SlidingWindow, TokenBucket,
};
#[doc(no_inline)]
pub use crate::decision::{Decision, LimitError};
#[doc(no_inline)]
pub use crate::limiter::{
    Algorithm, InFlight, InFlightBoundError, InFlightPermit, KeyedLimiter, Limiter, OverflowPolicy,
    OwnedInFlightPermit,
};
#[doc(no_inline)]
pub use crate::multi::MultiLimiter;
#[doc(no_inline)]
pub use crate::quota::{Quota, QuotaError};
#[cfg(all(feature = "tower", feature = "redis"))]
#[doc(no_inline)]
pub use crate::tower::RedisBackend;
#[cfg(feature = "tower")]
#[doc(no_inline)]
pub use crate::tower::{
    CheckBackend, ConfigError, Fallback, HeaderStyle, InFlightScope, Key, KeySource, Mode, Policy,
    RateLimitLayer,
};
#[cfg(feature = "tokio")]
#[doc(no_inline)]
pub use crate::wait::WaitError;
