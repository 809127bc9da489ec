//! What the layer answers when it cannot decide a request, and why a configuration is refused:
//! the two answers every part of the layer may give, so they sit below all of them.

use http::StatusCode;

/// What the layer does with a request it cannot decide (no key, or a backend error).
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::{Fallback, RateLimitLayer};
/// // No client key (no peer address, no API key header): a 401 asks for credentials.
/// let layer = RateLimitLayer::builder()
///     .on_missing_key(Fallback::Reject(StatusCode::UNAUTHORIZED))
///     .on_error(Fallback::Allow) // fail open while a backend cannot decide
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Answer with this status (a problem+json body, or the matching gRPC status).
    Reject(StatusCode),
    /// Pass the request on, uncounted and without rate-limit fields.
    Allow,
}

/// Why a layer's configuration was refused.
///
/// # Examples
/// ```
/// use http::StatusCode;
/// use tollgate::tower::{ConfigError, Fallback, RateLimitLayer};
/// // A fallback "rejection" with 200 would pass the request while claiming to refuse it.
/// let err = RateLimitLayer::builder().on_error(Fallback::Reject(StatusCode::OK)).build();
/// assert_eq!(err.err(), Some(ConfigError::FallbackStatus(StatusCode::OK)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A policy name must be 1–64 printable ASCII characters (it goes into headers).
    #[error("policy name {0:?} must be 1-64 printable ASCII characters")]
    PolicyName(String),
    /// The IPv6 grouping prefix must lie in /32 ..= /64: a shorter one puts whole providers
    /// in one bucket, a longer one gives a host that owns a /64 as many buckets as addresses.
    #[error("IPv6 prefix /{0} is outside /32 ..= /64")]
    Ipv6Prefix(u8),
    /// A [`Fallback::Reject`] status must be a client or server error (4xx or 5xx).
    #[error("fallback status {0} is not a 4xx or 5xx status")]
    FallbackStatus(StatusCode),
    /// A policy's algorithm refused one of its quotas, or its clock (a configured policy, or
    /// one built by [`Policy::gcra`](super::Policy::gcra)).
    #[error("policy {policy:?}: {error}")]
    Quota {
        /// The policy's name.
        policy: String,
        /// What the algorithm refused.
        error: crate::QuotaError,
    },
    /// An allow-listed path (`allow_paths` of a configuration or of the builder) must start with `/`: any other
    /// can never match, or (empty) would match every path.
    #[error("allow path {0:?} must start with `/`")]
    AllowPath(String),
    /// A configured policy is incomplete or contradictory.
    #[error("policy {policy:?}: {problem}")]
    Policy {
        /// The policy's name.
        policy: String,
        /// What is wrong.
        problem: String,
    },
}
