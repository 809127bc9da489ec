//! The Redis tier's errors, classified by what a caller should do about them.

use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind};

/// Why a Redis check could not be decided. A denial is not an error: it is a
/// [`Decision`](crate::Decision) with `allowed() == false`.
///
/// Every error is one of three classes ([`TierError::class`]):
/// - [`ErrorClass::Request`]: the request itself can never be admitted (decision rules: `c` above the
///   capacity). Nothing was sent to Redis.
/// - [`ErrorClass::Transient`]: Redis did not answer in time, the connection was refused or
///   dropped, or the server or cluster is (re)configuring (`LOADING`, `BUSY`, `MOVED`, `ASK`,
///   `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`). The same call may succeed later; a
///   failure policy (fail open, fail closed, local) decides meanwhile. (`MOVED` and `ASK` on a
///   limiter that is not on a Cluster connection are fatal: a [`TierError::Server`] saying to
///   connect with `connect_cluster`.)
/// - [`ErrorClass::Fatal`]: retrying will not help: a key holds data these scripts did not
///   write ([`TierError::WrongType`], [`TierError::CorruptState`]), a reply breaks the scripts'
///   contract, or the server refuses the call for good (permissions, out of memory, a
///   disabled command).
///
/// After a [`TierError::Timeout`] or a dropped connection the check may or may not have been
/// counted by Redis: it was sent, and its reply was lost. The error never over-admits (the
/// caller did not get an admission); it may under-admit by that one request.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use tollgate::redis::{TierError, ErrorClass};
/// let e = TierError::Timeout { timeout: Duration::from_millis(50) };
/// assert!(e.is_transient());
/// assert_eq!(e.class(), ErrorClass::Transient);
/// let e = TierError::WrongType { key: "tollgate:gcra:{alice}".into() };
/// assert!(e.is_fatal());
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The cost can never be admitted: it exceeds the rule's capacity (`B`, `C` or `L`).
    /// Nothing was sent to Redis and nothing changed.
    #[error("cost {cost} exceeds the capacity {capacity}: such a request can never be admitted")]
    Capacity {
        /// The requested cost.
        cost: u64,
        /// The largest cost the rule can ever admit.
        capacity: u64,
    },
    /// The key has no Cluster hash tag of its own (it is empty), so the
    /// states of several limits on it cannot share a slot and cannot be decided in one atomic
    /// call ([`RedisMultiLimiter`](super::RedisMultiLimiter) on a Cluster). Nothing was sent.
    #[error("the key {key:?} has no Cluster hash tag: its limits cannot be decided together")]
    NoHashTag {
        /// The user key, lossily decoded as UTF-8.
        key: String,
    },
    /// No reply within the limiter's timeout (transient).
    #[error("no reply from Redis within {timeout:?}")]
    Timeout {
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The connection was refused, dropped or reset, or the server or cluster is not ready to
    /// serve the key (transient).
    #[error("Redis is unavailable: {source}")]
    Unavailable {
        /// What the client library reported.
        #[source]
        source: redis::RedisError,
    },
    /// The key holds a Redis value of another type: something other than this limiter wrote
    /// to it (fatal).
    #[error("the Redis key {key} holds a value of another type than tollgate's state")]
    WrongType {
        /// The Redis key, lossily decoded as UTF-8.
        key: String,
    },
    /// The key holds a value of the right type that tollgate's scripts did not write (fatal).
    #[error("the Redis key {key} holds a value tollgate's scripts did not write")]
    CorruptState {
        /// The Redis key, lossily decoded as UTF-8.
        key: String,
    },
    /// A reply that breaks the scripts' contract (fatal).
    #[error("unexpected reply from Redis: {detail}")]
    BadReply {
        /// What was wrong with it.
        detail: String,
    },
    /// The server refused the call, and retrying will not help: an error in a script, a
    /// missing permission, no memory, a bad URL… (fatal).
    #[error("Redis refused the call: {source}")]
    Server {
        /// What the client library reported.
        #[source]
        source: redis::RedisError,
    },
}

/// What kind of failure an [`TierError`] is: see [`TierError`].
///
/// # Examples
/// A failure policy keyed on the class: retry transient errors, give up on the others.
/// ```
/// use tollgate::redis::{TierError, ErrorClass};
/// fn should_retry(e: &TierError) -> bool {
///     match e.class() {
///         ErrorClass::Transient => true,
///         ErrorClass::Request | ErrorClass::Fatal => false,
///     }
/// }
/// // A cost above the capacity is the request's fault, not Redis's: never retried.
/// assert!(!should_retry(&TierError::Capacity { cost: 11, capacity: 10 }));
/// assert!(!should_retry(&TierError::BadReply { detail: "nil".into() }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The request can never be admitted; Redis is fine.
    Request,
    /// Redis may answer if asked again later.
    Transient,
    /// Asking again will not help.
    Fatal,
}

impl TierError {
    /// The class of this error.
    ///
    /// # Examples
    /// ```
    /// use tollgate::redis::{TierError, ErrorClass};
    /// let e = TierError::Capacity { cost: 11, capacity: 10 };
    /// assert_eq!(e.class(), ErrorClass::Request);
    /// let e = TierError::CorruptState { key: "tollgate:gcra:{alice}".into() };
    /// assert_eq!(e.class(), ErrorClass::Fatal);
    /// ```
    pub fn class(&self) -> ErrorClass {
        match self {
            TierError::Capacity { .. } | TierError::NoHashTag { .. } => ErrorClass::Request,
            TierError::Timeout { .. } | TierError::Unavailable { .. } => ErrorClass::Transient,
            // A script lost again after its reload (flushed, failed over meanwhile): the next
            // call loads it again.
            TierError::Server { .. } if self.is_no_script() => ErrorClass::Transient,
            TierError::WrongType { .. }
            | TierError::CorruptState { .. }
            | TierError::BadReply { .. }
            | TierError::Server { .. } => ErrorClass::Fatal,
        }
    }

    /// Whether the same call may succeed later (timeouts, connection and cluster failures).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::TierError;
    /// assert!(TierError::Timeout { timeout: Duration::from_millis(50) }.is_transient());
    /// // A cost above the capacity fails the same way every time.
    /// assert!(!TierError::Capacity { cost: 11, capacity: 10 }.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// Whether retrying cannot help (wrong type, corrupt state, bad reply, refused call).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::TierError;
    /// assert!(TierError::WrongType { key: "tollgate:gcra:{alice}".into() }.is_fatal());
    /// assert!(!TierError::Timeout { timeout: Duration::from_millis(50) }.is_fatal());
    /// ```
    pub fn is_fatal(&self) -> bool {
        self.class() == ErrorClass::Fatal
    }

    /// The error of the decision rules for a cost above the capacity, as the in-process limiters return it.
    ///
    /// # Examples
    /// The same error an in-process limiter returns for that cost, so one error path serves
    /// both tiers; any other error has no such counterpart.
    /// ```
    /// use std::time::Duration;
    /// use tollgate::redis::TierError;
    /// let e = TierError::Capacity { cost: 11, capacity: 10 };
    /// assert_eq!(
    ///     e.as_capacity_exceeded(),
    ///     Some(tollgate::LimitError::CapacityExceeded { cost: 11, capacity: 10 })
    /// );
    /// assert_eq!(TierError::Timeout { timeout: Duration::from_millis(50) }.as_capacity_exceeded(), None);
    /// ```
    pub fn as_capacity_exceeded(&self) -> Option<crate::LimitError> {
        match *self {
            TierError::Capacity { cost, capacity } => {
                Some(crate::LimitError::CapacityExceeded { cost, capacity })
            }
            _ => None,
        }
    }

    pub(crate) fn bad_reply(detail: String) -> TierError {
        TierError::BadReply { detail }
    }

    /// The server had lost the script called (`NOSCRIPT`: restarted, failed over, or its
    /// script cache flushed); loading it again cures it.
    pub(crate) fn is_no_script(&self) -> bool {
        matches!(self, TierError::Server { source }
            if source.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
    }
}

impl From<redis::RedisError> for TierError {
    /// Classifies a client-library error.
    fn from(source: redis::RedisError) -> TierError {
        if is_transient(&source) {
            TierError::Unavailable { source }
        } else if source.code() == Some("WRONGTYPE") {
            TierError::WrongType {
                key: String::from("(unknown)"),
            }
        } else if matches!(
            source.kind(),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType
        ) {
            TierError::BadReply {
                detail: source.to_string(),
            }
        } else {
            TierError::Server { source }
        }
    }
}

fn is_transient(e: &redis::RedisError) -> bool {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
    {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        )
        | ErrorKind::ClusterConnectionNotFound => true,
        // The cluster connection's task dropped a request (while it reconnects): asking again
        // reaches the new connection.
        ErrorKind::Client => e.to_string().contains("internal failure"),
        // A script running past `busy-reply-threshold` (the server answers again once it
        // ends); `maxmemory` reached with no key to evict (writes pass again once memory is
        // freed); writes stopped after a failed snapshot (until one succeeds).
        _ => match e.code() {
            Some("BUSY" | "OOM" | "MISCONF") => true,
            Some("ERR") => e
                .detail()
                .and_then(script_call_code)
                .is_some_and(transient_code),
            _ => false,
        },
    }
}

/// A server error code that passes once the server recovers (or a replica is promoted):
/// what a `redis.call` inside a script may raise.
fn transient_code(code: &str) -> bool {
    matches!(
        code,
        "BUSY"
            | "OOM"
            | "MISCONF"
            | "READONLY"
            | "LOADING"
            | "MASTERDOWN"
            | "TRYAGAIN"
            | "CLUSTERDOWN"
            | "NOREPLICAS"
    )
}

/// The error code of a `redis.call` that failed inside a script, as Redis 6.2 and older
/// report it: under `ERR`, `Error running script (call to f_…): @user_script:12:
/// @user_script: 12: -OOM command not allowed …` (Redis 7 replies with the call's own code,
/// `-OOM … script: …`, which the match above reads).
fn script_call_code(detail: &str) -> Option<&str> {
    let rest = detail.strip_prefix("Error running script")?;
    let (_, code) = rest.split_once(": -")?;
    let code = code.split(' ').next()?;
    (!code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase())).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error reply as the server sends it, as the client library reads it.
    fn reply(bytes: &[u8]) -> TierError {
        let value = redis::parse_redis_value(bytes).expect("a reply");
        TierError::from(value.extract_error().expect_err("an error reply"))
    }

    /// A `redis.call` that fails inside a script (out of memory, a demoted master, a
    /// snapshot failure, a server still loading) is transient on Redis 6.2 and older, whose
    /// reply wraps the call's code in `ERR Error running script`, as on Redis 7, whose reply
    /// is the call's own code; a script's own error (a bad argument) stays fatal on both.
    /// The 7.0 replies are as redis-server 7.0.15 wrote them (an `OOM` under `maxmemory 1`, a
    /// `WRONGTYPE`, a script's own `error()`); the 6.2 ones as 6.2's scripting writes them
    /// (`Error running script (call to f_<sha>): <where>: <where>: -<reply>`), no 6.2 server
    /// being packaged here.
    #[test]
    fn script_call_errors_are_classed_alike_on_redis_6_and_7() {
        let sha = "d223ed8c7345b684e8ed044ed472601f536fa58b";
        for (code, message) in [
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("READONLY", "You can't write against a read only replica."),
            (
                "MISCONF",
                "Redis is configured to save RDB snapshots, but it's currently unable to \
                 persist to disk.",
            ),
            ("LOADING", "Redis is loading the dataset in memory"),
        ] {
            let six = format!(
                "-ERR Error running script (call to f_{sha}): @user_script:12: @user_script: 12: \
                 -{code} {message} \r\n"
            );
            let seven = format!("-{code} {message} script: {sha}, on @user_script:12.\r\n");
            for (version, bytes) in [("6.2", six), ("7.0", seven)] {
                let e = reply(bytes.as_bytes());
                assert!(e.is_transient(), "{code} on Redis {version}: {e:?}");
            }
        }
        let own = reply(
            format!("-ERR Error running script (call to f_{sha}): @user_script:3: bad cost\r\n")
                .as_bytes(),
        );
        assert!(own.is_fatal(), "{own:?}");
        let own = reply(
            format!("-ERR user_script:3: bad cost script: {sha}, on @user_script:3.\r\n")
                .as_bytes(),
        );
        assert!(own.is_fatal(), "{own:?}");
        let wrong = reply(
            format!(
                "-ERR Error running script (call to f_{sha}): @user_script:9: @user_script: 9: \
                 -WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
            )
            .as_bytes(),
        );
        assert!(!wrong.is_transient(), "{wrong:?}");
    }

    #[test]
    fn classification() {
        let io =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(TierError::from(io).is_transient());
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(TierError::from(io).is_transient());
        let parse = redis::RedisError::from((ErrorKind::Parse, "garbage"));
        assert!(matches!(TierError::from(parse), TierError::BadReply { .. }));
        let config = redis::RedisError::from((ErrorKind::InvalidClientConfig, "bad url"));
        assert!(TierError::from(config).is_fatal());
        let internal = redis::RedisError::from((
            ErrorKind::Client,
            "request wasn't handled due to internal failure",
        ));
        assert!(TierError::from(internal).is_transient());
        let client = redis::RedisError::from((ErrorKind::Client, "Missing slot coverage"));
        assert!(TierError::from(client).is_fatal());
        let no_script =
            redis::RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "gone"));
        let no_script = TierError::from(no_script);
        assert!(no_script.is_no_script() && no_script.is_transient());
        assert_eq!(
            TierError::Capacity {
                cost: 5,
                capacity: 4
            }
            .as_capacity_exceeded(),
            Some(crate::LimitError::CapacityExceeded {
                cost: 5,
                capacity: 4
            })
        );
    }
}
